"""Metadata objects of format version 2: immutable Parquet files under ``meta/``.

A *files* object lists data files, one row each, with their statistics as
typed columns (``min`` and ``max`` are structs with one field per column that
has statistics); a *deletes* object holds tombstone records, one row each,
with the tombstone file each came from. A manifest references them through
:class:`~castsql.format.manifest.MetaRef`, whose summary (rows, per-column
bounds, the range of paths) lets a reader skip an object that cannot match.

Everything here is pure Arrow: a version of a million files is some dozens of
Arrow tables, never a million Python objects (docs/FORMAT.md §3.2).

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import DataFile, Schema
    >>> st = open_storage(tempfile.mkdtemp())
    >>> schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
    >>> t = files_to_arrow([DataFile("data/a.parquet", 100, 1, 10, {"id": 1}, {"id": 9}, (10,))], schema)
    >>> ref = write_files_object(st, t, level=0)
    >>> ref.entries, ref.rows, ref.min, ref.max
    (1, 10, {'id': 1}, {'id': 9})
    >>> files_from_arrow(read_files_object(st, ref, schema, "v1"))[0].max
    {'id': 9}
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.errors import FormatError, ObjectNotFound
from castsql.format.arrays import FALSE, from_numpy, py_array, py_values, scalar, to_numpy
from castsql.format.jsonio import loads_text, pk_value
from castsql.format.layout import new_meta_key
from castsql.format.manifest import DataFile, MetaRef, json_stat, parse_time
from castsql.format.schema import Schema, json_ordered, type_from_name
from castsql.format.tombstone import (
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    TombstoneRecord,
    load_bitmap,
)
from castsql.storage import Storage
from castsql.storage.base import key_problem

PATH_BOUNDS = "paths"  # MetaRef.extra key: [smallest path, largest path] of a files object


def stat_fields(schema: Schema) -> list[pa.Field]:
    """The columns that carry min/max statistics, as typed struct fields."""
    fields = []
    for c in schema.columns:
        t = type_from_name(c.type)
        if json_ordered(t):
            fields.append(pa.field(c.name, t))
    return fields


def _files_schema(schema: Schema) -> pa.Schema:
    stats = stat_fields(schema)
    fields = [
        pa.field("path", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64()),
        pa.field("row_group_count", pa.int64()),
        pa.field("total_rows", pa.int64()),
        pa.field("row_group_rows", pa.list_(pa.int64())),
    ]
    if stats:
        fields += [pa.field("min", pa.struct(stats)), pa.field("max", pa.struct(stats))]
    fields.append(pa.field("extra", pa.string()))
    return pa.schema(fields)


def typed_stat(value: Any, t: pa.DataType) -> Any:
    """A JSON statistic (FORMAT.md §3) as a Python value of Arrow type ``t``; None if it is not one."""
    try:
        if pa.types.is_timestamp(t):
            if not isinstance(value, str):
                return None
            return parse_time(value) if t.tz else datetime.fromisoformat(value.replace("Z", ""))
        if pa.types.is_date(t):
            return date.fromisoformat(value) if isinstance(value, str) else None
        if pa.types.is_boolean(t):
            return value if isinstance(value, bool) else None
        if pa.types.is_integer(t):
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        if pa.types.is_floating(t):
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if pa.types.is_string(t):
            return value if isinstance(value, str) else None
    except (ValueError, TypeError):
        return None
    return None


def files_to_arrow(entries: Sequence[DataFile], schema: Schema) -> pa.Table:
    """Data file entries as the rows of a files object (statistics typed by ``schema``)."""
    target = _files_schema(schema)
    cols: dict[str, Any] = {
        "path": [f.path for f in entries],
        "size_bytes": [f.size_bytes for f in entries],
        "row_group_count": [f.row_group_count for f in entries],
        "total_rows": [f.total_rows for f in entries],
        "row_group_rows": [list(f.row_group_rows) if f.row_group_rows is not None else None for f in entries],
    }
    cols = {k: py_array(v, target.field(k).type) for k, v in cols.items()}
    stats = stat_fields(schema)
    if stats:
        for side in ("min", "max"):
            arrays = []
            for fld in stats:
                vals = [typed_stat(getattr(f, side).get(fld.name), fld.type) for f in entries]
                try:
                    arrays.append(py_array(vals, fld.type))
                except (pa.ArrowException, OverflowError):
                    arrays.append(pa.nulls(len(entries), fld.type))
            cols[side] = (
                pa.StructArray.from_arrays(arrays, fields=stats) if entries else pa.nulls(0, target.field(side).type)
            )
    extra = [json.dumps(f.extra, separators=(",", ":")) if f.extra else None for f in entries]
    cols["extra"] = py_array(extra, pa.string())
    return pa.table(cols, schema=target)


def files_from_arrow(table: pa.Table) -> list[DataFile]:
    """The rows of a files object as data file entries (statistics as JSON values)."""
    if table.num_rows == 0:
        return []
    # Column by column: a commit or a plan converts every entry of a version,
    # and per-row to_pylist of zoned timestamps cost ~0.1 ms an entry.
    stats: dict[str, list[tuple[str, list[Any]]]] = {}
    for side in ("min", "max"):
        cols = []
        if side in table.column_names:
            arr = table.column(side).combine_chunks()
            for fld, child in zip(arr.type, arr.flatten(), strict=True):  # flatten: a null struct nulls its fields
                cols.append((fld.name, _json_values(child)))
        stats[side] = cols
    n = table.num_rows
    rgr = py_values(table.column("row_group_rows"))
    extra = py_values(table.column("extra"))
    return [
        DataFile(
            path=path,
            size_bytes=size,
            row_group_count=groups,
            total_rows=rows,
            min=lo,
            max=hi,
            row_group_rows=tuple(groups_rows) if groups_rows is not None else None,
            extra=json.loads(more) if more else {},
        )
        for path, size, groups, rows, lo, hi, groups_rows, more in zip(
            py_values(table.column("path")),
            py_values(table.column("size_bytes")),
            py_values(table.column("row_group_count")),
            py_values(table.column("total_rows")),
            _stat_dicts(stats["min"], n),
            _stat_dicts(stats["max"], n),
            rgr,
            extra,
            strict=True,
        )
    ]


def _stat_dicts(columns: list[tuple[str, list[Any]]], n: int) -> list[dict[str, Any]]:
    """One statistics dict per entry from per-column values (None: no statistic)."""
    if not columns:
        return [{} for _ in range(n)]
    names = [name for name, _ in columns]
    rows = zip(*(vals for _, vals in columns), strict=True)
    return [{k: v for k, v in zip(names, row, strict=True) if v is not None} for row in rows]


_FEW_TIMES = 16  # values formatted one by one as fast as by Arrow's compute calls (one entry looked up)
# Microseconds since the epoch of 0001-01-01 and of 9999-12-31 23:59:59.999999:
# the times Python's datetime (and so json_stat) can write.
_PY_TIMES = (-62_135_596_800_000_000, 253_402_300_799_999_999)


def _json_values(arr: pa.Array) -> list[Any]:
    """A statistic column's values as :func:`json_stat` writes them."""
    t = arr.type
    if pa.types.is_timestamp(t) and t.unit != "ns":
        # The stored instants are UTC: dropping the zone keeps them and gives
        # naive datetimes, cheap to build, written as format_time writes.
        zone = "Z" if t.tz is not None else ""
        naive = arr.cast(pa.timestamp(t.unit)) if t.tz is not None else arr
        if t.unit == "us" and len(naive) >= _FEW_TIMES and _python_times(naive):
            # Arrow's text of a microsecond time is isoformat's with a space
            # for the "T", with no datetime built per value.
            text = py_values(pc.replace_substring(naive.cast(pa.string()), " ", "T", max_replacements=1))
            return [v + zone if v is not None else None for v in text] if zone else text
        return [v.isoformat(timespec="microseconds") + zone if v is not None else None for v in naive.to_pylist()]
    if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return py_values(arr)
    if (pa.types.is_float32(t) or pa.types.is_float64(t)) and len(arr) >= _FEW_TIMES:
        return py_values(pc.if_else(pc.is_finite(arr), arr, pa.nulls(1, t)[0]))  # NaN, ±inf: no statistic
    return [json_stat(v) for v in arr.to_pylist()]


