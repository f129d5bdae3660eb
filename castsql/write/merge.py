"""Merge (Delta Lake's ``MERGE INTO``) as one SQL text both engines run, and
the builder users call.

A merge joins the table (alias ``target``) with a source (alias ``source``)
on key columns or a predicate and, for each row pair and each unmatched row,
takes the FIRST clause, in the order given, whose condition holds:

- a target row matched by a source row: ``when_matched_update`` (set the
  given columns, keep the others; ``_all``: every column from the source by
  name) or ``when_matched_delete``;
- a source row no target row matches: ``when_not_matched_insert``;
- a target row no source row matches: ``when_not_matched_by_source_update`` /
  ``_delete``.

No clause holding means the row is left as it is. A target row matched by
more than one source row where a matched clause updates or deletes it is an
error (Delta's ``DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE``:
which source row wins would be arbitrary); nothing is written. Delta's one
exception holds too: when the only matched clause is an unconditional
delete, several matches delete the row once.

The engines run :func:`actions_sql` (plain SQL that DuckDB and Spark both
take), tombstone every updated or deleted target row and append the updated
and inserted rows, all in one version (:mod:`castsql.write.commit`).

Example::

    >>> spec = MergeSpec(on=("id",), clauses=(Clause("matched_update"), Clause("not_matched_insert")))
    >>> sql = actions_sql(spec, "t", "s", ["id", "v"], quote=lambda n: '"' + n + '"')
    >>> "RIGHT OUTER JOIN" in sql
    True
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from castsql.errors import MergeError, WriteError
from castsql.format.schema import castsql_own
from castsql.write.records import FILE_COL, POS_COL, RG_COL

ACTION_COL = "_castsql_action"
MATCHES_COL = "_castsql_matches"
OLD_KEY_COL = "_castsql_old_key"  # the primary key a changed target row had
ACTION_NONE, ACTION_UPDATE, ACTION_DELETE, ACTION_INSERT = 0, 1, 2, 3

KINDS = (
    "matched_update",
    "matched_delete",
    "not_matched_insert",
    "not_matched_by_source_update",
    "not_matched_by_source_delete",
)
_ACTION = {
    "matched_update": ACTION_UPDATE,
    "matched_delete": ACTION_DELETE,
    "not_matched_insert": ACTION_INSERT,
    "not_matched_by_source_update": ACTION_UPDATE,
    "not_matched_by_source_delete": ACTION_DELETE,
}
_TP, _SP = "__castsql_tp", "__castsql_sp"  # presence markers of a target and a source row


@dataclass(frozen=True)
class Clause:
    """One ``WHEN`` of a merge. ``set``: target column -> SQL expression over
    the aliases ``target`` and ``source``; None means every column from the
    source by name (``update_all`` / ``insert_all``)."""

    kind: str
    condition: str | None = None
    set: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown merge clause {self.kind!r} (one of {', '.join(KINDS)})")

    @property
    def action(self) -> int:
        return _ACTION[self.kind]

    @property
    def matched(self) -> str:
        """``matched``, ``not_matched`` or ``not_matched_by_source``."""
        return self.kind.rsplit("_", 1)[0]


@dataclass(frozen=True)
class MergeSpec:
    """What a merge does: ``on`` is a tuple of key column names (equal in the
    table and the source) or a SQL predicate over the two aliases;
    ``clauses`` in order, first match wins."""

    on: tuple[str, ...] | str
    clauses: tuple[Clause, ...]
    source_alias: str = "source"
    target_alias: str = "target"
    # What an engine may read cheaply (a CDC batch's, castsql.write.cdc): the
    # conditions compare the target's ``order`` columns (read them with the
    # keys) and look at the ``tiebreak`` columns only for target rows whose
    # ``order`` equals the source's (elsewhere they may be left NULL).
    order: tuple[str, ...] = ()
    tiebreak: tuple[str, ...] = ()
    # The clauses that do the same where no matched target row equals its
    # source row in ``order`` (their conditions drop the tie-breaking terms,
    # which cost DuckDB two thirds of a CDC batch's merge query).
    untied: tuple[Clause, ...] | None = None

    @property
    def keys(self) -> tuple[str, ...] | None:
        return self.on if isinstance(self.on, tuple) else None

    def of(self, group: str) -> list[Clause]:
        return [c for c in self.clauses if c.matched == group]

    @property
    def multiple_matches_allowed(self) -> bool:
        """Delta's exception (``isOnlyOneUnconditionalDelete``): several source
        rows may match a target row when the merge's only matched clause is an
        unconditional delete (the row is deleted once). A conditional delete
        among them is an error as any other matched clause: which source row's
        condition decides would be arbitrary.

        >>> MergeSpec(("id",), (Clause("matched_delete"),)).multiple_matches_allowed
        True
        >>> MergeSpec(("id",), (Clause("matched_delete", condition="source.v > 5"),)).multiple_matches_allowed
        False
        """
        matched = self.of("matched")
        return all(c.kind == "matched_delete" and c.condition is None for c in matched) and len(matched) <= 1

    def texts(self) -> list[str]:
        """Every piece of user SQL the merge runs: the ``on`` predicate, the
        clauses' conditions and their ``set`` expressions."""
        texts = [c.condition for c in self.clauses if c.condition]
        texts += [e for c in self.clauses if c.set for e in c.set.values()]
        if isinstance(self.on, str):
            texts.append(self.on)
        return texts

    def target_columns_used(self, columns: Sequence[str]) -> list[str]:
        """The target columns the merge reads besides row identity: keys, every
        column a condition or expression may name (a conservative guess from
        the text) and the columns an update keeps. An engine reads only these,
        and only for matched rows, when no clause concerns unmatched target rows."""
        text = "\n".join(self.texts())
        used = set(self.keys or ())
        for col in columns:
            quoted = ('"' + col.replace('"', '""') + '"', "`" + col.replace("`", "``") + "`")  # DuckDB's, Spark's
            if re.search(rf"(?<![\w$]){re.escape(col)}(?![\w$])", text, re.I) or any(
                q.lower() in text.lower() for q in quoted
            ):
                used.add(col)
        for c in self.clauses:
            if c.action == ACTION_UPDATE and c.set is not None:
                used.update(col for col in columns if col not in c.set)
        return [c for c in columns if c in used]


