"""CDC delete markers (FORMAT.md §3.7): the last sequence of each key a
sequenced CDC delete removed, so a late or replayed change older than the
delete cannot bring the key back.

A marker is a row (the table's CDC key columns, its sequence columns, and
``_castsql_written_at``) in an immutable Parquet *markers object* under
``cdc/``, referenced from the manifest's ``cdc.markers`` list. No query of
the table reads them; only writers applying sequenced CDC batches do. Each
such commit that applies deletes writes one object; objects are merged as
files objects are (a size-tiered LSM, :mod:`castsql.format.fold`), keeping
the highest sequence of each key and dropping markers older than the
table's ``castsql.cdc.deleteRetention``.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> st = open_storage(tempfile.mkdtemp())
    >>> ref = write_markers(st, stamp(pa.table({"id": [3, 9], "lsn": [40, 41]})), level=0)
    >>> ref.entries, ref.min, ref.max
    (2, {'id': 3}, {'id': 9})
    >>> latest(pa.table({"id": [1, 1, 2], "lsn": [5, 7, 1]}), ["id"], ["lsn"]).to_pydict()
    {'id': [1, 2], 'lsn': [7, 1]}
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from castsql.errors import FormatError
from castsql.format.layout import new_markers_key
from castsql.format.manifest import CdcState, MarkerBounds, MetaRef, format_time, json_stat, parse_time
from castsql.format.metafiles import read_object, typed_stat
from castsql.format.schema import Schema, type_from_name
from castsql.storage import Storage

KIND = "markers"
WRITTEN_AT = "_castsql_written_at"
OLDEST, NEWEST = "oldest", "newest"  # MetaRef.extra keys: when its oldest and newest markers were written
# The tiers of files objects (FORMAT.md §3.2): level 0 below 256 markers, 8 objects of one level merge,
# full (never merged again) at 16,384.
INLINE_MAX, FANOUT, OBJECT_TARGET = 32, 8, 16384


def stamp(markers: pa.Table, now: datetime | None = None) -> pa.Table:
    """``markers`` (key and sequence columns) with the time they are written."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return markers.append_column(WRITTEN_AT, pa.array([now] * markers.num_rows, pa.timestamp("us", tz="UTC")))


def latest(table: pa.Table, key: Sequence[str], sequence: Sequence[str]) -> pa.Table:
    """One row per key: the one with the highest sequence (compared column by
    column, in order). Keys and sequences are not NULL (writers refuse such
    changes)."""
    if table.num_rows < 2:
        return table
    order = pc.sort_indices(table, sort_keys=[*((k, "ascending") for k in key), *((s, "descending") for s in sequence)])
    s = table.take(order)
    return s.filter(pa.array(key_starts(s, key)))


def key_starts(table: pa.Table, key: Sequence[str]) -> np.ndarray:
    """For ``table`` sorted by ``key``: whether each row is the first of its key."""
    n = table.num_rows
    first = np.zeros(n, dtype=bool)
    if n:
        first[0] = True
    for k in key:
        col = table.column(k).combine_chunks()
        first[1:] |= pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True).to_numpy(zero_copy_only=False)
    return first


