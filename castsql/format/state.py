"""What a version holds: its data files and its tombstone records, in any format version.

A version-2 manifest's files live in metadata objects plus a short inline
list, its tombstones in deletes objects plus inline tombstone files; a
version-1 manifest lists everything inline. :class:`VersionState` reads either
the same way, as *parts*: one Arrow table of file entries per files object
(immutable, so shared by every version that references it) and one for the
inline entries. Nothing here builds a Python object per data file.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    >>> m = log.append(write_data_files(st, pa.table({"id": [1, 2]})))
    >>> state = log.state(m)
    >>> state.file_count, state.keys()[0].as_py().startswith("data/")
    (1, True)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, KeysView
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import FormatError
from castsql.format.layout import to_table_key
from castsql.format.manifest import DataFile, Manifest, MetaRef
from castsql.format.metafiles import (
    PATH_BOUNDS,
    deletes_from_arrow,
    files_from_arrow,
    files_to_arrow,
    read_deletes_object,
    read_files_object,
)
from castsql.format.tombstone import TombstoneRecord
from castsql.storage.base import Storage, is_normal_key, overlapped


class MetadataSource(Protocol):
    """What a version's state reads its objects through: the table's
    :class:`~castsql.format.metadata.TableMetadata`, which caches them."""

    storage: Storage
    holders: dict[str, str]

    def where(self, version: int) -> str: ...
    def has_part(self, ref: MetaRef, m: Manifest) -> bool: ...
    def part(self, ref: MetaRef, m: Manifest) -> FilePart: ...
    def hold(self, key: str, ref_path: str) -> None: ...
    def deletes_table(self, ref: MetaRef, where: str | None = None) -> pa.Table: ...
    def object_tombstones(self, ref: MetaRef, where: str | None = None) -> frozenset[str]: ...
    def delete_records(self, ref: MetaRef, where: str) -> list[tuple[str, TombstoneRecord]]: ...
    def tombstones(self, key: str) -> list[TombstoneRecord]: ...


ENTRIES_KEPT = 20_000  # a files object's entries kept as DataFiles up to this many (FilePart.entries)
# Paths in a files object are keys relative to the root, already normal
# (FORMAT.md §3.2): checked for a whole object at once.
_NOT_NORMAL_KEY = r"(^$|^/|^\.|/\.|//|/$|[?#*\[\]{}\\\x00-\x1f\x7f])"


@dataclass
class FilePart:
    """File entries of one files object (``ref``) or of a manifest's inline list (``ref`` None)."""

    ref: MetaRef | None
    table: pa.Table  # columns of castsql.format.metafiles (path holds table keys)
    _names: dict[str, str | None] | None = field(default=None, repr=False)
    _index: dict[str, int] | None = field(default=None, repr=False)  # key -> its first row
    _entries: dict[str, DataFile] = field(default_factory=dict, repr=False)
    _all: list[DataFile] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _looked_up: int = field(default=0, repr=False)  # entries converted one by one

    def entries(self) -> list[DataFile]:
        """Every entry of the part, in its order (a new list; the entries are
        shared). Kept for parts of up to ``ENTRIES_KEPT`` entries: a stream's
        commits and compactions convert the same small objects again and
        again, while a large table's parts are not held twice in memory."""
        got = self._all
        if got is None:
            got = files_from_arrow(self.table)
            if len(got) <= ENTRIES_KEPT:
                self._all = got
        return list(got)

    def entries_where(self, mask: pa.Array | pa.ChunkedArray) -> list[DataFile]:
        """The entries of the rows ``mask`` (a boolean column of the part's rows) selects."""
        if self._all is None and self.table.num_rows > ENTRIES_KEPT:
            return files_from_arrow(self.table.filter(mask))
        return [f for f, hit in zip(self.entries(), mask.to_pylist(), strict=True) if hit]

    def entry(self, key: str) -> DataFile:
        """The entry of ``key`` (KeyError if the part does not list it), kept:
        parts are shared by every version that references them, and a walk
        over versions asks for the same files again and again."""
        f = self._entries.get(key)
        if f is None:
            idx = self.index.get(key)
            if idx is None:
                raise KeyError(key)
            if self._all is not None:
                return self._all[idx]
            n = self.table.num_rows
            if n <= ENTRIES_KEPT and self._looked_up >= max(8, n // 32):
                # Converted one by one, an entry costs ~30 entries converted
                # together: a diff of 1,000 files looks up most of each part.
                return self.entries()[idx]
            f = files_from_arrow(self.table.slice(idx, 1))[0]
            with self._lock:
                self._looked_up += 1
                if len(self._entries) >= 4096:
                    self._entries.clear()
                self._entries[key] = f
        return f

    @property
    def index(self) -> dict[str, int]:
        """Key -> the row of its entry (a lookup without ``pc.index``, which
        imports pandas for its Python argument: see castsql.format.arrays)."""
        with self._lock:
            if self._index is None:
                paths = self.table.column("path").to_pylist()
                self._index = {k: i for i, k in reversed(list(enumerate(paths)))}  # a repeated key: its first row
            return self._index

    @property
    def key_set(self) -> KeysView[str]:
        return self.index.keys()

    @property
    def by_name(self) -> dict[str, str | None]:
        """Base name -> key (None: two files of this part share it)."""
        with self._lock:
            if self._names is None:
                names: dict[str, str | None] = {}
                for k in self.table.column("path").to_pylist():
                    n = k.rpartition("/")[2]
                    names[n] = None if n in names else k
                self._names = names
            return self._names


class VersionState:
    """The files and tombstones of one version (metadata objects read on first need, cached by the log)."""

    def __init__(self, meta: MetadataSource, manifest: Manifest) -> None:
        self._meta = meta
        self.manifest = manifest
        self._inline: FilePart | None = None
        self._inline_entries: list[DataFile] | None = None
        self._keys: dict[str, DataFile] | None = None  # inline entries by key
        self._names: dict[str, list[str | None]] | None = None  # inline keys by base name
        self._unique = False  # every part read and no data file listed twice
        self._refs: dict[str, MetaRef] | None = None  # the files objects by path
        self._lock = threading.Lock()

    def part(self, ref: MetaRef) -> FilePart:
        """The entries of files object ``ref`` of this version (read once, cached by the table's metadata)."""
        return self._meta.part(ref, self.manifest)

    def where(self) -> str:
        """The manifest's URI and the version, as errors name them."""
        return self._meta.where(self.manifest.version)

    @property
    def inline(self) -> FilePart:
        """The inline entries as an Arrow part (built on first use)."""
        entries = self.inline_entries()
        with self._lock:
            if self._inline is None:
                self._inline = FilePart(None, files_to_arrow(entries, self.manifest.schema))
            return self._inline

    def inline_entries(self) -> list[DataFile]:
        """The inline entries, paths turned into table keys (all of a version-1 manifest's files)."""
        with self._lock:
            if self._inline_entries is None:
                self._inline_entries = inline_entries(self.manifest, self._meta.storage.root, self.where())
            return self._inline_entries

    @property
    def parts(self) -> list[FilePart]:
        """Every part: one per files object, then the inline entries. Objects
        not yet cached are fetched and decoded in parallel (decoding Parquet
        releases the GIL; on S3 the requests overlap)."""
        return [*self._objects(), self.inline]

    def _objects(self) -> list[FilePart]:
        m = self.manifest
        refs = list(m.file_objects)
        if not all(self._meta.has_part(r, m) for r in refs):
            return overlapped(lambda r: self._meta.part(r, m), refs)
        return [self._meta.part(r, m) for r in refs]

    def unique_objects(self) -> list[FilePart]:
        """The parts of the files objects, checked (with the inline entries) to
        list no data file twice: once per state, O(files) hashing, paid where
        every file is listed anyway. The inline entries alone are checked when
        they are read (:func:`inline_entries`), so a version-1 manifest costs
        nothing more here."""
        objects = self._objects()
        if objects and not self._unique:
            check_unique([*objects, self.inline], self.where())
        self._unique = True
        return objects

    def parts_holding(self, key: str) -> list[FilePart]:
        """The parts that may hold ``key`` (objects whose path bounds exclude it are not read)."""
        m = self.manifest
        return [*(self._meta.part(ref, m) for ref in m.file_objects if may_hold(ref, key)), self.inline]

    @property
    def file_count(self) -> int:
        m = self.manifest
        if m.totals is not None:
            return m.totals.files
        return len(m.data_files)

    def table(self) -> pa.Table:
        """Every file entry of the version as one Arrow table (chunks shared with the parts)."""
        return pa.concat_tables([p.table for p in self.parts])

    def keys(self) -> pa.ChunkedArray:
        return self.table().column("path")

    def entries(self) -> list[DataFile]:
        """Every file as a DataFile (one Python object per file: for writers and small tables)."""
        return [f for p in self.parts for f in p.entries()]

    def contains(self, key: str) -> bool:
        # The inline entries by key, not as Arrow: a stepped resolve asks this
        # of every file a version touched, and building the inline part per
        # version cost more than the rest of the step.
        if key in self._inline_keys():
            return True
        m = self.manifest
        # Files objects never change: the one that listed ``key`` for another
        # version lists it for this one too, if this one references it.
        held = self._meta.holders.get(key)
        if held is not None and held in self._ref_by_path():
            return True
        for ref in m.file_objects:
            if may_hold(ref, key) and key in self._meta.part(ref, m).key_set:
                self._meta.hold(key, ref.path)
                return True
        return False

    def _ref_by_path(self) -> dict[str, MetaRef]:
        if self._refs is None:
            self._refs = {r.path: r for r in self.manifest.file_objects}
        return self._refs

    def _inline_keys(self) -> dict[str, DataFile]:
        if self._keys is None:
            keys = {f.path: f for f in self.inline_entries()}
            with self._lock:
                self._keys = keys
        return self._keys

    def lookup_key(self, name: str, where: str) -> str:
        """The key of the data file a tombstone's ``file`` field names (base name or path)."""
        root = self._meta.storage.root
        if "/" in name:
            key = to_table_key(name, root, what=f"{where}: tombstone file")
            if self.contains(key):
                return key
        else:
            if not self.manifest.file_objects:
                found = self._inline_names().get(name, [])
            else:
                found = [p.by_name[name] for p in self.parts if name in p.by_name]
            if len(found) > 1 or (found and found[0] is None):
                raise FormatError(f"{where}: tombstone names {name!r}, which matches several data files")
            if found:
                return found[0]  # type: ignore[return-value]
        raise FormatError(f"{where}: tombstone names {name!r}, which is not a data file of this version")

    def _inline_names(self) -> dict[str, list[str | None]]:
        if self._names is None:
            by: dict[str, str | None] = {}
            for k in self._inline_keys():
                n = k.rpartition("/")[2]
                by[n] = None if n in by else k
            names = {n: [k] for n, k in by.items()}
            with self._lock:
                self._names = names
        return self._names

    def entry(self, key: str) -> DataFile:
        inline = self._inline_keys().get(key)
        if inline is not None or not self.manifest.file_objects:
            return self._inline_keys()[key]
        m = self.manifest
        # The object contains() found it in, when this version references it
        # (a walk asks contains() first): no search of the others' bounds.
        held = self._ref_by_path().get(self._meta.holders.get(key, ""))
        if held is not None and key in (p := self._meta.part(held, m)).key_set:
            return p.entry(key)
        for p in (self._meta.part(ref, m) for ref in m.file_objects if may_hold(ref, key)):
            if key in p.key_set:
                return p.entry(key)
        raise KeyError(key)

    def tombstone_keys(self) -> list[str]:
        """Every tombstone file in force (reads the deletes objects)."""
        m = self.manifest
        out: dict[str, None] = {}
        for ref in m.delete_objects:
            out.update(dict.fromkeys(self._meta.deletes_table(ref).column("tombstone").to_pylist()))
        root = self._meta.storage.root
        out.update(dict.fromkeys(to_table_key(t, root, what="tombstone") for t in m.tombstones))
        return list(out)

    def tombstone_sets(self) -> tuple[frozenset[str], frozenset[str]]:
        """The keys of the tombstone files in the version's deletes objects, and
        of its inline ones; FormatError if one is in both, or if they do not
        count ``totals.tombstones`` (reads every deletes object: cached by key)."""
        m = self.manifest
        objects: frozenset[str] = frozenset().union(
            *(self._meta.object_tombstones(r, self.where()) for r in m.delete_objects)
        )
        inline = frozenset(to_table_key(t, self._meta.storage.root, what="tombstone") for t in m.tombstones)
        check_tombstones(m, objects, inline, self.where())
        return objects, inline

    def records(self) -> Iterator[tuple[str, TombstoneRecord]]:
        """Every tombstone record in force, with the tombstone file it came from."""
        m = self.manifest
        for ref in m.delete_objects:
            yield from self._meta.delete_records(ref, self.where())
        for t in m.tombstones:
            key = to_table_key(t, self._meta.storage.root, what="tombstone")
            for r in self._meta.tombstones(key):
                yield key, r


def may_hold(ref: MetaRef, key: str) -> bool:
    """Whether files object ``ref`` can list ``key``, by the path bounds of its summary."""
    bounds = ref.extra.get(PATH_BOUNDS)
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, str) for b in bounds)):
        return True
    return bounds[0] <= key <= bounds[1]


