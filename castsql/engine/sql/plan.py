"""A query's plan: what its text says, read once.

:func:`parse` reads a query's text once and returns a :class:`Plan`; every
later step (the guard, the policy, the audit calls, time travel, file pruning,
the ``count(*)`` shortcut) reads the plan instead of the text:

1. the text is cut into DuckDB's tokens once (:func:`castsql.engine.sql.tokens.tokenize`);
2. on those tokens, the forms DuckDB's grammar lacks are found and *lowered*,
   in this one place: time-travel clauses (``t AS OF VERSION 3``, ``t AS OF
   VERSION ?``, ``t AS OF TIMESTAMP '…'`` and the other spellings of
   :mod:`castsql.engine.sql.rewrite`) are taken out, leaving the table's name;
   ``DESCRIBE HISTORY t`` and the audit functions (``table_history('t')``,
   ``table_changes('t', a, b)``, ``table_diff('t', a, b)``,
   ``table_row_history('t', key)``) become the name of the relation CastSQL
   makes for them;
3. the lowered text is given to DuckDB's parser once (``json_serialize_sql``):
   the statements' type (all SELECT, or None when DuckDB cannot serialize
   them: the policy then parses what runs, see :mod:`castsql.engine.barrier.policy`),
   every table reference with where it lies in the text, the comparisons that
   bound each one (:mod:`castsql.engine.sql.pushdown`) and whether the query is
   ``SELECT count(*) FROM t``.

A plan depends on the text and the catalog's table names alone, so it is
memoised by text (:class:`castsql.engine.planner.Planner`); :meth:`Plan.bind`
gives ``AS OF VERSION ?`` the value of its positional parameter.

Example::

    >>> import duckdb
    >>> p = parse("SELECT * FROM t AS OF VERSION ? a WHERE a.id > 5", {"t"}, duckdb.connect()).bind([3])
    >>> [(r.table, r.version, r.conditions) for r in p.refs], p.kinds, p.used_params
    ([('t', 3, (('id', '>', 5, 'INTEGER'),))], ('SELECT',), frozenset({0}))
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import duckdb

from castsql.engine.sql import names, rewrite
from castsql.engine.sql.pushdown import Analysis, analyze_tree, serialize
from castsql.engine.sql.quoting import ident
from castsql.engine.sql.tokens import Token, tokenize
from castsql.errors import CastSQLError


@dataclass(frozen=True)
class Reference:
    """One reference to a table of the catalog, and the version it reads.

    ``start``/``end``: the text the planner replaces to read a view instead
    (the name, and the time-travel clause after it); ``alias``: what to add
    after the view's name when the query gave the reference no alias, so
    ``t.col`` still means the table. A reference without ``version``,
    ``timestamp`` and ``param`` reads the latest version."""

    table: str  # the name, unquoted, lower-cased (the last part of a qualified one)
    start: int
    end: int
    alias: str
    has_alias: bool
    version: int | None = None
    timestamp: str | None = None
    param: int | None = None  # AS OF VERSION ?: which positional parameter (0-based) holds the version
    # the WHERE comparisons that bound its rows: (column lower-cased, op, constant, constant's kind)
    conditions: tuple[tuple[str, str, Any, str], ...] = ()

    @property
    def travels(self) -> bool:
        """Whether the reference names a version or a time (else: the latest version)."""
        return self.version is not None or self.timestamp is not None or self.param is not None


@dataclass(frozen=True)
class AuditCall:
    """``DESCRIBE HISTORY t``, ``table_history('t')``, ``table_changes('t', a[, b])``,
    ``table_diff('t', a, b)`` or ``table_row_history('t', key[, key_hi])``."""

    kind: str  # "history", "changes", "diff" or "row_history"
    table: str
    args: tuple[Any, ...]  # after the table: versions, timestamps (str) or keys
    start: int
    end: int
    label: str  # the name its result is registered under
    replacement: str  # what replaces the text from start to end


@dataclass(frozen=True)
class Plan:
    """What one query's text says; see the module's documentation."""

    sql: str
    tokens: tuple[Token, ...]
    # DuckDB's statement types, when its parser serialized the lowered text
    # (every statement a SELECT); None otherwise (EXPLAIN, DDL, COPY …, or SQL it refuses)
    kinds: tuple[str, ...] | None = None
    refs: tuple[Reference, ...] = ()
    # catalog tables read at their latest version -> how many references (None: unknown, no parse tree)
    reads: Mapping[str, int | None] = field(default_factory=dict)
    audits: tuple[AuditCall, ...] = ()
    count_star: tuple[int, str] | None = None  # SELECT count(*) FROM t: (index in refs, output column)
    show_tables: bool = False
    used_params: frozenset[int] = frozenset()
    error: CastSQLError | None = None  # a malformed time-travel clause or audit call, raised by bind

    def bind(self, params: Sequence[Any] | None) -> Plan:
        """The plan with ``AS OF VERSION ?`` read from ``params``; ``used_params``
        says which ones (the statement DuckDB runs no longer holds them)."""
        if self.error is not None:
            raise type(self.error)(str(self.error))
        if not any(r.param is not None for r in self.refs):
            return self
        refs, used = [], set()
        for r in self.refs:
            if (param := r.param) is not None:
                r = replace(r, version=_version_param(params, param, r.table))
                used.add(param)
            refs.append(r)
        return replace(self, refs=tuple(refs), used_params=frozenset(used))


def _explained_start(toks: Sequence[Token]) -> int:
    """Where the statement after ``EXPLAIN [ANALYZE]`` or ``EXPLAIN (options)``
    starts in the text (0 without one): that statement is analysed, so they
    show the plan it would run."""
    skip = 0
    while skip < len(toks) and toks[skip].word in ("EXPLAIN", "ANALYZE"):
        skip += 1
    if 0 < skip < len(toks) and toks[skip].text == "(":
        depth = 0
        for k in range(skip, len(toks)):
            depth += toks[k].text.count("(") - toks[k].text.count(")")
            if depth == 0:
                skip = k + 1
                break
    return toks[skip].start if 0 < skip < len(toks) else 0


def parse(sql: str, catalog: Collection[str], con: duckdb.DuckDBPyConnection) -> Plan:
    """The plan of ``sql``: tokenized once, parsed by DuckDB once.

    ``catalog``: the tables' names, lower-cased (a table may be called like a
    keyword, ``data``); ``con``: the connection whose parser reads the text."""
    toks = tuple(tokenize(sql))
    if [t.word for t in toks if t.text != ";"] == ["SHOW", "TABLES"]:
        return Plan(sql, toks, kinds=("SELECT",), show_tables=True)
    try:
        audits = _audit_calls(sql, toks)
        clauses = rewrite.find(toks, catalog)
    except CastSQLError as e:
        return Plan(sql, toks, error=e)
    in_audit = [(a.start, a.end) for a in audits]
    clauses = [c for c in clauses if not any(s <= toks[c.first].start < e for s, e in in_audit)]

    # Lowered: time-travel clauses out (the name stays), audit calls named by their results.
    edits = [(toks[c.last].end, toks[c.end - 1].end, "") for c in clauses]
    edits += [(a.start, a.end, a.replacement) for a in audits]
    lowered, to_original = _splice(sql, edits)

    offset = _explained_start(toks)  # no edit lies before it
    tree = serialize(con, lowered[offset:])  # DuckDB's parser: once per text
    analysis = analyze_tree(tree) if tree is not None else None

    travel = {toks[c.first].start: c for c in clauses}
    found: dict[int, Reference] = {}  # start -> reference
    reads: dict[str, int | None] = {}
    if analysis is not None:
        at = _locator(lowered, offset, to_original)
        by_start = {t.start: t for t in toks}
        for b in analysis.bases:
            pos = at(b.location)
            c = travel.get(pos)
            if c is not None:
                found[pos] = _travel_ref(c, toks, tuple(b.conditions))
                continue
            if b.name not in catalog:
                continue
            reads[b.name] = (reads.get(b.name) or 0) + 1
            tok = by_start.get(pos)
            if tok is not None and tok.is_name and tok.name == b.name:
                conditions = tuple(b.conditions)
                found[pos] = Reference(
                    b.name, tok.start, tok.end, f" AS {tok.text}", b.has_alias, conditions=conditions
                )
    else:
        # No tree: every name of the catalog outside a time-travel clause or an
        # audit call is read at its latest version.
        spans = [c.span(toks) for c in clauses] + in_audit
        for t in toks:
            if t.is_name and t.name in catalog and not any(s <= t.start < e for s, e in spans):
                reads[t.name] = None
    for pos, c in travel.items():
        if pos not in found:
            found[pos] = _travel_ref(c, toks, ())
    refs = tuple(found[k] for k in sorted(found))
    return Plan(
        sql,
        toks,
        kinds=("SELECT",) * analysis.statements if analysis is not None and not offset else None,
        refs=refs,
        reads=reads,
        audits=tuple(audits),
        count_star=_count_star(analysis, refs, lowered, offset, to_original) if not offset else None,
    )


def splice(sql: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """``sql`` with each (start, end) replaced by its text (spans do not overlap)."""
    return _splice(sql, edits)[0]


def _splice(sql: str, edits: Sequence[tuple[int, int, str]]):
    """``splice``, and a map from offsets in the new text back to ``sql``
    (for the text that no edit replaced)."""
    out, pos, new_at, old_at = [], 0, [], []
    length = 0
    for start, end, text in sorted(edits):
        out.append(sql[pos:start])
        new_at.append(length)
        old_at.append(pos)
        length += start - pos
        out.append(text)
        length += len(text)
        pos = end
    out.append(sql[pos:])
    new_at.append(length)
    old_at.append(pos)

    def to_original(i: int) -> int:
        k = bisect.bisect_right(new_at, i) - 1
        return old_at[k] + (i - new_at[k]) if k >= 0 else i

    return "".join(out), to_original


def _locator(lowered: str, offset: int, to_original):
    """Byte offset in ``lowered[offset:]`` (DuckDB's query_location) -> offset in the original text."""
    if lowered.isascii():
        return lambda loc: to_original(offset + loc)
    index, b = {}, 0
    for ci, ch in enumerate(lowered[offset:]):
        index[b] = ci
        b += len(ch.encode("utf-8", "surrogatepass"))

    def at(loc: int) -> int:
        ci = index.get(loc)
        return -1 if ci is None else to_original(offset + ci)

    return at


def _travel_ref(c: rewrite.Clause, toks: Sequence[Token], conditions: tuple) -> Reference:
    start, end = c.span(toks)
    r = c.ref
    return Reference(
        r.name[-1].lower(), start, end, c.alias(), c.has_alias, r.version, r.timestamp, r.param, conditions
    )


def _count_star(analysis: Analysis | None, refs: tuple[Reference, ...], lowered: str, offset: int, to_original):
    if analysis is None or analysis.count_star is None or len(analysis.bases) != 1:
        return None
    pos = _locator(lowered, offset, to_original)(analysis.bases[0].location)
    for i, r in enumerate(refs):
        if r.start == pos:
            return i, analysis.count_star[1]
    return None


def _version_param(params: Sequence[Any] | None, index: int, table: str) -> int:
    """The version ``AS OF VERSION ?`` reads: positional parameter ``index``."""
    if params is None or isinstance(params, (str, Mapping)) or index >= len(params):
        raise CastSQLError(f"table {table}: AS OF VERSION ? needs a value: pass it in params (session.sql(query, [3]))")
    value = params[index]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CastSQLError(f"table {table}: AS OF VERSION ? needs a version number, got {value!r}")
    return value


# ---------------------------------------------------------------- audit calls


def _table_arg(tok: Token) -> str:
    if tok.kind == "string_const":
        return tok.text[1:-1].replace("''", "'")
    if tok.kind == "identifier":
        return tok.text.strip('"')
    raise CastSQLError(f"expected a table name at {tok.text!r}")


_AUDITS = {
    "TABLE_HISTORY": ("history", "one argument: table_history('t')", (1,)),
    "TABLE_CHANGES": (
        "changes",
        "a table and one or two versions or timestamps: table_changes('t', 2, 5)",
        (2, 3),
    ),
    "TABLE_DIFF": ("diff", "a table and two versions or timestamps: table_diff('t', 2, 5)", (3,)),
    "TABLE_ROW_HISTORY": (
        "row_history",
        "a table and a primary key value, or two for a range: table_row_history('t', 42)",
        (2, 3),
    ),
}


def _audit_arg(toks: list[Token], fn: str, usage: str) -> Any:
    """A constant argument of an audit call: a number (an optional sign) or a string."""
    sign = ""
    if len(toks) == 2 and toks[0].text in ("-", "+"):
        sign, toks = toks[0].text, toks[1:]
    if len(toks) == 1 and toks[0].kind == "numeric_const":
        text = sign + toks[0].text
        try:
            return int(text)
        except ValueError:
            return Decimal(text)
    if len(toks) == 1 and toks[0].kind == "string_const" and not sign:
        return toks[0].text[1:-1].replace("''", "'")
    raise CastSQLError(f"{fn} takes {usage}")


def _audit_calls(sql: str, toks: Sequence[Token]) -> list[AuditCall]:
    """``DESCRIBE HISTORY t`` (a whole statement), ``table_history('t')`` and
    ``table_changes('t', a[, b])``, with what replaces each."""
    if len(toks) >= 3 and toks[0].word == "DESCRIBE" and toks[1].word == "HISTORY":
        name = _table_arg(toks[2])
        label = names.internal("history", owner=name)
        return [AuditCall("history", name, (), toks[0].start, toks[2].end, label, f"SELECT * FROM {ident(label)}")]
    out: list[AuditCall] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.word in _AUDITS and i + 1 < len(toks) and toks[i + 1].text == "(":
            j = i + 2
            args: list[list[Token]] = [[]]
            while j < len(toks) and toks[j].text != ")":
                if toks[j].text == ",":
                    args.append([])
                else:
                    args[-1].append(toks[j])
                j += 1
            if j >= len(toks):
                raise CastSQLError(f"{t.text}( is not closed")
            kind, usage, counts = _AUDITS[t.word]
            if args == [[]]:
                args = []
            if len(args) not in counts or any(not a for a in args):
                raise CastSQLError(f"{t.text.lower()} takes {usage}")
            name = _table_arg(args[0][0]) if len(args[0]) == 1 else ""
            values = tuple(_audit_arg(a, t.text.lower(), usage) for a in args[1:])
            if kind in ("changes", "diff") and any(isinstance(v, (float, Decimal)) for v in values):
                raise CastSQLError(f"{t.text.lower()} takes {usage}")
            label = names.internal(kind, len(out), owner=name)
            out.append(AuditCall(kind, name, values, t.start, toks[j].end, label, ident(label)))
            i = j + 1
            continue
        i += 1
    return out
