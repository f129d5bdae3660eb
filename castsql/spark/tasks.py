"""What runs inside Spark's Python workers: reading live rows of row groups and
writing Parquet data files, through :mod:`castsql.storage` on either backend.

Everything here is a plain module-level function or a frozen dataclass so that
Spark pickles it by reference; the only state a task gets is a
:class:`TableRef` (URI, picklable S3 settings, schema) and the JSON rows it is
fed. Nothing here imports pyspark: workers never need the JVM side.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import AbstractBitMap, BitMap

from castsql.errors import SchemaMismatch
from castsql.format import Schema, write_data_files
from castsql.format.evolution import fits
from castsql.format.schema import type_from_name
from castsql.format.tombstone import key_bound
from castsql.spark.types import arrow_for_spark
from castsql.storage import S3Config, Storage, open_storage
from castsql.storage.ranged import open_ranged
from castsql.write.records import FILE_COL, MATCH_COL, PK_COL, POS_COL, RG_COL, summarize

__all__ = ["FILE_COL", "MATCH_COL", "PK_COL", "POS_COL", "RG_COL", "UNIT_COL"]

UNIT_COL = "unit"


@dataclass(frozen=True)
class TableRef:
    """What a worker needs to reach a table: picklable, no open connections."""

    uri: str
    s3: S3Config | None
    schema_json: dict[str, Any]
    primary_key: str | None = None

    @property
    def schema(self) -> Schema:
        return Schema.from_json(self.schema_json, self.uri)

    def storage(self) -> Storage:
        return open_storage(self.uri, s3=self.s3)


@dataclass
class Unit:
    """A slice of one data file to read: some of its row groups, the positions
    of those row groups deleted by bitmap, and the key ranges deleted in it."""

    key: str
    size: int
    row_groups: list[tuple[int, int, int]]  # (index, first file position, rows)
    deleted: AbstractBitMap = field(default_factory=BitMap)
    ranges: list[tuple[Any, Any]] = field(default_factory=list)
    tag: str | None = None  # carried through for callers (compaction's source file)

    def to_json(self) -> str:
        bm = self.deleted
        bm.run_optimize()
        return json.dumps(
            {
                "key": self.key,
                "size": self.size,
                "rgs": self.row_groups,
                "del": base64.b64encode(bm.serialize()).decode() if bm else "",
                "ranges": self.ranges,
                "tag": self.tag,
            }
        )

    @classmethod
    def from_json(cls, s: str) -> Unit:
        d = json.loads(s)
        bm = BitMap.deserialize(base64.b64decode(d["del"])) if d["del"] else BitMap()
        return cls(d["key"], d["size"], [tuple(r) for r in d["rgs"]], bm, [tuple(r) for r in d["ranges"]], d["tag"])


# ---------------------------------------------------------------------- reading


def open_parquet(storage: Storage, key: str, size: int) -> pq.ParquetFile:
    """A Parquet file of the table: by path on a local disk, by ranged reads elsewhere."""
    uri = storage.data_uri(key)  # a local file leading out of the root is refused
    if "://" not in uri:
        return pq.ParquetFile(uri)
    return pq.ParquetFile(open_ranged(storage, key, size, buffer_size=1024 * 1024))


def _range_scalar(v: Any, t: pa.DataType) -> pa.Scalar:
    """A key-range bound as a scalar comparable with a ``t`` column (times and
    dates typed; numbers and strings as JSON gave them, compared by pyarrow's casts)."""
    value = key_bound(v, t)
    return pa.scalar(value, type=t) if value is not v else pa.scalar(v)


def conform_read(t: pa.Table, schema: Schema, columns: list[str], where: str) -> pa.Table:
    """A row group as read from a data file, in the version's schema (FORMAT.md
    §3.4): columns matched by name, a column the table added after the file
    was written is NULL, a narrower type (an allowed widening: int32 read as
    int64, date as timestamp, …) is converted; anything else is an error naming
    the file, the column and both types."""
    cols, fields = [], []
    for name in columns:
        c = schema.column(name)
        want = type_from_name(c.type) if c is not None else None
        if name not in t.column_names:
            if c is None or c.added_in is None:
                raise SchemaMismatch(f"{where}: has no column {name!r} (it has {', '.join(t.column_names)})")
            cols.append(pa.nulls(t.num_rows, want))
        else:
            col = t.column(name)
            if want is not None and col.type != want:
                if not widens_physical(col.type, want):
                    raise SchemaMismatch(f"{where}: column {name!r} is {col.type} in the file, the table has {want}")
                col = col.cast(want, safe=not pa.types.is_timestamp(want))
            cols.append(col)
        fields.append(pa.field(name, cols[-1].type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def widens_physical(src: pa.DataType, dst: pa.DataType) -> bool:
    """May a data file's column of type ``src`` be read as the table's ``dst``?
    The type rule (lossless: :func:`castsql.format.evolution.fits`, which also
    takes other spellings of the same type, such as large strings), or another
    timestamp unit or zone (read as the UTC wall-clock time in microseconds,
    as the embedded engine reads it)."""
    return fits(src, dst) or (pa.types.is_timestamp(src) and pa.types.is_timestamp(dst))


def live_row_groups(
    ref: TableRef, unit: Unit, columns: list[str] | None = None, storage: Storage | None = None
) -> Iterator[tuple[int, pa.Table, np.ndarray]]:
    """For each row group of ``unit``: (index, its live rows, their file positions), in file order."""
    storage = storage or ref.storage()
    pf = open_parquet(storage, unit.key, unit.size)
    pk = ref.primary_key
    read_cols = columns
    if unit.ranges and columns is not None and pk is not None and pk not in columns:
        read_cols = [*columns, pk]
    schema = ref.schema
    wanted = read_cols if read_cols is not None else schema.names
    present = set(pf.schema_arrow.names)
    # Schema evolution (FORMAT.md §3.4): the file may predate an added column
    # (read as NULL) or hold a narrower type (converted to the version's).
    physical = [c for c in wanted if c in present]
    deleted = np.frombuffer(unit.deleted.to_array(), dtype=np.uint32) if unit.deleted else None
    for rg, start, rows in unit.row_groups:
        t = conform_read(pf.read_row_group(rg, columns=physical), schema, wanted, storage.uri(unit.key))
        if t.num_rows != rows:
            raise ValueError(f"{storage.uri(unit.key)}: row group {rg} holds {t.num_rows} rows, expected {rows}")
        keep = np.ones(rows, dtype=bool)
        if deleted is not None:
            lo, hi = np.searchsorted(deleted, [start, start + rows])
            keep[deleted[lo:hi].astype(np.int64) - start] = False
        if unit.ranges:
            col = t.column(pk)
            for a, b in unit.ranges:
                hit = pc.and_(
                    pc.greater_equal(col, _range_scalar(a, col.type)), pc.less_equal(col, _range_scalar(b, col.type))
                )
                # A null key is in no range: the row stays.
                keep &= ~pc.fill_null(hit, False).to_numpy(zero_copy_only=False)
        if read_cols is not columns:
            t = t.select(columns)
        positions = np.arange(start, start + rows, dtype=np.int64)
        if not keep.all():
            t = t.filter(pa.array(keep))
            positions = positions[keep]
        yield rg, t, positions


def _for_spark(t: pa.Table) -> pa.Table:
    cols, fields = [], []
    for f, col in zip(t.schema, t.columns, strict=True):
        target = arrow_for_spark(f.type)
        cols.append(col if col.type == target else col.cast(target))
        fields.append(pa.field(f.name, target))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def read_task(
    ref: TableRef, columns: list[str] | None, positions: bool, row_groups: bool, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: JSON units in, live rows out (optionally with file key,
    position and row group)."""
    storage = ref.storage()
    for batch in batches:
        for s in batch.column(UNIT_COL).to_pylist():
            unit = Unit.from_json(s)
            for rg, t, pos in live_row_groups(ref, unit, columns, storage):
                if t.num_rows == 0:
                    continue
                out = _for_spark(t)
                if positions:
                    out = out.append_column(FILE_COL, pa.repeat(pa.scalar(unit.key, pa.string()), t.num_rows))
                    out = out.append_column(POS_COL, pa.array(pos, pa.int64()))
                if row_groups:
                    out = out.append_column(RG_COL, pa.array(np.full(t.num_rows, rg, dtype=np.int32)))
                yield from out.to_batches()


# ---------------------------------------------------------------------- writing


def write_task(
    ref: TableRef,
    row_group_size: int,
    target_file_bytes: int,
    batches: Iterable[pa.RecordBatch],
    *,
    fill_missing: bool = False,
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: a partition's rows in, Parquet data files written
    straight to the table's storage, one JSON manifest entry per file out.

    ``write_data_files`` buffers Spark's 10,000-row batches into full row
    groups. A failed or retried attempt's files are never reported by a
    successful task, so no commit references them (they are GC's garbage).
    ``fill_missing``: table columns the rows lack are written as NULL (an
    append; the driver has refused a missing primary key).
    """
    files = write_data_files(
        ref.storage(),
        batches,
        ref.schema,
        row_group_size=row_group_size,
        target_file_bytes=target_file_bytes,
        fill_missing=fill_missing,
    )
    if files:
        yield pa.RecordBatch.from_pydict({"entry": [json.dumps(f.to_json()) for f in files]})


def rewrite_task(
    ref: TableRef, row_group_size: int, target_file_bytes: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body for compaction: one JSON unit per source file in, its
    live rows rewritten in their order into new data files, one JSON row
    ``{"source": key, "entries": [...], "rows": n}`` out per source file."""
    storage = ref.storage()
    names = ref.schema.names
    for batch in batches:
        for s in batch.column(UNIT_COL).to_pylist():
            unit = Unit.from_json(s)
            rows = 0

            def live(unit: Unit = unit) -> Iterator[pa.RecordBatch]:
                # Streamed: a 256 MB file is never held in memory whole.
                nonlocal rows
                for _, t, _ in live_row_groups(ref, unit, names, storage):
                    rows += t.num_rows
                    yield from t.to_batches()

            files = write_data_files(
                storage,
                live(),
                ref.schema,
                row_group_size=row_group_size,
                target_file_bytes=target_file_bytes,
            )
            out = {"source": unit.key, "entries": [f.to_json() for f in files], "rows": rows}
            yield pa.RecordBatch.from_pydict({"result": [json.dumps(out)]})


def count_task(ref: TableRef, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: live rows per unit (reading only the primary key)."""
    storage = ref.storage()
    keys, counts = [], []
    for batch in batches:
        for s in batch.column(UNIT_COL).to_pylist():
            unit = Unit.from_json(s)
            cols = [ref.primary_key] if ref.primary_key else ref.schema.names[:1]
            keys.append(unit.key)
            counts.append(sum(t.num_rows for _, t, _ in live_row_groups(ref, unit, cols, storage)))
    if keys:
        yield pa.RecordBatch.from_pydict({"key": keys, "live": pa.array(counts, pa.int64())})


# ---------------------------------------------------------------------- deleting


def summarize_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body for delete: live rows (file, row group, position, key,
    matched?) in, one JSON summary per (file, row group) out.

    The summary carries what the driver needs to pick the cheapest tombstone
    without a second scan: the matched positions, the live and matched counts
    (a fully matched row group becomes one RowGroupDelete), and whether the
    key is strictly increasing over the live rows and the matched rows are one
    run of consecutive live rows (then a key range is exact).
    """
    # Rows arrive unit by unit, in file order (read_task's order, kept by the
    # narrow plan between them), so each unit is summarized as soon as the next
    # begins and a worker never holds more than one row group's worth.
    current: tuple[str, int] | None = None
    pending: list[pa.RecordBatch] = []
    for b in batches:
        if b.num_rows == 0:
            continue
        files = b.column(FILE_COL)
        rgs = b.column(RG_COL).to_numpy(zero_copy_only=False)
        n = b.num_rows
        changed = pc.or_(pc.not_equal(files.slice(1), files.slice(0, n - 1)), pa.array(rgs[1:] != rgs[:-1])).to_numpy(
            zero_copy_only=False
        )
        starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
        for j, s in enumerate(starts):
            e = starts[j + 1] if j + 1 < len(starts) else n
            key = (files[s].as_py(), int(rgs[s]))
            if key != current:
                if pending:
                    yield _summary(current, pending)  # type: ignore[arg-type]
                current, pending = key, []
            pending.append(b.slice(s, e - s))
    if pending:
        yield _summary(current, pending)  # type: ignore[arg-type]


def _summary(unit: tuple[str, int], batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    # The planner (castsql.write.records) turns these into tombstone records on the driver.
    return pa.RecordBatch.from_pydict({"summary": [json.dumps(summarize(pa.Table.from_batches(batches)))]})
