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

Both engines run the same code, through the one write pipeline
(:func:`castsql.write.pipeline.apply_cdc`): the rule within a batch is
Arrow (:func:`check`, :func:`prepare`, :func:`deletes`; Spark runs them on
each partition of the batch hashed by key), the rule against the table is
the merge's SQL conditions (:meth:`Cdc.merge_spec`; DuckDB and Spark SQL).

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

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import MergeError
from castsql.format.markers import key_starts, latest
from castsql.format.schema import Schema, castsql_own
from castsql.write.merge import Clause, MergeMetrics, MergeSpec

UPSERTS = ("i", "u", "c", "r", "insert", "update", "upsert")
DELETES = ("d", "delete")
DEBEZIUM_UNAVAILABLE = "__debezium_unavailable_value"  # an unchanged TOAST column, as Debezium sends it

_DEL, _MARK = "_castsql_del", "_castsql_marker"  # reserved names (FORMAT.md §3.1): no table column has them


def _text(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def _names(v: str | Sequence[str] | None) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


@dataclass(frozen=True)
class Dialect:
    """The few spellings of the merge's conditions DuckDB and Spark SQL differ in."""

    name: str  # "duckdb" or "spark"

    def q(self, n: str) -> str:
        if self.name == "spark":
            return "`" + n.replace("`", "``") + "`"
        return '"' + n.replace('"', '""') + '"'

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
        for v in (*_names(delete_values), *_names(upsert_values)):
            if not isinstance(v, str) or not v:
                raise MergeError(f"cdc: delete_values and upsert_values must be texts, got {v!r}")
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
        if len(have) != len(batch.names):
            twice = next(n for i, n in enumerate(batch.names) if n.lower() in {m.lower() for m in batch.names[:i]})
            raise MergeError(f"{where}: the batch has two columns named {twice!r} (names are matched ignoring case)")

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
        if castsql_own(op):
            raise MergeError(f"{where}: the operation column {op!r} has a reserved name (_castsql_…); rename it")
        if op.lower() in table:
            raise MergeError(f"{where}: the operation column {op!r} is a column of the table; name another")
        if not (pa.types.is_string(batch.field(op).type) or pa.types.is_large_string(batch.field(op).type)):
            raise MergeError(f"{where}: the operation column {op!r} must hold text, it is {batch.field(op).type}")
        clash = {k.lower() for k in key} & {s.lower() for s in seq}
        if clash:
            raise MergeError(f"{where}: column {sorted(clash)[0]!r} is both a key and a sequence column")
        cols = tuple(f.name for f in schema if f.name.lower() in have)
        extra = [n for n in batch.names if n.lower() not in table and n != op]
        if extra:
            raise MergeError(
                f"{where}: the batch's column {extra[0]!r} is not a column of the table (merge_schema=True adds it)"
            )
        if not self.partial:
            missing = [f.name for f in schema if f.name.lower() not in have]
            if missing:
                raise MergeError(
                    f"{where}: table column {missing[0]!r} is missing from the batch "
                    "(partial=True keeps the stored value of columns a change leaves out)"
                )
        kinds = {c: schema.field(c).type for c in cols}
        types = {c: target.column_named(c).type for c in cols}
        return Cdc(
            key, op, seq, self.delete_values, self.upsert_values, self.partial, self.unavailable, cols, kinds, types
        )

    @property
    def content(self) -> tuple[str, ...]:
        """The columns that break a tie between two upserts of one sequence."""
        skip = {c.lower() for c in (*self.key, *self.sequence)}
        return tuple(c for c in self.columns if c.lower() not in skip)

    def _placeholder(self, column: str) -> bool:
        """May ``column`` carry the "unchanged" placeholder? A text or binary
        column other than the key and the sequence (a change always names those)."""
        t = self.kinds.get(column)
        if self.unavailable is None or t is None or column in (*self.key, *self.sequence):
            return False
        return pa.types.is_string(t) or pa.types.is_binary(t)

    def _ph(self, column: str, d: Dialect) -> str:
        t = self.kinds[column]
        return d.blob(self.unavailable or "") if pa.types.is_binary(t) else _text(self.unavailable or "")

    # ------------------------------------------------------------ the SQL

    def is_delete(self, d: Dialect, alias: str | None = None) -> str:
        col = d.q(self.op_column) if alias is None else f"{d.q(alias)}.{d.q(self.op_column)}"
        return f"lower({col}) IN ({', '.join(map(_text, self.delete_values))})"

    def _newer(self, d: Dialect, s: str, t: str, nullable: bool) -> str:
        """``s``'s sequence above ``t``'s, column by column (a NULL of ``t``'s lowest)."""
        q = d.q
        out = "FALSE"
        for col in reversed(self.sequence):
            a, b = f"{q(s)}.{q(col)}", f"{q(t)}.{q(col)}"
            low = f"{b} IS NULL OR " if nullable else ""
            out = f"({low}{a} > {b} OR ({a} = {b} AND {out}))"
        return out

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
            newer = self._newer(d, s, t, True)
            wins = f"({newer} OR ({tie} AND ({is_del} OR {above})))"
        else:
            newer = wins = "TRUE"
        skip = {c.lower() for c in self.key}
        update = insert = None
        if self.partial or self.unavailable is not None:
            update = {c: self._value(c, d, keep=f"{q(t)}.{q(c)}") for c in cols if c.lower() not in skip}
            insert = {c: self._value(c, d, keep="NULL") for c in cols}

        def clauses(wins: str) -> tuple[Clause, ...]:
            return (
                Clause("matched_delete", condition=f"{is_del} AND {wins}"),
                Clause("matched_update", condition=f"NOT ({is_del}) AND {wins}", set=update),
                Clause("not_matched_insert", condition=f"NOT ({is_del})", set=insert),
            )

        return MergeSpec(
            on=self.key,
            clauses=clauses(wins),
            source_alias=s,
            target_alias=t,
            order=self.sequence,
            # A placeholder's column is read whatever the order (its update keeps the target's value).
            tiebreak=tuple(c for c in self.content if not self._placeholder(c)) if self.sequence else (),
            untied=clauses(newer) if self.sequence else None,
        )

    def _value(self, column: str, d: Dialect, keep: str) -> str:
        v = f"{d.q('source')}.{d.q(column)}"
        if self._placeholder(column):
            return f"CASE WHEN {v} = {self._ph(column, d)} THEN {keep} ELSE {v} END"
        return v


# ---------------------------------------------------------------------- the batch, in Arrow
# Both engines run these on the batch (Spark on each partition of the batch
# hashed by key, so a key's changes meet in one call): one implementation of
# the rule within a batch, whatever the engine.


@dataclass(frozen=True)
class Check:
    """A batch's rows, its changes (distinct keys, with a sequence; else
    rows) and what is wrong with a change that cannot be applied (or None)."""

    rows: int
    changes: int
    problem: str | None = None

    def __add__(self, other: Check) -> Check:
        """Two parts of a batch whose keys differ (Spark's partitions by key)."""
        return Check(self.rows + other.rows, self.changes + other.changes, self.problem or other.problem)


def _first(mask: pa.Array | pa.ChunkedArray) -> int | None:
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks()  # indices_nonzero of a ChunkedArray of no chunks crashes pyarrow 22
    if not len(mask):
        return None
    idx = pc.indices_nonzero(pc.fill_null(mask, False))
    return idx[0].as_py() if len(idx) else None


def _shown(v: Any) -> str:
    """A value as an error line shows it: one line, at most 80 characters."""
    text = str(v)
    text = repr(text)[1:-1] if any(ch in text for ch in "\r\n") else text
    return text if len(text) <= 80 else text[:77] + "..."


def _is_delete(cdc: Cdc, table: pa.Table) -> pa.ChunkedArray:
    return pc.fill_null(pc.is_in(pc.utf8_lower(table.column(cdc.op_column)), pa.array(cdc.delete_values)), False)


def check(cdc: Cdc, batch: pa.Table) -> Check:
    """Refuse what cannot be applied (a NULL key, operation or sequence, an
    unknown operation, a NaN key or sequence), counting rows and changes."""
    batch = typed(cdc, batch)
    key = [batch.column(k) for k in cdc.key]

    def at(i: int) -> str:
        shown = ", ".join("NULL" if (v := c[i].as_py()) is None else _shown(v) for c in key)
        return f"the change of key ({', '.join(cdc.key)}) = ({shown})"

    problems: list[tuple[int, str]] = []
    for k, col in zip(cdc.key, key, strict=True):
        if (i := _first(pc.is_null(col, nan_is_null=True))) is not None:
            nan = pa.types.is_floating(col.type) and col[i].is_valid
            problems.append((i, f"key column {k!r} is {'NaN' if nan else 'NULL'} in a change"))
    op = batch.column(cdc.op_column)
    if (i := _first(pc.is_null(op))) is not None:
        problems.append((i, f"the operation column {cdc.op_column!r} is NULL in {at(i)}"))
    known = pa.array([*cdc.delete_values, *cdc.upsert_values])
    if (i := _first(pc.and_(pc.is_valid(op), pc.invert(pc.is_in(pc.utf8_lower(op), known))))) is not None:
        problems.append((
            i,
            f"the operation column {cdc.op_column!r} holds {_shown(repr(op[i].as_py()))} in {at(i)}, "
            "which is neither an "
            f"upsert ({', '.join(cdc.upsert_values)}) nor a delete ({', '.join(cdc.delete_values)})",
        ))  # fmt: skip
    for name in cdc.sequence:
        col = batch.column(name)
        if (i := _first(pc.is_null(col))) is not None:
            problems.append((i, f"sequence column {name!r} is NULL in {at(i)}: every change needs its sequence"))
        elif pa.types.is_floating(col.type) and (i := _first(pc.is_nan(col))) is not None:
            problems.append((i, f"sequence column {name!r} is NaN in {at(i)}: NaN orders nothing"))
    # The first row that has a problem; its first problem in the order above.
    problem = min(problems, key=lambda p: p[0])[1] if problems else None
    changes = batch.num_rows
    if cdc.sequence and problem is None and batch.num_rows:
        changes = batch.select(list(cdc.key)).group_by(list(cdc.key)).aggregate([]).num_rows
    return Check(batch.num_rows, changes, problem)


def typed(cdc: Cdc, batch: pa.Table) -> pa.Table:
    """``batch`` with its table columns named and typed as the table's (they
    fit: the pipeline checked the type rule), so changes compare with rows."""
    spelled = {c.lower(): c for c in cdc.columns}
    cols, fields = [], []
    for f, col in zip(batch.schema, batch.columns, strict=True):
        name = spelled.get(f.name.lower())
        if name is None:
            cols.append(col)
            fields.append(f)
            continue
        want = cdc.kinds[name]
        col = col if col.type == want else col.cast(want)
        if name in cdc.key and pa.types.is_floating(want):
            col = _zero(col)
        cols.append(col)
        fields.append(pa.field(name, want))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _zero(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A float key with -0.0 as 0.0: SQL, the merge and the primary key take them as one key."""
    return pc.add(col, pa.scalar(0.0, col.type))


def _rank_order(cdc: Cdc, table: pa.Table) -> pa.Array:
    """Row indexes ordering ``table`` (typed, with ``_castsql_del``) by key,
    then by rank from lowest to highest (NULL lowest: SQL's order)."""
    keys = [(k, "ascending") for k in cdc.key] + [(s, "ascending") for s in cdc.sequence]
    keys += [(_DEL, "ascending")] + [(c, "ascending") for c in cdc.content]
    return pc.sort_indices(table, sort_keys=keys, null_placement="at_start")


def prepare(cdc: Cdc, batch: pa.Table, markers: pa.Table | None = None) -> pa.Table:
    """The changes of ``batch`` (checked, :func:`check`) to apply: typed, and
    with a sequence, the highest-ranked change of each key (a placeholder
    value taking the key's last real value before it, with ``unavailable``)
    that outranks the key's delete ``markers`` (key and sequence columns)."""
    t = typed(cdc, batch)
    if not cdc.sequence or not t.num_rows:
        return t
    t = t.append_column(_DEL, pa.array(_is_delete(cdc, t).to_numpy(zero_copy_only=False).astype(np.int8)))
    s = t.take(_rank_order(cdc, t))
    n = s.num_rows
    starts = key_starts(s, cdc.key)
    last = np.append(starts[1:], True)  # the highest-ranked change of each key
    idx = np.arange(n)
    start_of = np.maximum.accumulate(np.where(starts, idx, 0))
    for c in cdc.content:
        if not cdc._placeholder(c):
            continue
        col = s.column(c)
        assert cdc.unavailable is not None  # a placeholder column: the batch names one
        ph = pa.scalar(cdc.unavailable.encode() if pa.types.is_binary(col.type) else cdc.unavailable, col.type)
        real = pc.fill_null(pc.not_equal(col, ph), True).to_numpy(zero_copy_only=False)
        seen = np.maximum.accumulate(np.where(real, idx, -1))
        s = s.set_column(s.schema.get_field_index(c), c, col.take(pa.array(np.where(seen >= start_of, seen, idx))))
    out = s.filter(pa.array(last)).drop_columns([_DEL])
    if markers is None or not markers.num_rows or not out.num_rows:
        return out
    m = markers.cast(pa.schema([out.schema.field(c) for c in (*cdc.key, *cdc.sequence)]))
    for k in cdc.key:
        if pa.types.is_floating(m.schema.field(k).type):
            m = m.set_column(m.schema.get_field_index(k), k, _zero(m.column(k)))
    m = latest(m, cdc.key, cdc.sequence)  # the highest marker of each key
    if len(cdc.key) == 1:  # a lookup, not a join (a join's set-up costs more than a batch's rows)
        at = pc.index_in(out.column(cdc.key[0]), value_set=m.column(cdc.key[0]).combine_chunks())
        marked = {c: m.column(c).take(at) for c in cdc.sequence}
        j = out
    else:
        m = m.rename_columns([*cdc.key, *(f"{_MARK}{i}" for i in range(len(cdc.sequence)))])
        j = out.join(m, list(cdc.key), join_type="left outer")
        marked = {c: j.column(f"{_MARK}{i}") for i, c in enumerate(cdc.sequence)}
    newer = pa.scalar(False)
    for c in reversed(cdc.sequence):
        a, b = j.column(c), marked[c]
        newer = pc.or_(pc.greater(a, b), pc.and_(pc.equal(a, b), newer))
    keep = pc.or_(pc.is_null(marked[cdc.sequence[0]]), pc.fill_null(newer, False))
    return j.filter(keep).select(out.column_names)


def deletes(cdc: Cdc, changes: pa.Table) -> pa.Table:
    """The key and sequence of each delete among ``changes``: the markers a commit keeps."""
    return changes.filter(_is_delete(cdc, changes)).select([*cdc.key, *cdc.sequence])


def debezium_defaults(
    where: str,
    format: str,
    batch: Any,
    op_column: str | None,
    sequence: str | Sequence[str] | None,
    unavailable: str | None,
    schema: pa.Schema | None,
    partial: bool | None = None,
) -> tuple[Any, str, Any, str | None, bool]:
    """``apply_cdc``'s batch and its operation column, sequence, placeholder
    and partial flag: as given for ``format="rows"``; for ``"debezium"``, the
    events read (:func:`castsql.write.debezium.read_debezium`) and what the
    envelope gives, where not given (partial: yes)."""
    if format == "rows":
        if op_column is None:
            raise MergeError(f"{where}: op_column is needed (the column holding each change's operation)")
        return batch, op_column, sequence, unavailable, bool(partial)
    if format != "debezium":
        raise MergeError(f"{where}: format must be 'rows' or 'debezium', got {format!r}")
    from castsql.write.debezium import OP_COLUMN, read_debezium

    read = read_debezium(batch, schema, where=where)
    seq = sequence if sequence is not None else read.sequence
    # Partial by default: a delete's before may hold the key alone (PostgreSQL's default replica identity).
    ph = DEBEZIUM_UNAVAILABLE if unavailable is None else unavailable
    return read.table, op_column or OP_COLUMN, seq, ph, True if partial is None else partial


def batch_of(where: str, app_id: Any, batch_id: Any) -> tuple[str, int] | None:
    """``(app_id, batch_id)`` checked: a batch's name, as Delta's
    ``txnAppId``/``txnVersion`` (None when neither is given)."""
    if app_id is None and batch_id is None:
        return None
    if app_id is None or batch_id is None:
        raise MergeError(f"{where}: give app_id and batch_id together (a batch's name), or neither")
    if not isinstance(app_id, str) or not app_id.strip():
        raise MergeError(f"{where}: app_id must be a non-empty text, got {app_id!r}")
    if isinstance(batch_id, bool) or not isinstance(batch_id, numbers.Integral) or not 0 <= int(batch_id) < 2**63:
        raise MergeError(f"{where}: batch_id must be an integer >= 0, got {batch_id!r} (and below 2**63)")
    return app_id, int(batch_id)


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
