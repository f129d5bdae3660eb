"""Other engines reading the mirrors (issue 37): DuckDB's ``iceberg_scan`` and
``delta_scan`` over a CastSQL table's Iceberg and Delta mirrors, against
CastSQL's own read of the same version.

    .venv/bin/python bench/mirror_read_bench.py [--rows 4000000] [--files 4] [--repeat 7] [--dir DIR]

The table is ``bench/read_bench.py``'s ``rand1``: ``--rows`` rows in
``--files`` files written by CastSQL's writer, then one commit deleting 1% of
each file's rows at random positions (a roaring bitmap per file). Both
mirrors are exported (Delta: a deletion vector per file; Iceberg format
version 2: a position delete file). A copy of the table (its data files and
log, not its mirror) sets ``castsql.mirror.iceberg.formatVersion`` to 3, so
its Iceberg mirror carries the same deletes as Puffin deletion vectors.
Then, warm, in one process, the queries of ``read_bench`` (count, sum, a 2%
id range, a wide filter, a group-by) through a CastSQL session,
``delta_scan`` of the table's directory and ``iceberg_scan`` of each
mirror's metadata file, in turns, medians of ``--repeat``; every engine's
answer is checked against CastSQL's first.
Expected: each reader <= 1.3x CastSQL's read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median_time
from read_bench import build_base, build_pattern, queries

import castsql
from castsql.engine import Session
from castsql.engine.duckdb.duck import load_extension
from castsql.format import TableLog
from castsql.mirror.delta import export_delta
from castsql.mirror.iceberg import export_iceberg, metadata_key
from castsql.storage import open_storage

GOAL = 1.3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dir", help="reuse the tables built by an earlier run here")
    args = ap.parse_args(argv)
    import duckdb

    print(machine())
    root = args.dir or tempfile.mkdtemp(prefix="castsql-mirror-read-")
    os.makedirs(root, exist_ok=True)
    t0 = time.perf_counter()
    tlog = build_pattern(root, build_base(root, args.rows, args.files), "rand1")
    uri = tlog.storage.root
    export_delta(tlog)
    ice = export_iceberg(tlog)
    v = tlog.latest().version
    print(f"table {uri}: {args.rows:,} rows in {args.files} files, 1% deleted by position; "
          f"version {v}, mirrored (built in {time.perf_counter() - t0:.0f} s)")  # fmt: skip
    assert ice.latest == v
    uri3 = uri + "-v3"
    if not os.path.exists(uri3):
        shutil.copytree(uri, uri3, ignore=shutil.ignore_patterns("_iceberg", "_delta_log"))
        castsql.open(uri3).set_properties({"castsql.mirror.iceberg.formatVersion": "3"})
    ice3 = export_iceberg(TableLog(open_storage(uri3)))
    print(f"copy {uri3}: its Iceberg mirror in format version 3 from version {ice3.latest}")

    s = Session(uri)
    name = s.tables[0]
    con = duckdb.connect()
    load_extension(con, "delta")
    load_extension(con, "avro")
    load_extension(con, "iceberg")
    readers = {
        "castsql": lambda q: s.sql(q.format(t=name)).to_pylist(),
        "delta_scan": lambda q: con.sql(q.format(t=f"delta_scan('{uri}')")).fetchall(),
        "iceberg_scan": lambda q: con.sql(q.format(t=f"iceberg_scan('{uri}/{metadata_key(v)}')")).fetchall(),
        "iceberg v3": lambda q: con.sql(q.format(t=f"iceberg_scan('{uri3}/{metadata_key(ice3.latest)}')")).fetchall(),
    }
    others = [r for r in readers if r != "castsql"]
    head = "".join(f"{r:>14}" for r in readers) + "".join(f"{r + ' x':>16}" for r in others)
    print(f"\n{'query (ms, warm)':<14}{head}")
    over = False
    for qname, q in queries(args.rows).items():
        want = [tuple(r.values()) for r in readers["castsql"](q)]
        for r in others:
            got = [tuple(x) for x in readers[r](q)]
            assert _close(got, want), f"{r} {qname}: {got[:3]} != {want[:3]}"
        # In turns, so the machine's load hits all alike.
        times: dict[str, list[float]] = {r: [] for r in readers}
        for _ in range(args.repeat):
            for r, fn in readers.items():
                times[r].append(median_time(lambda fn=fn, q=q: fn(q), 1, warmup=0))
        med = {r: sorted(ts)[len(ts) // 2] for r, ts in times.items()}
        ratios = [med[r] / med["castsql"] for r in others]
        over |= max(ratios) > GOAL
        cells = "".join(f"{med[r] * 1000:>14.1f}" for r in readers) + "".join(f"{x:>16.2f}" for x in ratios)
        print(f"{qname:<14}{cells}")
    print(f"\ngoal: each reader <= {GOAL}x CastSQL's read", "(MISSED)" if over else "(met)")
    return 0


def _close(a: list[tuple], b: list[tuple]) -> bool:
    """Equal rows, floats to 1e-9 relative (sums in another order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x, y, strict=True):
            if isinstance(p, float) or isinstance(q, float):
                if abs(float(p) - float(q)) > 1e-9 * max(1.0, abs(float(q))):
                    return False
            elif p != q:
                return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
