"""Commits per second for 1, 4 and 16 concurrent writer processes on each
backend, next to the raw compare-and-swap rate of the same backend.

    .venv/bin/python bench/commit_bench.py [--seconds 4] [--rounds 3] [--backends local,s3,gcs,azure]

Each writer process loops for a fixed time: "append" writes a one-row Parquet
file and commits it (the whole protocol); "raw CAS" reads one object with its
ETag and swaps it (the floor the protocol is built on). Rates are medians of
the rounds; the ratio column is commits/s over raw CAS/s for the same writer count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from _common import backend_root, machine


def _wait_for_start(ready, start) -> float:
    ready.put(1)
    while start.value == 0:
        time.sleep(0.001)
    while time.time() < start.value:
        time.sleep(0.001)
    return start.value


def _cas_worker(uri: str, env: dict, seconds: float, ready, start, out) -> None:
    os.environ.update(env)
    from castsql.storage import PreconditionFailed, open_storage

    st = open_storage(uri)
    st.get_with_etag("counter")  # connect before the clock starts
    ok = 0
    end = _wait_for_start(ready, start) + seconds
    while time.time() < end:
        data, etag = st.get_with_etag("counter")
        data = data.split()[0]
        try:
            st.put_if_match("counter", str(int(data) + 1).encode() + b" " + uuid.uuid4().hex.encode(), etag)
            ok += 1
        except PreconditionFailed:
            pass
    out.put(ok)


def _commit_worker(uri: str, env: dict, seconds: float, ready, start, out) -> None:
    os.environ.update(env)
    import pyarrow as pa

    from castsql.format import TableLog, write_data_files
    from castsql.storage import open_storage

    st = open_storage(uri)
    log = TableLog(st)
    schema = log.latest().schema
    # pyarrow's first Parquet write initialises kernels for a second or more:
    # do it before the clock starts (the file is an orphan, as after a crash).
    write_data_files(st, pa.table({"x": pa.array([-1], pa.int64())}), schema)
    ok = 0
    end = _wait_for_start(ready, start) + seconds
    while time.time() < end:
        log.append(write_data_files(st, pa.table({"x": pa.array([ok], pa.int64())}), schema))
        ok += 1
    out.put(ok)


def _run(kind: str, uri: str, env: dict, writers: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Queue()
    start = ctx.Value("d", 0.0)
    target = _cas_worker if kind == "cas" else _commit_worker
    procs = [ctx.Process(target=target, args=(uri, env, seconds, ready, start, out)) for _ in range(writers)]
    for p in procs:
        p.start()
    for _ in procs:  # every process has imported and connected: start the clock
        ready.get(timeout=300)
    start.value = time.time() + 0.2
    total = sum(out.get(timeout=120 + seconds) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def _fresh(kind: str, base: str, s3cfg) -> str:
    import pyarrow as pa

    from castsql.format import TableLog
    from castsql.storage import open_storage

    uri = f"{base}/{kind}-{uuid.uuid4().hex[:8]}"
    st = open_storage(uri, s3=s3cfg)
    if kind == "cas":
        st.put("counter", b"0")
    else:
        TableLog.create(st, pa.schema([("x", pa.int64())]))
    return uri


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="local,s3,gcs,azure")
    ap.add_argument("--writers", default="1,4,16")
    args = ap.parse_args()
    counts = [int(w) for w in args.writers.split(",")]
    print(f"# commit benchmark: {machine()}; {args.seconds:g} s per run, median of {args.rounds} rounds")
    print(f"{'backend':8} {'writers':>7} {'raw CAS/s':>10} {'commits/s':>10} {'ratio':>6}")
    for backend in args.backends.split(","):
        with backend_root(backend, "commits") as (s3cfg, base):
            env = {
                k: v for k, v in os.environ.items() if k in ("STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING")
            }
            if s3cfg is not None:
                env = {
                    "AWS_ENDPOINT_URL": s3cfg.endpoint_url,
                    "AWS_ACCESS_KEY_ID": s3cfg.key,
                    "AWS_SECRET_ACCESS_KEY": s3cfg.secret,
                    "AWS_REGION": s3cfg.region,
                }
            for n in counts:
                cas = statistics.median(
                    _run("cas", _fresh("cas", base, s3cfg), env, n, args.seconds) for _ in range(args.rounds)
                )
                com = statistics.median(
                    _run("commit", _fresh("commit", base, s3cfg), env, n, args.seconds) for _ in range(args.rounds)
                )
                print(f"{backend:8} {n:>7} {cas:>10.1f} {com:>10.1f} {com / cas:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
