"""Merge (upsert) and update on Spark: one version each, tombstones plus new rows.

``merge(spark, uri, source_df, on="id")`` returns the same builder as the
embedded engine's ``castsql.Table.merge`` (:class:`castsql.write.merge.MergeBuilder`:
clauses in order, first match wins, ``execute()`` gives
:class:`~castsql.write.merge.MergeMetrics`); only the engine differs:

1. the target's live rows of the newest version, with their identity (file,
   row group, position), are read by :func:`castsql.spark.reader.read_snapshot`
   (only the columns the clauses can name) and the source DataFrame is
   registered as a temporary view;
2. the shared :func:`castsql.write.merge.actions_sql` runs in Spark SQL over
   the two views: one row per changed row, with its action (update, delete,
   insert) and how many source rows matched its target row. Types are checked
   before any job runs: the source's table columns by the one type rule
   (:func:`check_source_types`: lossless widenings only, SchemaMismatch), a
   string column compared with a number, a value of another kind than its
   column's;
3. one job counts the actions and refuses Delta's multiple-match case
   (several source rows updating or deleting one target row: MergeError
   naming up to five keys, nothing written), a number a clause computes that
   its column cannot hold unchanged, and (unless ``allow_duplicate_keys``)
   inserted primary keys that are NULL, repeated, or already live
   (:func:`_check_inserted_keys`, DuplicateKey);
4. the replaced and deleted rows' positions are turned into per-row-group
   bitmaps on the workers (:func:`positions_task`) and the shared planner
   (:func:`castsql.write.records.plan_records`) picks the tombstone records;
5. the updated and inserted rows are written by the append task
   (:func:`castsql.spark.tasks.write_task`, one collect);
6. ONE commit through :func:`castsql.write.commit.commit_dml`: the new files
   and the one tombstone file in the same version. On a CommitConflict
   (docs/FORMAT.md §7) everything is planned again from the new head, up to
   ``attempts`` times; the files of a lost attempt are garbage for GC.

``update(spark, uri, set={"v": "v * 2"}, where="kind = 'x'")`` is the same
without a source: the delete's job (:func:`castsql.spark.deleter.plan_delete`:
workers summarize each row group, key ranges where exact) picks the
tombstones, a second job over the same version writes the matched rows with
the new values, one commit.

Example::

    >>> m = (merge(spark, "/data/events", changes_df, on="id")            # doctest: +SKIP
    ...      .when_matched_update_all().when_not_matched_insert_all().execute())
    >>> m.num_target_rows_updated, m.num_target_rows_inserted, m.version   # doctest: +SKIP
    (5000, 5000, 7)
"""

from __future__ import annotations

import array
import base64
import functools
import json
import math
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from castsql.errors import CastSQLError, SchemaMismatch
from castsql.format import DataFile, Manifest, Schema, TableLog
from castsql.format.evolution import fits, merged, rebase, refusal, widens
from castsql.format.manifest import json_stat
from castsql.format.schema import type_from_name
from castsql.format.tombstone import serialize_tombstones
from castsql.format.writer import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.snapshot import Snapshot, resolve
from castsql.spark.types import quote
from castsql.storage import S3Config, open_storage
from castsql.write.commit import commit_dml, with_retries
from castsql.write.keys import check_input_keys, check_written_keys
from castsql.write.merge import (
    ACTION_COL,
    ACTION_DELETE,
    ACTION_INSERT,
    ACTION_UPDATE,
    MATCHES_COL,
    OLD_KEY_COL,
    MergeBuilder,
    MergeError,
    MergeMetrics,
    MergeSpec,
    actions_sql,
    inserts_unmatched,
    moves_keys,
    validate,
)
from castsql.write.records import FILE_COL, POS_COL, RG_COL, plan_records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

__all__ = ["cdc_merge", "merge", "update"]

ROWS_PER_TASK = 500_000  # new rows per output task of a merge: a few large files, not one per shuffle partition


# ---------------------------------------------------------------------- worker side