def _python_times(arr: pa.Array) -> bool:
    """Whether every time of ``arr`` (microseconds, no zone) is one Python's datetime holds."""
    lo, hi = pc.min_max(arr.cast(pa.int64())).values()
    return lo.as_py() is None or (_PY_TIMES[0] <= lo.as_py() and hi.as_py() <= _PY_TIMES[1])


def conform_files(table: pa.Table, schema: Schema) -> pa.Table:
    """``table`` (a files object written under any schema of the table) with the
    statistic columns of ``schema``: a field the object lacks (a column added
    since) is null, one of a narrower type is widened, one that no longer
    exists is dropped. Objects of one version can then be concatenated."""
    target = _files_schema(schema)
    if table.schema.equals(target):
        return table
    cols = []
    for fld in target:
        if fld.name in ("min", "max"):
            have = table.column(fld.name).combine_chunks() if fld.name in table.column_names else None
            children = []
            for sub in fld.type:
                child = None
                if have is not None and have.type.get_field_index(sub.name) >= 0:
                    child = have.field(sub.name)
                    if child.type != sub.type:
                        try:
                            child = child.cast(sub.type)
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                            child = None
                children.append(child if child is not None else pa.nulls(table.num_rows, sub.type))
            cols.append(pa.StructArray.from_arrays(children, fields=list(fld.type)))
        else:
            cols.append(table.column(fld.name))
    return pa.Table.from_arrays(cols, schema=target)


