"""The snapshot resolver: a version of a table turned into the data files that
matter and, per file, the rows to drop.

Row-group deletes and position deletes (lists and bitmaps, row-group- or
file-relative) all become one roaring bitmap of file positions per file; key
ranges stay ranges (they are predicates on the primary key, which the scan can
use to skip data). Resolved snapshots are immutable and cached.

The files of a version are Arrow tables (one per metadata object, shared with
every version that references it, plus the inline entries): nothing builds a
Python object per data file unless asked for :attr:`Snapshot.files`. A
session's next version is resolved from the one before by its ``change``
record (the deletes of the files it touched), and a pruning predicate reads
only the metadata objects whose summaries can match (:meth:`Snapshot.prune`).

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files, RowGroupDelete
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    >>> f = log.append(write_data_files(st, pa.table({"id": range(10)}), row_group_size=5)).data_files[0]
    >>> _ = log.delete([RowGroupDelete(f.name, 1)])
    >>> snap = resolve(log, 2)
    >>> snap.live_rows, list(snap.files[0].deleted)
    (5, [5, 6, 7, 8, 9])
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap, FrozenBitMap

from castsql.errors import FormatError
from castsql.format import DataFile, KeyRangeDelete, Manifest, PositionDelete, RowGroupDelete, TableLog
from castsql.format.manifest import no_gc
from castsql.format.metafiles import files_from_arrow, files_to_arrow
from castsql.format.schema import Schema
from castsql.format.state import VersionState, check_unique
from castsql.format.tombstone import TombstoneRecord, check_key_range
from castsql.snapshot.footer import row_group_rows
from castsql.snapshot.prune import Predicate, prune_files, prune_mask, prune_refs

_EMPTY = FrozenBitMap()


@dataclass(slots=True)
class ResolvedFile:
    """One data file of a snapshot and the rows its tombstones drop."""

    key: str  # relative to the table root
    uri: str  # what a Parquet reader opens
    entry: DataFile
    row_group_rows: tuple[int, ...] | None
    # File positions, row groups included. Files without deletes share one
    # frozen empty bitmap. Read-only for everyone but the resolver.
    deleted: BitMap | FrozenBitMap = field(default=_EMPTY)
    key_ranges: tuple[tuple[Any, Any], ...] = ()
    version: int = -1  # of the snapshot it belongs to, for errors

    @property
    def total_rows(self) -> int:
        return self.entry.total_rows

    @property
    def has_deletes(self) -> bool:
        return bool(self.deleted) or bool(self.key_ranges)

    def row_group_start(self, rg: int) -> int:
        return sum(self.row_group_rows[:rg])  # type: ignore[index]

    def deleted_row_groups(self) -> list[int]:
        """Row groups every row of which is in ``deleted``."""
        out, start = [], 0
        for i, n in enumerate(self.row_group_rows or ()):
            if n and self.deleted.range_cardinality(start, start + n) == n:
                out.append(i)
            start += n
        return out


@dataclass(slots=True)
class FileDeletes:
    """What a version's tombstones drop from one file."""

    deleted: BitMap | FrozenBitMap = field(default=_EMPTY)
    key_ranges: tuple[tuple[Any, Any], ...] = ()
    row_group_rows: tuple[int, ...] | None = None  # read from the footer when the entry lacks it


