"""A stalled S3 server (accepts connections, never answers) must not hang
anyone: every remote call has bounded connect and read timeouts and bounded
retries, then one clear error naming the endpoint and the object; Ctrl-C works
during the wait. Proved for the shell, the Python API and a writer commit, with
a listener that never answers and with a proxy in front of the real test
server that stalls only some requests."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from faultproxy import FaultProxy

from castsql.engine import Session
from castsql.errors import CastSQLError, StorageError
from castsql.format import TableLog, write_data_files
from castsql.storage import S3Config, open_storage

pytestmark = pytest.mark.s3

FAST = {"connect_timeout": 1.0, "read_timeout": 1.0, "max_attempts": 2}
BOUND_S = 15  # 2 attempts x (1 s + 1 s) plus backoff and process start, with room for a loaded machine


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_python_api_gives_up_with_the_endpoint_and_object(silent):
    cfg = S3Config(endpoint_url=silent, key="k", secret="s", **FAST)
    t0 = time.monotonic()
    with pytest.raises(StorageError) as e:
        Session("s3://bucket/wh/events", s3=cfg)
    assert time.monotonic() - t0 < BOUND_S
    msg = str(e.value)
    assert silent in msg and "s3://bucket/wh/events/" in msg and "did not answer" in msg and "2 attempt" in msg


def test_shell_gives_up_with_one_line(silent, shell_env):
    env = {
        **shell_env,
        "AWS_ENDPOINT_URL": silent,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "CASTSQL_S3_CONNECT_TIMEOUT": "1",
        "CASTSQL_S3_READ_TIMEOUT": "1",
        "AWS_MAX_ATTEMPTS": "2",
    }
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", "s3://bucket/events", "-c", "SELECT count(*) FROM events"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert time.monotonic() - t0 < BOUND_S
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and silent in r.stderr and "did not answer" in r.stderr, r.stderr


@pytest.fixture
def proxied(s3_server, s3_root) -> Iterator[tuple[FaultProxy, str, S3Config]]:
    """A table on the real test server, and a proxy in front of it that stalls what ``proxy.stall`` says."""
    st = open_storage(s3_root + "/events", s3=s3_server.config)
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    log.append(write_data_files(st, pa.table({"id": list(range(100))})))
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    proxy = FaultProxy(port, rate=0.0)
    proxy.start()
    try:
        yield proxy, st.root, dataclasses.replace(s3_server.config, endpoint_url=proxy.endpoint_url, **FAST)
    finally:
        proxy.stop()


def test_a_writer_commit_gives_up_and_commits_nothing(proxied, s3_server):
    proxy, root, cfg = proxied
    st = open_storage(root, s3=cfg)
    log = TableLog(st)
    files = write_data_files(st, pa.table({"id": [100, 101]}))
    proxy.stall = lambda method, path: method == "PUT" and "/manifest/" in path
    t0 = time.monotonic()
    with pytest.raises(StorageError) as e:
        log.append(files)
    assert time.monotonic() - t0 < BOUND_S
    assert proxy.endpoint_url in str(e.value) and "manifest/v00000002.json" in str(e.value)
    assert TableLog(open_storage(root, s3=s3_server.config)).latest_version() == 1


def test_a_data_file_put_that_timed_out_once_is_repeated_and_the_commit_lands(proxied, s3_server):
    # object_store repeats no PUT whose answer timed out; a busy server (CI's
    # Azurite, once) then failed a whole writer over one slow answer.
    proxy, root, cfg = proxied
    st = open_storage(root, s3=cfg)
    stalled: list[str] = []

    def first_data_put(method: str, path: str) -> bool:
        if method == "PUT" and path.split("?")[0].endswith(".parquet") and not stalled:
            stalled.append(path)
            return True
        return False

    proxy.stall = first_data_put
    TableLog(st).append(write_data_files(st, pa.table({"id": [100, 101]})))
    assert len(stalled) == 1
    puts = [p for m, p, _ in proxy.requests if m == "PUT" and p == stalled[0]]
    assert len(puts) == 2  # the stalled try and its repeat
    with Session(root, s3=s3_server.config) as s:
        assert s.sql("SELECT count(*) AS n, sum(id) AS s FROM events").to_pylist() == [{"n": 102, "s": sum(range(102))}]


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "landed"])
def test_a_manifest_put_whose_answer_never_came_is_repeated_and_commits_once(proxied, s3_server, landed):
    # The commit point: a repeat of a try that landed answers 412, and the
    # writer finds its own commit there instead of committing again.
    proxy, root, cfg = proxied
    st = open_storage(root, s3=cfg)
    files = write_data_files(st, pa.table({"id": [100, 101]}))
    held: list[str] = []

    def first_manifest_put(method: str, path: str) -> bool:
        if method == "PUT" and "/manifest/" in path and not held:
            held.append(path)
            return True
        return False

    if landed:
        proxy.stall_answer = first_manifest_put
    else:
        proxy.stall = first_manifest_put
    m = TableLog(st).append(files)
    assert m.version == 2 and held and held[0].split("?")[0].endswith("manifest/v00000002.json")
    log = TableLog(open_storage(root, s3=s3_server.config))
    assert log.latest_version() == 2
    with Session(root, s3=s3_server.config) as s:
        assert s.sql("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 102}]


def test_a_query_whose_data_reads_stall_fails_in_bounded_time(proxied):
    proxy, root, cfg = proxied
    with Session(root, s3=cfg) as s:
        proxy.stall = lambda method, path: path.split("?")[0].endswith(".parquet")
        t0 = time.monotonic()
        with pytest.raises(CastSQLError) as e:
            s.sql("SELECT sum(id) FROM events")
        assert time.monotonic() - t0 < 3 * BOUND_S  # DuckDB's httpfs: http_timeout and http_retries from S3Config
        assert "events" in str(e.value)


def test_ctrl_c_in_the_shell_stops_the_wait(proxied, shell_env):
    import pexpect
    from pty_shell import Shell

    proxy, root, cfg = proxied
    env = _s3_env(shell_env, cfg)  # the default, long timeouts: only Ctrl-C ends this wait
    sh = Shell([root], env)
    try:
        proxy.stall = lambda method, path: "_latest_manifest" in path
        sh.type("SELECT count(*) FROM events;\r")
        time.sleep(1.5)
        sh.type("\x03")
        t0 = time.monotonic()
        out = sh.wait_prompt(input_accepted=True)
        assert time.monotonic() - t0 < 3
        assert "cancelled" in out.lower()
        proxy.stall = None
        out = sh.run("SELECT count(*) AS n FROM events;")
        assert "100" in out  # the shell and its session still work
        sh.child.sendeof()
        sh.child.expect(pexpect.EOF)
    finally:
        sh.close()


def _s3_env(shell_env: dict[str, str], cfg: S3Config) -> dict[str, str]:
    """A child process's environment reaching S3 as ``cfg`` says."""
    return {
        **shell_env,
        "AWS_ENDPOINT_URL": cfg.endpoint_url or "",
        "AWS_ACCESS_KEY_ID": cfg.key or "",
        "AWS_SECRET_ACCESS_KEY": cfg.secret or "",
    }


