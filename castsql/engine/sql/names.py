"""Names of CastSQL's own DuckDB objects, and the user's spelling of them.

A table's name is a directory name (or an S3 key component), so it can never
hold ``/``. Every name CastSQL gives its own views, temp tables and
registered Arrow tables does, and starts with ``castsql/``: no table name the
format allows can equal one, whatever it holds (``events@v1``, ``t$del0``,
quotes). The table a name belongs to is always its last component.

``castsql/v/<version>/<table>``            a version of a table (``t AS OF VERSION n``)
``castsql/p/<seq>/<version|latest>/<table>``  a file set pruned from one for a query
``castsql/<kind>/<…>/<view>``              what a view owns (anti-join positions …)

The session's DuckLake catalog (:mod:`castsql.engine.duckdb.lake`) cannot
have a ``/`` in its name: it is :data:`LAKE_CATALOG`, and DuckDB attaches its
metadata as :data:`LAKE_METADATA`. DuckDB wiring makes them; the barrier
refuses every statement that names them (:mod:`castsql.engine.barrier.guard`).

:func:`user_spelling` rewrites them in a message to what the user typed
(``events AS OF VERSION 1``), so no internal name reaches the user.

Example::

    >>> version_view("events@v1", 1)
    'castsql/v/1/events@v1'
    >>> user_spelling('Binder Error: view "castsql/v/1/events" failed')
    'Binder Error: view events AS OF VERSION 1 failed'
"""

from __future__ import annotations

import re

PREFIX = "castsql/"
TABLES = "castsql/tables"  # SHOW TABLES' answer
LAKE_CATALOG = "castsql_lake"
LAKE_METADATA = f"__ducklake_metadata_{LAKE_CATALOG}"  # the name DuckLake gives its metadata database


def internal(kind: str, *parts: object, owner: str) -> str:
    """The name of an internal object of ``kind``; ``owner`` (a table or an
    internal view) comes last, so :func:`table_of` finds its table."""
    return "/".join(["castsql", kind, *(str(p) for p in parts), owner])


def version_view(table: str, version: int) -> str:
    return internal("v", version, owner=table)


def pruned_view(view: str, seq: int) -> str:
    """A file set pruned from ``view`` (a table's latest view or a version view)."""
    m = _VERSION.fullmatch(view)
    if m:
        return internal("p", seq, m.group(1), owner=m.group(2))
    return internal("p", seq, "latest", owner=view)


def is_internal(name: str) -> bool:
    return name.lower().startswith(PREFIX)


def table_of(name: str) -> str:
    """The table an internal name belongs to (a table's own name for itself)."""
    return name.rsplit("/", 1)[-1]


_VERSION = re.compile(r"castsql/v/(\d+)/([^/]*)")


# A name as DuckDB prints it: in double quotes (any characters but a quote), or bare.
_NAME = r'(?:"castsql/(?P<q>(?:[^"]|"")*)"|castsql/(?P<b>[^\s"\'!,;:()]+))'


def user_spelling(message: str) -> str:
    """``message`` with every internal name replaced by what the user wrote:
    ``events AS OF VERSION 1`` for a version (or a file set pruned from one),
    the table's name for the rest."""
    if PREFIX not in message.lower():
        return message

    def spell(m: re.Match) -> str:
        quoted = m.group("q")
        parts = (quoted.replace('""', '"') if quoted is not None else m.group("b")).split("/")
        table = parts[-1]
        if parts[0] == "v" and len(parts) == 3 and parts[1].isdigit():
            return f"{table} AS OF VERSION {parts[1]}"
        if parts[0] == "p" and len(parts) == 4 and parts[2].isdigit():
            return f"{table} AS OF VERSION {parts[2]}"
        return table

    return re.sub(_NAME, spell, message, flags=re.IGNORECASE)
