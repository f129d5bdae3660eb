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

import functools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

import duckdb

from castsql.errors import CastSQLError


class SQLRewriteError(CastSQLError):
    """A time-travel clause is malformed."""


@dataclass(frozen=True)
class Token:
    start: int
    end: int
    kind: str  # keyword, identifier, numeric_const, string_const, operator
    text: str

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind in ("keyword", "identifier") else self.text


@dataclass(frozen=True)
class TimeTravel:
    """A table reference with a version or a timestamp."""

    name: tuple[str, ...]  # name parts, unquoted: ("t",) or ("wh", "t")
    version: int | None = None
    timestamp: str | None = None


# Postgres' lexer rules, which DuckDB's tokenizer follows (libpg_query scan.l):
# a dollar-quote delimiter, and the gap that continues a '…' literal on another
# line ('a'\n'b' is one literal, 'ab': whitespace holding a newline, -- comments allowed).
_DOLLAR_RE = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_CONTINUE_RE = re.compile(r"(?:[ \t\f]|--[^\n\r]*)*[\n\r](?:[ \t\n\r\f\v]+|--[^\n\r]*[\n\r])*'")
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _scan_string(sql: str, start: int) -> tuple[int, str]:
    """End offset and value of the string literal at ``start``: '…' (quotes
    doubled inside), E'…' (backslash escapes too), X'…'/B'…' (raw), $tag$…$tag$.
    An unterminated literal runs to the end of the text (DuckDB refuses it)."""
    if sql[start] == "$":
        m = _DOLLAR_RE.match(sql, start)
        if m is None:
            return len(sql), sql[start + 1 :]
        close = sql.find(m.group(0), m.end())
        if close < 0:
            return len(sql), sql[m.end() :]
        return close + len(m.group(0)), sql[m.end() : close]
    q = sql.find("'", start)
    if q < 0:
        return len(sql), ""
    backslash = sql[start:q].upper() == "E"
    parts: list[str] = []
    i = q + 1
    while i < len(sql):
        ch = sql[i]
        if backslash and ch == "\\" and i + 1 < len(sql):
            nxt = sql[i + 1]
            parts.append(_ESCAPES.get(nxt, nxt))
            i += 2
        elif ch == "'":
            if sql.startswith("''", i):
                parts.append("'")
                i += 2
                continue
            m = _CONTINUE_RE.match(sql, i + 1)
            if m is None:
                return i + 1, "".join(parts)
            i = m.end()
        else:
            parts.append(ch)
            i += 1
    return len(sql), "".join(parts)


def _quoted_end(sql: str, start: int) -> int:
    i = start + 1
    while i < len(sql):
        if sql[i] == '"':
            if sql.startswith('""', i):
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def _token_end(sql: str, start: int, kind: str, limit: int) -> int:
    """Where the token that DuckDB says starts at ``start`` ends; ``limit`` is
    where DuckDB's next token starts. Only literals and quoted names can hold
    spaces, quotes or comment marks, so they are scanned; any other token runs
    until a space, a comment or a quote, which DuckDB's next token or the gap
    before it begins with."""
    if kind == "string_const":
        end = _scan_string(sql, start)[0]
    elif kind == "identifier" and sql[start] == '"':
        end = _quoted_end(sql, start)
    else:
        end = start + 1
        while (
            end < limit and not sql[end].isspace() and sql[end] not in "'\"" and sql[end : end + 2] not in ("--", "/*")
        ):
            end += 1
    # DuckDB decides where tokens start: a scan that disagrees never runs into the next one.
    return max(start + 1, min(end, limit))


def _char_offsets(sql: str, raw: list) -> list:
    """DuckDB reports UTF-8 byte offsets; map them to string indexes."""
    if sql.isascii():
        return raw
    index = {}
    b = 0
    for ci, ch in enumerate(sql):
        index[b] = ci
        b += len(ch.encode("utf-8", "surrogatepass"))
    index[b] = len(sql)
    return [(index.get(start, len(sql)), tt) for start, tt in raw]


