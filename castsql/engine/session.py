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
import re
import shutil
import tempfile
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

from castsql.engine import audit, names, policy
from castsql.engine.duck import configure_s3, hide_credentials, load_httpfs, new_connection
from castsql.engine.guard import check_statement
from castsql.engine.pushdown import Analysis, analyze, duck_value
from castsql.engine.rewrite import TimeTravel, referenced_names, rewrite
from castsql.engine.safety import SafeModeError, lock_down
from castsql.engine.tokens import tokenize
from castsql.engine.views import Views, ident, sql_str
from castsql.errors import CastSQLError, SchemaMismatch, StorageError, TableNotFound, VersionNotFound
from castsql.format import TableLog
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.manifest import parse_time
from castsql.snapshot import Predicate, Snapshot, resolve
from castsql.storage import S3Config, Storage, StorageUnreachable, open_storage


class QueryError(CastSQLError):
    """DuckDB refused or failed a query; the message is DuckDB's."""


def _is_table(storage: Storage) -> bool:
    # ``exists`` is False only when the store says the object is absent; a
    # request that fails (StorageUnreachable after all its attempts) raises
    # and ends the open, so a stalled endpoint costs one request's budget.
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
        self._own_connection = connection is None
        if self._own_connection:
            # DuckDB's spill files go to the work directory, never to ./.tmp
            # (which may lie in a table); SQL cannot move them (policy.py).
            self.con.execute(f"SET temp_directory = {sql_str(self._workdir + '/duckdb-tmp')}")
        self._httpfs = False
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        self.views = Views(self.con, self._workdir)
        self.s3 = s3
        self._logs: dict[str, TableLog] = {}
        self._display: dict[str, str] = {}
        # view name (lower) -> (table URI, version) it shows now
        self._views_at: dict[str, tuple[str, int]] = {}
        self._provisional: set[str] = set()  # views whose deletes are an anti-join until read again
        self._read_before: set[str] = set()  # URIs of the tables a view was made for
        # (view, version, predicates) -> view of the files they may match, None if every file
        self._pruned: OrderedDict[tuple, str | None] = OrderedDict()
        self._pruned_seq = itertools.count()
        self._analyses: OrderedDict[str, Analysis | None] = OrderedDict()
        self.skipped: list[str] = []  # sub-directories of opened warehouses that are not readable tables
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
            self._httpfs = True
        self.views.lake  # noqa: B018 - attach DuckLake while that is still allowed
        temp = f"{self._workdir}/duckdb-tmp"
        lock_down(self.con, [*self.uris, self._workdir], temp)
        self.safe = True

    # ------------------------------------------------------------ catalog

    def open(self, uri: str, name: str | None = None) -> list[str]:
        """Add a table or every table of a warehouse; returns the names added.

        A warehouse's sub-directories that cannot be tables (a symbolic link
        leading out of it, an unreadable entry) are skipped and listed in
        ``skipped``; two tables whose names differ only in case cannot both be
        queried (SQL names are case-insensitive) and are refused together.
        """
        if self.safe:
            raise SafeModeError(f"safe mode: cannot open {uri}; tables are fixed when a safe session starts")
        storage = open_storage(uri, s3=self.s3)
        if storage.root.startswith("s3://") and not self._s3_ready:
            configure_s3(self.con, self.s3_config(storage))  # credentials in the secret manager only
            self._s3_ready = self._httpfs = True
        if _is_table(storage):
            found = {name or storage.root.rstrip("/").rsplit("/", 1)[-1]: storage}
        else:
            found = {}
            for child in storage.list_dirs():
                try:
                    sub = storage.child(child)
                    if _is_table(sub):
                        found[child] = sub
                except StorageUnreachable:
                    raise  # the endpoint, not this entry: every other probe would wait as long
                except StorageError as e:
                    self.skipped.append(f"{storage.uri(child)}: {e}")
            if not found:
                raise TableNotFound(f"{storage.root}: neither a table nor a warehouse of tables")
        by_lower: dict[str, list[str]] = {}
        for n in [*self._display.values(), *found]:
            by_lower.setdefault(n.lower(), []).append(n)
        clash = [names for names in by_lower.values() if len(names) > 1]
        if clash:
            pairs = "; ".join(" and ".join(repr(n) for n in names) for names in clash)
            raise TableNotFound(
                f"{storage.root}: tables {pairs} differ only in case, and SQL names are case-insensitive; "
                "open one of them directly (castsql URI/NAME)"
            )
        for n, st in found.items():
            self._logs[n.lower()] = TableLog(st)
            self._display[n.lower()] = n
        self.uris.append(storage.root)
        return list(found)

    def s3_config(self, storage: Storage) -> S3Config:
        """The S3 settings DuckDB needs to read ``storage``'s objects."""
        return getattr(storage, "config", None) or self.s3 or S3Config.from_env()

    def check_columns(self, table: str, snap: Snapshot, columns: Sequence[str]) -> None:
        """CastSQLError naming ``table`` and its columns unless every one of ``columns`` is one."""
        names = snap.schema.names
        for c in columns:
            if c not in names:
                raise CastSQLError(f"table {table}: no column {c!r} (columns: {', '.join(names)})")

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
        self._views_at.clear()

    # ------------------------------------------------------------ views

    def _ensure_view(self, name: str, snap: Snapshot, table: str) -> None:
        """The view ``name`` shows ``snap`` (created or replaced if it shows anything else).

        The first view of a table in a session applies its deletes with an
        anti-join (provisional, see ``Views.create``); from the second query of
        the table on, its versions are DuckLake snapshots, and a provisional
        view is rebuilt as one: a script that reads a table once pays no
        set-up, a session that keeps reading it gets the faster scans and the
        incremental versions."""
        at = (snap.table_uri, snap.version)
        key = name.lower()
        if self._views_at.get(key) != at:
            self._views_at.pop(key, None)
            self._provisional.discard(key)
            if self._create_view(name, snap, table):
                self._provisional.add(key)
            self._views_at[key] = at
        elif key in self._provisional:
            self._provisional.discard(key)
            self._create_view(name, snap, table, settle=True)

    def _create_view(self, name: str, snap: Snapshot, table: str, **kw: Any) -> bool:
        """``Views.create``; settled (DuckLake) unless this is the first view of the table."""
        kw.setdefault("settle", snap.table_uri in self._read_before)
        self._read_before.add(snap.table_uri)
        try:
            return self.views.create(name, snap, **kw)
        except duckdb.Error as e:
            raise QueryError(f"table {table} version {snap.version}: {_one_line(e)}") from None
        except SchemaMismatch as e:
            raise SchemaMismatch(f"table {table} {e}") from None

    def _version_snapshot(self, table: str, version: int) -> tuple[str, Snapshot]:
        """The view name of ``table`` at ``version`` and its snapshot; a collected version is refused."""
        log = self.log(table)
        disp = self._display[table.lower()]
        # A version's rows never change, but GC can drop the version: the probe
        # (one existence check per time-travel query) refuses a collected
        # version in a long-lived session just as in a new one.
        try:
            snap = resolve(log, version, probe=True)
        except VersionNotFound as e:
            raise VersionNotFound(f"table {disp}: {str(e).split(': ', 1)[-1]}") from None
        return names.version_view(disp, version), snap

    def version_view(self, table: str, version: int) -> str:
        """Name of a view of ``table`` at ``version`` (created on first use)."""
        name, snap = self._version_snapshot(table, version)
        self._ensure_view(name, snap, self._display[table.lower()])
        return name

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

    def prepare(self, sql: str, params: Sequence[Any] | None = None, used_params: set[int] | None = None) -> str:
        """``sql`` with time travel and audit calls rewritten, every view it needs in place.

        ``params``: the query's positional parameters, for ``AS OF VERSION ?``;
        the indexes of those a version clause took are added to ``used_params``
        (the statement DuckDB runs no longer holds them).

        Only the versions the statement reads are resolved: a table named only
        with ``AS OF`` is never asked for its latest version, so an old version
        reads even when the latest one is broken.
        """
        if [t.word for t in tokenize(sql) if t.text != ";"] == ["SHOW", "TABLES"]:
            # The opened tables, not DuckDB's temp views (versions, pruned file sets).
            self.con.register(_TABLES_VIEW, pa.table({"name": pa.array(self.tables, pa.string())}))
            return f"SELECT name FROM {ident(_TABLES_VIEW)} ORDER BY name"
        sql = audit.rewrite_audit_calls(self, sql)
        wanted: dict[str, tuple[str, Snapshot, str]] = {}  # view (lower) -> (view, snapshot, table)

        def replace(ref: TimeTravel) -> str:
            table = ref.name[-1]
            if ref.param is not None:
                version = _version_param(params, ref.param, table)
            elif ref.version is not None:
                version = ref.version
            else:
                version = self.resolve_time(table, ref.timestamp or "")
            name, snap = self._version_snapshot(table, version)
            wanted[name.lower()] = (name, snap, self._display[table.lower()])
            return ident(name)

        sql, refs = rewrite(sql, replace, self._logs)
        if used_params is not None:
            used_params.update(r.param for r in refs if r.param is not None)
        analysis = self._analyze(sql)
        names = set(analysis.tables) if analysis is not None else referenced_names(sql)
        for key in names:
            if key in self._logs:
                disp = self._display[key]
                wanted[key] = (disp, resolve(self._logs[key]), disp)
        if analysis is not None and analysis.count_star is not None:
            # SELECT count(*) FROM t: the version's metadata knows (rows minus
            # deletes), on any table size, without opening a file.
            table, column = analysis.count_star
            entry = wanted.get(table)
            if entry is not None:
                return f"SELECT CAST({self.views.live_rows(entry[1])} AS BIGINT) AS {ident(column)}"
        sql, pruned = self._prune(sql, analysis, wanted)
        for key, (name, snap, table) in wanted.items():
            # Views every reference of which was swapped for a pruned one are not needed.
            if analysis is None or pruned.get(key, 0) < analysis.tables.get(key, 1):
                self._ensure_view(name, snap, table)
        return sql

    def _prune(
        self, sql: str, analysis: Analysis | None, wanted: dict[str, tuple[str, Snapshot, str]]
    ) -> tuple[str, Counter[str]]:
        """``sql`` reading, for each table reference bounded by comparisons in
        its WHERE, a view of only the files whose manifest min/max can match
        (see :mod:`castsql.engine.pushdown`); and how many references of each
        view were swapped."""
        done: Counter[str] = Counter()
        if analysis is None or not analysis.refs:
            return sql, done
        edits: list[tuple[int, bool, str]] = []
        for ref in analysis.refs:
            entry = wanted.get(ref.name)
            if entry is None or entry[1].file_count <= 1:
                continue
            _, snap, table = entry
            preds = self._predicates(snap, ref.conditions)
            if not preds:
                continue
            view = self._view_for(entry[0], snap, tuple(preds), table)
            if view is not None:
                edits.append((ref.location, ref.has_alias, view))
        if not edits:
            return sql, done
        return _replace_names(sql, edits, done)

    def _predicates(self, snap: Snapshot, conditions: list) -> list[Predicate]:
        columns = {c.name.lower(): c for c in snap.schema.columns}
        preds = []
        for col, op, value, vtype in conditions:
            c = columns.get(col)
            v = None if c is None else duck_value(self.con, value, vtype, c.type)
            if v is not None:
                preds.append(Predicate(c.name, op, v))
        return preds

    def _analyze(self, sql: str) -> Analysis | None:
        # The parse (~0.3 ms) depends on the text alone: repeated queries skip it.
        # EXPLAIN [ANALYZE] shows the plan of the statement as it will run, so
        # the statement after it is analysed, at its own offset.
        if sql in self._analyses:
            self._analyses.move_to_end(sql)
            return self._analyses[sql]
        toks = tokenize(sql)
        skip = 0
        while skip < len(toks) and toks[skip].word in ("EXPLAIN", "ANALYZE"):
            skip += 1
        offset = toks[skip].start if 0 < skip < len(toks) else 0
        a = analyze(self.con, sql[offset:])
        if a is not None and offset:
            shift = len(sql[:offset].encode())
            for r in a.refs:
                r.location += shift
            a.count_star = None  # EXPLAIN shows the plan of the statement as written
        self._analyses[sql] = a
        while len(self._analyses) > 256:
            self._analyses.popitem(last=False)
        return a

    def _view_for(self, view: str, snap: Snapshot, preds: tuple[Predicate, ...], table: str) -> str | None:
        """The view of ``snap``'s files that ``preds`` may match, or None if that is every file.
        Remembered per predicate set: pruning 100,000 files takes ~60 ms."""
        key = (view.lower(), snap.table_uri, snap.version, preds)
        if key in self._pruned:
            self._pruned.move_to_end(key)
            return self._pruned[key]
        pruned = snap.prune(preds)  # reads only the metadata objects whose summaries can match
        # A few files with deletes are anti-joined with their deleted positions
        # in the row groups the predicates can reach (cheaper for a selective
        # query than DuckLake's per-query cost); more
        # stay with the version's own view, whose DuckLake table skips files by
        # its per-file statistics.
        dirty = [f for f in pruned.files if f.has_deletes]
        small = len(dirty) <= _ANTIJOIN_FILES and sum(f.total_rows for f in dirty) <= _ANTIJOIN_POSITIONS
        name = None
        if pruned is not snap and small:
            name = names.pruned_view(view, next(self._pruned_seq))
            self._create_view(name, pruned, table, within=preds)
        self._pruned[key] = name
        while len(self._pruned) > _PRUNED_VIEWS:
            _, old = self._pruned.popitem(last=False)
            if old is not None:
                self.views.drop(old)
        return name

    # ------------------------------------------------------------ queries

    @property
    def scope(self) -> policy.Scope:
        """What SQL may not write to (every opened table and warehouse, the work
        directory) and, in safe mode, the only URLs it may name."""
        roots = [log.storage.root for log in self._logs.values()]
        home = None
        if self._own_connection:
            home = self.con.execute("SELECT current_setting('home_directory')").fetchone()[0] or None
        return policy.Scope(
            tables=self.tables, protected=[*roots, *self.uris, self._workdir], readable=self.uris, home=home
        )

    def _run(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation | None:
        # One lexer (castsql.engine.tokens, memoised by text): the guard's
        # tokens are the ones prepare's audit and time-travel passes read.
        check_statement(sql, private_paths=(self._workdir,), toks=tokenize(sql))
        positional = params if isinstance(params, Sequence) and not isinstance(params, str) else None
        used: set[int] = set()
        prepared = self.prepare(sql, positional, used)
        if used and positional is not None:
            params = [p for i, p in enumerate(positional) if i not in used]
        try:
            policy.check(self.con, prepared, self.scope, safe=self.safe)
            self._load_httpfs_for(prepared)
            return self.con.sql(prepared, params=params)
        except duckdb.Error as e:
            raise QueryError(self._message(e)) from None

    def _load_httpfs_for(self, sql: str) -> None:
        """Load httpfs (from its pip package) before the first statement that
        names a URL, its credential settings blanked: DuckDB's own auto-loading
        is off, since it would leave AWS_* credentials in readable settings."""
        if self._httpfs or not self._own_connection:
            return
        if any(t.kind == "string_const" and "://" in t.text for t in tokenize(sql)):
            load_httpfs(self.con)
            hide_credentials(self.con)
            self._httpfs = True

    def _message(self, e: Exception) -> str:
        """DuckDB's error in one line, in the user's terms: no internal name, and
        a missing table answered with the tables there are."""
        msg = _one_line(e)
        m = _MISSING.match(msg)
        if m:
            known = ", ".join(self.tables) or "none"
            return f"no table named {m.group(1)} (tables: {known})"
        return msg

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run ``query``; the result as an Arrow table (empty for statements without one).

        ``params`` fill DuckDB's ``?`` / ``$1`` / ``$name`` placeholders.
        Example: ``session.sql("SELECT * FROM t AS OF VERSION 3 WHERE id < ?", [10])``.
        """
        rel = self._run(query, params)
        if rel is None:
            return pa.table({})
        try:
            return rel.to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(self._message(e)) from None

    def reader(
        self,
        query: str,
        batch_size: int = 122_880,
        *,
        display: bool = False,
        params: Sequence[Any] | dict[str, Any] | None = None,
    ) -> pa.RecordBatchReader:
        """Run ``query``; the result streamed as Arrow record batches.

        ``display`` (the shell's use): dates, times and intervals come as the
        text DuckDB spells them (``infinity``, ``12:00:00+05``, ``1 month
        2 days 03:00:00``, ``0044-03-15 (BC)``: values Arrow cannot carry or
        Python cannot print), with their DuckDB type in the field's
        ``castsql.type`` metadata. ``params`` as for :meth:`sql`.
        """
        rel = self._run(query, params)
        if rel is None:
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        shown: dict[int, str] = {}
        if display:
            rel, shown = _as_displayed(rel)
        try:
            inner = rel.to_arrow_reader(batch_size)
        except duckdb.Error as e:
            raise QueryError(_one_line(e)) from None
        if shown:
            fields = [
                f.with_metadata({"castsql.type": shown[i]}) if i in shown else f for i, f in enumerate(inner.schema)
            ]
            schema = pa.schema(fields)
            inner = pa.RecordBatchReader.from_batches(
                schema, (pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in inner)
            )

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
        self.check_columns(table, snap, list(columns or []) + [p.column for p in preds])
        disp = self._display[table.lower()]
        name = disp if version is None else names.version_view(disp, snap.version)
        view = self._view_for(name, snap, tuple(preds), disp) if preds and snap.file_count > 1 else None
        if view is None:
            self._ensure_view(name, snap, disp)
            view = name
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


_TABLES_VIEW = names.TABLES
_SPELLED = {"date", "time", "time with time zone", "interval"}  # and every timestamp


def _as_displayed(rel: duckdb.DuckDBPyRelation) -> tuple[duckdb.DuckDBPyRelation, dict[int, str]]:
    """``rel`` with its temporal columns cast to DuckDB's own text; which ones, with their types."""
    shown = {i: str(t) for i, t in enumerate(rel.types) if t.id in _SPELLED or t.id.startswith("timestamp")}
    if not shown:
        return rel, shown
    cols = [
        f"CAST(#{i + 1} AS VARCHAR) AS {ident(c)}" if i in shown else f"#{i + 1} AS {ident(c)}"
        for i, c in enumerate(rel.columns)
    ]
    return rel.project(", ".join(cols)), shown


_PRUNED_VIEWS = 64  # pruning results (and their views) kept per session
_ANTIJOIN_FILES = 8  # a pruned file set with deletes in at most this many files ...
_ANTIJOIN_POSITIONS = 16_000_000  # ... and at most this many rows in them is anti-joined


def _replace_names(sql: str, edits: list[tuple[int, bool, str]], done: Counter[str]) -> tuple[str, Counter[str]]:
    """Replace the table name token at each byte offset with a view name,
    keeping the old name as the alias when the query gave none; counts in
    ``done`` the references replaced, by the name they had (lower-cased)."""
    starts = {t.start: t for t in tokenize(sql)}
    raw = sql.encode()
    out, pos = [], 0
    for loc, has_alias, view in sorted(edits):
        at = loc if sql.isascii() else len(raw[:loc].decode(errors="replace"))
        tok = starts.get(at)
        if tok is None or tok.kind not in ("identifier", "keyword"):
            continue  # not where DuckDB said: leave this reference unpruned
        out += [sql[pos : tok.start], ident(view) + ("" if has_alias else f" AS {tok.text}")]
        done[(tok.text[1:-1].replace('""', '"') if tok.text.startswith('"') else tok.text).lower()] += 1
        pos = tok.end
    return "".join(out) + sql[pos:], done


def _version_param(params: Sequence[Any] | None, index: int, table: str) -> int:
    """The version ``AS OF VERSION ?`` reads: positional parameter ``index``."""
    if params is None or index >= len(params):
        raise CastSQLError(f"table {table}: AS OF VERSION ? needs a value: pass it in params (session.sql(query, [3]))")
    value = params[index]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CastSQLError(f"table {table}: AS OF VERSION ? needs a version number, got {value!r}")
    return value


_MISSING = re.compile(r"Catalog Error: Table with name (.+?) does not exist!")


def _one_line(e: Exception) -> str:
    msg = names.user_spelling(str(e).strip())
    first = msg.splitlines()[0] if msg else type(e).__name__
    # DuckDB adds a "LINE n:" excerpt with a caret: keep it, it points at the error.
    extra = [ln for ln in msg.splitlines()[1:] if ln.strip()]
    return first if not extra else first + " " + " ".join(s.strip() for s in extra[:1])
