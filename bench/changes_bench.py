"""Audits at the cost of the change: table_changes, row history and diff after many small merges.

    .venv/bin/python bench/changes_bench.py [--sizes 1000000,10000000] [--versions 1000]
                                            [--delta-versions 100] [--delta-sizes 1000000] [--repeat 5]
                                            [--no-change-data-feed] [--only-changes] [--write-cost N]

For each size it builds an events table (the rows of bench/merge_bench.py, files
of ``--file-rows`` rows in row groups of 122,880) and commits ``--versions``
small merges into it with the embedded engine, each ``merge(on id)`` of 30
updates of random existing keys, 20 new keys and one delete (Delta's
``when_matched_delete`` / ``update`` / ``not_matched_insert``). The same merges,
the first ``--delta-versions`` of them, go into a ``deltalake`` table with the
change data feed on (sizes in ``--delta-sizes``: every delta-rs merge rewrites
the files it touches, so a big table takes long to build). The CastSQL table
has ``castsql.changeDataFeed`` on too, as Delta's has its change data feed
(``--no-change-data-feed``: off, audits read the row groups tombstones hit).

Each query twice, medians of ``--repeat``: *first*, as a fresh session's
first query with nothing cached in the process (what a script pays), and
*again* in one session (what the shell pays when asked again: a version's
metadata walk is cached):

- ``table_changes`` over the last 1, 10 and 100 versions: ``SELECT count(*)``
  and every row into Arrow (``SELECT *``), against a warm full ``count(*),
  sum(amount)`` of the table, and against deltalake's ``load_cdf`` of the same
  versions (the same changes) into Arrow, a fresh ``DeltaTable`` each time;
- ``table_row_history`` of the key three of the merges updated, and of another;
- ``table_diff`` between the version before the first merge and the last,
  against reading the rows of the files that differ between them
  (``read_parquet`` of those files into Arrow) in the same session.

``--only-changes``: the ``table_changes`` lines and the ``load_cdf``
comparison only (no row history, no diff).

``--write-cost N``: instead, what the change data feed costs a writer: two
tables of the first size, with and without ``castsql.changeDataFeed``, take
the same N merges in turns; prints each one's median merge time and the ratio.

Goals (issue 34): 10 versions at 1M rows <= 100 ms; 10M <= 1.3x 1M; <= 1.0x
deltalake's load_cdf; a key's history <= 100 ms at 10M rows; the diff <= 1.2x
reading the files that differ.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
from _common import median_time
from merge_bench import ROW_GROUP, rows

import castsql
from castsql.engine import Session
from castsql.format import TableLog, write_data_files
from castsql.snapshot import resolve

BIG = 1 << 40
UPDATES, INSERTS = 30, 20
HOT = 424_242  # a key (modulo the size) three merges update: the row history's subject


def ops(n: int, versions: int, rng: np.random.Generator) -> list[pa.Table]:
    """One merge source per version: updates, inserts and one delete (``op`` = 'd')."""
    out = []
    hot = HOT % n
    hot_at = {versions // 4, versions // 2, 3 * versions // 4}
    deleted: set[int] = set()
    for i in range(versions):
        old = [int(k) for k in rng.choice(n, UPDATES + 8, replace=False) if int(k) not in deleted and k != hot]
        if i in hot_at:
            old[0] = hot
        upd, gone = old[:UPDATES], old[UPDATES]
        deleted.add(gone)
        new = n + i * INSERTS + np.arange(INSERTS)
        ids = np.array(upd + list(new) + [gone], dtype=np.int64)
        src = rows(ids, salt=i + 1)
        op = ["u"] * len(upd) + ["i"] * INSERTS + ["d"]
        out.append(src.append_column("op", pa.array(op)))
    return out


COLS = ("id", "ts", "user", "kind", "amount")


def merge_castsql(t: castsql.Table, src: pa.Table) -> None:
    (
        t.merge(src, on="id")
        .when_matched_delete(condition="source.op = 'd'")
        .when_matched_update(set={c: f"source.{c}" for c in COLS if c != "id"})
        .when_not_matched_insert(values={c: f"source.{c}" for c in COLS})
        .execute()
    )


def merge_delta(uri: str, src: pa.Table) -> None:
    from deltalake import DeltaTable

    (
        DeltaTable(uri)
        .merge(src, predicate="target.id = source.id", source_alias="source", target_alias="target")
        .when_matched_delete(predicate="source.op = 'd'")
        .when_matched_update(updates={c: f"source.{c}" for c in COLS if c != "id"})
        .when_not_matched_insert(updates={c: f"source.{c}" for c in COLS})
        .execute()
    )


def build(
    root: Path, n: int, file_rows: int, sources: list[pa.Table], delta_versions: int, cdf: bool
) -> tuple[str, str | None]:
    cs = str(root / "castsql" / "events")
    dl = str(root / "delta" / "events")
    if (root / "castsql" / "events" / "_latest_manifest").exists():  # --dir of an earlier run: reused
        print(f"# reusing the tables under {root}")
        return cs, dl if delta_versions and (root / "delta" / "events").exists() else None
    st = open_storage_of(cs)
    props = {"castsql.changeDataFeed": "true"} if cdf else None
    log = TableLog.create(st, rows(np.arange(1)).schema, primary_key="id", properties=props)
    for lo in range(0, n, file_rows):
        part = rows(np.arange(lo, min(n, lo + file_rows)))
        log.append(write_data_files(st, part, log.latest().schema, row_group_size=ROW_GROUP, target_file_bytes=BIG))
    times = []
    with castsql.open(cs) as t:
        for src in sources:
            t0 = time.perf_counter()
            merge_castsql(t, src)
            times.append(time.perf_counter() - t0)
    print(f"# castsql: {len(sources)} merges in {sum(times):.0f}s, p50 {statistics.median(times) * 1000:.0f} ms"
          f" (change data feed {'on' if cdf else 'off'})")  # fmt: skip
    if not delta_versions:
        return cs, None
    from deltalake import WriterProperties, write_deltalake

    for lo in range(0, n, file_rows):
        write_deltalake(
            dl, rows(np.arange(lo, min(n, lo + file_rows))), mode="append", target_file_size=BIG,
            writer_properties=WriterProperties(max_row_group_size=ROW_GROUP),
            configuration={"delta.enableChangeDataFeed": "true"},
        )  # fmt: skip
    t0 = time.perf_counter()
    for src in sources[:delta_versions]:
        merge_delta(dl, src)
    print(f"# deltalake: {delta_versions} merges in {time.perf_counter() - t0:.0f}s")
    return cs, dl


def open_storage_of(uri: str):
    from castsql.storage import open_storage

    return open_storage(uri)


def delta_versions_of(dl: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(dl).version()


def first(cs: str, q: str, repeat: int) -> float:
    """Median time of ``q`` as a fresh session's first query (no metadata cached in the process)."""
    import importlib

    resolver = importlib.import_module("castsql.snapshot.resolve")  # the module, not the function it exports

    times = []
    for _ in range(repeat):
        resolver._cache.clear()
        with Session(cs) as s:
            t = time.perf_counter()
            s.sql(q)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(
    n: int, cs: str, dl: str | None, dv: int, file_rows: int, repeat: int, only_changes: bool = False
) -> dict[str, float]:
    """The queries of the module's documentation on one size's tables; prints
    a table, returns the medians. ``first``: a fresh session's first query;
    ``again``: the same query again in one session (its metadata walk cached)."""
    res: dict[str, float] = {}
    with Session(cs) as s:
        last = s.log("events").latest_version()
        full = median_time(lambda: s.sql("SELECT count(*), sum(amount) FROM events"), repeat)
        res["full scan"] = full
        print(f"\n{n:,} rows, versions 0..{last}; full count(*), sum(amount), warm: {full * 1000:.1f} ms")
        print(f"{'query':<40}{'first ms':>9}{'again ms':>9}{'vs scan':>8}{'vs delta':>9}{'rows':>8}")

        def row(label: str, q: str, key: str, delta: float | None = None) -> None:
            cold = first(cs, q, repeat)
            warm = median_time(lambda: s.sql(q), repeat)
            got = s.sql(q)
            nrows = got.num_rows if got.num_columns > 1 else got.column(0)[0].as_py()
            res[key], res[key + " again"] = cold, warm
            vs = f"{cold / delta:>9.2f}" if delta else f"{'':>9}"
            print(f"{label:<40}{cold * 1000:>9.1f}{warm * 1000:>9.1f}{cold / full:>8.1f}{vs}{nrows:>8}")

        for k in (k for k in (1, 10, 100) if k < last):
            for what, sel in (("count(*)", "count(*)"), ("*", "*")):
                q = f"SELECT {sel} FROM table_changes('events', {last - k + 1}, {last})"
                row(f"table_changes {k} versions, {what}", q, f"changes {k} {what}")
        if dl is not None:
            from deltalake import DeltaTable

            top = delta_versions_of(dl)  # the deltalake table's version of the castsql table's version dv + 1
            cv = dv + 1  # castsql: version 0 creates, 1 appends (one file per --file-rows), merges follow
            assert top - dv == (n + file_rows - 1) // file_rows - 1, (top, dv)
            shift = cv - top
            for k in (k for k in (1, 10, 100) if k <= dv):
                q = f"SELECT * FROM table_changes('events', {top + shift - k + 1}, {top + shift})"

                def cdf(k: int = k) -> pa.Table:
                    return DeltaTable(dl).load_cdf(starting_version=top - k + 1, ending_version=top).read_all()

                # In turns, one of each per round: on a shared machine both
                # see the same load, and the ratio is of medians taken alike.
                nd = cdf().num_rows
                ours, theirs = [], []
                for _ in range(repeat):
                    ours.append(first(cs, q, 1))
                    t0 = time.perf_counter()
                    cdf()
                    theirs.append(time.perf_counter() - t0)
                cold, d = statistics.median(ours), statistics.median(theirs)
                res[f"vs delta {k}"] = cold
                print(f"{f'same {k} merges as load_cdf, *, in turns':<40}{cold * 1000:>9.1f}{'':>9}{'':>8}"
                      f"{cold / d:>9.2f}{s.sql(q).num_rows:>8}")  # fmt: skip
                print(f"{'':<40}  load_cdf: {d * 1000:.1f} ms, {nd} rows")
        if only_changes:
            return res
        for label, key in (("table_row_history, one key", HOT % n), ("table_row_history, another key", 5)):
            q = f"SELECT * FROM table_row_history('events', {key})"
            row(label, q, label)
        log = s.log("events")
        start = next(v for v in range(last + 1) if log.manifest(v).operation == "MERGE") - 1  # after the appends
        a, b = resolve(log, start), resolve(log, last)
        touched = sorted(b.touched_since(a))
        uris = list(dict.fromkeys([f.uri for f in a.resolved(touched)] + [f.uri for f in b.resolved(touched)]))
        files = "[" + ", ".join(f"'{u}'" for u in uris) + "]"
        base_read = median_time(lambda: s.con.sql(f"SELECT * FROM read_parquet({files})").to_arrow_table(), repeat)
        q = f"SELECT * FROM table_diff('events', {start}, {last})"
        row("table_diff before..after the merges, *", q, "diff")
        res["diff vs files"] = res["diff again"] / base_read
        print(f"{'':<40}  reading the {len(uris)} files that differ: {base_read * 1000:.1f} ms "
              f"(diff again: {res['diff vs files']:.2f}x)")  # fmt: skip
    return res


