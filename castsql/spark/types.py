"""Table schemas between Spark and CastSQL.

A CastSQL schema is a list of Arrow type names (docs/FORMAT.md §3). Spark has
no unsigned integers, so tables written by other tools that hold them are
read back widened (uint8 -> SMALLINT, …, uint64 -> DECIMAL(20, 0)); Spark's
TIMESTAMP is a zoned instant (stored as ``timestamp[us, tz=UTC]``) and
TIMESTAMP_NTZ a wall-clock time (``timestamp[us]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from castsql.errors import SchemaMismatch
from castsql.format import Schema

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


def quote(name: str) -> str:
    """A column or view name as Spark reads it literally (``a.b`` is not a
    field of ``a``, ``my-table`` not a subtraction).

    Example::

        >>> quote("a`b")
        '`a``b`'
    """
    return "`" + name.replace("`", "``") + "`"


def schema_from_spark(struct: StructType) -> Schema:
    """The CastSQL schema of a Spark DataFrame's rows, or SchemaMismatch for
    types the table format cannot hold (arrays, maps, structs, intervals…)."""
    from pyspark.errors import PySparkTypeError
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for f in struct.fields:
        try:
            fields.append(pa.field(f.name, to_arrow_type(f.dataType, timestamp_utc=True)))
        except (PySparkTypeError, TypeError) as e:
            raise SchemaMismatch(f"column {f.name!r}: Spark type {f.dataType.simpleString()} is not supported") from e
    schema = pa.schema(fields)
    try:
        return Schema.from_arrow(schema)
    except SchemaMismatch as e:
        raise SchemaMismatch(f"the DataFrame cannot be stored as a CastSQL table: {e}") from None


def arrow_for_spark(t: pa.DataType) -> pa.DataType:
    """The Arrow type a worker hands Spark for a column stored as ``t``."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width, pa.decimal128(20, 0))
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


def spark_type(t: pa.DataType) -> DataType:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow_for_spark(t), prefer_timestamp_ntz=True)


def spark_schema(schema: Schema, extra: list[tuple[str, pa.DataType]] = ()) -> StructType:  # type: ignore[assignment]
    """The Spark schema of a table's rows, plus ``extra`` columns."""
    from pyspark.sql.types import StructField, StructType

    fields = [StructField(f.name, spark_type(f.type), True) for f in schema.to_arrow()]
    fields += [StructField(name, spark_type(t), True) for name, t in extra]
    return StructType(fields)
