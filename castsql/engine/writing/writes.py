"""SQL that writes a table: which statement it is, and what it asks for.

A session runs ``DELETE``, ``UPDATE``, ``INSERT``, ``MERGE INTO`` (and
``TRUNCATE``) on its CastSQL tables by handing them to the write pipeline,
never to DuckDB: this module recognises such a statement on DuckDB's own
tokens (:mod:`castsql.engine.sql.tokens`) by its leading words and its target
table, and parses it into a plain description (:class:`Delete`,
:class:`Update`, :class:`Insert`, :class:`Merge`). The engine layer cannot
write; the embedded engine (:mod:`castsql.embedded.sql`) registers the
function that runs a description (:func:`register`), as
:mod:`castsql.commits` registers what follows a commit.

A statement whose target is not a CastSQL table (a temporary table, a
view of the user's own) is not recognised and runs in DuckDB as before;
every other statement that would write a table is still refused by
:mod:`castsql.engine.barrier.policy`.

Example::

    >>> parse("DELETE FROM events WHERE user_id = 42", {"events"}.__contains__)
    Delete(table='events', where='user_id = 42')
    >>> parse("UPDATE events e SET n = e.n + 1 WHERE e.id < 3", {"events"}.__contains__)
    Update(table='events', set={'n': 'n + 1'}, where='id < 3')
    >>> parse("DELETE FROM scratch", {"events"}.__contains__) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from castsql.engine.sql.rewrite import _clause, _Matcher
from castsql.engine.sql.tokens import Token, tokenize
from castsql.engine.writing import register, runner
from castsql.errors import ForbiddenStatement, SQLRewriteError

__all__ = [
    "Delete", "Insert", "Merge", "MergeClause", "Update", "WriteRefused", "Written", "parse", "register", "runner",
]  # fmt: skip


class WriteRefused(ForbiddenStatement):
    """A statement that writes a CastSQL table in a way SQL cannot (an ``AS OF``
    target, an ``UPDATE … FROM``, a write inside a transaction); nothing ran."""


@dataclass(frozen=True)
class Delete:
    """``DELETE FROM table [WHERE where]`` (``TRUNCATE table``: no ``where``)."""

    table: str
    where: str | None


@dataclass(frozen=True)
class Update:
    """``UPDATE table SET column = expression, … [WHERE where]``."""

    table: str
    set: dict[str, str]
    where: str | None


@dataclass(frozen=True)
class Insert:
    """``INSERT INTO table [BY NAME] [(columns)] source``: ``source`` is a
    query (``VALUES …``, ``SELECT …``) the session runs to Arrow."""

    table: str
    columns: tuple[str, ...] | None
    source: str
    by_name: bool = False


@dataclass(frozen=True)
class MergeClause:
    """One ``WHEN`` of a ``MERGE INTO``, in the kinds of
    :class:`castsql.write.merge.Clause`; ``set`` None: every column by name
    (``UPDATE SET *``, ``INSERT *``); ``values``: an ``INSERT VALUES (…)``
    without a column list, matched to the table's columns in order."""

    kind: str
    condition: str | None = None
    set: dict[str, str] | None = None
    values: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Merge:
    """``MERGE INTO table [AS target_alias] USING source [AS source_alias] ON on
    WHEN …``: ``source`` is what follows ``FROM`` in a query that reads it;
    ``keys``: the columns when ``on`` only equates equally named columns of
    the two sides (the merge's fast path), else None."""

    table: str
    target_alias: str
    source: str
    source_alias: str
    on: str
    keys: tuple[str, ...] | None
    clauses: tuple[MergeClause, ...] = field(default_factory=tuple)


Write = Delete | Update | Insert | Merge


@dataclass(frozen=True)
class Written:
    """What a write statement did: the rows it changed (inserted, updated,
    deleted) and the version it committed (None: no row changed, nothing
    committed)."""

    table: str
    operation: str
    count: int
    version: int | None
    detail: str | None = None  # what else the note says (a VACUUM's report)

    def result(self) -> pa.Table:
        """The statement's result as DuckDB's CLI shows a write's: one row,
        one column ``count``; the table and version ride in the schema's
        metadata (``castsql.table``, ``castsql.version``)."""
        meta = {"castsql.table": self.table, "castsql.version": "" if self.version is None else str(self.version)}
        return pa.table({"count": pa.array([self.count], pa.int64())}).replace_schema_metadata(meta)

    def note(self) -> str:
        """One line for the shell: the version committed, or that none was."""
        if self.version is None:
            if self.detail is not None:
                return f"{self.table}: {self.operation}: {self.detail}"
            return f"{self.operation}: no row changed; {self.table} keeps its version"
        what = f"{self.count} row{'s' * (self.count != 1)}" if self.detail is None else self.detail
        return f"{self.table}: version {self.version} ({self.operation}, {what})"


