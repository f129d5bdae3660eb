"""SQL writes run through the write pipeline: what a session does with a
``DELETE``, ``UPDATE``, ``INSERT`` or ``MERGE INTO`` of one of its tables.

Each statement (parsed by :mod:`castsql.engine.writing.writes`) becomes the call
``castsql.Table`` makes for the same write, on the same engine
(:class:`castsql.embedded.engine.Writer`): ``DELETE`` is ``Table.delete``,
``UPDATE`` is ``Table.update``, ``INSERT`` runs its ``VALUES`` or query
through the session's read path to Arrow (time travel, other tables and, out
of safe mode, ``read_parquet``) and is ``Table.append``; ``MERGE INTO`` reads
its source the same way and is ``Table.merge`` with the statement's clauses.
So each commits one version, keys enforced, conflicts retried, after-commit
hooks run; the statement's text is recorded in the version's summary
(``statement``) for history.

Example::

    >>> import castsql                                                   # doctest: +SKIP
    >>> s = castsql.connect("./warehouse")                              # doctest: +SKIP
    >>> s.sql("DELETE FROM events WHERE user_id = 42").to_pylist()      # doctest: +SKIP
    [{'count': 17}]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from castsql.engine.messages import one_line
from castsql.engine.physical import duck_type
from castsql.engine.sql.quoting import ident
from castsql.engine.writing import writes
from castsql.errors import CastSQLError, WriteError
from castsql.format.log import commit_statement

if TYPE_CHECKING:
    from castsql.embedded.engine import Writer
    from castsql.engine.session import Session
    from castsql.engine.writing.ddl import TableStatement
    from castsql.format import Manifest
    from castsql.snapshot import Snapshot


def run(session: Session, write: writes.Write | TableStatement, text: str, params: Any = None) -> writes.Written:
    """Run ``write`` (the statement ``text``) on ``session``'s table: one version, or none when no row changes."""
    from castsql.embedded.engine import Writer

    if not isinstance(write, writes.Delete | writes.Update | writes.Insert | writes.Merge):
        from castsql.embedded import sql_tables

        return sql_tables.run(session, write, text)
    writer = Writer(session, write.table)
    try:
        return _run(session, writer, write, text, params)
    except CastSQLError as e:
        raise _in_sql_words(e, write.table) from None


# The API's name of each operation, as its errors begin, and the statement's.
_SQL_WORDS = {"append": "INSERT", "delete": "DELETE", "update": "UPDATE", "merge": "MERGE"}
_API_HINT = " (allow_duplicate_keys=True / --allow-duplicate-keys writes them anyway)"


def _in_sql_words(e: CastSQLError, table: str) -> CastSQLError:
    """``e`` as a person who typed the statement reads it: ``table t: INSERT: …``
    rather than the pipeline's ``append``, without the API's switch to allow
    duplicate keys (SQL has none). Same class, so callers catch as before."""
    msg = str(e)
    for api, sql in _SQL_WORDS.items():
        head = f"table {table}: {api}"
        if msg.startswith(head + ":") or msg.startswith(head + " "):
            msg = f"table {table}: {sql}" + msg[len(head) :]
            break
    e.args = (msg.replace(_API_HINT, ""),)
    return e


def _run(session: Session, writer: Writer, write: writes.Write, text: str, params: Any) -> writes.Written:
    with commit_statement(text):
        if isinstance(write, writes.Delete):
            m = writer.delete(write.where if write.where is not None else "TRUE")
            return _done(session, write, "DELETE", m, "deleted_rows")
        if isinstance(write, writes.Update):
            snap = session.snapshot(write.table)
            m = writer.update(_typed(snap, _columns(snap, write.set, write.table, "UPDATE")), write.where)
            return _done(session, write, "UPDATE", m, "updated_rows")
        if isinstance(write, writes.Insert):
            rows = _insert_rows(session, write, params)
            m = writer.append(rows) if rows.num_rows else None
            return _done(session, write, "INSERT", m, "added_rows")
        return _merge(session, writer, write, params)


def _done(session: Session, write: writes.Write, op: str, m: Manifest | None, counted: str) -> writes.Written:
    if m is None:
        return writes.Written(write.table, op, 0, None)
    session.log(write.table).followed(m.version)  # an automatic compaction after it is the session's next read
    return writes.Written(write.table, op, int(m.summary.get(counted, 0)), m.version)


def _columns(snap: Snapshot, names: dict[str, str], table: str, op: str) -> dict[str, str]:
    """``names`` keyed by the table's own spelling of each column (SQL names are case-insensitive)."""
    have = {c.lower(): c for c in snap.schema.names}
    out = {}
    for name, value in names.items():
        col = have.get(name.lower())
        if col is None:
            raise WriteError(f"table {table}: {op}: no column {name!r} (columns: {', '.join(snap.schema.names)})")
        out[col] = value
    return out


def _typed(snap: Snapshot, sets: dict[str, str]) -> dict[str, str]:
    """Each expression cast to its column's type, as DuckDB's own UPDATE and
    MERGE cast what they store (``SET amount = 1.5`` into a DOUBLE column;
    the pipeline itself takes only lossless types)."""
    types = {c.name: c.type for c in snap.schema.columns}
    return {col: f"CAST(({expr}\n) AS {duck_type(types[col])})" for col, expr in sets.items()}


# Spellings of UTC: DuckDB answers ``Etc/UTC`` for a table's ``UTC``.
_UTC = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "GMT", "Etc/GMT", "Z", "+00:00"})


