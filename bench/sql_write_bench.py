"""SQL writes against the same writes through ``castsql.Table``, DuckLake and deltalake, same data, same run.

    .venv/bin/python bench/sql_write_bench.py [--rows 1000000] [--keys 10000] [--rounds 5]

Builds one table of ``--rows`` events (``merge_bench``'s rows: an integer key
and four more columns, one data file) and copies it: a CastSQL table written
through SQL, one written through ``Table``, a Delta table (``deltalake``) and
a DuckLake table (DuckDB's ``ducklake`` extension, as ``stream_bench``
attaches it). Then, ``--rounds`` times, rotating which goes first:

- a one-row delete: ``DELETE FROM events WHERE id = k`` through a long-lived
  ``castsql.connect`` session, ``Table.delete("id = k")`` on a long-lived
  handle, and DuckLake's ``DELETE FROM lake.events WHERE id = k``;
- an upsert of ``--keys`` keys (half existing, half new): ``MERGE INTO
  events t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN
  NOT MATCHED THEN INSERT *`` in the session (``src`` an Arrow table
  registered on its connection), ``Table.merge(on="id")`` with the same
  clauses, and ``DeltaTable.merge`` (a fresh handle, as ``merge_bench``).

Printed: medians and ratios. Goals (issue 56): the SQL delete <= 1.1x
``Table.delete``; the SQL merge <= 0.3x deltalake's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from merge_bench import build, merge_delta, source

import castsql
from castsql.engine.duckdb.duck import load_extension

UPSERT = "MERGE INTO events t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory)")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="castsql-sql-write-bench-"))
    n = args.rows
    t0 = time.perf_counter()
    cs, dl = build(base / "build", n, max(n, 1))
    sql_uri, table_uri = base / "sql" / "events", base / "table" / "events"
    shutil.copytree(cs, sql_uri)
    shutil.copytree(cs, table_uri)
    import duckdb

    lake = duckdb.connect()
    load_extension(lake, "ducklake")
    (base / "lake").mkdir()
    lake.execute(f"ATTACH 'ducklake:{base}/lake/meta.ducklake' AS lake (DATA_PATH '{base}/lake/data')")
    with castsql.open(str(cs)) as t:
        lake.register("base_rows", t.to_arrow())
    lake.execute("CREATE TABLE lake.events AS SELECT * FROM base_rows")
    lake.unregister("base_rows")
    print(f"# {os.cpu_count()} cores, shared machine; built {n:,} rows four times in {time.perf_counter() - t0:.0f}s")

    session = castsql.connect(str(sql_uri))
    table = castsql.open(str(table_uri))
    rng = np.random.default_rng(56)
    keys = rng.choice(n, 2 * (args.rounds + 1), replace=False)

    # ---- one-row delete
    deletes: dict[str, list[float]] = {"SQL DELETE": [], "Table.delete": [], "DuckLake DELETE": []}

    def run_delete(name: str, k: int) -> None:
        if name == "SQL DELETE":
            assert session.sql(f"DELETE FROM events WHERE id = {k}").column("count")[0].as_py() == 1
        elif name == "Table.delete":
            table.delete(f"id = {k}")
        else:
            lake.execute(f"DELETE FROM lake.events WHERE id = {k}")

    for r in range(args.rounds + 1):  # round 0 warms imports and caches, not counted
        names = list(deletes)
        order = names[r % 3 :] + names[: r % 3]
        for name in order:
            t = time.perf_counter()
            run_delete(name, int(keys[r]))
            if r:
                deletes[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in deletes.items()}
    print(f"one-row delete on {n:,} rows, {args.rounds} rounds, medians:")
    for name, m in med.items():
        print(f"  {name:<18}{m * 1000:>9.1f} ms")
    print(f"  SQL / Table.delete {med['SQL DELETE'] / med['Table.delete']:.2f}x (goal <= 1.1x); "
          f"SQL / DuckLake {med['SQL DELETE'] / med['DuckLake DELETE']:.2f}x")  # fmt: skip

    # ---- upsert of --keys keys
    merges: dict[str, list[float]] = {"SQL MERGE INTO": [], "Table.merge": [], "deltalake merge": []}
    salt = 1
    for r in range(args.rounds + 1):
        src = source(n, args.keys, rng, salt)
        salt += 1
        names = list(merges)
        order = names[r % 3 :] + names[: r % 3]
        for name in order:
            t = time.perf_counter()
            if name == "SQL MERGE INTO":
                session.con.register("src", src)
                got = session.sql(UPSERT).column("count")[0].as_py()
                session.con.unregister("src")
                assert got == args.keys, got
            elif name == "Table.merge":
                table.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
            else:
                merge_delta(dl, src)
            if r:
                merges[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in merges.items()}
    print(f"upsert of {args.keys:,} keys into {n:,} rows, {args.rounds} rounds, medians:")
    for name, m in med.items():
        print(f"  {name:<18}{m * 1000:>9.1f} ms")
    print(f"  SQL / deltalake {med['SQL MERGE INTO'] / med['deltalake merge']:.2f}x (goal <= 0.3x); "
          f"SQL / Table.merge {med['SQL MERGE INTO'] / med['Table.merge']:.2f}x")  # fmt: skip
    assert session.sql("SELECT count(*) AS n FROM events").column("n")[0].as_py() == table.at().to_arrow().num_rows
    session.close()
    table.close()
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