# ---------------------------------------------------------------- the runner


# ---------------------------------------------------------------- tokens


def _code(sql: str) -> list[Token]:
    return [t for t in tokenize(sql) if t.kind != "comment"]


def _w(t: Token | None) -> str:
    """A grammar word: an unquoted name or operator, upper-cased ('' for anything else)."""
    if t is None or t.kind in ("string_const", "numeric_const") or t.text.startswith('"'):
        return ""
    return t.text.upper()


def statements(sql: str) -> list[list[Token]]:
    """The tokens of each statement of ``sql`` (split at top-level ``;``)."""
    out: list[list[Token]] = [[]]
    for t in _code(sql):
        if t.kind == "operator" and t.text == ";":
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def _close(toks: Sequence[Token], i: int) -> int:
    """Index of the parenthesis closing the one at ``i``."""
    depth = 0
    for j in range(i, len(toks)):
        depth += toks[j].text.count("(") - toks[j].text.count(")") if toks[j].kind == "operator" else 0
        if depth <= 0:
            return j
    raise WriteRefused("a parenthesis is not closed")


def _top(toks: Sequence[Token], start: int, words: set[str], stop: int | None = None) -> int:
    """Index of the first token from ``start`` at parenthesis depth 0 whose
    word is in ``words``; ``stop`` (default: the end) if none."""
    end = len(toks) if stop is None else stop
    depth = 0
    for j in range(start, end):
        t = toks[j]
        if depth == 0 and _w(t) in words:
            return j
        if t.kind == "operator":
            depth += t.text.count("(") - t.text.count(")")
    return end


def _split_top(toks: Sequence[Token], start: int, end: int, word: str) -> list[tuple[int, int]]:
    """Ranges of ``toks[start:end]`` between top-level ``word`` tokens (``,``, ``AND``)."""
    out, depth, first = [], 0, start
    for j in range(start, end):
        t = toks[j]
        if depth == 0 and _w(t) == word:
            out.append((first, j))
            first = j + 1
        elif t.kind == "operator":
            depth += t.text.count("(") - t.text.count(")")
    out.append((first, end))
    return out


def _text(sql: str, toks: Sequence[Token], a: int, b: int, drop: set[str] | frozenset[str] = frozenset()) -> str:
    """The text of ``toks[a:b]``, without the qualifiers in ``drop``
    (``e.n`` becomes ``n`` where ``e`` is the target or its alias: the
    pipeline runs expressions over the table's own columns)."""
    if a >= b:
        return ""
    parts, pos = [], toks[a].start
    for j in range(a, b):
        t = toks[j]
        if (
            drop
            and t.is_name
            and t.name in drop
            and j + 2 < b
            and toks[j + 1].text == "."
            and (j == a or toks[j - 1].text != ".")
        ):
            parts.append(sql[pos : t.start])
            pos = toks[j + 1].end
    parts.append(sql[pos : toks[b - 1].end])
    return "".join(parts).strip()


def _unquoted(t: Token) -> str:
    """A name as written (quotes taken off, case kept): the pipeline matches columns."""
    return t.text[1:-1].replace('""', '"') if t.text.startswith('"') else t.text


def _name(toks: Sequence[Token], i: int) -> str | None:
    """The unqualified name at ``i`` (None: not a name, or a qualified one)."""
    if i >= len(toks) or not toks[i].is_name or (i + 1 < len(toks) and toks[i + 1].text == "."):
        return None
    return toks[i].name


def _no_time_travel(toks: Sequence[Token], i: int, table: str, what: str) -> None:
    try:
        found = _clause(_Matcher(toks, i)) if i < len(toks) else None
    except SQLRewriteError:
        found = (None, None)
    if found is not None:
        raise WriteRefused(
            f"{what} {table} … AS OF: a write goes to the newest version of {table}; AS OF reads an older one "
            f"(RESTORE TABLE {table} TO VERSION AS OF n brings an older version back)"
        )


_ALIAS_STOP = {"WHERE", "SET", "USING", "ON", "RETURNING", "AS", "BY", "(", "VALUES", "SELECT", "DEFAULT", "FROM"}


