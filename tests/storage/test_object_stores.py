"""GCS and Azure as a user meets them: the shell, the writer command line and
the Python API on each store's own URLs, with each cloud's usual variables;
safe mode and credentials; clear, bounded errors. The format, commit, race,
crash and engine suites run on every store too (their modules use
``every_store``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultproxy import FaultProxy

import castsql
from castsql.engine.session import Session
from castsql.errors import CastSQLError, StorageError, StorageUnreachable
from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage

CLOUDS = [pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)]


@pytest.fixture(params=CLOUDS)
def cloud_root(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_root")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=120,
    )


def events(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "v": pa.array([i * 10 for i in range(lo, hi)])})


def test_the_shell_and_the_writer_cli_work_on_the_store(cloud_root, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(events(0, 100), src)
    uri = f"{cloud_root}/events"
    p = cli("append", uri, "--from", str(src), "--primary-key", "id")
    assert p.returncode == 0, p.stderr
    p = cli("delete", uri, "--where", "id < 10")
    assert p.returncode == 0, p.stderr
    p = cli(uri, "-c", "SELECT count(*) AS n, min(id) AS lo FROM events")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["n,lo", "90,10"]  # csv when not a terminal, as duckdb
    p = cli(uri, "-c", "SELECT count(*) AS n FROM events AS OF VERSION 1")
    assert p.stdout.split() == ["n", "100"]


def test_the_python_api_time_travels_and_audits(cloud_root):
    uri = f"{cloud_root}/t"
    castsql.write_table(uri, events(0, 50), primary_key="id")
    t = castsql.open(uri)
    base = t.version
    t.update({"v": "-1"}, "id = 7")
    t.delete("id >= 40")
    assert castsql.open(uri).to_arrow().num_rows == 40
    with Session(uri) as s:
        kinds = s.sql(
            f"SELECT _change_type, count(*) AS n FROM table_changes('t', {base + 1}, {base + 2}) GROUP BY 1 ORDER BY 1"
        ).to_pylist()
        assert kinds == [
            {"_change_type": "delete", "n": 10},
            {"_change_type": "update_postimage", "n": 1},
            {"_change_type": "update_preimage", "n": 1},
        ]
        assert s.sql(f"SELECT v FROM t AS OF VERSION {base} WHERE id = 7").to_pylist() == [{"v": 70}]


def test_other_spellings_of_a_url_name_the_same_table(request: pytest.FixtureRequest):
    gs = request.getfixturevalue("gcs_root") + "/t"
    castsql.write_table(gs, events(0, 3))
    assert castsql.open(gs.replace("gs://", "gcs://")).to_arrow().num_rows == 3
    az = request.getfixturevalue("azure_root") + "/t"
    castsql.write_table(az, events(0, 4))
    container, rest = az.removeprefix("az://").split("/", 1)
    abfss = f"abfss://{container}@devstoreaccount1.dfs.core.windows.net/{rest}"
    assert open_storage(abfss).root == az
    assert castsql.open(abfss).to_arrow().num_rows == 4


def test_safe_mode_confines_reads_and_hides_credentials(cloud_root):
    uri, other = f"{cloud_root}/t", f"{cloud_root}/other"
    castsql.write_table(uri, events(0, 5))
    castsql.write_table(other, events(0, 7))
    p = cli(uri, "--safe", "-c", f"SELECT count(*) FROM read_parquet('{other}/data/*/*/*/*/*.parquet')")
    assert p.returncode != 0 and "safe mode" in p.stderr and "Traceback" not in p.stderr
    with Session(uri, safe=True) as s:
        assert s.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 5}]
        secrets = " ".join(str(r) for r in s.sql("SELECT secret_string FROM duckdb_secrets()").to_pylist())
        settings = " ".join(str(r) for r in s.sql("SELECT value FROM duckdb_settings()").to_pylist())
    for secret in (os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").split("AccountKey=")[-1].split(";")[0],):
        assert secret and secret not in secrets and secret not in settings


def test_sql_cannot_write_into_a_table_through_any_spelling(cloud_root):
    uri = f"{cloud_root}/t"
    castsql.write_table(uri, events(0, 5))
    target = uri + "/data/evil.parquet"
    if uri.startswith("az://"):
        container, rest = uri.removeprefix("az://").split("/", 1)
        target = f"abfss://{container}@devstoreaccount1.dfs.core.windows.net/{rest}/data/evil.parquet"
    with Session(uri) as s, pytest.raises(CastSQLError, match="overlaps"):
        s.sql(f"COPY (SELECT 1 AS x) TO '{target}'")


def test_a_missing_bucket_or_container_is_named(request: pytest.FixtureRequest):
    request.getfixturevalue("gcs_server")
    request.getfixturevalue("azure_server")
    with pytest.raises(StorageError, match="castsql-no-such"):
        open_storage("az://castsql-no-such/t").get("_latest_manifest")
    with pytest.raises(CastSQLError) as e:
        castsql.open("gs://castsql-no-such/t")
    assert "gs://castsql-no-such/t" in str(e.value)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_an_unreachable_store_is_a_bounded_one_line_error(cloud, request, monkeypatch):
    request.getfixturevalue(f"{cloud}_server")  # its variables, then pointed at a closed port
    if cloud == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
        monkeypatch.setenv("CASTSQL_GCS_CONNECT_TIMEOUT", "1")
        uri = "gs://castsql-test/t"
    else:
        cs = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING", cs.replace(cs.split("BlobEndpoint=")[1].split("/")[2], "127.0.0.1:9")
        )
        monkeypatch.setenv("CASTSQL_AZURE_CONNECT_TIMEOUT", "1")
        uri = "az://castsql-test/t"
    t0 = time.monotonic()
    with pytest.raises(StorageUnreachable) as e:
        open_storage(uri).get("_latest_manifest")
    assert time.monotonic() - t0 < 30
    assert "did not answer" in str(e.value) and uri in str(e.value) and "\n" not in str(e.value)
    p = cli(uri, "-c", "SELECT 1")
    assert p.returncode != 0 and "did not answer" in p.stderr and "Traceback" not in p.stderr


def test_a_pointer_move_that_fails_after_the_commit_point_still_reports_the_commit(gcs_server, gcs_root, monkeypatch):
    """GCS allows about one write a second to one object name, and any store
    can stop answering: once the manifest is created the version stands, so
    the write reports it (a user retrying a failed append would add the rows
    twice), and readers find it past the lagging pointer."""
    from castsql.format.metadata import parse_pointer

    proxy = FaultProxy(gcs_server.port, rate=0)
    proxy.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
        monkeypatch.setenv("CASTSQL_GCS_READ_TIMEOUT", "1")
        uri = f"{gcs_root}/t"
        castsql.write_table(uri, events(0, 10), primary_key="id")
        table = castsql.open(uri)
        # Stall the pointer's compare-and-swap only (a conditional upload on a generation).
        proxy.stall = lambda method, path: "ifGenerationMatch=" in path and "ifGenerationMatch=0" not in path
        m = table.append(events(10, 20))
        proxy.stall = None
        pointer = parse_pointer(open_storage(uri).get("_latest_manifest"), uri)
        assert pointer == m.version - 1  # the pointer lags ...
        assert castsql.open(uri).to_arrow().num_rows == 20  # ... and readers roll forward
        assert castsql.open(uri).append(events(20, 21)).version == m.version + 1  # the next writer too
    finally:
        proxy.stop()


def test_an_error_inside_duckdbs_read_of_the_store_is_one_line(cloud_root):
    """GCS and Azure objects are read by DuckDB through CastSQL's storage: an
    error there reaches the user as CastSQL's one line, not with DuckDB's
    report of a Python traceback."""
    uri = f"{cloud_root}/t"
    castsql.write_table(uri, events(0, 5))
    dotted = f"{cloud_root}/x/../t/data/*/*/*/*/*.parquet"  # a key GCS may hold, Azure refuses
    p = cli(uri, "-c", f"SELECT count(*) FROM read_parquet('{dotted}')")
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and "At:" not in p.stderr, p.stderr


@contextlib.contextmanager
def _proxied(cloud: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A counting proxy in front of the GCS or Azure test server, through which
    this process's requests go while the block lasts."""
    port = request.getfixturevalue(f"{cloud}_server").port
    proxy = FaultProxy(port, rate=0)
    proxy.start()
    try:
        if cloud == "gcs":
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
        else:
            cs = os.environ["AZURE_STORAGE_CONNECTION_STRING"].replace(f"http://127.0.0.1:{port}", proxy.endpoint_url)
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", cs)
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_first_query_asks_the_store_nothing_it_was_told_already(cloud, request, monkeypatch):
    """Requests at the floor (issue 36): the open's check that the URI is a
    table reads the pointer, and the first query uses that read instead of
    its own; DuckDB's first open of a data file takes the file's size from
    the manifest instead of asking the store for it."""
    uri = f"{request.getfixturevalue(f'{cloud}_root')}/t"
    castsql.write_table(uri, events(0, 100), primary_key="id")
    with _proxied(cloud, request, monkeypatch) as proxy:
        con = castsql.connect(uri)
        assert con.sql("SELECT v FROM t WHERE id = 42").to_pylist() == [{"v": 420}]
        pointer = [(m, p) for m, p, _ in proxy.requests if "_latest_manifest" in p]
        assert len(pointer) == 1 and pointer[0][0] == "GET", proxy.requests
        # The data file is only read, in ranges: no HEAD (Azure) or metadata GET (GCS) for its size.
        assert all(r for _, p, r in proxy.requests if ".parquet" in p), proxy.requests
        # A pointer read at open stands in for one query's read only: the next reads it again.
        proxy.requests.clear()
        castsql.write_table(uri, events(100, 101), mode="append")
        proxy.requests.clear()
        assert con.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 101}]
        assert [m for m, p, _ in proxy.requests if "_latest_manifest" in p] == ["GET"]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_warm_query_reads_no_data_file_again(cloud, request, monkeypatch):
    """Data files never change: their bytes, once read, are kept by the
    process (castsql.storage.objectfs.Blocks), so a query asked again, or
    another of the same columns, makes only the freshness check's requests;
    a new version's new file is read, its old ones are not."""
    uri = f"{request.getfixturevalue(f'{cloud}_root')}/t"
    castsql.write_table(uri, events(0, 1000), primary_key="id")
    with _proxied(cloud, request, monkeypatch) as proxy:
        con = castsql.connect(uri)
        q = "SELECT count(*) AS n, sum(v) AS s FROM t WHERE id >= 10"
        assert con.sql(q).to_pylist() == [{"n": 990, "s": sum(i * 10 for i in range(10, 1000))}]
        assert [p for _, p, _ in proxy.requests if ".parquet" in p]  # read once
        proxy.requests.clear()
        assert con.sql(q).to_pylist() == [{"n": 990, "s": sum(i * 10 for i in range(10, 1000))}]
        assert not [p for _, p, _ in proxy.requests if ".parquet" in p], proxy.requests
        castsql.write_table(uri, events(1000, 1001), mode="append")
        proxy.requests.clear()
        assert con.sql(q).to_pylist() == [{"n": 991, "s": sum(i * 10 for i in range(10, 1001))}]
        read = {p.rsplit("/", 1)[-1] for _, p, _ in proxy.requests if ".parquet" in p}
        assert len(read) == 1, proxy.requests  # the new file only
        # Objects a table's writers overwrite in place are read anew each time.
        st, hint = open_storage(uri), f"{uri}/_iceberg/metadata/version-hint.text"
        for text in ("1", "22"):
            st.put("_iceberg/metadata/version-hint.text", text.encode())
            assert con.sql(f"SELECT content FROM read_text('{hint}')").to_pylist() == [{"content": text}]


