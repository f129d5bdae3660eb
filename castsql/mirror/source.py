"""What a mirror reads of a CastSQL table, whatever format it writes: the
rows each data file drops at a version, and the names other formats give
Arrow's primitive types.

Example::

    >>> import pyarrow as pa
    >>> primitive_name(pa.int16(), "delta"), primitive_name(pa.int16(), "iceberg")
    ('short', 'int')
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.errors import MirrorError
from castsql.format.schema import type_from_name
from castsql.format.tombstone import key_bound_scalar
from castsql.snapshot import ResolvedFile, Snapshot
from castsql.storage import Storage
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
