"""A writer process for the concurrency and crash tests.

    python tests/support/commit_worker.py URI WRITER_ID COMMITS [--crash-at STEP] [--delete]

Each commit writes one data file holding one row ``id = WRITER_ID * 1_000_000 + i``
and appends it. With ``--crash-at`` the process SIGKILLs itself at that step
of its first commit: ``data:before``, ``data:after``, ``tombstone:before``,
``tombstone:after``, ``meta:before``, ``meta:after`` (a metadata object the
commit folds into: format version 2), ``manifest:before``, ``manifest:after``,
``pointer:before``, ``pointer:after``. S3 settings come from AWS_* variables.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid

import pyarrow as pa

from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.format.layout import POINTER_KEY
from castsql.storage import Storage, StorageError, open_storage


class CrashingStorage:
    """Passes every call through, and kills this process at one step."""

    def __init__(self, inner, step: str) -> None:
        self._inner = inner
        self._kind, self._when = step.split(":")

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _kind_of(self, key: str) -> str:
        if key == POINTER_KEY:
            return "pointer"
        return {"data": "data", "tombstone": "tombstone", "manifest": "manifest", "meta": "meta", "cdc": "cdc"}.get(
            key.split("/", 1)[0], "?"
        )

    def _maybe_die(self, key: str, when: str) -> None:
        if self._kind_of(key) == self._kind and when == self._when:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def _call(self, name: str, key: str, *args):
        self._maybe_die(key, "before")
        out = getattr(self._inner, name)(key, *args)
        self._maybe_die(key, "after")
        return out

    def put(self, key, data):
        return self._call("put", key, data)

    put_new = Storage.put_new  # through our put_if_absent, so the crash hook sees it

    def put_if_absent(self, key, data):
        return self._call("put_if_absent", key, data)

    def put_if_match(self, key, data, etag):
        return self._call("put_if_match", key, data, etag)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("writer", type=int)
    ap.add_argument("commits", type=int)
    ap.add_argument("--crash-at")
    ap.add_argument("--delete", action="store_true", help="delete row 0 of the first file instead of appending")
    ap.add_argument("--uncertain-retries", type=int, default=0, help="retry a commit that failed with a StorageError")
    args = ap.parse_args()
    storage = open_storage(args.uri)
    if args.crash_at:
        storage = CrashingStorage(storage, args.crash_at)
    log = TableLog(storage, writer=f"w{args.writer}")
    # The first read goes through the same faults as the commits: a client
    # retries it as it retries them (CI saw all three of obstore's attempts fail).
    for attempt in range(args.uncertain_retries + 1):
        try:
            schema = log.latest().schema
            break
        except StorageError:
            if attempt == args.uncertain_retries:
                raise
    slowest = 0.0
    for i in range(args.commits):
        if args.delete:
            f = log.latest().data_files[0]
            log.delete([PositionDelete(f.name, None, pa_bitmap([0]))])
            continue
        t = pa.table({"id": pa.array([args.writer * 1_000_000 + i], pa.int64()), "writer": [args.writer]})
        files = None
        commit_id = uuid.uuid4().hex
        for attempt in range(args.uncertain_retries + 1):
            try:
                if files is None:
                    files = write_data_files(storage, t, schema)
                    written = time.monotonic()
                log.append(files, commit_id=commit_id)  # same id: a retry cannot commit twice
                break
            except StorageError:
                if attempt == args.uncertain_retries:
                    raise
        # How long a data file lay unreferenced: GC's grace must exceed it.
        slowest = max(slowest, time.monotonic() - written)
    print(f"done slowest_commit_s={slowest:.3f}", flush=True)


def pa_bitmap(values):
    from pyroaring import BitMap

    return BitMap(values)


if __name__ == "__main__":
    main()
