"""Change data capture as it is delivered: batches of inserts, updates and
deletes, out of order across batches and at least once, applied so that the
table ends the same whatever the order and however often a batch comes.

A batch is rows of the table's columns plus an operation column (upserts:
``i``, ``u``, ``c``, ``r``, ``insert``, ``update``, ``upsert``; deletes:
``d``, ``delete``; any case; anything else is refused). With a
``sequence`` (one column or several, compared in order: Debezium's
``source.lsn``, a Kafka partition and offset), every change has a *rank*:

1. its sequence;
2. then its kind: a delete outranks an insert or update of the same sequence;
3. then, between two upserts of one key with the same sequence, their values
   (the batch's table columns other than key and sequence, in table order,
   NULL lowest, as SQL orders them).

A change applies only if it outranks the last change the table applied to
its key, a delete included: the live row's rank (its own sequence columns,
so they are table columns) and the key's *delete markers* (FORMAT.md §3.7;
the last sequence of each key a sequenced delete removed, kept for
``castsql.cdc.deleteRetention``). So a late change never rolls a row back,
a deleted key stays deleted, a replayed batch changes nothing, and the table
after any delivery order equals the highest-ranked change of each key. In a
batch, the highest-ranked change of each key is the one applied.

Both engines run the same SQL texts, built here (:class:`Cdc`), through the
one write pipeline (:func:`castsql.write.pipeline.apply_cdc`): the embedded
engine with DuckDB, Spark with Spark SQL.

Without a sequence a batch is applied as delivered: a key may appear once,
the last batch applied wins (no markers).

Example::

    >>> import pyarrow as pa
    >>> batch = pa.table({"id": [1, 1, 2], "v": ["a", "b", None], "op": ["I", "U", "D"], "seq": [1, 2, 3]})
    >>> latest_per_key(batch, "id", "seq").to_pydict()
    {'id': [1, 2], 'v': ['b', None], 'op': ['U', 'D'], 'seq': [2, 3]}
    >>> [c.kind for c in Cdc(("id",), "op", ("seq",)).merge_spec(["id", "v", "seq"], "duckdb").clauses]
    ['matched_delete', 'matched_update', 'not_matched_insert']

With the embedded engine::

    >>> events.apply_cdc(batch, key="id", op_column="op", sequence="seq")   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import MergeError
from castsql.format.schema import Schema
from castsql.write.merge import Clause, MergeMetrics, MergeSpec

UPSERTS = ("i", "u", "c", "r", "insert", "update", "upsert")
DELETES = ("d", "delete")
DEBEZIUM_UNAVAILABLE = "__debezium_unavailable_value"  # an unchanged TOAST column, as Debezium sends it

_DEL, _RN = "_castsql_del", "_castsql_rn"


def _text(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def _names(v: str | Sequence[str] | None) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


@dataclass(frozen=True)
class Dialect:
    """The few spellings DuckDB and Spark SQL differ in; ``sql_type`` names a
    manifest column type (``int64``) in the engine's SQL."""

    name: str  # "duckdb" or "spark"
    sql_type: Callable[[str], str] | None = None

    def q(self, n: str) -> str:
        if self.name == "spark":
            return "`" + n.replace("`", "``") + "`"
        return '"' + n.replace('"', '""') + '"'

    def boxed(self, x: str) -> str:
        """A one-field struct of ``x``: NULL only when no value, not when the value is NULL."""
        return f"named_struct('v', {x})" if self.name == "spark" else f"struct_pack(v := {x})"

    def last_value(self, x: str) -> str:
        return f"last_value({x}) IGNORE NULLS" if self.name == "spark" else f"last_value({x} IGNORE NULLS)"

    def blob(self, text: str) -> str:
        return f"CAST({_text(text)} AS {'BINARY' if self.name == 'spark' else 'BLOB'})"


@dataclass
class CdcMetrics(MergeMetrics):
    """What applying a CDC batch did: the merge's metrics, and what became of
    each change. ``num_changes``: changes left after keeping each key's
    highest-ranked one (``num_changes_superseded`` were outranked in the
    batch); of those, ``num_changes_applied`` changed the table (a delete of
    a key the table does not hold counts: its marker is kept) and
    ``num_changes_stale`` did not (the table had applied a later change of
    the key). ``batch_replayed``: the batch id was already committed, and
    nothing was read or written."""

    num_changes: int = 0
    num_changes_applied: int = 0
    num_changes_superseded: int = 0
    num_changes_stale: int = 0
    num_delete_markers_added: int = 0
    batch_replayed: bool = False


