"""``castsql demo [DIR]``: a small warehouse written by Spark, then the shell on it.

The warehouse (default ``./demo-warehouse``) holds two tables:

- ``events`` (``id`` BIGINT primary key, ``ts`` TIMESTAMP, ``user`` STRING,
  ``kind`` STRING, ``amount`` DOUBLE): 700,000 rows in row groups of 50,000,
  with versions made by appends and deletes that leave every kind of
  tombstone: a whole row group, a key range, a position bitmap and a short
  position list;
- ``users`` (``user`` STRING primary key, ``name``, ``country``,
  ``signup``): 1,000 rows, to join with.

Versions of ``events``:

====  =========================================================  ===============
v     operation                                                  tombstone
====  =========================================================  ===============
0     create
1     append ids 0-299,999 (two files of 150,000 rows)
2     append ids 300,000-599,999
3     delete ``id < 50000`` (row group 0 of the first file)      row group
4     delete ``id BETWEEN 160000 AND 179999``                    key range
5     delete ``kind = 'refund' AND amount > 900``                position bitmaps
6     delete ``id IN (7, 70007, 300007)``                        position lists
7     append ids 600,000-699,999
====  =========================================================  ===============

Example::

    >>> build_demo("/tmp/demo-warehouse")   # doctest: +SKIP
    '/tmp/demo-warehouse'
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_DIR = "./demo-warehouse"
ROW_GROUP_SIZE = 50_000
T0_SECONDS = 1_735_689_600  # 2025-01-01T00:00:00Z

EVENTS_SQL = f"""
    id,
    timestamp_seconds({T0_SECONDS} + id * 30) AS ts,
    concat('u', lpad(cast(pmod(id * 7919, 1000) AS STRING), 4, '0')) AS user,
    element_at(array('view', 'view', 'click', 'purchase', 'refund'), cast(pmod(hash(id), 5) + 1 AS INT)) AS kind,
    round(pmod(hash(id, 17), 100000) / 100.0, 2) AS amount
"""

USERS_SQL = f"""
    concat('u', lpad(cast(id AS STRING), 4, '0')) AS user,
    concat(element_at(array('Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Ken', 'Frances', 'Donald'),
                      cast(pmod(id, 8) + 1 AS INT)), ' ', cast(id AS STRING)) AS name,
    element_at(array('KR', 'US', 'DE', 'FR', 'JP', 'BR'), cast(pmod(hash(id), 6) + 1 AS INT)) AS country,
    timestamp_seconds({T0_SECONDS} - 86400 * (1 + pmod(id * 37, 700))) AS signup
"""

EVENT_DELETES = [
    "id < 50000",
    "id BETWEEN 160000 AND 179999",
    "kind = 'refund' AND amount > 900",
    "id IN (7, 70007, 300007)",
]


def _is_warehouse(directory: Path) -> bool:
    return all((directory / t / "_latest_manifest").exists() for t in ("events", "users"))


def build_demo(directory: str | os.PathLike[str], *, log: Callable[[str], None] = print) -> str:
    """Build the demo warehouse in ``directory`` (a local path) with Spark and
    return its path. An existing demo warehouse there is kept as it is.

    Example::

        >>> path = build_demo("demo-warehouse")   # doctest: +SKIP
        >>> sorted(os.listdir(path))               # doctest: +SKIP
        ['events', 'users']
    """
    root = Path(directory).expanduser().resolve()
    if _is_warehouse(root):
        log(f"demo warehouse already at {root}")
        return str(root)
    if root.exists() and any(root.iterdir()):
        from castsql.errors import CastSQLError

        raise CastSQLError(f"{root} exists and is not a demo warehouse; name an empty or new directory")
    from castsql.spark import append, delete, spark_session

    start = time.monotonic()
    log("starting Spark (local)...")
    spark = spark_session("castsql demo")
    events, users = str(root / "events"), str(root / "users")

    def step(text: str) -> None:
        log(f"  [{time.monotonic() - start:5.1f}s] {text}")

    def batch(lo: int, hi: int) -> object:
        return spark.range(lo, hi, numPartitions=2).selectExpr(*[c for c in _split(EVENTS_SQL)])

    for lo, hi in ((0, 300_000), (300_000, 600_000)):
        m = append(spark, events, batch(lo, hi), primary_key="id", row_group_size=ROW_GROUP_SIZE)
        step(f"events v{m.version}: appended ids {lo:,}-{hi - 1:,}")
    for cond in EVENT_DELETES:
        m = delete(spark, events, cond)
        n = m.summary.get("deleted_rows") if m else 0
        step(f"events v{m.version if m else '-'}: deleted {n:,} rows where {cond}")
    m = append(spark, events, batch(600_000, 700_000), row_group_size=ROW_GROUP_SIZE)
    step(f"events v{m.version}: appended ids 600,000-699,999")
    m = append(spark, users, spark.range(0, 1000, numPartitions=1).selectExpr(*_split(USERS_SQL)), primary_key="user")
    step(f"users v{m.version}: appended 1,000 users")
    log(f"demo warehouse ready at {root} ({time.monotonic() - start:.1f}s)")
    return str(root)


def _split(select_list: str) -> list[str]:
    """A SELECT list as separate expressions (commas inside parentheses stay)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in select_list:
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [" ".join(e.split()) for e in out]


def main(argv: list[str] | None = None) -> int:
    """``castsql demo [DIR]``: build the demo warehouse if absent, then open the shell on it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: castsql demo [DIR]", file=sys.stderr)
        return 2
    directory = argv[0] if argv else DEFAULT_DIR
    from castsql.errors import CastSQLError

    try:
        path = build_demo(directory)
    except CastSQLError as e:
        print(f"castsql demo: error: {e}", file=sys.stderr)
        return 1
    if "pyspark" in sys.modules:
        # Leave no JVM or PySpark signal handler behind: the shell starts in a fresh process.
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "castsql.cli", path])
    from castsql.shell.app import main as shell_main

    return shell_main([path])


if __name__ == "__main__":
    sys.exit(main())