def test_a_manifest_that_lies_about_a_files_size_fails_that_read_naming_it(cloud_root):
    """GCS and Azure reads take a data file's size from its manifest: a wrong
    one fails the query in one line naming the table, the version and the
    file (as a damaged footer would), and never returns other rows."""
    import json

    uri = f"{cloud_root}/t"
    castsql.write_table(uri, events(0, 100), primary_key="id")
    st = open_storage(uri)
    m = json.loads(st.get("manifest/v00000001.json"))
    m["files"]["inline"][0]["size_bytes"] += 100
    m["totals"]["bytes"] += 100
    st.delete("manifest/v00000001.json")
    st.put("manifest/v00000001.json", json.dumps(m).encode())
    p = cli(uri, "-c", "SELECT sum(v) FROM t")
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "version 1" in p.stderr and m["files"]["inline"][0]["path"] in p.stderr


@pytest.mark.s3
def test_on_s3_a_session_asks_a_data_files_size_once(s3_server, s3_root):
    """httpfs HEADs a file each time a query opens it (4 times in a first
    query, twice in each after): a table's data files never change, so a
    session asks once, and a query after the first asks nothing but the
    pointer, the probe past it and the column ranges."""
    import dataclasses

    uri = f"{s3_root}/t"
    castsql.write_table(uri, events(0, 100), primary_key="id", s3=s3_server.config)
    proxy = FaultProxy(s3_server.ports["s3"], rate=0)
    proxy.start()
    try:
        with Session(uri, s3=dataclasses.replace(s3_server.config, endpoint_url=proxy.endpoint_url)) as s:
            assert s.sql("SELECT v FROM t WHERE id = 42").to_pylist() == [{"v": 420}]
            assert [m for m, p, _ in proxy.requests if ".parquet" in p].count("HEAD") == 1, proxy.requests
            proxy.requests.clear()
            assert s.sql("SELECT v FROM t WHERE id = 43").to_pylist() == [{"v": 430}]
            assert not [p for m, p, _ in proxy.requests if m == "HEAD"], proxy.requests
    finally:
        proxy.stop()


