"""What no statement may name or call, in any mode, found on DuckDB's own tokens.

This is the word-level half of the SQL barrier; :mod:`castsql.engine.policy`
decides, per statement type, what each mode runs. Refused here:

- CastSQL's internal objects: its DuckLake catalog and that catalog's
  metadata database (:mod:`castsql.engine.lake`), and every name starting with
  ``castsql/`` (views of versions, pruned file sets … :mod:`castsql.engine.names`);
- functions that reach past the checks: DuckLake's (``ducklake_*``: they
  rewrite and delete the files of a catalog), SQL built while the query runs
  (``query()``, ``query_table()``, ``json_execute_serialized_sql()``,
  ``sqlite_query()``), scans of raw memory addresses (``arrow_scan()``,
  ``pandas_scan()``), checkpoints of another database, and logging or
  profiling to a file (DuckDB's logs record HTTP requests, signed headers
  included);
- a string naming a DuckLake catalog (``'ducklake:…'``) or the session's
  private work directory.

Words inside comments are not tokens; quoted identifiers are compared
unquoted; ``$$…$$`` strings are one token.

Example::

    >>> check_statement("SELECT * FROM events WHERE note = $$a)b$$")
    >>> check_statement("SELECT * FROM ducklake_expire_snapshots('castsql_lake')")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    castsql.engine.guard.ForbiddenStatement: DuckLake functions are not available in CastSQL ...
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass

import duckdb

from castsql.engine.literals import literal_at
from castsql.engine.names import PREFIX
from castsql.errors import CastSQLError

INTERNAL_CATALOG = "castsql_lake"
INTERNAL_NAMES = frozenset({INTERNAL_CATALOG, f"__ducklake_metadata_{INTERNAL_CATALOG}"})
# Table functions that run SQL text assembled while the query runs.
DYNAMIC_SQL = frozenset({"query", "query_table", "json_execute_serialized_sql", "sqlite_query"})
# Table functions that read Python objects by raw memory address.
RAW_MEMORY = frozenset({"arrow_scan", "arrow_scan_dumb", "pandas_scan", "python_map_function"})
# Functions that attach a database of another engine.
ATTACHING = frozenset({"sqlite_attach", "postgres_attach", "mysql_attach"})
# Their arguments name a file DuckDB writes to.
FILE_ARGUMENTS = {"enable_logging": "storage_path", "enable_profiling": "save_location"}
# Databases a CHECKPOINT may name: the session's own, in memory.
OWN_DATABASES = frozenset({"memory", "temp"})

_WHY = "CastSQL's own catalog is not reachable from SQL"


class ForbiddenStatement(CastSQLError):
    """A statement that CastSQL refuses to run, in every mode."""


@dataclass(frozen=True)
class Tok:
    """One of DuckDB's tokens: its kind, text and (for names) its unquoted, lower-cased value."""

    start: int
    end: int
    kind: str  # identifier, keyword, string_const, numeric_const, operator, comment
    text: str

    @property
    def name(self) -> str:
        if self.text.startswith('"'):
            return self.text[1:-1].replace('""', '"').lower()
        return self.text.lower()

    @property
    def is_name(self) -> bool:
        return self.kind in ("identifier", "keyword")

    def string_value(self) -> str | None:
        """The value of a string literal: ``'…'`` or ``$tag$…$tag$`` (None for other forms)."""
        t = self.text
        if t.startswith("'") and t.endswith("'") and len(t) >= 2:
            return t[1:-1].replace("''", "'")
        m = _DOLLAR.match(t)
        if m and t.endswith(m.group(0)) and len(t) >= 2 * len(m.group(0)):
            return t[len(m.group(0)) : -len(m.group(0))]
        return None


_DOLLAR = re.compile(r"\$[A-Za-z_]*\$")
_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")
_NUMBER = re.compile(r"[0-9][0-9_]*(\.[0-9_]*)?([eE][+-]?[0-9]+)?|\.[0-9]+")


def tokens(sql: str) -> list[Tok]:
    """DuckDB's tokens of ``sql`` with their exact text (DuckDB gives only where each starts)."""
    raw = duckdb.tokenize(sql)
    if not sql.isascii():  # DuckDB counts UTF-8 bytes
        index, b = {}, 0
        for ci, ch in enumerate(sql):
            index[b] = ci
            b += len(ch.encode("utf-8", "surrogatepass"))
        index[b] = len(sql)
        raw = [(index.get(s, len(sql)), k) for s, k in raw]
    out = []
    for i, (start, kind) in enumerate(raw):
        nxt = raw[i + 1][0] if i + 1 < len(raw) else len(sql)
        k = str(kind).rsplit(".", 1)[-1]
        end = _end(sql, start, nxt, k)
        out.append(Tok(start, end, k, sql[start:end]))
    return out


def _end(sql: str, start: int, nxt: int, kind: str) -> int:
    ch = sql[start : start + 1]
    if kind == "string_const":
        m = _DOLLAR.match(sql, start)
        if m:
            close = sql.find(m.group(0), m.end())
            return len(sql) if close < 0 else close + len(m.group(0))
        q = sql.find("'", start)
        return _closing(sql, q if q >= 0 else start, "'")
    if kind == "identifier" and ch == '"':
        return _closing(sql, start, '"')
    if kind in ("identifier", "keyword"):
        m = _WORD.match(sql, start)
        return m.end() if m else min(nxt, start + 1)
    if kind == "numeric_const":
        m = _NUMBER.match(sql, start)
        return m.end() if m else min(nxt, start + 1)
    # Operators and the rest: up to the next token, less spaces and comments.
    end = start + 1
    while end < nxt and not sql[end].isspace() and sql[end : end + 2] not in ("--", "/*"):
        end += 1
    return end


