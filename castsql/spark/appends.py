"""Appending a Spark DataFrame to a table: executors write, the driver commits.

A table on a local disk is written by Spark's own Parquet writer
(:mod:`castsql.spark.native_write`) where its ``why_not`` gives None. Otherwise
each task streams its partition's Arrow batches into
:func:`castsql.format.write_data_files`, which writes zstd Parquet files
(microsecond timestamps, full row groups) straight to the table's storage and
returns their manifest entries; the task yields those entries as JSON rows.
The driver collects them exactly once (every action would run the writes
again) and commits them in one version with :meth:`TableLog.append`.

Failure rules: a job that fails commits nothing; files of failed or retried
task attempts are never in the collected result and so never referenced (they
are garbage for :func:`castsql.spark.gc`).

Example::

    >>> df = spark.range(1000).selectExpr("id", "current_timestamp() AS ts")   # doctest: +SKIP
    >>> append(spark, "/data/events", df, primary_key="id").version            # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import functools
import json
from typing import TYPE_CHECKING

import pyarrow as pa

from castsql.errors import CommitConflict, SchemaMismatch, TableNotFound
from castsql.format import DataFile, Manifest, Schema, TableLog
from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.format.evolution import check_names, fits, merged, refusal
from castsql.format.layout import to_table_key
from castsql.format.properties import check_unchanged
from castsql.spark.errors import job_errors
from castsql.spark.native_write import why_not as why_not_native
from castsql.spark.native_write import write_native
from castsql.spark.tasks import TableRef, write_task
from castsql.spark.types import schema_from_spark
from castsql.storage import S3Config, open_storage
from castsql.write import pipeline
from castsql.write.keys import DuplicateKey, check_input_keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ATTEMPTS = 5  # key checks made before concurrent appends of overlapping keys give up (FORMAT.md §7)


def append(
    spark: SparkSession,
    uri: str,
    df: DataFrame,
    *,
    primary_key: str | None = None,
    s3: S3Config | None = None,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    target_file_bytes: int | None = None,
    merge_schema: bool = False,
    allow_duplicate_keys: bool = False,
    properties: dict[str, str] | None = None,
) -> Manifest:
    """Append the rows of ``df`` to the table at ``uri`` as one new version.

    The table is created (schema from ``df``, ``primary_key``, table
    ``properties``, all in version 0) if there is none; an existing table
    must already have ``primary_key`` and ``properties``. Returns the
    committed manifest; an empty ``df`` commits nothing and returns the
    latest manifest. Raises SchemaMismatch before writing anything
    if ``df`` does not fit the table (the one type rule,
    :func:`castsql.format.evolution.fits`). ``merge_schema=True`` adds the
    DataFrame's new columns (nullable, at the end) and makes allowed
    widenings, in the same version (FORMAT.md §3.4). Table columns ``df``
    lacks are written as NULL (Delta's rule), except the primary key, which
    is refused naming it.

    A table on a local disk is written by Spark's own Parquet writer, one file
    per task (``df.repartition(n)`` chooses how many), row groups of at most
    ``row_group_size`` rows. S3 tables, types Spark cannot store as they are,
    and an explicit ``target_file_bytes`` (files rolled by size) go through
    CastSQL's Python workers (:mod:`castsql.spark.native_write`).

    A table with a primary key refuses rows whose key is NULL, repeated in
    ``df`` or already live in the table (:class:`castsql.write.keys.DuplicateKey`,
    naming the first keys; nothing committed, the written files removed),
    unless ``allow_duplicate_keys=True``. The keys are read back from the new
    files on the driver; only table files whose key statistics overlap them,
    and in them only the row groups that may hold one, are read.

    Example::

        >>> s3 = S3Config(endpoint_url="http://127.0.0.1:8333")   # doctest: +SKIP
        >>> m = append(spark, "s3://bucket/events", df, s3=s3)   # doctest: +SKIP
        >>> m.summary["added_rows"]   # doctest: +SKIP
        1000000
    """
    if row_group_size <= 0 or (target_file_bytes is not None and target_file_bytes <= 0):
        raise ValueError("row_group_size and target_file_bytes must be positive")
    storage = open_storage(uri, s3=s3)
    log = TableLog(storage)
    schema = schema_from_spark(df.schema)
    if primary_key is not None and schema.column(primary_key) is None:
        raise SchemaMismatch(f"{storage.root}: primary key {primary_key!r} is not a column of the data {schema.names}")
    try:
        current = log.latest()
    except TableNotFound:
        current = None
    new_schema = None
    if current is None:
        TableLog.check_create(storage, schema, primary_key=primary_key, properties=properties)  # before the job
    else:
        schema, new_schema = _fit_table(storage.root, schema, current, primary_key, properties, merge_schema)
    with job_errors(f"{storage.root}: append"):
        if target_file_bytes is None and why_not_native(storage, schema, spark) is None:
            files = write_native(spark, storage, df, schema, row_group_size)  # type: ignore[arg-type]
        else:
            ref = TableRef(storage.root, getattr(storage, "config", None), schema.to_json())
            size = target_file_bytes or DEFAULT_TARGET_FILE_BYTES
            fn = functools.partial(write_task, ref, row_group_size, size, fill_missing=current is not None)
            rows = df.mapInArrow(fn, "entry string").collect()  # the one and only action
            files = [DataFile.from_json(json.loads(r.entry), "append task") for r in rows]
    keys = None
    if current is None:
        if primary_key is not None and files and not allow_duplicate_keys:
            # The first write's keys are checked before version 0 exists: a
            # refused first append leaves no table behind (SPARK.md, Append).
            keys = written_keys(log, files, primary_key, schema)
            try:
                check_input_keys(storage.root, primary_key, keys)
            except DuplicateKey:
                discard_files(log, files)
                raise
        # Created only now, so a failed job leaves no table behind either.
        log = TableLog.create(storage, schema, primary_key=primary_key, exist_ok=True, properties=properties)
        current = log.latest()
        if primary_key is not None and current.primary_key != primary_key:
            raise SchemaMismatch(f"{storage.root}: the table's primary key is {current.primary_key!r}")
    if not files:
        return current
    pk = current.primary_key
    if pk is None or allow_duplicate_keys:
        return pipeline.append(log, storage.root, files, schema=schema, new_schema=new_schema)
    try:
        return commit_unique(log, files, schema, new_schema, {}, pk, keys=keys)
    except (DuplicateKey, CommitConflict):
        discard_files(log, files)  # never committed: nobody can reference them
        raise


def _fit_table(
    root: str,
    schema: Schema,
    current: Manifest,
    primary_key: str | None,
    properties: dict[str, str] | None,
    merge_schema: bool,
) -> tuple[Schema, Schema | None]:
    """The schema the files of an append to the table ``current`` take (the
    table's column order and types), and the new table schema where
    ``merge_schema`` changes it; refused before the job when the data does
    not fit (the one type rule, on the driver: nothing is written)."""
    where = f"table {root}: append"
    if primary_key is not None and primary_key != current.primary_key:
        raise SchemaMismatch(f"{root}: the table's primary key is {current.primary_key!r}, not {primary_key!r}")
    check_unchanged(current.properties, properties, root)
    data = schema.to_arrow()
    target = current.schema
    new_schema = None
    if merge_schema:  # new columns added, allowed widenings made, in this version (FORMAT.md §3.4)
        target = merged(current.schema, data, where, current.primary_key)
        new_schema = target if target != current.schema else None
    # Table columns the DataFrame lacks are written as NULL, a missing primary key refused (FORMAT.md §3.4).
    missing = check_names(target, data.names, where, fill=True, primary_key=current.primary_key)
    for f in target.to_arrow():
        if f.name not in missing and not fits(data.field(f.name).type, f.type):
            raise refusal(where, f.name, data.field(f.name).type, f.type)
    return target, new_schema


def commit_unique(
    log: TableLog,
    files: list[DataFile],
    schema: Schema,
    new_schema: Schema | None,
    summary: dict,
    pk: str,
    *,
    keys: pa.Array | None = None,
) -> Manifest:
    """Commit ``files`` through the one append sequence
    (:func:`castsql.write.pipeline.append`: keys unique, non-NULL, not live).
    The keys are read back from the files just written (the key column only,
    on the driver), so the check sees exactly the rows that would be
    committed; ``keys``: read back already (a first write, checked before
    the table was created)."""
    if keys is None:
        keys = written_keys(log, files, pk, schema)
    return pipeline.append(
        log, log.storage.root, files, schema=schema, new_schema=new_schema, keys=keys, summary=summary
    )


def written_keys(log: TableLog, files: list[DataFile], pk: str, schema: Schema) -> pa.Array:
    from castsql.spark.tasks import open_parquet
    from castsql.storage.base import overlapped

    def one(f: DataFile) -> pa.ChunkedArray:
        key = to_table_key(f.path, log.storage.root, what="data file")
        return open_parquet(log.storage, key, f.size_bytes).read(columns=[pk]).column(0)

    parts = overlapped(one, files)  # each file's keys are ranged reads: they overlap
    want = schema.to_arrow().field(pk).type
    return pa.chunked_array([c for p in parts for c in p.chunks], want).combine_chunks()


def discard_files(log: TableLog, files: list[DataFile]) -> None:
    """Remove data files of a refused append (best effort: what stays is GC's garbage)."""
    for f in files:
        with contextlib.suppress(Exception):  # garbage collection removes it later
            log.storage.delete(to_table_key(f.path, log.storage.root, what="data file"))
