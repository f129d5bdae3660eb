"""Python workers of any SparkSession able to import castsql.

Example::

    >>> prepare_workers(SparkSession.builder.master("local[2]").getOrCreate())  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def prepare_workers(spark: SparkSession) -> None:
    """Make the Python workers of ``spark`` able to import castsql.

    A session CastSQL did not start runs its workers with ``$PYSPARK_PYTHON``
    or, unset, whatever ``python3`` is first on the PATH: often not the
    interpreter castsql is installed in. For a local master (driver and
    workers on this machine) the workers are pointed at this interpreter,
    unless the user chose one (``PYSPARK_PYTHON`` or ``spark.pyspark.python``);
    the package's parent directory is put on their ``PYTHONPATH`` too (for a
    source checkout that is not installed). A cluster's executors need castsql
    installed in their own Python (see docs/SPARK.md). Functions Spark has
    already serialized keep their interpreter: call this before making them.
    """
    sc = spark.sparkContext
    chosen = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python", None)
    if (sc.master or "").startswith("local") and not chosen and sc.pythonExec != sys.executable:
        sc.pythonExec = sys.executable
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in sc.environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        sc.environment["PYTHONPATH"] = os.pathsep.join([*paths, root])
