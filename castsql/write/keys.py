"""Primary-key uniqueness of appended and inserted rows (every writer).

A table's ``primary_key`` (FORMAT.md §3.1) is a promise readers and merges
rely on: a merge matches one target row per key, a key-range tombstone
deletes every row of a key. So an append (or a merge's inserts) is refused by
default when it would write a NULL key, the same key twice, or a key the
table already holds in a live row; the refusal names the first offending keys
and nothing is committed. ``allow_duplicate_keys=True``
(``--allow-duplicate-keys``) skips the check.

Every writer (the embedded one, Spark's append, merges' inserts) calls the
same two functions: :func:`check_input_keys` (NULLs, repeats within the
input) and :func:`existing_keys` (keys live rows of the table hold), and
refuses with the same :class:`DuplicateKey` messages. ``existing_keys`` reads
as little as it can: only the files whose key statistics overlap the input's
[min, max] (key-range pruning on the manifest), in them only the row groups
whose footer min/max hold an input key, and only their key column, with
pyarrow; membership is a sorted search in numpy (integer keys) or
``pyarrow.compute.is_in``. Tombstoned rows do not count.

Example::

    >>> try:
    ...     check_input_keys("t", "id", pa.chunked_array([[1, 2, 2, 3, 3]]))
    ... except DuplicateKey as e:
    ...     print(str(e)[:78])
    table t: append: the data holds key id = 2 more than once (and 1 more duplicat
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import DuplicateKey, NullKey
from castsql.format.tombstone import key_bound_scalar
from castsql.storage.base import overlapped_iter

if TYPE_CHECKING:
    from castsql.snapshot import ResolvedFile, Snapshot
    from castsql.storage import Storage

SHOWN = 5  # offending keys a refusal names
_ALLOW = "allow_duplicate_keys=True / --allow-duplicate-keys writes them anyway"


def _keys_text(pk: str, keys: Sequence[Any]) -> str:
    return ", ".join(f"{pk} = {k!r}" for k in keys[:SHOWN])


def normalized(keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``keys`` as one array compared as SQL compares them: a float ``-0.0`` is
    ``0.0`` (DuckDB and Spark find them equal; Arrow's hashing does not)."""
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_floating(arr.type):
        arr = pc.add(arr, pa.scalar(0.0, arr.type))  # -0.0 + 0.0 is 0.0
    return arr


def check_input_keys(
    table: str, pk: str, keys: pa.ChunkedArray | pa.Array, op: str = "append", *, allowable: bool = True
) -> None:
    """NullKey for a NULL or NaN key of ``keys`` (the keys of the rows a write
    adds), DuplicateKey for a key repeated among them."""
    where = f"table {table}: {op}"
    nulls = keys.null_count
    if nulls:
        raise NullKey(
            f"{where}: {nulls} row(s) have a NULL primary key {pk!r}; a primary key must not be NULL; "
            "nothing was committed"
        )
    arr = normalized(keys)
    if pa.types.is_floating(arr.type):
        nans = int(pc.sum(pc.is_nan(arr)).as_py() or 0)
        if nans:
            raise NullKey(
                f"{where}: {nans} row(s) have a NaN primary key {pk!r}; a primary key must be a number "
                "(FORMAT.md §3.1); nothing was committed"
            )
    n = len(arr)
    if n < 2:
        return
    if pa.types.is_integer(arr.type):
        # Vectorised in numpy: increasing keys (the usual append) cost one pass,
        # others one sort; a hash count costs ~0.4 s per million keys.
        k = arr.to_numpy(zero_copy_only=False)
        if bool(np.all(k[1:] > k[:-1])):
            return
        k = np.sort(k)
        same = k[1:] == k[:-1]
        if not same.any():
            return
        dupes = np.unique(k[1:][same]).tolist()
    else:
        if pc.count_distinct(arr).as_py() == n:
            return
        counts = pa.table({"k": arr}).group_by("k", use_threads=False).aggregate([("k", "count")])
        dupes = counts.filter(pc.greater(counts.column("k_count"), 1)).column("k").to_pylist()
    first = dupes[0]
    more = f" (and {len(dupes) - 1} more duplicated key{'s' * (len(dupes) > 2)}: " if len(dupes) > 1 else ""
    if more:
        more += ", ".join(repr(k) for k in dupes[1:SHOWN]) + (", …" if len(dupes) > SHOWN else "") + ")"
    raise DuplicateKey(
        f"{where}: the data holds key {pk} = {first!r} more than once{more}; a primary key must be unique"
        f"{_allow(allowable)}; nothing was committed"
    )


def _allow(allowable: bool) -> str:
    return f" ({_ALLOW})" if allowable else ""


