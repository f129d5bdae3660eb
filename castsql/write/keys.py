"""Primary-key uniqueness of appended and inserted rows (every writer).

A table's ``primary_key`` (FORMAT.md §3.1) is a promise readers and merges
rely on: a merge matches one target row per key, a key-range tombstone
deletes every row of a key. So an append (or a merge's inserts) is refused by
default when it would write a NULL key, the same key twice, or a key the
table already holds in a live row; the refusal names the first offending keys
and nothing is committed. ``allow_duplicate_keys=True``
(``--allow-duplicate-keys``) skips the check.

What needs no engine is here (NULLs, duplicates within the input, the
message); finding keys the table holds is the engine's job
(:meth:`castsql.engine.dml.Writer.existing_keys`): only the files whose key
statistics overlap the input's [min, max] are opened, and only their key
column is read.

Example::

    >>> try:
    ...     check_input_keys("t", "id", pa.chunked_array([[1, 2, 2, 3, 3]]))
    ... except DuplicateKey as e:
    ...     print(str(e)[:78])
    table t: append: the data holds key id = 2 more than once (and 1 more duplicat
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import CastSQLError

SHOWN = 5  # offending keys a refusal names
_ALLOW = "allow_duplicate_keys=True / --allow-duplicate-keys writes them anyway"


class DuplicateKey(CastSQLError):
    """Rows whose primary key is NULL, repeated, or already in the table; nothing was committed."""


def _keys_text(pk: str, keys: Sequence[Any]) -> str:
    return ", ".join(f"{pk} = {k!r}" for k in keys[:SHOWN])


def check_input_keys(table: str, pk: str, keys: pa.ChunkedArray | pa.Array, op: str = "append") -> None:
    """DuplicateKey unless ``keys`` (the input's key column) has no NULL and no repeat."""
    where = f"table {table}: {op}"
    nulls = keys.null_count
    if nulls:
        raise DuplicateKey(
            f"{where}: {nulls} row(s) have a NULL primary key {pk!r}; a primary key must not be NULL; "
            "nothing was committed"
        )
    n = len(keys)
    if n < 2:
        return
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
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
        f"{where}: the data holds key {pk} = {first!r} more than once{more}; a primary key must be unique "
        f"({_ALLOW}); nothing was committed"
    )


def refuse_existing(table: str, pk: str, found: Sequence[Any], version: int, op: str = "append") -> DuplicateKey:
    """The refusal of input keys the table already holds at ``version``."""
    shown = _keys_text(pk, sorted(found, key=lambda k: (k is None, k))) + (", …" if len(found) > SHOWN else "")
    return DuplicateKey(
        f"table {table}: {op}: {len(found)} key(s) are already in the table at version {version} ({shown}); "
        f"a primary key must be unique ({_ALLOW}); nothing was committed"
    )
