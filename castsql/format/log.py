"""A table's versions: the commit protocol (reading is :mod:`castsql.format.metadata`).

Commit rule (docs/FORMAT.md, "Commit protocol"): version N+1 is committed the
moment ``manifest/v(N+1).json`` is created by a create-only put whose
``previous`` is N. The pointer ``_latest_manifest`` is moved afterwards with a
compare-and-swap, but it is only a hint that is never ahead of the truth:
readers and writers start at the pointer and roll forward over any manifests
that exist past it. A writer that dies between the two puts therefore leaves a
committed version that everyone sees, and the next writer moves the pointer.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
    >>> files = write_data_files(st, pa.table({"id": [1, 2, 3]}), log.latest().schema)
    >>> log.append(files).version
    1
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from castsql.errors import CommitConflict, FormatError, SchemaMismatch, StorageError, TableExists
from castsql.format import changeblocks, evolution, keyindex
from castsql.format.change import Change, RestoreRaced
from castsql.format.layout import POINTER_KEY, manifest_key, new_tombstone_key, to_table_key
from castsql.format.manifest import DataFile, Manifest, Totals, added_summary, format_time
from castsql.format.metadata import RetryPolicy, TableMetadata
from castsql.format.properties import check
from castsql.format.schema import Schema
from castsql.format.tombstone import (
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    TombstoneRecord,
    check_key_range,
    serialize_tombstones,
)
from castsql.storage import ObjectNotFound, PreconditionFailed, Storage

IDEMPOTENCY_WINDOW = 64


def default_writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def pointer_bytes(version: int, commit_id: str) -> bytes:
    # The commit id makes every pointer body (and so its ETag) unique.
    return json.dumps({"version": version, "commit_id": commit_id, "updated_at": format_time(_now())}).encode()


def _checked_properties(properties: dict[str, str] | None, root: str) -> dict[str, str]:
    return {k: v for k, v in check(properties or {}, f"{root}: create").items() if v is not None}


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------- the after-commit point

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AfterCommit:
    """Work that follows every commit, whoever made it: registered by the
    layers above the format (``castsql.commits``: the mirrors, automatic
    compaction), run by :meth:`TableLog.commit` and :meth:`TableLog.create`
    once the version is committed and the pointer moved.

    ``run(log, manifest)`` returns the manifest of a version it committed
    itself (a compaction), or None. ``after_hook_commits``: whether it also
    runs for a commit made by a hook (the mirrors do, so the compaction's
    version is mirrored; a compaction does not, so it never follows itself)."""

    name: str
    run: Callable[[TableLog, Manifest], Manifest | None]
    after_hook_commits: bool


_HOOKS: list[AfterCommit] = []
_HOOKS_LOCK = threading.Lock()
# How deep in after-commit hooks this thread (or task) is: a commit made by a
# hook runs only the hooks that follow hook commits.
_IN_HOOK: contextvars.ContextVar[int] = contextvars.ContextVar("castsql_after_commit_depth", default=0)
_FOLLOWED_KEPT = 64  # versions per log whose hook commits are remembered (TableLog.followed)
# The statement that asked for the commits made in this context (SQL a session
# ran), recorded in their summary for history (FORMAT.md §3, ``statement``).
_STATEMENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("castsql_commit_statement", default=None)
STATEMENT_CHARS = 500  # a statement is kept this long at most: history, not a copy of the input


@contextlib.contextmanager
def commit_statement(text: str) -> Iterator[None]:
    """Record ``text`` (cut to :data:`STATEMENT_CHARS`) as ``summary.statement``
    of every version committed in this context, except those after-commit
    hooks commit (an automatic compaction did not run the statement).

    >>> with commit_statement("DELETE FROM events WHERE user_id = 42"):  # doctest: +SKIP
    ...     events.delete("user_id = 42")
    """
    cut = text if len(text) <= STATEMENT_CHARS else text[: STATEMENT_CHARS - 1] + "…"
    token = _STATEMENT.set(cut)
    try:
        yield
    finally:
        _STATEMENT.reset(token)


def _statement_summary() -> dict[str, str]:
    """``{"statement": text}`` inside :func:`commit_statement`, but not for a
    version an after-commit hook commits (it did not run the statement)."""
    statement = _STATEMENT.get()
    return {"statement": statement} if statement is not None and not _IN_HOOK.get() else {}


def register_after_commit(
    name: str, run: Callable[[TableLog, Manifest], Manifest | None], *, after_hook_commits: bool
) -> None:
    """Run ``run(log, manifest)`` after every commit, in registration order; a
    hook registered again under the same ``name`` replaces the earlier one.
    A hook's failure is logged and never fails the commit it follows."""
    with _HOOKS_LOCK:
        hook = AfterCommit(name, run, after_hook_commits)
        for i, h in enumerate(_HOOKS):
            if h.name == name:
                _HOOKS[i] = hook
                return
        _HOOKS.append(hook)