def positions_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: (file, row group, position) of the replaced and deleted
    rows in, one JSON unit ``{"key", "rg", "matched", "bitmap"}`` per (file,
    row group) out. The driver adds each unit's live count from the snapshot
    (no second read of the table)."""
    acc: dict[tuple[str, int], list[np.ndarray]] = defaultdict(list)
    for b in batches:
        if b.num_rows == 0:
            continue
        t = pa.Table.from_batches([b])
        for (key, rg), idx in _groups(t):
            acc[(key, rg)].append(t.column(POS_COL).take(idx).to_numpy())
    out = []
    for (key, rg), parts in acc.items():
        pos = np.unique(np.concatenate(parts)).astype(np.uint32)
        bm = BitMap(array.array("I", pos.tobytes()))
        bm.run_optimize()
        out.append(
            json.dumps({"key": key, "rg": rg, "matched": len(bm), "bitmap": base64.b64encode(bm.serialize()).decode()})
        )
    if out:
        yield pa.RecordBatch.from_pydict({"unit": out})


def _groups(t: pa.Table) -> Iterator[tuple[tuple[str, int], pa.Array]]:
    keys = t.select([FILE_COL, RG_COL]).group_by([FILE_COL, RG_COL], use_threads=False)
    for row in keys.aggregate([]).to_pylist():
        mask = pc.and_(pc.equal(t.column(FILE_COL), row[FILE_COL]), pc.equal(t.column(RG_COL), row[RG_COL]))
        yield (row[FILE_COL], int(row[RG_COL])), pc.indices_nonzero(mask)


# ---------------------------------------------------------------------- driver side


def _plan_from_positions(spark: SparkSession, log: TableLog, snap: Snapshot, hit: DataFrame, what: str) -> Any:
    """The tombstone plan deleting the rows ``hit`` (FILE_COL, RG_COL, POS_COL) names."""
    from castsql.spark.errors import job_errors
    from castsql.spark.reader import file_row_groups

    with job_errors(f"{log.uri}: {what}"):
        rows = hit.repartition(FILE_COL, RG_COL).mapInArrow(positions_task, "unit string").collect()
    files = {f.key: f for f in snap.files}
    per_file: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        u = json.loads(r.unit)
        f = files[u["key"]]
        rgs = file_row_groups(log, f)
        start = sum(rgs[: u["rg"]])
        end = start + rgs[u["rg"]]
        u["live"] = rgs[u["rg"]] - (f.deleted.range_cardinality(start, end) if f.deleted else 0)
        per_file[u["key"]].append(u)
    return plan_records(per_file, (f.key for f in snap.files), pk_ok=False, version=snap.version)


def _write_rows(log: TableLog, snap: Snapshot, df: DataFrame, what: str, rgs: int, tfb: int) -> list[DataFile]:
    """Write ``df`` (the table's columns) with the append task; one collect."""
    from castsql.spark.errors import job_errors
    from castsql.spark.reader import table_ref
    from castsql.spark.tasks import write_task

    fn = functools.partial(write_task, table_ref(log, snap), rgs, tfb)
    with job_errors(f"{log.uri}: {what}"):
        rows = df.mapInArrow(fn, "entry string").collect()
    return [DataFile.from_json(json.loads(r.entry), f"{what} task") for r in rows]


def _arrow_of(t: DataType) -> pa.DataType | None:
    """The Arrow type of Spark type ``t`` as a writer stores it (None: none)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(t, timestamp_utc=True)
    except Exception:  # arrays, maps, intervals…: no table column takes them
        return None


def check_source_types(source: DataFrame, schema: Schema, where: str) -> None:
    """The one type rule (:func:`castsql.format.evolution.fits`, FORMAT.md
    §3.4) for the source's columns that are table columns (by name, any
    case), as the embedded merge applies it: only lossless widenings
    (``int`` into ``bigint``); a double into a BIGINT column, a BIGINT into an
    INT one or a string into a number is refused naming the column and both
    types, before any job runs."""
    types = {c.name.lower(): c for c in schema.columns}
    for field in source.schema.fields:
        col = types.get(field.name.lower())
        if col is None:
            continue
        want = type_from_name(col.type)
        got = _arrow_of(field.dataType)
        if got is None:
            raise SchemaMismatch(
                f"{where}: column {col.name!r} is {field.dataType.simpleString()} in the data, the table has "
                f"{want} (only lossless widenings are accepted); nothing was written"
            )
        if not fits(got, want):
            raise refusal(where, col.name, got, want)


# A value a clause computes whose type does not fit its column (a SQL
# expression's number): (column, Spark type of the value, column's Spark
# type, the expression's text or None, the Column giving the value as text
# where the conversion would change it, else NULL).
Lossy = tuple[str, "DataType", "DataType", "str | None", "Column"]


def _fits_value(got: DataType, want: pa.DataType) -> bool:
    """May the value of a clause (of Spark type ``got``) be stored in a column
    of ``want`` as it is? The one type rule, and (as before) a timestamp of
    either kind in a timestamp column: Spark converts between them in the
    session's time zone (UTC in CastSQL's sessions)."""
    src = _arrow_of(got)
    if src is not None and fits(src, want):
        return True
    return type(got).__name__.startswith("Timestamp") and pa.types.is_timestamp(want)


def _cast_columns(
    df: DataFrame, snap: Snapshot, table: str, what: str, texts: Mapping[str, str]
) -> tuple[list[Column], list[Lossy]]:
    """``df``'s table columns cast to the table's types, after checking that
    each fits (one line naming the table, the column and both types if not).

    The source's columns are checked before (:func:`check_source_types`:
    their types must fit). A number that a SQL expression of a clause
    computes in another numeric type (``0`` into a SMALLINT column,
    ``target.n / 2`` into a BIGINT one) is stored only where the conversion
    changes no value: the second list gives, per such column, a Column that
    is the value as text where it would change (a fraction dropped, an
    overflow, digits lost), for :func:`_refuse_lossy` before anything is
    written."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType

    from castsql.spark.types import spark_type

    out: list[Column] = []
    lossy: list[Lossy] = []
    for f in snap.schema.to_arrow():
        want = spark_type(f.type)
        got = df.schema[f.name].dataType
        col = F.col(quote(f.name))
        source = texts.get(f.name.lower())
        if _fits_value(got, f.type):
            out.append(col.cast(want).alias(f.name))
        elif isinstance(got, NumericType) and isinstance(want, NumericType):
            stored = col.try_cast(want)
            changed = col.isNotNull() & (stored.isNull() | ~stored.cast(got).eqNullSafe(col))
            lossy.append((f.name, got, want, source, F.when(changed, col.cast("string"))))
            out.append(stored.alias(f.name))
        else:
            value = f"the value {source!r}" if source else "the source's value"
            raise MergeError(
                f"table {table}: {what}: column {f.name} is {want.simpleString()}, and {value} is "
                f"{got.simpleString()} (CAST it explicitly)"
            )
    return out, lossy