@dataclass
class MergeMetrics:
    """What a merge did (the names are ``deltalake``'s)."""

    num_source_rows: int = 0
    num_target_rows_inserted: int = 0
    num_target_rows_updated: int = 0
    num_target_rows_deleted: int = 0
    num_target_rows_copied: int = 0  # never: no data file is rewritten
    num_output_rows: int = 0
    num_target_files_added: int = 0
    num_target_files_removed: int = 0  # never
    num_tombstones_added: int = 0
    bytes_written: int = 0
    execution_time_ms: int = 0
    version: int | None = None  # the version committed; None when nothing changed
    attempts: int = 1  # plans made (more than one when a concurrent commit conflicted)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------- validation


def validate(spec: MergeSpec, table: str, columns: Sequence[str], source_columns: Sequence[str] | None = None) -> None:
    """Refuse, in one line naming the table and the column, what cannot run:
    no clause, unknown columns in ``on`` or ``set``, key columns or (for
    ``_all`` clauses) table columns the source lacks, a by-source update
    without ``set``. Expressions themselves are checked by the engine's SQL
    binder (before anything is written)."""
    where = f"table {table}: merge"
    if not spec.clauses:
        raise MergeError(f"{where}: no clause; add when_matched_update_all() / when_not_matched_insert_all() …")
    if spec.source_alias.lower() == spec.target_alias.lower():
        raise MergeError(f"{where}: the source and the target need different aliases, both are {spec.source_alias!r}")
    src = {c.lower(): c for c in source_columns} if source_columns is not None else None
    for s in source_columns or ():
        if castsql_own(s):  # the merge's own columns (FORMAT.md §3.1): one would hide one
            raise MergeError(f"{where}: the source's column {s!r} has a reserved name (_castsql_…); rename it")
    _check_on(spec, where, columns, src)
    for c in spec.clauses:
        _check_clause(c, spec, where, columns, src)


def _check_on(spec: MergeSpec, where: str, columns: Sequence[str], src: dict[str, str] | None) -> None:
    """The ``on`` predicate is text, or key columns both the table and the source hold."""
    cols = {c.lower() for c in columns}
    if isinstance(spec.on, str):
        if not spec.on.strip():
            raise MergeError(f"{where}: the 'on' predicate is empty")
        return
    if not spec.on:
        raise MergeError(f"{where}: 'on' names no key column")
    for k in spec.on:
        if k.lower() not in cols:
            raise MergeError(f"{where}: key column {k!r} is not a column of the table ({', '.join(columns)})")
        if src is not None and k.lower() not in src:
            raise MergeError(f"{where}: key column {k!r} is missing from the source ({', '.join(src.values())})")