class Snapshot:
    """One committed version of one table, resolved.

    ``files`` (ResolvedFile objects, files with live rows left, in table
    order) is built on first use; the columnar form is :meth:`table`, and
    ``deletes`` holds what each file with deletes loses.
    """

    def __init__(
        self,
        table_uri: str,
        version: int,
        manifest: Manifest,
        files: list[ResolvedFile] | None = None,
        primary_key: str | None = None,
        *,
        state: VersionState | None = None,
        deletes: dict[str, FileDeletes] | None = None,
        gone: frozenset[str] = frozenset(),
        uri_of: Any = None,
        names: dict[str, str] | None = None,
        tombstones: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
    ) -> None:
        self.table_uri = table_uri
        self.version = version
        self.manifest = manifest
        self.primary_key = primary_key
        self._files = files
        self._state = state
        self.deletes: dict[str, FileDeletes] = deletes if deletes is not None else {}
        self.gone = gone  # keys of files every row of which is deleted (not in ``files``)
        self._uri_of = uri_of
        # What the next version's stepped resolve checks it still holds: the key
        # each base name in a record stood for, and the tombstone files in force
        # (in deletes objects, inline).
        self.names: dict[str, str] = names or {}
        self.tombstones = tombstones
        self._lock = threading.Lock()
        if files is not None and deletes is None:
            self.deletes = {
                f.key: FileDeletes(f.deleted, f.key_ranges, f.row_group_rows) for f in files if f.has_deletes
            }

    def __repr__(self) -> str:
        return f"Snapshot({self.table_uri!r}, version={self.version})"

    @property
    def is_resolved(self) -> bool:
        """A whole version as the resolver made it (not a file set built from one)."""
        return self._state is not None

    @property
    def schema(self) -> Schema:
        return self.manifest.schema

    def table(self) -> pa.Table:
        """Every file entry of the version (gone ones included) as one Arrow table."""
        if self._state is None:
            return _entries_table([f.entry for f in self.files], self.schema)
        return self._state.table()

    @property
    def file_count(self) -> int:
        """Files with live rows left."""
        if self._files is not None:
            return len(self._files)
        assert self._state is not None
        return self._state.file_count - len(self.gone)

    @property
    def files(self) -> list[ResolvedFile]:
        with self._lock:
            if self._files is None:
                st = self._state
                assert st is not None
                # A file listed twice would be read twice: checked.
                objects = [f for p in st.unique_objects() for f in p.entries()]
                self._files = self._materialize(objects + st.inline_entries())
            return self._files

    def _materialize(self, entries: list[DataFile]) -> list[ResolvedFile]:
        out = []
        with no_gc():
            for f in entries:
                if f.path in self.gone:
                    continue
                d = self.deletes.get(f.path)
                v = self.version
                if d is None:
                    out.append(ResolvedFile(f.path, self._uri_of(f.path), f, f.row_group_rows, version=v))
                else:
                    rgr = d.row_group_rows if d.row_group_rows is not None else f.row_group_rows
                    out.append(ResolvedFile(f.path, self._uri_of(f.path), f, rgr, d.deleted, d.key_ranges, v))
        return out

    @property
    def stored_rows(self) -> int:
        """Rows in the version's data files, before tombstones."""
        if self._files is not None:
            return sum(f.total_rows for f in self._files) + sum(len(self.deletes[k].deleted) for k in self.gone)
        assert self._state is not None
        m = self.manifest
        return m.totals.rows if m.totals is not None else sum(f.total_rows for f in self._state.inline_entries())

    @property
    def live_rows(self) -> int | None:
        """Exact live row count, or None when key ranges make it unknowable without a scan."""
        if any(d.key_ranges for d in self.deletes.values()):
            return None
        # A file every row of which is deleted has them all in its bitmap.
        return self.stored_rows - sum(len(d.deleted) for d in self.deletes.values())

    def prune(self, preds: Sequence[Predicate]) -> Snapshot:
        """The files whose statistics may match every predicate, as a snapshot of
        their own (``self`` when no file can be excluded). Metadata objects whose
        summaries cannot match are never read."""
        types = {c.name: c.type for c in self.schema.columns}
        if self._files is not None or self._state is None or not self.manifest.file_objects:
            # Everything in Python objects already (version 1, small versions): JSON statistics.
            kept = prune_files(self.files, preds, types)
            return self if len(kept) == len(self.files) else self._sub(kept)
        m = self.manifest
        refs = prune_refs(m.file_objects, preds, types)
        tables = [self._state.part(ref).table for ref in refs] + [self._state.inline.table]
        table = pa.concat_tables(tables)
        table = table.filter(prune_mask(table, preds, types))
        if pc.count_distinct(table.column("path")).as_py() != table.num_rows:
            check_unique([p for p in self._state.parts if p.table.num_rows], self._state.where())
        if self.gone:
            table = table.filter(pc.invert(pc.is_in(table.column("path"), pa.array(sorted(self.gone)))))
        if table.num_rows == self.file_count:
            return self
        return self._sub(self._materialize(files_from_arrow(table)))

    def resolved(self, keys: Iterable[str]) -> list[ResolvedFile]:
        """The live files among ``keys`` (in ``keys``' order), without building the others."""
        if self._files is not None or self._state is None:
            want = set(keys)
            return [f for f in self.files if f.key in want]
        out = []
        for k in keys:
            if k in self.gone or not self._state.contains(k):
                continue
            out += self._materialize([self._state.entry(k)])
        return out

    def read_objects(self) -> None:
        """Read (and so check) every files object of the version, as a scan
        would; its deletes objects were read when it was resolved. Objects are
        cached by key: versions sharing them read them once."""
        if self._state is not None:
            for ref in self.manifest.file_objects:
                self._state.part(ref)

    def file_diff(self, prev: Snapshot) -> tuple[set[str], set[str]]:
        """Keys of the data files this version has and ``prev`` lacks, and the
        reverse, from the two versions' content (never from a ``change``
        record, which may disagree with it): the files objects one has and the
        other not, plus both inline lists. An object both reference lists the
        same files in both."""
        assert self._state is not None and prev._state is not None
        mine, theirs = _listed_apart(self, prev), _listed_apart(prev, self)
        return mine - theirs, theirs - mine

    def touched_since(self, prev: Snapshot) -> set[str] | None:
        """Keys of the files whose rows may differ between ``prev`` and this
        version — added, removed, or with other deletes — from their content;
        None when one of them is not a resolved version."""
        if self._state is None or prev._state is None:
            return None
        added, removed = self.file_diff(prev)
        keys = added | removed
        for k in self.deletes.keys() | prev.deletes.keys():
            a, b = self.deletes.get(k), prev.deletes.get(k)
            if a is None or b is None or a.deleted != b.deleted or a.key_ranges != b.key_ranges:
                keys.add(k)
        return keys

    def _sub(self, files: list[ResolvedFile]) -> Snapshot:
        return Snapshot(self.table_uri, self.version, self.manifest, files, self.primary_key)