def _bounds(table: pa.Table, key: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    mins, maxs = {}, {}
    for k in key:
        mm = pc.min_max(table.column(k))
        lo, hi = json_stat(mm["min"].as_py()), json_stat(mm["max"].as_py())
        if lo is not None and hi is not None:
            mins[k], maxs[k] = lo, hi
    return mins, maxs


def bounds(table: pa.Table, key: Sequence[str]) -> MarkerBounds:
    """How many markers ``table`` holds and their key columns' bounds (a version's ``change.markers``)."""
    mins, maxs = _bounds(table, key)
    return MarkerBounds(table.num_rows, mins, maxs)


def write_markers(storage: Storage, table: pa.Table, *, level: int | None, key: Sequence[str] | None = None) -> MetaRef:
    """Write ``table`` (key and sequence columns, then ``_castsql_written_at``)
    as a new markers object; its reference. ``key``: the key columns (default:
    the first column)."""
    key = list(key or table.column_names[:1])
    buf = io.BytesIO()
    meta = {b"castsql.kind": KIND.encode(), b"castsql.format_version": b"2"}
    pq.write_table(table.replace_schema_metadata(meta), buf, compression="zstd")
    path = new_markers_key()
    storage.put_new(path, buf.getvalue())
    mins, maxs = _bounds(table, key)
    extra = {}
    if table.num_rows:
        mm = pc.min_max(table.column(WRITTEN_AT))
        extra = {OLDEST: format_time(mm["min"].as_py()), NEWEST: format_time(mm["max"].as_py())}
    return MetaRef(path, KIND, table.num_rows, level, min=mins, max=maxs, extra=extra)


def read_markers(storage: Storage, ref: MetaRef, where: str) -> pa.Table:
    """The rows of markers object ``ref``, checked against its reference."""
    table = read_object(storage, ref, KIND, where)
    if WRITTEN_AT not in table.column_names:
        raise FormatError(f"{where}: markers object {storage.uri(ref.path)} has no {WRITTEN_AT} column")
    return table.replace_schema_metadata(None)


def conform(table: pa.Table, state: CdcState, schema: Schema, where: str) -> pa.Table:
    """``table`` (a markers object's rows) with the key and sequence columns
    in the table's types now (a column widened since reads widened)."""
    by_name = {c.name.lower(): c for c in schema.columns}
    have = {n.lower(): n for n in table.column_names}
    cols, fields = [], []
    for name in (*state.key, *state.sequence):
        col = by_name[name.lower()]
        if name.lower() not in have:
            raise FormatError(f"{where}: a markers object lacks column {name!r}")
        t = type_from_name(col.type)
        try:
            cols.append(table.column(have[name.lower()]).cast(t))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise FormatError(f"{where}: markers column {name!r} does not read as {col.type} ({e})") from None
        fields.append(pa.field(col.name, t))
    cols.append(table.column(WRITTEN_AT).cast(pa.timestamp("us", tz="UTC")))
    fields.append(pa.field(WRITTEN_AT, pa.timestamp("us", tz="UTC")))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def may_hold(ref: MetaRef, column: str, lo: Any, hi: Any) -> bool:
    """Whether ``ref``'s bounds for ``column`` overlap [lo, hi] (yes when unknown)."""
    a, b = ref.min.get(column), ref.max.get(column)
    if a is None or b is None or lo is None or hi is None:
        return True
    try:
        return not (b < lo or hi < a)
    except TypeError:
        return True


def _before(ref: MetaRef, field: str, cutoff: datetime | None) -> bool:
    """Whether ``ref``'s oldest (or newest) marker was written before ``cutoff``."""
    at = ref.extra.get(field)
    if cutoff is None or not isinstance(at, str):
        return False
    try:
        return parse_time(at) < cutoff
    except ValueError:
        return False


def any_expired(state: CdcState, retention: timedelta | None, now: datetime) -> bool:
    """Whether some marker of ``state`` is past ``retention`` (a compaction drops it)."""
    cutoff = None if retention is None else now - retention
    return any(_before(r, OLDEST, cutoff) for r in state.markers) or any(
        _before(MetaRef("", KIND, 0, extra={OLDEST: m["at"]}), OLDEST, cutoff) for m in state.inline
    )


def level(n: int) -> int | None:
    """The merge level of a markers object of ``n`` rows (None: full).

    >>> [level(n) for n in (1, 255, 256, 16384)]
    [0, 0, 1, None]
    """
    if n >= OBJECT_TARGET:
        return None
    lv, bound = 0, INLINE_MAX * FANOUT
    while n >= bound:
        lv, bound = lv + 1, bound * FANOUT
    return lv


def _unexpired(t: pa.Table, cutoff: datetime | None) -> pa.Table:
    if cutoff is None or not t.num_rows:
        return t
    return t.filter(pc.greater_equal(t.column(WRITTEN_AT), pa.scalar(cutoff, pa.timestamp("us", tz="UTC"))))


def inlinable(state: CdcState, schema: Schema) -> bool:
    """Whether the key and sequence columns' values are exact as JSON statistics (integers, text, times)."""
    for name in (*state.key, *state.sequence):
        t = type_from_name(schema.column_named(name).type)
        # Not floats: JSON has no infinity.
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_boolean(t)
                or pa.types.is_date(t) or pa.types.is_timestamp(t)):  # fmt: skip
            return False
    return True