def summarize_files(table: pa.Table) -> dict[str, Any]:
    """The summary a MetaRef carries for a files object's rows."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for side, out in (("min", mins), ("max", maxs)):
        if side not in table.column_names:
            continue
        arr = table.column(side).combine_chunks()
        for i, fld in enumerate(arr.type):
            child = arr.field(i)
            # A file without a statistic for a column can hold any value: the object can too.
            if child.null_count or len(child) == 0:
                continue
            mm = pc.min_max(child)
            v = json_stat((mm["min"] if side == "min" else mm["max"]).as_py())
            if v is not None:
                out[fld.name] = v
    paths = table.column("path")
    bounds = pc.min_max(paths) if len(paths) else None
    return {
        "entries": table.num_rows,
        "rows": int(pc.sum(table.column("total_rows")).as_py() or 0),
        "bytes": int(pc.sum(table.column("size_bytes")).as_py() or 0),
        "min": mins,
        "max": maxs,
        PATH_BOUNDS: [bounds["min"].as_py(), bounds["max"].as_py()] if bounds is not None else None,
    }


def _parquet_bytes(table: pa.Table, kind: str) -> bytes:
    buf = io.BytesIO()
    meta = {b"castsql.kind": kind.encode(), b"castsql.format_version": b"2"}
    pq.write_table(table.replace_schema_metadata(meta), buf, compression="zstd", row_group_size=1 << 20)
    return buf.getvalue()


def write_files_object(storage: Storage, table: pa.Table, *, level: int | None) -> MetaRef:
    """Write ``table`` (rows of :func:`files_to_arrow`) as a new files object; its reference."""
    s = summarize_files(table)
    key = new_meta_key("files")
    storage.put_new(key, _parquet_bytes(table, "files"))
    extra = {PATH_BOUNDS: s[PATH_BOUNDS]} if s[PATH_BOUNDS] else {}
    return MetaRef(key, "files", s["entries"], level, s["rows"], s["bytes"], s["min"], s["max"], extra=extra)


def read_object(storage: Storage, ref: MetaRef, kind: str, where: str) -> pa.Table:
    """The rows of metadata object ``ref`` of ``kind``, checked to be one and to hold its ``entries``."""
    try:
        data = storage.get(ref.path)
    except ObjectNotFound:
        raise FormatError(f"{where}: metadata object {storage.uri(ref.path)} is missing") from None
    try:
        # ParquetFile, not read_table: read_table imports pyarrow.dataset (and
        # pandas with it, ~0.2 s), which a fresh process's first read would pay.
        table = pq.ParquetFile(io.BytesIO(data)).read()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(f"{where}: metadata object {storage.uri(ref.path)} is not a Parquet file ({e})") from None
    found = (table.schema.metadata or {}).get(b"castsql.kind", b"").decode()
    if found != kind:
        raise FormatError(
            f"{where}: metadata object {storage.uri(ref.path)} is not a {kind} object (it says {found or 'nothing'})"
        )
    if table.num_rows != ref.entries:
        raise FormatError(
            f"{where}: metadata object {storage.uri(ref.path)} holds {table.num_rows} rows, "
            f"the manifest says {ref.entries}"
        )
    return table


_FILES_COLUMNS = {
    "path": pa.string(),
    "size_bytes": pa.int64(),
    "row_group_count": pa.int64(),
    "total_rows": pa.int64(),
}


def read_files_object(storage: Storage, ref: MetaRef, schema: Schema, where: str) -> pa.Table:
    """The rows of a files object, checked against its summary and conformed to ``schema``."""
    table = read_object(storage, ref, "files", where)
    uri = storage.uri(ref.path)
    for name, t in _FILES_COLUMNS.items():
        if name not in table.column_names or table.schema.field(name).type != t:
            raise FormatError(f"{where}: metadata object {uri} has no {t} column {name!r}")
        if table.column(name).null_count:
            raise FormatError(f"{where}: metadata object {uri}: column {name!r} holds nulls")
    if "row_group_rows" not in table.column_names:
        raise FormatError(f"{where}: metadata object {uri} has no column 'row_group_rows'")
    check_entries(table, f"{where}: metadata object {uri}")
    s = summarize_files(table)
    if (s["rows"], s["bytes"]) != (ref.rows, ref.bytes):
        raise FormatError(
            f"{where}: metadata object {uri} holds {s['rows']} rows in {s['bytes']} bytes of data files, "
            f"its summary in the manifest says {ref.rows} rows in {ref.bytes} bytes"
        )
    for col, v in s["min"].items():
        lo = ref.min.get(col)
        if lo is not None and _lt(v, lo):
            raise FormatError(f"{where}: metadata object {uri}: column {col!r} goes below its summary's min {lo!r}")
    for col, v in s["max"].items():
        hi = ref.max.get(col)
        if hi is not None and _lt(hi, v):
            raise FormatError(f"{where}: metadata object {uri}: column {col!r} goes above its summary's max {hi!r}")
    return conform_files(table, schema)


def check_entries(table: pa.Table, what: str) -> None:
    """FormatError naming ``what`` and the first bad file unless every row of a
    files object is a possible data file: counts not negative, row group sizes
    that add up, no min above its max, ``extra`` a JSON object. Vectorised: a
    full object of 16,384 files is checked in milliseconds."""
    paths = table.column("path")

    def refuse(bad: Any, problem: str) -> None:
        if pc.any(bad).as_py():  # nulls are not bad, and filter() drops them
            raise FormatError(f"{what}: data file {paths.filter(bad)[0].as_py()}: {problem}")

    for name in ("size_bytes", "row_group_count", "total_rows"):
        refuse(pc.less(table.column(name), _ZERO), f"{name!r} is negative")
    rgr = table.column("row_group_rows").combine_chunks()
    if rgr.null_count < len(rgr):
        refuse(pc.not_equal(pc.list_value_length(rgr), table.column("row_group_count")),
               "'row_group_rows' does not list row_group_count counts")  # fmt: skip
        # Per-file sums from the prefix sums of the flattened counts (no
        # per-file Python work): counts are bounded first, so no sum overflows.
        offsets = to_numpy(rgr.offsets)
        values = rgr.values
        counts = (to_numpy(values) if not values.null_count else values.to_numpy(zero_copy_only=False))[
            offsets[0] : offsets[-1]
        ]
        offsets = offsets - offsets[0]
        if len(counts) and (counts.min() < 0 or counts.max() > _MAX_COUNT):
            bad = np.zeros(len(rgr), dtype=bool)
            wrong = np.flatnonzero((counts < 0) | (counts > _MAX_COUNT))
            bad[np.searchsorted(offsets, wrong, side="right") - 1] = True
            refuse(from_numpy(bad), "'row_group_rows' holds a negative or impossible count")
        if len(offsets) > 1 and np.diff(offsets).max() > _MAX_GROUPS:
            refuse(pc.greater(pc.list_value_length(rgr), _MAX_GROUPS), "'row_group_rows' lists too many row groups")
        prefix = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        sums = from_numpy(prefix[offsets[1:]] - prefix[offsets[:-1]])
        total = table.column("total_rows").combine_chunks()
        refuse(pc.and_(pc.is_valid(rgr), pc.not_equal(sums, total)), "'row_group_rows' do not add up to 'total_rows'")
    if "min" in table.column_names and "max" in table.column_names:
        mins, maxs = table.column("min").combine_chunks(), table.column("max").combine_chunks()
        for i, fld in enumerate(mins.type):
            j = maxs.type.get_field_index(fld.name)
            if j < 0:
                continue
            try:
                bad = pc.greater(mins.field(i), maxs.field(j))
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
                continue
            refuse(bad, f"column {fld.name!r} has a min above its max")
    _check_extra(table, paths, what)


_EXTRA_DEPTH = 64
_ZERO = scalar(0, pa.int64())
_MAX_COUNT = 1 << 48  # rows in one row group: far past any real file, and 2^15 of them cannot overflow an int64
_MAX_GROUPS = 1 << 15


def _check_extra(table: pa.Table, paths: Any, what: str) -> None:
    """Every ``extra`` of a files object is a JSON object, nested at most
    ``_EXTRA_DEPTH`` deep."""
    extra = table.column("extra") if "extra" in table.column_names else None
    if extra is not None and extra.null_count < len(extra):
        # Parsed again when entries are built, maybe deeper in the stack: a
        # fixed depth limit makes every read of the object agree.
        deep = pc.count_substring_regex(extra, r"[\[{]")
        deep = pc.fill_null(pc.greater(deep, scalar(_EXTRA_DEPTH, deep.type)), FALSE)
        deep_rows = set(pc.indices_nonzero(deep).to_pylist()) if pc.any(deep).as_py() else set()
        for i, (path, text) in enumerate(zip(paths.to_pylist(), extra.to_pylist(), strict=True)):
            if text is None:
                continue
            value = loads_text(text, f"{what}: data file {path}", "'extra'")
            if not isinstance(value, dict):
                raise FormatError(f"{what}: data file {path}: 'extra' is not a JSON object")
            if i in deep_rows and json_depth(value) > _EXTRA_DEPTH:
                raise FormatError(f"{what}: data file {path}: 'extra' is nested more than {_EXTRA_DEPTH} deep")


def json_depth(value: Any) -> int:
    """How deeply ``value`` (parsed JSON) nests lists and objects, without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            depth = max(depth, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return depth


def _lt(a: Any, b: Any) -> bool:
    try:
        return bool(a < b)
    except TypeError:
        return False


# ------------------------------------------------------------------ deletes

DELETES_SCHEMA = pa.schema(
    [
        pa.field("tombstone", pa.string(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # row_group | key_range | positions
        pa.field("row_group", pa.int64()),
        pa.field("pk_min", pa.string()),  # JSON text of the bound
        pa.field("pk_max", pa.string()),
        pa.field("positions", pa.binary()),  # portable roaring bitmap
    ]
)


def deletes_to_arrow(records: Sequence[tuple[str, TombstoneRecord]]) -> pa.Table:
    """Tombstone records (with the tombstone file each came from) as the rows of a deletes object."""
    cols: dict[str, list[Any]] = {f.name: [] for f in DELETES_SCHEMA}
    for tomb, r in records:
        cols["tombstone"].append(tomb)
        cols["file"].append(r.file)
        if isinstance(r, RowGroupDelete):
            kind, rg, lo, hi, pos = "row_group", r.row_group, None, None, None
        elif isinstance(r, KeyRangeDelete):
            kind, rg, lo, hi, pos = "key_range", None, json.dumps(r.pk_min), json.dumps(r.pk_max), None
        else:
            bm = BitMap(r.positions)
            bm.run_optimize()
            kind, rg, lo, hi, pos = "positions", r.row_group, None, None, bm.serialize()
        for k, v in (("kind", kind), ("row_group", rg), ("pk_min", lo), ("pk_max", hi), ("positions", pos)):
            cols[k].append(v)
    return pa.table(cols, schema=DELETES_SCHEMA)


def deletes_from_arrow(table: pa.Table, where: str) -> list[tuple[str, TombstoneRecord]]:
    """The rows of a deletes object as tombstone records, each checked as a
    tombstone line would be (FORMAT.md §4); ``where`` names the object."""
    out: list[tuple[str, TombstoneRecord]] = []
    for i, r in enumerate(table.to_pylist()):
        at = f"{where}: record {i} (of tombstone {r['tombstone']})"
        kind, rg, f = r["kind"], r["row_group"], r["file"]
        if (problem := key_problem(f)) is not None:
            raise FormatError(f"{at}: 'file' {f!r} is not a plain object key: it {problem}")
        if rg is not None and rg < 0:
            raise FormatError(f"{at}: 'row_group' must be a non-negative integer, got {rg}")
        if kind == "row_group" and rg is not None:
            rec: TombstoneRecord = RowGroupDelete(f, rg)
        elif kind == "key_range" and r["pk_min"] is not None and r["pk_max"] is not None:
            lo, hi = (loads_text(r[k], at, k) for k in ("pk_min", "pk_max"))
            both_numbers = isinstance(lo, int | float) and isinstance(hi, int | float)
            if not (pk_value(lo) and pk_value(hi)) or (type(lo) is not type(hi) and not both_numbers):
                raise FormatError(f"{at}: 'pk_min'/'pk_max' must be two numbers or two strings")
            rec = KeyRangeDelete(f, lo, hi)
        elif kind == "positions" and r["positions"] is not None:
            rec = PositionDelete(f, rg, load_bitmap(r["positions"], at))
        else:
            raise FormatError(f"{at}: not a tombstone record (kind {kind!r} with these columns)")
        out.append((r["tombstone"], rec))
    return out


def write_deletes_object(storage: Storage, table: pa.Table, *, level: int | None) -> MetaRef:
    key = new_meta_key("deletes")
    storage.put_new(key, _parquet_bytes(table, "deletes"))
    return MetaRef(key, "deletes", table.num_rows, level, tombstones=_distinct_tombstones(table))


def read_deletes_object(storage: Storage, ref: MetaRef, where: str) -> pa.Table:
    table = read_object(storage, ref, "deletes", where)
    uri = storage.uri(ref.path)
    if not table.schema.equals(DELETES_SCHEMA, check_metadata=False):
        raise FormatError(f"{where}: metadata object {uri} does not have the columns of a deletes object")
    found = _distinct_tombstones(table)
    if found != ref.tombstones:
        raise FormatError(
            f"{where}: metadata object {uri} holds records of {found} tombstone files, "
            f"its summary says {ref.tombstones}"
        )
    return table


def _distinct_tombstones(table: pa.Table) -> int:
    return pc.count_distinct(table.column("tombstone")).as_py() if table.num_rows else 0