def _refuse_lossy(table: str, what: str, lossy: list[Lossy], examples: Sequence[Any]) -> None:
    """MergeError for the first column of ``lossy`` whose example (a value as
    text that its conversion would change, or None) is not None."""
    for (name, got, want, source, _), value in zip(lossy, examples, strict=True):
        if value is None:
            continue
        expr = f"the value {source!r}" if source else "the source's value"
        raise MergeError(
            f"table {table}: {what}: column {name} is {want.simpleString()}, and {expr} is {got.simpleString()}: "
            f"{value} cannot be stored as {want.simpleString()} unchanged (CAST it explicitly to convert); "
            "nothing was committed"
        )


def evolve_snapshot(snap: Snapshot, schema: Schema, where: str) -> Snapshot:
    """``snap`` seen through ``schema``, the schema a ``merge_schema`` write
    gives it (itself when that is its own): added columns carry ``added_in``
    (the next version), so its files, which lack them, read NULL there, and
    widened columns read in the wider type, as the committed version will."""
    if schema == snap.schema:
        return snap
    provisional = rebase(snap.schema, schema, snap.version + 1, where)
    return Snapshot(
        snap.table_uri, snap.version, snap.manifest.evolve(schema=provisional), snap.files, snap.primary_key
    )


def _analysis(table: str, what: str, e: Exception) -> MergeError:
    from castsql.spark.errors import spark_message

    return MergeError(f"table {table}: {what}: {spark_message(e)}; nothing was committed")


def merge(
    spark: SparkSession,
    uri: str,
    source: DataFrame,
    on: str | list[str] | tuple[str, ...] = "id",
    *,
    source_alias: str = "source",
    target_alias: str = "target",
    s3: S3Config | None = None,
    attempts: int = 5,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    merge_schema: bool = False,
    allow_duplicate_keys: bool = False,
) -> MergeBuilder:
    """A merge of the Spark DataFrame ``source`` into the table at ``uri``,
    run by Spark: add clauses, then ``execute()`` (see the module docs).

    ``on``: key column names (``"id"``, ``"id, day"`` or a list) or a SQL
    predicate over the aliases ``target`` and ``source``. Raises TableNotFound
    at once if there is no table at ``uri``.

    ``merge_schema=True`` (the embedded engine's and Delta's ``mergeSchema``):
    the source's columns the table lacks are added (nullable, at the end, of
    the source's type) and columns whose source type is an allowed widening
    are widened, in the version the merge commits (FORMAT.md §3.4); target
    rows the merge leaves alone read NULL in an added column.

    The source's columns that are table columns must fit them losslessly
    (the one type rule, :func:`castsql.format.evolution.fits`: ``int`` into
    ``bigint``; a double into a BIGINT column is SchemaMismatch naming the
    column and both types), before any job runs. On a table with a primary
    key, inserted rows whose key is NULL, repeated among the inserts, or
    (when the inserted key is not the source's ``on`` key) already live in
    the table are refused (:class:`castsql.write.keys.DuplicateKey`, naming
    the first keys; nothing written) unless ``allow_duplicate_keys=True``.

    Example::

        >>> (merge(spark, "s3://bucket/events", df, on="id", s3=s3)                    # doctest: +SKIP
        ...  .when_matched_delete(condition="source.op = 'D'")
        ...  .when_matched_update_all()
        ...  .when_not_matched_insert_all(condition="source.op <> 'D'")
        ...  .execute()).version
        8
    """
    log = TableLog(open_storage(uri, s3=s3))
    log.latest()  # no table here: TableNotFound now, not at execute()

    def run(spec: MergeSpec, src: Any) -> MergeMetrics:
        return _execute_merge(
            spark,
            log,
            spec,
            src,
            attempts,
            row_group_size,
            target_file_bytes,
            merge_schema=merge_schema,
            allow_duplicate_keys=allow_duplicate_keys,
        )

    return MergeBuilder(log.uri, source, on, run, source_alias=source_alias, target_alias=target_alias)


