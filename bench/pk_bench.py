"""The cost of primary-key uniqueness on append: 1M rows into a 10M-row table,
with the check and without it (``allow_duplicate_keys=True``), same run.

    .venv/bin/python bench/pk_bench.py [--rows 10000000] [--append 1000000] [--rounds 3] [--backend local|s3]

The table holds even keys 0, 2, … in files of ``--file-rows`` rows (sorted,
as a table fed by increasing ids is). Two kinds of append, each ``--rounds``
times with and without the check, alternating which goes first, through a
freshly opened handle:

- ``new-ids``: keys above the table's largest (the usual append of new
  events): key-range pruning leaves no candidate file, nothing is read;
- ``interleaved``: odd keys spread over the whole key range (the worst case
  for min/max pruning): every file and row group is a candidate, so every key
  column of the table is read (pyarrow) and searched for the input's sorted
  keys (numpy), :func:`castsql.write.keys.existing_keys`.

After each append the table is restored to the built version (untimed), so
every round appends into the same table. Printed: median seconds of each, and
the ratio checked / unchecked. Goal
(issue 19): at most 1.3x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
from _common import backend_root, machine

import castsql
from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("v", pa.float64()), ("k", pa.string())])


def rows(keys: np.ndarray) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "ts": pa.array(keys * 3, pa.int64()),
            "v": pa.array(np.random.default_rng(int(keys[0])).random(n)),
            "k": pa.array(np.char.add("k", (keys % 1000).astype(str)), pa.string()),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--append", type=int, default=1_000_000)
    ap.add_argument("--file-rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="local")
    args = ap.parse_args()
    print(machine())
    with backend_root(args.backend, "pk") as (s3, root):
        st = open_storage(f"{root}/t", s3=s3)
        log = TableLog.create(st, SCHEMA, primary_key="id")
        t0 = time.perf_counter()
        files = []
        for lo in range(0, args.rows, args.file_rows):
            keys = np.arange(lo, min(lo + args.file_rows, args.rows), dtype=np.int64) * 2
            files += write_data_files(st, rows(keys), log.latest().schema)
        base = log.append(files).version
        print(f"table: {args.rows:,} rows in {len(files)} files, built in {time.perf_counter() - t0:.1f}s")
        top = args.rows * 2
        n, r = args.append, args.rounds
        results: dict[tuple[str, bool], list[float]] = {}
        for i in range(r):
            for kind in ("new-ids", "interleaved"):
                for checked in (True, False) if i % 2 == 0 else (False, True):
                    slot = 2 * i + (0 if checked else 1)
                    if kind == "new-ids":
                        top += 2 * n
                        keys = np.arange(top, top + n, dtype=np.int64)
                    else:
                        # odd keys, a fresh set each time, spread over [0, 2 * rows)
                        step = 2 * (2 * r)
                        keys = (np.arange(n, dtype=np.int64) * step + 2 * slot + 1) % (args.rows * 2 * 4)
                        keys = np.unique(keys)
                    data = rows(keys)
                    with castsql.open(st.root, s3=s3) as t:
                        start = time.perf_counter()
                        t.append(data, allow_duplicate_keys=not checked)
                        took = time.perf_counter() - start
                    # Back to the 10M-row table (a restore writes only metadata), so
                    # every round checks against the same table, not one grown by the
                    # rounds before it.
                    TableLog(st).restore(base)
                    results.setdefault((kind, checked), []).append(took)
                    print(f"  round {i} {kind:12} {'checked' if checked else 'unchecked':9} {took:6.2f}s", flush=True)
        for kind in ("new-ids", "interleaved"):
            a, b = statistics.median(results[(kind, True)]), statistics.median(results[(kind, False)])
            print(f"{kind:12} append {n:,} rows into {args.rows:,}: checked {a:.2f}s, unchecked {b:.2f}s, {a / b:.2f}x")


if __name__ == "__main__":
    main()