def _alias(toks: Sequence[Token], i: int) -> tuple[str | None, int]:
    """An optional ``[AS] alias`` at ``i``; the alias and the index after it."""
    if _w(toks[i] if i < len(toks) else None) == "AS" and i + 1 < len(toks) and toks[i + 1].is_name:
        return toks[i + 1].name, i + 2
    if i < len(toks) and toks[i].is_name and _w(toks[i]) not in _ALIAS_STOP and toks[i].kind != "keyword":
        return toks[i].name, i + 1
    return None, i


def _no_other_tables(toks: Sequence[Token], a: int, b: int, table: str, what: str, is_table: Callable) -> None:
    """Refuse a condition or expression that reads a table (``… IN (SELECT id
    FROM other)``): the pipeline evaluates it over the row alone, as
    ``Table.delete``/``update`` do; a join with another table is a MERGE."""
    for j in range(a + 1, b):
        t = toks[j]
        if _w(toks[j - 1]) in ("FROM", "JOIN") and t.is_name and is_table(t.name):
            raise WriteRefused(
                f"{what} {table}: the condition or expression reads table {t.name}; they read the row itself: "
                f"use MERGE INTO {table} USING {t.name} ON … WHEN MATCHED THEN "
                f"{'DELETE' if what.startswith('DELETE') else 'UPDATE SET …'}"
            )


def _refuse_tail(toks: Sequence[Token], start: int, table: str, what: str) -> None:
    if _top(toks, start, {"RETURNING"}) < len(toks):
        raise WriteRefused(f"{what} {table} … RETURNING is not supported: the statement returns the count of rows")


# ---------------------------------------------------------------- the statements


def parse(sql: str, is_table: Callable[[str], bool]) -> Write | None:
    """The write ``sql`` (one statement) asks of a CastSQL table, or None when
    it does not write one (it then runs as any other statement); WriteRefused
    for a write to a table SQL cannot do."""
    parts = statements(sql)
    if len(parts) != 1:
        return None
    toks = parts[0]
    head = _w(toks[0])
    if head == "DELETE" and _w(toks[1] if len(toks) > 1 else None) == "FROM":
        return _delete(sql, toks, is_table)
    if head == "TRUNCATE":
        i = 2 if _w(toks[1] if len(toks) > 1 else None) == "TABLE" else 1
        name = _name(toks, i)
        if name is not None and is_table(name) and i + 1 == len(toks):
            return Delete(name, None)
        return None
    if head == "UPDATE":
        return _update(sql, toks, is_table)
    if head == "INSERT":
        return _insert(sql, toks, is_table)
    if head == "MERGE" and _w(toks[1] if len(toks) > 1 else None) == "INTO":
        return _merge(sql, toks, is_table)
    return None


def writes_table(sql: str, is_table: Callable[[str], bool]) -> str | None:
    """The CastSQL table a statement of ``sql`` would write through the
    pipeline, when ``sql`` holds several statements (None: none does)."""
    for toks in statements(sql):
        head = _w(toks[0])
        i = {"DELETE": 2, "UPDATE": 1, "INSERT": 2, "MERGE": 2, "TRUNCATE": 1}.get(head)
        if i is None:
            continue
        if head == "INSERT" and _w(toks[1] if len(toks) > 1 else None) == "OR":
            i = 4
        if head == "TRUNCATE" and _w(toks[1] if len(toks) > 1 else None) == "TABLE":
            i = 2
        name = _name(toks, i)
        if name is not None and is_table(name):
            return name
    return None