def cdc_merge(
    spark: SparkSession,
    uri: str,
    batch: DataFrame,
    *,
    key: str | list[str] | tuple[str, ...],
    op_column: str,
    sequence: str | None = None,
    delete_values: tuple[str, ...] = ("D", "delete"),
    s3: S3Config | None = None,
    attempts: int = 5,
    query: str | None = None,
    batch_id: int | None = None,
) -> MergeMetrics:
    """Apply one CDC batch (rows with the table's columns plus ``op_column``)
    as one version: a key whose last change is a delete (``op_column`` in
    ``delete_values``) is deleted, any other change replaces the row or
    inserts it (:func:`castsql.write.cdc.cdc_merge_spec`, the embedded
    engine's ``apply_cdc`` spec). With ``sequence``, a key changed several
    times in the batch takes the change with the highest ``sequence`` (a
    window in Spark); without it, keys must be unique in the batch.

    From ``foreachBatch``, pass ``query`` (a name of the stream, stable across
    restarts: its checkpoint location will do) and ``batch_id`` (the one
    ``foreachBatch`` gives): the version records both, and a batch the table
    already has for that query (a restart replaying it) commits nothing
    (``version`` None, ``extra["skipped_batch"]`` True): exactly once, as
    ``writeStream.format("castsql")`` does.

    Example::

        >>> cdc_merge(spark, "/data/users", feed_df, key="id", op_column="op", sequence="lsn").version  # doctest: +SKIP
        12
        >>> def apply(df, batch_id):  # doctest: +SKIP
        ...     cdc_merge(df.sparkSession, "/data/users", df, key="id", op_column="op",
        ...               query="users-cdc", batch_id=batch_id)
        >>> feed.writeStream.foreachBatch(apply).option("checkpointLocation", ck).start()  # doctest: +SKIP
    """
    import time

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from castsql.write.cdc import cdc_merge_spec

    keys = [key] if isinstance(key, str) else list(key)
    if sequence is not None:
        w = Window.partitionBy(*map(quote, keys)).orderBy(F.col(quote(sequence)).desc())
        batch = batch.withColumn("_castsql_rank", F.row_number().over(w)).where("_castsql_rank = 1")
        batch = batch.drop("_castsql_rank")
    if (query is None) != (batch_id is None):
        raise MergeError(f"{uri}: cdc_merge: give query and batch_id together (from foreachBatch), or neither")
    stream = (str(query), int(batch_id)) if query is not None and batch_id is not None else None
    log = TableLog(open_storage(uri, s3=s3))
    spec = cdc_merge_spec(keys, op_column, delete_values, quote=quote)
    started = time.perf_counter()
    metrics = _execute_merge(
        spark, log, spec, batch, attempts, DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES, stream=stream
    )
    metrics.execution_time_ms = int((time.perf_counter() - started) * 1000)
    return metrics


