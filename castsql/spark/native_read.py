"""Reading a version of a local table with Spark's own Parquet reader.

Spark's vectorized reader decodes the version's data files. Files without
deletes are read as they are; for the others the deletes are applied after
the reader, inside the same generated code, by a filter on two of the file's
metadata columns: ``_metadata.row_index`` (a row's position in its file, as
tombstones count them) and ``_metadata.file_size`` (which file it is: the
manifest records every file's size, and these files' sizes must differ).
Each file with deletes has its deleted positions as a bitset (one bit per
row, whole row groups included), in a broadcast. Where castsql-spark.jar
reaches the tasks (:func:`castsql.spark.jvm.loader.ship_jar`), a Java UDF
(``castsql.spark.jvm.Deleted``) finds the row's file's bitset (once per file)
and tests one bit; elsewhere a broadcast table of the bitsets
(``array<bigint>``) is hash-joined with every row on the size and the bit
tested in generated code. Key ranges, where a version has any, are a second
broadcast table (size, low, high) that rows of those files are anti-joined
with.

On 20M rows with 1 % scattered deletes this reads at 1.11-1.17x a plain
``spark.read.parquet`` of the same files with the UDF (the metadata columns
alone: 1.07-1.11x), 1.26-1.30x with the hash join, where the Python workers
took 1.50-1.72x (docs/PERFORMANCE.md, "Deletes tested by a Java UDF"); Spark
also prunes row groups by the query's own filters here. It applies only
where Spark's reader can open the files and read them as the version's
schema says; :func:`why_not` names what stops it, and the
caller then reads through the Python workers (:mod:`castsql.spark.reader`):
- the table is on S3 (this Spark has no Hadoop S3 connector) or a file is
  named by a full URI;
- a column is unsigned (Spark has no unsigned types: the workers widen them);
- a file holds a column with a narrower type than the version's (schema
  evolution widened it; FORMAT.md §3.4);
- two files with deletes have the same size, or the table's path holds a
  character Spark reads as a glob;
- a file's size, row count or row groups differ from its manifest entry
  (each footer is opened first: a size that lies would find the wrong
  deletes, row groups that lie would place a row-group delete wrong);
- a key-range bound is not exactly a key value, or Spark reads Parquet
  through its V2 source;
- the bitsets would pass ``BITSETS_MAX`` (64 MiB: 512M rows in files with
  deletes) or the version has over ``FILES_MAX`` files. (No column may be
  named ``_castsql_*``, FORMAT.md §3.1, so the reader's own columns never
  meet a table's.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import AbstractBitMap

from castsql.format import Schema
from castsql.format.schema import type_from_name
from castsql.format.tombstone import key_bound
from castsql.snapshot import ResolvedFile, Snapshot
from castsql.spark.types import quote, spark_schema, spark_type
from castsql.storage import Storage
from castsql.storage.base import overlapped
from castsql.storage.local import LocalStorage

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["parquet_is_v1", "read_native", "why_not"]

_GLOB = set("*?[]{}\\,")
# The broadcast bitsets cost one bit per row of every file with deletes; past
# this (512M rows) they would crowd the driver, and the workers read instead.
BITSETS_MAX = 64 << 20
# The driver opens every footer before choosing this path (~0.2 ms a local file).
FILES_MAX = 20_000
# Test deletes with castsql.spark.jvm.Deleted where the jar reaches the tasks
# (False: always the hash join with a broadcast table of bitsets).
JVM_FILTER = True
# Names of the helper columns; the table's own columns are selected by
# reference at the end, so a table column of the same name is not confused.
_SIZE, _POS, _KEY, _WORDS = "_castsql_fs", "_castsql_pos", "_castsql_fsz", "_castsql_words"
_LO, _HI = "_castsql_lo", "_castsql_hi"


def parquet_is_v1(spark: SparkSession) -> bool:
    """Does ``spark`` read and write Parquet with its V1 file source (the
    default), which has ``_metadata.row_index`` and the writer options CastSQL
    sets, rather than the V2 one?"""
    v1 = spark.conf.get("spark.sql.sources.useV1SourceList", "parquet") or ""
    return "parquet" in [x.strip().lower() for x in v1.split(",")]


def why_not(storage: Storage, snap: Snapshot, names: list[str], spark: SparkSession | None = None) -> str | None:
    """Why Spark's Parquet reader cannot read ``names`` of this version (in
    ``spark``'s settings, where given), or None if it can."""
    if not isinstance(storage, LocalStorage):
        return "the table is not on a local disk"
    if spark is not None and not parquet_is_v1(spark):
        return "Spark reads Parquet with its V2 source here, which has no _metadata.row_index"
    if _GLOB & set(storage.root):
        return "the table's path holds a character Spark reads as a glob"
    sizes = [f.entry.size_bytes for f in snap.files if f.has_deletes]
    if len(set(sizes)) != len(sizes):
        return "two data files with deletes have the same size"
    bitsets = sum(f.total_rows for f in snap.files if f.deleted) // 8
    if bitsets > BITSETS_MAX:
        return f"the bitsets of the files with deletes would take {bitsets >> 20} MiB (at most {BITSETS_MAX >> 20})"
    want = {n: type_from_name(snap.schema.column(n).type) for n in _read_columns(snap, names)}  # type: ignore[union-attr]
    for n, t in want.items():
        if pa.types.is_unsigned_integer(t):
            return f"column {n!r} is {t}: Spark has no unsigned types"
    if (why := _key_ranges_why_not(snap, want)) is not None:
        return why
    if len(snap.files) > FILES_MAX:
        return f"the version has {len(snap.files):,} data files (at most {FILES_MAX:,} have their footers checked)"
    for f in snap.files:
        if "://" in f.uri or _GLOB & set(f.uri) or f.uri.rsplit("/", 1)[-1].startswith(("_", ".")):
            # Spark skips files named _x or .x without a word.
            return f"data file {f.key} is not a plain local path Spark would read"
    # footers, on the process's I/O threads: pyarrow releases the GIL
    return next((why for why in overlapped(lambda f: _file_why_not(f, want), snap.files) if why), None)