def refuse_existing(
    table: str, pk: str, found: Sequence[Any], version: int, op: str = "append", *, allowable: bool = True
) -> DuplicateKey:
    """The refusal of input keys the table already holds at ``version``."""
    shown = _keys_text(pk, sorted(found, key=lambda k: (k is None, k))) + (", …" if len(found) > SHOWN else "")
    return DuplicateKey(
        f"table {table}: {op}: {len(found)} key(s) are already in the table at version {version} ({shown}); "
        f"a primary key must be unique{_allow(allowable)}; nothing was committed"
    )


def existing_keys(
    storage: Storage, snap: Snapshot, pk: str, keys: pa.Array | pa.ChunkedArray, limit: int = 1000
) -> list:
    """Up to ``limit`` of ``keys`` (no NULL among them) that live rows of
    ``snap`` hold, read with pyarrow from the table's ``storage``: only files
    whose key statistics overlap [min, max] of ``keys``, only their row groups
    whose footer statistics hold an input key, only the key column."""
    from castsql.format.schema import type_from_name
    from castsql.snapshot import Predicate

    col = snap.schema.column(pk)
    if len(keys) == 0 or col is None:
        return []
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    want = type_from_name(col.type)
    if arr.type != want:
        arr = arr.cast(want)
    arr = normalized(arr)
    mm = pc.min_max(arr)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    files = snap.prune([Predicate(pk, ">=", lo), Predicate(pk, "<=", hi)]).files
    if not files:
        return []
    integer = pa.types.is_integer(want)
    if integer:
        sk = arr.to_numpy(zero_copy_only=False)
        if not bool(np.all(sk[1:] > sk[:-1])):
            sk = np.unique(sk)
        probe: Any = sk
    else:
        probe = pc.unique(arr)

    def one(f: ResolvedFile) -> list:
        return _file_hits(storage, f, pk, want, probe, lo, hi, integer)

    found: list = []
    # Files on storage's I/O threads; at the limit the files not yet read are cancelled.
    with contextlib.closing(overlapped_iter(one, files)) as parts:
        for part in parts:
            found += part
            if len(found) >= limit:
                break
    return found[:limit]


def open_data_file(storage: Storage, f: ResolvedFile) -> Any:
    """Data file ``f`` as a ``pyarrow.parquet.ParquetFile``: by path on local disk, else by ranged reads."""
    import pyarrow.parquet as pq

    from castsql.storage.ranged import open_ranged

    if "://" not in f.uri:
        return pq.ParquetFile(f.uri)
    return pq.ParquetFile(open_ranged(storage, f.key, f.entry.size_bytes, buffer_size=1024 * 1024))


def _file_hits(
    storage: Storage, f: ResolvedFile, pk: str, want: pa.DataType, probe: Any, lo: Any, hi: Any, integer: bool
) -> list:
    """The input keys live rows of data file ``f`` hold."""
    pf = open_data_file(storage, f)
    md = pf.metadata
    names = pf.schema_arrow.names
    if pk not in names:
        return []
    ci = names.index(pk)  # flat schemas: the Parquet column index is the field's
    starts, start = [], 0
    for i in range(md.num_row_groups):
        starts.append(start)
        start += md.row_group(i).num_rows
    hits: list = []
    for i in _row_groups_to_read(md, ci, f, starts, probe, lo, hi, integer):
        col = pf.read_row_group(i, columns=[pk]).column(0).combine_chunks()
        if col.type != want:
            col = col.cast(want)
        col = normalized(col)
        if integer:
            pos = _integer_hits(col, probe)
        else:
            pos = np.flatnonzero(pc.fill_null(pc.is_in(col, value_set=probe), False).to_numpy(zero_copy_only=False))
        if len(pos) == 0:
            continue
        pos = np.sort(pos)
        got = col.take(pa.array(pos))
        hits += got.filter(pa.array(_live(f, starts[i], pos, got, want))).to_pylist()
    return hits


def _row_groups_to_read(
    md: Any, ci: int, f: ResolvedFile, starts: list[int], probe: Any, lo: Any, hi: Any, integer: bool
) -> list[int]:
    """The row groups of ``f`` that may hold an input key: not wholly deleted,
    and with statistics (where the column has them) around one."""
    rgs = []
    for i in range(md.num_row_groups):
        n = md.row_group(i).num_rows
        if n == 0 or (f.deleted and f.deleted.range_cardinality(starts[i], starts[i] + n) == n):
            continue
        st = md.row_group(i).column(ci).statistics if ci < md.num_columns else None
        if st is not None and st.has_min_max:
            a, b = st.min, st.max
            try:
                if integer:
                    j = int(np.searchsorted(probe, a, "left"))
                    if j >= len(probe) or probe[j] > b:
                        continue  # no input key in [a, b]
                elif b < lo or a > hi:
                    continue
            except TypeError:  # statistics of another physical kind: read the row group
                pass
        rgs.append(i)
    return rgs


