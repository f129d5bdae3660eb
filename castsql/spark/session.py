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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    return spark