def _listed_apart(a: Snapshot, b: Snapshot) -> set[str]:
    """Keys ``a`` lists in its inline entries or in files objects ``b`` does not reference."""
    st = a._state
    assert st is not None
    shared = {r.path for r in b.manifest.file_objects}
    keys = {f.path for f in st.inline_entries()}
    for ref in a.manifest.file_objects:
        if ref.path not in shared:
            keys |= st.part(ref).key_set
    return keys


def _entries_table(entries: Sequence[DataFile], schema: Schema) -> pa.Table:
    return files_to_arrow(entries, schema)


_cache: OrderedDict[tuple[str, int], Snapshot] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 64


def resolve(log: TableLog, version: int | None = None, *, probe: bool = False) -> Snapshot:
    """The snapshot of ``version`` (default: the latest) of the table ``log`` reads.

    ``probe``: refuse a version that GC dropped even if it is cached (see
    :meth:`TableLog.manifest`); what user-facing time travel asks for.
    """
    manifest = log.latest() if version is None else log.manifest(version, probe=probe)
    ck = (log.uri, manifest.version)
    with _cache_lock:
        snap = _cache.get(ck)
        if snap is not None and not _same_commit(snap.manifest, manifest):
            # The table was deleted and made again at the same place (a
            # notebook's "start over"): none of the old one's versions hold.
            for k in [k for k in _cache if k[0] == log.uri]:
                del _cache[k]
            snap = None
        if snap is not None:
            _cache.move_to_end(ck)
            return snap
        # A cached version before it is only a starting point: _step checks
        # that everything it holds is still in ``manifest``.
        prev = _cache.get((log.uri, manifest.version - 1))
    snap = _resolve(log, manifest, prev)
    with _cache_lock:
        _cache[ck] = snap
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return snap


