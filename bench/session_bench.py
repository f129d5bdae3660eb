"""A long-lived session following a busy table: memory and disk over many commits.

    .venv/bin/python bench/session_bench.py [--rows 1000000] [--files 4] [--commits 1000] [--every 100]

Builds a table of ``--rows`` rows in ``--files`` files with 1% of each file's
rows deleted, opens one Session and runs a query on it; then ``--commits``
times a one-row delete is committed (by another handle, as another writer
would) and the session runs ``SELECT sum(v) FROM t`` on the new version (and
checks the answer). Every ``--every`` commits it prints the process's resident
memory, the bytes in the session's work directory (DuckLake's catalog and
delete files) and the median seconds of the commits' first queries since the
last line. Issue 21's requirement: memory and disk stay bounded as versions
advance, so the last lines should look like the first ones.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from castsql.engine import Session
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.storage import open_storage


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="castsql-session-bench-")) / "t"
    st = open_storage(str(root))
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    log = TableLog.create(st, schema, primary_key="id")
    per = args.rows // args.files
    rng = np.random.default_rng(7)
    entries, live_sum = [], 0
    for i in range(args.files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        entries += write_data_files(st, pa.table({"id": ids, "v": ids}, schema=schema), target_file_bytes=1 << 40)
    log.append(entries)
    dead: dict[str, set[int]] = {}
    for f in entries:
        pos = rng.choice(per, per // 100, replace=False)
        dead[f.path] = set(int(p) for p in pos)
    log.delete([PositionDelete(f.path, None, BitMap(sorted(dead[f.path]))) for f in entries])
    base = {f.path: f.min["id"] for f in entries}
    live_sum = sum(int(ids) for ids in range(per * args.files)) - sum(base[p] + q for p, qs in dead.items() for q in qs)

    s = Session(str(root))
    assert s.sql("SELECT sum(v) AS s FROM t")["s"][0].as_py() == live_sum
    rnd = random.Random(11)
    print(f"{args.rows:,} rows in {args.files} files, 1% deleted; one session; per commit a one-row delete, a query")
    print(f"{'commits':>8}{'RSS MB':>10}{'workdir MB':>12}{'first query s':>15}")
    print(f"{0:>8}{rss_mb():>10.1f}{dir_bytes(s._workdir) / 1e6:>12.2f}{'':>15}")
    times: list[float] = []
    for n in range(1, args.commits + 1):
        f = rnd.choice(entries)
        while (p := rnd.randrange(per)) in dead[f.path]:
            pass
        dead[f.path].add(p)
        live_sum -= base[f.path] + p
        log.delete([PositionDelete(f.path, None, BitMap([p]))])
        t0 = time.perf_counter()
        got = s.sql("SELECT sum(v) AS s FROM t")["s"][0].as_py()
        times.append(time.perf_counter() - t0)
        if got != live_sum:
            raise SystemExit(f"commit {n}: sum {got}, expected {live_sum}")
        if n % args.every == 0:
            print(f"{n:>8}{rss_mb():>10.1f}{dir_bytes(s._workdir) / 1e6:>12.2f}{statistics.median(times):>15.4f}")
            times = []
    s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
