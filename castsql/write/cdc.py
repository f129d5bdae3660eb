"""Change data capture: applying a feed of inserts, updates and deletes, batch
by batch, each batch one merge (one version).

A batch is rows of the table's columns plus an operation column (``"D"`` or
``"delete"`` deletes the key; anything else upserts it) and, when a batch may
touch one key several times, a sequence column: :func:`latest_per_key` keeps
the last change of each key (a merge refuses two source rows for one target
row, as Delta does), then :func:`cdc_merge_spec` is the merge that applies it:

- key present, delete operation: the row is deleted;
- key present, other operation: the row becomes the batch's row;
- key absent, other operation: the row is inserted (a delete of an absent key
  does nothing).

Example::

    >>> import pyarrow as pa
    >>> batch = pa.table({"id": [1, 1, 2], "v": ["a", "b", None], "op": ["I", "U", "D"], "seq": [1, 2, 3]})
    >>> latest_per_key(batch, "id", "seq").to_pydict()
    {'id': [1, 2], 'v': ['b', None], 'op': ['U', 'D'], 'seq': [2, 3]}
    >>> [c.kind for c in cdc_merge_spec("id", "op").clauses]
    ['matched_delete', 'matched_update', 'not_matched_insert']

With the embedded engine (``table.merge(...)`` is a builder; the spec's
clauses can be given to it one by one, or use :func:`apply_cdc`)::

    >>> apply_cdc(events, batch, key="id", op_column="op", sequence="seq")   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.write.merge import Clause, MergeMetrics, MergeSpec


def _sql_text(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def cdc_merge_spec(
    key: str | Sequence[str],
    op_column: str,
    delete_values: Sequence[str] = ("D", "delete"),
    *,
    source_alias: str = "source",
    target_alias: str = "target",
    quote: Any = None,
) -> MergeSpec:
    """The merge applying one CDC batch (one row per key: see :func:`latest_per_key`).

    ``quote`` quotes the operation column's name in the conditions (default:
    double quotes, which DuckDB takes; pass a backtick quoter for Spark)."""
    q = quote or (lambda n: '"' + n.replace('"', '""') + '"')
    keys = (key,) if isinstance(key, str) else tuple(key)
    values = ", ".join(_sql_text(v) for v in delete_values)
    is_delete = f"{q(source_alias)}.{q(op_column)} IN ({values})"
    return MergeSpec(
        on=keys,
        clauses=(
            Clause("matched_delete", condition=is_delete),
            Clause("matched_update"),
            Clause("not_matched_insert", condition=f"NOT COALESCE({is_delete}, FALSE)"),
        ),
        source_alias=source_alias,
        target_alias=target_alias,
    )


def latest_per_key(table: pa.Table, key: str | Sequence[str], sequence: str) -> pa.Table:
    """The last row of each key by ``sequence`` (ties: the later row of
    ``table``), in key order; pyarrow only."""
    keys = [key] if isinstance(key, str) else list(key)
    if table.num_rows < 2:
        return table
    idx = pa.array(np.arange(table.num_rows))
    order = pc.sort_indices(
        table.append_column("__castsql_idx", idx),
        sort_keys=[*((k, "ascending") for k in keys), (sequence, "descending"), ("__castsql_idx", "descending")],
    )
    s = table.take(order)
    first = np.zeros(s.num_rows, dtype=bool)
    first[0] = True
    for k in keys:
        col = s.column(k).combine_chunks()
        same = pc.fill_null(pc.equal(col.slice(1), col.slice(0, len(col) - 1)), False)
        both_null = pc.and_(pc.is_null(col.slice(1)), pc.is_null(col.slice(0, len(col) - 1)))
        differ = ~(same.to_numpy(zero_copy_only=False) | both_null.to_numpy(zero_copy_only=False))
        first[1:] |= differ
    return s.filter(pa.array(first))


def apply_cdc(
    table: Any,
    batch: Any,
    *,
    key: str | Sequence[str],
    op_column: str,
    sequence: str | None = None,
    delete_values: Sequence[str] = ("D", "delete"),
) -> MergeMetrics:
    """Apply one CDC ``batch`` (Arrow) to a :class:`castsql.Table` with the
    embedded engine: one version. With ``sequence``, a key changed several
    times in the batch takes its last change."""
    from castsql.write.arrow import as_arrow

    src = as_arrow(batch, f"table {table.name}: cdc batch")
    if sequence is not None:
        src = latest_per_key(src, key, sequence)
    spec = cdc_merge_spec(key, op_column, delete_values)
    builder = table.merge(src, on=list(spec.on))
    for c in spec.clauses:
        builder.add(c)
    return builder.execute()