def _key_ranges_why_not(snap: Snapshot, want: dict[str, pa.DataType]) -> str | None:
    """Why the version's key-range tombstones cannot be tested in Spark's
    reader (a key type Spark compares differently, a bound not of the key's type)."""
    if not any(f.key_ranges for f in snap.files):
        return None
    t = want[snap.primary_key]  # type: ignore[index]
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)):
        return f"key ranges on a {t} key"
    for f in snap.files:
        for bound in (b for r in f.key_ranges for b in r):
            if not _exact_bound(bound, t):
                return f"data file {f.key}: key range bound {bound!r} is not a {t} value"
    return None


def _exact_bound(v: Any, t: pa.DataType) -> bool:
    """Is a key-range bound exactly a value of the key's type? (Another
    tool's 1.5 on an integer key would be truncated in an Arrow array.)"""
    try:
        pa.array([key_bound(v, t)], t)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return False
    if pa.types.is_integer(t):
        return isinstance(v, int) and not isinstance(v, bool)
    if pa.types.is_string(t):
        return isinstance(v, str)
    return True


def _file_why_not(f: ResolvedFile, want: dict[str, pa.DataType]) -> str | None:
    """Does the file hold what its manifest entry and the version say? Spark's
    reader would find a file by its size and trust its types; the workers
    check rows and convert types themselves."""
    try:
        size = os.path.getsize(f.uri)
        meta = pq.read_metadata(f.uri)
    except (OSError, pa.ArrowException) as e:
        return f"data file {f.key} cannot be opened: {e}"
    if size != f.entry.size_bytes:
        return f"data file {f.key} is {size} bytes, the manifest says {f.entry.size_bytes}"
    if meta.num_rows != f.total_rows:
        return f"data file {f.key} holds {meta.num_rows} rows, the manifest says {f.total_rows}"
    groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    if f.row_group_rows is not None and groups != tuple(f.row_group_rows):
        # Row-group deletes became positions by the manifest's row groups.
        return f"data file {f.key} holds row groups of {list(groups)} rows, the manifest says {list(f.row_group_rows)}"
    physical = meta.schema.to_arrow_schema()
    for n, t in want.items():
        i = physical.get_field_index(n)
        if i >= 0 and physical.field(i).type != t:
            return f"data file {f.key} holds {n!r} as {physical.field(i).type}, the version as {t}"
    return None


def _read_columns(snap: Snapshot, names: list[str]) -> list[str]:
    """``names``, and the primary key where key ranges are tested on it."""
    pk = snap.primary_key
    if pk and pk not in names and any(f.key_ranges for f in snap.files):
        return [*names, pk]
    return list(names)