def _stalled_shell(cfg: S3Config, shell_env: dict[str, str], uri: str, read_timeout: float, attempts: int):
    env = {
        **_s3_env(shell_env, cfg),
        "CASTSQL_S3_CONNECT_TIMEOUT": "1",
        "CASTSQL_S3_READ_TIMEOUT": str(read_timeout),
        "AWS_MAX_ATTEMPTS": str(attempts),
    }
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", uri, "-c", "SELECT 1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return r, time.monotonic() - t0


@pytest.mark.parametrize("what", ["table", "warehouse"])
def test_a_stalled_endpoint_fails_the_open_within_one_requests_attempts(proxied, shell_env, what):
    """The first request of an open that gets no answer ends the open: the
    probe of a second object (manifest 0 after the pointer, the next table of
    a warehouse) is not sent, and AWS_MAX_ATTEMPTS counts every try (botocore's
    ``max_attempts`` key had added one: 4 x 30 s by default, 124-127 s)."""
    proxy, root, cfg = proxied
    if what == "warehouse":  # listing answers, every table probe stalls
        wh = root.rsplit("/", 1)[0]
        second = open_storage(wh + "/more", s3=dataclasses.replace(cfg, endpoint_url=cfg.endpoint_url))
        TableLog.create(second, pa.schema([("id", pa.int64())]))
        uri = wh
        proxy.stall = lambda method, path: "_latest_manifest" in path
    else:
        uri = root
        proxy.stall = lambda method, path: True
    read_timeout, attempts = 3.0, 3
    r, elapsed = _stalled_shell(cfg, shell_env, uri, read_timeout, attempts)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "did not answer (up to 3 attempt(s)" in r.stderr and "_latest_manifest" in r.stderr
    assert proxy.counts["stalled"] == attempts  # one request, three tries, nothing after it
    one_request = attempts * read_timeout
    # about one request's budget (+ backoff <= 3 s, + process start), well short of two
    assert one_request <= elapsed < 2 * one_request - 1, elapsed


def test_a_server_that_ignores_range_still_gives_the_bytes_asked_for(proxied):
    """A store that answers a ranged GET with the whole object (as some
    S3-compatible servers do) is sliced from the range's start, not its head."""
    proxy, root, cfg = proxied
    st = open_storage(root, s3=cfg)
    st.put("blob", bytes(range(200)))
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    proxy.whole[f"/{bucket}/{prefix}/blob"] = bytes(range(200))
    assert st.get_range("blob", 10, 5) == bytes(range(10, 15))
    assert st.get_range("blob", 195, 50) == bytes(range(195, 200))
    assert st.get_range("blob", 10, 500) == bytes(range(10, 200))


def test_ctrl_c_stops_a_writer_in_one_line(proxied, shell_env):
    """The writer CLI stalled on S3 and interrupted: one line, exit 130, no
    traceback, and the table as it was (the stall is before the commit)."""
    import signal

    proxy, root, cfg = proxied
    env = _s3_env(shell_env, cfg)  # the default, long timeouts: only Ctrl-C ends this wait
    proxy.stall = lambda method, path: method == "PUT" and "/manifest/" in path
    p = subprocess.Popen(
        [sys.executable, "-m", "castsql.cli", "delete", root, "--where", "id = 7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(m == "PUT" and "/manifest/" in path for m, path, *_ in list(proxy.requests)):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=10)
    finally:
        p.kill()
        proxy.stall = None
    assert p.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("castsql delete: interrupted")
    assert TableLog(open_storage(root, s3=dataclasses.replace(cfg, **FAST))).latest_version() == 1


def test_a_warm_query_fails_as_its_look_for_a_newer_version_fails(proxied):
    # A warm query runs on the head it knows while it looks for a newer one:
    # when the look gets no answer the query fails with the look's error,
    # as when the look came first, and returns no rows of a maybe stale head.
    proxy, root, cfg = proxied
    with Session(root, s3=cfg) as s:
        assert s.sql("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 100}]
        proxy.stall = lambda method, path: "_latest_manifest" in path
        t0 = time.monotonic()
        with pytest.raises(StorageError) as e:
            s.sql("SELECT sum(id) AS s FROM events")
        assert time.monotonic() - t0 < BOUND_S
        assert "_latest_manifest" in str(e.value) and "did not answer" in str(e.value)
