"""What every mirror does the same, whatever format it writes: which files
changed between two versions and the rows each drops, the names other
formats give Arrow's primitive types, the create-only put of a mirror
version, and the state an exporter keeps between calls.

Example::

    >>> import pyarrow as pa
    >>> primitive_name(pa.int16(), "delta"), primitive_name(pa.int16(), "iceberg")
    ('short', 'int')
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Collection
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.errors import CommitConflict, MirrorError
from castsql.format.schema import type_from_name
from castsql.format.tombstone import key_bound_scalar
from castsql.snapshot import ResolvedFile, Snapshot
from castsql.storage import ObjectNotFound, PreconditionFailed, Storage
from castsql.storage.ranged import open_ranged

# Arrow type -> (Delta's name, Iceberg's name). Iceberg has no 8- or 16-bit
# integers: Parquet stores them as INT32 with a narrower logical type, which
# Iceberg readers read as int.
_PRIMITIVES: dict[pa.DataType, tuple[str, str]] = {
    pa.bool_(): ("boolean", "boolean"),
    pa.int8(): ("byte", "int"),
    pa.int16(): ("short", "int"),
    pa.int32(): ("integer", "int"),
    pa.int64(): ("long", "long"),
    pa.float32(): ("float", "float"),
    pa.float64(): ("double", "double"),
    pa.string(): ("string", "string"),
    pa.large_string(): ("string", "string"),
    pa.binary(): ("binary", "binary"),
    pa.large_binary(): ("binary", "binary"),
    pa.date32(): ("date", "date"),
}


def primitive_name(t: pa.DataType, fmt: str) -> str | None:
    """``fmt``'s (``delta`` or ``iceberg``) name of primitive ``t``, or None."""
    names = _PRIMITIVES.get(t)
    return None if names is None else names[0 if fmt == "delta" else 1]


def dropped(storage: Storage, snap: Snapshot, f: ResolvedFile) -> BitMap:
    """Every position of ``f`` that ``snap``'s tombstones drop: its positions
    and row groups, and the rows whose key falls in one of its key ranges
    (found by reading the file's key column)."""
    out = BitMap(f.deleted)
    if f.key_ranges:
        pk = snap.primary_key
        col = snap.schema.column(pk) if pk else None
        if col is None:
            raise MirrorError(f"{storage.root}: version {snap.version}: key-range deletes on a table with no key")
        want = type_from_name(col.type)
        keys = pq.ParquetFile(open_ranged(storage, f.key, f.entry.size_bytes, 1 << 20)).read(columns=[pk]).column(0)
        if keys.type != want:
            keys = keys.cast(want)
        hit = None
        for lo, hi in f.key_ranges:
            lo_s, hi_s = key_bound_scalar(lo, want), key_bound_scalar(hi, want)
            inside = pc.and_(pc.greater_equal(keys, lo_s), pc.less_equal(keys, hi_s))
            hit = inside if hit is None else pc.or_(hit, inside)
        idx = pc.indices_nonzero(pc.fill_null(hit, False)) if hit is not None else pa.array([], pa.uint64())
        out.update(idx.to_numpy().astype("uint32"))
    return out


def rows_before(storage: Storage, prev: Snapshot | None, old: ResolvedFile | None) -> BitMap:
    """What ``old`` (a file as the previous version had it) dropped then; nothing if it was not there."""
    if old is None or prev is None or not old.has_deletes:
        return BitMap()
    return dropped(storage, prev, old)


_LOOKUPS = 2048  # touched files looked up one by one; more: one pass over both versions


def changed_files(
    snap: Snapshot, prev: Snapshot | None, live: Collection[str]
) -> tuple[dict[str, ResolvedFile], dict[str, ResolvedFile], set[str]]:
    """The files of ``snap`` whose rows may differ from ``prev``'s (all of them
    without ``prev``), the same files as ``prev`` had them, and the keys of
    ``live`` (the files the mirror lists now) that ``snap`` no longer has. Only
    the touched files are looked at, so a commit's mirror costs its change,
    not the table."""
    touched = snap.touched_since(prev) if prev is not None else None
    # Looking files up one by one costs a search each: past a few thousand
    # (a first mirror, a big compaction) one pass over both versions is faster.
    if touched is None or len(touched) > _LOOKUPS:
        now = {f.key: f for f in snap.files}
        before = {f.key: f for f in prev.files} if prev is not None else {}
        return now, before, set(live) - now.keys()
    now = {f.key: f for f in snap.resolved(sorted(touched))}
    before = {f.key: f for f in prev.resolved(sorted(touched))} if prev is not None else {}
    return now, before, {k for k in touched if k in live and k not in now}


def same_deletes(a: ResolvedFile | None, b: ResolvedFile) -> bool:
    """Whether file ``a`` (None: absent) has exactly ``b``'s tombstones."""
    return a is not None and a.deleted == b.deleted and a.key_ranges == b.key_ranges


def put_version(storage: Storage, key: str, body: bytes, fmt: str, version: int) -> None:
    """Write a mirror version's last object, create-only: the moment it is visible.
    A racing exporter that wrote it first makes this one CommitConflict."""
    try:
        storage.put_if_absent(key, body)
    except PreconditionFailed:
        raise CommitConflict(
            f"{storage.root}: another exporter wrote {fmt} version {version} first; run the export again"
        ) from None


S = TypeVar("S")


def digest(body: bytes) -> str:
    """What a held mirror state remembers of the last object it wrote, to tell
    that object from one another exporter wrote in its place."""
    return hashlib.sha256(body).hexdigest()


def still_stored(storage: Storage, key: Callable[[int], str], version: int, expected: str) -> bool:
    """Whether a mirror is still the one a held state describes: the object
    of its last ``version`` (at ``key(version)``) is the one this process
    wrote (its :func:`digest` is ``expected``), and no next version exists.
    Two requests, not a listing of every version's objects."""
    if version < 0 or not expected:
        return False
    try:
        same = digest(storage.get(key(version))) == expected
    except ObjectNotFound:
        return False
    return same and not storage.exists(key(version + 1))


class Held(Generic[S]):
    """Each table's mirror state as this process last wrote or read it, by
    table root (a few tables): an exporter takes it, and puts it back only once
    what it holds matches what is stored."""

    def __init__(self, tables: int = 16) -> None:
        self._states: dict[str, S] = {}
        self._tables = tables
        self._lock = threading.Lock()

    def peek(self, root: str) -> S | None:
        with self._lock:
            return self._states.get(root)

    def take(self, root: str) -> S | None:
        with self._lock:
            return self._states.pop(root, None)

    def put(self, root: str, state: S) -> None:
        with self._lock:
            self._states[root] = state
            while len(self._states) > self._tables:
                self._states.pop(next(iter(self._states)))