def inline_entries(m: Manifest, root: str, where: str) -> list[DataFile]:
    """The inline entries of ``m``, paths turned into table keys (FormatError
    if two name the same file: a key and a full URI of it)."""
    out = [
        f if is_normal_key(f.path) else DataFile(
            to_table_key(f.path, root, what=f"{where}: data file"), f.size_bytes, f.row_group_count,
            f.total_rows, f.min, f.max, f.row_group_rows, f.extra,
        )
        for f in m.data_files
    ]  # fmt: skip
    if len({f.path for f in out}) != len(out):
        seen: set[str] = set()
        for f in out:
            if f.path in seen:
                raise FormatError(f"{where}: data file {f.path} is listed twice")
            seen.add(f.path)
    return out


def check_unique(parts: list[FilePart], where: str) -> None:
    """FormatError naming the first data file two parts (or one part twice) list:
    a reader would return its rows twice."""
    paths = pa.chunked_array([c for p in parts for c in p.table.column("path").chunks], pa.string())
    if pc.count_distinct(paths).as_py() == len(paths):
        return
    counts = pc.value_counts(paths)
    twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
    holders = [p.ref.path if p.ref is not None else "the manifest's inline list" for p in parts if twice in p.key_set]
    raise FormatError(f"{where}: data file {twice} is listed twice (in {' and '.join(holders)})")


