"""Running a query: the barriers, the plan's SQL, DuckDB, results and errors.

:meth:`Executor.run` takes a query's plan from the planner (tokenized and
parsed once per text), refuses what the guard refuses on the plan's tokens,
has the planner turn the plan into the SQL that reads its views, lets the
policy decide on the plan's statement types (or DuckDB's parse of what runs,
when the plan has none) and runs it. Errors come back as one line in the
user's terms (:mod:`castsql.engine.messages`).
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import duckdb
import pyarrow as pa

from castsql.engine.barrier import policy
from castsql.engine.barrier.guard import check_statement
from castsql.engine.catalog import Catalog
from castsql.engine.duckdb.duck import hide_credentials, load_httpfs
from castsql.engine.messages import QueryError, message, one_line
from castsql.engine.planner import Planner
from castsql.engine.sql.plan import Plan
from castsql.engine.sql.quoting import ident
from castsql.format import Manifest, TableLog

_SPELLED = {"date", "time", "time with time zone", "interval"}  # and every timestamp


class Executor:
    """Runs queries on one connection over a catalog's tables."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, catalog: Catalog, planner: Planner, workdir: str, *, own: bool
    ) -> None:
        self.con = con
        self.catalog = catalog
        self.planner = planner
        self.workdir = workdir
        self.own_connection = own
        self.httpfs = False  # loaded (or not this connection's to load)
        self.safe = False
        self.user_threads = False  # a statement set DuckDB's threads: the session no longer chooses them
        self._streams: weakref.WeakSet[_Stream] = weakref.WeakSet()  # readers' results not read to the end
        # A message of the session's own for an error (a file an inline audit reads), or None.
        self.explain: Callable[[BaseException], str | None] = lambda e: None
        # A statement that writes a table, run by the session through the write
        # pipeline (its result), or None: every other statement runs here.
        self.writes: Callable[[str, Any], pa.Table | None] = lambda sql, params: None

    @property
    def scope(self) -> policy.Scope:
        """What SQL may not write to (every opened table and warehouse, the work
        directory) and, in safe mode, the only URLs it may name."""
        roots = [log.storage.root for log in self.catalog.logs.values()]
        home = None
        if self.own_connection:
            home = self.con.execute("SELECT current_setting('home_directory')").fetchall()[0][0] or None
        uris = self.catalog.uris
        return policy.Scope(
            tables=self.catalog.tables, protected=[*roots, *uris, self.workdir], readable=uris, home=home
        )

    def prepare(self, sql: str, params: Sequence[Any] | None = None) -> tuple[Plan, str]:
        """The bound plan of ``sql`` and the SQL it becomes (see ``Session.prepare``)."""
        self.finish_streams()  # planning may run statements (views, audits)
        plan = self.planner.plan(sql).bind(params)
        return plan, self.planner.sql(plan)

    def run(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation | None:
        written = self._written(sql, params)
        if written is not None:
            return self.con.from_arrow(written)
        prepared, params, _ = self._ready(sql, params)
        try:
            return self.con.sql(prepared, params=params)
        except duckdb.Error as e:
            raise QueryError(self.message(e)) from None

    def _written(self, sql: str, params: Any) -> pa.Table | None:
        self.finish_streams()  # the write runs statements on the connection
        return self.writes(sql, params)

    def _ready(
        self, sql: str, params: Sequence[Any] | dict[str, Any] | None
    ) -> tuple[str, Sequence[Any] | dict[str, Any] | None, Plan]:
        """The SQL ``sql`` becomes, with the parameters it still takes and its
        plan, checked and with its threads set: what runs next is DuckDB's."""
        self.finish_streams()  # planning may run statements (views, audits)
        plan = self.planner.plan(sql)  # memoised by text: tokens and DuckDB's parse, once
        check_statement(sql, private_paths=(self.workdir,), toks=plan.tokens)
        positional = params if isinstance(params, Sequence) and not isinstance(params, str) else None
        plan = plan.bind(positional)
        prepared = self.planner.sql(plan)
        if plan.used_params and positional is not None:
            params = [p for i, p in enumerate(positional) if i not in plan.used_params]
        try:
            policy.check(self.con, prepared, lambda: self.scope, safe=self.safe, kinds=plan.kinds)
            self._load_httpfs_for(plan)
            if not self.user_threads and _sets_threads(plan):
                self.user_threads = True
                self.planner.views.release_threads()
            self.planner.views.settle_threads()
        except duckdb.Error as e:
            raise QueryError(self.message(e)) from None
        return prepared, params, plan

    def _load_httpfs_for(self, plan: Plan) -> None:
        """Load httpfs (from its pip package) before the first statement that
        names a URL, its credential settings blanked: DuckDB's own auto-loading
        is off, since it would leave AWS_* credentials in readable settings.
        The plan's string literals are those of the SQL that runs."""
        if self.httpfs or not self.own_connection:
            return
        if any(t.kind == "string_const" and "://" in t.text for t in plan.tokens):
            load_httpfs(self.con)
            hide_credentials(self.con)
            self.httpfs = True

    def message(self, e: Exception) -> str:
        """DuckDB's error in one line, in the user's terms: no internal name, and
        a missing table answered with the tables there are."""
        return self.explain(e) or message(e, lambda: self.catalog.tables)

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        # A SELECT of tables on an object store whose head the session knows
        # runs on that head while the look for a newer version (the pointer
        # and the next manifest, a round trip) runs beside it; when the look
        # finds a newer one, the query runs again on the versions it found.
        # The answer is the one the look-then-read order gives, without the
        # round trip in front of every warm query.
        written = self._written(query, params)
        if written is not None:
            return written
        self.planner.speculate = True
        try:
            prepared, bound, plan = self._ready(query, params)
        finally:
            self.planner.speculate = False
            checks, self.planner.checks = self.planner.checks, []
        try:
            result = self._execute(prepared, bound, plan)
        except QueryError:
            if not (checks and _newer(checks)):
                raise
        else:
            if not (checks and _newer(checks)):
                return result
        self.planner.found = {log.uri: look.result().version for log, _, look in checks}
        try:
            prepared, bound, plan = self._ready(query, params)
        finally:
            self.planner.found = {}
        return self._execute(prepared, bound, plan)

    def _execute(self, prepared: str, params: Any, plan: Plan) -> pa.Table:
        try:
            if plan.kinds == ("SELECT",):
                # One SELECT runs as one statement: a relation (con.sql) binds
                # it once to be made and again to run, ~2-4 ms for a query of
                # a few small files (the audits of one merge) in a fresh session.
                return self.con.execute(prepared, params).to_arrow_table()
            rel = self.con.sql(prepared, params=params)
            return pa.table({}) if rel is None else rel.to_arrow_table()
        except duckdb.Error as e:
            raise QueryError(self.message(e)) from None

    def reader(
        self,
        query: str,
        batch_size: int = 122_880,
        *,
        display: bool = False,
        params: Sequence[Any] | dict[str, Any] | None = None,
    ) -> pa.RecordBatchReader:
        written = self._written(query, params)
        if written is not None:
            return written.to_reader()
        rel = self.run(query, params)
        if rel is None:
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        shown: dict[int, str] = {}
        if display:
            rel, shown = _as_displayed(rel)
        try:
            inner = rel.to_arrow_reader(batch_size)
        except duckdb.Error as e:
            raise QueryError(one_line(e)) from None
        if shown:
            fields = [
                f.with_metadata({"castsql.type": shown[i]}) if i in shown else f for i, f in enumerate(inner.schema)
            ]
            schema = pa.schema(fields)
            inner = pa.RecordBatchReader.from_batches(
                schema, (pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in inner)
            )

        stream = _Stream(inner)
        self._streams.add(stream)
        return pa.RecordBatchReader.from_batches(inner.schema, stream.batches())

    def finish_streams(self) -> None:
        """Read to their end the results still being streamed, before another
        statement runs on the connection: DuckDB keeps one pending result per
        connection and ends the older one silently, so a reader would stop
        short. Their remaining batches wait in memory for their readers."""
        for stream in list(self._streams):
            stream.drain()
        self._streams.clear()


def _newer(checks: list[tuple[TableLog, int, Future[Manifest]]]) -> bool:
    """Whether a look for the latest version found one past the version the
    query read; the look's own error (a store that stopped answering) is the
    query's, as it would have been before the query ran."""
    return any(look.result().version != version for _, version, look in checks)


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


def _sets_threads(plan: Plan) -> bool:
    """Whether the statement sets (or resets) DuckDB's threads: ``SET threads``,
    ``RESET threads``, ``PRAGMA threads``; then they are the user's to keep."""
    toks = plan.tokens
    return any(t.is_name and t.name in ("threads", "worker_threads") for t in toks) and any(
        t.word in ("SET", "RESET", "PRAGMA") for t in toks
    )


class _Stream:
    """A reader's batches, as DuckDB streams them or, once :meth:`drain` read
    the rest ahead of another statement, from memory. Errors while reading
    take the same one-line form as ``sql()``'s."""

    def __init__(self, inner: pa.RecordBatchReader) -> None:
        self._inner = inner
        self._ahead: collections.deque[pa.RecordBatch] = collections.deque()
        self._error: QueryError | None = None
        self._done = False

    def drain(self) -> None:
        if self._done:
            return
        try:
            for b in self._inner:
                self._ahead.append(b)
        except (duckdb.Error, pa.ArrowException, OSError) as e:
            self._error = QueryError(one_line(e))
        self._done = True

    def batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            if self._ahead:
                yield self._ahead.popleft()
            elif self._done:
                if self._error is not None:
                    raise self._error
                return
            else:
                try:
                    b = self._inner.read_next_batch()
                except StopIteration:
                    self._done = True
                    continue
                except (duckdb.Error, pa.ArrowException, OSError) as e:
                    # An interrupt or a vanished file: one line, as sql() says it.
                    self._done = True
                    raise QueryError(one_line(e)) from None
                yield b