def _same_commit(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests of one version number are the same commit."""
    return a is b or (a.commit_id, a.created_at, a.previous) == (b.commit_id, b.created_at, b.previous)


def _resolve(log: TableLog, m: Manifest, prev: Snapshot | None) -> Snapshot:
    with no_gc():
        state = log.state(m)
        uri_of = _uri_maker(log)
        where = log.where(m.version)
        tombstones = state.tombstone_sets()
        stepped = _step(log, state, m, prev, tombstones[1], where) if prev is not None else None
        if stepped is not None:
            assert prev is not None
            deletes, names, records = dict(prev.deletes), dict(prev.names), stepped
        else:
            deletes, names, records = {}, {}, list(state.records())
        gone = _apply(log, state, m, deletes, records, where, names)
        if stepped is not None:
            assert prev is not None
            gone |= prev.gone
        return Snapshot(
            log.uri, m.version, m, None, m.primary_key, state=state, deletes=deletes, gone=frozenset(gone),
            uri_of=uri_of, names=names, tombstones=tombstones,
        )  # fmt: skip


def _step(
    log: TableLog, state: VersionState, m: Manifest, prev: Snapshot, inline: frozenset[str], where: str
) -> list[tuple[str, TombstoneRecord]] | None:
    """The tombstone records version ``m`` holds and ``prev`` (the version
    before, resolved) did not, when ``m``'s deletes are exactly ``prev``'s plus
    these; None when a full resolve is needed.

    Decided from the two versions' content, never from ``m.change`` (a change
    record can disagree with the version; the answer must not depend on
    whether the session read ``prev`` first): every deletes object and inline
    tombstone of ``prev`` is still in ``m`` (else records may have gone: a
    compaction, a fold, a merge), every file a record named is still in ``m``,
    and every base name a record used still names the same file. Then the
    records of ``m`` are ``prev``'s plus those of its new objects and inline
    tombstones, and applying these to ``prev``'s deletes gives what applying
    all of ``m``'s gives (deletes are idempotent and order-free)."""
    if prev._state is None or m.previous != prev.version:
        return None
    now = {r.path for r in m.delete_objects}
    before = {r.path for r in prev.manifest.delete_objects}
    if not before <= now or not prev.tombstones[1] <= inline:
        return None
    pm = prev.manifest
    if (m.file_objects != pm.file_objects or m.data_files != pm.data_files) and not _only_added(
        state, m, pm, prev.names
    ):
        # Files left or were rewritten: each file the records name must still be
        # there, under the same name. (Checking every name walks every part per
        # lookup: ~250 names cost ~30 ms a version on a table of 100,000 files.)
        if not all(state.contains(k) for k in prev.deletes):
            return None
        for name, key in prev.names.items():
            try:
                if state.lookup_key(name, where) != key:
                    return None
            except FormatError:
                return None  # the full resolve says what is wrong
    records = [rec for ref in m.delete_objects if ref.path not in before for rec in log.delete_records(ref, where)]
    for key in sorted(inline - prev.tombstones[1]):
        records += [(key, r) for r in log.tombstones(key)]
    return records


def _only_added(state: VersionState, m: Manifest, pm: Manifest, names: dict[str, str]) -> bool:
    """Whether ``m``'s data files are ``pm``'s (every files object and inline
    entry of it, objects being immutable) plus new ones, none of which has a
    base name a record of ``pm`` used: then every file the records name is
    still there under the same name (a delete, an append, most merges)."""
    before = {r.path for r in pm.file_objects}
    new = [r for r in m.file_objects if r.path not in before]
    n = len(pm.data_files)
    if len(m.file_objects) - len(new) != len(pm.file_objects) or m.data_files[:n] != pm.data_files:
        return False
    added = [f.path.rpartition("/")[2] for f in m.data_files[n:]]
    added += [name for r in new for name in state.part(r).by_name]
    return not any(name in names for name in added)


def _uri_maker(log: TableLog) -> Any:
    # What readers open for each data file: on a local disk, a file that
    # leads out of the root through a symbolic link is refused here.
    return log.storage.data_uris()