def _execute_merge(
    spark: SparkSession,
    log: TableLog,
    spec: MergeSpec,
    source: DataFrame,
    attempts: int,
    rgs: int,
    tfb: int,
    *,
    stream: tuple[str, int] | None = None,
    merge_schema: bool = False,
    allow_duplicate_keys: bool = False,
) -> MergeMetrics:
    """``stream``: (query, batch id) recorded in the commit; a batch the table
    already has for that query commits nothing (``extra["skipped_batch"]``).
    ``merge_schema``: the source's new columns added, widenings made;
    ``allow_duplicate_keys``: inserted keys not checked (see :func:`merge`)."""
    from pyspark import StorageLevel
    from pyspark.errors import AnalysisException
    from pyspark.sql import DataFrame as SparkDataFrame

    from castsql.spark.errors import check_types, job_errors
    from castsql.spark.reader import read_snapshot

    table = log.uri
    if not isinstance(source, SparkDataFrame):
        raise MergeError(
            f"table {table}: merge: the Spark engine merges a Spark DataFrame, got {type(source).__name__}"
        )
    if stream is not None and _batch_done(log, stream):
        return MergeMetrics(extra={"skipped_batch": True})
    where = f"table {table}: merge"
    head = log.latest()
    src_schema = None
    if merge_schema:
        from castsql.spark.types import schema_from_spark

        try:
            src_schema = schema_from_spark(source.schema).to_arrow()
        except SchemaMismatch as e:
            raise SchemaMismatch(f"{where}: the source: {e}") from None
        target = merged(head.schema, src_schema, where, head.primary_key)
    else:
        target = head.schema
    validate(spec, table, target.names, source.columns)
    check_source_types(source, target, where)  # the one type rule, before any job
    tag = uuid.uuid4().hex[:12]
    source_view, target_view = f"_castsql_source_{tag}", f"_castsql_target_{tag}"
    source.createOrReplaceTempView(source_view)
    with job_errors(f"{table}: merge: reading the source"):
        num_source = source.count()
    metrics = MergeMetrics(num_source_rows=num_source)
    texts = {n.lower(): e for c in spec.clauses if c.set for n, e in c.set.items()}

    def attempt(i: int) -> MergeMetrics:
        metrics.attempts = i + 1
        snap = resolve(log)
        if i and stream is not None and _batch_done(log, stream):
            metrics.extra["skipped_batch"] = True  # committed meanwhile by an earlier run of the batch
            return metrics
        new_schema = None
        if src_schema is not None:
            evolved = evolve_snapshot(snap, merged(snap.schema, src_schema, where, snap.primary_key), where)
            if evolved is not snap:
                snap, new_schema = evolved, evolved.schema
        names = snap.schema.names
        used = spec.target_columns_used(names)
        pk = snap.primary_key
        if pk is not None and pk not in used:
            used.append(pk)  # the key a changed row had (the key check)
        out = None
        for cols in (used, None):  # the guess at the columns, else all of them
            read_snapshot(spark, log, snap, positions=True, row_groups=True, columns=cols).createOrReplaceTempView(
                target_view
            )
            try:
                acts = spark.sql(actions_sql(spec, quote(target_view), quote(source_view), names, quote, old_key=pk))
                cast, lossy = _cast_columns(acts, snap, table, "merge", texts)
                out = acts.select(
                    FILE_COL,
                    RG_COL,
                    POS_COL,
                    ACTION_COL,
                    MATCHES_COL,
                    *([OLD_KEY_COL] if pk is not None else []),
                    *cast,
                    *[c.alias(f"_castsql_lossy{j}") for j, (*_, c) in enumerate(lossy)],
                )
                break
            except AnalysisException as e:
                if cols is None:
                    raise _analysis(table, "merge", e) from None
        assert out is not None
        check_types(out, table, "merge", _describe(spec))
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return _run_merge(
                spark, log, snap, spec, out, target_view, metrics, rgs, tfb, stream, new_schema,
                lossy=lossy, check_keys=not allow_duplicate_keys,
            )  # fmt: skip
        finally:
            out.unpersist()

    try:
        return with_retries(f"{table}: merge", attempts, attempt)
    finally:
        spark.catalog.dropTempView(source_view)
        spark.catalog.dropTempView(target_view)


def _batch_done(log: TableLog, stream: tuple[str, int]) -> bool:
    """Whether the table has a version of micro-batch ``stream[1]`` (or a later one) of query ``stream[0]``."""
    from castsql.spark.datasource import last_batch

    return last_batch(log, stream[0]) >= stream[1]


def _describe(spec: MergeSpec) -> str:
    parts = [spec.on if isinstance(spec.on, str) else f"on {', '.join(spec.on)}"]
    for c in spec.clauses:
        if c.condition:
            parts.append(c.condition)
        if c.set:
            parts += [f"{k} = {v}" for k, v in c.set.items()]
    return "; ".join(parts)


