"""Reading a version of a table into Spark: the live rows, tombstones applied.

:func:`read` of a table on a local disk goes to Spark's own Parquet reader
(:mod:`castsql.spark.native_read`); everything else is read here. The
resolved snapshot (:func:`castsql.snapshot.resolve`) is cut into units
of one row group each; Spark parallelizes the units and its Python workers
read them with pyarrow through :mod:`castsql.storage` (a local path, or ranged
GETs on S3: there is no Hadoop S3 connector here), drop the tombstoned rows
and hand Arrow batches to Spark. Row groups whose rows are all deleted are
never opened. With ``positions=True`` every row also carries its file's table
key and its position in that file, which is what deletes are made of.

Example::

    >>> df = read(spark, "/data/events", version=3)          # doctest: +SKIP
    >>> df.where("kind = 'refund'").count()                   # doctest: +SKIP
    1204
"""

from __future__ import annotations

import functools
import math
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from castsql.errors import CastSQLError
from castsql.format import Schema, TableLog
from castsql.format.schema import repeated
from castsql.snapshot import Snapshot
from castsql.spark.tasks import FILE_COL, POS_COL, RG_COL, UNIT_COL, TableRef, Unit, read_task
from castsql.spark.types import spark_schema
from castsql.spark.units import Splits, file_row_groups, file_unit, row_group_units
from castsql.storage import S3Config, open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FILE_COL", "POS_COL", "file_row_groups", "file_unit", "read", "row_group_units"]


def table_ref(log: TableLog, snap: Snapshot) -> TableRef:
    storage = log.storage
    return TableRef(storage.root, getattr(storage, "config", None), snap.schema.to_json(), snap.primary_key)


def units_frame(spark: SparkSession, units: list[Unit]) -> DataFrame:
    """A DataFrame of JSON units, one row each, cut into as many partitions
    as ``spark.read.parquet`` would cut the same files into (:class:`Splits`):
    a Python task costs ~0.2-0.5 s of its own here, so few large tasks, but
    at least one per task slot while there is enough to share."""
    sc = spark.sparkContext
    rows = sum(n for u in units for _, _, n in u.row_groups)
    slices = max(1, min(len(units), math.ceil(rows / Splits.of(spark).for_units(units))))
    rdd = sc.parallelize([(u.to_json(),) for u in units], slices)
    return spark.createDataFrame(rdd, f"{UNIT_COL} string")


def read_snapshot(
    spark: SparkSession,
    log: TableLog,
    snap: Snapshot,
    *,
    positions: bool = False,
    row_groups: bool = False,
    columns: list[str] | None = None,
) -> DataFrame:
    """The live rows of a resolved snapshot as a DataFrame (see :func:`read`)."""
    names = snap.schema.names if columns is None else columns
    sub = Schema(tuple(snap.schema.column(n) for n in names))  # type: ignore[misc]
    extra: list[tuple[str, pa.DataType]] = []
    if positions:
        extra += [(FILE_COL, pa.string()), (POS_COL, pa.int64())]
    if row_groups:
        extra.append((RG_COL, pa.int32()))
    out_schema = spark_schema(sub, extra)
    fn = functools.partial(read_task, table_ref(log, snap), list(names), positions, row_groups)
    return units_frame(spark, row_group_units(log, snap)).mapInArrow(fn, out_schema)


def read(
    spark: SparkSession,
    uri: str,
    version: int | None = None,
    *,
    timestamp: str | datetime | None = None,
    columns: list[str] | None = None,
    s3: S3Config | None = None,
    positions: bool = False,
) -> DataFrame:
    """The live rows of ``version`` (default: the latest) of the table at ``uri``.

    ``timestamp`` reads the newest version committed at or before it instead
    (ISO-8601 text or a datetime; a time after the latest commit or before the
    oldest kept version is an error naming both). ``columns`` reads only those
    columns (in that order). The version is fixed when ``read`` is called:
    later commits do not change the DataFrame. With ``positions`` two more
    columns, ``_castsql_file`` (the data file's key in the table) and
    ``_castsql_pos`` (the row's position in that file, as Spark's
    ``_metadata.row_index`` and DuckDB's ``file_row_number`` count it), say
    where each row lives.

    A table on a local disk is read by Spark's own Parquet reader, the
    deletes applied in Spark's generated code (:mod:`castsql.spark.native_read`);
    S3 tables, ``positions`` and the cases :func:`~castsql.spark.native_read.why_not`
    names are read by CastSQL's Python workers. Works with any SparkSession:
    local workers are pointed at this interpreter
    (:func:`castsql.spark.workers.prepare_workers`).

    Example::

        >>> read(spark, "s3://bucket/events", 2, positions=True).columns   # doctest: +SKIP
        ['id', 'ts', 'user', 'kind', 'amount', '_castsql_file', '_castsql_pos']
        >>> read(spark, "/data/events", timestamp="2025-06-01T00:00:00Z", columns=["id"]).count()  # doctest: +SKIP
        1204
    """
    from castsql.spark.datasource_read import resolve_read
    from castsql.spark.workers import prepare_workers

    prepare_workers(spark)
    log = TableLog(open_storage(uri, s3=s3))
    snap = resolve_read(log, version, timestamp, log.storage.root)
    if columns is not None:
        if isinstance(columns, str):
            raise CastSQLError(f"{log.storage.root}: columns must be a list of names, not {columns!r}")
        for c in columns:
            if snap.schema.column(c) is None:
                raise CastSQLError(f"{log.storage.root}: no column {c!r} (columns: {', '.join(snap.schema.names)})")
        if twice := repeated(list(columns)):
            # A DataFrame's columns need distinct names; Spark would fail later, deep in the plan.
            raise CastSQLError(f"{log.storage.root}: columns names {', '.join(map(repr, twice))} more than once")
    return read_resolved(spark, log, snap, columns, positions=positions)


def read_resolved(
    spark: SparkSession, log: TableLog, snap: Snapshot, columns: list[str] | None, *, positions: bool = False
) -> DataFrame:
    """The live rows of a resolved (perhaps pruned) snapshot, by Spark's own
    Parquet reader where it can read them, else by the Python workers."""
    from castsql.spark.native_read import read_native, why_not

    names = snap.schema.names if columns is None else list(columns)
    if not positions and why_not(log.storage, snap, names, spark) is None:
        return read_native(spark, log.storage, snap, names)
    return read_snapshot(spark, log, snap, positions=positions, columns=columns)
