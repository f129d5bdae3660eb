"""Spark writes the tables: append, delete by predicate, compaction and a
Spark reader of any version; plus garbage collection, which needs no Spark.

Importing this package does not import pyspark (nothing here touches it until
a function that needs a session runs), so ``gc`` works without Spark.

Example::

    >>> from castsql.spark import spark_session, append, delete, read   # doctest: +SKIP
    >>> spark = spark_session()                                          # doctest: +SKIP
    >>> append(spark, "/data/events", spark.range(10), primary_key="id") # doctest: +SKIP
    >>> delete(spark, "/data/events", "id % 2 = 0").version              # doctest: +SKIP
    2
"""

from castsql.spark.compactor import compact
from castsql.spark.deleter import delete
from castsql.spark.garbage import GCReport, gc
from castsql.spark.reader import read
from castsql.spark.session import spark_session
from castsql.spark.tasks import FILE_COL, POS_COL
from castsql.spark.writer import append

__all__ = ["FILE_COL", "POS_COL", "GCReport", "append", "compact", "delete", "gc", "read", "spark_session"]