def _run_merge(
    spark: SparkSession,
    log: TableLog,
    snap: Snapshot,
    spec: MergeSpec,
    out: DataFrame,
    target_view: str,
    metrics: MergeMetrics,
    rgs: int,
    tfb: int,
    stream: tuple[str, int] | None = None,
    new_schema: Schema | None = None,
    *,
    lossy: Sequence[Lossy] = (),
    check_keys: bool = True,
) -> MergeMetrics:
    """Count the actions (one job), refuse what must not be written (several
    source rows for one target row, a value its column cannot hold
    unchanged, inserted primary keys NULL, repeated or already in the table),
    then write the new rows and commit."""
    from pyspark.sql import functions as F

    from castsql.spark.errors import job_errors

    table = log.uri
    action = F.col(ACTION_COL)
    changes = action.isin(ACTION_UPDATE, ACTION_DELETE)
    key = snap.primary_key or (spec.keys[0] if spec.keys else None)
    aggs = [
        F.count_distinct(F.when(action == ACTION_UPDATE, F.struct(FILE_COL, POS_COL))).alias("updated"),
        F.count_distinct(F.when(action == ACTION_DELETE, F.struct(FILE_COL, POS_COL))).alias("deleted"),
        F.sum(F.when(action == ACTION_INSERT, 1).otherwise(0)).alias("inserted"),
        F.sum(F.when(changes & (F.col(MATCHES_COL) > 1), 1).otherwise(0)).alias("multiple"),
    ]
    if key is not None:
        k = F.when(action == ACTION_INSERT, F.col(quote(key)))
        aggs += [F.min(k).alias("lo"), F.max(k).alias("hi")]
    aggs += [F.min(f"_castsql_lossy{j}").alias(f"lossy{j}") for j in range(len(lossy))]
    pk = snap.primary_key if check_keys else None
    # Keys move (an update sets the key, or copies it from a source row matched
    # on other columns) or inserts may hit live keys: the keys come to the
    # driver for the one check (write.keys.check_written_keys). Otherwise
    # (an upsert on the key) NULL and repeated inserted keys are counted in the same job.
    moving = pk is not None and (moves_keys(spec, pk) or not inserts_unmatched(spec, pk))
    if pk is not None and not moving:
        pkc = F.col(quote(pk))
        aggs += [
            F.sum(F.when((action == ACTION_INSERT) & pkc.isNull(), 1).otherwise(0)).alias("null_keys"),
            F.count_distinct(F.when(action == ACTION_INSERT, pkc)).alias("distinct_keys"),
        ]
    with job_errors(f"{table}: merge"):
        [stats] = out.agg(*aggs).collect()
    if stats["multiple"] and not spec.multiple_matches_allowed:
        raise _multiple_matches(spark, log, spec, out, target_view)
    updated, deleted, inserted = stats["updated"], stats["deleted"], stats["inserted"] or 0
    _refuse_lossy(table, "merge", list(lossy), [stats[f"lossy{j}"] for j in range(len(lossy))])
    span = None
    if moving and (updated or inserted):
        span = _check_moved_keys(log, snap, spec, out, pk)
    elif pk is not None and inserted:
        _check_inserted_keys(log, snap, out, pk, inserted, stats["null_keys"], stats["distinct_keys"])
    metrics.num_target_rows_updated, metrics.num_target_rows_deleted = updated, deleted
    metrics.num_target_rows_inserted = inserted
    metrics.num_output_rows = updated + inserted
    if not (updated or deleted or inserted):
        metrics.version = None
        return metrics
    plan = _plan_from_positions(spark, log, snap, out.where(changes).select(FILE_COL, RG_COL, POS_COL), "merge")
    if plan.rows != updated + deleted:
        raise CastSQLError(f"{table}: merge: planned {plan.rows} tombstoned row(s) for {updated + deleted} changed")
    new = out.where(action.isin(ACTION_UPDATE, ACTION_INSERT)).select(*map(quote, snap.schema.names))
    # A few large files, not one per shuffle partition: about one task per ROWS_PER_TASK new rows.
    new = new.coalesce(max(1, math.ceil((updated + inserted) / ROWS_PER_TASK)))
    files = _write_rows(log, snap, new, "merge", rgs, tfb)
    if inserted and not moving:
        span = (key, json_stat(stats["lo"]), json_stat(stats["hi"])) if key is not None else (None, None, None)
        if span[0] is not None and (span[1] is None or span[2] is None):
            span = (None, None, None)
    m = commit_dml(
        log,
        operation="MERGE",
        read_version=snap.version,
        records=plan.records,
        files=files,
        summary={
            "inserted_rows": inserted,
            "updated_rows": updated,
            "deleted_rows": plan.rows,
            "source_rows": metrics.num_source_rows,
            **({"stream_query": stream[0], "stream_batch": stream[1]} if stream is not None else {}),
        },
        insert_key_span=span,
        schema=snap.schema if new_schema is not None else None,
        new_schema=new_schema,  # merge_schema: the schema changes in this version (FORMAT.md §3.4)
    )
    # As the embedded engine counts them: tombstone files, data bytes; the records in extra.
    metrics.version = m.version
    metrics.num_target_files_added = len(files)
    metrics.num_tombstones_added = 1 if plan.records else 0
    metrics.bytes_written = sum(f.size_bytes for f in files)
    metrics.extra["tombstone_records"] = len(plan.records)
    metrics.extra["tombstone_bytes"] = len(serialize_tombstones(plan.records)) if plan.records else 0
    return metrics


def _inserted_keys(table: str, out: DataFrame, pk: str) -> pa.Array:
    """The primary keys of the rows the merge inserts, on the driver."""
    from pyspark.sql import functions as F

    from castsql.spark.errors import job_errors

    with job_errors(f"{table}: merge"):
        keys = out.where(F.col(ACTION_COL) == ACTION_INSERT).select(quote(pk)).toArrow()
    return keys.column(0).combine_chunks()


