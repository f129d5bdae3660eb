"""Units of work over a snapshot's files: one per row group with live rows, or
one per file (what the reader, the data source and the compactor hand Spark).

Its own module so that the reader (:mod:`castsql.spark.reader`) and the data
source (:mod:`castsql.spark.datasource_read`) both use it without importing each other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyroaring import BitMap

from castsql.format import TableLog
from castsql.snapshot import Snapshot
from castsql.snapshot.footer import row_group_rows
from castsql.snapshot.resolve import ResolvedFile
from castsql.spark.tasks import Unit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_PARTITION_BYTES = 128 * 1024 * 1024  # Spark's spark.sql.files.maxPartitionBytes
OPEN_COST_BYTES = 4 * 1024 * 1024  # Spark's spark.sql.files.openCostInBytes


@dataclass(frozen=True)
class Splits:
    """How a read is cut into Spark tasks: Spark's own rule for Parquet files
    (``FilePartition.maxSplitBytes``), so that a castsql read gets as many
    tasks as ``spark.read.parquet`` of the same files would. A split holds at
    most ``min(max_bytes, max(open_cost, bytes / slots))`` bytes, where
    ``bytes`` counts every file's size plus ``open_cost``.

    Few, large tasks matter more here than for Spark's JVM reader: every
    Python task costs ~0.2-0.5 s of its own on a 2-core machine (measured with
    an empty ``rdd.map``), so 40 tasks of 500,000 rows cost seconds where 4
    tasks of 128 MB cost a fraction of one. ``slots`` keeps every core busy on
    small tables. Picklable: the data source's planner gets it from
    :func:`castsql.spark.register`.

    Example::

        >>> Splits(slots=2).rows_per_split(rows=20_000_000, size=342_000_000, files=2)
        5000000
        >>> Splits(slots=16).rows_per_split(rows=20_000_000, size=342_000_000, files=2)
        1250000
    """

    slots: int
    max_bytes: int = MAX_PARTITION_BYTES
    open_cost: int = OPEN_COST_BYTES

    @classmethod
    def of(cls, spark: SparkSession) -> Splits:
        """The rule of a session: its leaf-node parallelism (Spark's
        ``spark.sql.files.minPartitionNum`` when set) and its file-split settings."""
        conf = spark._jsparkSession.sessionState().conf()
        minimum = conf.filesMinPartitionNum()
        slots = int(minimum.get()) if minimum.isDefined() else int(spark._jsparkSession.leafNodeDefaultParallelism())
        return cls(max(1, slots), int(conf.filesMaxPartitionBytes()), int(conf.filesOpenCostInBytes()))

    @classmethod
    def local(cls) -> Splits:
        """Without a session to ask (a data source registered by hand): this machine's cores."""
        return cls(max(1, os.cpu_count() or 1))

    def rows_per_split(self, rows: int, size: int, files: int = 1) -> int:
        """Rows a split may hold, for ``files`` files of ``size`` bytes and
        ``rows`` rows in all. Where there is more than one wave of splits,
        their number is rounded up to a multiple of ``slots`` so that the
        last wave does not leave slots idle (3 splits on 2 slots take as long
        as 4 of three quarters the size)."""
        if rows <= 0 or size <= 0:
            return max(1, rows)
        total = size + files * self.open_cost
        # At least a byte: Spark accepts maxPartitionBytes=0 (then every row group is a split).
        split = max(1, min(self.max_bytes, max(self.open_cost, total // self.slots)))
        count = math.ceil(size / split)
        if count > self.slots:
            count = math.ceil(count / self.slots) * self.slots
        return max(1, math.ceil(rows / count))

    def for_units(self, units: Sequence[Unit]) -> int:
        """:meth:`rows_per_split` for the files ``units`` come from (each file counted once)."""
        sizes = {u.key: u.size for u in units}
        rows = sum(n for u in units for _, _, n in u.row_groups)
        return self.rows_per_split(rows, sum(sizes.values()), len(sizes))


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
