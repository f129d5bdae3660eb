"""Debezium's change event envelope as a CDC batch (:mod:`castsql.write.cdc`).

A Debezium event (the value of a Kafka record, with or without its
``schema``/``payload`` wrapper) is ``{"before": row, "after": row, "source":
{...}, "op": "c"|"u"|"d"|"r", "ts_ms": N}``. :func:`read_debezium` turns
events into the rows ``apply_cdc`` takes: the row (``after``; ``before`` for
a delete), the operation in :data:`OP_COLUMN`, and the default sequence
columns taken from ``source``, stored in the table as Apache Hudi's Debezium
sources store them:

==============================  ==========================================
source fields                   sequence columns
==============================  ==========================================
``lsn`` (PostgreSQL)            ``_event_lsn``
``file``, ``pos``, ``row``      ``_event_bin_file``, ``_event_pos``,
(MySQL, MariaDB: binlog)        ``_event_row``
``commit_lsn``, ``change_lsn``, ``_event_commit_lsn``, ``_event_change_lsn``,
``event_serial_no`` (SQL Srv.)  ``_event_serial_no``
anything else                   ``_event_ts_ms`` (the event's ``ts_ms``)
==============================  ==========================================

Unchanged TOAST columns arrive as ``__debezium_unavailable_value``: they keep
the stored value (``unavailable``). Tombstone records (a null value) and
heartbeats carry no change and are skipped; ``t`` (truncate) and ``m``
(message) events are refused.

Example::

    >>> events = [
    ...     {"payload": {"op": "c", "after": {"id": 1, "v": "a"}, "source": {"lsn": 10}, "ts_ms": 5}},
    ...     {"op": "d", "before": {"id": 1, "v": None}, "source": {"lsn": 12}, "ts_ms": 6},
    ... ]
    >>> b = read_debezium(events)
    >>> b.table.column_names, b.table.column("__debezium_op").to_pylist()
    (['id', 'v', '__debezium_op', '_event_lsn'], ['c', 'd'])
    >>> b.sequence
    ('_event_lsn',)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa

from castsql.errors import MergeError

OP_COLUMN = "__debezium_op"
OPS = ("c", "u", "d", "r")
# (source fields, sequence columns), the first whose fields every event has.
SEQUENCES = (
    (("lsn",), ("_event_lsn",)),
    (("file", "pos", "row"), ("_event_bin_file", "_event_pos", "_event_row")),
    (("commit_lsn", "change_lsn", "event_serial_no"), ("_event_commit_lsn", "_event_change_lsn", "_event_serial_no")),
)
TS_SEQUENCE = ("_event_ts_ms",)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class DebeziumBatch:
    """Events read as a CDC batch: ``table`` (rows, :data:`OP_COLUMN`, the
    sequence columns) and the sequence columns' names."""

    table: pa.Table
    sequence: tuple[str, ...]
    op_column: str = OP_COLUMN


