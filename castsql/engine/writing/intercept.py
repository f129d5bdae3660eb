"""A session's statement that writes a table: recognised, checked against
the session's mode, and handed to the write pipeline.

The executor asks :func:`intercept` first, for every statement: rows
(:mod:`castsql.engine.writing.writes`) and whole tables (:mod:`castsql.engine.writing.ddl`)
are parsed there; this module refuses, before anything runs, what the
session may not do (safe mode, a read-only session, a write beside other
statements or inside an open transaction, ``DROP TABLE``) and calls the
runner the embedded engine registered (:func:`castsql.engine.writing.writes.register`).

Example::

    >>> intercept(session, "DELETE FROM events WHERE user_id = 42")   # doctest: +SKIP
    Written(table='events', operation='DELETE', count=17, version=8, detail=None)
"""

from __future__ import annotations

from typing import Any

from castsql.engine.writing import ddl
from castsql.engine.writing.writes import (
    Insert,
    Merge,
    WriteRefused,
    Written,
    _name,
    _w,
    parse,
    runner,
    statements,
    writes_table,
)

_HEADS = ("delete", "update", "insert", "merge", "truncate", "drop", *ddl.HEADS)

DROP_WHY = (
    "SQL never deletes a table: DROP TABLE would delete every version at once, which no time travel or audit "
    "can undo (castsql gc keeps every version younger than its grace period for the same reason); "
    "to remove the table, delete its directory yourself"
)


def warehouse(session: Any) -> str | None:
    """The one warehouse ``session`` opened (where ``CREATE TABLE`` makes a
    table), or None: no warehouse, or several (which one would be a guess)."""
    tables = {log.storage.root.rstrip("/") for log in session.catalog.logs.values()}
    found = [u for u in session.catalog.uris if u.rstrip("/") not in tables]
    return found[0] if len(found) == 1 else None


def intercept(session: Any, sql: str, params: Any = None) -> Written | None:
    """Run ``sql`` through the write pipeline when it writes one of
    ``session``'s tables; None when it does not (it then runs as any other
    statement, and the policy refuses what it must). Refused in one line,
    with nothing run: any write in safe mode or in a read-only session, a
    write beside other statements or inside a transaction, parameters
    where the pipeline cannot take them."""
    low = sql.lower()
    if not any(h in low for h in _HEADS):
        return None  # most statements: not a word of a write in them
    logs = session.catalog.logs

    def is_table(name: str) -> bool:
        return name.lower() in logs

    if not statements(sql):
        return None
    if len(statements(sql)) > 1:
        table = writes_table(sql, is_table)
        if table is not None:
            _refuse_mode(session, "a write", table)
            raise WriteRefused(
                f"a write to table {table} must be a statement of its own: each statement that writes a "
                "CastSQL table commits one version (there is no BEGIN … COMMIT around several)"
            )
        return None
    toks = statements(sql)[0] if sql.strip() else []
    if [_w(t) for t in toks[:2]] == ["DROP", "TABLE"]:
        i = 4 if [_w(t) for t in toks[2:4]] == ["IF", "EXISTS"] else 2
        name = _name(toks, i)
        if name is not None and is_table(name):
            raise WriteRefused(f"DROP TABLE {name}: {DROP_WHY}")
    try:
        write: Any = parse(sql, is_table) or ddl.parse(sql, is_table, can_create=warehouse(session) is not None)
    except WriteRefused:
        if session.safe or session.read_only:
            table = writes_table(sql, is_table) or "?"
            _refuse_mode(session, _w(statements(sql)[0][0]), table)
        raise
    if write is None:
        return None
    _refuse_mode(session, _w(statements(sql)[0][0]), write.table)
    if params and not isinstance(write, Insert | Merge | ddl.CreateTable):
        raise WriteRefused(
            f"{_w(statements(sql)[0][0])} of table {write.table}: parameters are not supported here; "
            "write the values in the statement"
        )
    if session.in_transaction():
        raise WriteRefused(
            f"{_w(statements(sql)[0][0])} of table {write.table} inside a transaction: each statement that writes "
            "a CastSQL table is its own version; COMMIT or ROLLBACK first"
        )
    run = runner()
    if run is None:
        raise WriteRefused("writing tables from SQL needs castsql's embedded engine: import castsql first")
    written: Written = run(session, write, sql, params)
    return written


def _refuse_mode(session: Any, what: str, table: str) -> None:
    from castsql.errors import SafeModeError

    if session.safe:
        raise SafeModeError(
            f"safe mode: {what} of table {table} is not allowed (safe mode reads the opened tables and nothing else)"
        )
    if session.read_only:
        raise WriteRefused(
            f"read-only session: {what} of table {table} is refused (opened with -readonly or read_only=True)"
        )
