"""CDC ordered across batches against CDC ordered within a batch only (issue 52).

    .venv/bin/python bench/cdc_bench.py [--rows 1000000] [--batches 1000] [--batch-rows 40] [--s3]

One stream of CDC batches (``--batch-rows`` changes each: updates of
existing keys, new keys and 10% deletes, sequences growing) is applied to
two copies of a ``--rows`` table (automatic compaction on), batch by batch,
in turns:

- ``ordered``: ``Table.apply_cdc(batch, key="id", op_column="op",
  sequence="seq")``: each change against the key's last applied sequence,
  deletes included (delete markers), ties decided, bad input refused;
- ``within``: what ``apply_cdc`` did before (the baseline): the last change
  of each key in the batch (``latest_per_key``), then one merge (delete,
  update, insert), with no order across batches.

Printed: commit p50 and p99 of each and their ratio (goal: ordered <= 1.1x
within), and the median of the 101 batches around batch 100 against that of
the last 101 (goal: <= 1.2x). ``--s3``: then, on the S3 test server, the
requests a replayed batch (its ``batch_id`` committed already) makes, counted
by a proxy (goal: one pointer read and one manifest read, no write).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa

import castsql
from castsql.write.cdc import latest_per_key

PROPS = {"castsql.autoCompact": "true", "castsql.compact.sortBy": "ts"}
T0 = 1_735_689_600_000_000


def table(ids: np.ndarray, seq: np.ndarray, salt: int, ops: np.ndarray | None = None) -> pa.Table:
    h = (ids * 2654435761 + salt * 97) % 1_000_003
    cols = {
        "id": pa.array(ids.astype(np.int64)),
        "seq": pa.array(seq.astype(np.int64)),
        "ts": pa.array(T0 + seq.astype(np.int64) * 1_000, pa.timestamp("us", tz="UTC")),
        "user": pa.array(np.char.add("u", (h % 100_000).astype(str)).astype(object), pa.string()),
        "amount": pa.array((h % 100_000) / 100.0 + salt),
    }
    if ops is not None:
        cols["op"] = pa.array(ops.astype(object), pa.string())
    return pa.table(cols)


def feed(n: int, count: int, size: int, rng: np.random.Generator) -> list[pa.Table]:
    out, top, seq = [], n, n
    for b in range(count):
        k_new, k_del = size * 2 // 5, size // 10
        old = rng.choice(top, size - k_new, replace=False)
        new = top + np.arange(k_new)
        top += k_new
        ids = np.concatenate([old, new])
        ops = np.array(["U"] * (size - k_new) + ["I"] * k_new)
        ops[:k_del] = "D"
        out.append(table(ids, seq + np.arange(size), b + 1, ops))
        seq += size
    return out


def ordered(t: castsql.Table, batch: pa.Table) -> None:
    t.apply_cdc(batch, key="id", op_column="op", sequence="seq")


def within(t: castsql.Table, batch: pa.Table) -> None:
    src = latest_per_key(batch, "id", "seq")
    (
        t.merge(src, on="id")
        .when_matched_delete(condition="source.op = 'D'")
        .when_matched_update_all()
        .when_not_matched_insert_all(condition="source.op <> 'D'")
        .execute()
    )


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def window(xs: list[float], at: int) -> float:
    lo = max(0, min(at - 50, len(xs) - 101))
    return statistics.median(xs[lo : lo + 101])


def replay_requests(rows: int) -> None:
    import dataclasses

    from _common import start_s3
    from faultproxy import FaultProxy

    server = start_s3()
    proxy = FaultProxy(server.ports["s3"], rate=0)
    proxy.start()
    try:
        uri = "s3://bench/cdc"
        castsql.write_table(uri, table(np.arange(rows), np.zeros(rows), 0), primary_key="id", s3=server.config)
        batch = feed(rows, 1, 40, np.random.default_rng(1))[0]
        with castsql.open(uri, s3=server.config) as t:
            t.apply_cdc(batch, key="id", op_column="op", sequence="seq", app_id="feed", batch_id=0)
        cfg = dataclasses.replace(server.config, endpoint_url=proxy.endpoint_url)
        with castsql.open(uri, s3=cfg) as t:
            proxy.requests.clear()
            m = t.apply_cdc(batch, key="id", op_column="op", sequence="seq", app_id="feed", batch_id=0)
            got = [(method, path.rsplit("/", 1)[-1]) for method, path, _ in proxy.requests]
        assert m.batch_replayed
        print(f"replayed batch on S3: {len(got)} request(s): {', '.join(f'{a} {b}' for a, b in got)}")
    finally:
        proxy.stop()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--batch-rows", type=int, default=40)
    ap.add_argument("--s3", action="store_true", help="also count a replayed batch's requests on the S3 test server")
    ap.add_argument("--dir")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="cdc-bench-"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(7)
    base = table(np.arange(args.rows), np.zeros(args.rows), 0)
    stream = feed(args.rows, args.batches, args.batch_rows, rng)
    tables = {}
    for name in ("ordered", "within"):
        castsql.write_table(str(root / name), base, primary_key="id", properties=PROPS)
        tables[name] = castsql.open(str(root / name))
    apply = {"ordered": ordered, "within": within}
    times: dict[str, list[float]] = {n: [] for n in tables}
    for b, batch in enumerate(stream):
        order = list(tables) if b % 2 == 0 else list(reversed(tables))
        for name in order:
            t0 = time.perf_counter()
            apply[name](tables[name], batch)
            times[name].append(time.perf_counter() - t0)
    same = tables["ordered"].to_arrow().sort_by("id") == tables["within"].to_arrow().sort_by("id")
    print(
        f"{args.batches} CDC batches of {args.batch_rows} changes into {args.rows:,} rows (in order; same rows: {same})"
    )
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'p99/p50':>8} {'end/100':>8}")
    for name, xs in times.items():
        p50, p99 = pct(xs, 0.5), pct(xs, 0.99)
        end = window(xs, len(xs) - 1) / window(xs, 100)
        print(f"{name:10} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {p99 / p50:8.2f} {end:8.2f}")
    ratio = pct(times["ordered"], 0.5) / pct(times["within"], 0.5)
    print(f"ordered / within, commit p50: {ratio:.2f}x (goal <= 1.1x)")
    for t in tables.values():
        t.close()
    if args.s3:
        replay_requests(min(args.rows, 100_000))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
