"""Running a script that builds its own SparkSession, as a user's program would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# What every flaky script starts with: the user's own local[2,3] session (a
# failed task is retried) and ``df``, 20,000 rows in 2 partitions whose first
# attempt of the task holding id 19999 (its last row) fails once, after its
# writer had time to write the rows before it.
_PRELUDE = """
import os, sys, time
from pyspark.sql import SparkSession, functions as F
import castsql.spark as cs

uri, marker = sys.argv[1], sys.argv[2]
builder = SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
for key, value in {config!r}.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()

def once(i):
    if i == 19999 and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3)
        raise RuntimeError("first attempt fails")
    return i

ids = F.udf(once, "bigint")
df = spark.range(0, 20000, numPartitions=2).select(ids("id").alias("id"), (F.col("id") * 2).alias("v"))
"""


def run_flaky(tmp_path: Path, write: str, config: dict[str, str] | None = None) -> str:
    """Run ``write`` (Python that writes ``df`` to the table ``uri`` through
    ``spark``; see ``_PRELUDE``) in a fresh interpreter, then stop Spark;
    return the URI once it exited 0 with a task attempt failed."""
    uri = str(tmp_path / "t")
    path = tmp_path / "flaky.py"
    path.write_text(_PRELUDE.format(config=config or {}) + textwrap.dedent(write) + "\nspark.stop()\n")
    marker = tmp_path / "failed-once"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    out = subprocess.run(
        [sys.executable, str(path), uri, str(marker)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert marker.exists(), "no task attempt failed"
    return uri
