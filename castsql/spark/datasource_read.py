"""The read half of ``format("castsql")``: ``spark.read.format("castsql").load(uri)``.

The version is resolved when the DataFrame is made (``load``:
:func:`pinned`), so later commits do not change it; ``versionAsOf`` and
``timestampAsOf`` choose another (:func:`resolve_read`, which
:func:`castsql.spark.read` and the JVM data source use too). The version's
live row groups are cut into input partitions of whole files or groups of
row groups (:func:`plan_partitions`); the workers read them with
:func:`castsql.spark.tasks.live_row_groups` (tombstones applied, fully
deleted row groups never opened) and hand Spark Arrow batches. Filters
pushed by Spark (``spark.sql.python.filterPushdown.enabled``) are left to
Spark: see PRUNE_PUSHED_FILTERS for why PySpark 4.1.1 makes pruning by them
unsafe; :func:`predicates` turns them into pruning predicates where that is
safe (the JVM data source prunes by them).

This module imports pyspark.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyroaring import BitMap
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from castsql.format import Schema, TableLog
from castsql.format.manifest import json_stat, parse_time
from castsql.snapshot import Predicate, Snapshot, resolve
from castsql.snapshot.prune import may_match
from castsql.spark.datasource_options import check_known, get_option, int_option, s3_config, table_path
from castsql.spark.errors import BadOption
from castsql.spark.tasks import TableRef, Unit, _for_spark, live_row_groups, open_parquet
from castsql.spark.units import Splits
from castsql.storage import open_storage

# ---------------------------------------------------------------------- the version read


def version_at_time(log: TableLog, when: str | datetime) -> int:
    """The newest version committed at or before ``when``, as Delta's
    ``timestampAsOf``: a time after the latest commit or before the oldest
    kept version is an error naming both times."""
    if isinstance(when, str):
        try:
            t = parse_time(when.strip())
        except ValueError:
            raise BadOption(
                f"timestampAsOf: {when!r} is not a timestamp (use ISO-8601, e.g. 2025-06-01T12:00:00Z)"
            ) from None
    else:
        t = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    latest = log.latest()
    if t > latest.created_at:
        raise BadOption(
            f"{log.storage.root}: timestampAsOf {_iso(t)} is after the latest version {latest.version} "
            f"(committed at {_iso(latest.created_at)}); use a time at or before it"
        )
    versions = log.versions()
    oldest = log.manifest(versions[0]) if versions else latest
    if t < oldest.created_at:
        raise BadOption(
            f"{log.storage.root}: timestampAsOf {_iso(t)} is before the oldest kept version {oldest.version} "
            f"(committed at {_iso(oldest.created_at)}); use a time at or after it"
        )
    return log.version_at(t)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resolve_read(log: TableLog, version: int | None, timestamp: str | datetime | None, where: str = "read") -> Snapshot:
    """The snapshot of ``version`` or of ``timestamp`` (not both), else the latest."""
    if version is not None and timestamp is not None:
        raise BadOption(f"{where}: give versionAsOf or timestampAsOf, not both")
    if timestamp is not None:
        version = version_at_time(log, timestamp)
    return resolve(log, version)


def pinned(options: Any) -> Snapshot:
    """The snapshot a load reads, the options checked: the version
    ``versionAsOf`` or ``timestampAsOf`` names, else the latest."""
    check_known(options)
    storage = open_storage(table_path(options), s3=s3_config(options))
    when = get_option(options, "timestampAsOf")
    return resolve_read(TableLog(storage), int_option(options, "versionAsOf"), when, storage.root)


# ---------------------------------------------------------------------- pushdown

_OPS = {
    EqualTo: "=",
    EqualNullSafe: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
_Compared = EqualTo | EqualNullSafe | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual


def _column(schema: Schema, attribute: tuple[str, ...]) -> Any:
    if len(attribute) != 1:
        return None
    name = attribute[0]
    col = schema.column(name)
    if col is None:
        col = next((c for c in schema.columns if c.name.lower() == name.lower()), None)
    return col


def _prunable(type_name: str, value: Any) -> Any:
    """``value`` as a statistic of a column of ``type_name`` can be compared
    with, or None when pruning on it could be wrong (floats: Spark orders NaN
    above everything, statistics leave it out; decimals and booleans: JSON
    statistics do not order them exactly)."""
    t = type_name
    if value is None or isinstance(value, bool | float | Decimal | bytes | bytearray):
        return None
    if t.startswith(("int", "uint")) and isinstance(value, int):
        return value
    if t in ("string", "large_string") and isinstance(value, str):
        return value
    if t.startswith("date") and isinstance(value, date) and not isinstance(value, datetime):
        return value
    if t.startswith("timestamp") and isinstance(value, datetime):
        zoned = "tz=" in t
        if zoned and value.tzinfo is None:
            return None  # a wall-clock time in some zone: no instant to compare with
        if not zoned and value.tzinfo is not None:
            return None
        return value.astimezone(UTC) if zoned else value
    return None


def predicates(schema: Schema, filters: Sequence[Filter]) -> list[Predicate]:
    """The pruning predicates implied by Spark's pushed filters (a subset:
    whatever cannot be used safely is left to Spark alone)."""
    out: list[Predicate] = []
    for f in filters:
        if not isinstance(f, _Compared | In):
            continue  # Not, IsNull, string matches: nothing min/max statistics can prune by
        col = _column(schema, f.attribute)
        if col is None:
            continue
        if type(f) in _OPS:
            v = _prunable(col.type, f.value)
            if v is not None:
                out.append(Predicate(col.name, _OPS[type(f)], v))
        elif isinstance(f, In):
            vals = [_prunable(col.type, v) for v in f.value]
            if vals and all(v is not None for v in vals):
                with contextlib.suppress(TypeError):
                    out += [Predicate(col.name, ">=", min(vals)), Predicate(col.name, "<=", max(vals))]
    return out


@dataclass
class _Stats:
    min: dict[str, Any]
    max: dict[str, Any]


def row_group_may_match(pf: Any, rg: int, preds: list[Predicate], types: dict[str, str]) -> bool:
    """Whether row group ``rg``'s footer statistics allow a row matching every predicate."""
    md = pf.metadata.row_group(rg)
    index = {md.column(i).path_in_schema: i for i in range(md.num_columns)}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    for p in preds:
        i = index.get(p.column)
        if i is None or p.column in lo:
            continue
        st = md.column(i).statistics
        if st is None or not st.has_min_max:
            continue
        a, b = json_stat(st.min), json_stat(st.max)
        if a is not None and b is not None:
            lo[p.column], hi[p.column] = a, b
    return may_match(_Stats(lo, hi), preds, types)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- reading


