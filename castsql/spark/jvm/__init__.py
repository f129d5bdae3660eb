"""``format("castsql")`` as a JVM data source: the Java half (``*.java`` here,
built into ``castsql-spark.jar`` by ``python -m castsql.spark.jvm.build``) and
where the jar lies. The Python half is :mod:`castsql.spark.bridge`."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
JAR = HERE / "castsql-spark.jar"
PROVIDER = "castsql.spark.jvm.CastSQLProvider"
SOURCES = tuple(sorted(HERE.glob("*.java")))
