"""Compaction with the embedded engine: DuckDB in this process, no JVM.

The plan is the shared one (:mod:`castsql.write.compaction`): data files past
the deleted-fraction ``threshold`` and small files packed into bins of
``target_file_bytes``; tombstones folded. Each bin's live rows are read
through a view of just its files (deletes applied as in any read), optionally
ordered by ``sort_by`` (an event-time column: min/max pruning then skips the
files a time range cannot reach), and streamed into new data files of the
target size with row groups of ``row_group_size`` rows. The commit is the
same ``COMPACT`` change Spark's compaction makes, under the same conflict
rules; a compaction that loses to a concurrent delete, update or merge is
planned again from the new version (up to ``attempts`` times), so neither
side's rows are lost.

Example::

    >>> events = castsql.open("./warehouse/events")                   # doctest: +SKIP
    >>> events.compact(sort_by="ts").summary["removed_files"]           # doctest: +SKIP
    301
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from castsql.embedded.engine import Writer
from castsql.engine import Session
from castsql.engine.sql import names
from castsql.engine.sql.quoting import ident
from castsql.errors import CastSQLError, CommitConflict
from castsql.format import Change, DataFile, Manifest, TableLog
from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.format.markers import any_expired
from castsql.format.properties import AutoCompact, delete_retention
from castsql.snapshot import Snapshot, resolve
from castsql.write.compaction import SMALL_TOMBSTONE_BYTES, compaction_change, plan_compaction

_log = logging.getLogger(__name__)
_BATCH_ROWS = 122_880  # what DuckDB hands over at a time: one row group's worth


def compact(
    session: Session,
    table: str,
    *,
    threshold: float = 0.5,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    sort_by: str | None = None,
    small_tombstone_bytes: int = SMALL_TOMBSTONE_BYTES,
    attempts: int = 5,
    tiered: bool = False,
) -> Manifest | None:
    """Compact the newest version of ``table`` (a table of ``session``);
    returns the committed manifest, or None when there is nothing to do.
    ``tiered``: merge only the lowest size tier of small files (automatic
    compaction; :mod:`castsql.write.compaction`)."""
    if not 0 < threshold <= 1:
        raise CastSQLError(f"table {table}: compact: threshold must be in (0, 1], got {threshold}")
    if target_file_bytes <= 0 or row_group_size <= 0:
        raise CastSQLError(f"table {table}: compact: the target file size and row group size must be positive")
    log = session.log(table)
    for attempt in range(attempts):
        snap = resolve(log)
        if sort_by is not None and snap.schema.column(sort_by) is None:
            raise CastSQLError(
                f"table {table}: compact: no column {sort_by!r} to sort by (columns: {', '.join(snap.schema.names)})"
            )
        live = {f.key: f.total_rows - len(session.views.deleted(snap, f)) for f in snap.files}
        plan = plan_compaction(
            log,
            snap,
            live,
            threshold=threshold,
            small_tombstone_bytes=small_tombstone_bytes,
            target_file_bytes=target_file_bytes,
            sort_by=sort_by,
            tiered=tiered,
        )
        if not plan:
            return _expire_markers(log, snap) if not tiered else None
        added: list[DataFile] = []
        rows = 0
        for i, files in enumerate(plan.bins):
            written, n = _rewrite(session, table, snap, files, i, sort_by, row_group_size, target_file_bytes)
            expected = sum(plan.live_rows[f.key] for f in files)
            if n != expected:
                raise CommitConflict(
                    f"table {table}: compact read {n} live rows of {len(files)} file(s), expected {expected}; "
                    "nothing was committed"
                )
            added += written
            rows += n
        try:
            return log.commit(compaction_change(log, snap, plan, added, rows))
        except CommitConflict as e:
            if attempt == attempts - 1:
                raise CommitConflict(f"{e}; gave up after {attempts} attempts") from None
            _log.warning("compaction of version %d conflicted: %s; planning again", snap.version, e)
    raise AssertionError("unreachable")


def _expire_markers(log: TableLog, snap: Snapshot) -> Manifest | None:
    """With no file to rewrite, a compaction still drops the CDC delete
    markers past the table's retention (FORMAT.md §3.7): a ``COMPACT``
    version changing nothing else, or None when none is past it."""
    state = snap.manifest.cdc
    if state is None or not any_expired(state, delete_retention(snap.manifest.properties), datetime.now(UTC)):
        return None
    return log.commit(Change("COMPACT", read_version=snap.version, summary={"expired_delete_markers": True}))


# Commits after which automatic compaction looks at the table: those that
# change its rows. Not a compaction (never one after another), not the
# schema, properties or format alone.
_NOT_DATA_WRITES = frozenset({"CREATE", "COMPACT", "SET PROPERTIES", "ALTER", "UPGRADE"})


def maintain(log: TableLog, head: Manifest) -> Manifest | None:
    """The automatic compaction a table's properties ask for
    (``castsql.autoCompact``), run after every commit that changed the
    table's rows (``castsql.commits``, the after-commit point, whichever
    engine committed ``head``): when that version holds
    ``castsql.autoCompact.minNumFiles`` data files under
    ``castsql.autoCompact.maxFileSize`` (or as many tombstone files), the
    lowest size tier of them is packed into files of that size (ordered by
    ``castsql.compact.sortBy``) and the tombstones folded: a stream's large
    base file is not rewritten each time (:mod:`castsql.write.compaction`).
    Only metadata is read to decide; the compaction runs in a session of its
    own over ``log`` (DuckDB in this process, no JVM). One that keeps losing
    to concurrent writers gives up (the write that ran it has committed
    already) and the next write tries again. Returns its manifest, or None."""
    auto = AutoCompact.of(head.properties)  # the committed manifest in hand: no request without the setting
    if auto is None or head.operation in _NOT_DATA_WRITES:
        return None
    snap = resolve(log, head.version)
    sizes = snap.table().column("size_bytes")
    small = pc.sum(pc.less(sizes, auto.max_file_size)).as_py() or 0
    if small < auto.min_files and head.tombstone_count < auto.min_files:
        return None
    sort_by = auto.sort_by if auto.sort_by and snap.schema.column(auto.sort_by) is not None else None
    with Session() as session:
        table = session.adopt(log)
        try:
            return compact(
                session, table, target_file_bytes=auto.max_file_size, sort_by=sort_by, attempts=2, tiered=True
            )
        except CommitConflict as e:
            _log.warning("table %s: automatic compaction gave up: %s", log.storage.root, e)
            return None


def _rewrite(
    session: Session,
    table: str,
    snap: Snapshot,
    files: list,
    n: int,
    sort_by: str | None,
    row_group_size: int,
    target_file_bytes: int,
) -> tuple[list[DataFile], int]:
    """The live rows of ``files`` (one bin) written as new data files; returns them and the rows written."""
    view = names.internal("compact", n, owner=table)
    session.views.create(view, Snapshot(snap.table_uri, snap.version, snap.manifest, files, snap.primary_key))
    rows = 0
    try:
        order = f" ORDER BY {ident(sort_by)}" if sort_by else ""
        reader = session.con.execute(f"SELECT * FROM {ident(view)}{order}").to_arrow_reader(_BATCH_ROWS)

        def batches() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for b in reader:
                rows += b.num_rows
                yield b

        written = Writer(session, table).write_files(
            batches(), snap.schema, row_group_size=row_group_size, target_file_bytes=target_file_bytes
        )
    finally:
        session.views.drop(view)
    return written, rows
