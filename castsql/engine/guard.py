"""What no user statement may touch, in any mode: CastSQL's own catalog.

A session keeps a DuckLake catalog (:mod:`castsql.engine.lake`) that
describes the versions it reads; it lists the tables' real data files. DuckLake
treats the files of its catalog as its own: its maintenance functions
(``ducklake_rewrite_data_files``, ``ducklake_expire_snapshots``,
``ducklake_cleanup_old_files``, ``CHECKPOINT`` …) rewrite and delete them. Two
independent barriers keep a reader from ever doing that:

1. the catalog is attached read-only whenever a user statement runs, and
   nothing is ever scheduled for deletion in it (see :mod:`castsql.engine.lake`);
2. this module refuses, before anything runs, every statement that names the
   catalog or its metadata database, calls a DuckLake function, attaches a
   DuckLake, or runs SQL built at run time (``query()``, ``query_table()``,
   ``json_execute_serialized_sql()``), whose text could not be checked.

The check runs on DuckDB's own tokens, so words inside comments are ignored
and quoted identifiers are compared unquoted.

Example::

    >>> check_statement("SELECT * FROM events")
    >>> check_statement("SELECT * FROM ducklake_expire_snapshots('castsql_lake')")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    castsql.engine.guard.ForbiddenStatement: DuckLake functions are not available in CastSQL ...
"""

from __future__ import annotations

from castsql.engine.rewrite import tokenize
from castsql.errors import CastSQLError

INTERNAL_CATALOG = "castsql_lake"
INTERNAL_NAMES = frozenset({INTERNAL_CATALOG, f"__ducklake_metadata_{INTERNAL_CATALOG}"})
# Names CastSQL gives its own views, tables and session variables (live-row masks).
INTERNAL_PREFIX = "__castsql"
# Table functions that run SQL text assembled while the query runs.
DYNAMIC_SQL = frozenset({"query", "query_table", "json_execute_serialized_sql", "sqlite_query"})

_WHY = "CastSQL's own catalog is not reachable from SQL"


class ForbiddenStatement(CastSQLError):
    """A statement that would reach CastSQL's internal catalog."""


def check_statement(sql: str, *, private_paths: tuple[str, ...] = ()) -> None:
    """Raise ForbiddenStatement if ``sql`` could reach the internal catalog.

    ``private_paths`` are directories only CastSQL may name (the session's
    work directory, which holds the catalog's files).
    """
    toks = tokenize(sql)
    for i, t in enumerate(toks):
        if t.kind in ("identifier", "keyword"):
            name = t.text[1:-1].replace('""', '"') if t.text.startswith('"') else t.text
            low = name.lower()
            if low in INTERNAL_NAMES:
                raise ForbiddenStatement(f"{name} is CastSQL's internal catalog: {_WHY}")
            if low.startswith(INTERNAL_PREFIX):
                raise ForbiddenStatement(f"{name} is internal to CastSQL: statements cannot name it")
            if low.startswith("ducklake_"):
                raise ForbiddenStatement(f"DuckLake functions are not available in CastSQL ({low}): {_WHY}")
            if low in DYNAMIC_SQL and i + 1 < len(toks) and toks[i + 1].text == "(":
                raise ForbiddenStatement(
                    f"{low}() runs SQL text built while the query runs, which CastSQL cannot check: {_WHY}; "
                    "write the statement itself instead"
                )
        elif t.kind == "string_const":
            low = t.text.lower()
            body = low[low.find("'") + 1 :]
            if any(n in low for n in INTERNAL_NAMES) or body.startswith("ducklake:"):
                raise ForbiddenStatement(f"{t.text[:60]} names a DuckLake catalog: {_WHY}")
            if body.startswith(INTERNAL_PREFIX):
                raise ForbiddenStatement(f"{t.text[:60]} is internal to CastSQL: statements cannot name it")
            if any(p and p.lower() in low for p in private_paths):
                raise ForbiddenStatement(f"{t.text[:80]} lies in CastSQL's private work directory")
