"""S3 requests and latency of a cold query, an append and a delete, through a
request-counting proxy that delays every request (issue 36).

    .venv/bin/python bench/s3_requests_bench.py [--rows 1000000] [--delay 0.02]

A SeaweedFS server on 127.0.0.1 (the tests' own) holds a table of ``--rows``
rows in one data file; a proxy in front of it (tests/faultproxy.py, no faults)
adds ``--delay`` seconds to every request, about S3's first-byte latency, and
logs each one. Measured through the proxy:

* a fresh ``castsql`` process answering a selective query
  (``SELECT * FROM events WHERE id = …``), launch to exit;
* in one process that has the table open: a one-file append and a one-row
  delete.

Each line lists the requests by method and what they touched (the pointer, a
manifest, a data file's footer or column ranges, a tombstone), so a request
that need not be made shows by name. The issue's targets: ≤ 6 requests before
the column range reads of the query, ≤ 5 for an append, ≤ 6 for a delete.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from _common import machine, start_s3
from faultproxy import FaultProxy

CASTSQL = str(Path(sys.executable).with_name("castsql"))
TARGETS = {"query (before the column reads)": 6, "append": 5, "delete": 6}


def kind(path: str) -> str:
    """What a request's path names, in the format's terms (FORMAT.md)."""
    name = path.split("?", 1)[0].rsplit("/", 1)[-1]
    if "list-type=" in path or path.rstrip("/").count("/") <= 1:
        return "list"
    if name == "_latest_manifest":
        return "pointer"
    if "/manifest/" in path:
        return "manifest"
    if "tomb" in path or "delete" in name:
        return "tombstone"
    if name.endswith(".parquet"):
        return "data"
    return name or "bucket"


def describe(requests: list[tuple[str, str, str]]) -> str:
    counts = Counter(f"{m} {kind(p)}{' range' if r else ''}" for m, p, r in requests)
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--delay", type=float, default=0.02)
    p.add_argument("--show", action="store_true", help="print every request")
    args = p.parse_args()
    import pyarrow as pa

    import castsql
    from castsql.storage import S3Config

    print(machine())
    server = start_s3()
    proxy = FaultProxy(server.ports["s3"], rate=0, delay=args.delay)
    proxy.start()
    try:
        uri = "s3://bench/requests/events"
        n = args.rows
        data = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array([f"v{i % 977}" for i in range(n)])})
        castsql.write_table(uri, data, primary_key="id", s3=server.config)
        via = S3Config(endpoint_url=proxy.endpoint_url, key=server.access_key, secret=server.secret_key)
        env = dict(
            os.environ,
            AWS_ENDPOINT_URL=proxy.endpoint_url,
            AWS_ACCESS_KEY_ID=server.access_key,
            AWS_SECRET_ACCESS_KEY=server.secret_key,
            AWS_REGION="us-east-1",
        )
        results = []
        proxy.requests.clear()
        t0 = time.perf_counter()
        out = subprocess.run(
            [CASTSQL, uri, "-csv", "-c", f"SELECT * FROM events WHERE id = {n // 2}"],
            env=env,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"query failed: {out.stderr}")
        reqs = list(proxy.requests)
        first_range = next((i for i, (_, path, r) in enumerate(reqs) if r and kind(path) == "data"), len(reqs))
        results.append(("query (before the column reads)", first_range, elapsed, reqs))
        with castsql.open(uri, s3=via) as table:
            table.to_arrow()  # the process has the table open and read, as a stream's writer has
            for what, write in (
                ("append", lambda t: t.append(pa.table({"id": [n + 1], "v": ["new"]}))),
                ("delete", lambda t: t.delete(f"id = {n // 3}")),
            ):
                proxy.requests.clear()
                t0 = time.perf_counter()
                write(table)
                results.append((what, len(proxy.requests), time.perf_counter() - t0, list(proxy.requests)))
        print(f"{n:,} rows in one file; every request delayed {args.delay * 1000:.0f} ms\n")
        ok = True
        for what, count, seconds, reqs in results:
            target = TARGETS[what]
            ok = ok and count <= target
            print(f"  {what:34} {count:3} requests (target ≤ {target})  {seconds:6.3f} s   {describe(reqs)}")
            if args.show:
                for m, path, r in reqs:
                    print(f"      {m:6} {path} {r}")
        print("\nOK" if ok else "\nOVER: more requests than the targets")
        return 0 if ok else 1
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
