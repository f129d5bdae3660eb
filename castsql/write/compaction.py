"""Compaction, planned once for both engines: which data files to rewrite,
which tombstone files to fold, and the ``COMPACT`` change that commits it.

An engine supplies the live rows of each data file (a count, and the rows
themselves when rewriting): the embedded engine (:mod:`castsql.embedded.compactor`)
with DuckDB in this process, Spark (:mod:`castsql.spark.compactor`) with tasks
on a cluster. Both commit the same change, under the same conflict rules
(FORMAT.md §7): it names the version it read and that version's tombstones, so
a delete, update or merge committed meanwhile makes it conflict and it is
planned again; rows are never lost either way.

What is rewritten:

- a data file whose deleted fraction is at least ``threshold`` (its live rows
  into new files; a file with none is dropped);
- with ``target_file_bytes`` (bin-packing; the embedded engine), every data
  file whose live data is under that size, packed greedily in table order
  into bins of about that size: each bin becomes new files of that size (the
  seed's 256 MB, by default), so a stream's hundreds of tiny files become one.
  A bin of one small file that has no deletes to drop is left alone:
  rewriting it gains nothing. With ``sort_by`` they are one bin, sorted as a
  whole, so the new files hold disjoint ranges of that column.
- ``tiered`` (automatic compaction): of the small files, only the smallest
  ones, in increasing size, up to the first file larger than ``TIER_RATIO``
  times all the smaller ones together. A stream's base file is not rewritten
  to add a few batches to it: each compaction costs about what the batches
  since the last one wrote, a byte is rewritten a logarithmic number of times
  (as in an LSM tree's size tiers), and no one commit stalls on the whole table.

Tombstone files: one that names only removed data files goes; every other one
that names a removed file, and every small one, is merged into one new
tombstone file with the fewest records per data file (whole row groups, key
ranges, one position bitmap). Large tombstone files that name no removed file
stay.

Example::

    >>> plan = plan_compaction(log, snap, live_rows, threshold=0.5, target_file_bytes=256 << 20)  # doctest: +SKIP
    >>> [len(b) for b in plan.bins], plan.drop                                          # doctest: +SKIP
    ([301], [])
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pyroaring import BitMap

from castsql.format import (
    Change,
    DataFile,
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    TableLog,
    TombstoneRecord,
)
from castsql.format.layout import new_tombstone_key
from castsql.format.tombstone import serialize_tombstones
from castsql.snapshot import Snapshot
from castsql.snapshot.footer import row_group_rows
from castsql.snapshot.resolve import ResolvedFile

SMALL_TOMBSTONE_BYTES = 1024 * 1024
TIER_RATIO = 4


@dataclass
class CompactionPlan:
    """What a compaction of one version would do."""

    version: int
    bins: list[list[ResolvedFile]] = field(default_factory=list)  # each bin's live rows become new files
    drop: list[str] = field(default_factory=list)  # keys of files with no live rows
    remove_tombstones: list[str] = field(default_factory=list)
    merged_records: list[TombstoneRecord] = field(default_factory=list)
    live_rows: dict[str, int] = field(default_factory=dict)

    @property
    def rewrite(self) -> list[ResolvedFile]:
        return [f for b in self.bins for f in b]

    @property
    def removed_files(self) -> list[str]:
        return [f.key for f in self.rewrite] + self.drop

    def __bool__(self) -> bool:
        return bool(self.bins or self.drop or self.remove_tombstones)


def plan_compaction(
    log: TableLog,
    snap: Snapshot,
    live_rows: dict[str, int],
    *,
    threshold: float,
    small_tombstone_bytes: int = SMALL_TOMBSTONE_BYTES,
    target_file_bytes: int | None = None,
    sort_by: str | None = None,
    tiered: bool = False,
) -> CompactionPlan:
    """The plan for ``snap`` given each live file's live rows (``live_rows``,
    by key). ``target_file_bytes`` None: no bin-packing (Spark rewrites one
    file per task)."""
    state = log.state(snap.manifest)
    plan = CompactionPlan(snap.version, live_rows=dict(live_rows))
    live = {f.key: f for f in snap.files}
    deleted: list[ResolvedFile] = []  # past the threshold: rewritten whatever their size
    for f in state.entries():
        key = f.path  # entries of a version hold table keys
        if key not in live:
            plan.drop.append(key)  # every row deleted
            continue
        n = live_rows[key]
        if f.total_rows and n < f.total_rows and (f.total_rows - n) / f.total_rows >= threshold:
            if n == 0:
                plan.drop.append(key)
            else:
                deleted.append(live[key])
    if target_file_bytes is None:
        plan.bins = [[f] for f in deleted]
    else:
        plan.bins = _bins(snap, live, live_rows, deleted, target_file_bytes, sort_by, tiered)
    _fold_tombstones(log, state, plan, live, small_tombstone_bytes)
    return plan


def _live_bytes(f: ResolvedFile, live: int) -> float:
    return f.entry.size_bytes * (live / f.total_rows) if f.total_rows else 0.0


def _bins(
    snap: Snapshot,
    live: dict[str, ResolvedFile],
    live_rows: dict[str, int],
    deleted: list[ResolvedFile],
    target: int,
    sort_by: str | None,
    tiered: bool = False,
) -> list[list[ResolvedFile]]:
    must = {f.key for f in deleted}
    small = [f for f in live.values() if f.key in must or _live_bytes(f, live_rows[f.key]) < target]
    if tiered:
        small = _lowest_tier(small, must, live_rows)
    if sort_by is not None:
        # One bin, sorted as a whole and cut into files of the target size:
        # the new files then hold disjoint ranges of the column (bins sorted
        # one by one would overlap whenever the small files do, as a stream's do).
        return [small] if len(small) > 1 or any(f.key in must for f in small) else []
    bins: list[list[ResolvedFile]] = []
    current: list[ResolvedFile] = []
    size = 0.0
    for f in small:
        b = _live_bytes(f, live_rows[f.key])
        if current and size + b > target:
            bins.append(current)
            current, size = [], 0.0
        current.append(f)
        size += b
    if current:
        bins.append(current)
    # A lone file without deletes past the threshold would be copied as it is.
    return [b for b in bins if len(b) > 1 or b[0].key in must]


def _lowest_tier(small: list[ResolvedFile], must: set[str], live_rows: dict[str, int]) -> list[ResolvedFile]:
    """The files a tiered compaction merges: those past the deleted-fraction
    threshold, and the small ones in increasing size up to the first that is
    more than ``TIER_RATIO`` times all the smaller ones together; in table order."""
    by_size = sorted((f for f in small if f.key not in must), key=lambda f: _live_bytes(f, live_rows[f.key]))
    chosen: set[str] = set(must)
    total = 0.0
    for f in by_size:
        b = _live_bytes(f, live_rows[f.key])
        if total and b > TIER_RATIO * total:
            break
        chosen.add(f.key)
        total += b
    return [f for f in small if f.key in chosen]


def _fold_tombstones(
    log: TableLog, state: Any, plan: CompactionPlan, live: dict[str, ResolvedFile], small_tombstone_bytes: int
) -> None:
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
        plan.merged_records = merge_records(surviving, live, log)


def file_row_groups(log: TableLog, f: ResolvedFile) -> tuple[int, ...]:
    """Rows per row group of a snapshot file (from the footer for seed manifests that do not list them)."""
    if f.row_group_rows is None:
        f.row_group_rows = row_group_rows(log.storage, f.key, f.entry.size_bytes)
    return f.row_group_rows


def merge_records(
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


def compaction_change(log: TableLog, snap: Snapshot, plan: CompactionPlan, added: list[DataFile], rows: int) -> Change:
    """The ``COMPACT`` change of ``plan``, with the files its rewrites wrote
    (``rows`` live rows in all); writes the merged tombstone file if any."""
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
    return Change(
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
