"""A diff audit's rows as the diff page shows them: inserts, deletes and
updates (a preimage and its postimage paired), paged without turning the
whole diff into Python values.

Example::

    >>> import pyarrow as pa
    >>> d = Diff(pa.table({"id": [1, 1, 2], "v": ["a", "b", "c"],
    ...                    "_change_type": ["update_preimage", "update_postimage", "insert"]}))
    >>> d.counts, [(e.kind, sorted(e.changed)) for e in d.page(0, 10)]
    ({'insert': 1, 'delete': 0, 'update': 1}, [('update', ['v']), ('insert', [])])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

CHANGE_TYPE = "_change_type"
AUDIT_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


@dataclass(frozen=True, slots=True)
class DiffEntry:
    """One row of a diff: ``kind`` is ``insert``, ``delete`` or ``update``
    (``old`` and ``new`` both set, ``changed`` the columns whose values differ)."""

    kind: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    changed: frozenset[str] = frozenset()


class Diff:
    """A diff audit's rows (ordered by key, an update's preimage right before
    its postimage), paged by entry: an insert, a delete or an update's pair."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        kinds = rows.column(CHANGE_TYPE)
        # Each entry starts at a row that is not an update's postimage.
        self.starts = pc.indices_nonzero(pc.not_equal(kinds, "update_postimage")).to_numpy()
        counts = {r["values"]: r["counts"] for r in pc.value_counts(kinds).to_pylist()}
        self.counts = {
            "insert": counts.get("insert", 0),
            "delete": counts.get("delete", 0),
            "update": counts.get("update_postimage", 0),
        }

    def __len__(self) -> int:
        return len(self.starts)

    def page(self, first: int, n: int) -> list[DiffEntry]:
        """Entries ``first`` to ``first + n``."""
        if first >= len(self.starts):
            return []
        lo = int(self.starts[first])
        hi = int(self.starts[first + n]) if first + n < len(self.starts) else self.rows.num_rows
        return entries(self.rows.slice(lo, hi - lo))


def entries(rows: pa.Table) -> list[DiffEntry]:
    """A diff's rows (as ``Session.diff`` returns them: ordered by key, an
    update's preimage before its postimage) as inserts, deletes and paired updates."""
    cols = [c for c in rows.column_names if c not in AUDIT_COLUMNS]
    out: list[DiffEntry] = []
    pre: dict[str, Any] | None = None
    for r in rows.to_pylist():
        kind = r.pop(CHANGE_TYPE)
        for c in AUDIT_COLUMNS:
            r.pop(c, None)
        if kind == "update_preimage":
            pre = r
        elif kind == "update_postimage" and pre is not None:
            changed = frozenset(c for c in cols if pre.get(c) != r.get(c))
            out.append(DiffEntry("update", pre, r, changed))
            pre = None
        else:
            out.append(DiffEntry(kind, r if kind == "delete" else None, r if kind == "insert" else None))
    return out
