"""A CastSQL session: tables by name, SQL with time travel, Arrow out.

Each table is a DuckDB view of the live rows of its latest version; every query
first checks which version is latest (one pointer read, one probe), so a new
commit is seen by the next query without reopening anything. ``t AS OF
VERSION n`` and friends read views of that version. Every version a query sees
is fixed for the whole query: snapshot isolation.

A session is thin: its :class:`~castsql.engine.catalog.Catalog` knows the
tables, its :class:`~castsql.engine.planner.Planner` turns a query's plan
(:mod:`castsql.engine.sql.plan`: the text tokenized and parsed once) into SQL over
views, and its :class:`~castsql.engine.executor.Executor` checks and runs it.

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

import contextlib
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from castsql.engine.arrow_tables import temp_table
from castsql.engine.barrier import policy
from castsql.engine.barrier.safety import SafeModeError, lock_down
from castsql.engine.catalog import Catalog
from castsql.engine.duckdb.duck import configure_s3, hide_credentials, load_httpfs, new_connection
from castsql.engine.duckdb.stores import make_readable
from castsql.engine.duckdb.threads import RemoteThreads
from castsql.engine.executor import Executor
from castsql.engine.messages import QueryError, one_line
from castsql.engine.planner import Planner
from castsql.engine.sql import names
from castsql.engine.sql.plan import AuditCall
from castsql.engine.sql.quoting import ident, sql_str
from castsql.engine.views import Views
from castsql.engine.writing import intercept
from castsql.format import TableLog
from castsql.snapshot import Predicate, Snapshot
from castsql.storage import S3Config, Storage, open_storage
from castsql.storage.uris import S3, is_object_store

if TYPE_CHECKING:
    from castsql.engine.audits.audit import Audits, Version
    from castsql.engine.writing.writes import Written

__all__ = ["QueryError", "Session"]

REMOTE_THREADS = 16  # DuckDB threads of a session with a table on S3 (at least)


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
        read_only: bool = False,
    ) -> None:
        self.read_only = read_only  # SQL never writes a table (DELETE, MERGE … are refused)
        self.last_write: Written | None = None  # what the last statement that wrote a table did
        self.con = connection or new_connection(threads=threads)
        self._workdir = tempfile.mkdtemp(prefix="castsql-session-")
        self._own_connection = connection is None
        if self._own_connection:
            # DuckDB's spill files go to the work directory, never to ./.tmp
            # (which may lie in a table); SQL cannot move them (policy.py).
            self.con.execute(f"SET temp_directory = {sql_str(self._workdir + '/duckdb-tmp')}")
        self.views = Views(self.con, self._workdir)
        # A session dropped without close() still frees what it holds outside
        # DuckDB: its work directory and its bitmaps in CastSQL's extension,
        # which live in the process.
        self._cleanup = weakref.finalize(self, _release, self._workdir, self.views)
        self.s3 = s3
        self.catalog = Catalog()
        self._audits: Audits | None = None
        self.planner = Planner(self.con, self.catalog, self.views, self._audit)
        self.executor = Executor(self.con, self.catalog, self.planner, self._workdir, own=self._own_connection)
        self.executor.explain = self._explain
        self.executor.writes = self._write
        self._s3_ready = False
        self._threads_set = threads is not None or not self._own_connection
        if uri is not None:
            self.open(uri)
        if safe:
            self._lock_down()

    @property
    def safe(self) -> bool:
        return self.executor.safe

    @property
    def uris(self) -> list[str]:
        return self.catalog.uris

    @property
    def skipped(self) -> list[str]:
        """Sub-directories of opened warehouses that are not readable tables."""
        return self.catalog.skipped

    def _lock_down(self) -> None:
        """Enter safe mode (see :mod:`castsql.engine.barrier.safety`); there is no way back."""
        if not self._s3_ready:
            load_httpfs(self.con)  # extensions cannot be loaded once locked
            self.executor.httpfs = True
        self.views.lake  # noqa: B018 - attach DuckLake while that is still allowed
        if self.views.threads is not None:
            self.views.threads.fix()  # settings cannot change once locked: cold reads' threads, as before
        temp = f"{self._workdir}/duckdb-tmp"
        # Credentials out of readable settings while settings can still change.
        hide_credentials(self.con)
        lock_down(self.con, [*self.uris, self._workdir], temp)
        self.executor.safe = True

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
        self._reach(storage)
        return self.catalog.add(storage, name)

    def adopt(self, log: TableLog, name: str | None = None) -> str:
        """Add the table ``log`` reads, read and written through that very log
        (its cache, its storage and credentials), under ``name`` (default: the
        last component of its root); returns the name. What a writer's
        after-commit work (automatic compaction) runs in."""
        if self.safe:
            raise SafeModeError(f"safe mode: cannot open {log.uri}; tables are fixed when a safe session starts")
        self._reach(log.storage)
        return self.catalog.add_log(log, name)

    def _reach(self, storage: Storage) -> None:
        """Let DuckDB read ``storage``'s objects (S3 credentials in its secret
        manager, GCS and Azure through CastSQL's file systems)."""
        self.executor.finish_streams()
        if storage.root.startswith(S3.prefix):
            if not self._s3_ready:
                configure_s3(self.con, self.s3_config(storage))  # credentials in the secret manager only
                # httpfs HEADs a file each time a query opens it (4 times in a
                # fresh query, 2 in each one after). A table's data files never
                # change (FORMAT.md §2), so their sizes are kept for the
                # session; docs/OBJECT_STORES.md says what that means for a
                # user's own S3 objects read through the same session.
                self.con.execute("SET enable_http_metadata_cache = true")
                self._s3_ready = self.executor.httpfs = True
        elif is_object_store(storage.root):
            make_readable(self.con, storage)  # GCS, Azure: castsql.engine.duckdb.stores
        if storage.root.startswith(S3.prefix) and not self._threads_set and not self.executor.user_threads:
            # DuckDB 1.5 reads a remote file on the thread that scans it, so
            # its threads are its requests in flight: a cold many-file read (an
            # audit's new files, a stream's small files) runs on at least
            # REMOTE_THREADS, a warm one (no request) on the cores
            # (castsql.engine.duckdb.threads). Not on GCS and Azure: there each thread
            # opens its own handle of the fsspec filesystem, and a one-file
            # scan's requests grow with them (docs/OBJECT_STORES.md).
            cores = int(self.con.execute("SELECT current_setting('threads')").fetchall()[0][0])
            self.views.threads = RemoteThreads(self.con, cores, REMOTE_THREADS)
            self._threads_set = True

    def s3_config(self, storage: Storage) -> S3Config:
        """The S3 settings DuckDB needs to read ``storage``'s objects."""
        return getattr(storage, "config", None) or self.s3 or S3Config.from_env()

    def check_columns(self, table: str, snap: Snapshot, columns: Sequence[str]) -> None:
        """CastSQLError naming ``table`` and its columns unless every one of ``columns`` is one."""
        self.catalog.check_columns(table, snap, columns)

    @property
    def tables(self) -> list[str]:
        return self.catalog.tables

    def log(self, table: str) -> TableLog:
        """The version log of ``table``; TableNotFound names the known tables."""
        return self.catalog.log(table)

    def snapshot(self, table: str, version: int | None = None) -> Snapshot:
        """``table`` at ``version`` (default: latest), resolved; a collected version is refused."""
        return self.catalog.snapshot(table, version)

    def refresh(self) -> None:
        """Forget cached state; the next query re-reads every table."""
        self.planner.refresh()

    def version_view(self, table: str, version: int) -> str:
        """Name of a view of ``table`` at ``version`` (created on first use)."""
        name, snap = self.planner.version_snapshot(table, version)
        self.planner.ensure_view(name, snap, self.catalog.name(table))
        return name

    def resolve_time(self, table: str, when: str | datetime) -> int:
        return self.catalog.resolve_time(table, when)

    # ------------------------------------------------------------ queries

    def prepare(self, sql: str, params: Sequence[Any] | None = None, used_params: set[int] | None = None) -> str:
        """``sql`` with time travel and audit calls rewritten, every view it needs in place.

        ``params``: the query's positional parameters, for ``AS OF VERSION ?``;
        the indexes of those a version clause took are added to ``used_params``
        (the statement DuckDB runs no longer holds them).

        Only the versions the statement reads are resolved: a table named only
        with ``AS OF`` is never asked for its latest version, so an old version
        reads even when the latest one is broken.
        """
        plan, prepared = self.executor.prepare(sql, params)
        if used_params is not None:
            used_params.update(plan.used_params)
        return prepared

    @property
    def scope(self) -> policy.Scope:
        """What SQL may not write to (every opened table and warehouse, the work
        directory) and, in safe mode, the only URLs it may name."""
        return self.executor.scope

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run ``query``; the result as an Arrow table (empty for statements without one).

        ``params`` fill DuckDB's ``?`` / ``$1`` / ``$name`` placeholders.
        Example: ``session.sql("SELECT * FROM t AS OF VERSION 3 WHERE id < ?", [10])``.
        """
        return self.executor.sql(query, params)

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

        Another statement on this session while the reader is not read to
        its end (a query, a scan, an audit) first reads the reader's rest
        into memory: DuckDB would end the stream, and the reader stop short.
        Read large results to the end first, or use a session per stream.
        """
        return self.executor.reader(query, batch_size, display=display, params=params)

    def relation(self, query: str) -> duckdb.DuckDBPyRelation | None:
        """``query`` planned (time travel, audits, safe-mode checks) as a DuckDB
        relation that has not run yet, or None for a statement without a result:
        for DuckDB's own writers (the shell's text modes ``COPY`` it). A DuckDB
        error while it runs reads best through :meth:`error_message`.

        Example::

            >>> s.relation("SELECT count(*) FROM events").fetchone()  # doctest: +SKIP
            (1000,)
        """
        return self.executor.run(query)

    def error_message(self, e: Exception) -> str:
        """A DuckDB error in one line, in the user's terms (no internal view names)."""
        return self.executor.message(e)

    @property
    def workdir(self) -> str:
        """The session's private directory, removed by :meth:`close`; in safe
        mode the only place DuckDB may write."""
        return self._workdir

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
        self.executor.finish_streams()
        preds = [filter] if isinstance(filter, Predicate) else list(filter or [])
        snap = self.snapshot(table, version)
        self.check_columns(table, snap, list(columns or []) + [p.column for p in preds])
        disp = self.catalog.name(table)
        name = disp if version is None else names.version_view(disp, snap.version)
        view = self.planner.view_for(name, snap, tuple(preds), disp) if preds and snap.file_count > 1 else None
        if view is None:
            self.planner.ensure_view(name, snap, disp)
            view = name
        cols = ", ".join(ident(c) for c in columns) if columns else "*"
        where = " AND ".join(f"{ident(p.column)} {p.op} ?" for p in preds)
        q = f"SELECT {cols} FROM {ident(view)}" + (f" WHERE {where}" if where else "")
        self.views.settle_threads()
        try:
            return self.con.execute(q, [p.value for p in preds]).to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(one_line(e)) from None

    def history(self, table: str) -> pa.Table:
        """One row per kept version: time, operation, files and rows inserted,
        updated and deleted (see :mod:`castsql.engine.audits.audit`).

        Example::

            >>> s.history("events").column("rows_inserted").to_pylist()  # doctest: +SKIP
            [None, 1000, 20]
        """
        self.executor.finish_streams()
        return self.audits.history(self.log(table))

    def changes(self, table: str, start: Version, end: Version | None = None) -> pa.Table:
        """Rows inserted, updated and deleted by each version from ``start`` to
        ``end``, both included, or by the commits between two timestamps, with
        Delta's ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.

        Example::

            >>> s.changes("events", 3, 5).column("_change_type").to_pylist()  # doctest: +SKIP
            ['update_preimage', 'update_postimage', 'delete']
        """
        log, disp = self.log(table), self.catalog.name(table)
        return self._arrow(
            disp, "changes", lambda name: self.audits.changes(log, disp, name, start, end, inline=True), True
        )

    def diff(self, table: str, a: Version, b: Version) -> pa.Table:
        """The rows version ``b`` holds and ``a`` lacks (``insert``) and the
        reverse (``delete``), compared as values; updates paired by primary key.
        Costs the files that differ between the two versions.

        Example::

            >>> s.diff("events", 3, 200).num_rows  # doctest: +SKIP
            412
        """
        log, disp = self.log(table), self.catalog.name(table)
        return self._arrow(disp, "diff", lambda name: self.audits.diff(log, disp, name, a, b))

    def row_history(self, table: str, key: Any, key_hi: Any = None) -> pa.Table:
        """Every change of the row whose primary key is ``key`` (or of the rows
        whose key is in [``key``, ``key_hi``]) over the kept versions, as
        :meth:`changes` shows them; versions that cannot hold the key are not read.

        Example::

            >>> s.row_history("customers", 42).column("_commit_version").to_pylist()  # doctest: +SKIP
            [1, 17, 17, 230]
        """
        log, disp = self.log(table), self.catalog.name(table)
        return self._arrow(
            disp, "row_history", lambda name: self.audits.row_history(log, disp, name, key, key_hi, inline=True), True
        )

    @property
    def audits(self) -> Audits:
        """The audits' reader, made on first use: a session that audits
        nothing does not import it."""
        if self._audits is None:
            from castsql.engine.audits.audit import Audits

            self._audits = Audits(self.con, self.views)
        return self._audits

    def _arrow(self, disp: str, kind: str, make: Any, inline: bool = False) -> pa.Table:
        """``make(name)``'s relation (a view's name, or with ``inline`` a
        parenthesized SELECT) read into Arrow."""
        self.executor.finish_streams()
        name = names.internal(kind, "api", owner=disp)
        try:
            view = make(name)
            self.views.settle_threads()
            return self.con.execute(f"SELECT * FROM {view}").to_arrow_table()
        except duckdb.Error as e:
            raise QueryError((self.audits.explain(e, [name]) if inline else None) or one_line(e)) from None
        finally:
            self.audits.drop(name)

    def _audit(self, call: AuditCall, inline: bool = False) -> str | None:
        """Make an audit call of a query's plan a relation under its label; with
        ``inline`` (changes and row histories), return its SELECT instead."""
        log, disp = self.log(call.table), self.catalog.name(call.table)
        # Safe mode checks the SQL that runs, and CastSQL's own reads of the
        # table's files are for views alone to hold.
        inline = inline and not self.safe
        if call.kind == "history":
            temp_table(self.con, call.label, self.audits.history(log))
        elif call.kind == "changes":
            text = self.audits.changes(log, disp, call.label, *call.args, inline=inline)
            return text if inline else None
        elif call.kind == "diff":
            self.audits.diff(log, disp, call.label, *call.args)
        else:
            text = self.audits.row_history(log, disp, call.label, *call.args, inline=inline)
            return text if inline else None
        return None

    def _write(self, sql: str, params: Any) -> pa.Table | None:
        """A statement that writes one of the tables, run through the write
        pipeline (:mod:`castsql.engine.writing.intercept`): its count of rows; None for any other statement."""
        written = intercept.intercept(self, sql, params)
        if written is None:
            return None
        self.last_write = written
        return written.result()

    def in_transaction(self) -> bool:
        """Whether the user's own transaction is open on the connection (BEGIN without COMMIT)."""
        # Each statement outside a transaction is a transaction of its own: two
        # statements in a row see one id only inside a transaction (and asking
        # DuckDB to BEGIN again would abort the user's).
        first, second = (self.con.execute("SELECT txid_current()").fetchone() for _ in range(2))
        return first == second

    def _explain(self, e: BaseException) -> str | None:
        """The error of a query that read audits inline, as :meth:`Audits.explain` says it."""
        if self._audits is None or not self.planner.inlined:
            return None
        return self._audits.explain(e, self.planner.inlined)

    def close(self) -> None:
        self._cleanup()
        self.con.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _release(workdir: str, views: Views) -> None:
    with contextlib.suppress(duckdb.Error):  # the connection closed already
        views.close()
    shutil.rmtree(workdir, True)