def to_inline(t: pa.Table, state: CdcState) -> tuple[dict[str, Any], ...]:
    """Markers (rows of a markers object) as the manifest's inline entries."""
    cols = {c: t.column(c).to_pylist() for c in (*state.key, *state.sequence)}
    at = t.column(WRITTEN_AT).to_pylist()
    return tuple(
        {
            "key": [json_stat(cols[k][i]) for k in state.key],
            "sequence": [json_stat(cols[c][i]) for c in state.sequence],
            "at": format_time(at[i]),
        }
        for i in range(t.num_rows)
    )


def from_inline(state: CdcState, schema: Schema, where: str) -> pa.Table:
    """The manifest's inline markers as rows of a markers object, in the table's types now."""
    names = (*state.key, *state.sequence)
    types = {c: type_from_name(schema.column_named(c).type) for c in names}
    values: dict[str, list[Any]] = {c: [] for c in names}
    at = []
    for m in state.inline:
        for c, v in zip(names, [*m["key"], *m["sequence"]], strict=True):
            typed = typed_stat(v, types[c])
            if typed is None:
                raise FormatError(
                    f"{where}: cdc.inline: {v!r} is not a value of column {c!r} ({schema.column_named(c).type})"
                )
            values[c].append(typed)
        try:
            at.append(parse_time(m["at"]))
        except ValueError:
            raise FormatError(f"{where}: cdc.inline: {m['at']!r} is not a time") from None
    arrays = [pa.array(values[c], types[c]) for c in names] + [pa.array(at, pa.timestamp("us", tz="UTC"))]
    return pa.Table.from_arrays(arrays, names=[*names, WRITTEN_AT])


def next_markers(
    state: CdcState,
    add: pa.Table | None,
    *,
    inline: bool,
    load: Callable[[MetaRef], pa.Table],
    pending: pa.Table,
    write: Callable[[pa.Table, int | None], MetaRef | None],
    retention: timedelta | None,
    now: datetime,
    prune: bool = False,
) -> tuple[tuple[MetaRef, ...], tuple[dict[str, Any], ...]]:
    """The markers objects and inline markers of the next version.

    ``pending`` (the inline markers) and ``add`` stay inline while they are
    at most ``INLINE_MAX`` (and ``inline``: their types read back exactly
    from JSON), else they are written as one object. Every ``FANOUT``
    objects of one level are merged (the highest sequence of each key kept,
    markers past ``retention`` dropped), objects whose every marker is past
    it are dropped unread, and ``prune`` (compaction) rewrites every object
    holding an expired marker."""
    key, sequence = state.key, state.sequence
    cutoff = None if retention is None else now - retention
    out = [r for r in state.markers if not _before(r, NEWEST, cutoff)]

    def rewrite(members: list[MetaRef]) -> MetaRef | None:
        t = latest(_unexpired(pa.concat_tables([load(r) for r in members]), cutoff), key, sequence)
        return write(t, level(t.num_rows)) if t.num_rows else None

    new = _unexpired(pa.concat_tables([pending, add]) if add is not None and add.num_rows else pending, cutoff)
    kept: tuple[dict[str, Any], ...] = ()
    if inline and new.num_rows <= INLINE_MAX:
        kept = to_inline(new, state) if new.num_rows != len(state.inline) or add is not None else state.inline
    elif new.num_rows and (ref := write(latest(new, key, sequence), None)) is not None:
        out.append(replace(ref, level=level(ref.entries)))
    if prune:
        out = [r2 for r in out if (r2 := (rewrite([r]) if _before(r, OLDEST, cutoff) else r)) is not None]
    while True:
        by_level: dict[int, list[int]] = {}
        for i, r in enumerate(out):
            if r.level is not None:
                by_level.setdefault(r.level, []).append(i)
        due = sorted(lv for lv, idx in by_level.items() if len(idx) >= FANOUT)
        if not due:
            return tuple(out), kept
        members = by_level[due[0]][:FANOUT]
        merged = rewrite([out[i] for i in members])
        rest = [r for i, r in enumerate(out) if i not in members]
        out = [*rest, merged] if merged is not None else rest