def _check_moved_keys(log: TableLog, snap: Snapshot, spec: MergeSpec, out: DataFrame, pk: str) -> tuple | None:
    """The primary-key invariant of a merge whose keys may move: the keys of
    the rows it adds and of those it replaces, on the driver, checked by
    :func:`castsql.write.keys.check_written_keys` (the embedded engine's
    check); returns the conflict span."""
    from pyspark.sql import functions as F

    from castsql.spark.errors import job_errors

    action = F.col(ACTION_COL)
    with job_errors(f"{log.uri}: merge"):
        added = out.where(action.isin(ACTION_UPDATE, ACTION_INSERT)).select(quote(pk), ACTION_COL).toArrow()
        replaced = out.where(action.isin(ACTION_UPDATE, ACTION_DELETE)).select(OLD_KEY_COL).toArrow()
    absent = None
    if inserts_unmatched(spec, pk):  # the source's unmatched keys: not in the table
        absent = added.column(1).to_numpy() == ACTION_INSERT
    return check_written_keys(
        log.uri, "merge", pk, log.storage, snap, added.column(0), replaced=replaced.column(0), absent=absent
    )


def _check_inserted_keys(
    log: TableLog, snap: Snapshot, out: DataFrame, pk: str, inserted: int, nulls: int, distinct: int
) -> None:
    """NullKey / DuplicateKey (:mod:`castsql.write.keys`: the embedded
    merge's rule and messages) for an upsert on the key whose inserted keys
    are NULL or repeated; they cannot already be live (their source rows
    matched nothing on the key). The job counting the actions counted NULL
    and distinct keys; the keys come to the driver only to name the offending ones."""
    if nulls or distinct != inserted:
        check_input_keys(log.uri, pk, _inserted_keys(log.uri, out, pk), "merge")


def _multiple_matches(spark: SparkSession, log: TableLog, spec: MergeSpec, out: DataFrame, view: str) -> MergeError:
    """Delta's DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE, naming up to five keys."""
    from pyspark.sql import functions as F

    from castsql.spark.errors import job_errors

    bad = out.where(F.col(ACTION_COL).isin(ACTION_UPDATE, ACTION_DELETE) & (F.col(MATCHES_COL) > 1))
    ident = bad.select(FILE_COL, POS_COL).distinct()
    keys = list(spec.keys or ())
    with job_errors(f"{log.uri}: merge"):
        if keys:
            t = spark.table(quote(view)).select(FILE_COL, POS_COL, *map(quote, keys))
            rows = ident.join(t, [FILE_COL, POS_COL]).select(*map(quote, keys)).limit(5).collect()
            seen = [", ".join(f"{k}={v!r}" for k, v in zip(keys, r, strict=True)) for r in rows]
        else:
            seen = [f"row {r[1]} of {r[0]}" for r in ident.limit(5).collect()]
    return MergeError(
        f"table {log.uri}: merge: several source rows match one target row and a matched clause "
        f"would change it ({'; '.join(sorted(seen))}); make the source's keys unique (one row per key) "
        "— nothing was committed"
    )


# ---------------------------------------------------------------------- update