def write_cost(n: int, file_rows: int, merges: int) -> None:
    """Median merge time with and without the change data feed, merges in turns."""
    base = Path(tempfile.mkdtemp(prefix="castsql-cdf-cost-"))
    tables = {}
    for cdf in (False, True):
        st = open_storage_of(str(base / f"cdf{int(cdf)}"))
        props = {"castsql.changeDataFeed": "true"} if cdf else None
        log = TableLog.create(st, rows(np.arange(1)).schema, primary_key="id", properties=props)
        for lo in range(0, n, file_rows):
            part = rows(np.arange(lo, min(n, lo + file_rows)))
            log.append(write_data_files(st, part, log.latest().schema, row_group_size=ROW_GROUP, target_file_bytes=BIG))
        tables[cdf] = castsql.open(st.root)
    times: dict[bool, list[float]] = {False: [], True: []}
    for src in ops(n, merges, np.random.default_rng(11)):
        for cdf, t in tables.items():
            t0 = time.perf_counter()
            merge_castsql(t, src)
            times[cdf].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"{n:,} rows, {merges} merges in turns: median merge {off * 1000:.1f} ms without the change data feed, "
          f"{on * 1000:.1f} ms with it: {on / off:.2f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--delta-versions", type=int, default=100)
    ap.add_argument("--delta-sizes", default="1000000")
    ap.add_argument("--file-rows", type=int, default=1_250_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", help="where the tables are built; tables an earlier run built there are reused")
    ap.add_argument("--no-change-data-feed", action="store_true", help="build the CastSQL table without it")
    ap.add_argument("--write-cost", type=int, metavar="N", help="time N merges with and without the feed, in turns")
    ap.add_argument("--only-changes", action="store_true", help="table_changes and load_cdf only (no history, no diff)")
    args = ap.parse_args(argv)
    if args.write_cost:
        for n in [int(s) for s in args.sizes.split(",")]:
            write_cost(n, args.file_rows, args.write_cost)
        return 0
    base = Path(args.dir or tempfile.mkdtemp(prefix="castsql-changes-bench-"))
    delta_sizes = {int(s) for s in args.delta_sizes.split(",") if s}
    print(f"{os.cpu_count()} cores; {args.versions} merges of {UPDATES} updates, {INSERTS} inserts, 1 delete; "
          f"medians of {args.repeat}")  # fmt: skip
    per_size: dict[int, dict[str, float]] = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        sources = ops(n, args.versions, np.random.default_rng(11))
        dv = min(args.delta_versions, args.versions) if n in delta_sizes else 0
        cs, dl = build(base / f"n{n}", n, args.file_rows, sources, dv, not args.no_change_data_feed)
        per_size[n] = measure(n, cs, dl, dv, args.file_rows, args.repeat, args.only_changes)
    if len(per_size) > 1:
        small, large = min(per_size), max(per_size)
        print(f"\n{large:,} rows against {small:,} (same changes, same versions):")
        for key in per_size[small]:
            if key in per_size[large] and not key.startswith(("vs delta", "diff vs")):
                print(f"  {key:<30}{per_size[large][key] / per_size[small][key]:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
