"""What a Spark delete costs: bytes written and wall time, next to the table size.

    .venv/bin/python bench/spark_delete_bench.py [--rows 2000000] [--repeat 3] [--dir PATH]

Builds a table of ``--rows`` events rows (two files, row groups of 122,880)
on the local disk, then runs deletes of 1 row, 1 % and 10 % of the table, each
as scattered rows (a hash of the id: position bitmaps) and as one id range
(row groups and key ranges), ``--repeat`` times each on different rows. For
each kind it prints the bytes the delete wrote (its tombstone file and its
manifest; the pointer adds ~100 B) and the median wall time of the delete call
(one Spark job plus the commit). No data file is ever rewritten.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from castsql.format import TableLog
from castsql.format.layout import manifest_key
from castsql.spark import append, delete, spark_session
from castsql.storage import open_storage
from castsql.write.garbage import format_bytes

COLUMNS = [
    "id",
    "timestamp_seconds(1735689600 + id) AS ts",
    "concat('u', cast(pmod(id * 7919, 100000) AS STRING)) AS user",
    "element_at(array('view', 'click', 'purchase', 'refund'), cast(pmod(hash(id), 4) + 1 AS INT)) AS kind",
    "round(pmod(hash(id, 7), 100000) / 100.0, 2) AS amount",
]


def _cases(rows: int, repeat: int) -> list[tuple[str, int, list[str]]]:
    one_pct, ten_pct = rows // 100, rows // 10
    return [
        ("1 row", 1, [f"id = {rows // 7 + 1000 * i}" for i in range(repeat)]),
        ("1% scattered", one_pct, [f"pmod(hash(id, {i}), 100) = 0" for i in range(repeat)]),
        ("1% id range", one_pct,
         [f"id >= {s} AND id < {s + one_pct}" for s in (rows // 10 * i for i in range(repeat))]),
        ("10% scattered", ten_pct, [f"pmod(hash(id, {100 + i}), 10) = 0" for i in range(repeat)]),
        ("10% id range", ten_pct,
         [f"id >= {s} AND id < {s + ten_pct}" for s in (rows // 10 * (i + 3) + 7 for i in range(repeat))]),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="where to build the table (default: a temporary directory)")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="castsql-bench-")) / "events"
    spark = spark_session("castsql delete bench")
    t = time.monotonic()
    df = spark.range(0, args.rows, numPartitions=2).selectExpr(*COLUMNS)
    m = append(spark, str(root), df, primary_key="id")
    table_bytes = sum(f.size_bytes for f in m.data_files)
    print(
        f"table: {args.rows:,} rows, {len(m.data_files)} files, {format_bytes(table_bytes)} "
        f"(built in {time.monotonic() - t:.1f}s) at {root}"
    )
    delete(spark, str(root), "id = -1")  # warm the workers up: matches nothing, commits nothing
    st = open_storage(str(root))
    log = TableLog(st)
    print(f"{'delete':<15}{'rows':>10}{'tombstone':>12}{'manifest':>11}{'written':>11}{'of table':>10}{'median s':>10}")
    for name, _, conds in _cases(args.rows, args.repeat):
        times, tomb, man, deleted = [], [], [], []
        for cond in conds:
            before = set(log.latest().tombstones)
            t = time.monotonic()
            m = delete(spark, str(root), cond)
            times.append(time.monotonic() - t)
            [key] = set(m.tombstones) - before
            tomb.append(len(st.get(key)))
            man.append(len(st.get(manifest_key(m.version))))
            deleted.append(m.summary["deleted_rows"])
        written = statistics.median(a + b for a, b in zip(tomb, man, strict=True))
        print(
            f"{name:<15}{int(statistics.median(deleted)):>10,}{format_bytes(int(statistics.median(tomb))):>12}"
            f"{format_bytes(int(statistics.median(man))):>11}{format_bytes(int(written)):>11}"
            f"{written / table_bytes:>10.5%}{statistics.median(times):>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
