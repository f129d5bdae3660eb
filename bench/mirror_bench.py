"""What keeping the Delta and Iceberg mirrors in step costs per commit,
against the commit itself (issue 37), on a table of many files.

    .venv/bin/python bench/mirror_bench.py [--files 100000] [--commits 15] [--iceberg-format-version 3]

A local table whose version 1 lists ``--files`` data files (entries only: a
commit and its mirror read metadata, never the data, for appends and
position deletes), mirrored once up to there. Then, alternately, a one-row
delete (a position tombstone on one file) and a one-file append are
committed; after each, ``export_delta`` and ``export_iceberg`` write their
mirror versions. Per kind and mirror: the median time and the bytes the
commit wrote (manifest, tombstone, metadata objects) and the mirror wrote
(Delta: commit file, deletion vectors; Iceberg: manifests, manifest list,
position delete file or, in format version 3, Puffin deletion vectors,
metadata file), and their ratios. Goal: the mirror adds at most 1x the commit's own metadata
bytes and time.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine


def _entry(i: int, rows: int = 1_000_000):
    from castsql.format import DataFile

    return DataFile(
        path=f"data/2024/01/01/00/{uuid.UUID(int=random.Random(i).getrandbits(128)).hex}.parquet",
        size_bytes=20_000_000,
        row_group_count=8,
        total_rows=rows,
        min={"id": i * rows},
        max={"id": (i + 1) * rows - 1},
        row_group_rows=(rows // 8,) * 8,
    )


def _written(root: str) -> dict[str, int]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=15)
    ap.add_argument("--iceberg-format-version", choices=("2", "3"), default="2")
    args = ap.parse_args()
    import pyarrow as pa
    from pyroaring import BitMap

    from castsql.format import PositionDelete, TableLog
    from castsql.mirror.delta import export_delta
    from castsql.mirror.iceberg import export_iceberg
    from castsql.storage import open_storage

    print(machine())
    root = tempfile.mkdtemp(prefix="mirror-bench-") + "/t"
    st = open_storage(root)
    props = {"castsql.mirror.iceberg.formatVersion": args.iceberg_format_version}
    log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id", properties=props)
    t0 = time.perf_counter()
    log.append([_entry(i) for i in range(args.files)])
    built = time.perf_counter() - t0
    print(f"table: {args.files:,} files (built in {built:.1f} s)")
    mirrors = {"Delta": export_delta, "Iceberg": export_iceberg}
    for name, export in mirrors.items():
        t0 = time.perf_counter()
        first = export(log)
        print(
            f"first {name} mirror of versions 0-1: {time.perf_counter() - t0:.2f} s, {first.bytes_written / 1e6:.1f} MB"
        )

    rng = random.Random(1)
    names = [_entry(i).name for i in range(args.files)]
    kinds: dict[str, dict[str, list[float]]] = {}
    for i in range(args.commits * 2):
        kind = "one-row delete" if i % 2 == 0 else "one-file append"
        before = _written(root)
        t0 = time.perf_counter()
        if kind == "one-row delete":
            log.delete([PositionDelete(rng.choice(names), None, BitMap([rng.randrange(1_000_000)]))])
        else:
            log.append([_entry(args.files + i)])
        commit_s = time.perf_counter() - t0
        after = _written(root)
        commit_b = sum(v for k, v in after.items() if k not in before)
        for name, export in mirrors.items():
            t0 = time.perf_counter()
            r = export(log)
            mirror_s = time.perf_counter() - t0
            assert r.written == [log.latest().version]
            k = kinds.setdefault(f"{kind}, {name}", {"commit_s": [], "mirror_s": [], "commit_b": [], "mirror_b": []})
            k["commit_s"].append(commit_s)
            k["mirror_s"].append(mirror_s)
            k["commit_b"].append(commit_b)
            k["mirror_b"].append(r.bytes_written)

    head = f"{'commit kind, mirror':<26}{'commit ms':>10}{'mirror ms':>10}{'ratio':>7}"
    print(f"\n{head}{'commit B':>10}{'mirror B':>10}{'ratio':>7}")
    over = False
    for kind, k in kinds.items():
        cs, ms = statistics.median(k["commit_s"]) * 1000, statistics.median(k["mirror_s"]) * 1000
        cb, mb = statistics.median(k["commit_b"]), statistics.median(k["mirror_b"])
        over |= ms / cs > 1 or mb / cb > 1
        print(f"{kind:<26}{cs:>10.1f}{ms:>10.1f}{ms / cs:>7.2f}{cb:>10.0f}{mb:>10.0f}{mb / cb:>7.2f}")
    print(
        "\nmedians of", args.commits, "commits of each kind; goal: both ratios <= 1.0", "(MISSED)" if over else "(met)"
    )
    # The Delta checkpoint of this table's state, and how often the mirror writes one (checkpoint.due).
    import math

    from castsql.mirror import checkpoint as checkpoints
    from castsql.mirror.delta import _replay, mirrored_versions

    state = _replay(st, mirrored_versions(st))
    t0 = time.perf_counter()
    body, _ = checkpoints.checkpoint(state.protocol, state.meta, [state.adds[k] for k in sorted(state.adds)])
    took = time.perf_counter() - t0
    cs = statistics.median([c for k in kinds.values() for c in k["commit_s"]])
    cb = statistics.median([c for k in kinds.values() for c in k["commit_b"]])
    j = statistics.median([b for name, k in kinds.items() if "Delta" in name for b in k["mirror_b"]])
    want = checkpoints.BYTES_PER_FILE * len(state.adds) + checkpoints.FIXED_BYTES
    n = max(checkpoints.MIN_INTERVAL, min(checkpoints.MAX_INTERVAL, math.ceil(want / j)))
    print(
        f"Delta checkpoint of {len(state.adds):,} files: {took * 1000:.0f} ms, {len(body) / 1e6:.2f} MB; "
        f"written every {n} versions here, so per commit {took / n * 1000:.2f} ms = {took / n / cs:.2f}x a "
        f"commit's time and {len(body) / n:.0f} B = {len(body) / n / cb:.2f}x its bytes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
