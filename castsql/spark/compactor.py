"""Compaction: rewrite heavily deleted data files and merge tombstone files,
as one commit that changes no query result.

A data file whose deleted fraction is at least ``threshold`` is rewritten by a
Spark task into new file(s) holding only its live rows, in their order; a file
with no live rows is just dropped. Tombstone files are then tidied: one that
names only dropped files goes; every other one that names a dropped file, and
every small one (under ``small_tombstone_bytes``), is merged into one new
tombstone file holding their records that still name files of the table
(per file: row groups, key ranges and one position bitmap). Large tombstone
files that name no dropped file stay as they are.

The commit is a ``COMPACT`` change with ``read_version`` and the tombstones it
read (docs/FORMAT.md §7): a delete committed meanwhile makes it conflict, and
it is then recomputed from the new version (up to ``attempts`` times). Old
versions still reference the old files, so time travel to them works until
:func:`castsql.spark.gc` removes them.

Example::

    >>> m = compact(spark, "/data/events", threshold=0.3)   # doctest: +SKIP
    >>> m.summary["removed_files"], m.summary["added_files"]  # doctest: +SKIP
    (4, 4)
"""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING

from castsql.errors import CommitConflict
from castsql.format import DataFile, Manifest, TableLog
from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.snapshot import Snapshot, resolve
from castsql.spark.errors import job_errors
from castsql.spark.reader import file_unit, table_ref, units_frame
from castsql.spark.tasks import count_task, rewrite_task
from castsql.storage import S3Config, open_storage
from castsql.write.compaction import SMALL_TOMBSTONE_BYTES, CompactionPlan, compaction_change
from castsql.write.compaction import plan_compaction as shared_plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)


def _live_counts(spark: SparkSession, log: TableLog, snap: Snapshot) -> dict[str, int]:
    """Live rows per data file of ``snap``: from the bitmaps alone, except for
    files with key-range deletes, which take a scan of their key column."""
    counts = {f.key: f.total_rows - len(f.deleted) for f in snap.files if not f.key_ranges}
    ranged = [f for f in snap.files if f.key_ranges]
    if ranged:
        fn = functools.partial(count_task, table_ref(log, snap))
        with job_errors(f"{log.uri}: compact (counting live rows)"):
            rows = units_frame(spark, [file_unit(log, f) for f in ranged]).mapInArrow(fn, "key string, live long")
            for r in rows.collect():
                counts[r.key] = counts.get(r.key, 0) + r.live
    return counts


def plan_compaction(
    spark: SparkSession, log: TableLog, snap: Snapshot, threshold: float, small_tombstone_bytes: int
) -> CompactionPlan:
    """The shared plan (:func:`castsql.write.compaction.plan_compaction`), one
    file per bin: a Spark task rewrites each file on its own."""
    counts = _live_counts(spark, log, snap)
    return shared_plan(log, snap, counts, threshold=threshold, small_tombstone_bytes=small_tombstone_bytes)


def compact(
    spark: SparkSession,
    uri: str,
    *,
    threshold: float = 0.5,
    s3: S3Config | None = None,
    small_tombstone_bytes: int = SMALL_TOMBSTONE_BYTES,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    attempts: int = 5,
) -> Manifest | None:
    """Compact the latest version of the table at ``uri``; returns the
    committed manifest, or None if there was nothing to do.

    ``threshold`` (0 < t <= 1) is the deleted fraction from which a data file
    is rewritten.

    Example::

        >>> compact(spark, "/data/events", threshold=0.5).operation   # doctest: +SKIP
        'COMPACT'
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    log = TableLog(open_storage(uri, s3=s3))
    for attempt in range(attempts):
        snap = resolve(log)
        plan = plan_compaction(spark, log, snap, threshold, small_tombstone_bytes)
        if not plan:
            return None
        try:
            return _commit(spark, log, snap, plan, row_group_size, target_file_bytes)
        except CommitConflict as e:
            if attempt == attempts - 1:
                raise CommitConflict(f"{e}; gave up after {attempts} attempts") from None
            _log.warning("compaction of version %d conflicted: %s; recomputing", snap.version, e)
    raise AssertionError("unreachable")


def _commit(
    spark: SparkSession,
    log: TableLog,
    snap: Snapshot,
    plan: CompactionPlan,
    row_group_size: int,
    target_file_bytes: int,
) -> Manifest:
    added: list[DataFile] = []
    rows = 0
    if plan.rewrite:
        fn = functools.partial(rewrite_task, table_ref(log, snap), row_group_size, target_file_bytes)
        units = [file_unit(log, f, tag=f.key) for f in plan.rewrite]
        with job_errors(f"{log.uri}: compact"):
            results = units_frame(spark, units).mapInArrow(fn, "result string").collect()  # the one action
        for r in results:
            res = json.loads(r.result)
            if res["rows"] != plan.live_rows[res["source"]]:
                raise CommitConflict(
                    f"{log.uri}: compact read {res['rows']} live rows of {res['source']}, "
                    f"expected {plan.live_rows[res['source']]}; nothing was committed"
                )
            rows += res["rows"]
            added += [DataFile.from_json(e, "compact task") for e in res["entries"]]
    return log.commit(compaction_change(log, snap, plan, added, rows))
