"""What the UI's pages show, computed from a read-only (safe mode) session.

Every number a page shows comes from one of CastSQL's public reads:

- the warehouse and a table's timeline: the table's metadata alone (the
  version log's records: operation, time, totals, files added and removed),
  so a table of 10,000 versions is drawn without reading a data file;
- exact rows inserted, updated, deleted and live per version: the history
  audit (``Session.history``), fetched by the page after it is drawn;
- a diff: ``Session.diff``; a key's life: ``Session.row_history``;
- the schema at a version: the version log's ``schema_of``;
- SQL: ``Session.relation`` (the shell's planner, with safe mode's checks),
  read one page at a time with ``LIMIT``/``OFFSET``, never whole.

One DuckDB connection serves every request, so each use of it holds
:attr:`Warehouse.lock`; metadata reads (the format layer) do not need it.

Example::

    >>> w = Warehouse.open("./demo-warehouse")       # doctest: +SKIP
    >>> [t.name for t in w.overview()]              # doctest: +SKIP
    ['events', 'users']
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

from castsql.engine import Session
from castsql.errors import CastSQLError, QueryError, TableNotFound, VersionNotFound, one_line
from castsql.format import TableLog
from castsql.format.manifest import Manifest, VersionRecord
from castsql.format.schema import Schema
from castsql.ui.diff import Diff

# Operations the chart marks, and how it names them; any version whose schema
# changed (ALTER, or a write with merge_schema) is marked "schema change".
MARKED = {
    "MERGE": "merge",
    "DELETE": "delete",
    "UPDATE": "update",
    "COMPACT": "compact",
    "RESTORE": "restore",
    "OVERWRITE": "overwrite",
    "ALTER": "schema change",
}
SCHEMA_CHANGE = "schema change"
_DIFFS = 4  # diffs a server keeps for paging through them


class UIError(CastSQLError):
    """Bad input to a page (a malformed number, a statement without rows)."""


class NotFound(UIError):
    """A table, version or page that is not there."""


@dataclass(frozen=True, slots=True)
class TableInfo:
    """One table of the warehouse page."""

    name: str
    version: int
    committed_at: datetime
    rows: int
    bytes: int
    data_files: int
    tombstone_files: int
    primary_key: str | None
    properties: dict[str, str]


@dataclass(frozen=True, slots=True)
class Point:
    """One version in a table's timeline, from its metadata alone."""

    version: int
    time: float  # seconds since the epoch
    operation: str
    stored_rows: int  # rows in its data files, before tombstones
    files: int
    tombstones: int
    bytes: int
    rows_written: int  # rows of the data files it added
    files_added: int
    files_removed: int
    tombstones_added: int


@dataclass(slots=True)
class _Timeline:
    points: dict[int, Point] = field(default_factory=dict)  # versions never change: kept once read


