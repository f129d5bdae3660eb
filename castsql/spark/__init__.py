"""Spark writes the tables: append, delete by predicate, update, merge
(upsert), compaction and a Spark reader of any version; plus garbage
collection, which needs no Spark.

Importing this package imports nothing of Spark (its names load on first use),
so ``gc`` works without the ``spark`` extra; what needs Spark says so
(:class:`castsql.errors.MissingExtra`).

Example::

    >>> from castsql.spark import spark_session, append, delete, read   # doctest: +SKIP
    >>> spark = spark_session()                                          # doctest: +SKIP
    >>> append(spark, "/data/events", spark.range(10), primary_key="id") # doctest: +SKIP
    >>> delete(spark, "/data/events", "id % 2 = 0").version              # doctest: +SKIP
    2
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562): ``castsql gc`` imports this package and must
# work where pyspark and numpy are not installed (``pip install castsql``).
_EXPORTS = {
    "FILE_COL": "castsql.spark.tasks",
    "POS_COL": "castsql.spark.tasks",
    "GCReport": "castsql.write.garbage",
    "append": "castsql.spark.appends",
    "cdc_merge": "castsql.spark.engine",
    "compact": "castsql.spark.compactor",
    "delete": "castsql.spark.engine",
    "gc": "castsql.write.garbage",
    "merge": "castsql.spark.engine",
    "update": "castsql.spark.engine",
    "read": "castsql.spark.reader",
    "register": "castsql.spark.session",
    "register_views": "castsql.spark.session",
    "spark_session": "castsql.spark.session",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'castsql.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
