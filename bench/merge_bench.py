"""Upserts (merge) and one-row deletes: CastSQL's engines next to ``deltalake``, same data, same run.

    .venv/bin/python bench/merge_bench.py [--sizes 1000000,10000000] [--keys 10000] [--rounds 5] [--spark]

For each table size it builds the same rows twice, once as a CastSQL table
(the single-node writer) and once as a Delta table (``deltalake``), both in
files of ``--file-rows`` rows (the seed's 256 MB files, scaled to this
machine) with row groups of 122,880 rows: an integer key and four more
columns. Then, ``--rounds`` times, alternating which goes first, it upserts
``--keys`` changed keys — half of them existing keys with new values, half new
keys — with ``merge(on id).when_matched_update_all().when_not_matched_insert_all()``
into both, through a freshly opened handle each time, and records the wall time
and the bytes the merge added to the table's directory (data, tombstones and
metadata). ``--spark`` adds ``castsql.spark.merge`` on a warm local session.

Printed per size: median seconds and ratio to ``deltalake``; median bytes
written and their ratio to the Parquet size of the changed rows (written alone
with the table's writer) plus one tombstone. Then a one-row delete on the
smallest table, ``Table.delete`` against ``DeltaTable.delete``, medians and
ratio. Goals (issue 18): merge at most 0.25x deltalake at 10M rows; bytes at most
1.2x the changed rows plus one tombstone, flat in table size; delete at most 1.0x.
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

import numpy as np
import pyarrow as pa

import castsql
from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage
from castsql.write.garbage import format_bytes

ROW_GROUP = 122_880
BIG = 1 << 40  # one file per append call: the file size is set by --file-rows


def rows(ids: np.ndarray, salt: int = 0) -> pa.Table:
    """Event rows for ``ids``; ``salt`` changes every value but the key (an update)."""
    ids = ids.astype(np.int64)
    h = (ids * 2654435761 + salt * 97) % 1_000_003
    return pa.table(
        {
            "id": ids,
            "ts": pa.array((1_735_689_600 + ids + salt) * 1_000_000, pa.timestamp("us", tz="UTC")),
            "user": pa.array(np.char.add("u", (h % 100_000).astype(str)).astype(object), pa.string()),
            "kind": pa.array(np.array(["view", "click", "purchase", "refund"])[h % 4].astype(object), pa.string()),
            "amount": pa.array((h % 100_000) / 100.0 + salt),
        }
    )


def dir_bytes(path: Path) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(path):
        for n in names:
            p = os.path.join(dirpath, n)
            out[p] = os.path.getsize(p)
    return out


def added_bytes(before: dict[str, int], path: Path) -> int:
    after = dir_bytes(path)
    return sum(size for p, size in after.items() if before.get(p) != size)


def build(root: Path, n: int, file_rows: int) -> tuple[Path, Path]:
    from deltalake import WriterProperties, write_deltalake

    cs, dl = root / "castsql" / "events", root / "delta" / "events"
    st = open_storage(str(cs))
    first = rows(np.arange(0, min(n, file_rows)))
    log = TableLog.create(st, first.schema, primary_key="id")
    for lo in range(0, n, file_rows):
        part = rows(np.arange(lo, min(n, lo + file_rows)))
        log.append(write_data_files(st, part, log.latest().schema, row_group_size=ROW_GROUP, target_file_bytes=BIG))
        write_deltalake(
            str(dl), part, mode="append", target_file_size=BIG,
            writer_properties=WriterProperties(max_row_group_size=ROW_GROUP),
        )  # fmt: skip
    return cs, dl


def source(n: int, keys: int, rng: np.random.Generator, salt: int) -> pa.Table:
    """``keys`` changed keys: half existing (new values), half new keys past ``n``."""
    old = rng.choice(n, keys // 2, replace=False)
    new = n + salt * keys + np.arange(keys - keys // 2)  # new in every round
    return rows(np.concatenate([old, new]), salt=salt)


def merge_castsql(uri: Path, src: pa.Table) -> None:
    with castsql.open(str(uri)) as t:
        t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()


def merge_delta(uri: Path, src: pa.Table) -> None:
    from deltalake import DeltaTable

    (
        DeltaTable(str(uri))
        .merge(src, predicate="target.id = source.id", source_alias="source", target_alias="target")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def changed_rows_bytes(src: pa.Table, tmp: Path) -> int:
    """The Parquet size of the changed rows alone, written by the table's own writer."""
    st = open_storage(str(tmp / "alone"))
    files = write_data_files(st, src, row_group_size=ROW_GROUP)
    size = sum(f.size_bytes for f in files)
    shutil.rmtree(tmp / "alone", ignore_errors=True)
    return size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--file-rows", type=int, default=1_250_000, help="rows per data file (256 MB-class, scaled)")
    ap.add_argument("--spark", action="store_true", help="also castsql.spark.merge on a warm local session")
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory)")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="castsql-merge-bench-"))
    spark = None
    if args.spark:
        from castsql.spark import spark_session

        spark = spark_session("castsql merge bench")
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{os.cpu_count()} cores; {args.keys:,} changed keys per merge (half updates, half inserts); "
          f"{args.rounds} rounds, medians")  # fmt: skip
    head = f"{'rows':>11} {'engine':<16}{'median s':>9}{'vs delta':>9}{'written':>11}{'vs changed':>11}"
    print(head)
    salt = 1
    for n in sizes:
        root = base / f"n{n}"
        t0 = time.perf_counter()
        cs, dl = build(root, n, args.file_rows)
        sizes_of = {k: format_bytes(sum(dir_bytes(p).values())) for k, p in (("castsql", cs), ("delta", dl))}
        print(f"# built {n:,} rows in {time.perf_counter() - t0:.0f}s: {sizes_of}")
        times: dict[str, list[float]] = {"castsql embedded": [], "deltalake": []}
        written: dict[str, list[int]] = {k: [] for k in times}
        floor: list[int] = []
        engines = {"castsql embedded": (cs, merge_castsql), "deltalake": (dl, merge_delta)}
        if spark is not None:
            from castsql.spark import merge as spark_merge

            def merge_spark(uri: Path, src: pa.Table) -> None:
                df = spark.createDataFrame(src.to_pandas())
                spark_merge(
                    spark, str(uri), df, on="id"
                ).when_matched_update_all().when_not_matched_insert_all().execute()

            sp = root / "spark" / "events"
            shutil.copytree(cs, sp)
            engines["castsql spark"] = (sp, merge_spark)
            times["castsql spark"], written["castsql spark"] = [], []
        for r in range(args.rounds + 1):  # round 0 warms caches and imports, not counted
            src = source(n, args.keys, rng, salt)
            salt += 1
            order = list(engines) if r % 2 else list(reversed(engines))
            for name in order:
                uri, fn = engines[name]
                before = dir_bytes(uri)
                t = time.perf_counter()
                fn(uri, src)
                dt = time.perf_counter() - t
                if r:
                    times[name].append(dt)
                    written[name].append(added_bytes(before, uri))
            if r:
                floor.append(changed_rows_bytes(src, root))
        tomb = 2 * args.keys  # a roaring bitmap of ~5,000 scattered positions per merge: at most ~2 bytes each
        base_bytes = statistics.median(floor) + tomb
        d = statistics.median(times["deltalake"])
        for name in engines:
            m = statistics.median(times[name])
            w = statistics.median(written[name])
            print(f"{n:>11,} {name:<16}{m:>9.3f}{m / d:>9.2f}{format_bytes(int(w)):>11}{w / base_bytes:>11.2f}")
        print(f"{'':>11} changed rows alone: {format_bytes(int(statistics.median(floor)))} + tombstone ~{tomb} B")
    # One-row delete on the smallest table: fresh handles, alternating.
    n = sizes[0]
    cs, dl = base / f"n{n}" / "castsql" / "events", base / f"n{n}" / "delta" / "events"
    from deltalake import DeltaTable

    dts: dict[str, list[float]] = {"castsql embedded": [], "deltalake": []}
    for r in range(args.rounds + 1):
        key = int(rng.integers(0, n))
        for name in ["castsql embedded", "deltalake"] if r % 2 else ["deltalake", "castsql embedded"]:
            t = time.perf_counter()
            if name == "deltalake":
                DeltaTable(str(dl)).delete(f"id = {key}")
            else:
                with castsql.open(str(cs)) as tb:
                    tb.delete(f"id = {key}")
            if r:
                dts[name].append(time.perf_counter() - t)
    d = statistics.median(dts["deltalake"])
    c = statistics.median(dts["castsql embedded"])
    print(f"one-row delete on {n:,} rows: castsql embedded {c:.3f}s, deltalake {d:.3f}s, ratio {c / d:.2f}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
