"""The shell piped into a file, against DuckDB's own writers on the same rows.

    .venv/bin/python bench/shell_output_bench.py [--rows 1000000 20000000] [--runs 3]

For each size, a CastSQL table of an event log (id, ts, user, kind, amount:
BIGINT, TIMESTAMPTZ, VARCHAR, VARCHAR, DECIMAL) is written once; then, each
the median of ``--runs`` runs in the same process tree and the same minutes:

* castsql: ``castsql DIR -c "SELECT * FROM events" --mode M > file``, a fresh
  process, minus the median of the same command with ``LIMIT 0`` (start-up,
  opening the table and planning: reported on its own, see also
  bench/shell_startup_bench.py);
* baseline: DuckDB's ``COPY (SELECT * FROM read_parquet(the table's files))
  TO file`` in this process: FORMAT csv for csv and markdown, FORMAT json with
  ARRAY true for json, FORMAT json for jsonlines.

Prints each ratio against the issue's targets (csv/json/jsonlines 1.5x,
markdown 2x) and the castsql process's peak memory (target 300 MB at 20M
rows). The files go to a temporary directory on the local disk.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine

CASTSQL = str(Path(sys.executable).with_name("castsql"))
MODES = {"csv": ("FORMAT csv", 1.5), "json": ("FORMAT json, ARRAY true", 1.5), "jsonlines": ("FORMAT json", 1.5)}
MODES["markdown"] = ("FORMAT csv", 2.0)
PEAK_MB = 300


def build(root: Path, rows: int) -> str:
    import duckdb

    import castsql

    con = duckdb.connect()
    table = str(root / "wh" / "events")
    step = 2_000_000  # written in pieces: 20M rows at once would hold them all in memory
    for start in range(0, rows, step):
        part = con.sql(
            f"""SELECT i AS id, TIMESTAMPTZ '2025-01-01 00:00:00+00' + to_seconds(i * 3) AS ts,
                'u' || lpad((i * 7919 % 10000)::VARCHAR, 4, '0') AS "user",
                ['view', 'click', 'buy', 'refund'][1 + i % 4] AS kind,
                ((i * 31) % 100000 / 100.0)::DECIMAL(10, 2) AS amount
            FROM range({start}, {min(rows, start + step)}) t(i)"""
        ).to_arrow_table()
        castsql.write_table(table, part, mode="append", primary_key="id")
    return table


# The peak memory of a child counts its parent's at the fork (Linux carries the
# high-water mark across exec), and this process holds the built table: so a
# small Python in between starts castsql and reports castsql's own peak.
_WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "sys.stderr.write(f'\\npeak-kb {usage.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_castsql(warehouse: str, mode: str, sql: str, out: str) -> tuple[float, float]:
    """(seconds, peak resident MB) of one castsql process writing ``sql``'s result to ``out``."""
    with open(out, "wb") as f:
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-c", _WRAPPER, CASTSQL, warehouse, "--mode", mode, "-c", sql],
            stdout=f,
            stderr=subprocess.PIPE,
        )
        elapsed = time.perf_counter() - t0
    err = r.stderr.decode()
    if r.returncode != 0:
        raise SystemExit(f"castsql failed ({r.returncode}): {err}")
    return elapsed, int(err.rsplit("peak-kb ", 1)[1]) / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 20_000_000])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = p.parse_args()
    import duckdb

    print(machine())
    ok = True
    for rows in args.rows:
        root = Path(tempfile.mkdtemp(prefix="castsql-output-bench-"))
        try:
            table = build(root, rows)
            warehouse = str(Path(table).parent)
            files = sorted(glob.glob(f"{table}/**/*.parquet", recursive=True))
            files = [f for f in files if "/_" not in f[len(table) :]]  # data files, not metadata
            con = duckdb.connect()
            start = [run_castsql(warehouse, "csv", "SELECT * FROM events LIMIT 0", os.devnull)[0] for _ in range(5)]
            start_s = statistics.median(start)
            print(f"\n{rows:,} rows, {len(files)} data files; start-up+open+plan {start_s:.3f} s")
            print(f"  {'mode':10} {'castsql':>9} {'DuckDB COPY':>12} {'ratio':>6} {'target':>7} {'peak MB':>8}")
            for mode in args.modes:
                options, target = MODES[mode]
                out = str(root / f"out.{mode}")
                sql_files = ", ".join(f"'{f}'" for f in files)
                copy_sql = f"COPY (SELECT * FROM read_parquet([{sql_files}])) TO '{root}/copy.{mode}' ({options})"
                ours, peaks = [], []
                base = []
                for _ in range(args.runs):  # interleaved, so load affects both alike
                    t0 = time.perf_counter()
                    con.execute(copy_sql)
                    base.append(time.perf_counter() - t0)
                    seconds, peak = run_castsql(warehouse, mode, "SELECT * FROM events", out)
                    ours.append(seconds - start_s)
                    peaks.append(peak)
                o, b = statistics.median(ours), statistics.median(base)
                ratio = o / b
                peak = max(peaks)
                good = ratio <= target and (rows < 20_000_000 or peak <= PEAK_MB)
                ok = ok and good
                print(
                    f"  {mode:10} {o:8.3f}s {b:11.3f}s {ratio:5.2f}x {target:5.1f}x {peak:8.0f}"
                    f"{'' if good else '   MISSED'}"
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print("\nOK" if ok else "\nMISSED: a ratio over its target (or peak memory over 300 MB at 20M rows)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