def _check_clause(c: Clause, spec: MergeSpec, where: str, columns: Sequence[str], src: dict[str, str] | None) -> None:
    """One clause runs as asked: an ``_all`` clause finds every column in the
    source, a ``set`` names table columns with SQL text and leaves the keys alone."""
    if c.set is None:
        if c.matched == "not_matched_by_source" and c.action == ACTION_UPDATE:
            raise MergeError(f"{where}: when_not_matched_by_source_update needs set= (there is no source row)")
        if c.action in (ACTION_UPDATE, ACTION_INSERT) and src is not None:
            missing = [col for col in columns if col.lower() not in src]
            if missing:
                raise MergeError(
                    f"{where}: {c.kind}_all needs every table column in the source; "
                    f"column {missing[0]!r} is missing from it"
                )
        return
    if c.action == ACTION_DELETE:
        return
    if not c.set:
        raise MergeError(f"{where}: {c.kind} sets no column")
    cols = {col.lower() for col in columns}
    for name, expr in c.set.items():
        if name.lower() not in cols:
            raise MergeError(f"{where}: column {name!r} in set is not a column of the table ({', '.join(columns)})")
        if not isinstance(expr, str) or not expr.strip():
            raise MergeError(f"{where}: column {name!r}: the expression must be SQL text, got {expr!r}")
    if spec.keys and c.action == ACTION_UPDATE:
        for k in spec.keys:
            if any(n.lower() == k.lower() for n in c.set):
                raise MergeError(f"{where}: key column {k!r} cannot be updated (it decides which rows match)")


def inserts_unmatched(spec: MergeSpec, pk: str) -> bool:
    """Is every inserted row's primary key the key of its source row, which
    (the merge being on that key alone) matches no live row of the table?
    Then no inserted key can already be in the table: its row would have
    matched. Not so for a merge on other columns or a predicate, or an insert
    computing its key (``values={"id": "source.id + 1000"}``).

    >>> spec = MergeSpec(("id",), (Clause("not_matched_insert", set={"id": "source.id - 1000"}),))
    >>> inserts_unmatched(spec, "id"), inserts_unmatched(MergeSpec(("id",), (Clause("not_matched_insert"),)), "id")
    (False, True)
    """
    if spec.keys is None or [k.lower() for k in spec.keys] != [pk.lower()]:
        return False
    same = {pk.lower(), f"{spec.source_alias}.{pk}".lower()}
    for c in spec.of("not_matched"):
        expr = next((e for n, e in (c.set or {}).items() if n.lower() == pk.lower()), None)
        bare = expr.replace("`", "").replace('"', "").strip().lower() if expr is not None else None
        if c.set is not None and bare is not None and bare not in same:
            return False  # a computed key (a clause without one inserts NULL: refused as such)
    return True


def unstorable(table: str, what: str, column: str, want: str, got: str, expr: str | None, value: Any) -> WriteError:
    """The one refusal of a number a write computes that its column cannot
    hold unchanged (a fraction into an integer column, an overflow, lost
    digits): MergeError for a merge, WriteError for an update; both engines
    raise it (type names in the engine's spelling)."""
    text = f"the value {expr!r}" if expr else "the source's value"
    return (MergeError if what == "merge" else WriteError)(
        f"table {table}: {what}: column {column} is {want}, and {text} is {got}: {value} cannot be stored as "
        f"{want} unchanged (CAST it explicitly to convert); nothing was committed"
    )


def moves_keys(spec: MergeSpec, pk: str) -> bool:
    """Can an update of this merge give a row another primary key? An update
    that sets the key, or copies every column from a source row matched on
    anything but the key alone.

    >>> moves_keys(MergeSpec(("id",), (Clause("matched_update"),)), "id")
    False
    >>> moves_keys(MergeSpec("target.id = source.id", (Clause("matched_update", set={"id": "3"}),)), "id")
    True
    """
    on_key = spec.keys is not None and [k.lower() for k in spec.keys] == [pk.lower()]
    for c in spec.clauses:
        if c.action != ACTION_UPDATE:
            continue
        if c.set is None:
            if not on_key:
                return True
        elif any(n.lower() == pk.lower() for n in c.set):
            return True
    return False


# ---------------------------------------------------------------------- SQL


