"""Table schemas: column names with type names that round-trip to Arrow.

Type names are Arrow's own spelling (``int64``, ``string``,
``timestamp[us, tz=UTC]``, ``decimal128(10, 2)``…), as in the seed's example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from castsql.errors import FormatError, SchemaMismatch

_SIMPLE: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float": pa.float32(),
    "float32": pa.float32(),
    "halffloat": pa.float16(),
    "double": pa.float64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "utf8": pa.string(),
    "large_string": pa.string(),
    "binary": pa.binary(),
    "large_binary": pa.binary(),
    "date32": pa.date32(),
    "date32[day]": pa.date32(),
    "date": pa.date32(),
}
_TS_RE = re.compile(r"^timestamp\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]$")
_DEC_RE = re.compile(r"^decimal(?:128)?\((\d+),\s*(\d+)\)$")


def type_from_name(name: str) -> pa.DataType:
    """Arrow type for a manifest type name. Raises FormatError for unknown names."""
    key = name.strip()
    if key in _SIMPLE:
        return _SIMPLE[key]
    if m := _TS_RE.match(key):
        return pa.timestamp(m.group(1), tz=m.group(2))
    if m := _DEC_RE.match(key):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise FormatError(f"unknown column type {name!r}")


def normalize_type(t: pa.DataType) -> pa.DataType:
    """The type CastSQL stores for ``t``: large/view strings become ``string``,
    every timestamp becomes microseconds (UTC when it had a zone), half floats
    single (as DuckDB and Spark read them)."""
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_dictionary(t):
        return normalize_type(t.value_type)
    return t


def json_ordered(t: pa.DataType) -> bool:
    """Types whose values JSON states exactly and whose JSON forms sort like
    the values (ISO text for times): the types that get min/max statistics
    (§3) and may bound key ranges (§4)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_boolean(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


def type_name(t: pa.DataType) -> str:
    name = str(t)
    type_from_name(name)  # refuse types we could not read back
    return name


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    # The version that added the column to the table (schema evolution,
    # FORMAT.md §3.4); None for a column the table was created with. Data files
    # written before then lack it: readers read it as NULL there.
    added_in: int | None = None


def repeated(names: list[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    return sorted({n for n in names if names.count(n) > 1})


def same_but_case(names: list[str]) -> tuple[str, str] | None:
    """Two names equal but for case, if any: DuckDB and Spark match column
    names without case, so such a pair reads as one column there (DuckDB
    renames the second and a query gets the first's values twice)."""
    seen: dict[str, str] = {}
    for n in names:
        other = seen.setdefault(n.lower(), n)
        if other != n:
            return other, n
    return None


# Names no column may have, in any case (FORMAT.md §3.1): DuckDB's Parquet
# scan gives a row's position and file as the virtual columns file_row_number
# and file_index, and a file column of either name hides them (DuckDB 1.5
# refuses its file_row_number option on such a file), so the rows of a delete
# or an update could not be found; and the prefix the writers' and readers'
# own columns carry, so that no table column can be mistaken for one.
RESERVED_NAMES = ("file_row_number", "file_index")
_RESERVED_PREFIX = re.compile(r"_+castsql_", re.I)


def castsql_own(name: str) -> bool:
    """Does ``name`` carry the prefix of CastSQL's own columns (``_castsql_``, any case)?"""
    return _RESERVED_PREFIX.match(name) is not None


def reserved(name: str) -> str | None:
    """Why no column may be called ``name``, or None when it may.

    >>> reserved("_pos") is None, reserved("File_Index") is not None, reserved("_CastSQL_x") is not None
    (True, True, True)
    """
    if name.lower() in RESERVED_NAMES:
        return (
            f"column name {name!r} is reserved: DuckDB's Parquet scan gives each row's "
            f"{name.lower()} under that name, and a column of the same name would hide it; rename the column"
        )
    if castsql_own(name):
        return f"column name {name!r} is reserved: names starting with _castsql_ are CastSQL's own; rename the column"
    return None


@dataclass(frozen=True, slots=True)
class Schema:
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        if any(c.name == "" for c in self.columns):
            # DuckDB's SQL cannot name it (a zero-length identifier), nor Spark's.
            raise SchemaMismatch("a column's name is empty, which no SQL can name")
        for c in self.columns:
            if why := reserved(c.name):
                raise SchemaMismatch(why)
        pair = same_but_case([c.name for c in self.columns])
        if pair:
            raise SchemaMismatch(
                f"columns {pair[0]!r} and {pair[1]!r} differ only in case, which DuckDB and Spark cannot tell apart"
            )

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None

    def column_named(self, name: str) -> Column:
        """The column ``name``, where the caller knows the schema holds it
        (``KeyError`` otherwise: a bug, not bad input)."""
        c = self.column(name)
        if c is None:
            raise KeyError(name)
        return c

    def to_arrow(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, type_from_name(c.type)) for c in self.columns])

    @classmethod
    def from_arrow(cls, schema: pa.Schema) -> Schema:
        names = [f.name for f in schema]
        dupes = repeated(names)
        if dupes:
            raise SchemaMismatch(f"duplicate column names {dupes}")
        cols = []
        for f in schema:
            try:
                cols.append(Column(f.name, type_name(normalize_type(f.type))))
            except FormatError as e:
                raise SchemaMismatch(f"column {f.name!r}: unsupported column type: {e}") from None
        return cls(tuple(cols))

    def to_json(self) -> dict:
        cols = []
        for c in self.columns:
            d: dict = {"name": c.name, "type": c.type}
            if c.added_in is not None:
                d["added_in"] = c.added_in
            cols.append(d)
        return {"columns": cols}

    @classmethod
    def from_json(cls, obj: object, where: str) -> Schema:
        if not isinstance(obj, dict) or not isinstance(obj.get("columns"), list):
            raise FormatError(f"{where}: 'schema' must be an object with a 'columns' list")
        cols = []
        for i, c in enumerate(obj["columns"]):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("type"), str):
                raise FormatError(f"{where}: schema column {i} must have string 'name' and 'type'")
            try:
                type_from_name(c["type"])
            except FormatError as e:
                raise FormatError(f"{where}: column {c['name']!r}: {e}") from None
            added = c.get("added_in")
            if added is not None and (not isinstance(added, int) or isinstance(added, bool) or added < 1):
                raise FormatError(f"{where}: column {c['name']!r}: 'added_in' must be a version number >= 1")
            cols.append(Column(c["name"], c["type"], added))
        dupes = repeated([c.name for c in cols])
        if dupes:
            raise FormatError(f"{where}: schema names columns {dupes} twice")
        try:
            return cls(tuple(cols))
        except SchemaMismatch as e:  # names equal but for case (__post_init__)
            raise FormatError(f"{where}: schema {e}") from None

    def check_compatible(self, other: Schema, what: str) -> None:
        """Raise SchemaMismatch unless ``other`` has exactly our columns and types
        (column order may differ)."""
        mine = {c.name: c.type for c in self.columns}
        theirs = {c.name: c.type for c in other.columns}
        missing = [n for n in mine if n not in theirs]
        extra = [n for n in theirs if n not in mine]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing columns {missing}")
            if extra:
                parts.append(f"unknown columns {extra}")
            raise SchemaMismatch(f"{what}: {'; '.join(parts)} (table columns: {list(mine)})")
        for n, t in mine.items():
            if type_from_name(t) != type_from_name(theirs[n]):
                raise SchemaMismatch(f"{what}: column {n!r} has type {theirs[n]}, the table has {t}")
