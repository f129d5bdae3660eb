"""Appending to a local table with Spark's own Parquet writer.

The DataFrame, projected onto the table's columns and types, is written by
``df.write.parquet`` into a directory of its own under the table's ``data/``
(``data/YYYY/MM/DD/HH/<time-ordered id>/part-….zstd.parquet``). Spark's output
committer makes that directory hold exactly the files of the task attempts it
let commit: a failed or retried attempt's files are removed with its
``_temporary`` directory when the job commits. The driver then opens each
file's footer (8 at a time) and makes its manifest entry from it: size, row
counts per row group, and min/max per column from the row groups'
statistics. The caller commits those entries as the Python workers' entries
(:mod:`castsql.spark.appends`). A job that fails leaves files no manifest
names; they are removed here where possible, and ``castsql gc`` removes
whatever a killed driver left (FORMAT.md §8).

The files are what CastSQL's own writer would write, read back the same by
every reader: zstd, microsecond timestamps (the session's
``spark.sql.parquet.outputTimestampType`` is set to ``TIMESTAMP_MICROS`` for
the write; Spark's default INT96 has no statistics), proleptic Gregorian
dates (rebase mode ``CORRECTED``), row groups of at most ``row_group_size``
rows (``parquet.block.row.count.limit``), numbers and times without a
dictionary (parquet-mr cannot see which repeat; strings keep theirs). One
file per Spark task, as ``df.write.parquet`` cuts them:
``df.repartition(n)`` chooses how many.

On 20M rows on 2 cores this writes at 1.24-1.25x a snappy ``df.write.parquet``
(1.14-1.17x one with zstd), where the Python workers took 1.87-2.14x
(docs/PERFORMANCE.md). :func:`why_not` names what sends an append to the
workers instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from castsql.errors import FormatError
from castsql.format import DataFile, Schema
from castsql.format.datafiles import fixed_width
from castsql.format.layout import new_data_dir
from castsql.format.manifest import json_stat
from castsql.format.schema import json_ordered, type_from_name
from castsql.spark.native_read import parquet_is_v1
from castsql.spark.types import arrow_for_spark, quote, spark_type
from castsql.storage import Storage
from castsql.storage.base import overlapped
from castsql.storage.local import LocalStorage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["file_entry", "why_not", "write_native"]

# Session settings for the write: what CastSQL's own writer does.
_SETTINGS = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
}


def why_not(storage: Storage, schema: Schema, spark: SparkSession | None = None) -> str | None:
    """Why Spark's Parquet writer cannot write files of ``schema`` into this
    table, or None if it can."""
    if not isinstance(storage, LocalStorage):
        return "the table is not on a local disk"
    for c in schema.columns:
        t = type_from_name(c.type)
        if arrow_for_spark(t) != t:
            # Spark would store it as another type (unsigned, large, nanoseconds).
            return f"column {c.name!r} is {t}, which Spark's writer cannot store as it is"
    if spark is not None and not parquet_is_v1(spark):
        return "Spark writes Parquet with its V2 source here"
    return None


@contextlib.contextmanager
def _session_settings(spark: SparkSession) -> Iterator[None]:
    # Writes from several threads of one session overlap: the first saves the
    # user's values, the last restores them (each restoring what it saved left
    # CastSQL's values behind whenever two writes interleaved).
    key = spark._jsparkSession.hashCode()
    with _SETTINGS_LOCK:
        count, old = _SETTINGS_HELD.get(key, (0, None))
        if count == 0:
            old = {k: spark.conf.get(k, None) for k in _SETTINGS}
            for k, v in _SETTINGS.items():
                spark.conf.set(k, v)
        _SETTINGS_HELD[key] = (count + 1, old)
    try:
        yield
    finally:
        with _SETTINGS_LOCK:
            count, old = _SETTINGS_HELD[key]
            if count > 1:
                _SETTINGS_HELD[key] = (count - 1, old)
            else:
                del _SETTINGS_HELD[key]
                for k, was in (old or {}).items():
                    if was is None:
                        spark.conf.unset(k)
                    else:
                        spark.conf.set(k, was)


_SETTINGS_LOCK = threading.Lock()
# Per session (its JVM object's hash): writes in progress, and the user's values to restore.
_SETTINGS_HELD: dict[int, tuple[int, dict[str, str | None] | None]] = {}


def _projected(df: DataFrame, schema: Schema) -> DataFrame:
    """``df`` as the table's columns, in its order and types; a column ``df``
    lacks is NULL (the caller has checked that it may be)."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    cols = []
    for c in schema.columns:
        t = spark_type(type_from_name(c.type))
        src = df[quote(c.name)] if c.name in have else F.lit(None)
        cols.append(src.cast(t).alias(c.name))
    return df.select(*cols)


