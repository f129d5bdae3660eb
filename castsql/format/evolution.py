"""Schema evolution and the one type rule every writer applies (FORMAT.md §3.4).

Two questions, answered here for every writer (Python, embedded DuckDB,
Spark, the CLI) so that they cannot disagree:

- **May the table's schema change from A to B?** (:func:`widens`,
  :func:`rebase`) Columns are added nullable at the end; a column's type may
  widen along Delta 4.0's type-widening and Iceberg's promotion lists:
  ``int8 → int16 → int32 → int64``, ``float → double``, ``decimal(p, s) →
  decimal(p', s)`` with ``p' > p``, ``date32[day] → timestamp[us]``. Nothing
  else: no rename, no drop, no narrowing, no type change that could lose or
  reinterpret a value already written (files are never rewritten; readers
  convert old files when they read them).
- **May input data of type S be stored in a column of type T?**
  (:func:`fits`) Only when every value of S is exactly a value of T: the same
  type, a wider integer of the same signedness (or a signed one with more
  bits for an unsigned input), integers of at most 16 bits into ``float`` and
  of at most 32 bits into ``double`` (their 24- and 53-bit significands hold
  them exactly; ``int64`` into ``double`` does not: 2**53 + 1 would change),
  ``float`` into ``double``, an integer or a decimal into a decimal with room
  for all its digits, ``date`` into a naive timestamp, an all-null column
  into anything. A string is never parsed into a number or a time: a value
  that does not fit is refused before any file is written, naming the table,
  the column and both types.

Example::

    >>> widens("int32", "int64"), widens("int64", "int32"), widens("double", "int64")
    (True, False, False)
    >>> fits(pa.int32(), pa.float64()), fits(pa.int64(), pa.float64()), fits(pa.string(), pa.int64())
    (True, False, False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from castsql.errors import SchemaMismatch
from castsql.format.schema import Column, Schema, normalize_type, repeated, type_from_name, type_name

# The widenings a table's schema may make, as Delta 4.0 ("type widening") and
# Iceberg ("type promotion") allow them; see the module docstring.
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def widens(src: str, dst: str) -> bool:
    """May a column of type name ``src`` become ``dst`` (or is it already)?"""
    s, d = type_from_name(src), type_from_name(dst)
    if s == d:
        return True
    if pa.types.is_signed_integer(s) and pa.types.is_signed_integer(d):
        return d.bit_width > s.bit_width
    if pa.types.is_float32(s) and pa.types.is_float64(d):
        return True
    if pa.types.is_decimal(s) and pa.types.is_decimal(d):
        return d.scale == s.scale and d.precision > s.precision
    if pa.types.is_date32(s) and pa.types.is_timestamp(d):
        return d.tz is None
    return False


def fits(src: pa.DataType, dst: pa.DataType) -> bool:
    """Is every value of input type ``src`` exactly a value of column type ``dst``?"""
    src = normalize_type(src)
    if src == dst or pa.types.is_null(src):
        return True
    if pa.types.is_integer(src):
        bits, signed = src.bit_width, pa.types.is_signed_integer(src)
        if pa.types.is_integer(dst):
            if signed == pa.types.is_signed_integer(dst):
                return dst.bit_width >= bits
            return pa.types.is_signed_integer(dst) and dst.bit_width > bits
        if pa.types.is_float64(dst):
            return bits <= 32
        if pa.types.is_float32(dst):
            return bits <= 16
        if pa.types.is_decimal(dst):
            digits = _INT_DIGITS[bits] + (1 if not signed and bits == 64 else 0)
            return dst.precision - dst.scale >= digits
        return False
    if pa.types.is_float32(src):
        return pa.types.is_float64(dst)
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return dst.scale >= src.scale and dst.precision - dst.scale >= src.precision - src.scale
    if pa.types.is_date32(src) and pa.types.is_timestamp(dst):
        return dst.tz is None
    return False


def input_name(t: pa.DataType) -> str:
    """How a refusal names an input type (the name the table would store it as)."""
    return str(normalize_type(t))


def refusal(where: str, column: str, src: pa.DataType, dst: pa.DataType) -> SchemaMismatch:
    """The one-line refusal of a column whose input type does not fit."""
    hint = ""
    try:
        if widens(type_name(dst), type_name(normalize_type(src))):
            hint = "; merge_schema=True (--merge-schema) widens the column"
    except (SchemaMismatch, Exception):  # an input type the format has no name for
        hint = ""
    return SchemaMismatch(
        f"{where}: column {column!r} is {input_name(src)} in the data, the table has {dst} "
        f"(only lossless widenings are accepted){hint}; nothing was written"
    )


def check_names(
    table: Schema, data: Sequence[str], where: str, *, fill: bool = False, primary_key: str | None = None
) -> list[str]:
    """SchemaMismatch unless ``data`` has the table's column names.

    With ``fill`` (every append: Python, Spark, ``format("castsql")``, the
    CLI), table columns the data lacks are allowed and returned: the writer
    stores them as NULL, as Delta does (every column but the primary key is
    nullable). A missing primary key is refused, naming it. Without ``fill``
    the names must be exactly the table's."""
    mine = table.names
    missing = [n for n in mine if n not in data]
    extra = [n for n in data if n not in mine]
    dupes = repeated(list(data))
    if dupes:
        raise SchemaMismatch(f"{where}: duplicate column names {dupes}")
    if fill and primary_key is not None and primary_key in missing:
        raise SchemaMismatch(
            f"{where}: the data has no column {primary_key!r}, the table's primary key (every row needs its key; "
            "other missing columns are stored as NULL); nothing was written"
        )
    if (missing and not fill) or extra:
        parts = []
        if missing and not fill:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unknown columns {extra} (merge_schema=True / --merge-schema adds them)")
        raise SchemaMismatch(f"{where}: {'; '.join(parts)} (table columns: {mine})")
    return missing if fill else []


