"""A warm query on an object store: its look for a newer version in front of
the query, against the look beside it (the query runs on the head the session
knows, and again if the look finds a newer one).

    .venv/bin/python bench/warm_look_bench.py [--rows 2000000] [--delay 0.02] [--repeat 11] [--rounds 3]

One table of ``--rows`` rows on the S3 test server, read through a proxy that
adds ``--delay`` seconds to every request (S3's first-byte latency is about
20 ms); two warm queries in one session, each timed with the look beside the
query (CastSQL's way) and in front of it (the session told it knows no head),
in turns, ``--rounds`` rounds of medians of ``--repeat``. Prints the medians
and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import numpy as np
import pyarrow as pa
from _common import start_s3
from faultproxy import FaultProxy

import castsql


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    server = start_s3()
    proxy = None
    try:
        uri = "s3://bench/warm-look/t"
        n = args.rows
        castsql.write_table(uri, pa.table({"id": np.arange(n), "v": np.arange(n) % 97}), s3=server.config)
        port = int(server.config.endpoint_url.rsplit(":", 1)[1])
        proxy = FaultProxy(port, rate=0, delay=args.delay)
        proxy.start()
        s = castsql.open(uri, s3=dataclasses.replace(server.config, endpoint_url=proxy.endpoint_url))._session
        name = s.catalog.tables[0]
        log = s.catalog.logs[name]
        knows = log.known_head

        def timed(q: str, beside: bool) -> float:
            log.known_head = knows if beside else (lambda: None)  # None: the look goes first
            try:
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    s.sql(q)
                    times.append(time.perf_counter() - t0)
                return statistics.median(times)
            finally:
                log.known_head = knows

        print(f"{n:,} rows on the S3 test server, {args.delay * 1000:.0f} ms added to each request; "
              f"medians of {args.repeat}, {args.rounds} rounds in turns")  # fmt: skip
        print(f"{'query':<48}{'beside ms':>10}{'in front ms':>12}{'ratio':>7}")
        for q in (f"SELECT count(*), sum(v) FROM {name}", f"SELECT v, count(*) FROM {name} GROUP BY v ORDER BY v"):
            s.sql(q)
            beside, front = [], []
            for _ in range(args.rounds):
                beside.append(timed(q, True))
                front.append(timed(q, False))
            b, f = statistics.median(beside), statistics.median(front)
            print(f"{q[:48]:<48}{b * 1000:>10.1f}{f * 1000:>12.1f}{b / f:>7.2f}")
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
