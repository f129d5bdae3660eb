"""The start-up banner: what is open, the latest versions, and a first query that works.

Example (the tables of ``tests/support/tables.py``)::

    CastSQL (DuckDB 1.5.5): /data/warehouse
    Tables: events v6, users v1
    Try:    SELECT count(*) FROM events AS OF VERSION 5;
            .history events
    Statements end with ';'.  .help lists the commands, Ctrl-D quits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from castsql.shell.catalog import latest_versions, quote_ident

if TYPE_CHECKING:
    from castsql.engine import Session

MAX_BANNER_TABLES = 12


def suggested_version(session: Session, table: str, latest: int) -> int:
    """The version a first time-travel query should read: the one before the latest, if it is still kept."""
    if latest <= 0:
        return latest
    try:
        session.log(table).manifest(latest - 1)  # garbage collection may have removed it
    except Exception:
        return latest
    return latest - 1


def suggested_query(table: str, version: int) -> str:
    """A time-travel query that works on any table.

    Example::

        >>> suggested_query("events", 5)
        'SELECT count(*) FROM events AS OF VERSION 5;'
    """
    return f"SELECT count(*) FROM {quote_ident(table)} AS OF VERSION {version};"


def banner_text(session: Session) -> str:
    """The banner for ``session``; reads each table's latest version (in parallel) and nothing else."""
    where = ", ".join(session.uris) if session.uris else "no tables open (in-memory DuckDB)"
    lines = [f"CastSQL (DuckDB {duckdb.__version__}): {where}"]
    versions = latest_versions(session)
    if versions:
        listed = [f"{n} v{v}" if v is not None else f"{n} (unreadable)" for n, v in versions.items()]
        more = len(listed) - MAX_BANNER_TABLES
        shown = ", ".join(listed[:MAX_BANNER_TABLES]) + (f", … {more} more (.tables)" if more > 0 else "")
        lines.append(f"Tables: {shown}")
        first = next((n for n, v in versions.items() if v is not None), None)
        if first is not None:
            v = suggested_version(session, first, versions[first] or 0)
            lines.append(f"Try:    {suggested_query(first, v)}")
            lines.append(f"        .history {quote_ident(first)}")
    elif session.uris:
        lines.append("Tables: none yet (an empty warehouse; .open it again to see tables written since)")
    else:
        lines.append(
            "Open a table or a warehouse with .open URI (a local directory, s3://, gs:// or az://bucket/prefix)."
        )
    lines += [f"Skipped: {why}" for why in getattr(session, "skipped", [])]
    lines.append("Statements end with ';'.  .help lists the commands, Ctrl-D quits.")
    return "\n".join(lines)
