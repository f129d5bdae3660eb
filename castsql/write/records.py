"""The tombstone planner: the cheapest records deleting a set of matched rows.

Both engines feed it *units*, one summary per (file, row group) holding live
rows, as plain dicts (JSON-able, so Spark workers can send them):

- ``key``, ``rg``: the file's table key and the row group;
- ``live``, ``matched``: live rows of the row group and how many matched;
- ``bitmap``: the matched file positions, a :class:`pyroaring.BitMap` or its
  serialized form in base64 (what Spark workers send);
- optional key facts that make a key range provably exact: ``sorted`` (the
  key strictly increases over the live rows), ``first``/``last`` (the keys of
  the first and last live row), ``contig``, ``touch_start``, ``touch_end``
  (the matched rows are one run of consecutive live rows, reaching the first /
  last live row), ``lo``/``hi`` (the first and last matched key). A unit
  without them never gets a key range.

Per file the plan is, whichever serializes shorter (row groups win ties:
readers skip them without reading):

- ``RowGroupDelete`` for each row group all of whose live rows match, plus
  one ``PositionDelete`` (file-relative bitmap) for the rest; or
- one ``KeyRangeDelete`` when it is exact: the key strictly increases over
  the file's live rows and the matched rows are one run of consecutive live
  rows, so the live rows with a key in [first matched, last matched] are
  exactly the matched ones.

Example::

    >>> from pyroaring import BitMap
    >>> units = {"a.parquet": [{"key": "a.parquet", "rg": 0, "live": 3, "matched": 3, "bitmap": BitMap([0, 1, 2])},
    ...                        {"key": "a.parquet", "rg": 1, "live": 3, "matched": 1, "bitmap": BitMap([4])}]}
    >>> plan = plan_records(units, ["a.parquet"], pk_ok=False, version=1)
    >>> plan.rows, [type(r).__name__ for r in plan.records]
    (4, ['RowGroupDelete', 'PositionDelete'])
"""

from __future__ import annotations

import array
import base64
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import AbstractBitMap, BitMap

from castsql.format.manifest import json_stat
from castsql.format.schema import json_ordered
from castsql.format.tombstone import (
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    TombstoneRecord,
    serialize_tombstones,
)

FILE_COL = "_castsql_file"  # table key of the row's data file
POS_COL = "_castsql_pos"  # the row's position in that file (Spark's _metadata.row_index)
RG_COL = "_castsql_rg"  # the row group holding it
MATCH_COL = "_castsql_match"  # does the operation delete (or replace) this row?
PK_COL = "_castsql_pk"  # the row's primary key, when key ranges are possible

Unit = dict[str, Any]


@dataclass
class DeletePlan:
    """What a delete would record: the tombstone records and the rows they remove."""

    version: int
    records: list[TombstoneRecord] = field(default_factory=list)
    rows: int = 0
    files: int = 0
    positions: dict[str, BitMap] = field(default_factory=dict)  # the rows deleted, by file

    @property
    def targets(self) -> frozenset[str]:
        """Table keys of the files the records name."""
        return frozenset(r.file for r in self.records)


def key_range_type(t: pa.DataType) -> bool:
    """Key types whose ranges tombstones can state exactly in JSON (FORMAT.md §4)."""
    if pa.types.is_unsigned_integer(t) and t.bit_width == 64:
        return False  # Spark reads uint64 as DECIMAL
    return json_ordered(t) and not pa.types.is_boolean(t)


def _bitmap(u: Unit) -> BitMap:
    b = u["bitmap"]
    return b if isinstance(b, BitMap) else BitMap.deserialize(base64.b64decode(b))


def file_records(key: str, units: list[Unit], pk_ok: bool) -> tuple[list[TombstoneRecord], int]:
    """The cheapest records deleting the matched rows of one file, and how many
    rows they delete; ``units`` are the summaries of its row groups that have
    live rows (at least those with matches; all of them for a key range)."""
    units.sort(key=lambda u: u["rg"])
    matched = [u for u in units if u["matched"]]
    n = sum(u["matched"] for u in matched)
    by_groups: list[TombstoneRecord] = []
    rest = BitMap()
    for u in matched:
        if u["matched"] == u["live"]:
            by_groups.append(RowGroupDelete(key, u["rg"]))
        else:
            rest |= _bitmap(u)
    if rest:
        rest.run_optimize()
        by_groups.append(PositionDelete(key, None, rest))
    if pk_ok and key_range_exact(units):
        by_range: list[TombstoneRecord] = [KeyRangeDelete(key, matched[0]["lo"], matched[-1]["hi"])]
        if len(serialize_tombstones(by_range)) < len(serialize_tombstones(by_groups)):
            return by_range, n
    return by_groups, n


