"""``spark.read.format("castsql")`` and ``df.write.format("castsql")`` as a
Python data source (PySpark ≥ 4.0's ``pyspark.sql.datasource``): what
:func:`castsql.spark.register` registers where the JVM data source
(:mod:`castsql.spark.bridge`, rows never leaving the JVM) is not built.

Registered, it reads and writes as::

    spark.read.format("castsql").option("versionAsOf", 3).load("s3://bucket/events")
    spark.read.format("castsql").option("timestampAsOf", "2025-06-01T00:00:00Z").load(uri)
    df.write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    df.write.format("castsql").mode("append").option("mergeSchema", "true").save(uri)

This module holds the class Spark registers, :class:`CastSQLDataSource`;
its halves are modules of their own, sharing the option helpers:

- :mod:`castsql.spark.datasource_read`: the version a load pins, input
  partitions of row groups, the readers (and pruning by pushed filters);
- :mod:`castsql.spark.datasource_write`: a write's plan, each task attempt's
  files, the driver's commit of exactly those files, batch and stream;
- :mod:`castsql.spark.datasource_options`: the options, checked the same
  way by both halves and by the JVM data source.

The names the halves hold are importable from here too, as they were when
this module held them.

Nothing here runs on import of :mod:`castsql.spark`; this module imports
pyspark.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from castsql.spark.datasource_options import (
    KNOWN,
    READ_OPTIONS,
    S3_OPTIONS,
    SPARK_OPTIONS,
    WRITE_OPTIONS,
    BadOption,
    option_spelling,
    s3_config,
)
from castsql.spark.datasource_read import (
    PRUNE_PUSHED_FILTERS,
    CastSQLPartition,
    CastSQLPushdownReader,
    CastSQLReader,
    make_reader,
    pinned,
    plan_partitions,
    predicates,
    resolve_read,
    row_group_may_match,
    version_at_time,
)
from castsql.spark.datasource_write import (
    CastSQLStreamWriter,
    CastSQLWriter,
    FilesWritten,
    WritePlan,
    commit_files,
    commit_write,
    last_batch,
    plan_write,
    stream_query,
    write_attempt,
)
from castsql.spark.types import spark_schema
from castsql.spark.units import Splits

__all__ = [
    "KNOWN", "NAME", "PRUNE_PUSHED_FILTERS", "READ_OPTIONS", "S3_OPTIONS", "SPARK_OPTIONS", "WRITE_OPTIONS",
    "BadOption", "CastSQLDataSource", "CastSQLPartition", "CastSQLPushdownReader", "CastSQLReader",
    "CastSQLStreamWriter", "CastSQLWriter", "FilesWritten", "WritePlan", "commit_files", "commit_write",
    "for_session", "last_batch", "option_spelling", "plan_partitions", "predicates", "resolve_read",
    "row_group_may_match", "s3_config", "version_at_time", "write_attempt",
]  # fmt: skip

NAME = "castsql"


class CastSQLDataSource(DataSource):
    """``format("castsql")``: see the module's documentation."""

    # How reads are cut into tasks; set on the class :func:`for_session` makes.
    splits: Splits | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._version: int | None = None
        self._schema_json: dict[str, Any] | None = None

    def schema(self) -> StructType:
        # Called once, where the DataFrame is made: the version is pinned here
        # (the instance is pickled with it to the planner).
        snap = pinned(self.options)
        self._version, self._schema_json = snap.version, snap.schema.to_json()
        return spark_schema(snap.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self._version is None:
            self.schema()
        return make_reader(self.options, self._version, self._schema_json, schema, type(self).splits or Splits.local())  # type: ignore[arg-type]

    def writer(self, schema: StructType, overwrite: bool) -> CastSQLWriter:
        return CastSQLWriter(plan_write(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> CastSQLStreamWriter:
        return CastSQLStreamWriter(plan_write(self.options, schema, overwrite), stream_query(self.options))


def for_session(splits: Splits, name: str = NAME) -> type[CastSQLDataSource]:
    """The data source class :func:`castsql.spark.register` registers where
    the JVM one (:mod:`castsql.spark.bridge`) cannot be loaded, under
    ``name``: the planner runs in a Python process of its own that cannot ask
    the session how many task slots it has, so the session's split rule rides
    on the class. Spark pickles a registered class; this one is not
    importable by name, so it travels by value, ``splits`` with it."""
    return type(
        CastSQLDataSource.__name__,
        (CastSQLDataSource,),
        {
            "splits": splits,
            "name": classmethod(lambda cls: name),
            "__module__": __name__,
            "__qualname__": CastSQLDataSource.__qualname__,
        },
    )
