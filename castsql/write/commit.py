"""The one commit of an update, merge or delete: new data files and one
tombstone file in ONE version, so no reader ever sees the delete without the
insert (a crash before the manifest put leaves only unreferenced objects).

Concurrency (docs/FORMAT.md §7): the change carries the version it was
planned from, the files its tombstones name and the key span of the rows it
inserts; :class:`castsql.format.change.Change` refuses it with a
CommitConflict when a commit since then removed one of those files, deleted
rows of one, or added a file that may hold one of those keys.
:func:`with_retries` then plans again from the new head; the files a lost
attempt wrote are garbage for GC.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files, RowGroupDelete
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
    >>> old = log.append(write_data_files(st, pa.table({"id": [1, 2]}), log.latest().schema)).data_files[0]
    >>> new = write_data_files(st, pa.table({"id": [1, 2]}), log.latest().schema)
    >>> m = commit_dml(log, operation="UPDATE", read_version=1, records=[RowGroupDelete(old.name, 0)],
    ...                files=new, summary={"updated_rows": 2})
    >>> m.version, m.summary["added_tombstones"], m.summary["added_rows"]
    (2, 1, 2)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, TypeVar

import pyarrow as pa

from castsql.errors import CommitConflict
from castsql.format import DataFile, Manifest, TableLog, TombstoneRecord
from castsql.format.change import Change
from castsql.format.manifest import ChangeData, added_summary
from castsql.format.markers import stamp
from castsql.format.schema import Schema

log_ = logging.getLogger(__name__)

T = TypeVar("T")


def commit_dml(
    log: TableLog,
    *,
    operation: str,
    read_version: int,
    records: Sequence[TombstoneRecord],
    files: Sequence[DataFile],
    summary: dict[str, Any] | None = None,
    insert_key_span: tuple[str | None, Any, Any] | None = None,
    schema: Schema | None = None,
    new_schema: Schema | None = None,
    change_data: ChangeData | Callable[[], ChangeData | None] | None = None,
    cdc_order: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
    markers: pa.Table | None = None,
) -> Manifest:
    """Write one tombstone file holding ``records`` (if any) and commit it with
    the data files ``files`` as one version planned from ``read_version``
    (and ``change_data``: the written change-data file of the rows ``records``
    delete, with the keys the write changed, or the function that writes it,
    run beside the tombstone file's write). A sequenced CDC batch gives
    ``cdc_order`` (its key and sequence columns) and ``markers``: the key and
    sequence of each delete it applied (FORMAT.md §3.7), written as one
    markers object.

    The records are checked against ``read_version`` first (files in it, row
    groups and positions that exist). ``insert_key_span`` is (key column, lo,
    hi) of the rows the operation inserts (JSON statistics; column None: any
    concurrent data file conflicts). Raises CommitConflict when a concurrent
    commit makes the plan stale (nothing committed: plan again)."""
    if not records and not files and (markers is None or not markers.num_rows):
        raise ValueError("commit_dml needs records, files or markers")
    where = f"{log.storage.root}: {operation.lower()}"
    targets: set[str] = set()
    tombstones: tuple[str, ...] = ()
    # A change file still to write is written while the tombstone file is:
    # each waits on its own sync (the feed's cost on a commit, FORMAT.md §3.5).
    with ThreadPoolExecutor(1) if callable(change_data) else nullcontext() as pool:
        pending = pool.submit(change_data) if pool is not None and callable(change_data) else None
        if records:
            targets = log.validate_tombstones(records, log.manifest(read_version), where=where)
            tombstones = (log.write_tombstone(records),)
        written = pending.result() if pending is not None else change_data
    assert not callable(written)
    added_markers = stamp(markers) if markers is not None and markers.num_rows else None
    full = {
        **added_summary(files),
        "added_tombstones": len(tombstones),
        "tombstone_records": len(records),
        **(summary or {}),
    }
    change = Change(
        operation,
        add_files=tuple(files),
        add_tombstones=tombstones,
        tombstone_targets=frozenset(targets),
        conflict_files=frozenset(targets),
        key_span=insert_key_span,
        schema=schema,
        new_schema=new_schema,  # schema evolution in the same version (FORMAT.md §3.4)
        read_version=read_version,
        summary=full,
        change_data=written,
        cdc_order=cdc_order,
        add_markers=added_markers,
    )
    return log.commit(change, base=log.manifest(read_version))


def commit_overwrite(
    log: TableLog,
    files: Sequence[DataFile],
    *,
    schema: Schema,
    new_schema: Schema | None = None,
    summary: dict[str, Any] | None = None,
    attempts: int = 5,
) -> Manifest:
    """Commit ``files`` as the table's only files: one ``OVERWRITE`` version
    that also removes every data file and tombstone of the version it
    replaces. A data file or tombstone committed meanwhile would survive it,
    so that conflicts and the removal is planned again (up to ``attempts``
    times); nothing is committed when every attempt loses."""
    from castsql.errors import DmlConflict

    last: Exception | None = None
    for _ in range(attempts):
        head = log.latest()
        state = log.state(head)
        old = state.keys().to_pylist()
        tombs = state.tombstone_keys()
        change = Change(
            "OVERWRITE",
            add_files=tuple(files),
            remove_files=tuple(old),
            remove_tombstones=tuple(tombs),
            schema=schema,
            new_schema=new_schema,
            read_version=head.version,
            read_tombstones=frozenset(tombs),
            # Any data file committed after head.version would survive the
            # overwrite: conflict, and plan the removal again.
            key_span=(None, None, None),
            summary={**(summary or {}), "removed_files": len(old)},
        )
        try:
            return log.commit(change, base=head)
        except DmlConflict as e:
            last = e
        except CommitConflict as e:
            if "tombstone" not in str(e):
                raise
            last = e
    raise CommitConflict(
        f"{log.storage.root}: overwrite lost to concurrent commits {attempts} times; nothing was committed"
    ) from last


def with_retries(where: str, attempts: int, run: Callable[[int], T]) -> T:
    """``run(attempt)`` (plan from the newest version, then commit) until it
    does not conflict, at most ``attempts`` times; then CommitConflict saying
    nothing was committed and the operation can simply be retried."""
    for attempt in range(attempts):
        try:
            return run(attempt)
        except CommitConflict as e:
            if attempt == attempts - 1:
                raise CommitConflict(
                    f"{where}: concurrent commits conflicted with it {attempts} times (last: {e}); "
                    "nothing was committed; retry"
                ) from None
            log_.info("%s: planned again after a concurrent commit: %s", where, e)
    raise AssertionError("unreachable")
