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

Then a bulk insert of ``--insert-rows`` rows (default 10M; 0 skips it) from
Parquet files into an empty keyed table, as two commands a person runs, each
in a fresh process: ``castsql WH -c "INSERT INTO events SELECT * FROM
read_parquet([...])"`` and ``castsql append URI --from FILES``; ``--rounds``
(at most 3) rounds, rotating which goes first, each into a new empty table.

Printed: medians and ratios. Goals (issue 56): the SQL delete <= 1.1x
``Table.delete``; the SQL merge <= 0.3x deltalake's; the SQL insert <= 1.2x
``castsql append``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from merge_bench import build, merge_delta, rows, source

import castsql
from castsql.engine.duckdb.duck import load_extension
from castsql.format import TableLog
from castsql.storage import open_storage

UPSERT = "MERGE INTO events t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--insert-rows", type=int, default=10_000_000, help="rows of the bulk insert (0: skip it)")
    ap.add_argument("--only-insert", action="store_true", help="run the bulk insert alone")
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.only_insert:
        return bench_insert(Path(args.dir or tempfile.mkdtemp(prefix="castsql-sql-insert-bench-")), args)
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
    if args.insert_rows:
        bench_insert(base / "insert", args)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def bench_insert(base: Path, args: argparse.Namespace) -> int:
    """``INSERT INTO … SELECT * FROM read_parquet(…)`` in the shell against
    ``castsql append --from`` of the same files, each a fresh process."""
    import pyarrow.parquet as pq

    n, parts = args.insert_rows, 4
    (base / "in").mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(parts):
        lo, hi = n * i // parts, n * (i + 1) // parts
        f = base / "in" / f"part{i}.parquet"
        pq.write_table(rows(np.arange(lo, hi)), f, row_group_size=1 << 20)
        files.append(str(f))
    exe = str(Path(sys.executable).with_name("castsql"))
    listed = ", ".join(f"'{f}'" for f in files)
    times: dict[str, list[float]] = {"SQL INSERT … SELECT": [], "castsql append": []}
    rounds = min(args.rounds, 3)
    for r in range(rounds):
        names = list(times)
        order = names[r % 2 :] + names[: r % 2]
        for name in order:
            wh = base / f"r{r}-{'sql' if name.startswith('SQL') else 'cli'}"
            TableLog.create(open_storage(str(wh / "events")), rows(np.arange(1)).schema, primary_key="id")
            if name.startswith("SQL"):
                cmd = [exe, str(wh), "-c", f"INSERT INTO events SELECT * FROM read_parquet([{listed}])"]
            else:
                cmd = [exe, "append", str(wh / "events"), "--from", *files]
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t)
            with castsql.open(str(wh / "events")) as tb:
                assert tb.version == 1 and tb.to_duckdb().count("*").fetchone()[0] == n, (name, tb.version)
            shutil.rmtree(wh)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"bulk insert of {n:,} rows from {parts} Parquet files into an empty keyed table, {rounds} rounds, medians:")
    for name, m in med.items():
        print(f"  {name:<22}{m:>8.2f} s")
    print(f"  SQL / castsql append {med['SQL INSERT … SELECT'] / med['castsql append']:.2f}x (goal <= 1.2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