def _closing(sql: str, i: int, quote: str) -> int:
    i += 1
    while i < len(sql):
        if sql[i] == quote:
            if sql[i + 1 : i + 2] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def check_statement(sql: str, *, private_paths: tuple[str, ...] = ()) -> None:
    """Raise ForbiddenStatement if ``sql`` names an internal object or calls a
    function no mode allows. ``private_paths`` are directories only CastSQL may
    name (the session's work directory, which holds the catalog's files)."""
    toks = tokens(sql)
    for i, t in enumerate(toks):
        if t.is_name:
            name = t.name
            call = i + 1 < len(toks) and toks[i + 1].text == "("
            if name in INTERNAL_NAMES:
                raise ForbiddenStatement(f"{name} is CastSQL's internal catalog: {_WHY}")
            if name.startswith(PREFIX):
                raise ForbiddenStatement(f"{t.text} is internal to CastSQL: statements cannot name it")
            if name.startswith("ducklake_"):
                raise ForbiddenStatement(f"DuckLake functions are not available in CastSQL ({name}): {_WHY}")
            if not call:
                continue
            if name in DYNAMIC_SQL:
                raise ForbiddenStatement(
                    f"{name}() runs SQL text built while the query runs, which CastSQL cannot check; "
                    "write the statement itself instead"
                )
            if name in RAW_MEMORY:
                raise ForbiddenStatement(f"{name}() reads raw memory addresses: not available from SQL")
            if name in ATTACHING:
                raise ForbiddenStatement(f"{name}() attaches a database: {ATTACH_WHY}")
            args = _call_args(toks, i + 1)
            if name in FILE_ARGUMENTS and any(a.name in (FILE_ARGUMENTS[name], "storage") for a in args):
                raise ForbiddenStatement(f"{name}() writing to a file is not available from SQL")
            if name in ("checkpoint", "force_checkpoint"):
                _check_checkpoint_target(args)
        elif t.kind == "string_const":
            low = t.text.lower()
            value = literal_at(sql, toks, i)  # as DuckDB reads it (E'…' escapes, continued lines)
            body = (value or low).lower()
            if any(n in low for n in INTERNAL_NAMES) or body.startswith("ducklake:"):
                raise ForbiddenStatement(f"{t.text[:60]} names a DuckLake catalog: {_WHY}")
            if _names_private(value or t.text, private_paths):
                raise ForbiddenStatement(f"{t.text[:80]} lies in CastSQL's private work directory")


def _names_private(value: str, private_paths: tuple[str, ...]) -> bool:
    """Whether the path ``value`` lies in one of ``private_paths``, however it
    is spelled: ``/tmp//d``, ``/tmp/./d``, ``/t/table/../../tmp/d``, ``file:``,
    a relative path or a symbolic link all name ``/tmp/d``."""
    spellings = {value}
    local = re.sub(r"^file:(//(localhost)?)?", "", value, flags=re.IGNORECASE)
    if "://" not in local and "\0" not in local and len(local) < 4096:
        spellings.add(posixpath.normpath(re.sub(r"/+", "/", local)))
        spellings.add(os.path.realpath(local))
    privates = {q for p in private_paths if p for q in (p, os.path.realpath(p))}
    return any(p.lower() in s.lower() for p in privates for s in spellings)


ATTACH_WHY = (
    "an attached catalog (DuckLake, Iceberg, DuckDB …) could own or overwrite the tables' files; "
    "to join CastSQL tables with another database, attach it to your own DuckDB connection and use "
    "castsql.connect(..., connection=con) or Table.to_duckdb(con)"
)


def _call_args(toks: list[Tok], open_at: int) -> list[Tok]:
    """The tokens between the parenthesis at ``open_at`` and its match."""
    depth = 0
    for j in range(open_at, len(toks)):
        depth += toks[j].text.count("(") - toks[j].text.count(")")
        if depth <= 0:
            return toks[open_at + 1 : j]
    return toks[open_at + 1 :]


def _check_checkpoint_target(args: list[Tok]) -> None:
    for a in args:
        db = a.string_value() if a.kind == "string_const" else a.name if a.is_name else None
        if db is not None and db.lower() not in OWN_DATABASES:
            raise ForbiddenStatement(
                f"CHECKPOINT of {db}: only the session's own in-memory database can be checkpointed"
            )


def check_one_condition(table: str, text: str) -> None:
    """Refuse a filter that is not one condition: a ``;`` or a parenthesis
    closed before it opens would end the ``WHERE (…)`` it is put in and let it
    add rows (``1=1) UNION ALL SELECT …``)."""
    depth = 0
    for tok in tokens(text):
        if tok.kind == "string_const" or tok.text.startswith('"'):
            continue  # a literal ($$…$$, E'…' too) or a quoted name: its parentheses are text
        depth += tok.text.count("(") - tok.text.count(")")
        if depth < 0 or ";" in tok.text:
            break
    else:
        if depth == 0:
            return
    raise CastSQLError(f"table {table}: filter must be one SQL condition, got {text!r}")
