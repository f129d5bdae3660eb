"""Min/max pruning: which data files can hold rows matching simple predicates.

A predicate is ``column op value`` with op in ``= != < <= > >=``; a list of
them is a conjunction. A file is kept unless its manifest min/max prove that no
row can match; a file without statistics for a column is always kept.

Example::

    >>> f = DataFile("a.parquet", 1, 1, 10, {"id": 0}, {"id": 9})
    >>> may_match(f, [Predicate("id", ">", 9)], {"id": "int64"})
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.format import DataFile
from castsql.format.arrays import FALSE, from_numpy, scalar
from castsql.format.manifest import json_stat

_OPS = {"=", "==", "!=", "<>", "<", "<=", ">", ">="}


@dataclass(frozen=True)
class Predicate:
    column: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unsupported operator {self.op!r} (use one of {sorted(_OPS)})")


def _comparable(value: Any, type_name: str) -> Any:
    """``value`` in the form the manifest stores statistics of that column in."""
    if isinstance(value, datetime | date):
        v = json_stat(value)
        if isinstance(value, datetime) and value.tzinfo is None and "tz=" in type_name:
            v = v + "Z"
        return v
    return value


def _prepare(preds: Sequence[Predicate], types: dict[str, str]) -> list[tuple[str, str, Any]]:
    """(column, op, value as stored in statistics): converted once, not once per file."""
    return [(p.column, p.op, _comparable(p.value, types.get(p.column, ""))) for p in preds if p.value is not None]


def _may_match(f: DataFile, preds: list[tuple[str, str, Any]]) -> bool:
    for col, op, v in preds:
        lo, hi = f.min.get(col), f.max.get(col)
        if lo is None or hi is None:
            continue
        if isinstance(v, str) and v[4:5] == "-" and not (str(lo)[4:5] == str(hi)[4:5] == "-"):
            # A time before year 1000 written by an older CastSQL without its
            # leading zeros ("201-05-01T…"): as text it does not order; keep the file.
            continue
        if isinstance(v, str) and len(v) > 10 and isinstance(lo, str) and len(lo) == 10:
            # A date column widened to a timestamp (FORMAT.md §3.4): its old
            # statistics are dates, i.e. midnight, in the timestamp's form.
            lo, hi = lo + "T00:00:00.000000", (hi + "T00:00:00.000000" if len(hi) == 10 else hi)
        try:
            if (
                (op in ("=", "==") and (v < lo or v > hi))
                or (op == "<" and lo >= v)
                or (op == "<=" and lo > v)
                or (op == ">" and hi <= v)
                or (op == ">=" and hi < v)
                or (op in ("!=", "<>") and lo == hi == v)
            ):
                return False
        except TypeError:
            continue  # incomparable statistic: keep the file
    return True


def may_match(f: DataFile, preds: Sequence[Predicate], types: dict[str, str]) -> bool:
    return _may_match(f, _prepare(preds, types))


def prune_files(files: Sequence, preds: Sequence[Predicate], types: dict[str, str]) -> list:
    """The files (anything with an ``entry`` DataFile, or DataFiles) that may match."""
    prepared = _prepare(preds, types)
    if not prepared:
        return list(files)
    return [f for f in files if _may_match(getattr(f, "entry", f), prepared)]


def prune_refs(refs: Sequence, preds: Sequence[Predicate], types: dict[str, str]) -> list:
    """The metadata objects (MetaRefs of files objects) whose summaries may match."""
    prepared = _prepare(preds, types)
    if not prepared:
        return list(refs)
    return [r for r in refs if _may_match(r, prepared)]


def prune_mask(table: pa.Table, preds: Sequence[Predicate], types: dict[str, str]) -> pa.Array:
    """For each row of a files table (castsql.format.metafiles), whether its
    typed min/max statistics may match every predicate (nulls: may match)."""
    keep = from_numpy(np.ones(table.num_rows, dtype=bool))
    if "min" not in table.column_names or table.num_rows == 0:
        return keep
    mins, maxs = table.column("min").combine_chunks(), table.column("max").combine_chunks()
    for p in preds:
        if p.value is None or mins.type.get_field_index(p.column) < 0:
            continue
        lo, hi = mins.field(p.column), maxs.field(p.column)
        try:
            v = scalar(p.value, lo.type)
            op = p.op
            if op in ("=", "=="):
                out = pc.or_(pc.greater(lo, v), pc.less(hi, v))
            elif op == "<":
                out = pc.greater_equal(lo, v)
            elif op == "<=":
                out = pc.greater(lo, v)
            elif op == ">":
                out = pc.less_equal(hi, v)
            elif op == ">=":
                out = pc.less(hi, v)
            else:
                out = pc.and_(pc.equal(lo, v), pc.equal(hi, v))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            continue  # a value of another kind than the column: no pruning on it
        keep = pc.and_(keep, pc.invert(pc.fill_null(out, FALSE)))
    return keep
