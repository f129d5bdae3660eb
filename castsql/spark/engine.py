"""Merge (upsert), update and delete on Spark: Spark's engine of the one write
pipeline (:mod:`castsql.write.pipeline`), one version each, tombstones plus
new rows.

``merge(spark, uri, source_df, on="id")`` returns the same builder as the
embedded engine's ``castsql.Table.merge`` (:class:`castsql.write.merge.MergeBuilder`:
clauses in order, first match wins, ``execute()`` gives
:class:`~castsql.write.merge.MergeMetrics`); ``update`` and
``castsql.spark.delete`` take a SQL condition. The pipeline owns the
sequence and every rule (schema evolution, the type rule for the source,
multiple matches, the primary key, conflict spans, retries, streams, the
commit); :class:`SparkEngine` supplies only Spark's part:

- a merge's actions: the target's live rows of the version with their
  identity (file, row group, position), read by
  :func:`castsql.spark.reader.read_snapshot` (only the columns the clauses
  can name), and the source DataFrame become temporary views; the shared
  :func:`castsql.write.merge.actions_sql` runs in Spark SQL over them,
  persisted, and ONE job counts the actions, the target rows several source
  rows would change, the inserted keys (NULLs, distinct, min, max) and the
  values a clause computes that their column cannot hold unchanged;
- an update's and a delete's rows: the delete's job
  (:func:`castsql.spark.deleter.plan_delete`: workers summarize each row
  group, key ranges where exact) picks the tombstones; a second job over the
  same version writes the matched rows with the new values;
- a merge's tombstones: the replaced and deleted rows' positions become
  per-row-group bitmaps on the workers (:func:`positions_task`) and the
  shared planner (:func:`castsql.write.records.plan_records`) picks the records;
- new rows: written by the append task (:func:`castsql.spark.tasks.write_task`,
  one collect);
- keys, when the pipeline needs them (keys that may move): one collect of
  the added and replaced keys.

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
from castsql.format import DataFile, Manifest, TableLog, TombstoneRecord
from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.format.evolution import fits
from castsql.format.schema import type_from_name
from castsql.snapshot import Snapshot
from castsql.spark.errors import BadCondition
from castsql.spark.types import quote
from castsql.storage import S3Config, open_storage
from castsql.write import pipeline
from castsql.write.cdc import Cdc, CdcMetrics, Check, check, deletes, prepare
from castsql.write.merge import (
    ACTION_COL,
    ACTION_DELETE,
    ACTION_INSERT,
    ACTION_NONE,
    ACTION_UPDATE,
    MATCHES_COL,
    OLD_KEY_COL,
    MergeBuilder,
    MergeError,
    MergeMetrics,
    MergeSpec,
    actions_sql,
    unstorable,
)
from castsql.write.pipeline import Counts, KeyStats
from castsql.write.records import FILE_COL, POS_COL, RG_COL, plan_records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

__all__ = ["cdc_merge", "delete", "merge", "update"]

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


def _partition(batches: Iterable[pa.RecordBatch]) -> pa.Table | None:
    got = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(got) if got else None


def cdc_check_task(cdc: Cdc, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: :func:`castsql.write.cdc.check` of one partition of a batch hashed by key."""
    t = _partition(batches)
    c = check(cdc, t) if t is not None else Check(0, 0)
    out = {"rows": [c.rows], "changes": [c.changes], "problem": [c.problem]}
    yield pa.RecordBatch.from_pydict(
        out, pa.schema([("rows", pa.int64()), ("changes", pa.int64()), ("problem", pa.string())])
    )


