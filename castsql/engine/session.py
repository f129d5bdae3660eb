"""A CastSQL session: tables by name, SQL with time travel, Arrow out.

Each table is a DuckDB view of the live rows of its latest version; every query
first checks which version is latest (one pointer read, one probe), so a new
commit is seen by the next query without reopening anything. ``t AS OF
VERSION n`` and friends are rewritten to views of that version (see
:mod:`castsql.engine.rewrite`). Every version a query sees is fixed for the
whole query: snapshot isolation.

Example::

    >>> import pyarrow as pa, tempfile, os
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files
    >>> root = os.path.join(tempfile.mkdtemp(), "events")
    >>> log = TableLog.create(open_storage(root), pa.schema([("id", pa.int64())]))
    >>> _ = log.append(write_data_files(log.storage, pa.table({"id": [1, 2, 3]})))
    >>> s = Session(root)
    >>> s.sql("SELECT count(*) AS n FROM events").to_pylist()
    [{'n': 3}]
    >>> s.sql("SELECT count(*) AS n FROM events AS OF VERSION 0").to_pylist()
    [{'n': 0}]
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

from castsql.engine import audit
from castsql.engine.duck import configure_s3, load_httpfs, new_connection
from castsql.engine.pushdown import TableRef, duck_value, table_refs
from castsql.engine.rewrite import TimeTravel, referenced_names, rewrite, tokenize
from castsql.engine.safety import SafeModeError, check_read_only, lock_down
from castsql.engine.views import Views, ident
from castsql.errors import CastSQLError, TableNotFound, VersionNotFound
from castsql.format import TableLog
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.manifest import parse_time
from castsql.snapshot import Predicate, Snapshot, prune_files, resolve
from castsql.storage import S3Config, Storage, open_storage


class QueryError(CastSQLError):
    """DuckDB refused or failed a query; the message is DuckDB's."""


def _is_table(storage: Storage) -> bool:
    return storage.exists(POINTER_KEY) or storage.exists(manifest_key(0))


