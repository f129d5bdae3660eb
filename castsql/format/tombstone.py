"""Tombstone files: JSON lines, each one delete, never rewriting data.

Kinds (see docs/FORMAT.md):

- ``{"file": F, "row_group": N}`` — every row of row group N of F;
- ``{"file": F, "pk_min": A, "pk_max": B}`` — rows of F whose primary key is in [A, B];
- ``{"file": F, "row_group": N, "deleted_rows": [0, 5]}`` — positions counted from
  the start of row group N;
- ``{"file": F, "deleted_rows": [...]}`` — positions counted from the start of F;
- ``"deleted_rows_bitmap": "<base64>"`` in place of ``deleted_rows`` — the same
  positions as a serialized roaring bitmap (pyroaring / CRoaring portable format).

``F`` is the data file's base name or its full path.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, TypeGuard

import pyarrow as pa
from pyroaring import BitMap

from castsql.errors import FormatError
from castsql.format.jsonio import loads_text, pk_value
from castsql.format.schema import Schema, type_from_name
from castsql.storage.base import key_problem

# Below this many positions a JSON list is as small as a bitmap and readable by eye.
_LIST_MAX = 32


@dataclass(frozen=True, slots=True)
class RowGroupDelete:
    file: str
    row_group: int


@dataclass(frozen=True, slots=True)
class KeyRangeDelete:
    file: str
    pk_min: Any
    pk_max: Any


@dataclass(frozen=True, slots=True)
class PositionDelete:
    """Positions within ``row_group`` (or within the file if it is None)."""

    file: str
    row_group: int | None
    positions: BitMap


TombstoneRecord = RowGroupDelete | KeyRangeDelete | PositionDelete


def _nonneg_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def load_bitmap(data: bytes, where: str) -> BitMap:
    """A portable roaring bitmap, or FormatError naming ``where``.

    Decoding allocates about the serialized size (CRoaring copies the
    containers as they are; pyroaring checks the result, cardinalities
    included), so a small object cannot claim a huge bitmap in memory; what the
    positions may be is checked against the data file's rows where the record
    is applied (a bitmap of 2^32 positions is 1 MB and is refused there, before
    any position is listed)."""
    try:
        return BitMap.deserialize(data)
    except (TypeError, ValueError, IndexError, OverflowError, MemoryError) as e:  # IndexError: b"" (found by fuzzing)
        raise FormatError(f"{where}: positions are not a portable roaring bitmap ({e or type(e).__name__})") from None


def parse_record(obj: Any, where: str) -> TombstoneRecord:
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: a tombstone line must be a JSON object")
    f = obj.get("file")
    if not isinstance(f, str) or not f:
        raise FormatError(f"{where}: tombstone has no 'file'")
    if (problem := key_problem(f)) is not None:
        raise FormatError(f"{where}: 'file' {f!r} is not a plain object key: it {problem}")
    keys = set(obj) - {"file"}
    rg = obj.get("row_group")
    if "row_group" in obj and not _nonneg_int(rg):
        raise FormatError(f"{where}: 'row_group' must be a non-negative integer, got {rg!r}")
    if keys == {"row_group"} and _nonneg_int(rg):  # checked above: narrows rg's type
        return RowGroupDelete(f, rg)
    if keys == {"pk_min", "pk_max"}:
        lo, hi = obj["pk_min"], obj["pk_max"]
        both_numbers = isinstance(lo, int | float) and isinstance(hi, int | float)
        if not (pk_value(lo) and pk_value(hi)) or (type(lo) is not type(hi) and not both_numbers):
            raise FormatError(f"{where}: 'pk_min'/'pk_max' must be two numbers or two strings")
        return KeyRangeDelete(f, lo, hi)
    if keys in ({"deleted_rows"}, {"row_group", "deleted_rows"}):
        rows = obj["deleted_rows"]
        if not isinstance(rows, list) or not all(_nonneg_int(r) and r < 2**32 for r in rows):
            raise FormatError(f"{where}: 'deleted_rows' must be a list of non-negative integers below 2^32")
        return PositionDelete(f, rg, BitMap(rows))
    if keys in ({"deleted_rows_bitmap"}, {"row_group", "deleted_rows_bitmap"}):
        raw = obj["deleted_rows_bitmap"]
        try:
            data = base64.b64decode(raw, validate=True)
        except (TypeError, ValueError, binascii.Error) as e:
            raise FormatError(f"{where}: 'deleted_rows_bitmap' is not a base64 roaring bitmap ({e})") from None
        return PositionDelete(f, rg, load_bitmap(data, where))
    raise FormatError(f"{where}: unknown tombstone kind with keys {sorted(obj)}")


def parse_tombstones(data: bytes, where: str) -> list[TombstoneRecord]:
    """Every record of a tombstone file; ``where`` names the file in errors."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise FormatError(f"{where}: tombstone file is not UTF-8 text") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        obj = loads_text(line, where, f"line {n}")
        out.append(parse_record(obj, f"{where}: line {n}"))
    return out