def after_commit_hooks() -> list[str]:
    """The names of the registered after-commit hooks, in the order they run."""
    with _HOOKS_LOCK:
        return [h.name for h in _HOOKS]


class TableLog(TableMetadata):
    """The versions of the table rooted at ``storage``: what
    :class:`~castsql.format.metadata.TableMetadata` reads, plus the commit
    protocol that writes the next one."""

    def __init__(self, storage: Storage, *, retry: RetryPolicy | None = None, writer: str | None = None) -> None:
        super().__init__(storage, retry=retry)
        self.writer = writer or default_writer_id()
        # Version -> the version an after-commit hook committed right after it (followed()).
        self._followed: OrderedDict[int, int] = OrderedDict()

    # ------------------------------------------------------------------ create

    @classmethod
    def create(
        cls,
        storage: Storage,
        schema: Schema | pa.Schema,
        *,
        primary_key: str | None = None,
        writer: str | None = None,
        exist_ok: bool = False,
        properties: dict[str, str] | None = None,
    ) -> TableLog:
        """Create an empty table (version 0) with ``properties``
        (:mod:`castsql.format.properties`). With ``exist_ok`` an existing
        table of the same schema is opened instead."""
        log = cls(storage, writer=writer)
        schema = cls.check_create(storage, schema, primary_key=primary_key, properties=properties)
        commit_id = uuid.uuid4().hex
        m = Manifest(
            version=0,
            previous=None,
            created_at=_now(),
            schema=schema,
            primary_key=primary_key,
            operation="CREATE",
            properties=_checked_properties(properties, storage.root),
            commit_id=commit_id,
            writer=log.writer,
            totals=Totals(),
            summary=_statement_summary(),
        )
        if storage.exists(POINTER_KEY):
            existing = log.latest()
            if not exist_ok:
                raise TableExists(f"{storage.root}: a table already exists here (version {existing.version})")
            existing.schema.check_compatible(schema, f"{storage.root}")
            return log
        try:
            storage.put_if_absent(manifest_key(0), m.to_bytes())
        except PreconditionFailed:
            if not exist_ok:
                raise TableExists(f"{storage.root}: a table already exists here") from None
            log.latest().schema.check_compatible(schema, f"{storage.root}")
            return log
        with contextlib.suppress(PreconditionFailed):  # someone rolled it forward already
            storage.put_if_absent(POINTER_KEY, pointer_bytes(0, commit_id))
        with log._lock:
            log._manifests[0] = m
        log._after_commit(m)  # a mirror the table is created with starts at version 0
        return log

    @staticmethod
    def check_create(
        storage: Storage,
        schema: Schema | pa.Schema,
        *,
        primary_key: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> Schema:
        """What :meth:`create` refuses (column types and names, the primary
        key, the properties), raised without writing anything; the table's
        schema otherwise. A writer whose first write creates the table checks
        that write against this schema before :meth:`create`, so a refused
        first write leaves no table behind."""
        if isinstance(schema, pa.Schema):
            schema = Schema.from_arrow(schema)
        if primary_key is not None and schema.column(primary_key) is None:
            raise FormatError(f"{storage.root}: primary key {primary_key!r} is not a column ({schema.names})")
        _checked_properties(properties, storage.root)
        return schema

    # ------------------------------------------------------------------ commit

    def commit(self, change: Change, *, commit_id: str | None = None, base: Manifest | None = None) -> Manifest:
        """Commit ``change`` as the next version, rebasing it on whatever won
        any race meanwhile. Raises CommitConflict if it cannot be applied or
        every attempt lost.

        ``commit_id`` makes a retry idempotent: a caller whose earlier call
        failed with an uncertain outcome (a StorageError after the request may
        have landed) calls again with the same id, and gets the version that
        call committed instead of committing twice. The last
        ``IDEMPOTENCY_WINDOW`` versions are searched for it.

        ``base``: the head the caller planned ``change`` on. If it is the last
        head this log read, the first attempt starts from it instead of
        reading the pointer again (two requests fewer on S3); a commit that
        landed since makes the create-only put of the next manifest fail, and
        the next attempt reads the head afresh, as without it.
        """
        explicit = commit_id is not None
        commit_id = commit_id or uuid.uuid4().hex
        checked: int | None = None
        # An explicit id searches back from the head for an earlier landing: only a fresh head will do.
        first = self.seen_head(base) if base is not None and not explicit else None
        for attempt in range(self.retry.max_attempts):
            base, pv, etag = first if attempt == 0 and first is not None else self._head()
            if explicit or checked is not None:
                low = base.version - IDEMPOTENCY_WINDOW if checked is None else checked
                for v in range(base.version, max(low, -1), -1):
                    try:
                        m = self._read_manifest(v)
                    except ObjectNotFound:
                        break  # garbage-collected
                    if m.commit_id == commit_id:
                        self._advance_pointer(v, commit_id, pv, etag)
                        # The call that landed it failed before its hooks: run them now (they are idempotent).
                        self._after_commit(m)
                        return m
            checked = base.version
            new = change.apply(base, self).evolve(
                version=base.version + 1,
                previous=base.version,
                # Never earlier than the base: time travel by timestamp bisects.
                created_at=max(_now(), base.created_at),
                commit_id=commit_id,
                writer=self.writer,
            )
            if said := _statement_summary():
                new = new.evolve(summary={**new.summary, **said})
            try:
                # The commit point: a try whose answer never came may have landed,
                # so its repeat answers 412 and the check below says whose it is.
                self.storage.repeated(self.storage.put_if_absent, manifest_key(new.version), new.to_bytes())
            except PreconditionFailed:
                # A client retry of a put that did land reports a loss: check.
                if not self._is_ours(new.version, commit_id):
                    self.retry.sleep(attempt)
                    continue
            with self._lock:
                self._manifests[new.version] = new
            self._advance_pointer(new.version, commit_id, pv, etag)
            if new.version % keyindex.BLOCK == 0:
                keyindex.write_index(self, new.version)  # after the commit point: best effort (§3.6)
            if new.version % min(changeblocks.SIZES) == 0:
                changeblocks.write_blocks(self, new.version)  # after the commit point: best effort (§3.8)
            self._after_commit(new)
            return new
        raise CommitConflict(
            f"{self.storage.root}: {change.operation} lost the commit race {self.retry.max_attempts} times; "
            "nothing was committed"
        )

    def _after_commit(self, m: Manifest) -> None:
        """Run the registered after-commit hooks for committed version ``m``:
        the one point every commit passes, whatever made it. A hook that fails
        is logged (the version stays committed, and the next commit's hooks
        catch up: a mirror writes every version it lacks); a version a hook
        commits is remembered for :meth:`followed`."""
        depth = _IN_HOOK.get()
        with _HOOKS_LOCK:
            hooks = [h for h in _HOOKS if h.after_hook_commits or not depth]
        if not hooks:
            return
        token = _IN_HOOK.set(depth + 1)
        try:
            for hook in hooks:
                try:
                    made = hook.run(self, m)
                except Exception as e:
                    _log.warning(
                        "table %s: %s after version %d failed (the version is committed): %s",
                        self.storage.root, hook.name, m.version, e,
                    )  # fmt: skip
                    continue
                if made is not None and made.version > m.version:
                    with self._lock:
                        self._followed[m.version] = made.version
                        while len(self._followed) > _FOLLOWED_KEPT:
                            self._followed.popitem(last=False)
        finally:
            _IN_HOOK.reset(token)

    def followed(self, version: int) -> int:
        """``version``, or the last version the after-commit hooks of this log
        committed right after it (an automatic compaction), following the
        chain: what a writer that committed ``version`` now reads.

        >>> log.followed(m.version)                                    # doctest: +SKIP
        8
        """
        with self._lock:
            while version in self._followed:
                version = self._followed[version]
        return version

    def _is_ours(self, version: int, commit_id: str) -> bool:
        try:
            return self._read_manifest(version).commit_id == commit_id
        except (ObjectNotFound, FormatError):
            return False

    def _advance_pointer(self, version: int, commit_id: str, pv: int | None, etag: str | None) -> None:
        """Move the pointer up to ``version`` unless it already points further.

        Best effort: the manifest put already committed the version, and a
        failure here only leaves readers one roll-forward GET more to do.
        """
        body = pointer_bytes(version, commit_id)
        for attempt in range(self.retry.max_attempts):
            if pv is not None and pv >= version:
                return
            try:
                if etag is None:
                    self.storage.put_if_absent(POINTER_KEY, body)
                else:
                    self.storage.put_if_match(POINTER_KEY, body, etag)
                return
            except PreconditionFailed:
                try:
                    pv, etag = self._read_pointer()
                except StorageError:
                    return
                if attempt:
                    self.retry.sleep(attempt)
            except StorageError:
                # The version is committed: an error now (GCS's limit of about one
                # write a second to one object name, a store that stopped
                # answering) must not report the write as failed, or a retry
                # would commit it twice. The pointer lags; readers roll forward.
                return

    # ------------------------------------------------------------------ writers' calls

    def upgrade(self) -> Manifest | None:
        """Make the table format version 2 now, with a commit that changes no
        data (operation ``UPGRADE``); None (nothing committed) if the latest
        version already is. Any other commit by this code upgrades it too.

        Example: ``TableLog(open_storage("/data/events")).upgrade()``.
        """
        if self.latest().format_version >= 2:
            return None
        return self.commit(Change("UPGRADE", summary={"upgraded_to": 2}))

    def set_properties(self, properties: Mapping[str, str | None]) -> Manifest | None:
        """Commit a version that sets ``properties`` (None removes one): operation
        ``SET PROPERTIES``, no data file written. None when nothing changes.

        >>> log.set_properties({"castsql.autoCompact": "true"}).operation      # doctest: +SKIP
        'SET PROPERTIES'
        """
        where = f"table {self.storage.root}: set properties"
        props = check(properties, where)
        head = self.latest()
        if all(head.properties.get(k) == v for k, v in props.items()):
            return None
        return self.commit(Change("SET PROPERTIES", properties=props), base=head)

    def alter(
        self,
        *,
        add: Mapping[str, str | pa.DataType] | None = None,
        widen: Mapping[str, str | pa.DataType] | None = None,
    ) -> Manifest | None:
        """Commit a version whose schema adds ``add`` (name -> type, nullable, at
        the end) and widens ``widen`` (name -> wider type): operation ``ALTER``, no
        data file written or rewritten. None when the schema already is that.

        >>> log.alter(add={"note": "string"}).schema.names[-1]                 # doctest: +SKIP
        'note'
        """
        head = self.latest()
        where = f"table {self.storage.root}: alter"
        if not add and not widen:
            raise SchemaMismatch(f"{where}: nothing to change (give columns to add or to widen)")
        new = evolution.altered(head.schema, add=add, widen=widen, where=where, primary_key=head.primary_key)
        if new == head.schema:
            return None
        return self.commit(Change("ALTER", new_schema=new), base=head)

    def append(
        self,
        files: Sequence[DataFile],
        *,
        schema: Schema | None = None,
        operation: str = "APPEND",
        commit_id: str | None = None,
    ) -> Manifest:
        """Commit new data files (from :func:`write_data_files`) as one version."""
        if not files:
            raise ValueError("append needs at least one data file")
        return self.commit(
            Change(operation, add_files=tuple(files), schema=schema, summary=added_summary(files)), commit_id=commit_id
        )

    def delete(
        self,
        records: Iterable[TombstoneRecord],
        *,
        read_version: int | None = None,
        deleted_rows: int | None = None,
        operation: str = "DELETE",
    ) -> Manifest | None:
        """Write one tombstone file holding ``records`` and commit it.

        Records are checked against ``read_version`` (default: latest): every
        file they name must be in it, row groups and positions must exist, and
        key ranges need a primary key. Returns None (commits nothing) when there
        are no records.
        """
        records = list(records)
        if not records:
            return None
        base = self.latest() if read_version is None else self.manifest(read_version)
        targets = self.validate_tombstones(records, base, where=f"{self.storage.root}: delete")
        key = self.write_tombstone(records)
        summary: dict[str, Any] = {"added_tombstones": 1, "tombstone_records": len(records)}
        if deleted_rows is not None:
            summary["deleted_rows"] = deleted_rows
        return self.commit(
            Change(
                operation,
                add_tombstones=(key,),
                tombstone_targets=frozenset(targets),
                read_version=base.version,
                summary=summary,
            ),
            base=base,
        )

    def write_tombstone(self, records: Sequence[TombstoneRecord]) -> str:
        """Write one tombstone file holding ``records`` (create-only, a new key)
        and return its key; nothing is committed. Checked records only: see
        :meth:`validate_tombstones`."""
        key = new_tombstone_key()
        self.storage.put_new(key, serialize_tombstones(records))
        with self._lock:
            self._tombstones[key] = list(records)  # the fold that takes it into a deletes object reads it from here
        return key

    def restore(self, version: int) -> Manifest | None:
        """Commit one version whose content equals ``version``'s (Delta's
        ``RESTORE``): the files and tombstones in force then, nothing rewritten.
        Returns None (commits nothing) when the newest version already has that
        content. Refused with VersionNotFound if ``version`` was collected, and
        with FormatError if an object it needs is gone. A commit that lands
        while the restore is planned makes it plan again (a restore must not
        keep rows a concurrent commit added): CommitConflict after as many
        tries as the retry policy allows.

        >>> log.restore(3).operation                                 # doctest: +SKIP
        'RESTORE'
        """
        root = self.storage.root
        where = f"{root}: restore to version {version}"
        target = self.manifest(version, probe=True)
        old = self.state(target)
        old_files = {to_table_key(f.path, root, what="data file"): f for f in old.entries()}
        old_tombs = set(old.tombstone_keys())
        checked: set[str] = set()
        for _ in range(self.retry.max_attempts):
            base = self.latest()
            now = self.state(base)
            now_keys = set(now.keys().to_pylist())
            now_tombs = set(now.tombstone_keys())
            add_keys = [k for k in old_files if k not in now_keys]
            add_tombs = sorted(old_tombs - now_tombs)
            back = set(add_tombs)
            targets = {old.lookup_key(r.file, where) for t, r in old.records() if t in back}
            change = Change(
                "RESTORE",
                add_files=tuple(old_files[k] for k in add_keys),
                remove_files=tuple(sorted(now_keys - old_files.keys())),
                add_tombstones=tuple(add_tombs),
                remove_tombstones=tuple(sorted(now_tombs - old_tombs)),
                tombstone_targets=frozenset(targets),
                read_version=base.version,
                summary={"restored_version": version},
                restore_cdc=True,
                cdc=target.cdc,  # the restored version's CDC order and delete markers (FORMAT.md §3.7)
            )
            if not (change.add_files or change.remove_files or change.add_tombstones or change.remove_tombstones):
                return None
            # Only what comes back needs checking: what the head has is there
            # (GC removes objects only after every manifest naming them).
            for key in [*add_keys, *add_tombs]:
                if key not in checked and not self.storage.exists(key):
                    raise FormatError(f"{where}: {key} is gone (garbage-collected?); nothing was committed")
                checked.add(key)
            try:
                return self.commit(change, base=base)
            except RestoreRaced:
                continue
        raise CommitConflict(f"{where}: new versions kept landing while it was planned; nothing was committed")

    def validate_tombstones(self, records: Sequence[TombstoneRecord], base: Manifest, *, where: str) -> set[str]:
        """Check records against ``base``; return the table keys of the files they name."""
        state = self.state(base)
        targets = set()
        for i, r in enumerate(records):
            at = f"{where}: record {i}"
            key = state.lookup_key(r.file, at)
            f = state.entry(key)
            targets.add(key)
            rg = r.row_group if isinstance(r, RowGroupDelete | PositionDelete) else None
            if rg is not None and rg >= f.row_group_count:
                raise FormatError(f"{at}: row group {rg} of {f.name} does not exist (it has {f.row_group_count})")
            if isinstance(r, PositionDelete) and len(r.positions):
                if r.row_group is None:
                    limit = f.total_rows
                elif f.row_group_rows is not None:
                    limit = f.row_group_rows[r.row_group]
                else:
                    limit = f.total_rows
                if r.positions.max() >= limit:
                    scope = f"row group {r.row_group} of {f.name}" if r.row_group is not None else f.name
                    raise FormatError(f"{at}: row {r.positions.max()} is past the end of {scope} ({limit} rows)")
            if isinstance(r, KeyRangeDelete):
                if base.primary_key is None:
                    raise FormatError(f"{at}: key-range tombstone on a table with no primary key")
                check_key_range(r, base.schema, base.primary_key, at)
        return targets