def cdc_changes_task(cdc: Cdc, markers: pa.Table | None, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: :func:`castsql.write.cdc.prepare` of one partition of a batch hashed by key."""
    t = _partition(batches)
    if t is not None:
        yield from prepare(cdc, t, markers).select([*cdc.columns, cdc.op_column]).to_batches()


def cdc_deletes_task(cdc: Cdc, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: :func:`castsql.write.cdc.deletes` of prepared changes."""
    t = _partition(batches)
    if t is not None:
        yield from deletes(cdc, t).to_batches()


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
    """:func:`castsql.write.merge.unstorable` for the first column of
    ``lossy`` whose example (a value as text that its conversion would
    change, or None) is not None."""
    for (name, got, want, source, _), value in zip(lossy, examples, strict=True):
        if value is not None:
            raise unstorable(table, what, name, want.simpleString(), got.simpleString(), source, value)


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
        engine = SparkEngine(spark, log, row_group_size, target_file_bytes, source=src, merge_schema=merge_schema)
        options = pipeline.Options(attempts, merge_schema, allow_duplicate_keys)
        return pipeline.merge(engine, spec, options)

    return MergeBuilder(log.uri, source, on, run, source_alias=source_alias, target_alias=target_alias)


def cdc_merge(
    spark: SparkSession,
    uri: str,
    batch: DataFrame,
    *,
    key: str | list[str] | tuple[str, ...],
    op_column: str,
    sequence: str | Sequence[str] | None = None,
    delete_values: Sequence[str] | None = None,
    upsert_values: Sequence[str] | None = None,
    partial: bool | None = None,
    unavailable: str | None = None,
    s3: S3Config | None = None,
    attempts: int = 5,
    app_id: str | None = None,
    batch_id: int | None = None,
    merge_schema: bool = False,
    query: str | None = None,
    format: str = "rows",
) -> CdcMetrics:
    """Apply one CDC batch (a DataFrame of the table's columns plus
    ``op_column``) as one version, with Spark: the embedded engine's
    :meth:`castsql.Table.apply_cdc`, the same rules and SQL
    (:mod:`castsql.write.cdc`) run by Spark SQL. With ``sequence``, a change
    applies only if it is later than the last one the table applied to its
    key, a delete included, whatever order batches arrive in and however
    often; ties are decided by the same rule on both engines, whatever the
    partitioning.

    ``app_id`` and ``batch_id`` name the batch (Delta's ``txnAppId`` /
    ``txnVersion``; from ``foreachBatch``: a stable name of the stream and
    the ``batch_id`` it gives): a batch the table already has for that app
    commits nothing (``batch_replayed``; ``extra["skipped_batch"]``).
    ``query`` is the older spelling of ``app_id``.

    ``format="debezium"``: ``batch`` holds Debezium's envelope (columns
    ``op``, ``before``, ``after``, ``source``, ``ts_ms``, as ``from_json`` of
    the Kafka value gives them): read as :mod:`castsql.write.debezium` reads
    events (the row, the operation, a sequence from ``source``, unchanged
    TOAST values kept).

    Example::

        >>> cdc_merge(spark, "/data/users", feed_df, key="id", op_column="op", sequence="lsn").version  # doctest: +SKIP
        12
        >>> def apply(df, batch_id):  # doctest: +SKIP
        ...     cdc_merge(df.sparkSession, "/data/users", df, key="id", op_column="op", sequence="lsn",
        ...               app_id="users-cdc", batch_id=batch_id)
        >>> feed.writeStream.foreachBatch(apply).option("checkpointLocation", ck).start()  # doctest: +SKIP
    """
    import time

    from castsql.write.cdc import Cdc, batch_of

    if query is not None and app_id is not None and query != app_id:
        raise MergeError(f"{uri}: cdc_merge: query is app_id's older name; give one of them")
    stream = batch_of(f"{uri}: cdc_merge", app_id if app_id is not None else query, batch_id)
    if format == "debezium":
        batch, op_column, sequence, unavailable = _debezium_frame(batch, op_column, sequence, unavailable)
        partial = True if partial is None else partial  # a delete's before may hold the key alone
    elif format != "rows":
        raise MergeError(f"{uri}: cdc_merge: format must be 'rows' or 'debezium', got {format!r}")
    cdc = Cdc.of(key, op_column, sequence, delete_values, upsert_values, bool(partial), unavailable)
    log = TableLog(open_storage(uri, s3=s3))
    log.latest()  # no table here: TableNotFound before any job
    started = time.perf_counter()
    engine = SparkEngine(
        spark, log, DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES, source=batch, merge_schema=merge_schema
    )
    try:
        metrics = pipeline.apply_cdc(engine, cdc, pipeline.Options(attempts, merge_schema, stream=stream))
    finally:
        engine.release()
    metrics.execution_time_ms = int((time.perf_counter() - started) * 1000)
    return metrics


def _debezium_frame(
    df: DataFrame, op_column: str | None, sequence: Any, unavailable: str | None
) -> tuple[DataFrame, str, Any, str | None]:
    """A DataFrame of Debezium's envelope as a CDC batch, as
    :func:`castsql.write.debezium.read_debezium` reads events."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from castsql.write.cdc import DEBEZIUM_UNAVAILABLE
    from castsql.write.debezium import OP_COLUMN, SEQUENCES, TS_SEQUENCE

    cols = {f.name: f.dataType for f in df.schema.fields}
    if "op" not in cols or not ({"after", "before"} & cols.keys()):
        raise MergeError(
            f"cdc_merge: format='debezium' needs the envelope's columns op, before, after, source; got {list(cols)}"
        )
    # A side that is never set reads from JSON as a string column of NULLs: absent.
    after, before = (t if isinstance(t := cols.get(side), StructType) else None for side in ("after", "before"))
    if after is None and before is None:
        raise MergeError("cdc_merge: format='debezium': before or after must be a struct (from_json of the event)")
    # JSON inference types the two sides apart (a delete's before may hold only the key, NULLs
    # read as strings): each column is after's, or before's cast to after's type for a delete.
    types = {f.name: f.dataType for f in (*(before.fields if before else ()), *(after.fields if after else ()))}

    def value(name: str) -> Column:
        a = F.col(f"after.{quote(name)}") if after is not None and name in after.fieldNames() else F.lit(None)
        if before is None or name not in before.fieldNames():
            return a.cast(types[name])
        return F.when(F.col("op") == "d", F.col(f"before.{quote(name)}").cast(types[name])).otherwise(a)

    source = cols.get("source")
    have = {f.name for f in source.fields} if isinstance(source, StructType) else set()
    fields, names = next(((f, n) for f, n in SEQUENCES if set(f) <= have), ((), TS_SEQUENCE))
    seqs = [F.col(f"source.{f}").alias(n) for f, n in zip(fields, names, strict=True)] or [
        F.col("ts_ms").alias(names[0])
    ]
    out = df.where(F.col("op").isNotNull()).select(
        *[value(n).alias(n) for n in types], F.col("op").alias(OP_COLUMN), *seqs
    )
    return (
        out,
        op_column or OP_COLUMN,
        sequence if sequence is not None else names,
        DEBEZIUM_UNAVAILABLE if unavailable is None else unavailable,
    )


def delete(
    spark: SparkSession,
    uri: str,
    where: str,
    *,
    s3: S3Config | None = None,
    attempts: int = 5,
) -> Manifest | None:
    """Delete the rows of the latest version for which the SQL condition
    ``where`` is true; returns the committed manifest, or None (nothing
    committed) if no row matched.

    Writes exactly one tombstone file and one manifest, through the one write
    sequence (:func:`castsql.write.pipeline.delete`: the embedded delete's
    commit and conflict rules); the rows are found by
    :func:`castsql.spark.deleter.plan_delete`. Raises Spark's
    AnalysisException (or ParseException) for a condition that does not
    parse or names unknown columns, BadCondition for a non-boolean one, and
    CommitConflict if concurrent commits conflicted ``attempts`` times in a row.

    Example::

        >>> delete(spark, "/data/events", "user = 'u42'").summary["deleted_rows"]   # doctest: +SKIP
        37
    """
    if not where or not where.strip():
        raise BadCondition("the delete condition is empty (to delete every row, say so: --where 'true')")
    log = TableLog(open_storage(uri, s3=s3))
    return pipeline.delete(SparkEngine(spark, log), where, attempts=attempts)


def _describe(spec: MergeSpec) -> str:
    parts = [spec.on if isinstance(spec.on, str) else f"on {', '.join(spec.on)}"]
    for c in spec.clauses:
        if c.condition:
            parts.append(c.condition)
        if c.set:
            parts += [f"{k} = {v}" for k, v in c.set.items()]
    return "; ".join(parts)


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
    log = TableLog(open_storage(uri, s3=s3))
    engine = SparkEngine(spark, log, row_group_size, target_file_bytes)
    return pipeline.update(engine, set, where, merge_schema=merge_schema, attempts=attempts)


# ---------------------------------------------------------------------- the engine


class SparkEngine:
    """Spark's engine of the one write pipeline (:mod:`castsql.write.pipeline`):
    rows found by Spark jobs over the snapshot (read by CastSQL's workers with
    their file and position), new rows written by the append task, what the
    driver needs counted in one job."""

    def __init__(
        self,
        spark: SparkSession,
        log: TableLog,
        rgs: int = DEFAULT_ROW_GROUP_SIZE,
        tfb: int = DEFAULT_TARGET_FILE_BYTES,
        *,
        source: Any = None,
        merge_schema: bool = False,
    ) -> None:
        self.spark, self.log, self.table = spark, log, log.uri
        self.rgs, self.tfb = rgs, tfb
        self.source, self.merge_schema = source, merge_schema
        self._views: list[str] = []
        self._count: int | None = None
        self._batch: Any = None  # a CDC batch as given, while ``source`` is its changes to apply
        self._narrowed: Any = None

    # -------------------------------------------------- delete and update

    def check_texts(self, texts: Sequence[str], op: str) -> None:
        return None  # Spark parses them; nothing else runs them

    def find_delete(self, snap: Snapshot, where: str) -> _SparkFound | None:
        from castsql.spark.deleter import plan_delete

        plan = plan_delete(self.spark, self.log, snap, where)
        if not plan.records:
            return None
        return _SparkFound(self, snap, Counts(deleted=plan.rows), plan=plan)

    def expression_types(self, snap: Snapshot, set: Mapping[str, str], op: str) -> dict[str, pa.DataType]:
        """Types from Spark's analysis of the expressions over the version's rows (no job runs)."""
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F
        from pyspark.sql.types import NullType

        from castsql.spark.reader import read_snapshot
        from castsql.spark.types import schema_from_spark

        df = read_snapshot(self.spark, self.log, snap)
        have = {c.lower() for c in snap.schema.names}
        out: dict[str, pa.DataType] = {}
        for col, expr in set.items():
            try:
                got = df.select(F.expr(expr).alias(col)).schema
            except AnalysisException as e:
                raise _analysis(self.table, op, e) from None
            if isinstance(got[0].dataType, NullType):
                out[col] = pa.null()
                continue
            try:
                out[col] = schema_from_spark(got).to_arrow().field(0).type
            except SchemaMismatch:
                if col.lower() not in have:
                    raise SchemaMismatch(
                        f"table {self.table}: {op}: new column {col!r}: {expr!r} is "
                        f"{got[0].dataType.simpleString()}, a type no table column can have"
                    ) from None
        return out

    def find_update(self, snap: Snapshot, set: Mapping[str, str], where: str | None) -> _SparkFound | None:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        from castsql.spark.deleter import plan_delete
        from castsql.spark.errors import check_types
        from castsql.spark.reader import read_snapshot

        table = self.table
        cond = where if where is not None and where.strip() else "TRUE"
        names = snap.schema.names
        df = read_snapshot(self.spark, self.log, snap)
        pk = snap.primary_key
        old = [F.col(quote(pk)).alias(OLD_KEY_COL)] if pk is not None else []  # the key each row has now
        try:
            new = df.where(F.expr(cond)).select(
                *[F.expr(set[c]).alias(c) if c in set else F.col(quote(c)) for c in names], *old
            )
            check_types(df.select(F.expr(cond)), table, "condition", cond)
            for c, e in set.items():
                check_types(df.select(F.expr(e)), table, f"value of {c}", e)
            cols, lossy = _cast_columns(new, snap, table, "update", {c.lower(): e for c, e in set.items()})
            cast = new.select(*cols)
        except AnalysisException as e:
            raise _analysis(table, "update", e) from None
        plan = plan_delete(self.spark, self.log, snap, cond)
        if not plan.records:
            return None
        # The new key as stored beside the old one: one job when the pipeline asks for keys.
        keyed = new.select(cols[names.index(pk)], OLD_KEY_COL) if pk is not None else None
        return _SparkFound(
            self, snap, Counts(updated=plan.rows), plan=plan, new=new, cast=cast, lossy=lossy, keyed=keyed, cond=cond
        )

    # -------------------------------------------------- merge

    def source_schema(self) -> pa.Schema:
        """The source's columns as Arrow types: the table's columns by the one
        type rule's reading of Spark types; with ``merge_schema`` every column."""
        from castsql.spark.types import schema_from_spark

        self._check_source()
        where = f"table {self.table}: merge"
        if self.merge_schema:
            try:
                return schema_from_spark(self.source.schema).to_arrow()
            except SchemaMismatch as e:
                raise SchemaMismatch(f"{where}: the source: {e}") from None
        types = {c.name.lower(): c for c in self.log.latest().schema.columns}
        fields = []
        for field in self.source.schema.fields:
            got = _arrow_of(field.dataType)
            col = types.get(field.name.lower())
            if got is None and col is not None:
                raise SchemaMismatch(
                    f"{where}: column {col.name!r} is {field.dataType.simpleString()} in the data, the table has "
                    f"{type_from_name(col.type)} (only lossless widenings are accepted); nothing was written"
                )
            fields.append(pa.field(field.name, got if got is not None else pa.null()))
        return pa.schema(fields)

    def _check_source(self) -> None:
        from pyspark.sql import DataFrame as SparkDataFrame

        if not isinstance(self.source, SparkDataFrame):
            raise MergeError(
                f"table {self.table}: merge: the Spark engine merges a Spark DataFrame, "
                f"got {type(self.source).__name__}"
            )

    def source_rows(self) -> int:
        from castsql.spark.errors import job_errors

        self._check_source()
        if self._count is None:
            with job_errors(f"{self.table}: merge: reading the source"):
                self._count = self.source.count()
        return self._count

    # -------------------------------------------------- CDC (castsql.write.pipeline.apply_cdc)

    dialect = "spark"

    def _by_key(self, cdc: Cdc) -> DataFrame:
        """The batch (as given) hashed by key: each key's changes in one partition."""
        from pyspark.sql import functions as F

        if self._batch is None:
            self._check_source()
            self._batch = self.source
        return self._batch.repartition(*[F.col(quote(k)) for k in cdc.key])

    def cdc_check(self, cdc: Cdc) -> Check:
        from castsql.spark.errors import job_errors

        fn = functools.partial(cdc_check_task, cdc)
        with job_errors(f"{self.table}: cdc"):
            rows = self._by_key(cdc).mapInArrow(fn, "rows long, changes long, problem string").collect()
        return sum((Check(r.rows, r.changes, r.problem) for r in rows), Check(0, 0))

    def cdc_changes(self, cdc: Cdc, markers: pa.Table | None) -> tuple[int, pa.Table]:
        from pyspark import StorageLevel
        from pyspark.sql.types import StringType, StructField, StructType

        from castsql.spark.errors import job_errors
        from castsql.spark.types import spark_type

        def schema(columns: Sequence[str]) -> StructType:  # the operation column is text, the others the table's
            return StructType(
                [StructField(c, spark_type(cdc.kinds[c]) if c in cdc.kinds else StringType()) for c in columns]
            )

        if self._narrowed is not None:
            self._narrowed.unpersist()
        changes = self._by_key(cdc).mapInArrow(
            functools.partial(cdc_changes_task, cdc, markers), schema([*cdc.columns, cdc.op_column])
        )
        self.source = self._narrowed = changes.persist(StorageLevel.MEMORY_AND_DISK)
        self._count = None
        keyed = [*cdc.key, *cdc.sequence]
        with job_errors(f"{self.table}: cdc"):
            dels = self.source.mapInArrow(functools.partial(cdc_deletes_task, cdc), schema(keyed)).toArrow()
        return self.source_rows(), dels.cast(pa.schema([pa.field(c, cdc.kinds[c]) for c in keyed]))

    def find_merge(self, snap: Snapshot, spec: MergeSpec, unchanged: bool = False) -> _SparkFound:
        """The actions of :func:`castsql.write.merge.actions_sql` over the
        source and the live target rows, persisted, and counted in one job."""
        from pyspark import StorageLevel
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        from castsql.spark.errors import check_types, job_errors
        from castsql.spark.reader import read_snapshot

        table = self.table
        tag = uuid.uuid4().hex[:12]
        source_view, target_view = f"_castsql_source_{tag}", f"_castsql_target_{tag}"
        self.source.createOrReplaceTempView(source_view)
        self._views += [source_view, target_view]
        texts = {n.lower(): e for c in spec.clauses if c.set for n, e in c.set.items()}
        names = snap.schema.names
        used = spec.target_columns_used(names)
        pk = snap.primary_key
        if pk is not None and pk not in used:
            used.append(pk)  # the key a changed row had (the key check)
        out = None
        for cols in (used, None):  # the guess at the columns, else all of them
            read_snapshot(self.spark, self.log, snap, positions=True, row_groups=True, columns=cols
                          ).createOrReplaceTempView(target_view)  # fmt: skip
            try:
                acts = self.spark.sql(
                    actions_sql(
                        spec, quote(target_view), quote(source_view), names, quote, old_key=pk, keep_unchanged=unchanged
                    )
                )
                cast, lossy = _cast_columns(acts, snap, table, "merge", texts)
                out = acts.select(
                    FILE_COL, RG_COL, POS_COL, ACTION_COL, MATCHES_COL,
                    *([OLD_KEY_COL] if pk is not None else []),
                    *cast,
                    *[c.alias(f"_castsql_lossy{j}") for j, (*_, c) in enumerate(lossy)],
                )  # fmt: skip
                break
            except AnalysisException as e:
                if cols is None:
                    raise _analysis(table, "merge", e) from None
        assert out is not None
        check_types(out, table, "merge", _describe(spec))
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        found = _SparkFound(self, snap, Counts(), out=out, lossy=lossy, spec=spec, target_view=target_view)
        try:
            action = F.col(ACTION_COL)
            changes = action.isin(ACTION_UPDATE, ACTION_DELETE)
            key = pk or (spec.keys[0] if spec.keys else None)
            aggs = [
                F.count_distinct(F.when(action == ACTION_UPDATE, F.struct(FILE_COL, POS_COL))).alias("updated"),
                F.count_distinct(F.when(action == ACTION_DELETE, F.struct(FILE_COL, POS_COL))).alias("deleted"),
                F.sum(F.when(action == ACTION_INSERT, 1).otherwise(0)).alias("inserted"),
                F.sum(F.when(changes & (F.col(MATCHES_COL) > 1), 1).otherwise(0)).alias("multiple"),
            ]
            if unchanged:
                matched = F.col(FILE_COL).isNotNull()
                aggs += [
                    F.sum(F.when((action == ACTION_NONE) & matched, 1).otherwise(0)).alias("matched_unchanged"),
                    F.sum(F.when((action == ACTION_NONE) & ~matched, 1).otherwise(0)).alias("unmatched_unchanged"),
                ]
            if key is not None:  # the inserted keys, counted in the same job
                k = F.when(action == ACTION_INSERT, F.col(quote(key)))
                aggs += [
                    F.min(k).alias("lo"),
                    F.max(k).alias("hi"),
                    F.sum(F.when((action == ACTION_INSERT) & F.col(quote(key)).isNull(), 1).otherwise(0)).alias(
                        "nulls"
                    ),
                    F.count_distinct(k).alias("distinct"),
                ]
            aggs += [F.min(f"_castsql_lossy{j}").alias(f"lossy{j}") for j in range(len(lossy))]
            with job_errors(f"{table}: merge"):
                [stats] = out.agg(*aggs).collect()
        except BaseException:
            found.close()
            raise
        found.counts = Counts(stats["updated"], stats["deleted"], stats["inserted"] or 0)
        if unchanged:
            found.counts.matched_unchanged = stats["matched_unchanged"] or 0
            found.counts.unmatched_unchanged = stats["unmatched_unchanged"] or 0
        found.multiple = bool(stats["multiple"])
        found.stats, found.stats_key = stats, key
        return found

    def close(self) -> None:
        for v in self._views:
            self.spark.catalog.dropTempView(v)
        self._views = []

    def release(self) -> None:
        """Drop every view and cached relation (a CDC batch's, after the last attempt)."""
        if self._narrowed is not None:
            self._narrowed.unpersist()
            self._narrowed = None
        for v in self._views:
            self.spark.catalog.dropTempView(v)
        self._views = []


class _SparkFound:
    """What Spark's engine found for one attempt (:class:`castsql.write.pipeline.Found`):
    a merge's persisted actions and their counts, or an update's or delete's
    tombstone plan (the workers summarized each row group) and new rows."""

    def __init__(self, engine: SparkEngine, snap: Snapshot, counts: Counts, **parts: Any) -> None:
        self.engine, self.snap, self.counts = engine, snap, counts
        self.multiple = False
        self.plan = parts.get("plan")
        self.out: DataFrame | None = parts.get("out")
        self.new, self.cast = parts.get("new"), parts.get("cast")
        self.keyed, self.cond = parts.get("keyed"), parts.get("cond")
        self.lossy: Sequence[Lossy] = parts.get("lossy") or ()
        self.spec: MergeSpec | None = parts.get("spec")
        self.target_view: str | None = parts.get("target_view")
        self.stats: Any = None
        self.stats_key: str | None = None

    @property
    def _what(self) -> str:
        return "merge" if self.out is not None else "update"

    def multiple_labels(self) -> list[str]:
        from pyspark.sql import functions as F

        from castsql.spark.errors import job_errors

        assert self.out is not None and self.spec is not None and self.target_view is not None
        spark, keys = self.engine.spark, list(self.spec.keys or ())
        bad = self.out.where(F.col(ACTION_COL).isin(ACTION_UPDATE, ACTION_DELETE) & (F.col(MATCHES_COL) > 1))
        ident = bad.select(FILE_COL, POS_COL).distinct()
        with job_errors(f"{self.engine.table}: merge"):
            if keys:
                t = spark.table(quote(self.target_view)).select(FILE_COL, POS_COL, *map(quote, keys))
                rows = ident.join(t, [FILE_COL, POS_COL]).select(*map(quote, keys)).limit(5).collect()
                return sorted(", ".join(f"{k}={v!r}" for k, v in zip(keys, r, strict=True)) for r in rows)
            return sorted(f"row {r[1]} of {r[0]}" for r in ident.limit(5).collect())

    def refuse_unstorable(self) -> None:
        from pyspark.sql import functions as F

        from castsql.spark.errors import job_errors

        if not self.lossy:
            return
        if self.out is not None:  # counted by the merge's job
            examples = [self.stats[f"lossy{j}"] for j in range(len(self.lossy))]
        else:  # one job: a value its column cannot hold unchanged refuses the update
            assert self.new is not None  # an update's rows, set where no merge output is
            with job_errors(f"{self.engine.table}: update"):
                [row] = self.new.agg(*[F.min(c).alias(f"v{j}") for j, (*_, c) in enumerate(self.lossy)]).collect()
            examples = list(row)
        _refuse_lossy(self.engine.table, self._what, list(self.lossy), examples)

    def insert_stats(self, column: str) -> KeyStats:
        s = self.stats
        if s is None or column != self.stats_key:
            raise CastSQLError(f"{self.engine.table}: merge: no statistics of inserted column {column!r}")
        return KeyStats(s["nulls"], s["distinct"], s["lo"], s["hi"])

    def keys(self, pk: str) -> tuple[pa.Array, pa.Array, np.ndarray]:

        from castsql.spark.errors import job_errors

        want = type_from_name(self.snap.schema.column_named(pk).type)
        with job_errors(f"{self.engine.table}: {self._what}"):  # one collect
            if self.out is None:
                assert self.keyed is not None  # an update's keyed rows
                t = self.keyed.toArrow()
                return t.column(0).cast(want).combine_chunks(), t.column(1).combine_chunks(), np.zeros(t.num_rows, bool)
            t = self.out.select(quote(pk), ACTION_COL, OLD_KEY_COL).toArrow()  # every row changes something
        action = t.column(1).to_numpy()
        adds, gone = np.isin(action, (ACTION_UPDATE, ACTION_INSERT)), np.isin(action, (ACTION_UPDATE, ACTION_DELETE))
        added = t.column(0).filter(pa.array(adds)).cast(want).combine_chunks()
        return added, t.column(2).filter(pa.array(gone)).combine_chunks(), action[adds] == ACTION_INSERT

    def tombstones(self) -> tuple[list[TombstoneRecord], int]:
        if self.out is None:
            assert self.plan is not None  # an update plans its tombstones first
            return list(self.plan.records), self.plan.rows
        from pyspark.sql import functions as F

        changes = F.col(ACTION_COL).isin(ACTION_UPDATE, ACTION_DELETE)
        self.plan = _plan_from_positions(
            self.engine.spark, self.engine.log, self.snap,
            self.out.where(changes).select(FILE_COL, RG_COL, POS_COL), "merge",
        )  # fmt: skip
        return list(self.plan.records), self.plan.rows

    def deleted_positions(self) -> dict[str, BitMap]:
        """The planned records' rows (the workers' bitmaps, collected for the plan)."""
        return dict(self.plan.positions) if self.plan is not None else {}

    def held_rows(self) -> pa.Table | None:
        """None: the rows stay in Spark's executors; the change-data file reads them from the files."""
        return None

    def written_rows(self) -> pa.Table | None:
        """None: the rows were written by Spark's executors; the change file reads them back."""
        return None

    def write(self) -> list[DataFile]:
        e = self.engine
        if self.out is None:
            assert self.cast is not None and self.plan is not None  # an update's rows and plan
            files = _write_rows(e.log, self.snap, self.cast, "update", e.rgs, e.tfb)
            written = sum(f.total_rows for f in files)
            if written != self.plan.rows:
                raise CastSQLError(
                    f"table {e.table}: update: the condition {self.cond!r} matched {self.plan.rows} row(s) and "
                    f"then {written}; it must give the same answer every time it is evaluated (no rand()); "
                    "nothing was committed"
                )
            return files
        from pyspark.sql import functions as F

        c = self.counts
        new = self.out.where(F.col(ACTION_COL).isin(ACTION_UPDATE, ACTION_INSERT))
        new = new.select(*map(quote, self.snap.schema.names))
        # A few large files, not one per shuffle partition: about one task per ROWS_PER_TASK new rows.
        new = new.coalesce(max(1, math.ceil((c.updated + c.inserted) / ROWS_PER_TASK)))
        return _write_rows(e.log, self.snap, new, "merge", e.rgs, e.tfb)

    def close(self) -> None:
        if self.out is not None:
            self.out.unpersist()
        self.engine.close()
