"""CastSQL's own DuckDB extensions: deleted positions held as bitmaps in the
process (``castsql_live.cpp``) and skipped by DuckDB's Parquet reader
(``castsql_scan.cpp``), or, where only the first exists, tested by a filter in
the scan's pipeline.

They are compiled from this package's C++ sources by ``scripts/setup`` (through
:mod:`castsql.engine.duckdb.native.build`), against the headers of the installed
DuckDB, fetched from DuckDB's source distribution on PyPI. Where they were not
built (no compiler, an installed wheel) or ``CASTSQL_NATIVE=0`` is set,
CastSQL applies deletes with an anti-join instead: the same answers, slower
queries (docs/PERFORMANCE.md, "Deletes applied in the pipeline").

Example::

    >>> from castsql.engine.duckdb.duck import new_connection
    >>> con = new_connection()
    >>> loaded(con) == (extension() is not None)
    True
"""

from __future__ import annotations

import array
import itertools
import os
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import AbstractBitMap

NAME = "castsql_live"
HERE = Path(__file__).resolve().parent
SOURCE = HERE / f"{NAME}.cpp"
BUILT = HERE / f"{NAME}.duckdb_extension"
SCAN_NAME = "castsql_scan"
SCAN_SOURCE = HERE / f"{SCAN_NAME}.cpp"
SCAN_BUILT = HERE / f"{SCAN_NAME}.duckdb_extension"

_loaded: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
_scanning: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


def extension() -> Path | None:
    """The built extension, or None where it was not built or ``CASTSQL_NATIVE=0``."""
    if os.environ.get("CASTSQL_NATIVE", "1") == "0" or not BUILT.exists():
        return None
    return BUILT