@dataclass(frozen=True, slots=True)
class Page:
    """One page of rows of a larger result."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    offset: int
    more: bool


class Warehouse:
    """The tables of one URI (a warehouse or one table), read-only."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lock = threading.RLock()
        self._timelines: dict[str, _Timeline] = {}
        self._schemas: dict[tuple[str, int], tuple[Schema, str | None]] = {}
        self._meta: dict[tuple[str, int], str] = {}  # commit metadata shown, by (table, version)
        self._history: dict[str, tuple[int, pa.Table]] = {}  # table -> (newest version, its history audit)
        self._history_lock = threading.Lock()
        self._auditing: set[str] = set()  # tables whose history is being computed in the background
        self._diffs: OrderedDict[tuple[str, int, int], Diff] = OrderedDict()

    @classmethod
    def open(cls, uri: str) -> Warehouse:
        """The tables at ``uri`` in a safe-mode session: queries read those
        tables and nothing else, and no statement writes (the shell's ``--safe``)."""
        session = Session(uri, safe=True)
        if not session.tables:
            session.close()
            raise TableNotFound(f"{uri}: no table here")
        return cls(session)

    def close(self) -> None:
        """Stop what runs on the connection and close the session; a request
        stuck on its client (a download nobody reads) does not hold the exit:
        after 5 s the session is left to the process's end."""
        with contextlib.suppress(duckdb.Error):
            self.session.con.interrupt()
        if self.lock.acquire(timeout=5):
            try:
                self.session.close()
            finally:
                self.lock.release()

    # ------------------------------------------------------------ tables

    def tables(self) -> list[str]:
        return self.session.tables

    def name(self, table: str) -> str:
        """``table`` as the catalog spells it; UIError for a table it lacks."""
        try:
            self.session.log(table)
        except TableNotFound as e:
            raise NotFound(one_line(e)) from None  # the shell's words: no table named 'x' (tables: …)
        return self.session.catalog.name(table)

    def log(self, table: str) -> TableLog:
        return self.session.log(self.name(table))

    def heads(self) -> dict[str, int | None]:
        """Each table's newest version (one pointer read each): what the pages poll."""
        out: dict[str, int | None] = {}
        for t in self.tables():
            try:
                out[t] = self.session.log(t).latest_version()
            except CastSQLError:
                out[t] = None
        return out

    def overview(self) -> list[TableInfo | tuple[str, str]]:
        """Each table's newest version at a glance; a table whose newest
        version cannot be read is (its name, why), and the others still show."""
        out: list[TableInfo | tuple[str, str]] = []
        for t in self.tables():
            try:
                out.append(self._info(t))
            except (CastSQLError, duckdb.Error) as e:
                out.append((t, one_line(e)))
        return out

    def _info(self, t: str) -> TableInfo:
        with self.lock:
            snap = self.session.snapshot(t)
            live = self.session.views.live_rows(snap)
        m = snap.manifest
        totals = self.session.log(t).totals(m)
        return TableInfo(
            name=t,
            version=m.version,
            committed_at=m.created_at,
            rows=live,
            bytes=totals.bytes,
            data_files=m.file_count,
            tombstone_files=m.tombstone_count,
            primary_key=m.primary_key,
            properties=dict(m.properties),
        )

    # ------------------------------------------------------------ timeline

    def warm(self) -> None:
        """Read every table's timeline now (metadata only, no lock), so the
        first table page a person opens finds it read: what ``castsql ui``
        does in the background while the browser starts."""
        for t in self.tables():
            with contextlib.suppress(CastSQLError):
                self.timeline(t)

    def kept(self, table: str) -> list[int]:
        """The kept versions of ``table``, ascending (one listing)."""
        return self.log(table).versions()

    def timeline(self, table: str, versions: list[int] | None = None) -> list[Point]:
        """One :class:`Point` per kept version (or per one of ``versions``),
        oldest first, from metadata only; versions read before are not read again."""
        name = self.name(table)
        log = self.session.log(name)
        tl = self._timelines.setdefault(name, _Timeline())
        kept = log.versions() if versions is None else versions
        todo = [v for v in kept if v not in tl.points]
        if todo:
            for v, r in log.prefetch_records(todo).items():
                tl.points[v] = _point(log, r)
            for v in todo:  # a version the light read skipped: its full manifest says why
                if v not in tl.points:
                    with contextlib.suppress(CastSQLError):
                        tl.points[v] = _point(log, log.manifest(v))
        return [tl.points[v] for v in kept if v in tl.points]

    def commit_meta(self, table: str, version: int) -> str:
        """Version ``version``'s commit metadata in one line (writer, commit
        id, the writer's summary and extra fields); kept once read."""
        key = (self.name(table), version)
        got = self._meta.get(key)
        if got is None:
            try:
                m = self.session.log(key[0]).manifest(version)
            except CastSQLError as e:
                return f"Error: {one_line(e)}"
            meta = {"writer": m.writer, "commit": m.commit_id, **(m.summary or {}), **(m.extra or {})}
            got = ", ".join(f"{k}={v}" for k, v in meta.items() if v not in (None, "", [], {}))
            self._meta[key] = got
        return got

    def manifest(self, table: str, version: int) -> Manifest:
        """Version ``version`` of ``table``; NotFound as the shell says it
        (``table t: version 9 does not exist (latest is 5)``)."""
        name = self.name(table)
        try:
            return self.session.log(name).manifest(version, probe=True)
        except VersionNotFound as e:
            raise NotFound(f"table {name}: {str(e).split(': ', 1)[-1]}") from None

    def history(self, table: str) -> tuple[pa.Table, bool]:
        """The history audit (exact rows inserted, updated, deleted, live per
        version) and whether it is of the newest version. It reads every
        version's tombstones, seconds on a long history, so it is kept per
        newest version; once a table moves, the kept one is answered at once
        (not fresh) while the new one is computed in the background, one at
        a time a table: a stream's every commit does not queue an audit."""
        name = self.name(table)
        latest = self.session.log(name).latest_version()
        with self._history_lock:
            kept = self._history.get(name)
            if kept is not None and kept[0] == latest:
                return kept[1], True
            start = name not in self._auditing
            if kept is not None and start:
                self._auditing.add(name)
        if kept is not None:
            if start:
                threading.Thread(target=self._audit, args=(name,), daemon=True).start()
            return kept[1], False
        return self._audit(name, wait=True), True

    def _audit(self, name: str, wait: bool = False) -> pa.Table:
        try:
            with self.lock:
                latest = self.session.log(name).latest_version()
                kept = self._history.get(name)
                if wait and kept is not None and kept[0] == latest:  # another request computed it meanwhile
                    return kept[1]
                h = self.session.history(name)
            with self._history_lock:
                self._history[name] = (latest, h)
            return h
        finally:
            with self._history_lock:
                self._auditing.discard(name)

    # ------------------------------------------------------------ schema

    def schema(self, table: str, version: int) -> tuple[Schema, str | None]:
        name = self.name(table)
        key = (name, version)
        got = self._schemas.get(key)
        if got is None:
            try:
                got = self.session.log(name).schema_of(version)
            except VersionNotFound as e:
                raise NotFound(f"table {name}: {str(e).split(': ', 1)[-1]}") from None
            self._schemas[key] = got
        return got

    def schema_changes(self, table: str) -> list[tuple[int, list[str]]]:
        """The versions whose schema differs from the one before, with what
        changed. A schema only grows (columns are added, types widened:
        FORMAT.md §3.4), so two versions with one schema have it in every
        version between them: a span is split only where its ends differ,
        and a history of 10,000 versions with a few changes reads a few
        dozen schemas, not 10,000."""
        kept = self.kept(table)
        out: list[tuple[int, list[str]]] = []

        def at(i: int) -> Schema | None:
            try:
                return self.schema(table, kept[i])[0]
            except CastSQLError:
                return None

        def split(lo: int, hi: int) -> None:
            a, b = at(lo), at(hi)
            if a == b:
                return
            if hi - lo == 1:
                if a is not None and b is not None:
                    out.append((kept[hi], schema_delta(a, b)))
                return
            mid = (lo + hi) // 2
            split(lo, mid)
            split(mid, hi)

        if len(kept) > 1:
            split(0, len(kept) - 1)
        return out

    # ------------------------------------------------------------ audits

    def version(self, table: str, text: str | None, default: int | None = None) -> int:
        """``text`` as a kept version of ``table``; UIError naming what is wrong."""
        if text is None or text == "":
            if default is not None:
                return default
            raise UIError(f"table {self.name(table)}: a version is needed")
        try:
            v = int(text)
        except ValueError:
            raise UIError(f"table {self.name(table)}: {text!r} is not a version number") from None
        self.manifest(table, v)  # refuses a version never committed or collected
        return v

    def diff(self, table: str, a: int, b: int) -> Diff:
        """The diff audit of versions ``a`` and ``b``, kept for paging (the
        last few asked) as the audit returned it (Arrow); a page's rows
        become Python values only when that page is drawn."""
        name = self.name(table)
        key = (name, a, b)
        got = self._diffs.get(key)
        if got is None:
            with self.lock:
                try:
                    rows = self.session.diff(name, a, b)
                except QueryError as e:
                    raise UIError(one_line(e)) from None
            got = Diff(rows)
            self._diffs[key] = got
            while len(self._diffs) > _DIFFS:
                self._diffs.popitem(last=False)
        else:
            self._diffs.move_to_end(key)
        return got

    def row_history(self, table: str, key: str) -> pa.Table:
        name = self.name(table)
        with self.lock:
            return self.session.row_history(name, key)

    # ------------------------------------------------------------ SQL

    @contextlib.contextmanager
    def relation(self, query: str) -> Iterator[duckdb.DuckDBPyRelation]:
        """``query`` planned as the shell plans it in safe mode, held under the lock."""
        with self.lock:
            try:
                rel = self.session.relation(query.strip().rstrip(";"))
            except duckdb.Error as e:
                raise QueryError(self.session.error_message(e)) from None
            if rel is None:
                raise UIError("this statement has no result to show (the UI runs SELECT queries)")
            try:
                yield rel
            except duckdb.Error as e:
                raise QueryError(self.session.error_message(e)) from None

    def page(self, query: str, offset: int, size: int) -> Page:
        """Rows ``offset`` to ``offset + size`` of ``query``'s result: DuckDB
        reads up to that row and stops (LIMIT), so nothing keeps the whole result."""
        with self.relation(query) as rel:
            got = rel.limit(size + 1, offset).fetch_arrow_table()
            return Page(
                columns=list(rel.columns),
                types=[str(t) for t in rel.types],
                rows=[list(r.values()) for r in got.slice(0, size).to_pylist()],
                offset=offset,
                more=got.num_rows > size,
            )


def _point(log: TableLog, r: VersionRecord | Manifest) -> Point:
    totals = r.totals if r.totals is not None else log.totals(r)
    change = r.change
    added = change.added_files if change is not None else ()
    return Point(
        version=r.version,
        time=r.created_at.timestamp(),
        operation=r.operation or "",
        stored_rows=totals.rows,
        files=totals.files,
        tombstones=totals.tombstones,
        bytes=totals.bytes,
        rows_written=sum(f.total_rows for f in added),
        files_added=len(added),
        files_removed=len(change.removed_files) if change is not None else 0,
        tombstones_added=len(change.added_tombstones) if change is not None else 0,
    )


def schema_delta(old: Schema, new: Schema) -> list[str]:
    """What changed from ``old`` to ``new``, one line a column."""
    out = []
    before = {c.name: c for c in old.columns}
    after = {c.name: c for c in new.columns}
    for c in new.columns:
        o = before.get(c.name)
        if o is None:
            out.append(f"added column {c.name} {c.type}")
        elif o.type != c.type:
            out.append(f"column {c.name}: {o.type} → {c.type}")
    out.extend(f"dropped column {n}" for n in before if n not in after)
    return out
