"""A table's versions: reading the pointer and manifests, and committing.

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
import json
import os
import random
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from castsql.errors import CommitConflict, FormatError, TableExists, TableNotFound, VersionNotFound
from castsql.format.change import Change, RestoreRaced
from castsql.format.jsonio import load_json
from castsql.format.layout import (
    MANIFEST_DIR,
    POINTER_KEY,
    manifest_key,
    manifest_version,
    new_tombstone_key,
    to_table_key,
)
from castsql.format.manifest import DataFile, Manifest, MetaRef, Totals, format_time, no_gc, parse_manifest
from castsql.format.metafiles import files_from_arrow, read_deletes_object
from castsql.format.schema import Schema
from castsql.format.state import FilePart, VersionState, read_part, read_records
from castsql.format.tombstone import (
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    TombstoneRecord,
    check_key_range,
    parse_tombstones,
    serialize_tombstones,
)
from castsql.storage import ObjectNotFound, PreconditionFailed, Storage


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with full-jitter exponential backoff."""

    max_attempts: int = 200
    base_delay: float = 0.002
    max_delay: float = 0.25

    def sleep(self, attempt: int) -> None:
        time.sleep(random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt)))


IDEMPOTENCY_WINDOW = 64
_PART_ROWS_CACHED = 4_000_000  # file entries of metadata objects kept parsed, per table


