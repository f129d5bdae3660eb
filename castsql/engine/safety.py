"""Safe mode: queries read the opened tables and nothing else.

- DuckDB may touch only the opened tables' roots and the session's own work
  directory (``allowed_directories`` with ``enable_external_access = false``):
  no other local file, no URL, no extension install or load, no ATTACH;
- the configuration is then locked, so no query can undo it;
- only read statements run (SELECT and EXPLAIN of one): DuckDB's
  ``allowed_directories`` would otherwise let ``COPY … TO`` write into a table.

Independently of safe mode, a manifest or tombstone naming an object outside
its table root is refused in every mode (castsql.format.layout.to_table_key).
"""

from __future__ import annotations

import re

import duckdb

from castsql.errors import CastSQLError


class SafeModeError(CastSQLError):
    """A statement or action that safe mode forbids."""


def lock_down(con: duckdb.DuckDBPyConnection, allowed: list[str]) -> None:
    """Restrict ``con`` to the ``allowed`` directory prefixes (local paths or s3:// URIs)."""
    dirs = sorted({a.rstrip("/") + "/" for a in allowed})
    con.execute("SET allowed_directories = ?", [dirs])
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALY[SZ]E)?\b", re.IGNORECASE)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise SafeModeError unless every statement of ``sql`` only reads."""
    for st in con.extract_statements(sql):
        kind = st.type
        if kind == duckdb.StatementType.EXPLAIN:
            inner = _EXPLAIN.sub("", st.query, count=1)
            inner_types = [s.type for s in con.extract_statements(inner)] if inner.strip() else []
            if inner_types and all(t == duckdb.StatementType.SELECT for t in inner_types):
                continue
        elif kind == duckdb.StatementType.SELECT:
            continue
        name = str(kind).rsplit(".", 1)[-1]
        raise SafeModeError(f"safe mode: {name} statements are not allowed (only SELECT and EXPLAIN SELECT)")
