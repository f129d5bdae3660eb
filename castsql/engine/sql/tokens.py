"""SQL text as DuckDB's own tokenizer cuts it: the one lexer of CastSQL.

``duckdb.tokenize`` gives where each token starts and its kind; this module
adds where it ends (so each token's text is exact), the value of a string
literal, and the unquoted, lower-cased value of a name. Comments are not
tokens; ``'…'``, ``E'…'``, ``$tag$…$tag$`` and quoted names are
one token each, so nothing inside them is ever read as SQL.

A query's tokens are computed once (:class:`castsql.engine.sql.plan.Plan` holds
them) and memoised by text.

Example::

    >>> [(t.kind, t.text) for t in tokenize("SELECT $$a)b$$ AS x -- note")]
    [('keyword', 'SELECT'), ('string_const', '$$a)b$$'), ('keyword', 'AS'), ('identifier', 'x')]
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class Token:
    """One of DuckDB's tokens: where it starts and ends, its kind and exact text."""

    start: int
    end: int
    kind: str  # keyword, identifier, numeric_const, string_const, operator, comment
    text: str

    @property
    def word(self) -> str:
        """Names upper-cased as written (quotes kept); other tokens as they are."""
        return self.text.upper() if self.kind in ("keyword", "identifier") else self.text

    @property
    def name(self) -> str:
        """A name unquoted and lower-cased (SQL names are case-insensitive)."""
        return unquote(self).lower()

    @property
    def is_name(self) -> bool:
        return self.kind in ("identifier", "keyword")

    def string_value(self) -> str | None:
        """The value of a string literal (None for other tokens)."""
        return _scan_string(self.text, 0)[1] if self.kind == "string_const" else None


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
    """DuckDB's tokens of ``sql`` with their exact text (memoised by text)."""
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


def unquote(tok: Token) -> str:
    """A name token's text without its double quotes."""
    if tok.text.startswith('"'):
        return tok.text[1:-1].replace('""', '"')
    return tok.text


def string_value(tok: Token) -> str:
    """The value of a string_const token: '…', E'…', $tag$…$tag$, continued lines joined."""
    return _scan_string(tok.text, 0)[1]