def _apply(
    log: TableLog,
    state: VersionState,
    m: Manifest,
    deletes: dict[str, FileDeletes],
    records: list[tuple[str, TombstoneRecord]],
    where: str,
    names: dict[str, str],
) -> set[str]:
    """Add ``records`` to ``deletes`` (copying any entry it changes) and the
    base names they use to ``names``; returns the keys of files whose every
    row they delete."""
    if not records:
        return set()
    info: dict[str, DataFile] = {}
    touched: set[str] = set()
    seen: dict[str, int] = {}  # records met per tombstone file: errors say which one
    for tkey, r in records:
        n = seen[tkey] = seen.get(tkey, -1) + 1
        at = f"{log.storage.uri(tkey)} (version {m.version}): record {n}"
        key = state.lookup_key(r.file, at)
        if "/" not in r.file:
            names[r.file] = key
        if key not in info:
            info[key] = state.entry(key)
        f = info[key]
        if key not in touched:
            was = deletes.get(key)
            deletes[key] = FileDeletes(
                BitMap(was.deleted) if was else BitMap(),
                was.key_ranges if was else (),
                was.row_group_rows if was else None,
            )
            touched.add(key)
        d = deletes[key]
        if isinstance(r, KeyRangeDelete):
            if m.primary_key is None:
                raise FormatError(f"{at}: key-range tombstone on a table with no primary key")
            check_key_range(r, m.schema, m.primary_key, at)
            if (r.pk_min, r.pk_max) not in d.key_ranges:
                d.key_ranges += ((r.pk_min, r.pk_max),)
            continue
        _apply_positions(log, f, d, r, key, at)
    gone = set()
    # Only files these records touched can have become gone (a stepped
    # resolve carries the others' state over from the version before).
    for key in touched:
        d, held = deletes[key], info.get(key)
        if (
            key in touched
            and d.deleted
            and d.row_group_rows is None
            and held is not None
            and held.row_group_rows is None
        ):
            _row_groups(log, held, d)
        if held is not None and len(d.deleted) >= held.total_rows:
            gone.add(key)
    return gone


def _apply_positions(
    log: TableLog, f: DataFile, d: FileDeletes, r: RowGroupDelete | PositionDelete, key: str, at: str
) -> None:
    """Add a record of deleted positions (a whole row group, rows of one, or
    rows of the file) to ``d``; FormatError, naming ``at``, for rows the file lacks."""
    rg = r.row_group if isinstance(r, RowGroupDelete | PositionDelete) else None
    if rg is not None:
        rgr = _row_groups(log, f, d)
        if not 0 <= rg < len(rgr):
            raise FormatError(f"{at}: row group {rg} of {key} does not exist (it has {len(rgr)})")
        start = sum(rgr[:rg])
        if isinstance(r, RowGroupDelete):
            d.deleted.add_range(start, start + rgr[rg])  # type: ignore[union-attr]
        else:
            if r.positions and r.positions.max() >= rgr[rg]:
                raise FormatError(
                    f"{at}: row {r.positions.max()} is past the end of row group {rg} of {key} "
                    f"({rgr[rg]} rows; {len(r.positions)} positions)"
                )
            d.deleted |= r.positions.shift(start) if start else r.positions
    else:
        assert isinstance(r, PositionDelete)
        if r.positions and r.positions.max() >= f.total_rows:
            raise FormatError(
                f"{at}: row {r.positions.max()} is past the end of {key} "
                f"({f.total_rows} rows; {len(r.positions)} positions)"
            )
        d.deleted |= r.positions


def _row_groups(log: TableLog, f: DataFile, d: FileDeletes) -> tuple[int, ...]:
    if f.row_group_rows is not None:
        return f.row_group_rows
    if d.row_group_rows is None:
        d.row_group_rows = row_group_rows(log.storage, f.path, f.size_bytes)
        if sum(d.row_group_rows) != f.total_rows:
            raise FormatError(
                f"{log.storage.uri(f.path)}: holds {sum(d.row_group_rows)} rows, the manifest says {f.total_rows}"
            )
    return d.row_group_rows
