"""Audits of a table's history: what each version did, and which rows changed.

``history`` — one row per kept version: ``version, committed_at, operation,
writer, data_files, tombstone_files, files_added, files_removed, rows_added,
rows_deleted, live_rows``. Row counts are exact: computed from the resolved
snapshots (key ranges are counted with a metadata-only query), not copied from
what a writer claimed.

``changes`` — every row inserted or deleted by each version in (start, end],
with the table's columns plus ``_change_type`` ('insert' | 'delete'),
``_commit_version`` and ``_commit_timestamp`` (the names Delta Lake's change
data feed uses). Nothing has to be enabled in advance: a row is identified by
(data file, row position), so version v's changes are the rows live at v and
not at v-1 (inserts) and the reverse (deletes). Compactions rewrite rows
without changing them and contribute no changes; a row inserted and later
deleted in the range appears twice, like in a change feed.

In SQL: ``DESCRIBE HISTORY t``, ``SELECT * FROM table_history('t')`` and
``SELECT * FROM table_changes('t', start[, end])``: a query's plan
(:mod:`castsql.engine.plan`) finds the calls, :func:`register` runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from castsql.engine import names
from castsql.engine.quoting import ident
from castsql.engine.views import ROW_FILE, ROW_POS
from castsql.errors import CastSQLError, VersionNotFound
from castsql.snapshot import Snapshot, resolve

if TYPE_CHECKING:
    from castsql.engine.plan import AuditCall
    from castsql.engine.session import Session
    from castsql.format.schema import Schema

HISTORY_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("committed_at", pa.timestamp("us", tz="UTC")),
        ("operation", pa.string()),
        ("writer", pa.string()),
        ("data_files", pa.int64()),
        ("tombstone_files", pa.int64()),
        ("files_added", pa.int64()),
        ("files_removed", pa.int64()),
        ("rows_added", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("live_rows", pa.int64()),
        ("error", pa.string()),  # why this version cannot be read; NULL when it can
    ]
)

_NO_DATA_CHANGE = {"COMPACT", "OPTIMIZE"}


def live_rows(session: Session, table: str, snap: Snapshot) -> int:
    n = snap.live_rows
    if n is None:  # key ranges: count through the view
        view = session.version_view(table, snap.version)
        n = session.con.sql(f"SELECT count(*) FROM {ident(view)}").fetchone()[0]
    return n


def _live_in(session: Session, table: str, snap: Snapshot, keys: set[str]) -> int:
    files = snap.resolved(sorted(keys))
    return sum(f.total_rows - len(f.deleted) for f in files if not f.key_ranges) + _count_ranges(
        session, snap, [f for f in files if f.key_ranges]
    )


def _count_ranges(session: Session, snap: Snapshot, files: list) -> int:
    if not files:
        return 0
    sub = Snapshot(snap.table_uri, snap.version, snap.manifest, files, snap.primary_key)
    name = names.internal(
        "count", abs(hash((snap.table_uri, snap.version))), owner=snap.table_uri.rstrip("/").rsplit("/", 1)[-1]
    )
    session.views.create(name, sub)
    return session.con.sql(f"SELECT count(*) FROM {ident(name)}").fetchone()[0]


def history(session: Session, table: str) -> pa.Table:
    log = session.log(table)
    rows = []
    prev: Snapshot | None = None
    prev_live = 0
    # Versions come from the listing, and each is read on its own: a broken
    # version (latest or not: a bad manifest, a missing metadata object or
    # tombstone, metadata that disagrees with itself) gets a row saying what is
    # wrong in its error column, and the others still read (audits of old
    # versions matter most when the latest is broken).
    for v in log.versions():
        row: dict = {"version": v}
        try:
            m = log.manifest(v)
            row.update(
                committed_at=m.created_at,
                operation=m.operation,
                writer=m.writer,
                data_files=m.file_count,
                tombstone_files=m.tombstone_count,
            )
            snap = resolve(log, m.version)
            snap.read_objects()  # a missing or bad files object breaks the version: say so here
            live = live_rows(session, table, snap)
            added_files = removed_files = rows_added = rows_deleted = None
            if prev is not None and prev.version == m.version - 1:
                # Counted from the two versions' content, not from what the
                # manifest's change record claims.
                new_keys, gone_keys = snap.file_diff(prev)
                added_files, removed_files = len(new_keys), len(gone_keys)
                if (m.operation or "").upper() in _NO_DATA_CHANGE:
                    rows_added = rows_deleted = 0
                else:
                    rows_added = _live_in(session, table, snap, new_keys)
                    rows_deleted = prev_live + rows_added - live
        except (CastSQLError, duckdb.Error) as e:
            rows.append({**row, "error": str(e).splitlines()[0]})
            prev = None
            continue
        rows.append(
            {
                **row,
                "files_added": added_files,
                "files_removed": removed_files,
                "rows_added": rows_added,
                "rows_deleted": rows_deleted,
                "live_rows": live,
            }
        )
        prev, prev_live = snap, live
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def changes(session: Session, table: str, start: int, end: int | None = None) -> pa.Table:
    log = session.log(table)
    disp = session.catalog.name(table)
    # With both ends given the latest version is never read: changes between
    # old versions stay readable when the latest one is broken.
    try:
        end = log.latest_version() if end is None else log.manifest(end, probe=True).version
        if start > end:
            raise CastSQLError(f"table {disp}: table_changes start version {start} is after end version {end}")
        # GC keeps a contiguous run of versions up to the latest: if start is
        # still stored, so is every version after it.
        resolve(log, start, probe=True)
    except VersionNotFound as e:
        raise VersionNotFound(f"table {disp}: {str(e).split(': ', 1)[-1]}") from None
    parts: list[str] = []
    snap = resolve(log, end)
    for v in range(start + 1, end + 1):
        cur = resolve(log, v)  # raises VersionNotFound for a collected version
        prev = resolve(log, v - 1)
        if (cur.manifest.operation or "").upper() in _NO_DATA_CHANGE:
            continue
        ts = cur.manifest.created_at.isoformat()
        touched = cur.touched_since(prev)  # from the change record (format version 2)
        if touched is None:
            prev_files = {f.key: f for f in prev.files}
            cur_files = {f.key: f for f in cur.files}
            touched = {
                k
                for k in prev_files.keys() | cur_files.keys()
                if k not in prev_files
                or k not in cur_files
                or prev_files[k].deleted != cur_files[k].deleted
                or prev_files[k].key_ranges != cur_files[k].key_ranges
            }
        if not touched:
            continue
        # Every row in the end version's columns and types (FORMAT.md §3.4): a
        # column a version did not have yet is NULL, a since-widened one cast.
        pcols, ccols = _as_schema(prev.schema, snap.schema), _as_schema(cur.schema, snap.schema)
        pv = _positional_view(session, prev, prev.resolved(sorted(touched)), names.internal("chg", v, "a", owner=disp))
        cv = _positional_view(session, cur, cur.resolved(sorted(touched)), names.internal("chg", v, "b", owner=disp))
        meta = f"{v}::BIGINT AS _commit_version, TIMESTAMPTZ '{ts}' AS _commit_timestamp"
        parts.append(
            f"SELECT {ccols}, 'insert' AS _change_type, {meta} FROM {ident(cv)} AS c "
            f"ANTI JOIN {ident(pv)} AS p ON c.{ROW_FILE} = p.{ROW_FILE} AND c.{ROW_POS} = p.{ROW_POS}"
        )
        parts.append(
            f"SELECT {pcols}, 'delete' AS _change_type, {meta} FROM {ident(pv)} AS p "
            f"ANTI JOIN {ident(cv)} AS c ON c.{ROW_FILE} = p.{ROW_FILE} AND c.{ROW_POS} = p.{ROW_POS}"
        )
    if not parts:
        empty = pa.schema(
            [
                *list(snap.schema.to_arrow()),
                pa.field("_change_type", pa.string()),
                pa.field("_commit_version", pa.int64()),
                pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
            ]
        )
        return empty.empty_table()
    q = " UNION ALL ".join(parts) + " ORDER BY _commit_version, _change_type DESC"
    return session.con.sql(q).to_arrow_table()


def _as_schema(have: Schema, want: Schema) -> str:
    """Columns of a view of schema ``have`` as ``want``'s (a later schema of the same table)."""
    from castsql.engine.physical import duck_type

    out = []
    for c in want.columns:
        value = ident(c.name) if have.column(c.name) is not None else "NULL"
        out.append(f"CAST({value} AS {duck_type(c.type)}) AS {ident(c.name)}")
    return ", ".join(out)


def _positional_view(session: Session, snap: Snapshot, files: list, name: str) -> str:
    sub = Snapshot(snap.table_uri, snap.version, snap.manifest, files, snap.primary_key)
    session.views.create(name, sub, positions=True)
    return name


# ---------------------------------------------------------------- SQL forms


def register(session: Session, call: AuditCall) -> None:
    """Compute an audit call of a query's plan and register its result under the call's label."""
    changed = call.kind == "changes"
    result = changes(session, call.table, *call.versions) if changed else history(session, call.table)
    _register(session, call.label, result)


def _register(session: Session, name: str, table: pa.Table) -> str:
    session.con.register(name, table)
    return ident(name)
