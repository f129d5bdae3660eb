"""16 writer processes committing to one table at once: no commit lost,
duplicated or reordered, on the local backend (50 commits each) and on the S3,
GCS and Azure servers (15 each: every commit there is several round trips, and 16 writers
contending for the pointer retry each other's commits, so 50 took ~4.5 of CI's
30 minutes; the contention is the same with 15)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from paths import SUPPORT
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

from castsql.format import TableLog
from castsql.format.layout import POINTER_KEY, manifest_key

WORKER = str(SUPPORT / "commit_worker.py")
WRITERS = 16
COMMITS = {"local": 50, "s3": 15, "gcs": 15, "azure": 15}


def test_sixteen_writers(storage, worker_env, backend):
    commits = COMMITS[backend]
    TableLog.create(storage, pa.schema([("id", pa.int64()), ("writer", pa.int64())]))
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, storage.root, str(w), str(commits)],
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WRITERS)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]

    log = TableLog(storage)
    total = WRITERS * commits
    assert log.latest_version() == total
    assert log.versions() == list(range(total + 1))
    assert b'"version": %d' % total in storage.get(POINTER_KEY)
    hist = log.history()
    assert all(m.previous == m.version - 1 for m in hist[1:])

    # Every version added exactly one file, and the last holds all of them once.
    last = log.state(hist[-1]).entries()
    paths = [f.path for f in last]
    assert len(paths) == total == len(set(paths))
    for m in hist[1:]:
        prev = set(log.state(log.manifest(m.previous)).keys().to_pylist())
        assert len(set(log.state(m).keys().to_pylist()) - prev) == 1
        assert [f.path for f in m.change.added_files] == list(set(log.state(m).keys().to_pylist()) - prev)
    ids = sorted(f.min["id"] for f in last)
    assert ids == sorted(w * 1_000_000 + i for w in range(WRITERS) for i in range(commits))
    # No orphans either: every data file written was committed, and every
    # metadata object the last version needs is there.
    assert sorted(o.key for o in storage.list("data/")) == sorted(paths)
    assert all(storage.exists(r.path) for r in hist[-1].file_objects)
    assert storage.exists(manifest_key(total))
