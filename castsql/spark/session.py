"""The local Spark session every CastSQL writer job runs in.

Spark is only the engine that moves Arrow batches between tasks: its workers
write and read the table through :mod:`castsql.storage` (there is no Hadoop S3
connector here), so the session needs no jars and no network beyond
127.0.0.1.

Example::

    >>> spark = spark_session()  # doctest: +SKIP
    >>> spark.conf.get("spark.sql.session.timeZone")  # doctest: +SKIP
    'UTC'
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from castsql.storage import S3Config

MASTER_ENV = "CASTSQL_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"

_LOG4J = Path(__file__).with_name("log4j2.properties")


def _prepare_environment() -> None:
    # Spark binds its driver and block manager to SPARK_LOCAL_IP; without it a
    # host whose name resolves to another interface makes Spark reach out there.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Workers must run this interpreter (the venv) so they can import castsql.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # An editable install makes castsql importable anyway; running from a source
    # checkout does not, so put the package's parent on the workers' path.
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def spark_session(
    app_name: str = "castsql",
    *,
    master: str | None = None,
    progress: bool = False,
    ui: bool = False,
    shuffle_partitions: int = 4,
) -> SparkSession:
    """Get the running Spark session or start a local one for CastSQL jobs.

    ``master`` defaults to ``$CASTSQL_SPARK_MASTER`` or ``local[2]``. The
    session runs in UTC, with Arrow on, few shuffle partitions, no web UI
    (unless ``ui``) and Spark's console progress bar only when ``progress``.
    A session that is already running is returned as it is (Spark keeps one
    per process), except that the settings CastSQL relies on are re-applied.

    Example::

        >>> from castsql.spark import spark_session, read
        >>> spark = spark_session()                              # doctest: +SKIP
        >>> read(spark, "/data/events").count()                  # doctest: +SKIP
        1000000
    """
    _prepare_environment()
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}"
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(max(2, os.cpu_count() or 2)))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.fallback.enabled", "false")
        # Spark's own Parquet writer (never used for table data) would write INT96.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.python.worker.reuse", "true")
        # pyspark's worker daemon, minus the BrokenPipeError tracebacks of the
        # tasks Spark cancels when another task of the job fails.
        .config("spark.python.daemon.module", "castsql.spark.daemon")
    )
    spark = builder.getOrCreate()
    # Runtime settings of a session someone else started: make them ours.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    register(spark)
    return spark


# ---------------------------------------------------------------------- any session

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> SparkSession:
    """Register the ``castsql`` data source in ``spark`` (any session; calling
    it again is harmless) and return the session.

    Afterwards ``spark.read.format("castsql").load(uri)`` (options
    ``versionAsOf``, ``timestampAsOf``), ``df.write.format("castsql")`` and
    ``df.writeStream.format("castsql")`` work, as does ``CREATE TEMPORARY
    VIEW v USING castsql OPTIONS (path '…')``. ``castsql`` is the JVM data
    source of ``castsql-spark.jar`` (:mod:`castsql.spark.bridge`: Spark's own
    Parquet reader and writer, filters pruning files and row groups), or,
    where the jar is not built, the Python data source
    (:mod:`castsql.spark.datasource`), whose pushed filters prune nothing
    (see :data:`castsql.spark.datasource_read.PRUNE_PUSHED_FILTERS`).

    Example::

        >>> register(spark).read.format("castsql").option("versionAsOf", 2).load("/data/events")  # doctest: +SKIP
        DataFrame[id: bigint, ts: timestamp, user: string, kind: string, amount: double]
    """
    from castsql.spark.bridge import install
    from castsql.spark.datasource import CastSQLDataSource, for_session
    from castsql.spark.units import Splits
    from castsql.spark.workers import prepare_workers

    prepare_workers(spark)
    if install(spark):
        return spark
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(CastSQLDataSource.name()):
        # Spark refuses a name the *active* session has already (another session of
        # this SparkContext, newSession()), though each session looks its own up.
        jvm: Any = spark.sparkContext._jvm  # py4j: untyped, and set once the session runs
        jss = jvm.org.apache.spark.sql.SparkSession
        active = jss.getActiveSession()
        jss.setActiveSession(spark._jsparkSession)
        try:
            spark.dataSource.register(for_session(Splits.of(spark)))
        finally:
            if active.isDefined():
                jss.setActiveSession(active.get())
            else:
                jss.clearActiveSession()
    return spark


def register_views(
    spark: SparkSession,
    warehouse: str,
    version: int | None = None,
    *,
    timestamp: str | None = None,
    s3: S3Config | None = None,
) -> list[str]:
    """One temporary view per table of ``warehouse`` (a directory or prefix
    of tables), named by its sub-directory, at ``version`` / ``timestamp``
    (default: each table's latest version, fixed now). Returns the names.

    Example::

        >>> register_views(spark, "s3://bucket/wh")                    # doctest: +SKIP
        ['events', 'users']
        >>> spark.sql("SELECT count(*) FROM events").first()[0]       # doctest: +SKIP
        1896
    """
    from castsql.errors import CastSQLError, TableNotFound
    from castsql.format.layout import POINTER_KEY, manifest_key
    from castsql.format.schema import same_but_case
    from castsql.spark.types import quote
    from castsql.storage import open_storage

    register(spark)
    storage = open_storage(warehouse, s3=s3)
    tables = {}
    for child in sorted(storage.list_dirs()):
        sub = storage.child(child)
        if sub.exists(POINTER_KEY) or sub.exists(manifest_key(0)):
            tables[child] = sub
    if not tables:
        raise TableNotFound(f"{storage.root}: no tables in this warehouse")
    if pair := same_but_case(list(tables)):  # Spark's view names ignore case: one would hide the other
        raise CastSQLError(
            f"{storage.root}: tables {pair[0]!r} and {pair[1]!r} differ only in case, and Spark's view names "
            "ignore case; no views were made (register each with spark.read.format('castsql') under a name)"
        )
    frames = {}
    for child, sub in tables.items():
        reader = spark.read.format("castsql")
        for k, v in _s3_options(getattr(sub, "config", None) or s3).items():
            reader = reader.option(k, v)
        if version is not None:
            reader = reader.option("versionAsOf", str(version))
        if timestamp is not None:
            reader = reader.option("timestampAsOf", timestamp)
        frames[child] = reader.load(sub.root)
    # Every table resolved before any view is made: a failure leaves none behind.
    for child, df in frames.items():
        df.createOrReplaceTempView(quote(child))  # my-table, 2024: quoted in SQL
    return list(frames)


def _s3_options(cfg: S3Config | None) -> dict[str, str]:
    if cfg is None:
        return {}
    out = {"s3.endpoint": cfg.endpoint_url, "s3.accessKeyId": cfg.key, "s3.secretAccessKey": cfg.secret}
    out |= {"s3.sessionToken": cfg.session_token, "s3.region": cfg.region}
    return {k: v for k, v in out.items() if v}