@dataclass(frozen=True)
class Cdc:
    """How a batch's rows are read as changes, and the SQL that applies them.

    ``key``: the columns identifying a row; ``op_column``: the operation
    (not stored); ``sequence``: the columns ordering a key's changes (stored:
    table columns). ``partial``: a table column the batch lacks keeps its
    stored value (NULL for a new row) instead of being refused;
    ``unavailable``: a text (or binary) value that means "unchanged" (Debezium's
    ``__debezium_unavailable_value``), which keeps the stored value too."""

    key: tuple[str, ...]
    op_column: str
    sequence: tuple[str, ...] = ()
    delete_values: tuple[str, ...] = DELETES
    upsert_values: tuple[str, ...] = UPSERTS
    partial: bool = False
    unavailable: str | None = None
    columns: tuple[str, ...] = field(default=())  # the batch's table columns, in table order (bind)
    kinds: dict[str, pa.DataType] = field(default_factory=dict)  # their Arrow types
    types: dict[str, str] = field(default_factory=dict)  # their manifest type names

    @classmethod
    def of(
        cls,
        key: str | Sequence[str],
        op_column: str,
        sequence: str | Sequence[str] | None = None,
        delete_values: Sequence[str] | None = None,
        upsert_values: Sequence[str] | None = None,
        partial: bool = False,
        unavailable: str | None = None,
    ) -> Cdc:
        """The arguments users give (``apply_cdc``'s), checked."""
        keys, seq = _names(key), _names(sequence)
        delete_values = DELETES if delete_values is None else delete_values
        upsert_values = UPSERTS if upsert_values is None else upsert_values
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise MergeError(f"cdc: key must name the key column(s), got {key!r}")
        if not isinstance(op_column, str) or not op_column:
            raise MergeError(f"cdc: op_column must name the operation column, got {op_column!r}")
        if not all(isinstance(s, str) and s for s in seq):
            raise MergeError(f"cdc: sequence must name column(s), got {sequence!r}")
        dels = tuple(v.lower() for v in _names(delete_values))
        ups = tuple(v.lower() for v in _names(upsert_values) if v.lower() not in dels)
        if not dels:
            raise MergeError("cdc: delete_values is empty")
        if unavailable is not None and not isinstance(unavailable, str):
            raise MergeError(f"cdc: unavailable must be a text, got {unavailable!r}")
        return cls(keys, op_column, seq, dels, ups, bool(partial), unavailable)

    # ------------------------------------------------------------ binding to a table

    def bind(self, where: str, target: Schema, batch: pa.Schema) -> Cdc:
        """This CDC read against the table's ``schema`` (after any schema
        evolution) and the ``batch``'s columns: names in the table's spelling,
        the batch's table columns in table order. MergeError, naming the
        column, for what cannot run."""
        schema = target.to_arrow()
        table = {f.name.lower(): f for f in schema}
        have = {n.lower(): n for n in batch.names}

        def column(name: str, what: str, stored: bool) -> str:
            if name.lower() not in have:
                got = ", ".join(batch.names)
                raise MergeError(f"{where}: {what} column {name!r} is missing from the batch ({got})")
            if stored and name.lower() not in table:
                extra = (
                    "; a row keeps the sequence of its last change, so that later batches are ordered against it: "
                    "add the column, or apply with merge_schema=True"
                    if what == "sequence"
                    else ""
                )
                raise MergeError(f"{where}: {what} column {name!r} is not a column of the table{extra}")
            return table[name.lower()].name if stored else have[name.lower()]

        key = tuple(column(k, "key", True) for k in self.key)
        seq = tuple(column(s, "sequence", True) for s in self.sequence)
        op = column(self.op_column, "operation", False)
        if op.lower() in table:
            raise MergeError(f"{where}: the operation column {op!r} is a column of the table; name another")
        if not (pa.types.is_string(batch.field(op).type) or pa.types.is_large_string(batch.field(op).type)):
            raise MergeError(f"{where}: the operation column {op!r} must hold text, it is {batch.field(op).type}")
        clash = {k.lower() for k in key} & {s.lower() for s in seq}
        if clash:
            raise MergeError(f"{where}: column {sorted(clash)[0]!r} is both a key and a sequence column")
        cols = tuple(f.name for f in schema if f.name.lower() in have)
        if not self.partial:
            missing = [f.name for f in schema if f.name.lower() not in have]
            if missing:
                raise MergeError(
                    f"{where}: table column {missing[0]!r} is missing from the batch "
                    "(partial=True keeps the stored value of columns a change leaves out)"
                )
        kinds = {c: schema.field(c).type for c in cols}
        types = {c: target.column(c).type for c in cols}
        return Cdc(
            key, op, seq, self.delete_values, self.upsert_values, self.partial, self.unavailable, cols, kinds, types
        )

    @property
    def content(self) -> tuple[str, ...]:
        """The columns that break a tie between two upserts of one sequence."""
        skip = {c.lower() for c in (*self.key, *self.sequence)}
        return tuple(c for c in self.columns if c.lower() not in skip)

    def _placeholder(self, column: str) -> bool:
        t = self.kinds.get(column)
        return self.unavailable is not None and t is not None and (pa.types.is_string(t) or pa.types.is_binary(t))

    def _ph(self, column: str, d: Dialect) -> str:
        t = self.kinds[column]
        return d.blob(self.unavailable or "") if pa.types.is_binary(t) else _text(self.unavailable or "")

    # ------------------------------------------------------------ the SQL

    def is_delete(self, d: Dialect, alias: str | None = None) -> str:
        col = d.q(self.op_column) if alias is None else f"{d.q(alias)}.{d.q(self.op_column)}"
        return f"lower({col}) IN ({', '.join(map(_text, self.delete_values))})"

    def problems_sql(self, source: str, d: Dialect, nan_columns: Sequence[str] = ()) -> str:
        """At most one row: the first change that cannot be applied
        (``problem``, ``op``, ``k``: the key as text), for :meth:`refusal`."""
        q = d.q
        op = q(self.op_column)
        known = ", ".join(map(_text, (*self.delete_values, *self.upsert_values)))
        whens = [f"WHEN {q(k)} IS NULL THEN 'null key:{k}'" for k in self.key]
        whens += [f"WHEN {op} IS NULL THEN 'null op'", f"WHEN lower({op}) NOT IN ({known}) THEN 'op'"]
        whens += [f"WHEN {q(s)} IS NULL THEN 'null sequence:{s}'" for s in self.sequence]
        whens += [f"WHEN isnan({q(c)}) THEN 'nan:{c}'" for c in nan_columns]
        problem = f"CASE {' '.join(whens)} ELSE NULL END"
        key = " || ', ' || ".join(f"COALESCE(CAST({q(k)} AS STRING), 'NULL')" for k in self.key)
        return (
            f"SELECT {problem} AS problem, CAST({op} AS STRING) AS op, {key} AS k FROM {source} "
            f"WHERE {problem} IS NOT NULL LIMIT 1"
        )

    def refusal(self, where: str, row: dict[str, Any]) -> MergeError:
        """The one-line error for a row of :meth:`problems_sql`."""
        problem, op, k = row["problem"], row["op"], row["k"]
        at = f"the change of key ({', '.join(self.key)}) = ({k})"
        if problem.startswith("null key:"):
            msg = f"key column {problem.split(':', 1)[1]!r} is NULL in a change"
        elif problem == "null op":
            msg = f"the operation column {self.op_column!r} is NULL in {at}"
        elif problem == "op":
            msg = (
                f"the operation column {self.op_column!r} holds {op!r} in {at}, which is neither an upsert "
                f"({', '.join(self.upsert_values)}) nor a delete ({', '.join(self.delete_values)})"
            )
        elif problem.startswith("null sequence:"):
            msg = f"sequence column {problem.split(':', 1)[1]!r} is NULL in {at}: every change needs its sequence"
        else:
            msg = f"column {problem.split(':', 1)[1]!r} is NaN in {at}: NaN orders nothing"
        return MergeError(f"{where}: {msg}; nothing was committed")

    def _order(self, d: Dialect, descending: bool) -> str:
        """A key's changes from lowest rank to highest (or the reverse)."""
        way, nulls = ("DESC", "NULLS LAST") if descending else ("ASC", "NULLS FIRST")
        parts = [f"{d.q(s)} {way}" for s in self.sequence] + [f"{d.q(_DEL)} {way}"]
        parts += [f"{d.q(c)} {way} {nulls}" for c in self.content]
        return ", ".join(parts)

    def typed_sql(self, source: str, columns: Sequence[str], d: Dialect) -> str:
        """``source`` with its table columns in the table's types (they fit:
        the pipeline checked the type rule), so changes compare with rows."""
        q = d.q
        typed = {c.lower(): c for c in self.columns}
        out = [
            f"CAST({q(c)} AS {d.sql_type(self.types[typed[c.lower()]])}) AS {q(c)}"
            if c.lower() in typed and d.sql_type is not None
            else q(c)
            for c in columns
        ]
        return f"SELECT {', '.join(out)} FROM {source}"

    def latest_sql(self, source: str, columns: Sequence[str], d: Dialect) -> str:
        """The batch with one change per key, its highest-ranked; with
        ``unavailable``, a placeholder value takes the key's last real value
        in the batch before it (a change that left the column as it was)."""
        q = d.q
        part = ", ".join(q(k) for k in self.key)
        folds = [c for c in self.content if self._placeholder(c)]
        extra = [
            f"{d.last_value(f'CASE WHEN {q(c)} = {self._ph(c, d)} THEN NULL ELSE {d.boxed(q(c))} END')} OVER "
            f"(PARTITION BY {part} ORDER BY {self._order(d, False)} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
            f" AS {q(f'_castsql_fold{i}')}"
            for i, c in enumerate(folds)
        ]
        fold_of = {c: f"_castsql_fold{i}" for i, c in enumerate(folds)}
        out = [
            f"CASE WHEN {q(fold_of[c])} IS NULL THEN {q(c)} ELSE {q(fold_of[c])}.v END AS {q(c)}"
            if c in fold_of
            else q(c)
            for c in columns
        ]
        ranked = (
            f"SELECT *, {', '.join([*extra, ''])}row_number() OVER (PARTITION BY {part} ORDER BY "
            f"{self._order(d, True)}) AS {q(_RN)} FROM (SELECT *, CASE WHEN {self.is_delete(d)} THEN 1 ELSE 0 END "
            f"AS {q(_DEL)} FROM {source}) AS {q('_castsql_c')}"
        )
        return f"SELECT {', '.join(out)} FROM ({ranked}) AS {q('_castsql_r')} WHERE {q(_RN)} = 1"

    def _newer(self, d: Dialect, s: str, t: str, nullable: bool) -> str:
        """``s``'s sequence above ``t``'s, column by column (a NULL of ``t``'s lowest)."""
        q = d.q
        out = "FALSE"
        for col in reversed(self.sequence):
            a, b = f"{q(s)}.{q(col)}", f"{q(t)}.{q(col)}"
            low = f"{b} IS NULL OR " if nullable else ""
            out = f"({low}{a} > {b} OR ({a} = {b} AND {out}))"
        return out

    def fresh_sql(self, latest: str, markers: str | None, columns: Sequence[str], d: Dialect) -> str:
        """``latest``'s changes that outrank the key's delete markers (a
        marker outranks an upsert of its sequence, and equals a delete)."""
        q = d.q
        cols = ", ".join(f"{q('s')}.{q(c)}" for c in columns)
        if markers is None:
            return f"SELECT {cols} FROM {latest} AS {q('s')}"
        on = " AND ".join(f"{q('m')}.{q(k)} = {q('s')}.{q(k)}" for k in self.key)
        return (
            f"SELECT {cols} FROM {latest} AS {q('s')} ANTI JOIN {markers} AS {q('m')} "
            f"ON {on} AND NOT {self._newer(d, 's', 'm', False)}"
        )

    def deletes_sql(self, fresh: str, d: Dialect) -> str:
        """The key and sequence of each delete in ``fresh``: the markers to keep."""
        cols = ", ".join(d.q(c) for c in (*self.key, *self.sequence))
        return f"SELECT {cols} FROM {fresh} WHERE {self.is_delete(d)}"

    def merge_spec(self, columns: Sequence[str] | None = None, dialect: str | Dialect = "duckdb") -> MergeSpec:
        """The merge applying a batch of one change per key: a delete deletes
        the row, an upsert replaces or inserts it, each only when it outranks
        the row (with a sequence)."""
        d = dialect if isinstance(dialect, Dialect) else Dialect(dialect)
        q = d.q
        s, t = "source", "target"
        is_del = self.is_delete(d, s)
        cols = list(columns) if columns is not None else list(self.columns)
        if self.sequence:
            tie = " AND ".join(f"{q(s)}.{q(c)} = {q(t)}.{q(c)}" for c in self.sequence)
            above = "FALSE"
            for c in reversed(self.content):
                a, b = f"{q(s)}.{q(c)}", f"{q(t)}.{q(c)}"
                same = f"{a} IS NOT DISTINCT FROM {b}"
                above = f"(({a} IS NOT NULL AND {b} IS NULL) OR {a} > {b} OR ({same} AND {above}))"
            wins = f"({self._newer(d, s, t, True)} OR ({tie} AND ({is_del} OR {above})))"
        else:
            wins = "TRUE"
        skip = {c.lower() for c in self.key}
        update = insert = None
        if self.partial or self.unavailable is not None:
            update = {c: self._value(c, d, keep=f"{q(t)}.{q(c)}") for c in cols if c.lower() not in skip}
            insert = {c: self._value(c, d, keep="NULL") for c in cols}
        return MergeSpec(
            on=self.key,
            clauses=(
                Clause("matched_delete", condition=f"{is_del} AND {wins}"),
                Clause("matched_update", condition=f"NOT ({is_del}) AND {wins}", set=update),
                Clause("not_matched_insert", condition=f"NOT ({is_del})", set=insert),
            ),
            source_alias=s,
            target_alias=t,
        )

    def _value(self, column: str, d: Dialect, keep: str) -> str:
        v = f"{d.q('source')}.{d.q(column)}"
        if self._placeholder(column):
            return f"CASE WHEN {v} = {self._ph(column, d)} THEN {keep} ELSE {v} END"
        return v


