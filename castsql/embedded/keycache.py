"""Where each key of a table's data files sits, kept in memory by a handle that merges again and again.

A merge finds the target rows its source keys match by scanning the key
column of every data file whose statistics may hold one. A stream of small
upserts into a large table pays that scan on every commit (half of a 40-row
upsert's time into 10M rows, docs/PERFORMANCE.md), though the files are the
same commit after commit: data files never change once written, so the keys
of a file read once stay true for as long as the file is in the table. This
cache keeps them, per file and column, sorted (with each key's position in the
file), and answers a merge's lookup with a binary search per source key:
the cost of the change, not of the table. Deleted rows are not its business
(they are filtered by the caller, from the snapshot's deletes, as a scan's
are). Columns a merge compares besides the key (a CDC batch's sequence
columns) are kept too, in row order, and taken at the positions found.

What it holds: single-column keys of integer, date, time and timestamp types
(stored as their 64-bit integers); other types (strings, floats, whose
equality differs between NumPy and SQL, several key columns) keep the scan.
It is filled only by a handle's second merge, so a one-off merge (the command
line, a job) costs what it did; and at most :data:`BUDGET` bytes are kept, the
least recently used files dropped first (their keys are scanned again when
needed).

Example::

    >>> import pyarrow as pa
    >>> cache = KeyCache()
    >>> cache.put("f1", "id", pa.int64(), pa.array([5, 3, 9], pa.int64()))
    >>> positions, keys = cache.find("f1", "id", pa.int64(), pa.array([9, 4, 3], pa.int64()))
    >>> positions.tolist(), keys.to_pylist()  # where in f1, and the key there
    ([1, 2], [3, 9])
    >>> cache.find("f2", "id", pa.int64(), pa.array([9], pa.int64())) is None  # not cached
    True
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow as pa

BUDGET = 512 * 2**20  # bytes of keys and positions kept per handle (10M int64 keys, sorted: 80 MB)


def cacheable(t: pa.DataType) -> bool:
    """Whether keys of type ``t`` are kept: integers and the types stored as
    64-bit (or narrower) integers, whose equality is their integers'."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
    )


def as_integers(values: pa.Array, t: pa.DataType) -> np.ndarray:
    """``values`` (of type ``t``, no NULLs) as the integers they are stored as."""
    if pa.types.is_integer(t):
        return values.to_numpy(zero_copy_only=False)
    width = pa.int32() if t.bit_width == 32 else pa.int64()
    return values.view(width).to_numpy(zero_copy_only=False)


def from_integers(values: np.ndarray, t: pa.DataType) -> pa.Array:
    """The inverse of :func:`as_integers`."""
    if pa.types.is_integer(t):
        return pa.array(values, t)
    width = pa.int32() if t.bit_width == 32 else pa.int64()
    return pa.array(values, width).view(t)


class _FileKeys:
    """One file's keys, ascending, and where each sits (None: the file's own order is ascending)."""

    __slots__ = ("keys", "order")

    def __init__(self, keys: np.ndarray, order: np.ndarray | None) -> None:
        self.keys, self.order = keys, order

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + (self.order.nbytes if self.order is not None else 0)


class KeyCache:
    """The sorted keys of data files, by (file, column, type), and the columns
    compared besides them: see the module's doc."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = BUDGET if budget is None else budget
        # (file, column, type, "keys" | "values") -> sorted keys, or a column's values in row order
        self._files: OrderedDict[tuple[str, str, str, str], _FileKeys | pa.Array] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.warm = False  # a merge of this handle has run: the next fills the cache
        # Off: every merge scans, as before the cache (CASTSQL_KEY_CACHE=0; benches compare the two).
        self.enabled = os.environ.get("CASTSQL_KEY_CACHE", "1") != "0"

    def put(self, uri: str, column: str, t: pa.DataType, keys: pa.Array) -> None:
        """Keep ``keys``, the values of ``column`` (type ``t``) of file ``uri``
        in row order, NULLs included (they never match), unless past the budget."""
        valid = keys.is_valid().to_numpy(zero_copy_only=False)
        values = as_integers(keys.fill_null(0) if keys.null_count else keys, t)
        positions = None
        if not valid.all():
            positions = np.flatnonzero(valid)
            values = values[positions]
        if len(values) > 1 and not (values[1:] >= values[:-1]).all():
            order = np.argsort(values, kind="stable")
            values = values[order]
            positions = order if positions is None else positions[order]
        entry = _FileKeys(np.ascontiguousarray(values), None if positions is None else positions.astype(np.int64))
        self._keep((uri, column, str(t), "keys"), entry)

    def put_values(self, uri: str, column: str, values: pa.Array) -> None:
        """Keep ``values``, the whole of ``column`` of file ``uri`` in row
        order (a column a merge compares besides the key: a CDC sequence)."""
        self._keep((uri, column, str(values.type), "values"), values)

    def values(self, uri: str, column: str, t: pa.DataType, positions: np.ndarray) -> pa.Array | None:
        """``column`` (type ``t``) of file ``uri`` at ``positions``; None if not kept."""
        key = (uri, column, str(t), "values")
        with self._lock:
            entry = self._files.get(key)
            if entry is None:
                return None
            self._files.move_to_end(key)
        assert isinstance(entry, pa.Array)
        return entry.take(pa.array(positions, pa.int64()))

    def _keep(self, key: tuple[str, str, str, str], entry: _FileKeys | pa.Array) -> None:
        if entry.nbytes > self.budget:
            return
        with self._lock:
            old = self._files.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._files[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.budget:
                _, dropped = self._files.popitem(last=False)
                self._bytes -= dropped.nbytes

    def find(self, uri: str, column: str, t: pa.DataType, wanted: pa.Array) -> tuple[np.ndarray, pa.Array] | None:
        """The positions in file ``uri`` whose ``column`` equals one of
        ``wanted`` (type ``t``, no NULLs), ascending, and the key at each; None
        if the file's keys are not kept."""
        key = (uri, column, str(t), "keys")
        with self._lock:
            entry = self._files.get(key)
            if entry is None:
                return None
            self._files.move_to_end(key)
        assert isinstance(entry, _FileKeys)
        q = np.unique(as_integers(wanted, t))
        lo = np.searchsorted(entry.keys, q, side="left")
        hi = np.searchsorted(entry.keys, q, side="right")
        hit = hi > lo
        lo, hi = lo[hit], hi[hit]
        if not len(lo):
            return np.empty(0, np.int64), pa.array([], t)
        counts = hi - lo
        # Every index in [lo, hi) of each hit: a key repeated in a file (a merge on a column that is not the key).
        idx = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(counts.sum())
        found = idx if entry.order is None else entry.order[idx]
        by_position = np.argsort(found, kind="stable")
        return found[by_position], from_integers(entry.keys[idx][by_position], t)

    def __len__(self) -> int:
        return len(self._files)


_CACHES: weakref.WeakKeyDictionary[Any, KeyCache] = weakref.WeakKeyDictionary()


def of(owner: Any) -> KeyCache:
    """The cache of ``owner`` (a session: one per table handle), made on first use."""
    cache = _CACHES.get(owner)
    if cache is None:
        cache = _CACHES[owner] = KeyCache()
    return cache