def _delete(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> Delete | None:
    table = _name(toks, 2)
    if table is None or not is_table(table):
        return None
    _no_time_travel(toks, 3, table, "DELETE FROM")
    alias, i = _alias(toks, 3)
    if i < len(toks) and _w(toks[i]) == "USING":
        raise WriteRefused(
            f"DELETE FROM {table} USING … is not supported: use MERGE INTO {table} USING … ON … "
            "WHEN MATCHED THEN DELETE"
        )
    _refuse_tail(toks, i, table, "DELETE FROM")
    if i == len(toks):
        return Delete(table, None)
    if _w(toks[i]) != "WHERE":
        raise WriteRefused(f"DELETE FROM {table}: expected WHERE at {toks[i].text!r}")
    _no_other_tables(toks, i, len(toks), table, "DELETE FROM", is_table)
    return Delete(table, _text(sql, toks, i + 1, len(toks), {table, *([alias] if alias else [])}) or None)


def _assignments(
    sql: str, toks: Sequence[Token], a: int, b: int, drop: set[str], table: str, what: str, strip: bool = True
) -> dict[str, str]:
    """``column = expression, …``: the target's qualifier (in ``drop``) is
    taken off the columns, and with ``strip`` off the expressions too."""
    out: dict[str, str] = {}
    for x, y in _split_top(toks, a, b, ","):
        j = x
        if j + 2 < y and toks[j + 1].text == "." and toks[j].is_name and toks[j].name in drop:
            j += 2  # SET e.n = …: the target's column
        if j + 1 >= y or not toks[j].is_name or toks[j + 1].text != "=":
            shown = _text(sql, toks, x, y)
            raise WriteRefused(f"{what} {table}: expected column = expression, got {shown!r}")
        col = _unquoted(toks[j])
        if col.lower() in (c.lower() for c in out):
            raise WriteRefused(f"{what} {table}: column {col} is set twice")
        out[col] = _text(sql, toks, j + 2, y, drop if strip else set())
    return out


def _update(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> Update | None:
    table = _name(toks, 1)
    if table is None or not is_table(table):
        return None
    _no_time_travel(toks, 2, table, "UPDATE")
    alias, i = _alias(toks, 2)
    if i >= len(toks) or _w(toks[i]) != "SET":
        raise WriteRefused(f"UPDATE {table}: expected SET")
    drop = {table, *([alias] if alias else [])}
    end = _top(toks, i + 1, {"FROM", "WHERE", "RETURNING"})
    if end < len(toks) and _w(toks[end]) == "FROM":
        raise WriteRefused(
            f"UPDATE {table} … FROM is not supported: use MERGE INTO {table} USING … ON … "
            "WHEN MATCHED THEN UPDATE SET …"
        )
    _refuse_tail(toks, end, table, "UPDATE")
    _no_other_tables(toks, i, len(toks), table, "UPDATE", is_table)
    sets = _assignments(sql, toks, i + 1, end, drop, table, "UPDATE")
    where = _text(sql, toks, end + 1, len(toks), drop) if end < len(toks) else None
    return Update(table, sets, where or None)


_QUERY_START = {"SELECT", "WITH", "VALUES", "FROM", "(", "TABLE"}


def _insert(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> Insert | None:
    i = 1
    if _w(toks[i] if i < len(toks) else None) == "OR":
        name = _name(toks, 4)
        if name is not None and is_table(name):
            raise WriteRefused(
                f"INSERT OR {_w(toks[2])} INTO {name} is not supported: use MERGE INTO {name} USING … ON … "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )
        return None
    if _w(toks[i] if i < len(toks) else None) != "INTO":
        return None
    table = _name(toks, 2)
    if table is None or not is_table(table):
        return None
    _no_time_travel(toks, 3, table, "INSERT INTO")
    _, i = _alias(toks, 3)
    by_name = False
    if _w(toks[i] if i < len(toks) else None) == "BY" and i + 1 < len(toks):
        by_name = _w(toks[i + 1]) == "NAME"
        i += 2
    columns = None
    if i < len(toks) and toks[i].text == "(" and _w(toks[i + 1] if i + 1 < len(toks) else None) not in _QUERY_START:
        close = _close(toks, i)
        columns = []
        for x, y in _split_top(toks, i + 1, close, ","):
            if y != x + 1 or not toks[x].is_name:
                raise WriteRefused(f"INSERT INTO {table}: the column list must be column names")
            columns.append(_unquoted(toks[x]))
        i = close + 1
    if i >= len(toks) or _w(toks[i]) not in _QUERY_START:
        what = " ".join(t.text for t in toks[i : i + 2]) or "nothing"
        raise WriteRefused(f"INSERT INTO {table}: expected VALUES or a query, got {what}")
    conflict = _top(toks, i, {"ON", "RETURNING"})
    if conflict < len(toks) and (_w(toks[conflict]) == "RETURNING" or _w(toks[conflict + 1]) == "CONFLICT"):
        if _w(toks[conflict]) == "RETURNING":
            _refuse_tail(toks, conflict, table, "INSERT INTO")
        raise WriteRefused(
            f"INSERT INTO {table} … ON CONFLICT is not supported: use MERGE INTO {table} USING … ON … "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
    return Insert(table, tuple(columns) if columns is not None else None, _text(sql, toks, i, len(toks)), by_name)


# ---------------------------------------------------------------- MERGE INTO


def _merge(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> Merge | None:
    table = _name(toks, 2)
    if table is None or not is_table(table):
        return None
    _no_time_travel(toks, 3, table, "MERGE INTO")
    alias, i = _alias(toks, 3)
    target = alias or table
    if i >= len(toks) or _w(toks[i]) != "USING":
        raise WriteRefused(f"MERGE INTO {table}: expected USING")
    on_at = _top(toks, i + 1, {"ON"})
    if on_at >= len(toks):
        raise WriteRefused(f"MERGE INTO {table}: expected ON")
    source, source_alias = _merge_source(sql, toks, i + 1, on_at, table)
    if source_alias.lower() == target.lower():
        raise WriteRefused(
            f"MERGE INTO {table}: the source and the target need different names; give one an alias "
            f"(MERGE INTO {table} AS t USING … AS s)"
        )
    when = _top(toks, on_at + 1, {"WHEN"})
    if when >= len(toks):
        raise WriteRefused(f"MERGE INTO {table}: no WHEN clause")
    on = _text(sql, toks, on_at + 1, when)
    keys = _keys(toks, on_at + 1, when, target, source_alias)
    _refuse_tail(toks, when, table, "MERGE INTO")
    clauses = _merge_clauses(sql, toks, when, table, target, source_alias)
    return Merge(table, target, source, source_alias, on, keys, clauses)


def _merge_source(sql: str, toks: Sequence[Token], a: int, b: int, table: str) -> tuple[str, str]:
    """The source's text (what follows FROM) and its alias."""
    if a >= b:
        raise WriteRefused(f"MERGE INTO {table}: expected a source after USING")
    j = a
    default = "source"
    if toks[a].text == "(":
        j = _close(toks, a) + 1
    else:
        default = toks[a].name
        j = a + 1
        while j + 1 < b and toks[j].text == ".":
            default = toks[j + 1].name
            j += 2
        m = _Matcher(toks, j)
        try:
            if _clause(m) is not None:
                j = m.i
        except SQLRewriteError:
            pass
    alias, k = _alias(toks, j)
    if k < b and toks[k].text == "(":  # AS s(id, v): names of a VALUES list's columns
        k = _close(toks, k) + 1
    if k != b:
        raise WriteRefused(f"MERGE INTO {table}: cannot read the source at {toks[k].text!r}")
    text = _text(sql, toks, a, b)
    if alias is None:
        return f"{text} AS {_quote(default)}", default
    return text, alias


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _keys(toks: Sequence[Token], a: int, b: int, target: str, source: str) -> tuple[str, ...] | None:
    """The key columns when ``ON`` is only ``t.k = s.k`` terms joined by AND."""
    keys: list[str] = []
    sides = {target.lower(), source.lower()}
    for x, y in _split_top(toks, a, b, "AND"):
        part = list(toks[x:y])
        if len(part) != 7 or part[1].text != "." or part[3].text != "=" or part[5].text != ".":
            return None
        (lt, _, lc, _, rt, _, rc) = part
        if {lt.name, rt.name} != sides or lc.name != rc.name or not lc.is_name:
            return None
        keys.append(_unquoted(lc))
    return tuple(keys) or None


def _merge_clauses(
    sql: str, toks: Sequence[Token], start: int, table: str, target: str, source: str
) -> tuple[MergeClause, ...]:
    bounds = []
    j = start
    while j < len(toks):
        nxt = _top(toks, j + 1, {"WHEN"})
        bounds.append((j, nxt))
        j = nxt
    out: list[MergeClause] = []
    skipped: dict[str, list[str]] = {}  # per group, the conditions of DO NOTHING clauses before
    for a, b in bounds:
        clause, group = _one_clause(sql, toks, a, b, table, target, source)
        guards = skipped.setdefault(group, [])
        if clause is None:  # DO NOTHING: later clauses of its group apply where it did not
            cond = _merge_condition(sql, toks, a, b)
            if cond is None:
                guards.append("TRUE")
            else:
                guards.append(cond)
            continue
        if guards:
            if "TRUE" in guards:
                continue  # an unconditional DO NOTHING before it: it never applies
            negated = " AND ".join(f"NOT COALESCE(({g}\n), FALSE)" for g in guards)
            cond = negated if clause.condition is None else f"{negated} AND ({clause.condition}\n)"
            clause = MergeClause(clause.kind, cond, clause.set, clause.values)
        out.append(clause)
    if not out:
        raise WriteRefused(f"MERGE INTO {table}: every WHEN clause does nothing")
    return tuple(out)


def _then(toks: Sequence[Token], a: int, b: int) -> int:
    return _top(toks, a, {"THEN"}, b)


def _merge_condition(sql: str, toks: Sequence[Token], a: int, b: int) -> str | None:
    then = _then(toks, a, b)
    cond_at = _top(toks, a + 1, {"AND"}, then)
    return _text(sql, toks, cond_at + 1, then) if cond_at < then else None


def _one_clause(
    sql: str, toks: Sequence[Token], a: int, b: int, table: str, target: str, source: str
) -> tuple[MergeClause | None, str]:
    then = _then(toks, a, b)
    where = f"MERGE INTO {table}"
    if then >= b:
        raise WriteRefused(f"{where}: expected THEN in {_text(sql, toks, a, b)!r}")
    words = [_w(t) for t in toks[a + 1 : then]]
    cond_at = _top(toks, a + 1, {"AND"}, then)
    head = words[: cond_at - a - 1]
    if head == ["MATCHED"]:
        group = "matched"
    elif head in (["NOT", "MATCHED"], ["NOT", "MATCHED", "BY", "TARGET"]):
        group = "not_matched"
    elif head == ["NOT", "MATCHED", "BY", "SOURCE"]:
        group = "not_matched_by_source"
    else:
        raise WriteRefused(
            f"{where}: expected WHEN [NOT] MATCHED [BY SOURCE|TARGET], got {_text(sql, toks, a, then)!r}"
        )
    cond = _text(sql, toks, cond_at + 1, then) if cond_at < then else None
    act = [_w(t) for t in toks[then + 1 : min(then + 4, b)]]
    if act[:2] == ["DO", "NOTHING"]:
        return None, group
    if act[:1] == ["DELETE"] and then + 2 == b:
        if group == "not_matched":
            raise WriteRefused(f"{where}: WHEN NOT MATCHED cannot DELETE (there is no target row)")
        return MergeClause(f"{group}_delete", cond), group
    if act[:1] == ["UPDATE"]:
        if group == "not_matched":
            raise WriteRefused(f"{where}: WHEN NOT MATCHED cannot UPDATE (there is no target row); use INSERT")
        rest = then + 2
        if rest == b or (act[1:3] == ["SET", "*"] and then + 4 == b):
            if group == "not_matched_by_source":
                raise WriteRefused(f"{where}: WHEN NOT MATCHED BY SOURCE … UPDATE needs SET column = expression")
            return MergeClause(f"{group}_update", cond, None), group
        if act[1:2] != ["SET"]:
            raise WriteRefused(f"{where}: expected UPDATE SET …")
        sets = _assignments(sql, toks, then + 3, b, {target.lower()}, table, "MERGE INTO", strip=False)
        return MergeClause(f"{group}_update", cond, sets), group
    if act[:1] == ["INSERT"]:
        if group != "not_matched":
            raise WriteRefused(f"{where}: only WHEN NOT MATCHED can INSERT")
        return MergeClause("not_matched_insert", cond, *_insert_action(sql, toks, then + 2, b, where)), group
    raise WriteRefused(
        f"{where}: expected UPDATE, DELETE, INSERT or DO NOTHING after THEN, got {_text(sql, toks, then + 1, b)!r}"
    )


def _insert_action(
    sql: str, toks: Sequence[Token], i: int, b: int, where: str
) -> tuple[dict[str, str] | None, tuple[str, ...] | None]:
    """``INSERT`` / ``INSERT *`` / ``INSERT BY NAME`` (every column by name),
    ``INSERT [(cols)] VALUES (exprs)``: its set, or its values in table order."""
    rest = [_w(t) for t in toks[i:b]]
    if rest in ([], ["*"], ["BY", "NAME"]):
        return None, None
    cols = None
    if i < b and toks[i].text == "(":
        close = _close(toks, i)
        cols = [_text(sql, toks, x, y) for x, y in _split_top(toks, i + 1, close, ",")]
        cols = [c[1:-1].replace('""', '"') if c.startswith('"') else c for c in cols]
        i = close + 1
    if i + 1 >= b or _w(toks[i]) != "VALUES" or toks[i + 1].text != "(" or _close(toks, i + 1) != b - 1:
        raise WriteRefused(f"{where}: expected INSERT [(columns)] VALUES (expressions) or INSERT *")
    values = [_text(sql, toks, x, y) for x, y in _split_top(toks, i + 2, b - 1, ",")]
    if cols is None:
        return None, tuple(values)
    if len(cols) != len(values):
        raise WriteRefused(f"{where}: INSERT names {len(cols)} columns and gives {len(values)} values")
    return dict(zip(cols, values, strict=True)), None
