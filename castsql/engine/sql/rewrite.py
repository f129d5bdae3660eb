"""Time-travel clauses in SQL, found with DuckDB's own tokenizer.

Recognised after a table name (optionally qualified or quoted):

    t AS OF VERSION 3          t VERSION AS OF 3         t AT (VERSION => 3)
    t AS OF TIMESTAMP '…'      t TIMESTAMP AS OF '…'     t AT (TIMESTAMP => '…')
    t FOR SYSTEM_TIME AS OF '…' (SQL:2011), and TIMESTAMP '…' literals in place of '…'

Each clause is replaced by the name the caller gives that version, keeping the
table's own name (or the user's alias) as the alias, so ``t.col`` still works.
Because the tokenizer skips comments and yields string literals and quoted
identifiers as single tokens, text inside them is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from castsql.engine.sql.tokens import Token, string_value, tokenize, unquote
from castsql.errors import SQLRewriteError

__all__ = [
    "Clause",
    "SQLRewriteError",
    "TimeTravel",
    "Token",
    "find",
    "rewrite",
    "string_value",
    "tokenize",
]


@dataclass(frozen=True)
class TimeTravel:
    """A table reference with a version or a timestamp."""

    name: tuple[str, ...]  # name parts, unquoted: ("t",) or ("wh", "t")
    version: int | None = None
    timestamp: str | None = None
    param: int | None = None  # AS OF VERSION ?: which positional parameter (0-based) holds the version


_NOT_ALIAS = {
    "WHERE", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "ON", "USING", "GROUP", "ORDER",
    "LIMIT", "OFFSET", "UNION", "EXCEPT", "INTERSECT", "HAVING", "WINDOW", "QUALIFY", "POSITIONAL", "ASOF",
    "ANTI", "SEMI", "SAMPLE", "TABLESAMPLE", "LATERAL", "RETURNING", "SET", "FROM", "SELECT", "AS",
}  # fmt: skip


class _Matcher:
    def __init__(self, toks: Sequence[Token], i: int) -> None:
        self.toks, self.i = toks, i

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def words(self, *ws: str) -> bool:
        for k, w in enumerate(ws):
            t = self.peek(k)
            if t is None or t.word != w or t.kind not in ("keyword", "identifier", "operator"):
                return False
        self.i += len(ws)
        return True

    def take(self) -> Token:
        t = self.peek()
        if t is None:
            raise SQLRewriteError("time-travel clause ends early")
        self.i += 1
        return t


def _version_value(m: _Matcher) -> int | Token:
    t = m.take()
    if t.kind == "operator" and t.text == "?":
        return t  # a positional parameter: its value comes with the query
    if t.kind != "numeric_const" or not t.text.replace("_", "").isdigit():
        raise SQLRewriteError(f"expected a version number at {t.text!r} (position {t.start})")
    return int(t.text.replace("_", ""))


def _time_value(m: _Matcher) -> str:
    t = m.take()
    if t.kind in ("keyword", "identifier") and t.word in ("TIMESTAMP", "TIMESTAMPTZ"):
        t = m.take()
    if t.kind != "string_const":
        raise SQLRewriteError(f"expected a timestamp string at {t.text!r} (position {t.start})")
    return string_value(t)


def _clause(m: _Matcher) -> tuple[int | Token | None, str | None] | None:
    """Match a time-travel clause at the matcher's position; None if there is none."""
    if m.words("AS", "OF", "VERSION") or m.words("VERSION", "AS", "OF"):
        return _version_value(m), None
    if (
        m.words("AS", "OF", "TIMESTAMP")
        or m.words("TIMESTAMP", "AS", "OF")
        or m.words("FOR", "SYSTEM_TIME", "AS", "OF")
    ):
        return None, _time_value(m)
    if m.words("AT", "("):
        if m.words("VERSION", "=>"):
            v = _version_value(m)
            ts = None
        elif m.words("TIMESTAMP", "=>"):
            v, ts = None, _time_value(m)
        else:
            return None
        if not m.words(")"):
            raise SQLRewriteError("expected ')' after AT (…")
        return v, ts
    return None


@dataclass(frozen=True)
class Clause:
    """A time-travel reference found in a statement's tokens: the name runs
    over tokens ``first`` to ``last`` (inclusive), the clause after it ends
    before token ``end``."""

    ref: TimeTravel
    first: int
    last: int
    end: int
    has_alias: bool  # an alias follows the clause

    def span(self, toks: Sequence[Token]) -> tuple[int, int]:
        """Where the name and its clause lie in the text."""
        return toks[self.first].start, toks[self.end - 1].end

    def alias(self) -> str:
        """The alias a replacement keeps when the query gave none: the table's own name."""
        return ' AS "' + self.ref.name[-1].replace('"', '""') + '"'


def find(toks: Sequence[Token], tables: Collection[str] = ()) -> list[Clause]:
    """Every time-travel clause in ``toks`` (DuckDB's tokens of one text), in order.

    ``tables`` (lower-cased) are table names that may be written unquoted
    although DuckDB tokenizes them as keywords (``data``, ``year``, ``source``…).
    ``AS OF VERSION ?`` gets the index of its positional parameter."""
    out: list[Clause] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind != "identifier" and not (t.kind == "keyword" and t.text.lower() in tables):
            i += 1
            continue
        # A possibly qualified name: ident (. ident)*
        j = i
        parts = [unquote(toks[j])]
        while j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind == "identifier":
            j += 2
            parts.append(unquote(toks[j]))
        m = _Matcher(toks, j + 1)
        clause = _clause(m)
        if clause is None:
            i = j + 1
            continue
        version, param = clause[0], None
        if isinstance(version, Token):  # AS OF VERSION ?: the n-th positional parameter
            param = sum(1 for k in toks if k.kind == "operator" and k.text == "?" and k.start < version.start)
            version = None
        nxt = m.peek()
        has_alias = nxt is not None and (
            (nxt.kind == "keyword" and nxt.word == "AS") or (nxt.kind == "identifier" and nxt.word not in _NOT_ALIAS)
        )
        ref = TimeTravel(tuple(parts), version=version, timestamp=clause[1], param=param)
        out.append(Clause(ref, i, j, m.i, has_alias))
        i = m.i
    return out


def rewrite(
    sql: str, replace: Callable[[TimeTravel], str], tables: Collection[str] = ()
) -> tuple[str, list[TimeTravel]]:
    """Replace every time-travel reference with ``replace(ref)``; returns the
    new SQL and the references found, in order. (A query's plan,
    :mod:`castsql.engine.sql.plan`, uses :func:`find` on its tokens instead.)

    Example::

        >>> rewrite("SELECT * FROM t AS OF VERSION 3", lambda r: f"t_v{r.version}")[0]
        'SELECT * FROM t_v3 AS "t"'
    """
    toks = tokenize(sql)
    out: list[str] = []
    pos = 0
    clauses = find(toks, tables)
    for c in clauses:
        start, end = c.span(toks)
        out.append(sql[pos:start])
        out.append(replace(c.ref) + ("" if c.has_alias else c.alias()))
        pos = end
    out.append(sql[pos:])
    return "".join(out), [c.ref for c in clauses]
