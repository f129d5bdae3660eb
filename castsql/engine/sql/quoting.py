"""SQL literals and identifiers, spelled out in the statement text.

The engine writes values into its own statements as literals rather than bound
parameters on every path a first read takes: DuckDB's Python client imports
pandas (0.2-0.5 s) the first time it binds any parameter, and a script that
opens a table and reads it once would pay that on every run
(docs/PERFORMANCE.md, "The first read in a fresh process").

    >>> sql_str("it's"), ident('a"b'), sql_list(["x", "y"])
    ("'it''s'", '"a""b"', "['x', 'y']")
    >>> sql_value(date(2024, 5, 1)), sql_value(-3), sql_value(None)
    ("DATE '2024-05-01'", '-3', 'NULL')
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any


def sql_str(s: str) -> str:
    """A string literal (DuckDB's strings have no backslash escapes; only ``'`` is doubled)."""
    return "'" + s.replace("'", "''") + "'"


def ident(s: str) -> str:
    """A quoted identifier."""
    return '"' + s.replace('"', '""') + '"'


def sql_list(values: Sequence[str]) -> str:
    """A list literal of strings."""
    return "[" + ", ".join(sql_str(v) for v in values) + "]"


def parquet_files(uris: Sequence[str]) -> str:
    """``read_parquet`` of data files, as CastSQL scans its own: without hive
    partitioning, whose detection would read 7 for the column ``v`` of a
    table stored under a folder named ``v=7``.

    >>> parquet_files(["/t/a.parquet"])
    "read_parquet(['/t/a.parquet'], hive_partitioning = false)"
    """
    return f"read_parquet({sql_list(uris)}, hive_partitioning = false)"


def live_parquet(uris: Sequence[str], set_id: int) -> str:
    """``"castsql/parquet"`` (CastSQL's extension: ``read_parquet`` that skips
    the positions bound in set ``set_id``) of data files; no hive
    partitioning, as files are matched to bitmaps by their index in the list.

    >>> print(live_parquet(["/t/a.parquet"], 3))
    "castsql/parquet"(['/t/a.parquet'], castsql_set=3, hive_partitioning=false)
    """
    return f'"castsql/parquet"({sql_list(uris)}, castsql_set={set_id}, hive_partitioning=false)'


def sql_value(value: Any) -> str:
    """A literal of the type DuckDB would bind ``value`` as (None, bool, int,
    float, Decimal, str, date, datetime); TypeError for anything else."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"CAST({sql_str(repr(value))} AS DOUBLE)"  # nan and inf too
    if isinstance(value, Decimal):
        return sql_str(str(value)) if not value.is_finite() else str(value)
    if isinstance(value, str):
        return sql_str(value)
    if isinstance(value, datetime):
        kind = "TIMESTAMPTZ" if value.tzinfo is not None else "TIMESTAMP"
        return f"{kind} {sql_str(value.isoformat(sep=' '))}"
    if isinstance(value, date):
        return f"DATE {sql_str(value.isoformat())}"
    raise TypeError(f"no SQL literal for {type(value).__name__}")