def _integer_hits(col: pa.Array, probe: Any) -> np.ndarray:
    """The positions in ``col`` (integer keys) of the sorted input keys ``probe``."""
    k = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else None
    if k is None:
        k = pc.fill_null(col, probe[0] if len(probe) else 0).to_numpy(zero_copy_only=False)
        valid = col.is_valid().to_numpy(zero_copy_only=False)
    else:
        valid = None
    # The input keys within this row group's range, searched in its keys.
    sub = probe[int(np.searchsorted(probe, k.min(), "left")) : int(np.searchsorted(probe, k.max(), "right"))]
    if len(sub) == 0:
        return np.empty(0, dtype=np.int64)
    if len(k) > 1 and bool(np.all(k[1:] > k[:-1])):  # strictly increasing (the usual file)
        j = np.searchsorted(k, sub)
        j[j >= len(k)] = len(k) - 1
        pos = j[k[j] == sub]
    else:
        j = np.searchsorted(sub, k)
        j[j >= len(sub)] = len(sub) - 1
        pos = np.flatnonzero(sub[j] == k)
    if valid is not None:
        pos = pos[valid[pos]]
    return pos


def _live(f: ResolvedFile, base: int, pos: np.ndarray, got: pa.Array, want: pa.DataType) -> np.ndarray:
    """Which of the rows at ``pos`` (of the row group starting at file
    position ``base``; keys ``got``) no tombstone deletes."""
    keep = np.ones(len(pos), dtype=bool)
    if f.deleted:
        keep &= np.array([base + int(p) not in f.deleted for p in pos], dtype=bool)
    for ra, rb in f.key_ranges:
        ka, kb = _bound(ra, want), _bound(rb, want)
        inside = pc.and_(pc.greater_equal(got, ka), pc.less_equal(got, kb))
        keep &= ~pc.fill_null(inside, False).to_numpy(zero_copy_only=False)
    return keep


def _bound(v: Any, t: pa.DataType) -> pa.Scalar:
    """A key-range bound as a scalar that compares with a ``t`` column as SQL does."""
    return key_bound_scalar(v, t)


def check_written_keys(
    table: str,
    op: str,
    pk: str,
    storage: Storage,
    snap: Snapshot,
    added: pa.Array | pa.ChunkedArray,
    *,
    replaced: pa.Array | pa.ChunkedArray | None = None,
    absent: np.ndarray | None = None,
) -> tuple[str, Any, Any] | None:
    """The primary-key invariant for one write planned from ``snap``
    (FORMAT.md §3.1), whichever engine planned it: after the commit every
    live row's key is non-NULL, not NaN and held by no other live row.

    ``added``: the keys of every row the write adds (inserted rows, and the
    new values of updated rows); ``replaced``: the keys of the live rows it
    tombstones (their keys are free again); ``absent``: a mask over ``added``
    of keys known to be in no live row (a merge on the key alone inserting
    the keys of the source rows that matched nothing), not looked up.

    Raises NullKey or DuplicateKey naming the first offending keys. Returns
    the conflict span (``pk``, lo, hi as JSON statistics) of the added keys
    no replaced row held, which a concurrent commit must not add too
    (:class:`castsql.format.change.Change`); None when there are none.

    Example::

        >>> import tempfile
        >>> from castsql.format import TableLog, write_data_files
        >>> from castsql.snapshot import resolve
        >>> from castsql.storage import open_storage
        >>> st = open_storage(tempfile.mkdtemp())
        >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
        >>> _ = log.append(write_data_files(st, pa.table({"id": [1, 2]}), log.latest().schema))
        >>> check_written_keys("t", "update", "id", st, resolve(log), pa.array([2]), replaced=pa.array([2]))
        >>> try:  # set id = 1 where id = 2
        ...     check_written_keys("t", "update", "id", st, resolve(log), pa.array([1]), replaced=pa.array([2]))
        ... except DuplicateKey as e:
        ...     print(str(e).split(";")[0])
        table t: update: 1 key(s) are already in the table at version 1 (id = 1)
    """
    from castsql.format.manifest import json_stat

    allowable = op != "update"  # only appends and merges take allow_duplicate_keys
    check_input_keys(table, pk, added, op, allowable=allowable)
    arr = normalized(added)
    fresh = np.ones(len(arr), dtype=bool)
    if replaced is not None and len(replaced):
        old = normalized(replaced)
        if old.type != arr.type:
            old = old.cast(arr.type)
        fresh = ~pc.fill_null(pc.is_in(arr, value_set=old), False).to_numpy(zero_copy_only=False)
    lookup = fresh if absent is None else fresh & ~np.asarray(absent, dtype=bool)
    if lookup.any():
        found = existing_keys(storage, snap, pk, arr.filter(pa.array(lookup)))
        if found:
            raise refuse_existing(table, pk, found, snap.version, op, allowable=allowable)
    if not fresh.any():
        return None
    mm = pc.min_max(arr.filter(pa.array(fresh)))
    return pk, json_stat(mm["min"].as_py()), json_stat(mm["max"].as_py())
