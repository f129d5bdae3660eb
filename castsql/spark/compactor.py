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
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyroaring import BitMap

from castsql.errors import CommitConflict
from castsql.format import (
    Change,
    DataFile,
    KeyRangeDelete,
    Manifest,
    PositionDelete,
    RowGroupDelete,
    TableLog,
    TombstoneRecord,
)
from castsql.format.layout import new_tombstone_key
from castsql.format.tombstone import serialize_tombstones
from castsql.format.writer import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
from castsql.snapshot import Snapshot, resolve
from castsql.snapshot.resolve import ResolvedFile
from castsql.spark.errors import job_errors
from castsql.spark.reader import file_row_groups, file_unit, table_ref, units_frame
from castsql.spark.tasks import count_task, rewrite_task
from castsql.storage import S3Config, open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

SMALL_TOMBSTONE_BYTES = 1024 * 1024


@dataclass
class CompactionPlan:
    """What a compaction of one version would do."""

    version: int
    rewrite: list[ResolvedFile] = field(default_factory=list)  # files with live rows to rewrite
    drop: list[str] = field(default_factory=list)  # keys of files with no live rows
    remove_tombstones: list[str] = field(default_factory=list)
    merged_records: list[TombstoneRecord] = field(default_factory=list)
    live_rows: dict[str, int] = field(default_factory=dict)

    @property
    def removed_files(self) -> list[str]:
        return [f.key for f in self.rewrite] + self.drop

    def __bool__(self) -> bool:
        return bool(self.rewrite or self.drop or self.remove_tombstones)


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


def _merge_records(
    records: list[tuple[str, TombstoneRecord]], files: dict[str, ResolvedFile], log: TableLog
) -> list[TombstoneRecord]:
    """Records of several tombstone files as the fewest records per file:
    whole row groups, key ranges, and one file-relative position bitmap."""
    groups: dict[str, set[int]] = defaultdict(set)
    ranges: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    positions: dict[str, BitMap] = defaultdict(BitMap)
    for key, r in records:
        if isinstance(r, RowGroupDelete):
            groups[key].add(r.row_group)
        elif isinstance(r, KeyRangeDelete):
            if (r.pk_min, r.pk_max) not in ranges[key]:
                ranges[key].append((r.pk_min, r.pk_max))
        elif r.row_group is None:
            positions[key] |= r.positions
        else:
            rgr = file_row_groups(log, files[key])
            positions[key] |= r.positions.shift(sum(rgr[: r.row_group]))
    out: list[TombstoneRecord] = []
    for key in files:  # table order
        if key not in groups and key not in ranges and key not in positions:
            continue
        rgr = file_row_groups(log, files[key])
        bm = positions.get(key, BitMap())
        start = 0
        for i, n in enumerate(rgr):
            if i in groups[key] or (n and bm.range_cardinality(start, start + n) == n):
                groups[key].add(i)
                bm.remove_range(start, start + n)
            start += n
        out += [RowGroupDelete(key, rg) for rg in sorted(groups[key])]
        out += [KeyRangeDelete(key, lo, hi) for lo, hi in ranges[key]]
        if bm:
            out.append(PositionDelete(key, None, bm))
    return out


def plan_compaction(
    spark: SparkSession, log: TableLog, snap: Snapshot, threshold: float, small_tombstone_bytes: int
) -> CompactionPlan:
    m = snap.manifest
    state = log.state(m)
    plan = CompactionPlan(snap.version)
    live = {f.key: f for f in snap.files}
    plan.live_rows = _live_counts(spark, log, snap)
    for f in state.entries():
        key = f.path  # entries of a version hold table keys
        if key not in live:
            plan.drop.append(key)  # every row deleted
            continue
        n = plan.live_rows[key]
        if f.total_rows and n < f.total_rows and (f.total_rows - n) / f.total_rows >= threshold:
            if n == 0:
                plan.drop.append(key)
            else:
                plan.rewrite.append(live[key])
    removed = set(plan.removed_files)
    merge: list[str] = []
    touched = False  # some kept tombstone file names a removed data file
    surviving: list[tuple[str, TombstoneRecord]] = []
    by_tombstone: dict[str, list[TombstoneRecord]] = defaultdict(list)
    for tkey, r in state.records():
        by_tombstone[tkey].append(r)
    for tkey, recs in by_tombstone.items():
        named = [state.lookup_key(r.file, f"{log.uri}: {tkey}") for r in recs]
        keep = [(k, r) for k, r in zip(named, recs, strict=True) if k not in removed]
        if not keep:
            plan.remove_tombstones.append(tkey)
        elif len(keep) < len(recs) or len(serialize_tombstones(recs)) < small_tombstone_bytes:
            touched = touched or len(keep) < len(recs)
            merge.append(tkey)
            surviving += keep
    # Rewriting a lone small tombstone file that names no removed file gains nothing.
    if len(merge) > 1 or touched:
        plan.remove_tombstones += merge
        plan.merged_records = _merge_records(surviving, live, log)
    return plan


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
    add_tombstones: tuple[str, ...] = ()
    if plan.merged_records:
        key = new_tombstone_key()
        log.storage.put_new(key, serialize_tombstones(plan.merged_records))
        add_tombstones = (key,)
    m = snap.manifest
    summary: dict[str, Any] = {
        "added_files": len(added),
        "added_rows": rows,
        "added_bytes": sum(f.size_bytes for f in added),
        "removed_files": len(plan.removed_files),
        "removed_tombstones": len(plan.remove_tombstones),
        "added_tombstones": len(add_tombstones),
        "tombstone_records": len(plan.merged_records),
    }
    change = Change(
        "COMPACT",
        add_files=tuple(added),
        remove_files=tuple(plan.removed_files),
        add_tombstones=add_tombstones,
        remove_tombstones=tuple(plan.remove_tombstones),
        tombstone_targets=frozenset(r.file for r in plan.merged_records),
        schema=m.schema,
        read_version=m.version,
        read_tombstones=frozenset(log.state(m).tombstone_keys()),
        summary=summary,
    )
    return log.commit(change)