def key_range_exact(units: list[Unit]) -> bool:
    """True if the matched rows are exactly the live rows whose key lies in
    [first matched key, last matched key]: the key strictly increases over the
    file's live rows (within each row group and across them) and the matched
    rows are consecutive live rows. ``units`` must be every row group of the
    file with live rows, in order."""
    if not units or not all(u.get("sorted") for u in units):
        return False
    try:
        if not all(a["last"] < b["first"] for a, b in itertools.pairwise(units)):
            return False
    except TypeError:  # keys of mixed JSON types cannot be ordered
        return False
    hit = [i for i, u in enumerate(units) if u["matched"]]
    if not hit:
        return False
    first, last = hit[0], hit[-1]
    if any(not units[i].get("contig") for i in hit):
        return False
    if first != last and not (units[first]["touch_end"] and units[last]["touch_start"]):
        return False
    return all(units[i]["matched"] == units[i]["live"] for i in range(first + 1, last))


def summarize(table: pa.Table) -> Unit:
    """The unit summary of the live rows of ONE (file, row group): ``table`` has
    FILE_COL, RG_COL, POS_COL, MATCH_COL and, for key ranges, PK_COL; the
    bitmap comes out in base64 (JSON for Spark's workers)."""
    key, rg = table.column(FILE_COL)[0].as_py(), int(table.column(RG_COL)[0].as_py())
    t = table.take(pc.sort_indices(table.column(POS_COL)))
    pos = t.column(POS_COL).to_numpy()
    m = pc.fill_null(t.column(MATCH_COL), False).to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(m)
    info: Unit = {"key": key, "rg": rg, "live": len(pos), "matched": len(idx)}
    if len(idx):
        bm = BitMap(array.array("I", pos[idx].astype(np.uint32).tobytes()))
        bm.run_optimize()
        info["bitmap"] = base64.b64encode(bm.serialize()).decode()
        info["contig"] = bool(idx[-1] - idx[0] + 1 == len(idx))
        info["touch_start"] = bool(idx[0] == 0)
        info["touch_end"] = bool(idx[-1] == len(pos) - 1)
    if PK_COL in t.column_names:
        pk = t.column(PK_COL).combine_chunks()
        ok = pk.null_count == 0
        if ok and len(pk) > 1:
            ok = bool(pc.all(pc.greater(pk.slice(1), pk.slice(0, len(pk) - 1))).as_py())
        first, last = json_stat(pk[0].as_py()), json_stat(pk[-1].as_py())
        info["sorted"] = bool(ok and first is not None and last is not None)
        info["first"], info["last"] = first, last
        if len(idx) and info["sorted"]:
            info["lo"], info["hi"] = json_stat(pk[int(idx[0])].as_py()), json_stat(pk[int(idx[-1])].as_py())
    return info


def plan_records(
    units_by_file: Mapping[str, list[Unit]], file_order: Iterable[str], pk_ok: bool, *, version: int
) -> DeletePlan:
    """The plan both engines commit: for each file in ``file_order`` (manifest
    order, so tombstones are stable) with matched rows, its cheapest records."""
    plan = DeletePlan(version)
    for key in file_order:
        units = units_by_file.get(key)
        if not units or not any(u["matched"] for u in units):
            continue
        recs, n = file_records(key, list(units), pk_ok)
        plan.records.extend(recs)
        plan.rows += n
        plan.files += 1
        plan.positions[key] = BitMap.union(*(_bitmap(u) for u in units if u["matched"]))
    return plan


def position_units(
    key: str, positions: np.ndarray, row_group_rows: Sequence[int], deleted: AbstractBitMap | None
) -> list[Unit]:
    """Units for the matched file ``positions`` of one file without reading it:
    live rows per row group are its rows minus its deleted positions (so a
    fully matched row group becomes a RowGroupDelete). No key facts: an
    engine that did not read the file's keys cannot prove a key range."""
    pos = np.unique(np.asarray(positions, dtype=np.int64))
    bounds = np.concatenate(([0], np.cumsum(np.asarray(row_group_rows, dtype=np.int64))))
    rgs = np.searchsorted(bounds, pos, side="right") - 1
    out = []
    cuts = np.flatnonzero(np.diff(rgs)) + 1
    for chunk in np.split(np.arange(len(pos)), cuts):
        if not len(chunk):
            continue
        rg = int(rgs[chunk[0]])
        start, end = int(bounds[rg]), int(bounds[rg + 1])
        live = end - start
        if deleted:
            live -= deleted.range_cardinality(start, end)
        bm = BitMap(array.array("I", pos[chunk].astype(np.uint32).tobytes()))
        if deleted:
            bm -= deleted  # already gone: deleting again changes nothing
        if bm:
            out.append({"key": key, "rg": rg, "live": live, "matched": len(bm), "bitmap": bm})
    return out