def _events(source: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(source, str | os.PathLike):
        out = []
        try:
            with open(source, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise MergeError(f"{where}: {source}, line {n}: not a JSON event ({e.msg})") from None
        except OSError as e:
            raise MergeError(f"{where}: cannot read {source}: {e.strerror or e}") from None
        return out
    if isinstance(source, pa.Table):
        return source.to_pylist()
    if isinstance(source, Iterable) and not isinstance(source, str | bytes | Mapping):
        return list(source)
    raise MergeError(f"{where}: Debezium events must be a JSON-lines file, a list of events or an Arrow table")


def read_events(paths: Iterable[str], where: str) -> list[Mapping[str, Any]]:
    """The events of JSON-lines files, in order (``castsql merge --format debezium``)."""
    return [e for p in paths for e in _events(p, where)]


def _payload(event: Any, i: int, where: str) -> Mapping[str, Any] | None:
    if event is None:
        return None  # a tombstone record: Kafka's compaction marker, no change
    if isinstance(event, str):
        event = json.loads(event)
    if not isinstance(event, Mapping):
        raise MergeError(f"{where}: event {i} is not an object")
    if "payload" in event and isinstance(event["payload"], Mapping | type(None)):
        return _payload(event["payload"], i, where)
    return event


def _sequence(payloads: list[Mapping[str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The source fields every event names (a snapshot event may leave one NULL, as SQL Server's
    ``change_lsn``), and their sequence columns; else the event time."""
    for fields, names in SEQUENCES:
        if payloads and all(isinstance(p.get("source"), Mapping) and all(f in p["source"] for f in fields)
                            for p in payloads):  # fmt: skip
            return fields, names
    return (), TS_SEQUENCE


def _lowest(values: list[Any]) -> Any:
    """What a NULL sequence field stands for: below every value (a snapshot's event comes first)."""
    return "" if any(isinstance(v, str) for v in values) else 0


# Debezium's logical types of integer times (the schema wrapper names them), in microseconds per unit.
_TIME_UNITS = {
    "io.debezium.time.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": 0.001,
}


def _logical(schema: Any) -> dict[str, str]:
    """Field name -> Debezium logical type, from an event's ``schema`` (its ``before``/``after`` structs)."""
    out: dict[str, str] = {}
    if not isinstance(schema, Mapping):
        return out
    for side in schema.get("fields") or ():
        if isinstance(side, Mapping) and side.get("field") in ("before", "after"):
            for f in side.get("fields") or ():
                if isinstance(f, Mapping) and isinstance(f.get("field"), str) and isinstance(f.get("name"), str):
                    out[f["field"]] = f["name"]
    return out


def _value(v: Any, t: pa.DataType | None, logical: str | None, where: str, column: str) -> Any:
    """A Debezium field as the table column's type expects it: epoch days for a
    date, epoch milli-, micro- or nanoseconds for a time as the event's schema
    names it (microseconds, Debezium's MicroTimestamp, without a schema)."""
    if t is None or v is None or isinstance(v, str | bool):
        return v
    try:
        if pa.types.is_date(t) and isinstance(v, int):
            return date(1970, 1, 1) + timedelta(days=v)
        if pa.types.is_timestamp(t) and isinstance(v, int):
            unit = _TIME_UNITS.get(logical or "", 1)
            ts = _EPOCH + timedelta(microseconds=v * unit if unit >= 1 else v // round(1 / unit))
            return ts if t.tz else ts.replace(tzinfo=None)
    except (OverflowError, ValueError):
        raise MergeError(
            f"{where}: column {column!r}: {v} is not a time {logical or 'in microseconds'} can hold"
        ) from None
    return v


def _changes(events: Any, where: str) -> tuple[list[tuple[Mapping, dict]], dict[str, str]]:
    """Each event that changes a row, as (its payload, the row it leaves: the
    ``before`` of a delete, else the ``after``), and the logical types the
    events' schemas name; tombstone records and heartbeats skipped."""
    payloads = []
    logical: dict[str, str] = {}
    for i, e in enumerate(_events(events, where)):
        if isinstance(e, Mapping) and "payload" in e:
            logical.update(_logical(e.get("schema")))
        p = _payload(e, i, where)
        if p is None or (p.get("op") is None and p.get("after") is None and p.get("before") is None):
            continue  # a tombstone record or a heartbeat
        op = p.get("op")
        if op not in OPS:
            why = {"t": " — a truncate cannot be applied key by key", "m": " — a message event changes no row"}
            raise MergeError(
                f"{where}: event {i} has op {op!r}; CastSQL applies c, u, r (upserts) and d (deletes)"
                + why.get(str(op), "")
            )
        row = p.get("before") if op == "d" else p.get("after")
        if not isinstance(row, Mapping):
            side = "before" if op == "d" else "after"
            raise MergeError(f"{where}: event {i} (op {op!r}) has no {side!r} row")
        payloads.append((p, dict(row)))
    return payloads, logical


def read_debezium(events: Any, schema: pa.Schema | None = None, *, where: str = "debezium") -> DebeziumBatch:
    """Debezium events (a JSON-lines file, a list of events or of their JSON
    texts, or an Arrow table of ``op``, ``before``, ``after``, ``source``,
    ``ts_ms``) as a CDC batch; ``schema`` (the table's) types the row
    columns it has."""
    payloads, logical = _changes(events, where)
    fields, names = _sequence([p for p, _ in payloads])
    types = {f.name.lower(): f.type for f in schema} if schema is not None else {}
    rows = []
    low = {f: _lowest([p["source"][f] for p, _ in payloads]) for f in fields}
    for p, row in payloads:
        out = {k: _value(v, types.get(k.lower()), logical.get(k), where, k) for k, v in row.items()}
        out[OP_COLUMN] = p["op"]
        if fields:
            for f, n in zip(fields, names, strict=True):
                v = p["source"][f]
                out[n] = low[f] if v is None else v
        else:
            out[names[0]] = p.get("ts_ms")
        rows.append(out)
    if not rows:
        empty = [*(schema or []), pa.field(OP_COLUMN, pa.string()), *(pa.field(n, pa.int64()) for n in names)]
        return DebeziumBatch(pa.schema(empty).empty_table(), names)
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    fields_out = []
    for c in columns:
        t = types.get(c.lower())
        fields_out.append(pa.field(c, t) if t is not None else None)
    try:
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows])
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise MergeError(f"{where}: the events' values do not make a table ({e})") from None
    for i, wanted in enumerate(fields_out):
        if wanted is None or table.column(i).type == wanted.type:
            continue
        try:
            table = table.set_column(i, wanted, table.column(i).cast(wanted.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue  # left as read: the merge's type rule names the column and both types
    return DebeziumBatch(table, names)