def _bitset(deleted: AbstractBitMap, rows: int) -> np.ndarray:
    """The positions of a bitmap as 64-bit words: bit i of word j is row 64*j + i."""
    bits = np.zeros(-(-rows // 64) * 64, dtype=bool)
    bits[np.frombuffer(deleted.to_array(), dtype=np.uint32)] = True
    return np.packbits(bits, bitorder="little").view(np.int64)


def _bitsets(spark: SparkSession, dirty: list[ResolvedFile]) -> DataFrame:
    """One broadcast row per file with deletes: its size and its deleted
    positions as a bitset (NULL where it has only key ranges)."""
    words = [_bitset(f.deleted, f.total_rows) if f.deleted else None for f in dirty]
    sizes = pa.array([f.entry.size_bytes for f in dirty], pa.int64())
    return spark.createDataFrame(pa.table({_KEY: sizes, _WORDS: pa.array(words, pa.list_(pa.int64()))}))


def _key_ranges(spark: SparkSession, dirty: list[ResolvedFile], key_t: pa.DataType) -> DataFrame:
    """One broadcast row per key range: its file's size and its bounds."""
    from pyspark.sql.types import LongType, StructField, StructType

    ranged = [(f.entry.size_bytes, key_bound(a, key_t), key_bound(b, key_t)) for f in dirty for a, b in f.key_ranges]
    sizes, lo, hi = zip(*ranged, strict=True)
    table = pa.table({_KEY: pa.array(sizes, pa.int64()), _LO: pa.array(lo, key_t), _HI: pa.array(hi, key_t)})
    # The key's own Spark type: a naive timestamp must stay TIMESTAMP_NTZ, or
    # Spark compares it through the session's time zone.
    kt = spark_type(key_t)
    schema = StructType([StructField(_KEY, LongType()), StructField(_LO, kt), StructField(_HI, kt)])
    return spark.createDataFrame(table, schema)


def _jvm_deleted(spark: SparkSession, dirty: list[ResolvedFile], size: Column, pos: Column) -> Column | None:
    """ "This row is deleted", tested in the tasks by :class:`castsql.spark.jvm.Deleted`
    over a broadcast of the bitsets; None where castsql-spark.jar cannot reach them."""
    from pyspark.sql import Column

    from castsql.spark.jvm.loader import ship_jar

    if not ship_jar(spark):
        return None
    parts = [np.array([sum(1 for f in dirty if f.deleted)], np.int64)]
    for f in dirty:
        if f.deleted:  # a file with only key ranges has no bitset: no row of it is deleted here
            words = _bitset(f.deleted, f.total_rows)
            parts += [np.array([f.entry.size_bytes, len(words)], np.int64), words]
    blob = np.concatenate(parts).astype("<i8").tobytes()
    jvm: Any = spark.sparkContext._jvm  # py4j: untyped, and set once the session runs
    return Column(jvm.castsql.spark.jvm.Deleted.column(spark._jsparkSession, bytearray(blob), size._jc, pos._jc))


def _not_in_bitset(pos: Column, words: Column) -> Column:
    """True for a row whose position's bit is not set (a NULL bitset: the row stays)."""
    from pyspark.sql import functions as F

    word = F.try_element_at(words, F.shiftright(pos, 6).cast("int") + 1)
    return ~F.coalesce(F.getbit(word, pos.bitwiseAND(63).cast("int")) == 1, F.lit(False))


def read_native(spark: SparkSession, storage: Storage, snap: Snapshot, names: list[str]) -> DataFrame:
    """The live rows of ``snap``'s columns ``names`` through Spark's Parquet
    reader (where :func:`why_not` gives None).

    Example::

        >>> snap = resolve(TableLog(storage), 3)                               # doctest: +SKIP
        >>> read_native(spark, storage, snap, snap.schema.names).count()       # doctest: +SKIP
        1204
    """
    from pyspark.sql import functions as F

    def schema_of(cols: list[str]) -> Any:
        return spark_schema(Schema(tuple(snap.schema.column(n) for n in cols)))  # type: ignore[misc]

    def scan(files: list, cols: list[str]) -> DataFrame:
        # CastSQL's files hold proleptic Gregorian dates and times (pyarrow's);
        # Spark would refuse ancient ones from a writer it does not know.
        reader = spark.read.schema(schema_of(cols)).option("datetimeRebaseMode", "CORRECTED")
        return reader.option("int96RebaseMode", "CORRECTED").parquet(*(f.uri for f in files))

    clean = [f for f in snap.files if not f.has_deletes]
    dirty = [f for f in snap.files if f.has_deletes]
    if not dirty:
        if clean:
            return scan(clean, names)
        return spark.createDataFrame([], schema_of(names))
    # Only files with deletes pay for the row positions and the lookup.
    cols = _read_columns(snap, names)
    raw = scan(dirty, cols)
    meta = raw.metadataColumn("_metadata")
    rows = raw.select(*(raw[quote(n)] for n in cols), meta["row_index"].alias(_POS), meta["file_size"].alias(_SIZE))
    deleted = _jvm_deleted(spark, dirty, rows[_SIZE], rows[_POS]) if JVM_FILTER else None
    if deleted is not None:
        live = rows.where(~deleted)
    else:  # no jar for the tasks: a hash join on the size finds each row's bitset
        bits = _bitsets(spark, dirty)
        joined = rows.join(F.broadcast(bits), rows[_SIZE] == bits[_KEY])
        live = joined.where(_not_in_bitset(joined[_POS], joined[_WORDS]))
    if any(f.key_ranges for f in dirty):
        # An anti-join, not a lambda over an array of ranges: Spark 4.1 loses
        # a lambda's outer column when nothing else selects it.
        pk = snap.primary_key
        ranges = _key_ranges(spark, dirty, type_from_name(snap.schema.column(pk).type))  # type: ignore[union-attr, arg-type]
        key = live[quote(pk)]  # type: ignore[arg-type]
        hit = (live[_SIZE] == ranges[_KEY]) & (key >= ranges[_LO]) & (key <= ranges[_HI])
        live = live.join(F.broadcast(ranges), hit, "left_anti")  # a NULL key is in no range
    out = live.select(*(rows[quote(n)] for n in names))
    return scan(clean, names).unionByName(out) if clean else out