def default_writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_pointer(data: bytes, where: str) -> int:
    obj = load_json(data, where, "pointer")
    v = obj.get("version") if isinstance(obj, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise FormatError(f'{where}: pointer must be {{"version": <non-negative integer>}}, got {data[:80]!r}')
    return v


def pointer_bytes(version: int, commit_id: str) -> bytes:
    # The commit id makes every pointer body (and so its ETag) unique.
    return json.dumps({"version": version, "commit_id": commit_id, "updated_at": format_time(_now())}).encode()


def _schema_key(m: Manifest) -> str:
    return _schema_text(m.schema)


_schema_texts: dict[int, tuple[Schema, str]] = {}
_HOLDERS = 200_000  # data files whose files object a log remembers


def _schema_text(schema: Schema) -> str:
    # Asked on every lookup of a files object (a stepped resolve makes
    # hundreds a version): the JSON once per schema object, found by identity
    # (hashing a schema costs as much as the JSON); the entry holds the
    # schema, so its id is not reused while cached.
    hit = _schema_texts.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    text = json.dumps(schema.to_json(), sort_keys=True)
    if len(_schema_texts) >= 4096:
        _schema_texts.clear()
    _schema_texts[id(schema)] = (schema, text)
    return text


def _checked_properties(properties: dict[str, str] | None, root: str) -> dict[str, str]:
    from castsql.format.properties import check

    return {k: v for k, v in check(properties or {}, f"{root}: create").items() if v is not None}


def _now() -> datetime:
    return datetime.now(UTC)


class TableLog:
    """The versions of the table rooted at ``storage``."""

    def __init__(self, storage: Storage, *, retry: RetryPolicy | None = None, writer: str | None = None) -> None:
        self.storage = storage
        self.retry = retry or RetryPolicy()
        self.writer = writer or default_writer_id()
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()
        self._tombstones: OrderedDict[str, list[TombstoneRecord]] = OrderedDict()
        # Metadata objects never change: parsed ones are kept by key (bounded by rows held).
        self._parts: OrderedDict[tuple[str, str], FilePart] = OrderedDict()
        self._deletes: OrderedDict[str, pa.Table] = OrderedDict()
        self._records: OrderedDict[str, list[tuple[str, TombstoneRecord]]] = OrderedDict()
        self._object_tombs: OrderedDict[str, frozenset[str]] = OrderedDict()
        # Data file key -> a files object found to list it (VersionState.contains).
        self.holders: dict[str, str] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TableLog({self.storage.root!r})"

    @property
    def uri(self) -> str:
        return self.storage.root

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
        if isinstance(schema, pa.Schema):
            schema = Schema.from_arrow(schema)
        if primary_key is not None and schema.column(primary_key) is None:
            raise FormatError(f"{storage.root}: primary key {primary_key!r} is not a column ({schema.names})")
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
        return log

    # ------------------------------------------------------------------ read

    def _read_manifest(self, version: int) -> Manifest:
        """Manifest ``version`` or ObjectNotFound; cached (manifests never change)."""
        with self._lock:
            m = self._manifests.get(version)
            if m is not None:
                self._manifests.move_to_end(version)
                return m
        key = manifest_key(version)
        data = self.storage.get(key)
        with no_gc():  # a 100,000-file manifest is millions of small objects: see no_gc
            m = parse_manifest(data, self.storage.uri(key), expected_version=version)
        with self._lock:
            self._manifests[version] = m
            while len(self._manifests) > 64:
                self._manifests.popitem(last=False)
        return m

    def where(self, version: int) -> str:
        """``<manifest URI> (version N)``: how errors about a version's metadata name it."""
        return f"{self.storage.uri(manifest_key(version))} (version {version})"

    def manifest_raw(self, version: int) -> Manifest:
        """Manifest ``version`` (cached), or ObjectNotFound: no listing, no pointer read."""
        return self._read_manifest(version)

    # ------------------------------------------------------------------ what a version holds

    def state(self, m: Manifest) -> VersionState:
        """The files and tombstones of version ``m`` (format version 1 or 2)."""
        return VersionState(self, m)

    def hold(self, key: str, ref_path: str) -> None:
        """Remember that files object ``ref_path`` lists data file ``key`` (bounded)."""
        if len(self.holders) >= _HOLDERS:
            self.holders.clear()
        self.holders[key] = ref_path

    def has_part(self, ref: MetaRef, m: Manifest) -> bool:
        with self._lock:
            return (ref.path, _schema_key(m)) in self._parts

    def part(self, ref: MetaRef, m: Manifest) -> FilePart:
        """The entries of files object ``ref`` of version ``m`` (cached by key and schema)."""
        ck = (ref.path, _schema_key(m))
        with self._lock:
            p = self._parts.get(ck)
            if p is not None:
                self._parts.move_to_end(ck)
                return p
        p = read_part(self, ref, m, self.where(m.version))
        with self._lock:
            self._parts[ck] = p
            held = sum(x.table.num_rows for x in self._parts.values())
            while held > _PART_ROWS_CACHED and len(self._parts) > 1:
                held -= self._parts.popitem(last=False)[1].table.num_rows
        return p

    def deletes_table(self, ref: MetaRef, where: str | None = None) -> pa.Table:
        """The rows of deletes object ``ref`` (cached by key); ``where`` names the version in errors."""
        with self._lock:
            t = self._deletes.get(ref.path)
            if t is not None:
                self._deletes.move_to_end(ref.path)
                return t
        t = read_deletes_object(self.storage, ref, where or self.storage.root)
        with self._lock:
            self._deletes[ref.path] = t
            while len(self._deletes) > 256:
                self._deletes.popitem(last=False)
        return t

    def object_tombstones(self, ref: MetaRef, where: str | None = None) -> frozenset[str]:
        """The keys of the tombstone files whose records deletes object ``ref`` holds (cached by key)."""
        with self._lock:
            keys = self._object_tombs.get(ref.path)
            if keys is not None:
                self._object_tombs.move_to_end(ref.path)
                return keys
        keys = frozenset(self.deletes_table(ref, where).column("tombstone").to_pylist())
        with self._lock:
            self._object_tombs[ref.path] = keys
            while len(self._object_tombs) > 1024:
                self._object_tombs.popitem(last=False)
        return keys

    def delete_records(self, ref: MetaRef, where: str) -> list[tuple[str, TombstoneRecord]]:
        """The records of deletes object ``ref``, with the tombstone file of each (cached by key)."""
        with self._lock:
            recs = self._records.get(ref.path)
            if recs is not None:
                self._records.move_to_end(ref.path)
                return recs
        self.deletes_table(ref, where)  # read and checked once
        recs = read_records(self, ref, where)
        with self._lock:
            self._records[ref.path] = recs
            while len(self._records) > 256:
                self._records.popitem(last=False)
        return recs

    def entries_of(self, table: pa.Table) -> list[DataFile]:
        return files_from_arrow(table)

    def totals(self, m: Manifest) -> Totals:
        """What ``m`` holds: its own totals (version 2), or counted from its lists (version 1)."""
        if m.totals is not None:
            return m.totals
        return Totals(
            files=len(m.data_files),
            rows=sum(f.total_rows for f in m.data_files),
            bytes=sum(f.size_bytes for f in m.data_files),
            tombstones=len(m.tombstones),
        )

    def _read_pointer(self) -> tuple[int | None, str | None]:
        try:
            data, etag = self.storage.get_with_etag(POINTER_KEY)
        except ObjectNotFound:
            return None, None
        return parse_pointer(data, self.storage.uri(POINTER_KEY)), etag

    def _head(self) -> tuple[Manifest, int | None, str | None]:
        """The latest committed manifest, with the pointer's version and ETag."""
        pv, etag = self._read_pointer()
        if pv is None:
            # The creator may have died between manifest 0 and the pointer.
            try:
                m = self._read_manifest(0)
            except ObjectNotFound:
                raise TableNotFound(f"{self.storage.root}: no table here (no {POINTER_KEY})") from None
        else:
            for _ in range(self.retry.max_attempts):
                try:
                    m = self._read_manifest(pv)
                    break
                except ObjectNotFound:
                    # GC may drop it between our pointer GET and this one, once
                    # the pointer has moved on (FORMAT.md §8 keeps only versions
                    # from the pointer's current one): read the pointer again.
                    again, again_etag = self._read_pointer()
                    if again is None or again == pv:
                        raise FormatError(
                            f"{self.storage.uri(POINTER_KEY)}: names version {pv}, "
                            f"but {manifest_key(pv)} does not exist"
                        ) from None
                    pv, etag = again, again_etag
            else:
                raise FormatError(f"{self.storage.uri(POINTER_KEY)}: kept moving to garbage-collected versions")
        while True:  # roll forward over versions committed after the pointer moved
            try:
                m = self._read_manifest(m.version + 1)
            except ObjectNotFound:
                return m, pv, etag

    def latest(self) -> Manifest:
        """The latest committed version (one pointer GET, then one manifest GET
        per version past the pointer, plus one that finds none)."""
        return self._head()[0]

    def latest_version(self) -> int:
        return self.latest().version

    def manifest(self, version: int, *, probe: bool = False) -> Manifest:
        """Manifest of a committed version; VersionNotFound if there is none.

        Manifests are cached, as they never change, but GC may drop one: with
        ``probe`` a cached manifest is returned only if it is still stored
        (one existence check), so a collected version is refused.
        """
        if not isinstance(version, int) or version < 0:
            raise VersionNotFound(f"{self.storage.root}: version {version!r} is not a version number")
        try:
            if probe and not self.storage.exists(manifest_key(version)):
                with self._lock:
                    self._manifests.pop(version, None)
                raise ObjectNotFound(manifest_key(version))
            return self._read_manifest(version)
        except ObjectNotFound:
            pass
        # Listing, not the pointer: a version is told apart from a collected one
        # even when the latest version is unreadable (audits of old versions
        # must keep working exactly then).
        kept = self.versions()
        if not kept or version > kept[-1]:
            latest = f" (latest is {kept[-1]})" if kept else ""
            raise VersionNotFound(f"{self.storage.root}: version {version} does not exist{latest}") from None
        raise VersionNotFound(
            f"{self.storage.root}: version {version} was garbage-collected (oldest kept is {kept[0]})"
        ) from None

    def versions(self) -> list[int]:
        """Committed versions whose manifests are still kept, ascending.

        A manifest that exists is committed (the create-only put is the commit
        point), so this is a listing of ``manifest/`` alone: it needs neither
        the pointer nor the latest manifest to be readable.
        """
        return sorted(
            v for info in self.storage.list(MANIFEST_DIR + "/") if (v := manifest_version(info.key)) is not None
        )

    def history(self) -> list[Manifest]:
        """Every kept version's manifest, oldest first."""
        return [self._read_manifest(v) for v in self.versions()]

    def version_at(self, when: datetime) -> int:
        """The latest version committed at or before ``when``."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        vs = self.versions()
        lo, hi, found = 0, len(vs) - 1, None
        # created_at never decreases along the chain (commit() enforces it).
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._read_manifest(vs[mid]).created_at <= when:
                found, lo = vs[mid], mid + 1
            else:
                hi = mid - 1
        if found is None:
            first = self._read_manifest(vs[0]).created_at if vs else None
            raise VersionNotFound(
                f"{self.storage.root}: no version at or before {format_time(when)}"
                + (f" (the oldest kept version was committed at {format_time(first)})" if first else "")
            )
        return found

    def tombstones(self, key: str) -> list[TombstoneRecord]:
        """Records of one tombstone file (cached; tombstones never change)."""
        key = to_table_key(key, self.storage.root, what="tombstone")
        with self._lock:
            recs = self._tombstones.get(key)
            if recs is not None:
                self._tombstones.move_to_end(key)
                return recs
        try:
            data = self.storage.get(key)
        except ObjectNotFound:
            raise FormatError(f"{self.storage.uri(key)}: tombstone file is missing") from None
        recs = parse_tombstones(data, self.storage.uri(key))
        with self._lock:
            self._tombstones[key] = recs
            while len(self._tombstones) > 4096:
                self._tombstones.popitem(last=False)
        return recs

    # ------------------------------------------------------------------ commit

    def commit(self, change: Change, *, commit_id: str | None = None) -> Manifest:
        """Commit ``change`` as the next version, rebasing it on whatever won
        any race meanwhile. Raises CommitConflict if it cannot be applied or
        every attempt lost.

        ``commit_id`` makes a retry idempotent: a caller whose earlier call
        failed with an uncertain outcome (a StorageError after the request may
        have landed) calls again with the same id, and gets the version that
        call committed instead of committing twice. The last
        ``IDEMPOTENCY_WINDOW`` versions are searched for it.
        """
        explicit = commit_id is not None
        commit_id = commit_id or uuid.uuid4().hex
        checked: int | None = None
        for attempt in range(self.retry.max_attempts):
            base, pv, etag = self._head()
            if explicit or checked is not None:
                low = base.version - IDEMPOTENCY_WINDOW if checked is None else checked
                for v in range(base.version, max(low, -1), -1):
                    try:
                        m = self._read_manifest(v)
                    except ObjectNotFound:
                        break  # garbage-collected
                    if m.commit_id == commit_id:
                        self._advance_pointer(v, commit_id, pv, etag)
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
            try:
                self.storage.put_if_absent(manifest_key(new.version), new.to_bytes())
            except PreconditionFailed:
                # A client retry of a put that did land reports a loss: check.
                if not self._is_ours(new.version, commit_id):
                    self.retry.sleep(attempt)
                    continue
            with self._lock:
                self._manifests[new.version] = new
            self._advance_pointer(new.version, commit_id, pv, etag)
            return new
        raise CommitConflict(
            f"{self.storage.root}: {change.operation} lost the commit race {self.retry.max_attempts} times; "
            "nothing was committed"
        )

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
                pv, etag = self._read_pointer()
                if attempt:
                    self.retry.sleep(attempt)

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
        summary = {
            "added_files": len(files),
            "added_rows": sum(f.total_rows for f in files),
            "added_bytes": sum(f.size_bytes for f in files),
        }
        return self.commit(
            Change(operation, add_files=tuple(files), schema=schema, summary=summary), commit_id=commit_id
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
            )
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
                return self.commit(change)
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