class Session:
    """SQL over CastSQL tables. Open a table (named by the last component of
    its path) or a warehouse (a directory or prefix of tables, each named by
    its sub-directory)."""

    def __init__(
        self,
        uri: str | None = None,
        *,
        s3: S3Config | None = None,
        threads: int | None = None,
        connection: duckdb.DuckDBPyConnection | None = None,
        safe: bool = False,
    ) -> None:
        self.con = connection or new_connection(threads=threads)
        self._workdir = tempfile.mkdtemp(prefix="castsql-session-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        self.views = Views(self.con, self._workdir)
        self.s3 = s3
        self._logs: dict[str, TableLog] = {}
        self._display: dict[str, str] = {}
        self._latest: dict[str, int] = {}  # table -> version its plain view shows
        self._pinned: set[str] = set()  # version views already created
        # view name (lower) -> the snapshot it shows, for views whose files a query may prune
        self._view_snaps: dict[str, Snapshot] = {}
        # (view, version, predicates) -> view of the files they may match, None if every file
        self._pruned: OrderedDict[tuple, str | None] = OrderedDict()
        self._pruned_seq = itertools.count()
        self._refs_cache: OrderedDict[str, list[TableRef]] = OrderedDict()
        self._s3_ready = False
        self.uris: list[str] = []
        self.safe = False
        if uri is not None:
            self.open(uri)
        if safe:
            self._lock_down()

    def _lock_down(self) -> None:
        """Enter safe mode (see :mod:`castsql.engine.safety`); there is no way back."""
        if not self._s3_ready:
            load_httpfs(self.con)  # extensions cannot be loaded once locked
        self.views.lake  # noqa: B018 - attach DuckLake while that is still allowed
        lock_down(self.con, [*self.uris, self._workdir])
        self.safe = True

    # ------------------------------------------------------------ catalog

    def open(self, uri: str, name: str | None = None) -> list[str]:
        """Add a table or every table of a warehouse; returns the names added."""
        if self.safe:
            raise SafeModeError(f"safe mode: cannot open {uri}; tables are fixed when a safe session starts")
        storage = open_storage(uri, s3=self.s3)
        if storage.root.startswith("s3://") and not self._s3_ready:
            configure_s3(self.con, getattr(storage, "config", None) or self.s3 or S3Config.from_env())
            self._s3_ready = True
        if _is_table(storage):
            found = {name or storage.root.rstrip("/").rsplit("/", 1)[-1]: storage}
        else:
            found = {}
            for child in storage.list_dirs():
                sub = storage.child(child)
                if _is_table(sub):
                    found[child] = sub
            if not found:
                raise TableNotFound(f"{storage.root}: neither a table nor a warehouse of tables")
        for n, st in found.items():
            self._logs[n.lower()] = TableLog(st)
            self._display[n.lower()] = n
            self._latest.pop(n.lower(), None)
        self.uris.append(storage.root)
        return list(found)

    @property
    def tables(self) -> list[str]:
        return sorted(self._display.values())

    def log(self, table: str) -> TableLog:
        """The version log of ``table``; TableNotFound names the known tables."""
        try:
            return self._logs[table.lower()]
        except KeyError:
            known = ", ".join(self.tables) or "none"
            raise TableNotFound(f"no table named {table!r} (tables: {known})") from None

    def snapshot(self, table: str, version: int | None = None) -> Snapshot:
        """``table`` at ``version`` (default: latest), resolved; a collected version is refused."""
        return resolve(self.log(table), version, probe=version is not None)

    def refresh(self) -> None:
        """Forget cached state; the next query re-reads every table."""
        self._latest.clear()

    # ------------------------------------------------------------ views

    def _sync_latest(self, table: str) -> None:
        key = table.lower()
        snap = resolve(self._logs[key])
        if self._latest.get(key) != snap.version:
            self._create_view(self._display[key], snap, self._display[key])
            self._latest[key] = snap.version
        self._note_prunable(key, snap)

    def _create_view(self, name: str, snap: Snapshot, table: str, **kw: Any) -> None:
        try:
            self.views.create(name, snap, **kw)
        except duckdb.Error as e:
            raise QueryError(f"table {table} version {snap.version}: {_one_line(e)}") from None

    def version_view(self, table: str, version: int) -> str:
        """Name of a view of ``table`` at ``version`` (created on first use)."""
        log = self.log(table)
        disp = self._display[table.lower()]
        name = f"{disp}@v{version}"
        # A version's rows never change, but GC can drop the version: the probe
        # (one existence check per time-travel query) refuses a collected
        # version in a long-lived session just as in a new one.
        try:
            snap = resolve(log, version, probe=True)
        except VersionNotFound as e:
            self._pinned.discard(name)
            raise VersionNotFound(f"table {disp}: {str(e).split(': ', 1)[-1]}") from None
        if name not in self._pinned:
            self._create_view(name, snap, disp)
            self._pinned.add(name)
        self._note_prunable(name.lower(), snap)
        return name

    def _note_prunable(self, view: str, snap: Snapshot) -> None:
        if self._view_snaps.get(view) is snap:
            return
        if len(snap.files) > 1:
            self._view_snaps[view] = snap
        else:
            self._view_snaps.pop(view, None)

    def resolve_time(self, table: str, when: str | datetime) -> int:
        log = self.log(table)
        try:
            t = parse_time(when) if isinstance(when, str) else when
        except ValueError:
            raise CastSQLError(f"table {table}: {when!r} is not a timestamp") from None
        try:
            return log.version_at(t)
        except VersionNotFound as e:
            raise VersionNotFound(f"table {self._display[table.lower()]}: {str(e).split(': ', 1)[-1]}") from None

    def _replace(self, ref: TimeTravel) -> str:
        table = ref.name[-1]
        version = ref.version if ref.version is not None else self.resolve_time(table, ref.timestamp or "")
        return ident(self.version_view(table, version))

    def prepare(self, sql: str) -> str:
        """``sql`` with time travel and audit calls rewritten, every view it needs in place."""
        if [t.word for t in tokenize(sql) if t.text != ";"] == ["SHOW", "TABLES"]:
            # The opened tables, not DuckDB's temp views (versions, pruned file sets).
            self.con.register(_TABLES_VIEW, pa.table({"name": pa.array(self.tables, pa.string())}))
            return f"SELECT name FROM {_TABLES_VIEW} ORDER BY name"
        sql = audit.rewrite_audit_calls(self, sql)
        sql, _ = rewrite(sql, self._replace)
        for name in referenced_names(sql):
            if name in self._logs:
                self._sync_latest(name)
        return self._prune(sql)

    def _prune(self, sql: str) -> str:
        """``sql`` reading, for each table reference bounded by comparisons in
        its WHERE, a view of only the files whose manifest min/max can match
        (see :mod:`castsql.engine.pushdown`)."""
        if not self._view_snaps:
            return sql
        # EXPLAIN [ANALYZE] shows the plan of the statement as it will run.
        toks = tokenize(sql)
        if not any(t.word == "WHERE" for t in toks):
            return sql
        skip = 0
        while skip < len(toks) and toks[skip].word in ("EXPLAIN", "ANALYZE"):
            skip += 1
        offset = toks[skip].start if 0 < skip < len(toks) else 0
        shift = len(sql[:offset].encode())
        edits: list[tuple[int, bool, str]] = []
        for ref in self._table_refs(sql[offset:]):
            snap = self._view_snaps.get(ref.name)
            if snap is None:
                continue
            columns = {c.name.lower(): c for c in snap.schema.columns}
            preds = []
            for col, op, value, vtype in ref.conditions:
                c = columns.get(col)
                v = None if c is None else duck_value(self.con, value, vtype, c.type)
                if v is not None:
                    preds.append(Predicate(c.name, op, v))
            if not preds:
                continue
            view = self._view_for(ref.name, snap, tuple(preds))
            if view is not None:
                edits.append((ref.location + shift, ref.has_alias, view))
        return _replace_names(sql, edits) if edits else sql

    def _table_refs(self, sql: str) -> list[TableRef]:
        # The parse (~0.3 ms) depends on the text alone: repeated queries skip it.
        refs = self._refs_cache.get(sql)
        if refs is None:
            refs = table_refs(self.con, sql)
            self._refs_cache[sql] = refs
            while len(self._refs_cache) > 256:
                self._refs_cache.popitem(last=False)
        else:
            self._refs_cache.move_to_end(sql)
        return refs

    def _view_for(self, view: str, snap: Snapshot, preds: tuple[Predicate, ...]) -> str | None:
        """The view of ``snap``'s files that ``preds`` may match, or None if that is every file.
        Remembered per predicate set: pruning 100,000 files takes ~60 ms."""
        key = (view, snap.version, preds)
        if key in self._pruned:
            self._pruned.move_to_end(key)
            return self._pruned[key]
        files = prune_files(snap.files, preds, {c.name: c.type for c in snap.schema.columns})
        # If files with deletes are left, the version's DuckLake table is the
        # better view: it skips files by its own per-file statistics, and a new
        # DuckLake table per file set would cost more than it saves. Files
        # without deletes become a plain read_parquet, without DuckLake's
        # per-query cost (bench/prune_bench.py).
        name = None
        if len(files) < len(snap.files) and not any(f.has_deletes for f in files):
            name = f"{view}#p{next(self._pruned_seq)}"
            sub = Snapshot(snap.table_uri, snap.version, snap.manifest, files, snap.primary_key)
            self._create_view(name, sub, view)
        self._pruned[key] = name
        while len(self._pruned) > _PRUNED_VIEWS:
            _, old = self._pruned.popitem(last=False)
            if old is not None:
                self.views.drop(old)
        return name

    # ------------------------------------------------------------ queries

    def _run(self, sql: str) -> duckdb.DuckDBPyRelation | None:
        prepared = self.prepare(sql)
        try:
            if self.safe:
                check_read_only(self.con, prepared)
            return self.con.sql(prepared)
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None

    def sql(self, query: str) -> pa.Table:
        """Run ``query``; the result as an Arrow table (empty for statements without one).

        Example: ``session.sql("SELECT * FROM t AS OF VERSION 3 WHERE id < 10")``.
        """
        rel = self._run(query)
        if rel is None:
            return pa.table({})
        try:
            return rel.to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None

    def reader(self, query: str, batch_size: int = 122_880) -> pa.RecordBatchReader:
        """Run ``query``; the result streamed as Arrow record batches."""
        rel = self._run(query)
        if rel is None:
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        try:
            inner = rel.to_arrow_reader(batch_size)
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None

        def batches():
            # Errors can surface while batches are read (a file vanished, an
            # interrupt): give them the same one-line form as sql().
            try:
                yield from inner
            except (duckdb.Error, pa.ArrowException, OSError) as e:
                raise QueryError(_one_line(e)) from None

        return pa.RecordBatchReader.from_batches(inner.schema, batches())

    def scan(
        self,
        table: str,
        columns: Sequence[str] | None = None,
        filter: Sequence[Predicate] | Predicate | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """Rows of ``table`` (at ``version``), only ``columns``, where every predicate holds.

        Example: ``session.scan("t", ["id"], Predicate("id", ">=", 10), version=2)``.
        """
        preds = [filter] if isinstance(filter, Predicate) else list(filter or [])
        snap = self.snapshot(table, version)
        names = snap.schema.names
        for c in list(columns or []) + [p.column for p in preds]:
            if c not in names:
                raise CastSQLError(f"table {table}: no column {c!r} (columns: {', '.join(names)})")
        view = f"{self._display[table.lower()]}@scan"
        self._create_view(view, snap, table, predicates=preds)
        cols = ", ".join(ident(c) for c in columns) if columns else "*"
        where = " AND ".join(f"{ident(p.column)} {p.op} ?" for p in preds)
        q = f"SELECT {cols} FROM {ident(view)}" + (f" WHERE {where}" if where else "")
        try:
            return self.con.execute(q, [p.value for p in preds]).to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None

    def history(self, table: str) -> pa.Table:
        """One row per kept version: time, operation, files and rows added and deleted."""
        return audit.history(self, table)

    def changes(self, table: str, start: int, end: int | None = None) -> pa.Table:
        """Rows inserted and deleted by each version in (start, end]; see :mod:`castsql.engine.audit`."""
        return audit.changes(self, table, start, end)

    def close(self) -> None:
        self.con.close()
        self._cleanup()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_TABLES_VIEW = "__castsql_tables"
_PRUNED_VIEWS = 64  # pruning results (and their views) kept per session


def _replace_names(sql: str, edits: list[tuple[int, bool, str]]) -> str:
    """Replace the table name token at each byte offset with a view name,
    keeping the old name as the alias when the query gave none."""
    starts = {t.start: t for t in tokenize(sql)}
    raw = sql.encode()
    out, pos = [], 0
    for loc, has_alias, view in sorted(edits):
        at = loc if sql.isascii() else len(raw[:loc].decode(errors="replace"))
        tok = starts.get(at)
        if tok is None or tok.kind != "identifier":
            continue  # not where DuckDB said: leave this reference unpruned
        out += [sql[pos : tok.start], ident(view) + ("" if has_alias else f" AS {tok.text}")]
        pos = tok.end
    return "".join(out) + sql[pos:]


def _one_line(e: Exception) -> str:
    msg = str(e).strip()
    first = msg.splitlines()[0] if msg else type(e).__name__
    # DuckDB adds a "LINE n:" excerpt with a caret: keep it, it points at the error.
    extra = [ln for ln in msg.splitlines()[1:] if ln.strip()]
    return first if not extra else first + " " + " ".join(s.strip() for s in extra[:1])