def actions_sql(
    spec: MergeSpec,
    target: str,
    source: str,
    columns: Sequence[str],
    quote: Callable[[str], str],
    old_key: str | None = None,
    keep_unchanged: bool = False,
) -> str:
    """ONE SQL query, valid in DuckDB and Spark SQL, giving what the merge does.

    ``target`` and ``source`` are relation names (already quoted as needed);
    the target relation has the table's ``columns`` plus its rows' identity
    (``_castsql_file``, ``_castsql_rg``, ``_castsql_pos``). ``quote`` quotes an
    identifier: double quotes for DuckDB, backticks for Spark.

    One row per row the merge changes: the target row's identity (NULL for
    inserts), ``_castsql_action`` (1 update, 2 delete, 3 insert), chosen by the
    first clause whose condition holds, ``_castsql_matches`` (source rows
    matching that target row; over 1 is an error unless
    :attr:`MergeSpec.multiple_matches_allowed`) and the table's columns as the
    new row has them (NULL for a delete). Unchanged rows are left out. With
    ``old_key`` (the primary key, a column of the target relation), also
    ``_castsql_old_key``: the key the target row had, which an update may change.
    ``keep_unchanged``: rows no clause changes are kept too (action 0), so a
    caller can count the source rows that changed nothing.
    """
    q = quote
    t, s = q(spec.target_alias), q(spec.source_alias)
    groups = {g: spec.of(g) for g in ("matched", "not_matched", "not_matched_by_source")}
    if groups["not_matched"] and groups["not_matched_by_source"]:
        join = "FULL OUTER JOIN"
    elif groups["not_matched"]:
        join = "RIGHT OUTER JOIN"
    elif groups["not_matched_by_source"]:
        join = "LEFT OUTER JOIN"
    else:
        join = "INNER JOIN"
    keys = spec.keys
    on = " AND ".join(f"{t}.{q(k)} = {s}.{q(k)}" for k in keys) if keys is not None else f"({spec.on}\n)"
    both = f"{t}.{q(_TP)} IS NOT NULL AND {s}.{q(_SP)} IS NOT NULL"
    only_source = f"{t}.{q(_TP)} IS NULL"
    only_target = f"{s}.{q(_SP)} IS NULL"

    def cond(c: Clause) -> str:
        return "TRUE" if c.condition is None else f"({c.condition}\n)"

    def value(c: Clause, col: str) -> str:
        if c.action == ACTION_DELETE:
            return "NULL"
        if c.set is None:
            return f"{s}.{q(col)}"
        for name, expr in c.set.items():
            if name.lower() == col.lower():
                return f"({expr}\n)"
        return f"{t}.{q(col)}" if c.action == ACTION_UPDATE else "NULL"

    def by_group(pick: Callable[[Clause], str]) -> str:
        """CASE over the three kinds of row, first clause of each whose condition holds."""
        branches = []
        for test, g in ((both, "matched"), (only_source, "not_matched"), (only_target, "not_matched_by_source")):
            if not groups[g]:
                continue
            inner = " ".join(f"WHEN {cond(c)} THEN {pick(c)}" for c in groups[g])
            branches.append(f"WHEN {test} THEN CASE {inner} ELSE NULL END")
        return f"CASE {' '.join(branches)} ELSE NULL END"

    out = [
        f"{t}.{q(FILE_COL)} AS {q(FILE_COL)}",
        f"{t}.{q(RG_COL)} AS {q(RG_COL)}",
        f"{t}.{q(POS_COL)} AS {q(POS_COL)}",
        f"COALESCE({by_group(lambda c: str(c.action))}, {ACTION_NONE}) AS {q(ACTION_COL)}",
        f"CASE WHEN {both} THEN COUNT(*) OVER (PARTITION BY {t}.{q(FILE_COL)}, {t}.{q(POS_COL)}) "
        f"ELSE 0 END AS {q(MATCHES_COL)}",
    ]
    if old_key is not None:
        out.append(f"{t}.{q(old_key)} AS {q(OLD_KEY_COL)}")
    out += [f"{by_group(partial(_flip, value, col))} AS {q(col)}" for col in columns]
    inner = (
        f"SELECT {', '.join(out)} "
        f"FROM (SELECT *, TRUE AS {q(_TP)} FROM {target}) AS {t} "
        f"{join} (SELECT *, TRUE AS {q(_SP)} FROM {source}) AS {s} ON {on}"
    )
    if keep_unchanged:
        return inner
    return f"SELECT * FROM ({inner}) AS {q('_castsql_actions')} WHERE {q(ACTION_COL)} <> {ACTION_NONE}"


