"""The Python half of the JVM ``format("castsql")`` (:mod:`castsql.spark.jvm`).

Spark finds ``castsql`` in ``castsql-spark.jar``; that class asks this
module's handler, through py4j's callback server, for everything that needs
the format:

- a read (``load``) is resolved here once, its version fixed; each query on
  it gets :func:`castsql.spark.read`'s DataFrame of the columns it needs (Spark's
  own Parquet reader, deletes applied in generated code; S3 tables through
  the Python workers), the filters Spark pushed put inside by the JVM half;
- a write is :mod:`castsql.spark.native_write` (Spark's own Parquet writer,
  one directory per write whose failed attempts Spark's committer discards)
  or, where that cannot write the table, CastSQL's Python workers; then one
  commit on this driver with exactly the files written
  (:func:`castsql.spark.datasource_write.commit_files`: keys, overwrite, schema);
- a micro-batch is the same write, recorded with its query and batch id, and
  skipped when the table already holds that batch.

So the rows stay in the JVM: the Python data source
(:class:`castsql.spark.datasource.CastSQLDataSource`) hands each through
Arrow to a Python worker and back, which is why it stays only as the
fallback where the jar cannot be built or loaded.

Errors come back as the JVM exception to throw: CastSQL's own as one line
(``IllegalArgumentException``), a failed Spark job as Spark's own exception.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from castsql.errors import CastSQLError
from castsql.format import TableLog
from castsql.spark.datasource_options import (
    check_known,
    get_option,
    int_option,
    option_spelling,
    s3_config,
    table_path,
)
from castsql.spark.datasource_read import resolve_read
from castsql.spark.datasource_write import (
    FilesWritten,
    WritePlan,
    commit_files,
    commit_write,
    plan_write,
    write_attempt,
)
from castsql.spark.errors import BadOption
from castsql.spark.jvm.loader import load_jar
from castsql.spark.types import spark_schema
from castsql.storage import open_storage
from castsql.storage.local import LocalStorage
from castsql.write.pipeline import last_batch

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Options a read pins (the version it resolved replaces both).
_PINNED_OUT = ("versionasof", "timestampasof")


def install(spark: SparkSession) -> bool:
    """Make ``format("castsql")`` the JVM data source in ``spark``'s JVM:
    its jar (:func:`castsql.spark.jvm.build.locate`: built once where an
    installed package has none) added to the class loader Spark looks data
    sources up in, py4j's callback server started, this driver's handler
    installed. False, with a warning saying why, where there is no jar to
    load or that class loader cannot take it: the caller then registers the
    Python data source."""
    from pyspark.java_gateway import ensure_callback_server_started

    jar, why = load_jar(spark)
    if jar is None:
        _fallback(why)
        return False
    sc = spark.sparkContext
    ensure_callback_server_started(sc._gateway)
    jvm: Any = sc._jvm  # py4j: untyped, and set once the session runs
    jvm.castsql.spark.jvm.CastSQLProvider.install(Handler())
    return True


@functools.cache
def _fallback(why: str) -> None:
    """Say once per reason that ``format("castsql")`` is the slower Python data source."""
    log.warning(
        "castsql: format('castsql') is the Python data source (2-2.6x a plain Parquet read or write, where "
        "the JVM data source takes 1.1-1.5x): %s",
        why,
    )


def _session(jsession: Any) -> SparkSession:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and active._jsparkSession.equals(jsession):
        return active
    return SparkSession(_active_context(), jsession)


def _active_context() -> SparkContext:
    """The running SparkContext: the JVM half calls in only while one runs."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    assert sc is not None, "no SparkContext is running"
    return sc