def write_native(
    spark: SparkSession, storage: LocalStorage, df: DataFrame, schema: Schema, row_group_size: int
) -> list[DataFile]:
    """Write ``df`` as data files of the table with Spark's Parquet writer and
    return their manifest entries (nothing is committed here). Files with no
    rows are dropped; a job that fails removes what it wrote.

    Example::

        >>> files = write_native(spark, LocalStorage("/data/events"), df, schema, 122_880)   # doctest: +SKIP
        >>> files[0].path                                                                    # doctest: +SKIP
        'data/2026/11/25/09/019abc…/part-00000-…-c000.zstd.parquet'
    """
    stage = new_data_dir()
    where = storage.root.rstrip("/") + "/" + stage
    try:
        with _session_settings(spark):
            writer = _projected(df, schema).write.option("compression", "zstd")
            writer = writer.option("parquet.block.row.count.limit", str(row_group_size))
            for c in schema.columns:
                if fixed_width(type_from_name(c.type)):
                    # parquet-mr keeps a dictionary until it passes 1 MB, which a
                    # row group of 122,880 distinct int64s never does: ids and
                    # times became a dictionary of every value. Plain, as
                    # CastSQL's writer stores distinct ones (castsql.format.datafiles).
                    writer = writer.option(f"parquet.enable.dictionary#{c.name}", "false")
            writer.parquet(where)
        names = sorted(n for n in os.listdir(where) if n.endswith(".parquet") and not n.startswith(("_", ".")))
        arrow = schema.to_arrow()
        # footers, on the process's I/O threads: pyarrow releases the GIL
        files = overlapped(lambda n: file_entry(f"{stage}/{n}", f"{where}/{n}", arrow), names)
    except BaseException:
        shutil.rmtree(where, ignore_errors=True)  # nothing names them yet
        raise
    files = [f for f in files if f.total_rows]
    keep = {f.name for f in files}
    for n in os.listdir(where):  # Spark's _SUCCESS and .crc files, and part files without rows
        if n not in keep:
            with contextlib.suppress(OSError):
                os.remove(f"{where}/{n}")
    if not files:
        with contextlib.suppress(OSError):
            os.rmdir(where)
    return files


def file_entry(key: str, path: str, schema: pa.Schema) -> DataFile:
    """The manifest entry of a written data file, from its footer: every
    row group's statistics must give a column's min/max, or it gets none (a
    row group of NULLs only needs none). Raises FormatError for a file that
    does not hold ``schema``'s columns as ``schema``'s types."""
    size = os.path.getsize(path)
    meta = pq.read_metadata(path)
    physical = meta.schema.to_arrow_schema()
    for f in schema:
        i = physical.get_field_index(f.name)
        if i < 0 or physical.field(i).type != f.type:
            got = physical.field(i).type if i >= 0 else "nothing"
            raise FormatError(f"data file {path}: Spark wrote {f.name!r} as {got}, the table holds {f.type}")
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    leaf = {meta.schema.column(i).name: i for i in range(meta.num_columns)}
    for f in schema:
        if not json_ordered(f.type):
            continue
        bounds = _bounds(meta, leaf[f.name], f.type)
        if bounds is not None:
            mins[f.name], maxs[f.name] = bounds
    return DataFile(key, size, meta.num_row_groups, meta.num_rows, mins, maxs, rows)


def _bounds(meta: pq.FileMetaData, col: int, t: pa.DataType) -> tuple[Any, Any] | None:
    lo = hi = None
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        s = rg.column(col).statistics
        if rg.num_rows == 0:
            continue
        if s is not None and s.has_null_count and s.null_count == rg.num_rows:
            continue  # NULLs only: nothing to bound
        if s is None or not s.has_min_max:
            return None  # a row group without statistics: no bounds for the file
        try:
            a = json_stat(pa.scalar(s.min, t).as_py())
            b = json_stat(pa.scalar(s.max, t).as_py())
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            return None
        if a is None or b is None:
            return None  # NaN: JSON cannot order it
        lo = a if lo is None or a < lo else lo
        hi = b if hi is None or hi < b else hi
    return None if lo is None else (lo, hi)