def debezium_defaults(
    where: str,
    format: str,
    batch: Any,
    op_column: str | None,
    sequence: str | Sequence[str] | None,
    unavailable: str | None,
    schema: pa.Schema | None,
) -> tuple[Any, str, Any, str | None]:
    """``apply_cdc``'s batch and its operation column, sequence and
    placeholder: as given for ``format="rows"``; for ``"debezium"``, the
    events read (:func:`castsql.write.debezium.read_debezium`) and what the
    envelope gives, where not given."""
    if format == "rows":
        if op_column is None:
            raise MergeError(f"{where}: op_column is needed (the column holding each change's operation)")
        return batch, op_column, sequence, unavailable
    if format != "debezium":
        raise MergeError(f"{where}: format must be 'rows' or 'debezium', got {format!r}")
    from castsql.write.debezium import OP_COLUMN, read_debezium

    read = read_debezium(batch, schema, where=where)
    seq = sequence if sequence is not None else read.sequence
    return read.table, op_column or OP_COLUMN, seq, DEBEZIUM_UNAVAILABLE if unavailable is None else unavailable


def batch_of(where: str, app_id: Any, batch_id: Any) -> tuple[str, int] | None:
    """``(app_id, batch_id)`` checked: a batch's name, as Delta's
    ``txnAppId``/``txnVersion`` (None when neither is given)."""
    if app_id is None and batch_id is None:
        return None
    if app_id is None or batch_id is None:
        raise MergeError(f"{where}: give app_id and batch_id together (a batch's name), or neither")
    if not isinstance(app_id, str) or not app_id.strip():
        raise MergeError(f"{where}: app_id must be a non-empty text, got {app_id!r}")
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise MergeError(f"{where}: batch_id must be an integer >= 0, got {batch_id!r}")
    return app_id, batch_id


def cdc_merge_spec(
    key: str | Sequence[str],
    op_column: str,
    delete_values: Sequence[str] = DELETES,
    *,
    quote: Any = None,
) -> MergeSpec:
    """The merge applying one CDC batch of one row per key, without a
    sequence (:meth:`Cdc.merge_spec`). ``quote``: a Spark backtick quoter
    makes Spark's spelling."""
    spark = quote is not None and quote("x").startswith("`")
    return Cdc.of(key, op_column, None, delete_values).merge_spec(None, "spark" if spark else "duckdb")


def latest_per_key(table: pa.Table, key: str | Sequence[str], sequence: str) -> pa.Table:
    """The last row of each key by ``sequence`` (ties: the later row of
    ``table``), in key order; pyarrow only (``castsql merge --sequence`` of a
    plain merge; a CDC batch's rule is :class:`Cdc`'s)."""
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


def apply_cdc(table: Any, batch: Any, **options: Any) -> CdcMetrics:
    """:meth:`castsql.Table.apply_cdc` (this module's first home)."""
    return table.apply_cdc(batch, **options)