def check_tombstones(m: Manifest, objects: frozenset[str], inline: frozenset[str], where: str) -> None:
    """The tombstone files of version ``m``: none both folded and inline, as
    many as ``totals.tombstones`` says (version 2)."""
    both = objects & inline
    if both:
        raise FormatError(f"{where}: tombstone {min(both)} is listed twice (inline and in a deletes object)")
    if m.totals is not None and m.totals.tombstones != len(objects) + len(inline):
        raise FormatError(
            f"{where}: totals say {m.totals.tombstones} tombstone files, "
            f"its deletes objects and inline list hold {len(objects) + len(inline)}"
        )


def check_object_paths(table: pa.Table, uri: str, where: str) -> None:
    """FormatError unless every path of a files object is a normal, plain key."""
    bad = pc.match_substring_regex(table.column("path"), _NOT_NORMAL_KEY)
    if pc.any(bad).as_py():
        first = table.column("path").filter(bad)[0].as_py()
        raise FormatError(f"{where}: metadata object {uri} lists {first!r}, which is not a plain key inside the table")


def read_part(storage: Storage, ref: MetaRef, m: Manifest, where: str) -> FilePart:
    table = read_files_object(storage, ref, m.schema, where)
    check_object_paths(table, storage.uri(ref.path), where)
    return FilePart(ref, table)


def read_records(storage: Storage, ref: MetaRef, where: str) -> list[tuple[str, TombstoneRecord]]:
    table = read_deletes_object(storage, ref, where)
    return deletes_from_arrow(table, f"{where}: {storage.uri(ref.path)}")
