"""What no statement may name or call, in any mode, found on DuckDB's own tokens.

This is the word-level half of the SQL barrier; :mod:`castsql.engine.barrier.policy`
decides, per statement type, what each mode runs. Refused here:

- CastSQL's internal objects: its DuckLake catalog and that catalog's
  metadata database (:mod:`castsql.engine.duckdb.lake`), and every name starting with
  ``castsql/`` (views of versions, pruned file sets … :mod:`castsql.engine.sql.names`);
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
    castsql.errors.ForbiddenStatement: DuckLake functions are not available in CastSQL ...
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence

from castsql.engine.sql.literals import literal_at
from castsql.engine.sql.names import LAKE_CATALOG, LAKE_METADATA, PREFIX
from castsql.engine.sql.tokens import Token, tokenize
from castsql.errors import CastSQLError, ForbiddenStatement

INTERNAL_CATALOG = LAKE_CATALOG  # its old name here, before SQL text's names held it
INTERNAL_NAMES = frozenset({LAKE_CATALOG, LAKE_METADATA})
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


Tok = Token  # the name policy.py and older callers use


def tokens(sql: str) -> list[Token]:
    """DuckDB's tokens of ``sql`` with their exact text (:mod:`castsql.engine.sql.tokens`)."""
    return tokenize(sql)


def check_statement(sql: str, *, private_paths: tuple[str, ...] = (), toks: Sequence[Token] | None = None) -> None:
    """Raise ForbiddenStatement if ``sql`` names an internal object or calls a
    function no mode allows. ``private_paths`` are directories only CastSQL may
    name (the session's work directory, which holds the catalog's files);
    ``toks``: ``sql``'s tokens when the caller has them (a query's plan)."""
    toks = list(tokens(sql) if toks is None else toks)
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
