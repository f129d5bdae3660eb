"""The write half of ``format("castsql")``: ``df.write.format("castsql").save(uri)``
and ``df.writeStream.format("castsql")``.

The write is planned on the driver (:func:`plan_write`: options, schema,
keys, the table's head). Every task attempt writes its own data files (fresh
names) and sends their manifest entries to the driver in its commit message
(:func:`write_attempt`); the driver's ``commit`` puts exactly those entries
in one new version (:func:`commit_files`). Files of failed or denied
attempts are in no commit message and so in no version: they are orphans
for :func:`castsql.spark.gc`. The JVM data source (:mod:`castsql.spark.bridge`)
plans and commits its writes with the same functions.

This module imports pyspark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from castsql.errors import CommitConflict
from castsql.format import Schema, TableLog
from castsql.format.manifest import added_summary
from castsql.spark.datasource_options import (
    bool_option,
    check_known,
    get_option,
    int_option,
    option_spelling,
    s3_config,
    table_path,
)
from castsql.spark.errors import BadOption
from castsql.spark.tasks import TableRef
from castsql.storage import Storage, open_storage
from castsql.write.pipeline import last_batch


@dataclass
class FilesWritten(WriterCommitMessage):
    """What one task attempt wrote: manifest entries as JSON."""

    entries: list[str]


@dataclass(frozen=True)
class WritePlan:
    """What every task of a write needs, decided on the driver when the write is planned."""

    ref: TableRef
    row_group_size: int
    target_file_bytes: int
    overwrite: bool
    primary_key: str | None
    exists: bool
    # mergeSchema: the schema this write gives the table (None: the table's stays).
    new_schema: Schema | None = None
    # allowDuplicateKeys: commit rows whose primary key is NULL, repeated or already live.
    allow_duplicate_keys: bool = False
    # txnAppId / txnVersion (Delta's idempotent writes): the batch's name, and
    # whether the table had it already when the write was planned (then no task writes).
    txn: tuple[str, int] | None = None
    replayed: bool = False


def plan_write(options: Any, spark_struct: StructType, overwrite: bool) -> WritePlan:
    from castsql.errors import SchemaMismatch, TableNotFound
    from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
    from castsql.spark.types import schema_from_spark

    check_known(options)
    uri = table_path(options)
    if get_option(options, "versionAsOf") is not None or get_option(options, "timestampAsOf") is not None:
        raise BadOption("format('castsql'): versionAsOf and timestampAsOf are read options; a write adds a version")
    pk = get_option(options, "primaryKey") or None
    rgs = int_option(options, "rowGroupSize", 1) or DEFAULT_ROW_GROUP_SIZE
    tfb = int_option(options, "targetFileBytes", 1) or DEFAULT_TARGET_FILE_BYTES
    merge_schema = bool_option(options, "mergeSchema")
    allow_dupes = bool_option(options, "allowDuplicateKeys")
    storage = open_storage(uri, s3=s3_config(options))
    schema = schema_from_spark(spark_struct)
    if pk is not None and schema.column(pk) is None:
        # Spark names columns without case, and a schema holds no two names equal but
        # for case, so option("primaryKey", "ID") can only mean column id.
        pk = next((n for n in schema.names if n.lower() == pk.lower()), pk)
    if pk is not None and schema.column(pk) is None:
        raise SchemaMismatch(f"{storage.root}: primaryKey {pk!r} is not a column of the data {schema.names}")
    try:
        current = TableLog(storage).latest()
    except TableNotFound:
        current = None
    new_schema = None
    if current is not None:
        if pk is not None and pk.lower() != (current.primary_key or "").lower():
            raise SchemaMismatch(f"{storage.root}: the table's primary key is {current.primary_key!r}, not {pk!r}")
        target = current.schema
        if merge_schema:  # new columns added, allowed widenings made, in this version (FORMAT.md §3.4)
            from castsql.format.evolution import merged

            where = f"table {storage.root}: write with mergeSchema"
            target = merged(current.schema, schema.to_arrow(), where, current.primary_key)
            new_schema = target if target != current.schema else None
        _check_schema(storage.root, target, schema, current.primary_key)
        schema, pk = target, current.primary_key  # the files take the table's column order and types
    ref = TableRef(storage.root, getattr(storage, "config", None), schema.to_json(), pk)
    txn = _txn(options)
    replayed = txn is not None and current is not None and last_batch(TableLog(storage), *txn) >= txn[1]
    return WritePlan(ref, rgs, tfb, overwrite, pk, current is not None, new_schema, allow_dupes, txn, replayed)


def _txn(options: Any) -> tuple[str, int] | None:
    """Delta's ``txnAppId`` and ``txnVersion`` options: a batch write's name (both, or neither)."""
    app, version = get_option(options, "txnAppId"), int_option(options, "txnVersion")
    if (app is None) != (version is None):
        raise BadOption("format('castsql'): give txnAppId and txnVersion together (a batch's name), or neither")
    if app is None or version is None:
        return None
    if not app.strip():
        raise BadOption("format('castsql'): txnAppId must not be empty")
    return app, version


def _check_schema(root: str, table: Schema, data: Schema, primary_key: str | None = None) -> None:
    """The data's columns must be the table's, of types that fit them: one line
    naming the first difference. A table column the data lacks is written as
    NULL (FORMAT.md §3.4, Delta's rule), except the primary key."""
    from castsql.errors import SchemaMismatch

    have = {c.name: c.type for c in data.columns}
    for c in table.columns:
        if c.name not in have and c.name == primary_key:
            raise SchemaMismatch(
                f"{root}: the data has no column {c.name} ({c.type}), the table's primary key (every row needs "
                "its key; other missing columns are stored as NULL); nothing was written"
            )
    for c in data.columns:
        want = table.column(c.name)
        if want is None:
            raise SchemaMismatch(
                f"{root}: column {c.name} ({c.type}) is not in the table {table.names} "
                "(option mergeSchema=true adds it)"
            )
    # The one type rule of every writer (castsql.format.evolution.fits): lossless widenings only.
    from castsql.format.evolution import fits, refusal

    have_types, want_types = data.to_arrow(), table.to_arrow()
    for f in want_types:
        if f.name not in have:
            continue  # written as NULL
        src = have_types.field(f.name).type
        if not fits(src, f.type):
            text = str(refusal(f"{root}: written data", f.name, src, f.type))
            raise SchemaMismatch(option_spelling(text))


def write_attempt(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> FilesWritten:
    """One task attempt: its batches into new data files (names of its own), their entries out."""
    from castsql.format import write_data_files

    if plan.replayed:
        return FilesWritten([])  # the table has this txnVersion already: nothing to write

    files = write_data_files(
        plan.ref.storage(),
        batches,
        plan.ref.schema,
        row_group_size=plan.row_group_size,
        target_file_bytes=plan.target_file_bytes,
        fill_missing=True,  # table columns the data lacks (checked at planning: never the primary key)
    )
    return FilesWritten([json.dumps(f.to_json()) for f in files])


def commit_files(
    plan: WritePlan,
    messages: Sequence[WriterCommitMessage | None],
    summary: dict[str, Any] | None = None,
) -> Any:
    """The driver's commit: one version with exactly the files named in ``messages``
    (an overwrite also removes every file and tombstone of the version it replaces)."""
    from castsql.format import DataFile

    storage = plan.ref.storage()
    files = tuple(
        DataFile.from_json(json.loads(e), "castsql write task")
        for m in messages
        if isinstance(m, FilesWritten)
        for e in m.entries
    )
    from castsql.spark.appends import commit_unique, discard_files, written_keys
    from castsql.write.keys import DuplicateKey, check_input_keys

    keys = None
    if not plan.exists and plan.primary_key is not None and files and not plan.allow_duplicate_keys:
        # A first write's keys are checked before version 0 exists: refused,
        # it leaves no table behind (SPARK.md), and the same write can be retried.
        keys = written_keys(TableLog(storage), list(files), plan.primary_key, plan.ref.schema)
        try:
            check_input_keys(storage.root, plan.primary_key, keys, "overwrite" if plan.overwrite else "append")
        except DuplicateKey:
            discard_files(TableLog(storage), list(files))
            raise
    log = _open_or_create(storage, plan)
    summary = dict(summary or {})
    summary.update(added_summary(files))
    pk = log.latest().primary_key
    if pk != plan.primary_key:
        keys = None  # another writer created the table meanwhile, with its own key
    if pk is not None and files and not plan.allow_duplicate_keys:
        # The keys rule of every writer (castsql.write.keys), on the keys read
        # back from exactly the files this commit names; refused files are removed.
        try:
            if not plan.overwrite:
                return commit_unique(log, list(files), plan.ref.schema, plan.new_schema, summary, pk, keys=keys)
            if keys is None:
                keys = written_keys(log, list(files), pk, plan.ref.schema)
            check_input_keys(storage.root, pk, keys, "overwrite")
        except (DuplicateKey, CommitConflict):
            discard_files(log, list(files))
            raise
    if not plan.overwrite:
        if not files and not summary.get("stream_query"):
            return log.latest()
        from castsql.write import pipeline

        return pipeline.append(log, storage.root, files, schema=plan.ref.schema, new_schema=plan.new_schema,
                               summary=summary)  # fmt: skip
    from castsql.write.commit import commit_overwrite

    return commit_overwrite(log, files, schema=plan.ref.schema, new_schema=plan.new_schema, summary=summary)


def commit_write(plan: WritePlan, messages: Sequence[WriterCommitMessage | None]) -> None:
    """A batch write's commit. With ``txnAppId``/``txnVersion`` (Delta's
    idempotent writes) it is recorded as that app's batch, and a batch the
    table already holds (planned as such, or committed since by a retried
    job) commits nothing: its files, if any, stay orphans for GC."""
    txn = plan.txn
    if txn is None:
        commit_files(plan, messages)
        return
    if plan.replayed or (plan.exists and last_batch(TableLog(plan.ref.storage()), *txn) >= txn[1]):
        return
    commit_files(plan, messages, {"stream_query": txn[0], "stream_batch": txn[1]})


def _open_or_create(storage: Storage, plan: WritePlan) -> TableLog:
    from castsql.errors import SchemaMismatch

    if plan.exists:
        # The commit checks the files against the head's schema (a mergeSchema
        # plan's schema is the table's plus its new columns: not "the same table").
        return TableLog(storage)
    log = TableLog.create(storage, plan.ref.schema, primary_key=plan.primary_key, exist_ok=True)
    latest = log.latest()
    if not plan.exists:
        # Created by someone else since planning: the same checks as at planning.
        _check_schema(storage.root, latest.schema, plan.ref.schema, latest.primary_key)
        if plan.primary_key is not None and latest.primary_key != plan.primary_key:
            raise SchemaMismatch(f"{storage.root}: the table's primary key is {latest.primary_key!r}")
    return log


class CastSQLWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return write_attempt(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_write(self.plan, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # The files of the attempts are in no version; GC removes them after its grace period.
        pass


def stream_query(options: Any) -> str:
    """The name a stream's micro-batches are recorded under: ``queryId``,
    else its checkpoint location, else the table's path."""
    return get_option(options, "queryId") or get_option(options, "checkpointLocation") or table_path(options)


class CastSQLStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch one version, recorded with its query and batch id:
    a batch already committed (a restart replaying it) is never committed again."""

    def __init__(self, plan: WritePlan, query: str) -> None:
        self.plan = plan
        self.query = query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return write_attempt(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        storage = self.plan.ref.storage()
        log = _open_or_create(storage, self.plan)
        if last_batch(log, self.query) >= batchId:
            return  # committed before a restart: the replay's files stay orphans
        commit_files(self.plan, messages, {"stream_query": self.query, "stream_batch": batchId})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
