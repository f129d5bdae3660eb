"""Safe mode: queries read the opened tables and nothing else.

- DuckDB may touch only the opened tables' roots and the session's own work
  directory (``allowed_directories`` with ``enable_external_access = false``):
  no other local file, no URL, no extension install or load, no ATTACH.
  DuckDB also lets a query read its temporary directory (``.tmp/`` under the
  current directory by default): it is moved into the work directory;
- the configuration is then locked, so no query can undo it;
- only read statements run (SELECT and EXPLAIN of one): DuckDB's
  ``allowed_directories`` would otherwise let ``COPY … TO`` write into a table;
- the arguments of table functions (``read_parquet(…)``, ``read_text(…)``)
  must be literals, and no literal URL may hold a ``.`` or ``..`` segment:
  DuckDB checks ``allowed_directories`` on the text of an ``s3://`` path, and
  ``s3://bucket/table/../other`` starts with an allowed prefix while the
  server may resolve it elsewhere. With literal arguments every path a query
  names is visible here.

Independently of safe mode, a manifest or tombstone naming an object outside
its table root is refused in every mode (castsql.format.layout.to_table_key).
"""

from __future__ import annotations

import json
import re
from typing import Any

import duckdb

from castsql.errors import CastSQLError


class SafeModeError(CastSQLError):
    """A statement or action that safe mode forbids."""


def lock_down(con: duckdb.DuckDBPyConnection, allowed: list[str], temp_directory: str) -> None:
    """Restrict ``con`` to the ``allowed`` directory prefixes (local paths or s3:// URIs);
    ``temp_directory`` (inside one of them) replaces DuckDB's default ``.tmp``."""
    dirs = sorted({a.rstrip("/") + "/" for a in allowed})
    con.execute("SET temp_directory = ?", [temp_directory])
    con.execute("SET allowed_directories = ?", [dirs])
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALY[SZ]E)?\b", re.IGNORECASE)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise SafeModeError unless every statement of ``sql`` only reads, and
    only paths written out as literals (see the module docstring)."""
    for st in con.extract_statements(sql):
        kind = st.type
        query = st.query
        if kind == duckdb.StatementType.EXPLAIN:
            inner = _EXPLAIN.sub("", st.query, count=1)
            inner_types = [s.type for s in con.extract_statements(inner)] if inner.strip() else []
            if inner_types and all(t == duckdb.StatementType.SELECT for t in inner_types):
                _check_paths(con, inner)
                continue
        elif kind == duckdb.StatementType.SELECT:
            _check_paths(con, query)
            continue
        name = str(kind).rsplit(".", 1)[-1]
        raise SafeModeError(f"safe mode: {name} statements are not allowed (only SELECT and EXPLAIN SELECT)")


def _check_paths(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        raw = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
        tree = json.loads(raw[0]) if raw else {}
    except (duckdb.Error, ValueError):
        tree = {}
    if tree.get("error", True):
        # DuckDB cannot serialize it: let DuckDB report what is wrong with it (a
        # statement it cannot parse does not run either).
        try:
            con.extract_statements(sql)
        except duckdb.Error:
            return
        raise SafeModeError("safe mode: this statement cannot be checked, so it is not allowed")
    _walk(tree)


def _walk(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            for arg in fn.get("children") or ():
                if not _literal(arg):
                    raise SafeModeError(
                        f"safe mode: the arguments of {fn.get('function_name', 'a table function')}() must be "
                        "literals (no expressions, variables or subqueries), so that the paths it reads are known"
                    )
        elif node.get("type") == "BASE_TABLE":
            _check_path(node.get("table_name"))
        elif node.get("class") == "CONSTANT":
            _check_path((node.get("value") or {}).get("value"))
        for v in node.values():
            _walk(v)
    elif isinstance(node, list):
        for v in node:
            _walk(v)


_LITERAL_BUILDERS = {"list_value", "struct_pack", "row", "map"}


def _literal(expr: Any) -> bool:
    if not isinstance(expr, dict):
        return False
    if expr.get("class") == "CONSTANT":
        return True
    if expr.get("class") == "FUNCTION" and expr.get("function_name") in _LITERAL_BUILDERS:
        return all(_literal(c) for c in expr.get("children") or ())
    return False


_DOT_SEGMENT = re.compile(r"(^|/)(\.|%2e){1,2}(/|$)", re.IGNORECASE)


def _check_path(value: Any) -> None:
    if isinstance(value, str) and "://" in value:
        path = value.split("://", 1)[1].split("?", 1)[0]
        if _DOT_SEGMENT.search(path):
            raise SafeModeError(f"safe mode: {value!r} holds a '.' or '..' path segment")