def merged(table: Schema, data: pa.Schema, where: str, primary_key: str | None = None) -> Schema:
    """The schema ``merge_schema=True`` gives the table for input ``data``: the
    table's columns, each widened where the input's type is an allowed widening
    of it, then the input's new columns (in the input's order, nullable).
    Refuses an input type that neither fits nor widens, naming both types."""
    cols = list(table.columns)
    # By name in any case, as merge and Spark match columns: "ID" is not a new column of a table with "id".
    index = {c.name.lower(): i for i, c in enumerate(cols)}
    for f in data:
        t = normalize_type(f.type)
        i = index.get(f.name.lower())
        if i is None:
            if pa.types.is_null(t):
                raise SchemaMismatch(
                    f"{where}: new column {f.name!r} holds only nulls, so it has no type; give it one "
                    "(e.g. pa.array([...], pa.int64())) or add it with add_columns"
                )
            try:
                cols.append(Column(f.name, type_name(t)))
            except Exception:
                raise SchemaMismatch(f"{where}: new column {f.name!r} has type {t}, no table can hold") from None
            index[f.name.lower()] = len(cols) - 1
            continue
        have = type_from_name(cols[i].type)
        if fits(t, have):
            continue
        try:
            wider = type_name(t)
        except Exception:
            raise refusal(where, f.name, t, have) from None
        if not widens(cols[i].type, wider):
            raise refusal(where, f.name, t, have)
        check_widen_key(cols[i].name, cols[i].type, wider, primary_key, where)
        cols[i] = Column(cols[i].name, wider, cols[i].added_in)
    return Schema(tuple(cols))


def check_widen_key(column: str, src: str, dst: str, primary_key: str | None, where: str) -> None:
    """The primary key widens only between integers (key-range tombstones
    written before must keep their meaning, §4)."""
    if column == primary_key and not (
        pa.types.is_integer(type_from_name(src)) and pa.types.is_integer(type_from_name(dst))
    ):
        raise SchemaMismatch(f"{where}: the primary key {column!r} cannot change from {src} to {dst}")


def altered(
    table: Schema,
    *,
    add: Mapping[str, str | pa.DataType] | None = None,
    widen: Mapping[str, str | pa.DataType] | None = None,
    where: str,
    primary_key: str | None = None,
) -> Schema:
    """``table`` with columns added (name -> type, nullable, at the end) and
    widened (name -> wider type); SchemaMismatch naming the column otherwise."""
    cols = list(table.columns)
    index = {c.name: i for i, c in enumerate(cols)}
    lower = {c.name.lower(): c.name for c in cols}
    for name, t in (widen or {}).items():
        i = index.get(name)
        if i is None:
            raise SchemaMismatch(f"{where}: no column {name!r} to widen (columns: {table.names})")
        new = _type_name(t, where, name)
        if not widens(cols[i].type, new):
            raise SchemaMismatch(
                f"{where}: column {name!r} cannot change from {cols[i].type} to {new} (allowed: int8 → int16 → "
                "int32 → int64, float → double, decimal precision up with the same scale, date32[day] → "
                "timestamp[us]); renames, drops and other changes are not supported"
            )
        check_widen_key(name, cols[i].type, new, primary_key, where)
        cols[i] = Column(name, new, cols[i].added_in)
    for name, t in (add or {}).items():
        if not isinstance(name, str) or not name:
            raise SchemaMismatch(f"{where}: a column name must be a non-empty string, got {name!r}")
        if name.lower() in lower:
            raise SchemaMismatch(f"{where}: column {name!r} already exists (as {lower[name.lower()]!r})")
        cols.append(Column(name, _type_name(t, where, name)))
        lower[name.lower()] = name
    return Schema(tuple(cols))