@pytest.mark.parametrize("cloud", [pytest.param("s3", marks=pytest.mark.s3), *CLOUDS])
def test_a_session_on_s3_keeps_requests_in_flight_on_more_threads_than_cores(cloud, request, tmp_path):
    """DuckDB reads a remote file on the thread that scans it: on S3 a query
    that reads more new row groups than cores runs on at least REMOTE_THREADS
    (a many-file audit with 20 ms per request: 5.2 s on 2 threads, 1.7 s on
    16), and one that finds them all in DuckDB's caches on the cores (a warm
    aggregate: 11.0 ms against 15.4); GCS and Azure keep DuckDB's default
    (their fsspec handles would multiply a scan's requests); threads the
    caller chose, or a caller's own connection, are left alone."""
    import duckdb

    from castsql.engine.session import REMOTE_THREADS

    uri = f"{request.getfixturevalue(f'{cloud}_root')}/t"
    s3 = request.getfixturevalue("s3_server").config if cloud == "s3" else None
    default = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
    castsql.write_table(uri, events(0, 10), primary_key="id", s3=s3)
    st = open_storage(uri, s3=s3)
    n = 10 + 10 * (default + 1)
    TableLog(st).append(write_data_files(st, events(10, n), row_group_size=10))  # more row groups than cores

    def threads(s: Session) -> int:
        return s.con.execute("SELECT current_setting('threads')").fetchone()[0]

    with Session(uri, s3=s3) as s:
        assert threads(s) == default
        q = "SELECT count(*) AS n, sum(v) AS v FROM t"
        assert s.sql(q)["n"][0].as_py() == n
        assert threads(s) == (max(default, REMOTE_THREADS) if cloud == "s3" else default)
        assert s.sql(q)["n"][0].as_py() == n
        assert threads(s) == default  # nothing left to fetch
        castsql.open(uri, s3=s3).append(events(n, n + 1))  # one new row group
        assert s.sql(q)["n"][0].as_py() == n + 1
        assert threads(s) == default
        s.sql("SET threads = 5")  # the user's, kept through a cold read of many row groups
        TableLog(st).append(write_data_files(st, events(n + 1, 2 * n), row_group_size=10))
        assert s.sql(q)["n"][0].as_py() == 2 * n
        assert threads(s) == 5
    with Session(uri, s3=s3) as s:
        s.sql(f"SET threads = {default}")  # the value the session had: still the user's
        assert s.sql(q)["n"][0].as_py() == 2 * n and threads(s) == default
    with Session(s3=s3) as s:
        s.sql("SET threads = 5")  # before any table is open
        s.open(uri)
        assert s.sql(q)["n"][0].as_py() == 2 * n and threads(s) == 5
    with Session(uri, s3=s3, threads=3) as s:
        assert threads(s) == 3
    con = duckdb.connect()
    con.execute("SET threads = 2")
    with Session(uri, s3=s3, connection=con) as s:
        assert threads(s) == 2
    castsql.write_table(str(tmp_path / "local"), events(0, 10), primary_key="id")
    with Session(str(tmp_path / "local")) as s:  # a local directory: DuckDB's default
        assert threads(s) == default
