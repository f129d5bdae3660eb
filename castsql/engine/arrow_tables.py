"""Arrow data into a DuckDB temp table without importing pandas.

Registering an Arrow table makes DuckDB's Python client import pandas
(0.2-0.5 s in a fresh process, see castsql.format.arrays); its C stream does
not. A stream is read once, so the rows are copied into a temp table.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from castsql.engine.sql.quoting import ident


def temp_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, select: str = "*") -> str:
    """Create (or replace) the temp table ``name`` as ``SELECT select`` over
    ``table``'s rows; returns its quoted name.

    >>> con = duckdb.connect()
    >>> temp_table(con, "t", pa.table({"a": pa.array([1, 2])}), "a * 10 AS a")
    '"t"'
    >>> con.sql("SELECT sum(a) FROM t").fetchone()
    (30,)
    """
    stream = f"{name}/arrow"
    con.register(stream, table.__arrow_c_stream__())
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {ident(name)} AS SELECT {select} FROM {ident(stream)}")
    finally:
        con.unregister(stream)
    return ident(name)
