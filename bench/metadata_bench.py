#!/usr/bin/env python
"""Metadata at scale: format version 1 (every manifest lists every file) against
version 2 (metadata objects), side by side, measured in one run.

    .venv/bin/python bench/metadata_bench.py [--files 10000,100000,1000000] [--s3-files 100000]
                                             [--commits 40] [--v1-commits 3] [--reps 5] [--data DIR]

For each size N a synthetic table of N data files is built once (cached under
--data): entries as Spark writes them for 256 MB files of 60 row groups, five
columns with statistics (id, ts, user, kind, amount); the files themselves
need not exist. Version 1 is one manifest listing all N (what CastSQL wrote
before version 2); version 2 is the same files in metadata objects as CastSQL's
commits leave them (full objects of 16,384 files). Then, per format:

- bytes written per one-file append and per one-row delete (manifest, metadata
  objects, tombstone file; not the data file), the mean over a series of
  commits so that folds and merges are counted;
- commit latency of a fresh writer (a new TableLog per commit: pointer,
  manifest, whatever the commit reads, its puts), median;
- a cold reader's time to the pruned file list of the latest version for a
  selective predicate (``id`` in one file's range), median;
- full resolve of the latest version by a cold reader (to the columnar file
  list), median;
- warm incremental resolve after one more commit (the reader resolved the
  version before), median.

Version-1 commits are made as the version-1 writer made them (read and parse
the whole manifest, write it whole with one more entry), since CastSQL's own
writers now write version 2. Prints a table and the ratios v2/v1, and the
goals: append and delete bytes <= 64 KB and flat; fresh commit <= 100 ms at
1,000,000 files; cold pruned list <= 500 ms; full resolve <= 1 s; incremental
resolve <= 20 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import castsql  # noqa: F401 - the installed package, or a copy named by PYTHONPATH
except ImportError:
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from castsql.format import PositionDelete, Schema, TableLog, fold
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.log import pointer_bytes
from castsql.format.manifest import DataFile, Manifest, Totals, parse_manifest
from castsql.format.metafiles import write_files_object
from castsql.snapshot import Predicate, resolve
from castsql.snapshot import resolve as resolve_mod_fn
from castsql.storage import open_storage

RESOLVE = sys.modules[resolve_mod_fn.__module__]
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("user", pa.string()),
        ("kind", pa.string()),
        ("amount", pa.float64()),
    ]
)
RG, RGS = 122_880, 60
ROWS = RG * (RGS - 1) + 50_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def entries_table(n: int, start: int = 0) -> pa.Table:
    """N file entries, columnar (what a files object holds)."""
    idx = np.arange(start, start + n, dtype=np.int64)
    ids = [f"{(1_700_000_000_000 + int(i)) << 80 | (0x7 << 76) | int(i):032x}" for i in idx]
    paths = pa.array([f"data/2026/01/01/00/{h}.parquet" for h in ids], pa.string())
    rgr_values = np.tile(np.array([RG] * (RGS - 1) + [50_000], dtype=np.int64), n)
    offsets = np.arange(0, (n + 1) * RGS, RGS, dtype=np.int32)
    rgr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rgr_values))
    lo, hi = idx * ROWS, (idx + 1) * ROWS - 1
    ts_lo = pa.array((T0.timestamp() * 1e6 + idx * 60_000_000).astype(np.int64), pa.timestamp("us", tz="UTC"))
    ts_hi = pa.array(
        (T0.timestamp() * 1e6 + idx * 60_000_000 + 59_999_999).astype(np.int64), pa.timestamp("us", tz="UTC")
    )
    fields = [pa.field(f.name, f.type) for f in SCHEMA]
    mins = pa.StructArray.from_arrays(
        [pa.array(lo), ts_lo, pa.array(["u0000"] * n), pa.array(["click"] * n), pa.array(np.zeros(n))], fields=fields
    )
    maxs = pa.StructArray.from_arrays(
        [pa.array(hi), ts_hi, pa.array(["u0999"] * n), pa.array(["view"] * n), pa.array(np.full(n, 999.9))],
        fields=fields,
    )
    return pa.table(
        {
            "path": paths,
            "size_bytes": pa.array(np.full(n, 268_000_000, dtype=np.int64)),
            "row_group_count": pa.array(np.full(n, RGS, dtype=np.int64)),
            "total_rows": pa.array(np.full(n, ROWS, dtype=np.int64)),
            "row_group_rows": rgr,
            "min": mins,
            "max": maxs,
            "extra": pa.nulls(n, pa.string()),
        }
    )


def one_entry(i: int) -> DataFile:
    """The entry a one-file append commits (file number ``i`` of the table)."""
    ts = T0 + timedelta(minutes=i)
    return DataFile(
        path=f"data/2026/01/02/00/{uuid.uuid4().hex}.parquet",
        size_bytes=268_000_000,
        row_group_count=RGS,
        total_rows=ROWS,
        min={
            "id": i * ROWS,
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "user": "u0000",
            "kind": "click",
            "amount": 0.0,
        },
        max={
            "id": (i + 1) * ROWS - 1,
            "ts": (ts + timedelta(seconds=59)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "user": "u0999",
            "kind": "view",
            "amount": 999.9,
        },
        row_group_rows=tuple([RG] * (RGS - 1) + [50_000]),
    )


def _entry_json(i: int) -> str:
    return json.dumps(one_entry(i).to_json() | {"path": f"data/2026/01/01/00/{i:032x}.parquet"}, separators=(",", ":"))


def build(root: str, fmt: int, n: int, s3=None) -> str:
    """The table of N files in format ``fmt`` under ``root``; built once."""
    uri = f"{root}/v{fmt}-{n}"
    st = open_storage(uri, s3=s3)
    if st.exists(POINTER_KEY):
        return uri
    log(f"building format {fmt}, {n:,} files at {uri}")
    schema = Schema.from_arrow(SCHEMA)
    head = Manifest(1, 0, datetime.now(UTC), schema, primary_key="id", operation="APPEND", format_version=fmt)
    m0 = Manifest(0, None, head.created_at, schema, primary_key="id", operation="CREATE", format_version=fmt)
    if fmt == 1:
        body = m0.to_json() | {"data_files": [], "tombstones": []}
        st.put_if_absent(manifest_key(0), json.dumps(body).encode())
        text = json.dumps(head.to_json(), separators=(",", ":"))
        marker = '"data_files":[]'
        assert marker in text
        chunks = [text[: text.index(marker)] + '"data_files":[']
        chunks.append(",".join(_entry_json(i) for i in range(n)))
        chunks.append(text[text.index(marker) + len(marker) - 1 :])
        st.put_if_absent(manifest_key(1), "".join(chunks).encode())
    else:
        st.put_if_absent(manifest_key(0), m0.evolve(totals=Totals()).to_bytes())
        refs = []
        for start in range(0, n, fold.OBJECT_TARGET):
            t = entries_table(min(fold.OBJECT_TARGET, n - start), start)
            refs.append(write_files_object(st, t, level=fold.level_for(t.num_rows, fold.FILES_INLINE_MAX)))
        totals = Totals(files=n, rows=n * ROWS, bytes=n * 268_000_000)
        st.put_if_absent(manifest_key(1), head.evolve(file_objects=tuple(refs), totals=totals).to_bytes())
    st.put_if_absent(POINTER_KEY, pointer_bytes(1, uuid.uuid4().hex))
    return uri


def v1_commit(uri: str, s3, add: DataFile | None = None, tombstone: str | None = None) -> None:
    """A commit as the version-1 writer made it: the whole manifest read, parsed and rewritten."""
    st = open_storage(uri, s3=s3)
    data, etag = st.get_with_etag(POINTER_KEY)
    v = json.loads(data)["version"]
    while st.exists(manifest_key(v + 1)):
        v += 1
    base = parse_manifest(st.get(manifest_key(v)), uri, expected_version=v)
    new = base.evolve(
        version=v + 1,
        previous=v,
        created_at=datetime.now(UTC),
        data_files=base.data_files + ((add,) if add else ()),
        tombstones=base.tombstones + ((tombstone,) if tombstone else ()),
    )
    st.put_if_absent(manifest_key(v + 1), new.to_bytes())
    st.put_if_match(POINTER_KEY, pointer_bytes(v + 1, uuid.uuid4().hex), etag)


def _written(st, before: dict[str, int]) -> int:
    return sum(o.size for o in st.list("") if o.key not in before and not o.key.startswith("data/"))


def measure(uri: str, fmt: int, n: int, s3, commits: int, reps: int) -> dict:
    st = open_storage(uri, s3=s3)
    out: dict = {}
    series = commits if fmt == 2 else min(commits, ARGS.v1_commits)
    # Appends: bytes and fresh-writer latency.
    sizes, times = [], []
    for i in range(series):
        before = {o.key: o.size for o in st.list("")}
        entry = one_entry(n + i)
        gc.collect()
        t0 = time.perf_counter()
        if fmt == 1:
            v1_commit(uri, s3, add=entry)
        else:
            TableLog(open_storage(uri, s3=s3)).append([entry])
        times.append(time.perf_counter() - t0)
        sizes.append(_written(st, before))
    out["append_bytes"] = statistics.mean(sizes)
    out["commit_s"] = statistics.median(times)
    # One-row deletes: bytes per commit (tombstone file, manifest, objects).
    target = entries_table(1, 0).column("path")[0].as_py() if fmt == 2 else f"data/2026/01/01/00/{0:032x}.parquet"
    sizes = []
    for i in range(series):
        before = {o.key: o.size for o in st.list("")}
        rec = PositionDelete(target, None, BitMap([i]))
        if fmt == 1:
            from castsql.format.layout import new_tombstone_key
            from castsql.format.tombstone import serialize_tombstones

            key = new_tombstone_key()
            st.put_new(key, serialize_tombstones([rec]))
            v1_commit(uri, s3, tombstone=key)
        else:
            w = TableLog(open_storage(uri, s3=s3))
            w.delete([rec])
        sizes.append(_written(st, before))
    out["delete_bytes"] = statistics.mean(sizes)
    # Cold reader: pruned file list for a selective predicate.
    mid = n // 2
    preds = [Predicate("id", ">=", mid * ROWS + 10), Predicate("id", "<=", mid * ROWS + 20)]

    def cold_pruned() -> int:
        RESOLVE._cache.clear()
        snap = resolve(TableLog(open_storage(uri, s3=s3)))
        return snap.prune(preds).file_count

    # Version 1 at a million files parses ~740 MB per cold read: fewer repetitions.
    cold_reps = reps if fmt == 2 or n < 1_000_000 else ARGS.v1_reps
    out["pruned_files"] = cold_pruned()
    out["cold_pruned_s"] = _median(cold_pruned, cold_reps)

    def cold_full() -> int:
        RESOLVE._cache.clear()
        snap = resolve(TableLog(open_storage(uri, s3=s3)))
        return snap.table().num_rows if fmt == 2 else len(snap.files)

    out["full_resolve_s"] = _median(cold_full, cold_reps)
    # Warm incremental: resolve N, one more commit, resolve N+1.
    warm = TableLog(open_storage(uri, s3=s3))
    times = []
    for i in range(reps if fmt == 2 else 1):
        RESOLVE._cache.clear()
        resolve(warm)
        if fmt == 1:
            v1_commit(uri, s3, add=one_entry(n + series + i))
        else:
            TableLog(open_storage(uri, s3=s3)).append([one_entry(n + series + i)])
        t0 = time.perf_counter()
        snap = resolve(warm)
        _ = snap.table().num_rows if fmt == 2 else len(snap.files)
        times.append(time.perf_counter() - t0)
    out["incremental_s"] = statistics.median(times)
    return out


def _median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fmt_bytes(b: float) -> str:
    return f"{b / 1e6:.1f} MB" if b >= 1e6 else f"{b / 1e3:.1f} KB"


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default="10000,100000,1000000")
    ap.add_argument("--s3-files", default="100000", help="sizes also measured on the S3 test server ('' for none)")
    ap.add_argument("--commits", type=int, default=40, help="version-2 commits per series (folds and merges counted)")
    ap.add_argument("--v1-commits", type=int, default=3, help="version-1 commits per series (each costs O(table))")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--v1-reps", type=int, default=1, help="repetitions of version-1 cold reads at 1,000,000 files")
    ap.add_argument("--data", default="/tmp/castsql-metadata-bench")
    ap.add_argument("--formats", default="1,2", help="'2' measures format 2 alone (no ratios)")
    ARGS = ap.parse_args()
    ARGS.formats = [int(x) for x in ARGS.formats.split(",")]
    sizes = [int(x) for x in ARGS.files.split(",") if x]
    s3_sizes = [int(x) for x in ARGS.s3_files.split(",") if x]
    os.makedirs(ARGS.data, exist_ok=True)
    rows = []
    cases = [("local", n) for n in sizes] + [("s3", n) for n in s3_sizes]
    server = None
    for backend, n in cases:
        s3 = None
        root = ARGS.data
        if backend == "s3":
            if server is None:
                from _common import start_s3

                server = start_s3()
            s3, root = server.config, "s3://bench/metadata"
        res = {}
        for fmt in ARGS.formats:
            uri = build(root, fmt, n, s3)
            log(f"measuring format {fmt}, {n:,} files, {backend}")
            res[fmt] = measure(uri, fmt, n, s3, ARGS.commits, ARGS.reps)
        rows.append((backend, n, res))
    if server is not None:
        server.stop()
    report(rows)


def report(rows) -> None:
    print(f"\nmetadata_bench: {os.cpu_count()} cores, Python {sys.version.split()[0]}, pyarrow {pa.__version__}")
    head = ["backend", "files", "fmt", "append bytes", "delete bytes", "fresh commit", "cold pruned", "full resolve",
            "incremental"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for backend, n, res in rows:
        for fmt in sorted(res):
            r = res[fmt]
            print(
                f"| {backend} | {n:,} | v{fmt} | {fmt_bytes(r['append_bytes'])} | {fmt_bytes(r['delete_bytes'])} | "
                f"{r['commit_s'] * 1000:.0f} ms | {r['cold_pruned_s'] * 1000:.0f} ms ({r['pruned_files']} file) | "
                f"{r['full_resolve_s'] * 1000:.0f} ms | {r['incremental_s'] * 1000:.1f} ms |"
            )
        if len(res) < 2:
            continue
        a, b = res[1], res[2]
        print(
            f"| {backend} | {n:,} | v2/v1 | {b['append_bytes'] / a['append_bytes']:.4f} | "
            f"{b['delete_bytes'] / a['delete_bytes']:.4f} | {b['commit_s'] / a['commit_s']:.3f} | "
            f"{b['cold_pruned_s'] / a['cold_pruned_s']:.3f} | {b['full_resolve_s'] / a['full_resolve_s']:.3f} | "
            f"{b['incremental_s'] / a['incremental_s']:.3f} |"
        )
    print(
        "\ngoals (version 2): append and delete bytes <= 64 KB and flat in the files; at 1,000,000 files: fresh commit"
    )
    print("<= 100 ms, cold pruned list <= 500 ms, full resolve <= 1 s, incremental resolve <= 20 ms")
    for backend, n, res in rows:
        r = res[2]
        checks = [
            ("append bytes", r["append_bytes"] <= 64_000),
            ("delete bytes", r["delete_bytes"] <= 64_000),
        ]
        if n >= 1_000_000 and backend == "local":
            checks += [
                ("fresh commit", r["commit_s"] <= 0.1),
                ("cold pruned", r["cold_pruned_s"] <= 0.5),
                ("full resolve", r["full_resolve_s"] <= 1.0),
                ("incremental", r["incremental_s"] <= 0.02),
            ]
        print(f"  {backend} {n:,}: " + ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in checks))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
