"""Units of work over a snapshot's files: one per row group with live rows, or
one per file (what the reader, the data source and the compactor hand Spark).

Its own module so that the reader (:mod:`castsql.spark.reader`) and the data
source (:mod:`castsql.spark.datasource`) both use it without importing each other.
"""

from __future__ import annotations

from pyroaring import BitMap

from castsql.format import TableLog
from castsql.snapshot import Snapshot
from castsql.snapshot.footer import row_group_rows
from castsql.snapshot.resolve import ResolvedFile
from castsql.spark.tasks import Unit


def file_row_groups(log: TableLog, f: ResolvedFile) -> tuple[int, ...]:
    """Rows per row group of a snapshot file (from the footer for seed manifests that do not list them)."""
    if f.row_group_rows is None:
        f.row_group_rows = row_group_rows(log.storage, f.key, f.entry.size_bytes)
    return f.row_group_rows


def row_group_units(log: TableLog, snap: Snapshot | None, files: list[ResolvedFile] | None = None) -> list[Unit]:
    """One unit per row group that still has live rows, in snapshot order."""
    units = []
    for f in files if files is not None else snap.files:  # type: ignore[union-attr]
        start = 0
        for i, n in enumerate(file_row_groups(log, f)):
            end = start + n
            gone = f.deleted.range_cardinality(start, end) if f.deleted else 0
            if n and gone < n:
                dels = f.deleted & BitMap(range(start, end)) if gone else BitMap()
                units.append(Unit(f.key, f.entry.size_bytes, [(i, start, n)], dels, list(f.key_ranges)))
            start = end
    return units


def file_unit(log: TableLog, f: ResolvedFile, tag: str | None = None) -> Unit:
    """One unit holding every row group of a file that still has live rows."""
    rgs = [rg for u in row_group_units(log, None, [f]) for rg in u.row_groups]
    return Unit(f.key, f.entry.size_bytes, rgs, BitMap(f.deleted), list(f.key_ranges), tag)