class CastSQLPartition(InputPartition):
    """Units (a file's row groups, their deletes) read by one Spark task, as JSON."""

    def __init__(self, units: list[str]) -> None:
        super().__init__(units)
        self.units = units


def _rows(u: Unit) -> int:
    return sum(n for _, _, n in u.row_groups)


def plan_partitions(units: list[Unit], rows_per_partition: int) -> list[list[Unit]]:
    """Row-group units grouped into partitions of about ``rows_per_partition``
    rows: each file's row groups are cut into that many near-equal runs of
    consecutive row groups (a 10M-row file at 5M rows a partition is two
    halves, not 5M + 5M + a sliver of a row group), and files smaller than
    that share a partition."""
    files: list[Unit] = []
    for u in units:
        last = files[-1] if files else None
        if last is not None and last.key == u.key:
            last.row_groups.extend(u.row_groups)
            last.deleted |= u.deleted
        else:
            files.append(Unit(u.key, u.size, list(u.row_groups), u.deleted.copy(), list(u.ranges)))
    runs: list[Unit] = []
    for f in files:
        rows = _rows(f)
        count = max(1, round(rows / rows_per_partition))
        cut: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
        seen = 0
        for rg in f.row_groups:
            cut[min(count - 1, seen * count // max(1, rows))].append(rg)
            seen += rg[2]
        for rgs in cut:
            if rgs:
                lo, hi = rgs[0][1], rgs[-1][1] + rgs[-1][2]
                dels = f.deleted & BitMap(range(lo, hi)) if f.deleted else BitMap()
                runs.append(Unit(f.key, f.size, rgs, dels, list(f.ranges)))
    parts: list[list[Unit]] = []
    size = 0
    for u in runs:
        rows = _rows(u)
        if parts and size + rows <= rows_per_partition:
            parts[-1].append(u)
            size += rows
        else:
            parts.append([u])
            size = rows
    return parts


class CastSQLReader(DataSourceReader):
    """Reads one pinned version; without filter pushdown (Spark refuses a
    reader that implements ``pushFilters`` while the setting is off)."""

    def __init__(self, ref: TableRef, version: int, columns: list[str], splits: Splits) -> None:
        self.ref = ref
        self.version = version
        self.columns = columns
        self.splits = splits
        self.preds: list[Predicate] = []

    def partitions(self) -> list[InputPartition]:
        from castsql.spark.units import row_group_units

        storage = self.ref.storage()
        log = TableLog(storage)
        snap = resolve(log, self.version)
        if self.preds:
            snap = snap.prune(self.preds)
        units = row_group_units(log, snap)
        parts = plan_partitions(units, self.splits.for_units(units))
        return [CastSQLPartition([u.to_json() for u in p]) for p in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        storage = self.ref.storage()
        types = {c.name: c.type for c in self.ref.schema.columns}
        # An empty version has no partitions; Spark then reads one ``None``.
        for s in partition.units if partition is not None else []:  # type: ignore[attr-defined]
            unit = Unit.from_json(s)
            if self.preds:
                pf = open_parquet(storage, unit.key, unit.size)
                unit.row_groups = [rg for rg in unit.row_groups if row_group_may_match(pf, rg[0], self.preds, types)]
            for _, t, _ in live_row_groups(self.ref, unit, self.columns, storage):
                if t.num_rows:
                    yield from _for_spark(t).to_batches()


# PySpark 4.1.1 keeps the partitions and read function planned for one
# query's pushed filters (PythonDataSourceV2.setReadInfo) and reuses them for
# the next query of the same DataFrame or view that has no filter to push
# (``df.where("id = 7").count()`` then ``df.count()``): rows pruned for the
# first query would be missing from the second. So pushed filters prune
# nothing until Spark plans each query afresh; the machinery below is kept,
# tested directly, and switched on here.
PRUNE_PUSHED_FILTERS = False


class CastSQLPushdownReader(CastSQLReader):
    """A reader that takes Spark's pushed filters: they prune files (manifest
    statistics) and row groups (footer statistics). All of them are handed
    back to Spark, which still evaluates them on the rows: pruning is never
    trusted for the answer. Used only with PRUNE_PUSHED_FILTERS (see there)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.preds = predicates(self.ref.schema, filters)
        yield from filters


def _pushdown_planning() -> bool:
    """Whether Spark is asking for a reader in its filter-pushdown planner
    (``pyspark.sql.worker.data_source_pushdown_filters``), which runs only
    while the setting is on; the plain planner refuses a reader that
    implements ``pushFilters``."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def make_reader(
    options: Any, version: int, schema_json: dict[str, Any], wanted: StructType, splits: Splits
) -> CastSQLReader:
    """The reader of the pinned ``version`` (its schema ``schema_json``) for
    the columns Spark asks for (``wanted``), cut into tasks by ``splits``."""
    storage = open_storage(table_path(options), s3=s3_config(options))
    table_schema = Schema.from_json(schema_json, storage.root)
    names = [c.name for c in table_schema.columns]
    asked = [f.name for f in wanted.fields]
    columns = [n for n in names if n in asked] if set(asked) <= set(names) else names
    primary_key = TableLog(storage).manifest(version).primary_key
    ref = TableRef(storage.root, getattr(storage, "config", None), table_schema.to_json(), primary_key)
    cls = CastSQLPushdownReader if PRUNE_PUSHED_FILTERS and _pushdown_planning() else CastSQLReader
    return cls(ref, version, columns, splits)
