#!/usr/bin/env python
"""The UI's table page on a long history: ``/tables/<name>`` of a table with
10,000 versions, served by a real ``castsql ui`` server in this process and
fetched over HTTP, against the history audit on the same table (what the
page would cost if it drew its chart from the data).

    .venv/bin/python bench/ui_bench.py [--versions 10000] [--reps 5] [--data DIR]

The table (cached under --data) is built with the format's commit API: one
small append a version, and every tenth version a one-row delete, as a
stream leaves a table. Measured, each a median over --reps:

- cold page: a new server (a new session, nothing cached) and its first
  page, which carries the newest 500 versions' points and the 100 listed;
- whole timeline: then the JSON of every version's point that the page
  fetches after it is drawn (/api/tables/<name>/timeline), on that server;
- warm page: the same page again (the server keeps the points it read);
- timeline walk: the metadata walk of all versions alone, on a new session
  (what ``castsql ui`` runs in the background at start);
- baseline: ``Table.history()``, the history audit (exact row counts, reads
  tombstones and keys), once: it is the slow path the page avoids.

Goal: the cold page in at most 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import castsql  # the installed package, or a copy named by PYTHONPATH
except ImportError:
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
from pyroaring import BitMap

import castsql
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.storage import open_storage
from castsql.ui.model import Warehouse
from castsql.ui.server import make_server


def build(root: Path, versions: int) -> str:
    """A table of ``versions`` versions (kept when it exists)."""
    uri = str(root / f"stream{versions}")
    if (Path(uri) / "_latest_manifest").exists():
        return uri
    store = open_storage(uri)
    first = pa.table({"id": pa.array([0], pa.int64()), "kind": ["a"]})
    log = TableLog.create(store, first.schema, primary_key="id")
    schema = log.latest().schema
    t0 = time.perf_counter()
    last = None
    for v in range(1, versions):
        if v % 1000 == 0:
            print(f"  built {v:,} versions ({time.perf_counter() - t0:.0f}s)", flush=True)
        if v % 10 == 0 and last is not None:
            log.delete([PositionDelete(last.path, None, BitMap([0]))])
            last = None
            continue
        data = pa.table({"id": pa.array([v], pa.int64()), "kind": ["ab"[v % 2]]})
        (last,) = write_data_files(store, data, schema)
        log.append([last])
    return uri


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--data", default="/tmp/castsql-ui-bench")
    args = ap.parse_args(argv)
    uri = build(Path(args.data), args.versions)
    name = Path(uri).name

    def serve() -> tuple[object, Warehouse, urllib.request.OpenerDirector]:
        w = Warehouse.open(uri)
        server = make_server(w, uri)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        http = urllib.request.build_opener()
        http.addheaders = [("Cookie", f"{server.cookie}={server.token}")]
        return server, w, http

    def page(server, http, path: str = "") -> bytes:
        host, port = server.server_address[:2]
        body = http.open(f"http://{host}:{port}/tables/{name}{path}").read()
        assert b"id=versions" in body or b'"total"' in body
        return body

    def whole(server, http) -> None:
        got = json.loads(
            http.open(f"http://{server.server_address[0]}:{server.server_address[1]}/api/tables/{name}/timeline").read()
        )
        assert len(got["version"]) == got["total"] == args.versions, (len(got["version"]), got["total"])

    cold, rest, warm, walk = [], [], [], []
    for _ in range(args.reps):
        server, w, http = serve()
        cold.append(timed(lambda server=server, http=http: page(server, http)))
        rest.append(timed(lambda server=server, http=http: whole(server, http)))
        warm.append(timed(lambda server=server, http=http: page(server, http)))
        server.shutdown()
        server.server_close()
        w.close()
        w = Warehouse.open(uri)
        walk.append(timed(lambda w=w: w.timeline(name)))
        w.close()
    with castsql.open(uri) as t:
        base = timed(t.history)
    n = len(Warehouse.open(uri).timeline(name))
    mc, mw, mt = statistics.median(cold), statistics.median(warm), statistics.median(walk)
    mr = statistics.median(rest)
    print(f"table page of {n:,} versions (medians of {args.reps}; shared machine):")
    print(f"  cold page (new server)         {mc * 1000:8.0f} ms   goal <= 1000 ms: {'met' if mc <= 1 else 'MISSED'}")
    print(f"  whole timeline JSON after it   {mr * 1000:8.0f} ms")
    print(f"  warm page (same server again)  {mw * 1000:8.0f} ms")
    print(f"  timeline walk alone (metadata) {mt * 1000:8.0f} ms")
    print(f"  baseline: history audit (once) {base * 1000:8.0f} ms")
    print(f"  ratios: cold page / history audit {mc / base:.3f}; warm / cold {mw / mc:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
