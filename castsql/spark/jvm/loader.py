"""``castsql-spark.jar`` into a running Spark: the driver's class loader (for
``format("castsql")``) and the executors (for the classes a plan uses in
tasks: :class:`castsql.spark.jvm.Deleted`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from castsql.spark.jvm import PROVIDER
from castsql.spark.jvm.build import locate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def load_jar(spark: SparkSession) -> tuple[Path | None, str]:
    """Add castsql-spark.jar to the class loader PySpark's JVM threads share:
    the jar once it is there, else None and why it cannot be."""
    from py4j.protocol import Py4JJavaError

    jar, why = locate()
    if jar is None:
        return None, why
    jvm: Any = spark.sparkContext._jvm  # py4j: untyped, and set once the session runs
    loader = jvm.Thread.currentThread().getContextClassLoader()
    # PySpark's JVM threads share spark-submit's MutableURLClassLoader: a jar
    # added to it is seen by every thread (a SQL ``ADD JAR`` only by one).
    if loader is None or loader.getClass().getName() != "org.apache.spark.util.MutableURLClassLoader":
        return None, "this JVM's context class loader is not spark-submit's (was the session started from PySpark?)"
    url = jvm.java.io.File(str(jar)).toURI().toURL()
    if not any(u.equals(url) for u in loader.getURLs()):
        loader.addURL(url)
    try:
        loader.loadClass(PROVIDER)
    except Py4JJavaError:  # a jar this JVM cannot load (built for another Spark)
        return None, f"{jar} cannot be loaded by this JVM: remove it and call castsql.spark.register in a new process"
    return jar, ""


def ship_jar(spark: SparkSession) -> bool:
    """castsql-spark.jar loaded in the driver and sent to the executors
    (``SparkContext.addJar``: they load it before their next task), so a plan
    may use its classes in tasks; False where there is no jar to load.

    Example::

        >>> ship_jar(spark)                    # doctest: +SKIP
        True
    """
    jar, _ = load_jar(spark)
    if jar is None:
        return False
    jsc = spark.sparkContext._jsc.sc()
    if f"/{jar.name}\n" not in jsc.listJars().mkString("\n") + "\n":
        jsc.addJar(str(jar))
    return True