def _answer(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the JVM exception the Java half is to throw."""
    from py4j.protocol import Py4JJavaError

    jvm: Any = _active_context()._jvm  # py4j: untyped
    try:
        return fn()
    except Py4JJavaError as e:
        return e.java_exception  # a Spark job's own failure, as Spark reports it
    except CastSQLError as e:
        return jvm.java.lang.IllegalArgumentException(option_spelling(str(e)))
    except Exception as e:
        if (origin := _jvm_origin(e)) is not None:
            return origin  # a Spark error, converted by PySpark on the way here: the JVM's own again
        log.exception("format('castsql') failed")
        return jvm.java.lang.RuntimeException(f"castsql: {type(e).__name__}: {e}")


def _jvm_origin(e: BaseException) -> Any:
    """The JVM exception PySpark converted into ``e``: kept as ``_origin`` by
    most, only as the context of the conversion's ``raise … from None`` by
    some (a Python UDF's PythonException)."""
    from py4j.java_gateway import JavaObject
    from py4j.protocol import Py4JJavaError

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(origin := getattr(seen, "_origin", None), JavaObject):
            return origin
        if isinstance(seen, Py4JJavaError):
            return seen.java_exception
        seen = seen.__context__
    return None


def _options(joptions: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in joptions.items()}


class Handler:
    """``castsql.spark.jvm.Handler``, called by the JVM on py4j's callback server."""

    def open(self, jsession: Any, joptions: Any) -> Any:
        return _answer(lambda: _open(_session(jsession), _options(joptions)))

    def scan(self, jsession: Any, joptions: Any, columns: Any, filters: Any) -> Any:
        return _answer(lambda: _scan(_session(jsession), _options(joptions), list(columns), list(filters))._jdf)

    def write(self, jsession: Any, jdata: Any, mode: str, joptions: Any) -> Any:
        return _answer(lambda: _write(_frame(jsession, jdata), str(mode), _options(joptions)))

    def writeBatch(self, jsession: Any, jdata: Any, batch_id: int, complete: bool, joptions: Any) -> Any:
        return _answer(lambda: _write_batch(_frame(jsession, jdata), int(batch_id), bool(complete), _options(joptions)))

    class Java:
        implements = ["castsql.spark.jvm.Handler"]


def _frame(jsession: Any, jdata: Any) -> DataFrame:
    from pyspark.sql import DataFrame

    return DataFrame(jdata, _session(jsession))


# ---------------------------------------------------------------------- read


def _open(spark: SparkSession, options: dict[str, str]) -> Any:

    check_known(options)
    storage = open_storage(table_path(options), s3=s3_config(options))
    when = get_option(options, "timestampAsOf")
    at = None if when is None else _in_zone(when, spark.conf.get("spark.sql.session.timeZone", "UTC") or "UTC")
    snap = resolve_read(TableLog(storage), int_option(options, "versionAsOf"), at, storage.root)
    jvm: Any = _active_context()._jvm  # py4j: untyped
    pinned = jvm.java.util.HashMap()
    for k, v in options.items():
        if k.lower() not in _PINNED_OUT:
            pinned.put(k, v)
    pinned.put("versionAsOf", str(snap.version))
    pinned.put("__schema", spark_schema(snap.schema).json())
    return pinned


def _in_zone(text: str, zone: str) -> str | datetime:
    """``timestampAsOf`` as Delta reads it: a time without a zone is in the
    session's time zone (``spark.sql.session.timeZone``); text that is not a
    time is left for the version lookup to refuse in its own words."""
    from zoneinfo import ZoneInfo

    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        return t if t.tzinfo is not None else t.replace(tzinfo=ZoneInfo(zone))
    except (ValueError, KeyError):  # not a time, or a zone Python does not know (then UTC)
        return text


def _scan(spark: SparkSession, options: dict[str, str], columns: list[str], jfilters: list[Any]) -> DataFrame:
    """:func:`castsql.spark.read`'s DataFrame of ``columns``, from the files of
    the pinned version whose manifest statistics may match Spark's pushed
    filters (:meth:`castsql.snapshot.Snapshot.prune`): the others are never
    opened. Spark applies every filter to the rows above this scan."""
    from castsql.spark.datasource_read import predicates
    from castsql.spark.reader import read_resolved

    # register() pointed this SparkContext's Python workers at castsql already (prepare_workers).
    log = TableLog(open_storage(table_path(options), s3=s3_config(options)))
    snap = resolve_read(log, int_option(options, "versionAsOf"), None, log.storage.root)
    preds = predicates(snap.schema, [f for f in map(python_filter, jfilters) if f is not None])
    if preds:
        snap = snap.prune(preds)
    return read_resolved(spark, log, snap, columns)


def python_filter(jfilter: Any) -> Any:
    """A JVM ``org.apache.spark.sql.sources.Filter`` as the
    ``pyspark.sql.datasource`` filter of the same meaning (what
    :func:`castsql.spark.datasource_read.predicates` prunes by), or None for one
    it does not use or a value it cannot take over exactly."""
    from pyspark.sql import datasource as ds

    kind = jfilter.getClass().getSimpleName()
    simple = {
        "EqualTo": ds.EqualTo,
        "EqualNullSafe": ds.EqualNullSafe,
        "GreaterThan": ds.GreaterThan,
        "GreaterThanOrEqual": ds.GreaterThanOrEqual,
        "LessThan": ds.LessThan,
        "LessThanOrEqual": ds.LessThanOrEqual,
    }
    try:
        if kind in simple:
            value = _python_value(jfilter.value())
            return None if value is _UNKNOWN else simple[kind]((str(jfilter.attribute()),), value)
        if kind == "In":
            values = [_python_value(v) for v in jfilter.values()]
            return None if _UNKNOWN in values else ds.In((str(jfilter.attribute()),), tuple(values))
    except Exception:  # a value of a kind not seen before: no pruning by it, never a failed query
        log.debug("castsql: filter %s not used for pruning", jfilter, exc_info=True)
    return None


_UNKNOWN = object()


def _python_value(v: Any) -> Any:
    """py4j turns numbers, strings, booleans and decimals into Python's own;
    dates and times arrive as JVM objects."""
    from py4j.java_gateway import JavaObject

    if not isinstance(v, JavaObject):
        return v
    kind = v.getClass().getName()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    if kind == "java.sql.Timestamp":  # TIMESTAMP: an instant
        return epoch + timedelta(seconds=v.getTime() // 1000, microseconds=v.getNanos() // 1000)
    if kind == "java.time.Instant":
        return epoch + timedelta(seconds=v.getEpochSecond(), microseconds=v.getNano() // 1000)
    if kind == "java.time.LocalDateTime":  # TIMESTAMP_NTZ: a wall-clock time
        return datetime.fromisoformat(v.toString())
    if kind in ("java.sql.Date", "java.time.LocalDate"):
        return date.fromisoformat(v.toString())
    return _UNKNOWN


# ---------------------------------------------------------------------- write


def _write(df: DataFrame, mode: str, options: dict[str, str]) -> None:
    """``df.write.format("castsql").mode(mode)``: one new version, as Delta's
    save modes: append adds, overwrite replaces, ``errorifexists`` (Spark's
    default) creates or refuses, ``ignore`` creates or does nothing."""
    check_known(options)
    parts = json.loads(get_option(options, "__partition_columns") or "[]")
    if parts:
        raise BadOption(f"format('castsql'): CastSQL tables are not partitioned; drop partitionBy({', '.join(parts)})")
    if mode not in ("Append", "Overwrite", "ErrorIfExists", "Ignore"):
        raise BadOption(f"format('castsql'): save mode {mode!r} is not supported")
    storage = open_storage(table_path(options), s3=s3_config(options))
    names = _table_names(storage)
    if names is not None and mode == "Ignore":
        return None
    if names is not None and mode == "ErrorIfExists":
        raise BadOption(
            f"{storage.root}: the table already exists; mode 'errorifexists' (Spark's default) only creates "
            "tables: use .mode('append') or .mode('overwrite')"
        )
    df = _table_case(df, names)
    plan = plan_write(options, df.schema, overwrite=mode == "Overwrite")
    if plan.replayed:
        return None  # txnAppId/txnVersion the table holds already: nothing to write
    commit_write(plan, [FilesWritten(_write_files(df, plan, options))])
    return None


def _table_names(storage: Any) -> list[str] | None:
    """The latest version's column names, or None where there is no table."""
    from castsql.errors import TableNotFound

    try:
        return TableLog(storage).latest().schema.names
    except TableNotFound:
        return None


def _table_case(df: DataFrame, names: list[str] | None) -> DataFrame:
    """``df`` with its columns named as the table's (``names``) where they
    differ only in case: Spark resolves names case-insensitively unless
    ``spark.sql.caseSensitive`` is on, and so does a write to a Delta table."""
    if names is None or (df.sparkSession.conf.get("spark.sql.caseSensitive", "false") or "").lower() == "true":
        return df
    lower = {n.lower(): n for n in names}
    renames = {c: lower[c.lower()] for c in df.columns if c not in names and c.lower() in lower}
    return df.withColumnsRenamed(renames) if renames else df


def _write_batch(df: DataFrame, batch_id: int, complete: bool, options: dict[str, str]) -> None:
    # The queryId option, else Spark's query id (kept in the checkpoint): never the
    # checkpoint's path, which a new query may reuse (or share, under a session-wide root).
    query = get_option(options, "queryId") or get_option(options, "__streamQueryId") or table_path(options)
    df = _table_case(df, _table_names(open_storage(table_path(options), s3=s3_config(options))))
    plan = plan_write(options, df.schema, overwrite=complete)
    storage = plan.ref.storage()
    if plan.exists and last_batch(TableLog(storage), query) >= batch_id:
        return None  # a restart replaying a batch the table already holds
    entries = _write_files(df, plan, options)
    commit_files(plan, [FilesWritten(entries)], {"stream_query": query, "stream_batch": batch_id})
    return None


def _write_files(df: DataFrame, plan: WritePlan, options: dict[str, str]) -> list[str]:
    """The new data files' manifest entries (JSON), written by Spark's own
    Parquet writer where it can write this table, else by the Python workers."""
    from castsql.spark.native_write import why_not, write_native

    storage = plan.ref.storage()
    spark = df.sparkSession
    schema = plan.ref.schema
    if get_option(options, "targetFileBytes") is None and why_not(storage, schema, spark) is None:
        assert isinstance(storage, LocalStorage)  # why_not() refuses every other store
        files = write_native(spark, storage, df, schema, plan.row_group_size)
        return [json.dumps(f.to_json()) for f in files]
    fn = functools.partial(_attempt, plan)
    return [r.entry for r in df.mapInArrow(fn, "entry string").collect()]


def _attempt(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # Only the attempts Spark collects from are committed; a failed attempt's files are orphans for gc.
    entries = write_attempt(plan, batches).entries
    yield pa.RecordBatch.from_pydict({"entry": entries}, pa.schema([("entry", pa.string())]))
