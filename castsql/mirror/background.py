"""Mirrors written after the commit returns (``castsql.mirror.async``).

A table with that property set has its Delta and Iceberg mirror versions
written by one thread of the committing process, not by the commit: the
commit's latency is the table's own, as with Delta's UniForm, which writes a
table's Iceberg metadata after the Delta commit. What a reader of a mirror
sees lags the table by the versions still queued (usually none, or the one
being written); CastSQL's own readers never read the mirrors.

- **Coalesced.** Commits that come faster than the mirrors are written
  leave one request per table: "up to version N", the newest. An export
  writes every version it lacks, one metadata version per table version,
  so no version is skipped.
- **Never lost at exit.** The interpreter waits for the queue at exit,
  before its thread pools stop: a process that commits and ends leaves its mirrors written,
  as a synchronous commit would. A process killed before then leaves them
  behind, and the next commit or ``castsql export`` writes every version
  still missing, as after a mirror that failed.
- **Errors are logged**, as after a synchronous commit: the write committed.
- :func:`settle` waits for a table's queued work; every other export of
  the table in the process waits for it first (:func:`before_export`), so
  none races the thread.

Example::

    >>> import castsql
    >>> t = castsql.write_table("/tmp/bg", {"id": [1]}, properties={
    ...     "castsql.mirror.delta": "true", "castsql.mirror.async": "true"})  # doctest: +SKIP
    >>> settle("/tmp/bg")                                                    # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from castsql.format import TableLog

_log = logging.getLogger(__name__)
_cond = threading.Condition()
_queued: dict[str, tuple[TableLog, int]] = {}  # root -> (log, version to reach), oldest request first
_busy: set[str] = set()
_worker: threading.Thread | None = None
_LOGS_KEPT = 16  # tables whose log (and its cached manifests) the thread keeps


def schedule(log: TableLog, version: int) -> None:
    """Queue the mirrors of ``log``'s table up to ``version`` for the thread
    (one request per table: a newer version replaces an older one)."""
    global _worker
    root = log.storage.root
    with _cond:
        queued = _queued.get(root)
        if queued is None or queued[1] < version:
            _queued[root] = (log, version)
        if _worker is None or not _worker.is_alive():
            # A daemon: the atexit wait below, not the interpreter's join, is what keeps its work.
            _worker = threading.Thread(target=_run, name="castsql-mirrors", daemon=True)
            _worker.start()
        _cond.notify_all()


def settle(root: str | None = None, timeout: float | None = None) -> bool:
    """Wait until the mirrors queued for the table at ``root`` (every table:
    None) are written; False when ``timeout`` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def idle() -> bool:
        if root is None:
            return not _queued and not _busy
        return root not in _queued and root not in _busy

    with _cond:
        while not idle():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _cond.wait(left)
    return True


def before_export(root: str) -> None:
    """What an export of the table at ``root`` does first: wait for the
    thread's queued work on it (two exporters of one version in one process
    would make one of them fail), unless it is the thread's own export."""
    if threading.current_thread() is not _worker:
        settle(root)


def _run() -> None:
    from castsql import mirror
    from castsql.format import TableLog
    from castsql.format.properties import mirrors

    logs: dict[str, TableLog] = {}
    while True:
        with _cond:
            while not _queued:
                _cond.wait()
            root = next(iter(_queued))
            log, version = _queued.pop(root)
            _busy.add(root)
        try:
            # A log of its own per table, kept between requests: the
            # committing thread goes on with its log's caches while this one
            # reads the (immutable) manifests, each once. One mirror after the
            # other, on this thread: an export on any other thread waits for
            # this one (before_export).
            own = logs.get(root)
            if own is None or own.storage is not log.storage:
                own = logs[root] = TableLog(log.storage)
                if len(logs) > _LOGS_KEPT:
                    del logs[next(iter(logs))]
            for name in mirrors(own.manifest(version).properties):
                mirror.write_one(own, name, version)
        except Exception:  # write_one logs a mirror's own error; this is anything else
            _log.exception("table %s: mirrors up to version %d not written", root, version)
        finally:
            with _cond:
                _busy.discard(root)
                _cond.notify_all()


def _forked() -> None:
    # A forked child has none of the parent's threads: the parent writes what
    # it queued, and the child's exit must not wait for work no thread will do.
    global _cond, _worker
    _cond, _worker = threading.Condition(), None
    _queued.clear()
    _busy.clear()


os.register_at_fork(after_in_child=_forked)

# Before the interpreter's own exit work: threading's exit hooks run before
# the atexit module's, and one of them (concurrent.futures') stops the
# thread pools the mirrors write through. Those hooks run newest first, and
# concurrent.futures registered its hook when the storage layer imported it.
threading._register_atexit(settle)  # type: ignore[attr-defined]
