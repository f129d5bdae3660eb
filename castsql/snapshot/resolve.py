"""The snapshot resolver: a version of a table turned into the data files that
matter and, per file, the rows to drop.

Row-group deletes and position deletes (lists and bitmaps, row-group- or
file-relative) all become one roaring bitmap of file positions per file; key
ranges stay ranges (they are predicates on the primary key, which the scan can
use to skip data). Resolved snapshots are immutable and cached.

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
from dataclasses import dataclass, field
from typing import Any

from pyroaring import BitMap, FrozenBitMap

from castsql.errors import FormatError
from castsql.format import DataFile, KeyRangeDelete, Manifest, PositionDelete, RowGroupDelete, TableLog
from castsql.format.files import FileIndex
from castsql.format.manifest import no_gc
from castsql.format.schema import Schema
from castsql.format.tombstone import check_key_range
from castsql.snapshot.footer import row_group_rows


@dataclass(slots=True)
class ResolvedFile:
    """One data file of a snapshot and the rows its tombstones drop."""

    key: str  # relative to the table root
    uri: str  # what a Parquet reader opens
    entry: DataFile
    row_group_rows: tuple[int, ...]
    # File positions, row groups included. Files without deletes share one
    # frozen empty bitmap and tuple: a 100,000-file version then builds no
    # per-file containers (they were half of resolve()'s time). Read-only for
    # everyone but the resolver.
    deleted: BitMap | FrozenBitMap = field(default=FrozenBitMap())
    key_ranges: tuple[tuple[Any, Any], ...] = ()

    @property
    def total_rows(self) -> int:
        return self.entry.total_rows

    @property
    def has_deletes(self) -> bool:
        return bool(self.deleted) or bool(self.key_ranges)

    def row_group_start(self, rg: int) -> int:
        return sum(self.row_group_rows[:rg])

    def deleted_row_groups(self) -> list[int]:
        """Row groups every row of which is in ``deleted``."""
        out, start = [], 0
        for i, n in enumerate(self.row_group_rows):
            if n and self.deleted.range_cardinality(start, start + n) == n:
                out.append(i)
            start += n
        return out


@dataclass(slots=True)
class Snapshot:
    """One committed version of one table, resolved."""

    table_uri: str
    version: int
    manifest: Manifest
    files: list[ResolvedFile]  # files with live rows left, in manifest order
    primary_key: str | None

    @property
    def schema(self) -> Schema:
        return self.manifest.schema

    @property
    def live_rows(self) -> int | None:
        """Exact live row count, or None when key ranges make it unknowable without a scan."""
        if any(f.key_ranges for f in self.files):
            return None
        return sum(f.total_rows - len(f.deleted) for f in self.files)


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
        if snap is not None:
            _cache.move_to_end(ck)
            return snap
    snap = _resolve(log, manifest)
    with _cache_lock:
        _cache[ck] = snap
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return snap


def _resolve(log: TableLog, m: Manifest) -> Snapshot:
    with no_gc():
        return _resolve_files(log, m)


def _resolve_files(log: TableLog, m: Manifest) -> Snapshot:
    index = FileIndex(m, log.uri)
    uris = log.storage.uris(index.by_key)
    files = {
        key: ResolvedFile(key, uri, f, f.row_group_rows)  # type: ignore[arg-type]
        for (key, f), uri in zip(index.by_key.items(), uris, strict=True)
    }

    def rows_of(rf: ResolvedFile) -> tuple[int, ...]:
        if rf.row_group_rows is None:
            rf.row_group_rows = row_group_rows(log.storage, rf.key, rf.entry.size_bytes)
            if sum(rf.row_group_rows) != rf.entry.total_rows:
                raise FormatError(
                    f"{rf.uri}: holds {sum(rf.row_group_rows)} rows, the manifest says {rf.entry.total_rows}"
                )
        return rf.row_group_rows

    touched: list[ResolvedFile] = []
    for tkey in m.tombstones:
        where = f"{log.storage.uri(tkey) if '://' not in tkey else tkey} (version {m.version})"
        for n, r in enumerate(log.tombstones(tkey)):
            at = f"{where}: record {n}"
            rf = files[index.lookup_key(r.file, at)]
            if isinstance(r, KeyRangeDelete):
                if m.primary_key is None:
                    raise FormatError(f"{at}: key-range tombstone on a table with no primary key")
                check_key_range(r, m.schema, m.primary_key, at)
                rf.key_ranges += ((r.pk_min, r.pk_max),)
                continue
            if type(rf.deleted) is not BitMap:
                rf.deleted = BitMap()  # the first delete of this file: its own bitmap
                touched.append(rf)
            if isinstance(r, RowGroupDelete) or (isinstance(r, PositionDelete) and r.row_group is not None):
                rgr = rows_of(rf)
                if r.row_group >= len(rgr):
                    raise FormatError(f"{at}: row group {r.row_group} of {rf.key} does not exist")
                start = sum(rgr[: r.row_group])
                if isinstance(r, RowGroupDelete):
                    rf.deleted.add_range(start, start + rgr[r.row_group])
                else:
                    if r.positions and r.positions.max() >= rgr[r.row_group]:
                        raise FormatError(f"{at}: row {r.positions.max()} is past the end of row group {r.row_group}")
                    rf.deleted |= r.positions.shift(start) if start else r.positions
            else:
                assert isinstance(r, PositionDelete)
                if r.positions and r.positions.max() >= rf.total_rows:
                    raise FormatError(f"{at}: row {r.positions.max()} is past the end of {rf.key}")
                rf.deleted |= r.positions
    gone = set()
    for rf in touched:
        if len(rf.deleted) >= rf.entry.total_rows:
            gone.add(rf.key)
        elif rf.deleted and rf.row_group_rows is None:
            rows_of(rf)
    live = [rf for rf in files.values() if rf.key not in gone] if gone else list(files.values())
    return Snapshot(log.uri, m.version, m, live, m.primary_key)
