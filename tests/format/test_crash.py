"""A writer SIGKILLed at every step of the commit protocol: the table reads at
its last committed version and the next writer commits without repair."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from paths import SUPPORT
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

from castsql.format import TableLog, write_data_files
from castsql.format.fold import FILES_INLINE_MAX
from castsql.format.layout import POINTER_KEY

WORKER = str(SUPPORT / "commit_worker.py")

# step -> is the crashed commit committed afterwards?
STEPS = {
    "data:before": False,
    "data:after": False,
    "tombstone:before": False,
    "tombstone:after": False,
    "meta:before": False,  # a metadata object the commit folds its inline files into
    "meta:after": False,
    "manifest:before": False,
    "manifest:after": True,  # the create-only manifest put is the commit point
    "pointer:before": True,
    "pointer:after": True,
}


def run_worker(storage, env, *args):
    return subprocess.run(
        [sys.executable, WORKER, storage.root, "7", "1", *args], env=env, capture_output=True, text=True, timeout=120
    )


def assert_readable(log: TableLog) -> None:
    """Every kept version parses and every object it references exists."""
    for m in log.history():
        for key in log.state(m).keys().to_pylist():
            assert log.storage.exists(key), key
        for t in m.tombstones:
            log.tombstones(t)
        for ref in (*m.file_objects, *m.delete_objects):
            assert log.storage.exists(ref.path), ref.path


@pytest.mark.parametrize("step", list(STEPS))
def test_kill_at_each_step(storage, worker_env, step):
    log = TableLog.create(storage, pa.schema([("id", pa.int64()), ("writer", pa.int64())]))
    log.append(write_data_files(storage, pa.table({"id": [1, 2], "writer": [0, 0]}), log.latest().schema))
    prefill = 0
    if step.startswith("meta"):
        # Fill the inline list: the crashing append is the one that folds it into an object.
        prefill = FILES_INLINE_MAX - 1
        for i in range(prefill):
            log.append(write_data_files(storage, pa.table({"id": [10 + i], "writer": [0]}), log.latest().schema))
    delete = step.startswith("tombstone")
    r = run_worker(storage, worker_env, "--crash-at", step, *(["--delete"] if delete else []))
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]

    expected = (2 if STEPS[step] else 1) + prefill
    reader = TableLog(storage)
    assert reader.latest_version() == expected
    assert_readable(reader)

    r = run_worker(storage, worker_env, *(["--delete"] if delete else []))
    assert r.returncode == 0, r.stderr[-2000:]
    after = TableLog(storage)
    assert after.latest_version() == expected + 1
    assert json.loads(storage.get(POINTER_KEY))["version"] == expected + 1
    assert after.versions() == list(range(expected + 2))
    assert_readable(after)
    if not delete:
        ids = sorted(f.min["id"] for f in after.state(after.latest()).entries())
        mine = [7_000_000, 7_000_000] if STEPS[step] else [7_000_000]
        assert ids == [1, *range(10, 10 + prefill), *mine]
    if step.startswith("meta"):
        assert after.latest().file_objects  # the next writer did fold


def test_kill_creator_between_manifest_and_pointer(storage, worker_env):
    class DieAfterManifest:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def put_if_absent(self, key, data):
            if key == POINTER_KEY:
                raise KeyboardInterrupt  # the creator dies here
            return self.inner.put_if_absent(key, data)

    with pytest.raises(KeyboardInterrupt):
        TableLog.create(DieAfterManifest(storage), pa.schema([("id", pa.int64()), ("writer", pa.int64())]))
    assert TableLog(storage).latest_version() == 0
    r = run_worker(storage, worker_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(storage.get(POINTER_KEY))["version"] == 1