def update(
    spark: SparkSession,
    uri: str,
    set: Mapping[str, str],
    where: str | None = None,
    *,
    s3: S3Config | None = None,
    attempts: int = 5,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    merge_schema: bool = False,
) -> Manifest | None:
    """Set columns of the rows of the newest version for which ``where`` (SQL;
    None: every row) is true: ``set`` maps a column to a SQL expression over
    the row's columns. One version: a tombstone for the old rows and new data
    files for the new ones. Returns the committed manifest, or None (nothing
    committed) when no row matched.

    ``merge_schema=True`` (as the embedded engine's ``Table.update``): a
    ``set`` column the table lacks is added (nullable, at the end, of its
    expression's Spark type: ``CAST(0 AS BIGINT)`` to choose one; a bare
    ``NULL`` has none and is refused), and a column whose expression's type is
    an allowed widening of it is widened, in the version the update commits
    (FORMAT.md §3.4); rows the update does not touch read NULL in an added
    column. Without it, such a column is an error.

    Raises MergeError (unknown column, a value of the wrong type, a condition
    that does not parse), BadCondition (not a boolean), WrongType (a string
    column compared with a number) before anything is written, and
    CommitConflict when concurrent commits conflicted ``attempts`` times.

    Example::

        >>> m = update(spark, "/data/events", {"amount": "amount * 2"}, "kind = 'refund'")  # doctest: +SKIP
        >>> m.summary["updated_rows"]                                                  # doctest: +SKIP
        1204
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    from castsql.spark.deleter import plan_delete
    from castsql.spark.errors import check_types, job_errors
    from castsql.spark.reader import read_snapshot

    log = TableLog(open_storage(uri, s3=s3))
    table = log.uri
    columns = log.latest().schema.names
    if not isinstance(set, Mapping) or not set:
        raise MergeError(f"table {table}: update: set names no column (give {{column: SQL expression}})")
    by_lower = {c.lower(): c for c in columns}
    for name, expr in set.items():
        if not isinstance(name, str) or not name or (name.lower() not in by_lower and not merge_schema):
            raise MergeError(
                f"table {table}: update: column {name!r} is not a column of the table ({', '.join(columns)}; "
                "merge_schema=True adds it)"
            )
        if not isinstance(expr, str) or not expr.strip():
            raise MergeError(f"table {table}: update: column {name!r}: the value must be SQL text, got {expr!r}")
    cond = where if where is not None and where.strip() else "TRUE"

    def attempt(i: int) -> Manifest | None:
        snap = resolve(log)
        new_schema = None
        if merge_schema:
            try:
                evolved = _evolve_for_set(spark, log, snap, set, f"table {table}: update")
            except AnalysisException as e:
                raise _analysis(table, "update", e) from None
            if evolved is not snap:
                snap, new_schema = evolved, evolved.schema
        names = snap.schema.names
        lower = {c.lower(): c for c in names}
        assign = {lower[n.lower()]: e for n, e in set.items()}
        df = read_snapshot(spark, log, snap)
        try:
            new = df.where(F.expr(cond)).select(
                *[F.expr(assign[c]).alias(c) if c in assign else F.col(quote(c)) for c in names]
            )
            check_types(df.select(F.expr(cond)), table, "condition", cond)
            for c, e in assign.items():
                check_types(df.select(F.expr(e)), table, f"value of {c}", e)
            cols, lossy = _cast_columns(new, snap, table, "update", {c.lower(): e for c, e in assign.items()})
            cast = new.select(*cols)
        except AnalysisException as e:
            raise _analysis(table, "update", e) from None
        plan = plan_delete(spark, log, snap, cond)
        if not plan.records:
            return None
        if lossy:  # one job: a value its column cannot hold unchanged refuses the update
            with job_errors(f"{table}: update"):
                [row] = new.agg(*[F.min(c).alias(f"v{j}") for j, (*_, c) in enumerate(lossy)]).collect()
            _refuse_lossy(table, "update", lossy, list(row))
        pk = snap.primary_key
        span = None
        if pk is not None and pk in assign:  # keys may move: unique and non-NULL after it too (one job)
            with job_errors(f"{table}: update"):
                keys = df.where(F.expr(cond)).select(F.expr(assign[pk]).alias("new"), F.col(quote(pk))).toArrow()
            new_keys = keys.column(0).cast(type_from_name(snap.schema.column(pk).type))
            span = check_written_keys(table, "update", pk, log.storage, snap, new_keys, replaced=keys.column(1))
        files = _write_rows(log, snap, cast, "update", row_group_size, target_file_bytes)
        written = sum(f.total_rows for f in files)
        if written != plan.rows:
            raise CastSQLError(
                f"table {table}: update: the condition {cond!r} matched {plan.rows} row(s) and then {written}; "
                "it must give the same answer every time it is evaluated (no rand()); nothing was committed"
            )
        return commit_dml(
            log,
            operation="UPDATE",
            read_version=snap.version,
            records=plan.records,
            files=files,
            summary={"updated_rows": plan.rows, "deleted_rows": plan.rows},
            insert_key_span=span,
            schema=snap.schema if new_schema is not None else None,
            new_schema=new_schema,  # merge_schema: the schema changes in this version (FORMAT.md §3.4)
        )

    return with_retries(f"{table}: update", attempts, attempt)


def _evolve_for_set(spark: SparkSession, log: TableLog, snap: Snapshot, set: Mapping[str, str], where: str) -> Snapshot:
    """``snap`` seen through the schema an update with ``merge_schema`` gives
    it (the embedded engine's rule, :meth:`castsql.engine.dml.Writer.update`):
    ``set`` columns it lacks added with their expression's type, columns whose
    expression's type is an allowed widening of theirs widened; itself when
    nothing changes. The types come from Spark's analysis of the expressions
    over the version's rows (no job runs)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NullType

    from castsql.format.schema import normalize_type, type_name
    from castsql.spark.reader import read_snapshot
    from castsql.spark.types import schema_from_spark

    have = {c.name.lower(): c for c in snap.schema.columns}
    df = read_snapshot(spark, log, snap)
    fields = []
    for col, expr in set.items():
        got = df.select(F.expr(expr).alias(col)).schema
        c = have.get(col.lower())
        try:
            t = pa.null() if isinstance(got[0].dataType, NullType) else schema_from_spark(got).to_arrow().field(0).type
        except SchemaMismatch:
            if c is None:
                raise SchemaMismatch(f"{where}: new column {col!r}: {expr!r} is {got[0].dataType.simpleString()}, "
                                     "a type no table column can have") from None  # fmt: skip
            continue  # the update's own type check names it
        if c is None:
            fields.append(pa.field(col, t))  # merged() refuses a bare NULL: it has no type
        elif not pa.types.is_null(t) and (wider := type_name(normalize_type(t))) != c.type and widens(c.type, wider):
            fields.append(pa.field(c.name, t))
    if not fields:
        return snap
    return evolve_snapshot(snap, merged(snap.schema, pa.schema(fields), where, snap.primary_key), where)