def load(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """Load the extension at ``path`` into ``con`` (made with
    ``allow_unsigned_extensions``), and ``castsql_scan`` after it where that
    was built; False, and ``con`` unchanged, if DuckDB refuses the first (a
    build for another platform, say)."""
    try:
        con.execute(f"LOAD '{path.as_posix()}'")
    except duckdb.Error:
        return False
    _loaded.add(con)
    if path == BUILT and SCAN_BUILT.exists() and os.environ.get("CASTSQL_NATIVE_SCAN", "1") != "0":
        try:
            con.execute(f"LOAD '{SCAN_BUILT.as_posix()}'")
        except duckdb.Error:
            return True  # built for another DuckDB: the filter still works
        _scanning.add(con)
    return True


def loaded(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` has ``castsql_live``'s functions."""
    return con in _loaded


def scans(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` also has ``"castsql/parquet"``: read_parquet that skips
    the rows of a set's bitmaps (``castsql_scan.cpp``)."""
    return con in _scanning


_sets = itertools.count(1)
_LITERAL_MARKS = 256
_DENSE_ROWS = 1 << 24  # castsql_live.cpp DENSE_ROWS


def _dense(rows: int, deleted: int) -> bool:
    """Whether the extension keeps a file's deletes as a bitset (castsql_live.cpp, ``Bits``)."""
    return rows <= _DENSE_ROWS or deleted * 32 >= rows


def bitmap_bytes(rows: int, deleted: int) -> int:
    """The memory the extension takes for one file's deletes (castsql_live.cpp,
    ``Bits``): a bitset, or four bytes per deleted row for a large file with
    sparse deletes."""
    if _dense(rows, deleted):
        return (rows + 7) // 8
    return 4 * deleted


def new_set() -> int:
    """A set or bitmap number nothing else in this process uses: the
    extension's state lives in the process, shared by every connection that
    loaded it."""
    return next(_sets)


class Bitmaps:
    """The extension's bitmaps and sets that one connection's views use.

    A set binds the files of one scan (by index) to bitmaps of their deleted
    positions; a bitmap is shared by every set whose file has the same deletes
    (the resolver hands unchanged files' deletes on as the same object), so a
    new version registers only the files it changed. A bitmap no set binds is
    dropped at once, except the newest ``idle`` bytes' worth of them: a
    version's view replaced by DuckLake's, then a commit, then the next
    version's view, finds them still there.

    Example::

        >>> from pyroaring import BitMap
        >>> from castsql.engine.duckdb.duck import new_connection
        >>> con = new_connection()
        >>> bm = Bitmaps(con)
        >>> s = bm.bind([("f.parquet", 10, BitMap([3]))])
        >>> con.execute(f'SELECT "castsql/live"({s}, 0::UBIGINT, 3), "castsql/live"({s}, 0::UBIGINT, 4)').fetchall()
        [(False, True)]
        >>> bm.forget(s)
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, idle: int = 64 << 20) -> None:
        self.con = con
        self.idle = idle
        self._by_uri: dict[str, list[tuple[AbstractBitMap, int]]] = {}
        self._refs: dict[int, int] = {}
        self._uri: dict[int, str] = {}
        self._size: dict[int, int] = {}
        self._sets: dict[int, list[int]] = {}
        self._unbound: OrderedDict[int, None] = OrderedDict()  # oldest first

    @property
    def sets(self) -> int:
        """Sets held: one per scan of a view that exists."""
        return len(self._sets)

    def holds(self, uri: str, dead: AbstractBitMap) -> bool:
        """Whether a bitmap of ``uri`` is registered for this very ``dead`` object."""
        return any(bm is dead for bm, _ in self._by_uri.get(uri, ()))

    def bind(self, files: Sequence[tuple[str, int, AbstractBitMap | None]]) -> int:
        """A new set over ``files`` (URI, rows, deleted positions; in the order of
        the scan's file list); returns its number, for ``"castsql/live"``.
        ``None`` for a file's positions binds nothing at its index: the scan
        (``"castsql/parquet"``, not ``"castsql/live"``) reads all its rows."""
        set_id, ids, new = new_set(), [], []
        at = [i for i, (_, _, dead) in enumerate(files) if dead is not None]
        bound = [(uri, rows, dead) for uri, rows, dead in files if dead is not None]
        for uri, rows, dead in bound:
            known = self._by_uri.get(uri, ())
            bid = next((b for bm, b in known if bm is dead), None)
            if bid is None:
                bid = next((b for bm, b in known if bm == dead), None)
            if bid is None:
                bid = new_set()
                # A file's deletes only grow: the version before's bitmap plus
                # the new positions (a one-row delete copies a bitmap and marks one).
                base = max(((bm, b) for bm, b in known if len(bm) < len(dead) and bm <= dead), default=None, key=_len)
                new.append((bid, rows, dead, base))
            ids.append(bid)
        try:
            if new:
                self._register(new)
            pairs = ", ".join(f"({i}, {b})" for i, b in zip(at, ids, strict=True))
            self.con.execute(f'SELECT count("castsql/bind"({set_id}, f::UBIGINT, b)) FROM (VALUES {pairs}) t(f, b)')
        except BaseException:
            self.con.execute(f'SELECT "castsql/forget"({set_id})')
            for bid, *_ in new:
                self.con.execute(f'SELECT "castsql/drop"({bid})')
            raise
        for (uri, rows, dead), bid in zip(bound, ids, strict=True):
            if bid not in self._refs:
                self._by_uri.setdefault(uri, []).append((dead, bid))
                self._uri[bid], self._size[bid], self._refs[bid] = uri, bitmap_bytes(rows, len(dead)), 0
            self._refs[bid] += 1
            self._unbound.pop(bid, None)
        self._sets[set_id] = ids
        return set_id

    def _register(self, new: list[tuple[int, int, AbstractBitMap, tuple[AbstractBitMap, int] | None]]) -> None:
        fresh = [(b, rows, dead) for b, rows, dead, base in new if base is None]
        cloned = [(b, base, dead - base[0]) for b, _, dead, base in new if base is not None]
        if fresh:
            sizes = ", ".join(f"({b}, {int(rows)}, {len(dead)})" for b, rows, dead in fresh)
            self.con.execute(f'SELECT count("castsql/alloc"(b, n, k)) FROM (VALUES {sizes}) t(b, n, k)')
        if cloned:
            sizes = ", ".join(f"({b}, {of}, {len(extra)})" for b, (_, of), extra in cloned)
            self.con.execute(f'SELECT count("castsql/clone"(b, o, k)) FROM (VALUES {sizes}) t(b, o, k)')
        # A fresh bitset whose positions are a few runs (whole row groups)
        # takes a fill per run; every other position is marked one by one,
        # with its index in its bitmap's list (a clone's come after its copy's).
        marks, fills = [], []
        for b, rows, dead in fresh:
            arr = np.frombuffer(dead.to_array(), dtype=np.uint32)
            cut = np.flatnonzero(np.diff(arr) != 1) if len(arr) > _LITERAL_MARKS and _dense(rows, len(arr)) else None
            if cut is not None and (len(cut) + 1) * 8 <= len(arr):
                fills.append((b, np.concatenate((arr[:1], arr[cut + 1])), np.concatenate((arr[cut], arr[-1:]))))
            else:
                marks.append((b, np.arange(len(arr), dtype=np.int64), arr))
        for b, (bm, _), extra in cloned:
            marks.append(
                (
                    b,
                    np.arange(len(bm), len(bm) + len(extra), dtype=np.int64),
                    np.frombuffer(extra.to_array(), dtype=np.uint32),
                )
            )
        self._call("castsql/fill", fills, new[0][0])
        self._call("castsql/mark", marks, new[0][0])
        if cloned:
            sealed = ", ".join(f"({b})" for b, _, _ in cloned)
            self.con.execute(f'SELECT count("castsql/seal"(b)) FROM (VALUES {sealed}) t(b)')

    def _call(self, fn: str, rows: list[tuple[int, np.ndarray, np.ndarray]], tag: int) -> None:
        """``fn(b, x, y)`` for every bitmap ``b`` and pair of its arrays ``x``, ``y``."""
        ids = np.concatenate([np.full(len(x), b, dtype=np.int64) for b, x, _ in rows] or [np.empty(0, np.int64)])
        if not len(ids):
            return  # bitmaps of no position (a file whose deletes a pruned view cannot reach)
        xs = np.concatenate([x.astype(np.int64, copy=False) for _, x, _ in rows])
        ys = np.concatenate([y.astype(np.int64, copy=False) for _, _, y in rows])
        if len(ids) <= _LITERAL_MARKS:  # a one-row delete's: cheaper as literals than as a registered stream
            values = ", ".join(
                f"({b}, {x}, {y})" for b, x, y in zip(ids.tolist(), xs.tolist(), ys.tolist(), strict=True)
            )
            self.con.execute(f'SELECT count("{fn}"(b, x, y)) FROM (VALUES {values}) t(b, x, y)')
            return
        cols = {
            "b": buffer_array(pa.int64(), ids),
            "x": buffer_array(pa.int64(), xs),
            "y": buffer_array(pa.int64(), ys),
        }
        name = f"castsql/marks/{tag}/native"
        # Through the C stream: registering an Arrow table imports pandas (quoting.py).
        self.con.register(name, pa.table(cols).__arrow_c_stream__())
        try:
            self.con.execute(f'SELECT count("{fn}"(b, x, y)) FROM "{name}"')
        finally:
            self.con.unregister(name)

    def forget(self, set_id: int) -> None:
        """Drop a set; bitmaps no set binds go, past the newest ``idle`` bytes of them."""
        self.con.execute(f'SELECT "castsql/forget"({set_id})')
        for bid in self._sets.pop(set_id, []):
            self._refs[bid] -= 1
            if self._refs[bid] == 0:
                self._unbound[bid] = None
        kept = 0
        for bid in reversed(list(self._unbound)):
            kept += self._size[bid]
            if kept > self.idle:
                self._drop(bid)

    def _drop(self, bid: int) -> None:
        self.con.execute(f'SELECT "castsql/drop"({bid})')
        uri = self._uri.pop(bid)
        self._by_uri[uri] = [(bm, b) for bm, b in self._by_uri[uri] if b != bid]
        if not self._by_uri[uri]:
            del self._by_uri[uri]
        del self._refs[bid], self._size[bid], self._unbound[bid]

    def close(self) -> None:
        """Drop every set and bitmap (they live in the process, not the connection)."""
        for set_id in list(self._sets):
            self.forget(set_id)
        for bid in list(self._unbound):
            self._drop(bid)


def _len(entry: tuple[AbstractBitMap, int]) -> int:
    return len(entry[0])


def buffer_array(type_: pa.DataType, values: np.ndarray | array.array) -> pa.Array:
    """``values`` (of ``type_``'s width) as an Arrow array, zero-copy from its
    buffer: ``pa.array`` of a NumPy array imports pandas (quoting.py)."""
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])
