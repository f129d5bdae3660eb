"""Delete by predicate: one Spark job finds the rows, one tombstone file and
one manifest record them. No data file is rewritten.

The job reads the live rows of the latest version with their file key, row
group and position (:mod:`castsql.spark.reader`), evaluates the SQL condition
on each, and summarizes every (file, row group) on the workers
(:func:`castsql.spark.tasks.summarize_task`); the driver collects the
summaries once and the shared planner (:mod:`castsql.write.records`, which
the embedded engine uses too) picks, per file, the smallest set of tombstone
records:

- ``RowGroupDelete`` for each row group all of whose live rows match;
- ``KeyRangeDelete`` when it is exact: the key is strictly increasing over the
  file's live rows and the matched rows are one run of consecutive live rows,
  so the live rows with a key in [first matched, last matched] are exactly the
  matched ones;
- otherwise a ``PositionDelete`` with a file-relative roaring bitmap (a list
  up to 32 rows) for the rest.

The choice between "row groups + positions" and "one key range" is the one
whose JSON is shorter (row groups win ties: readers skip them without
reading). :func:`castsql.spark.engine.delete` (``castsql.spark.delete``)
commits the plan through the one write sequence (:mod:`castsql.write.pipeline`),
whose conflict rules (docs/FORMAT.md §7) replan from a new version when a
concurrent commit removed a file the plan names or deleted rows of one.

Example::

    >>> plan = plan_delete(spark, log, resolve(log), "kind = 'test'")   # doctest: +SKIP
    >>> plan.rows, [type(r).__name__ for r in plan.records]               # doctest: +SKIP
    (5120, ['RowGroupDelete', 'PositionDelete'])
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from castsql.errors import CastSQLError
from castsql.format import TableLog
from castsql.snapshot import Snapshot
from castsql.spark.errors import BadCondition, check_types, job_errors
from castsql.spark.reader import read_snapshot
from castsql.spark.tasks import summarize_task
from castsql.write.records import FILE_COL, MATCH_COL, PK_COL, POS_COL, RG_COL, DeletePlan, key_range_type, plan_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def plan_delete(spark: SparkSession, log: TableLog, snap: Snapshot, where: str) -> DeletePlan:
    """Run the delete's one Spark job against ``snap`` and choose its records."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    cond = F.expr(where)  # a syntax error raises ParseException here
    # Read only the columns the condition can name (and the key): workers
    # then decode a fraction of each row group. Should the guess miss one, the
    # condition is analysed again over every column, which also makes Spark's
    # error list them all.
    pk = snap.primary_key
    named = [c for c in snap.schema.names if c == pk or re.search(rf"(?<!\w){re.escape(c)}(?!\w)", where, re.I)]
    try:
        df = read_snapshot(spark, log, snap, positions=True, row_groups=True, columns=named or None)
        probe = df.select(cond.alias(MATCH_COL))
    except AnalysisException:
        df = read_snapshot(spark, log, snap, positions=True, row_groups=True)
        probe = df.select(cond.alias(MATCH_COL))  # unknown columns raise AnalysisException here
    if not isinstance(probe.schema[MATCH_COL].dataType, BooleanType):
        raise BadCondition(
            f"the delete condition must be true or false for each row; {where!r} is "
            f"{probe.schema[MATCH_COL].dataType.simpleString()}"
        )
    check_types(probe, log.uri, "condition", where)  # "kind = 5" on a string column: refused before the job
    cols = [F.col(FILE_COL), F.col(RG_COL), F.col(POS_COL), F.coalesce(cond, F.lit(False)).alias(MATCH_COL)]
    pk_ok = pk is not None and key_range_type(snap.schema.to_arrow().field(pk).type)
    if pk_ok and pk is not None:
        cols.append(F.col(pk).alias(PK_COL))
    with job_errors(f"{log.uri}: delete"):
        rows = df.select(*cols).mapInArrow(summarize_task, "summary string").collect()  # the one action
    per_file: dict[str, list[dict[str, Any]]] = defaultdict(list)
    seen = set()
    for r in rows:
        u = json.loads(r.summary)
        if (u["key"], u["rg"]) in seen:  # the plan keeps a unit in one task; make sure
            raise CastSQLError(f"{log.uri}: delete: row group {u['rg']} of {u['key']} was summarized twice")
        seen.add((u["key"], u["rg"]))
        per_file[u["key"]].append(u)
    return plan_records(per_file, (f.key for f in snap.files), pk_ok, version=snap.version)  # manifest order
