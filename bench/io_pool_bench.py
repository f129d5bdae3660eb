"""Parquet footers read on the process's I/O threads
(``castsql.storage.base.overlapped``, 16 shared threads) against a pool of 8
started per call, as ``spark/native_read.py``, ``spark/native_write.py`` and
``spark/appends.py`` did before they used storage's (issue 55).

    .venv/bin/python bench/io_pool_bench.py [--files 64] [--rounds 15]

Writes ``--files`` small Parquet files to a temporary directory, then
``--rounds`` times, alternating which goes first, reads every footer both
ways. Printed: each way's median seconds and the ratio shared / own pool
(at most ~1.0 is no regression).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from castsql.storage.base import overlapped


def _own_pool(paths: list[str]) -> list[object]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(pq.read_metadata, paths))


def _shared(paths: list[str]) -> list[object]:
    return overlapped(pq.read_metadata, paths)


def _seconds(fn: Callable[[list[str]], list[object]], paths: list[str]) -> float:
    start = time.perf_counter()
    fn(paths)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        table = pa.table({"id": pa.array(range(10_000), pa.int64()), "v": pa.array(range(10_000), pa.float64())})
        paths = [f"{d}/f{i}.parquet" for i in range(args.files)]
        for p in paths:
            pq.write_table(table, p, row_group_size=1_000)
        ways = {"own pool of 8": _own_pool, "shared (overlapped)": _shared}
        times: dict[str, list[float]] = {k: [] for k in ways}
        _own_pool(paths), _shared(paths)  # warm the page cache and the shared threads
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                times[name].append(_seconds(ways[name], paths))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:22} median {v * 1000:.2f} ms over {args.rounds} rounds, {args.files} files")
    print(f"ratio shared / own pool: {med['shared (overlapped)'] / med['own pool of 8']:.2f}")


if __name__ == "__main__":
    main()