def _utc_relabelled(data: pa.Table, snap: Snapshot) -> pa.Table:
    """``data`` with a timestamp whose time zone is another spelling of the
    table's UTC labelled as the table's: the same instants, so Arrow relabels
    it without a copy, where DuckDB's cast would read every row again (a
    10M-row ``INSERT … SELECT`` from Parquet paid a second pass for it)."""
    want = {f.name.lower(): f.type for f in snap.schema.to_arrow()}
    fields = list(data.schema)
    for i, f in enumerate(fields):
        w = want.get(f.name.lower())
        if (
            w is not None
            and pa.types.is_timestamp(f.type)
            and pa.types.is_timestamp(w)
            and f.type != w
            and f.type.unit == w.unit
            and f.type.tz in _UTC
            and w.tz in _UTC
        ):
            fields[i] = f.with_type(w)
    if fields == list(data.schema):
        return data
    return data.cast(pa.schema(fields, metadata=data.schema.metadata))


def _as_table_types(session: Session, data: pa.Table, snap: Snapshot, table: str, op: str) -> pa.Table:
    """``data``'s columns that are the table's (by name, any case) cast by
    DuckDB to the table's types, the others kept: a ``VALUES`` list's ``1.5``
    is a DECIMAL to DuckDB, and ``MERGE`` stores it in a DOUBLE as DuckDB would."""
    types = {c.name.lower(): c.type for c in snap.schema.columns}
    data = _utc_relabelled(data, snap)
    if all(types.get(f.name.lower()) in (None, str(f.type)) for f in data.schema):
        return data  # already the table's types (an Arrow source): nothing to cast
    raw = data.rename_columns([f"c{i}" for i in range(data.num_columns)])
    cols = ", ".join(
        f"CAST(c{i} AS {duck_type(types[n.lower()])}) AS {ident(n)}" if n.lower() in types else f"c{i} AS {ident(n)}"
        for i, n in enumerate(data.column_names)
    )
    name = f"{table}$source"
    session.con.register(name, raw)
    try:
        return session.con.execute(f"SELECT {cols} FROM {ident(name)}").to_arrow_table()
    except duckdb.Error as e:
        raise WriteError(f"table {table}: {op}: {one_line(e)}; nothing was committed") from None
    finally:
        session.con.unregister(name)


def _insert_rows(session: Session, write: writes.Insert, params: Any) -> pa.Table:
    """The rows ``INSERT`` gives, in the table's columns and types: its query
    run through the session (so ``AS OF``, other tables and safe mode's
    rules hold for it), its values cast by DuckDB to the columns' types as
    DuckDB's own ``INSERT`` casts them."""
    table = write.table
    snap = session.snapshot(table)
    source = session.sql(f"SELECT * FROM ({write.source}\n)", params)
    names = snap.schema.names
    if write.by_name:
        targets = list(_columns(snap, {c: c for c in source.column_names}, table, "INSERT").keys())
    elif write.columns is not None:
        targets = list(_columns(snap, {c: c for c in write.columns}, table, "INSERT").keys())
    else:
        targets = names
    if len(set(t.lower() for t in targets)) != len(targets):
        raise WriteError(f"table {table}: INSERT: a column is named twice")
    if source.num_columns != len(targets):
        raise WriteError(
            f"table {table}: INSERT gives {source.num_columns} value{'s' * (source.num_columns != 1)} per row "
            f"for {len(targets)} column{'s' * (len(targets) != 1)} ({', '.join(targets)})"
        )
    return _as_table_types(session, source.rename_columns(targets), snap, table, "INSERT")


def _merge_keys(snap: Snapshot, write: writes.Merge) -> tuple[str, ...] | None:
    """The columns ``ON t.k = s.k [AND …]`` matches on, for the pipeline's keyed
    merge; None (the condition as written) when a clause updates one of them:
    SQL's ``ON`` is a condition, and Delta's ``MERGE`` may set the column it
    joins on, where ``Table.merge(on="k")`` refuses to."""
    if write.keys is None:
        return None
    keys = tuple(_columns(snap, {k: k for k in write.keys}, write.table, "MERGE").keys())
    lower = {k.lower() for k in keys}
    for c in write.clauses:
        if c.kind.endswith("_update") and c.set is not None and lower & {n.lower() for n in c.set}:
            return None
    return keys


def _merge(session: Session, writer: Writer, write: writes.Merge, params: Any) -> writes.Written:
    from castsql.write.merge import Clause, MergeBuilder, MergeMetrics, MergeSpec

    snap = session.snapshot(write.table)
    source = _as_table_types(session, session.sql(f"SELECT * FROM {write.source}", params), snap, write.table, "MERGE")

    def execute(spec: MergeSpec, src: Any) -> MergeMetrics:
        return writer.merge(spec, src)

    on: str | tuple[str, ...] = write.on
    keys = _merge_keys(snap, write)
    if keys is not None:
        on = keys
    builder = MergeBuilder(
        write.table, source, on, execute, source_alias=write.source_alias, target_alias=write.target_alias
    )
    for c in write.clauses:
        values: dict[str, str] | None = c.set
        if c.values is not None:
            names = snap.schema.names
            if len(c.values) != len(names):
                raise WriteError(
                    f"table {write.table}: MERGE: INSERT VALUES gives {len(c.values)} values for "
                    f"{len(names)} columns ({', '.join(names)})"
                )
            values = _typed(snap, dict(zip(names, c.values, strict=True)))
        elif values is not None:
            values = _typed(snap, _columns(snap, values, write.table, "MERGE"))
        builder.add(Clause(c.kind, c.condition, values))
    metrics = builder.execute()
    n = metrics.num_target_rows_inserted + metrics.num_target_rows_updated + metrics.num_target_rows_deleted
    if metrics.version is not None:
        session.log(write.table).followed(metrics.version)
    return writes.Written(write.table, "MERGE", n, metrics.version)


writes.register(run)
