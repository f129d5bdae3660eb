"""Shared fixtures.

* ``s3_server`` - one SeaweedFS S3 server for the whole run, started on first use.
* ``s3_root`` - a fresh ``s3://bucket/prefix`` URI per test (unique prefix in a shared bucket).
* ``gcs_server`` / ``azure_server`` - fake-gcs-server and Azurite, one each for
  the whole run, started on first use (tests/support/cloudservers.py); they put the
  cloud's usual variables in this process's environment, as a user's shell would.
* ``storage`` - a :class:`Storage` per backend: runs the test once on a local
  directory and once on S3 (the S3 run is marked ``s3``; deselect with ``-m "not s3"``).
  A module that proves a property on every store (local, S3, GCS, Azure)
  imports ``every_store`` from tests/support/stores.py, which overrides ``backend``.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Iterator

import pytest
import s3server
from cloudservers import AzuriteServer, GCSServer
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


@pytest.fixture(autouse=True)
def _s3_server_alive() -> None:
    """Before each test, a started S3 server that died is started again, with a warning."""
    for server in list(s3server.live_servers()):
        died = server.ensure_running()
        if died is not None:
            warnings.warn(f"the S3 test server had died and was started again: {died}", stacklevel=1)


@pytest.fixture
def s3_root(s3_server: SeaweedS3Server, request: pytest.FixtureRequest) -> str:
    """``s3://castsql-test/<test-name>-<random>``: nothing else writes under it."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"s3://{TEST_BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


# -- GCS and Azure -----------------------------------------------------------


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    server = GCSServer().start()
    try:
        server.create_bucket(TEST_BUCKET)
        os.environ.update(server.env)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzuriteServer]:
    server = AzuriteServer().start()
    try:
        server.create_container(TEST_BUCKET)
        os.environ.update(server.env)
        yield server
    finally:
        server.stop()


def _test_prefix(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def gcs_root(gcs_server: GCSServer, request: pytest.FixtureRequest) -> str:
    return f"gs://{TEST_BUCKET}/{_test_prefix(request)}"


@pytest.fixture
def azure_root(azure_server: AzuriteServer, request: pytest.FixtureRequest) -> str:
    return f"az://{TEST_BUCKET}/{_test_prefix(request)}"


# -- backends ----------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def storage_root(backend: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty root URI on the backend under test."""
    if backend in ("s3", "gcs", "azure"):
        return request.getfixturevalue(f"{backend}_root")
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


# -- shell -------------------------------------------------------------------


@pytest.fixture(scope="session")
def shell_warehouse(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A warehouse directory for shell tests, built once: ``events`` (versions
    0-6 of :func:`tables.build_events`, 1,896 live rows at v6, 1,900 at v3) and
    ``users`` (v1: ids 1-3, one NULL name). Tests must not write to it."""
    import os

    import pyarrow as pa
    from tables import build_events

    from castsql.format import TableLog, write_data_files

    root = tmp_path_factory.mktemp("shell") / "wh"
    build_events(open_storage(str(root / "events")))
    st = open_storage(str(root / "users"))
    log = TableLog.create(
        st, pa.schema([("id", pa.int64()), ("name", pa.string()), ("email", pa.string())]), primary_key="id"
    )
    log.append(
        write_data_files(st, pa.table({"id": [1, 2, 3], "name": ["ann", "bob", None], "email": ["a@x", "b@x", "c@x"]}))
    )
    assert os.path.isdir(root / "events")
    return str(root)


@pytest.fixture
def shell_env(tmp_path) -> dict[str, str]:
    """Environment for shell subprocesses: history in a temp file, no colors
    in pipes, no terminal cursor-position queries (a pty in tests never answers them)."""
    import os

    env = dict(os.environ)
    env.update(
        CASTSQL_HISTORY=str(tmp_path / "history"),
        PROMPT_TOOLKIT_NO_CPR="1",
        TERM="xterm-256color",
        COLUMNS="120",
        LINES="40",
    )
    env.pop("NO_COLOR", None)
    return env


# -- Spark (castsql.spark) ---------------------------------------------------


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (``local[2]``, UTC, Arrow on) for the whole run."""
    from castsql.spark import spark_session

    session = spark_session("castsql-tests")
    yield session
    session.stop()


EVENTS_T0 = 1_735_689_600  # 2025-01-01T00:00:00Z


def events_rows(ids):
    """The ``events`` rows of ``ids``: every column is a function of ``id``, so a
    set of live ids is a complete model of a table's contents."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa

    ids = [int(i) for i in ids]
    t0 = datetime.fromtimestamp(EVENTS_T0, UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array([t0 + timedelta(seconds=30 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "user": pa.array([f"u{i * 7919 % 1000:04d}" for i in ids], pa.string()),
            "kind": pa.array([("view", "click", "purchase", "refund")[i * 31 % 4] for i in ids], pa.string()),
            "amount": pa.array([round((i * 37 % 1000) / 10, 1) for i in ids], pa.float64()),
        }
    )


@pytest.fixture
def events_df(spark):
    """``events_df(ids, partitions=1)``: a Spark DataFrame of those events rows."""

    def make(ids, partitions: int = 1):
        # Files sorted by id: one file per partition, a contiguous id range each.
        df = spark.createDataFrame(events_rows(ids))
        if partitions == 1:
            return df.coalesce(1)
        return df.repartitionByRange(partitions, "id").sortWithinPartitions("id")

    return make


@pytest.fixture
def check_version(spark, request: pytest.FixtureRequest):
    """``check_version(uri, version, live_ids)``: the Spark reader and the
    engine both return exactly the model's rows at that version. (It does not
    depend on ``backend``: tests on a local path run once.)"""
    from castsql.engine.session import Session
    from castsql.spark import read

    def check(uri: str, version: int, live_ids) -> None:
        s3_config = request.getfixturevalue("s3_server").config if uri.startswith("s3://") else None
        want = events_rows(sorted(live_ids))
        got = read(spark, uri, version, s3=s3_config).toArrow()
        got = got.cast(want.schema).sort_by("id")
        assert got.num_rows == want.num_rows, f"v{version}: spark read {got.num_rows} rows, model has {want.num_rows}"
        assert got.equals(want), f"v{version}: spark reader differs from the model"
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        with Session(uri, s3=s3_config) as s:
            eng = s.sql(f"SELECT * FROM {name} AS OF VERSION {version} ORDER BY id")
        assert eng.cast(want.schema).equals(want), f"v{version}: engine differs from the model"

    return check


@pytest.fixture
def events(storage: Storage):
    """The ``events`` table of :func:`tables.build_events` (versions 0-6 and their model) on the backend under test."""
    from tables import build_events

    return build_events(storage.child("events"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (scripts/test): every test
    that needs Spark on one worker, so the run starts one Spark session; the
    other tests by module, so a module's fixtures are built once."""
    for item in items:
        spark = "spark" in getattr(item, "fixturenames", ()) or item.get_closest_marker("spark") is not None
        item.add_marker(pytest.mark.xdist_group("spark" if spark else item.module.__name__))
