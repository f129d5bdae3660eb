"""Shared by the benchmarks: medians, ratios, and the S3 test server."""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"  # the test servers (s3server, cloudservers)
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def median_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def start_s3():
    """A SeaweedFS server on 127.0.0.1 (the one the test suite uses) with a bucket."""
    from s3server import SeaweedS3Server

    server = SeaweedS3Server()
    server.start()
    server.create_bucket("bench")
    return server


@contextlib.contextmanager
def backend_root(backend: str, name: str) -> Iterator[tuple[object, str]]:
    """(S3 config or None, a root URI nobody else uses) for ``local``, ``s3``,
    ``gcs`` or ``azure`` (a SeaweedFS, fake-gcs-server or Azurite server that
    lives as long as the block; GCS's and Azure's settings go into this
    process's environment, which worker processes inherit)."""
    if backend in ("gcs", "azure"):
        import os

        from cloudservers import AzuriteServer, GCSServer

        server = GCSServer().start() if backend == "gcs" else AzuriteServer().start()
        try:
            if backend == "gcs":
                server.create_bucket("bench")
            else:
                server.create_container("bench")
            os.environ.update(server.env)
            yield None, f"{'gs' if backend == 'gcs' else 'az'}://bench/{name}"
        finally:
            server.stop()
    elif backend == "s3":
        server = start_s3()
        try:
            yield server.config, f"s3://bench/{name}"
        finally:
            server.stop()
    elif backend == "local":
        yield None, tempfile.mkdtemp(prefix=f"castsql-{name}-")
    else:
        raise SystemExit(f"unknown backend {backend!r} (use local, s3, gcs or azure)")


def ensure_bytecode() -> None:
    """CastSQL's modules compiled, as ``scripts/setup`` leaves them (an
    installed package has its bytecode): a bench of fresh processes then
    measures CastSQL, not the compiling of sources edited since the setup."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "castsql"), quiet=2)


def machine() -> str:
    import os
    import platform

    import duckdb
    import pyarrow

    return (
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"DuckDB {duckdb.__version__}, pyarrow {pyarrow.__version__}"
    )
