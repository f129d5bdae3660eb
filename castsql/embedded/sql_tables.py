"""SQL that makes or maintains a whole table, run as ``castsql.Table`` runs it:
``CREATE TABLE`` (``castsql.write_table``'s rules: the first rows checked
whole before version 0 exists), ``ALTER TABLE`` (``add_columns``,
``widen_columns``, ``set_properties``), ``RESTORE`` (``TableLog.restore``),
``OPTIMIZE`` (``Table.compact``) and ``VACUUM`` (``Table.gc``, its safety
rules whole: nothing younger than the grace period is removed, whatever
``RETAIN`` says). Parsed by :mod:`castsql.engine.writing.ddl`.

Example::

    >>> s.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR)")     # doctest: +SKIP
    >>> s.sql("RESTORE TABLE kv TO VERSION AS OF 0")                      # doctest: +SKIP
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from castsql.engine.messages import one_line
from castsql.engine.sql.quoting import ident
from castsql.engine.writing import ddl
from castsql.engine.writing.intercept import warehouse
from castsql.engine.writing.writes import WriteRefused, Written
from castsql.errors import WriteError
from castsql.format import TableLog
from castsql.format.log import commit_statement
from castsql.storage import open_storage

if TYPE_CHECKING:
    from castsql.engine.session import Session
    from castsql.format import Manifest

VACUUM_RETAIN = timedelta(hours=168)  # Delta's default retention: versions younger stay for time travel
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")


def run(session: Session, st: ddl.TableStatement, text: str) -> Written:
    """Run ``st`` (the statement ``text``) on ``session``."""
    with commit_statement(text):
        if isinstance(st, ddl.CreateTable):
            return _create(session, st)
        log = session.log(st.table)
        if isinstance(st, ddl.AlterTable):
            return _alter(session, log, st)
        if isinstance(st, ddl.Restore):
            version = st.version if st.timestamp is None else session.resolve_time(st.table, st.timestamp)
            assert version is not None
            return _done(session, st.table, "RESTORE", log.restore(version), 0)
        if isinstance(st, ddl.Optimize):
            from castsql.embedded.compactor import compact

            m = compact(session, st.table, sort_by=_column(session, st.table, st.sort_by) if st.sort_by else None)
            removed = int(m.summary.get("removed_files", 0)) if m is not None else 0
            return _done(
                session, st.table, "OPTIMIZE", m, 0, f"{removed} files compacted" if m else "nothing to compact"
            )
        return _vacuum(session, log, st)


def _done(session: Session, table: str, op: str, m: Manifest | None, n: int, detail: str | None = None) -> Written:
    if m is None:
        return Written(table, op, n, None, detail)
    session.log(table).followed(m.version)
    return Written(table, op, n, m.version, detail)


def _column(session: Session, table: str, name: str) -> str:
    have = session.snapshot(table).schema.names
    for c in have:
        if c.lower() == name.lower():
            return c
    raise WriteError(f"table {table}: no column {name!r} (columns: {', '.join(have)})")


def _create(session: Session, st: ddl.CreateTable) -> Written:
    from castsql.embedded.engine import Writer
    from castsql.format.datafiles import conform
    from castsql.write.keys import check_input_keys

    name = st.table
    if name.lower() in session.catalog.logs:
        if st.if_not_exists:
            return Written(session.catalog.name(name), "CREATE", 0, None, "exists already")
        v = session.log(name).latest_version()
        raise WriteRefused(
            f"CREATE TABLE {name}: table {name} exists (version {v}); CREATE TABLE IF NOT EXISTS skips it"
        )
    if not _TABLE_NAME.fullmatch(name):
        raise WriteRefused(
            f"CREATE TABLE {name!r}: a table name is a directory name of letters, digits, '_' and '-', "
            "starting with a letter or '_'"
        )
    root = warehouse(session)
    if root is None:  # parse() is not asked for CREATE TABLE without one
        raise WriteRefused(f"CREATE TABLE {name}: the session has no single warehouse to create it in")
    storage = open_storage(f"{root.rstrip('/')}/{name}", s3=session.s3)
    if next(iter(storage.list("")), None) is not None:
        raise WriteRefused(f"CREATE TABLE {name}: {storage.root} holds objects already and is no table; nothing made")
    data = _rows(session, st)
    pk = None
    if st.primary_key is not None:
        pk = next((c for c in data.column_names if c.lower() == st.primary_key.lower()), None)
        if pk is None:
            raise WriteRefused(f"CREATE TABLE {name}: primary key {st.primary_key} is not a column")
    props = dict(st.properties)
    schema = TableLog.check_create(storage, data.schema, primary_key=pk, properties=props)
    if st.query is not None:
        # Checked whole before version 0 exists, as castsql.write_table does:
        # a refused first write leaves no table behind.
        data = conform(data, schema, f"table {name}: create", primary_key=pk)
        if pk is not None:
            check_input_keys(name, pk, data.column(pk))
    TableLog.create(storage, schema, primary_key=pk, properties=props)
    session.open(storage.root)
    if st.query is None or data.num_rows == 0:
        return Written(name, "CREATE", 0, 0)
    m = Writer(session, name).append(data)
    return _done(session, name, "CREATE", m, data.num_rows)


def _rows(session: Session, st: ddl.CreateTable) -> pa.Table:
    """The new table's rows (none for a column list), in their Arrow types:
    DuckDB spells the types, as in its own CREATE TABLE."""
    if st.query is not None:
        return session.sql(st.query)
    cols = ", ".join(f"CAST(NULL AS {kind}) AS {ident(col)}" for col, kind in st.columns)
    try:
        return session.con.execute(f"SELECT {cols} LIMIT 0").to_arrow_table()
    except duckdb.Error as e:
        raise WriteError(f"CREATE TABLE {st.table}: {one_line(e)}") from None


def _arrow_types(session: Session, table: str, columns: dict[str, str], op: str) -> dict[str, pa.DataType]:
    cols = ", ".join(f"CAST(NULL AS {kind}) AS {ident(col)}" for col, kind in columns.items())
    try:
        schema = session.con.execute(f"SELECT {cols} LIMIT 0").to_arrow_table().schema
    except duckdb.Error as e:
        raise WriteError(f"table {table}: {op}: {one_line(e)}") from None
    return {f.name: f.type for f in schema}


def _alter(session: Session, log: TableLog, st: ddl.AlterTable) -> Written:
    if st.add:
        m = log.alter(add=_arrow_types(session, st.table, st.add, "ADD COLUMN"))
        return _done(session, st.table, "ALTER", m, 0)
    if st.widen:
        widen = {_column(session, st.table, c): t for c, t in st.widen.items()}
        m = log.alter(widen=_arrow_types(session, st.table, widen, "ALTER COLUMN"))
        return _done(session, st.table, "ALTER", m, 0)
    return _done(session, st.table, "SET PROPERTIES", log.set_properties(st.properties), 0)


def _vacuum(session: Session, log: TableLog, st: ddl.Vacuum) -> Written:
    from castsql.write.garbage import gc

    retain = VACUUM_RETAIN if st.retain_hours is None else timedelta(hours=st.retain_hours)
    report = gc(log.storage, older_than=retain, dry_run=st.dry_run)
    session.refresh()  # versions it dropped are no longer the session's to read
    return Written(st.table, "VACUUM", 0, None, report.summary())