def record_to_json(r: TombstoneRecord) -> dict[str, Any]:
    if isinstance(r, RowGroupDelete):
        return {"file": r.file, "row_group": r.row_group}
    if isinstance(r, KeyRangeDelete):
        return {"file": r.file, "pk_min": r.pk_min, "pk_max": r.pk_max}
    d: dict[str, Any] = {"file": r.file}
    if r.row_group is not None:
        d["row_group"] = r.row_group
    if len(r.positions) <= _LIST_MAX:
        d["deleted_rows"] = list(r.positions)
    else:
        r.positions.run_optimize()
        d["deleted_rows_bitmap"] = base64.b64encode(r.positions.serialize()).decode()
    return d


def serialize_tombstones(records: Iterable[TombstoneRecord]) -> bytes:
    return "".join(json.dumps(record_to_json(r), separators=(",", ":")) + "\n" for r in records).encode()


def check_key_range(r: KeyRangeDelete, schema: Schema, pk: str, where: str) -> None:
    """FormatError unless ``r``'s bounds are values of the primary key's type
    (FORMAT.md §4: numbers for numeric keys, strings for string keys, ISO
    times and dates for temporal ones)."""
    col = schema.column(pk)
    t = type_from_name(col.type) if col is not None else None
    if t is None or not all(_fits(v, t) for v in (r.pk_min, r.pk_max)):
        kind = col.type if col is not None else "no such column"
        raise FormatError(f"{where}: key range [{r.pk_min!r}, {r.pk_max!r}] does not fit primary key {pk!r} ({kind})")
    if _order(r.pk_min, t) > _order(r.pk_max, t):
        # An empty range deletes nothing: a writer never records one, so it is a lie.
        raise FormatError(f"{where}: key range [{r.pk_min!r}, {r.pk_max!r}] has pk_min above pk_max")


def key_bound(v: Any, t: pa.DataType) -> Any:
    """A key-range bound (JSON: a number or a string; times and dates as ISO
    text, FORMAT.md §4) as the Python value a ``t`` column holds: an aware or
    naive datetime for a timestamp (naive ones taken as UTC), a date for a date,
    the JSON value itself otherwise."""
    from castsql.format.manifest import parse_time

    if pa.types.is_timestamp(t) and isinstance(v, str):
        when = parse_time(v)
        # A column without zone holds UTC times: a bound with an offset is that instant in UTC (FORMAT.md §4).
        return when if t.tz else when.astimezone(UTC).replace(tzinfo=None)
    if pa.types.is_date(t) and isinstance(v, str):
        return date.fromisoformat(v)
    return v


def key_bound_scalar(v: Any, t: pa.DataType) -> pa.Scalar:
    """A key-range bound as a scalar that compares with a ``t`` column as SQL
    compares them: a fractional bound of an integer key stays a double (2.5
    is not 2), any other as the column's type (:func:`key_bound`).

        >>> import pyarrow.compute as pc
        >>> pc.greater_equal(pa.array([2, 3], pa.int64()), key_bound_scalar(2.5, pa.int64())).to_pylist()
        [False, True]
    """
    if isinstance(v, float) and pa.types.is_integer(t):
        return pa.scalar(v, pa.float64())
    return pa.scalar(key_bound(v, t), type=t)


def _order(v: Any, t: pa.DataType) -> Any:
    """``v`` as the key's values compare (strings by code point, which is
    UTF-8 byte order; times as instants, naive ones taken as UTC)."""
    if pa.types.is_timestamp(t):
        when = datetime.fromisoformat(v.replace("Z", "+00:00"))
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    return v


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _fits(v: Any, t: pa.DataType) -> bool:
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        if not isinstance(v, int | float) or isinstance(v, bool):
            return False
        # An integer past the key type's range is no key's value (DuckDB
        # cannot even take it as a bound: past 128 bits it fails the query).
        return not (isinstance(v, int) and pa.types.is_integer(t)) or _int_range(t)[0] <= v <= _int_range(t)[1]
    if not isinstance(v, str):
        return False
    if pa.types.is_string(t):
        return True
    try:
        if pa.types.is_timestamp(t):
            datetime.fromisoformat(v.replace("Z", "+00:00"))
        elif pa.types.is_date(t):
            date.fromisoformat(v)
        else:
            return False
    except ValueError:
        return False
    return True