def tokenize(sql: str) -> list[Token]:
    """DuckDB's tokens of ``sql`` with their text. Memoised: one query is
    tokenized by the audit rewrite, the time-travel rewrite and the name scan
    in turn (3 of the ~1 ms Session.prepare spends per query)."""
    return list(_tokenize(sql))


@functools.lru_cache(maxsize=256)
def _tokenize(sql: str) -> tuple[Token, ...]:
    raw = _char_offsets(sql, duckdb.tokenize(sql))
    out = []
    for i, (start, tt) in enumerate(raw):
        if start >= len(sql):
            continue
        kind = str(tt).rsplit(".", 1)[-1]
        nxt = raw[i + 1][0] if i + 1 < len(raw) else len(sql)
        end = _token_end(sql, start, kind, nxt)
        out.append(Token(start, end, kind, sql[start:end]))
    return tuple(out)


def _unquote(tok: Token) -> str:
    if tok.text.startswith('"'):
        return tok.text[1:-1].replace('""', '"')
    return tok.text


def string_value(tok: Token) -> str:
    """The value of a string_const token: '…', E'…', $tag$…$tag$, continued lines joined."""
    return _scan_string(tok.text, 0)[1]


_NOT_ALIAS = {
    "WHERE", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "ON", "USING", "GROUP", "ORDER",
    "LIMIT", "OFFSET", "UNION", "EXCEPT", "INTERSECT", "HAVING", "WINDOW", "QUALIFY", "POSITIONAL", "ASOF",
    "ANTI", "SEMI", "SAMPLE", "TABLESAMPLE", "LATERAL", "RETURNING", "SET", "FROM", "SELECT", "AS",
}  # fmt: skip


class _Matcher:
    def __init__(self, toks: list[Token], i: int) -> None:
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


def _version_value(m: _Matcher) -> int:
    t = m.take()
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


def _clause(m: _Matcher) -> tuple[int | None, str | None] | None:
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


def rewrite(
    sql: str, replace: Callable[[TimeTravel], str], tables: Collection[str] = ()
) -> tuple[str, list[TimeTravel]]:
    """Replace every time-travel reference with ``replace(ref)``; returns the
    new SQL and the references found, in order.

    ``tables`` (lower-cased) are table names that may be written unquoted
    although DuckDB tokenizes them as keywords (``data``, ``year``, ``source``…).

    Example::

        >>> rewrite("SELECT * FROM t AS OF VERSION 3", lambda r: f"t_v{r.version}")[0]
        'SELECT * FROM t_v3 AS "t"'
    """
    toks = tokenize(sql)
    out: list[str] = []
    refs: list[TimeTravel] = []
    pos = 0
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind != "identifier" and not (t.kind == "keyword" and t.text.lower() in tables):
            i += 1
            continue
        # A possibly qualified name: ident (. ident)*
        j = i
        parts = [_unquote(toks[j])]
        while j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind == "identifier":
            j += 2
            parts.append(_unquote(toks[j]))
        m = _Matcher(toks, j + 1)
        clause = _clause(m)
        if clause is None:
            i = j + 1
            continue
        ref = TimeTravel(tuple(parts), version=clause[0], timestamp=clause[1])
        refs.append(ref)
        nxt = m.peek()
        has_alias = nxt is not None and (
            (nxt.kind == "keyword" and nxt.word == "AS") or (nxt.kind == "identifier" and nxt.word not in _NOT_ALIAS)
        )
        alias = "" if has_alias else ' AS "' + parts[-1].replace('"', '""') + '"'
        out.append(sql[pos : t.start])
        out.append(replace(ref) + alias)
        pos = toks[m.i - 1].end
        i = m.i
    out.append(sql[pos:])
    return "".join(out), refs


def referenced_names(sql: str) -> set[str]:
    """Lower-cased identifiers and keywords in ``sql`` (candidates for table
    names: a table may be called like a non-reserved keyword, ``data``)."""
    return {_unquote(t).lower() for t in tokenize(sql) if t.kind in ("identifier", "keyword")}