# ---------------------------------------------------------------------- builder

Executor = Callable[[MergeSpec, Any], MergeMetrics]


class MergeBuilder:
    """``deltalake``'s merge builder: clauses are added in order (first match
    wins) and :meth:`execute` runs them in one commit.

    Example::

        >>> metrics = (events.merge(updates, on="id")                       # doctest: +SKIP
        ...     .when_matched_update_all()
        ...     .when_not_matched_insert_all()
        ...     .execute())
        >>> metrics.num_target_rows_updated, metrics.num_target_rows_inserted   # doctest: +SKIP
        (5000, 5000)
    """

    def __init__(
        self,
        table: str,
        source: Any,
        on: str | Sequence[str],
        executor: Executor,
        *,
        source_alias: str = "source",
        target_alias: str = "target",
    ) -> None:
        self.table = table
        self.source = source
        if isinstance(on, str) and re.fullmatch(r"\s*[A-Za-z_][\w$]*(\s*,\s*[A-Za-z_][\w$]*)*\s*", on):
            keys: tuple[str, ...] | str = tuple(k.strip() for k in on.split(","))  # "id" or "id, day"
        elif isinstance(on, str):
            keys = on
        else:
            keys = tuple(on)
            if not all(isinstance(k, str) for k in keys):
                raise MergeError(f"table {table}: merge: on must be column names or a predicate, got {on!r}")
        self._on = keys
        self._aliases = (source_alias, target_alias)
        self._clauses: list[Clause] = []
        self._executor = executor

    def _add(self, kind: str, condition: str | None, set: Mapping[str, str] | None) -> MergeBuilder:
        if condition is not None and (not isinstance(condition, str) or not condition.strip()):
            raise MergeError(f"table {self.table}: merge: {kind} condition must be SQL text, got {condition!r}")
        if set is not None and not isinstance(set, Mapping):
            raise MergeError(f"table {self.table}: merge: {kind} set must be a dict of column -> SQL, got {set!r}")
        self._clauses.append(Clause(kind, condition, dict(set) if set is not None else None))
        return self

    def when_matched_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        """Matched target rows: set these columns (SQL over ``target``/``source``), keep the others."""
        return self._add("matched_update", condition, set)

    def when_matched_update_all(self, condition: str | None = None) -> MergeBuilder:
        """Matched target rows become the source row (every column by name)."""
        return self._add("matched_update", condition, None)

    def when_matched_delete(self, condition: str | None = None) -> MergeBuilder:
        """Matched target rows are deleted."""
        return self._add("matched_delete", condition, None)

    def when_not_matched_insert(self, values: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        """Unmatched source rows are inserted with these values (SQL over ``source``); other columns NULL."""
        return self._add("not_matched_insert", condition, values)

    def when_not_matched_insert_all(self, condition: str | None = None) -> MergeBuilder:
        """Unmatched source rows are inserted as they are (every table column by name)."""
        return self._add("not_matched_insert", condition, None)

    def when_not_matched_by_source_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        """Target rows no source row matches: set these columns (SQL over ``target``)."""
        return self._add("not_matched_by_source_update", condition, set)

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> MergeBuilder:
        """Target rows no source row matches are deleted."""
        return self._add("not_matched_by_source_delete", condition, None)

    def add(self, clause: Clause) -> MergeBuilder:
        """Add a prepared clause (e.g. those of :func:`castsql.write.cdc.cdc_merge_spec`)."""
        return self._add(clause.kind, clause.condition, clause.set)

    def spec(self) -> MergeSpec:
        source_alias, target_alias = self._aliases
        return MergeSpec(self._on, tuple(self._clauses), source_alias, target_alias)

    def execute(self) -> MergeMetrics:
        """Run the merge: one version, or nothing when no row changes."""
        started = time.perf_counter()
        metrics = self._executor(self.spec(), self.source)
        metrics.execution_time_ms = int((time.perf_counter() - started) * 1000)
        return metrics

    def __repr__(self) -> str:
        return f"<castsql.MergeBuilder {self.table} on {self._on!r}: {[c.kind for c in self._clauses]}>"


def _flip(fn: Callable[[Clause, str], str], col: str, c: Clause) -> str:
    """``fn(c, col)``: one column's value picker, bound to the column."""
    return fn(c, col)
