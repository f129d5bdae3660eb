"""Safe mode: queries read the opened tables and nothing else, and no credential is readable.

Which statements safe mode runs is decided with every other mode's in
:mod:`castsql.engine.barrier.policy` (SELECT and EXPLAIN SELECT only). This module
holds what safe mode adds:

- DuckDB's own limits (:func:`lock_down`): DuckDB may touch only the opened
  tables' roots and the session's own work directory (``allowed_directories``
  with ``enable_external_access = false``): no other local file, no URL, no
  extension install or load, no ATTACH. DuckDB also lets a query read its
  temporary directory (``.tmp/`` under the current directory by default): it
  is moved into the work directory. Then the configuration is locked, after
  the session has blanked the S3 credential settings DuckDB copies from
  ``AWS_*`` variables (the credentials live in DuckDB's secret manager,
  which redacts them);
- checks of a SELECT's parse tree (:func:`check_select`): the arguments of
  table functions (``read_parquet(…)``, ``read_text(…)``) must be literals,
  so every path a query names is written in it; every URL literal must lie
  under an opened S3 warehouse's ``s3://bucket/prefix/``, with no query string
  or fragment (DuckDB honours ``?s3_endpoint=HOST`` and would send a signed
  request, access key id included, to that host) and no ``.``/``..``
  segment (DuckDB checks ``allowed_directories`` on the text of an ``s3://``
  path, and the server may resolve ``s3://b/t/../other`` elsewhere).

Independently of safe mode, a manifest or tombstone naming an object outside
its table root is refused in every mode (castsql.format.layout.to_table_key).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import duckdb

from castsql.engine.sql.quoting import sql_str
from castsql.errors import SafeModeError


def lock_down(con: duckdb.DuckDBPyConnection, allowed: list[str], temp_directory: str) -> None:
    """Restrict ``con`` to the ``allowed`` directory prefixes (local paths or s3:// URIs);
    ``temp_directory`` (inside one of them) replaces DuckDB's default ``.tmp``.

    The S3 credential settings must be blank already: once the configuration
    is locked nothing can blank them. The session does that first, with
    DuckDB wiring's :func:`castsql.engine.duckdb.duck.hide_credentials` (the
    barrier and the wiring are rooms that do not import each other)."""
    dirs = sorted({a.rstrip("/") + "/" for a in allowed})
    con.execute("SET temp_directory = ?", [temp_directory])
    con.execute("SET allowed_directories = ?", [dirs])
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET allow_unredacted_secrets = false")
    con.execute("SET enable_external_access = false")
    # The shell's text modes bound DuckDB's memory while they write (castsql.shell.pipe);
    # SQL cannot change it in safe mode anyway (policy.py refuses SET).
    con.execute("SET allowed_configs = ['memory_limit']")
    con.execute("SET lock_configuration = true")


def check_select(con: duckdb.DuckDBPyConnection, query: str, readable: Sequence[str]) -> None:
    """SafeModeError unless every table function of ``query`` takes literal
    arguments and every URL literal in it names an object under ``readable``
    (``s3://bucket/prefix`` of the opened warehouses)."""
    tree = serialized(con, query)
    if tree is None:
        # DuckDB cannot serialize it: let DuckDB report what is wrong with it (a
        # statement it cannot parse does not run either).
        try:
            con.extract_statements(query)
        except duckdb.Error:
            return
        raise SafeModeError("safe mode: this statement cannot be checked, so it is not allowed")
    _walk(tree)
    for url in literal_urls(tree):
        check_url(url, readable)


def check_url(url: str, readable: Sequence[str]) -> None:
    """SafeModeError unless ``url`` is a plain object URL under one of ``readable``."""
    path = url.split("://", 1)[1]
    if "?" in url or "#" in url:
        raise SafeModeError(
            f"safe mode: {url!r} holds a query string or fragment: URLs in SQL must be plain object paths"
        )
    if _DOT_SEGMENT.search(path):
        raise SafeModeError(f"safe mode: {url!r} holds a '.' or '..' path segment")
    prefixes = [r.rstrip("/") + "/" for r in readable if "://" in r]
    if not any(url.startswith(p) for p in prefixes):
        where = ", ".join(prefixes) or "none: this warehouse is on local disk"
        raise SafeModeError(
            f"safe mode: {url!r} is not an object of the opened warehouse (URLs allowed under: {where})"
        )


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


_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)


def literal_urls(tree: Any) -> list[str]:
    """Every string constant of a serialized statement that is a URL."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("class") == "CONSTANT":
                v = (node.get("value") or {}).get("value")
                if isinstance(v, str) and _URL.match(v):
                    out.append(v)
            elif node.get("type") == "BASE_TABLE":
                for k in ("table_name", "schema_name", "catalog_name"):
                    v = node.get(k)
                    if isinstance(v, str) and _URL.match(v):
                        out.append(v)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    return out


def serialized(con: duckdb.DuckDBPyConnection, query: str) -> dict | None:
    """DuckDB's parse tree of a SELECT, as JSON; None when it cannot serialize it."""
    try:
        raw = con.execute(f"SELECT json_serialize_sql({sql_str(query)})").fetchone()  # a literal: quoting.py
        tree = json.loads(raw[0]) if raw else {}
    except (duckdb.Error, ValueError):
        return None
    return None if tree.get("error", True) else tree