_SQL_TYPES = {
    "tinyint": "int8", "smallint": "int16", "int": "int32", "integer": "int32", "bigint": "int64",
    "real": "float", "float4": "float", "float8": "double", "double precision": "double",
    "varchar": "string", "text": "string", "boolean": "bool", "timestamp": "timestamp[us]",
    "timestamptz": "timestamp[us, tz=UTC]", "timestamp with time zone": "timestamp[us, tz=UTC]",
    "blob": "binary",
}  # fmt: skip


def _type_name(t: str | pa.DataType, where: str, column: str) -> str:
    """A column type given as Arrow's name, a SQL name (``BIGINT``, ``DECIMAL(10,2)``) or an Arrow type."""
    try:
        if isinstance(t, pa.DataType):
            return type_name(normalize_type(t))
        key = " ".join(str(t).strip().split())
        key = _SQL_TYPES.get(key.lower(), key)
        if key.lower().startswith(("decimal(", "numeric(")):
            key = "decimal128(" + key.split("(", 1)[1]
        return type_name(type_from_name(key))
    except Exception:
        raise SchemaMismatch(
            f"{where}: column {column!r}: unknown type {t!r} (Arrow names such as int64, double, string, "
            "date32[day], timestamp[us], decimal128(10, 2), or SQL names such as BIGINT)"
        ) from None


def rebase(base: Schema, target: Schema, version: int, where: str) -> Schema:
    """The schema of version ``version`` when a writer that planned ``target``
    commits on top of ``base`` (which may have evolved meanwhile): ``base``
    with ``target``'s widenings and new columns (``added_in`` = ``version``).
    A concurrent change that makes them disagree is a SchemaMismatch."""
    cols = list(base.columns)
    index = {c.name: i for i, c in enumerate(cols)}
    for c in target.columns:
        i = index.get(c.name)
        if i is None:
            cols.append(Column(c.name, c.type, version))
            index[c.name] = len(cols) - 1
        elif widens(cols[i].type, c.type):
            cols[i] = Column(c.name, c.type, cols[i].added_in)
        elif not widens(c.type, cols[i].type):
            raise SchemaMismatch(
                f"{where}: column {c.name!r} is {cols[i].type} in the table now, this change makes it {c.type}"
            )
    return Schema(tuple(cols))


def check_readable(files: Schema, table: Schema, where: str) -> None:
    """Data files written with schema ``files`` read as ``table`` (§3.4): every
    column of theirs is the table's, of its type or one that widens to it, and
    every table column they lack was added by evolution."""
    mine = {c.name: c for c in table.columns}
    for c in files.columns:
        t = mine.get(c.name)
        if t is None:
            raise SchemaMismatch(f"{where}: unknown columns [{c.name!r}] (table columns: {table.names})")
        if not widens(c.type, t.type):
            raise SchemaMismatch(f"{where}: column {c.name!r} has type {c.type}, the table has {t.type}")
    theirs = set(files.names)
    missing = [c.name for c in table.columns if c.name not in theirs and c.added_in is None]
    if missing:
        raise SchemaMismatch(f"{where}: missing columns {missing} (table columns: {table.names})")


def describe(old: Schema, new: Schema) -> dict:
    """What changed from ``old`` to ``new``, for a version's ``summary``."""
    before = {c.name: c.type for c in old.columns}
    added = [{"name": c.name, "type": c.type} for c in new.columns if c.name not in before]
    widened = [
        {"name": c.name, "from": before[c.name], "to": c.type}
        for c in new.columns
        if c.name in before and before[c.name] != c.type
    ]
    out: dict = {}
    if added:
        out["added_columns"] = added
    if widened:
        out["widened_columns"] = widened
    return out
