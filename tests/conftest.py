"""Shared fixtures.

* ``s3_server`` - one SeaweedFS S3 server for the whole run, started on first use.
* ``s3_root`` - a fresh ``s3://bucket/prefix`` URI per test (unique prefix in a shared bucket).
* ``storage`` - a :class:`Storage` per backend: runs the test once on a local
  directory and once on S3 (the S3 run is marked ``s3``; deselect with ``-m "not s3"``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from s3server import SeaweedS3Server

from castsql.storage import Storage, open_storage

TEST_BUCKET = "castsql-test"

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]


# -- S3 ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedS3Server]:
    server = SeaweedS3Server()
    server.start()
    try:
        server.create_bucket(TEST_BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_root(s3_server: SeaweedS3Server, request: pytest.FixtureRequest) -> str:
    """``s3://castsql-test/<test-name>-<random>``: nothing else writes under it."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"s3://{TEST_BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


# -- backends ----------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def storage_root(backend: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty root URI on the backend under test."""
    if backend == "s3":
        return request.getfixturevalue("s3_root")
    return str(tmp_path / "root")


@pytest.fixture
def storage(backend: str, storage_root: str, request: pytest.FixtureRequest) -> Iterator[Storage]:
    s3 = request.getfixturevalue("s3_server").config if backend == "s3" else None
    st = open_storage(storage_root, s3=s3)
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def worker_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment for writer subprocesses: the S3 server's endpoint and keys
    as the usual AWS variables, which ``S3Config.from_env()`` reads."""
    import os

    env = dict(os.environ)
    if backend == "s3":
        cfg = request.getfixturevalue("s3_server").config
        env.update(
            AWS_ENDPOINT_URL=cfg.endpoint_url or "",
            AWS_ACCESS_KEY_ID=cfg.key or "",
            AWS_SECRET_ACCESS_KEY=cfg.secret or "",
            AWS_REGION=cfg.region,
        )
    return env


@pytest.fixture
def s3_config(backend: str, request: pytest.FixtureRequest):
    """The S3 settings a Session needs on the backend under test (None on local)."""
    return request.getfixturevalue("s3_server").config if backend == "s3" else None
