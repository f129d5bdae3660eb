"""Audits of a table's history: what each version did, and which rows changed.

``history`` — one row per kept version: ``version, committed_at, operation,
writer, data_files, tombstone_files, files_added, files_removed,
rows_inserted, rows_updated, rows_deleted, live_rows, statement, error``
(``statement``: the SQL text that wrote the version, Delta's ``operationParameters``'
role; NULL for a write that was not SQL). Row counts are
exact: computed from what the versions hold, not copied from what a writer
claimed. On a table with a primary key a row whose key left and came back in
one version is one update (counted in ``rows_updated`` only); without a key
``rows_updated`` is NULL and an update is a delete and an insert.

``changes`` — every row inserted, updated or deleted by each version from
start to end, both included (Delta's and DuckLake's ``table_changes``), with
the table's columns plus ``_change_type``, ``_commit_version`` and
``_commit_timestamp`` (Delta Lake's change data feed's names and values:
``insert``, ``delete``, ``update_preimage``, ``update_postimage``; updates are
paired by primary key). Nothing has to be enabled in advance: a row is
identified by (data file, row position), so a version's changes are the rows
of the files it added and the positions its tombstones added
(:mod:`castsql.engine.audits.changes`). A version that recorded its change (FORMAT.md
§3.5, ``castsql.changeDataFeed``) is read from its own manifest and files
alone: its new files and its change-data file, the rows its tombstones
delete as they were; any other is found from its and its previous version's
content, reading its deleted rows from the row groups they lie in.
Compactions rewrite rows without changing them and contribute no changes.
Version 0's changes are its rows, inserted. A version's changes need the
version before it: where GC collected that one, the range is refused with
the earliest start the table still keeps.

``diff`` — the rows version ``b`` has and version ``a`` lacks and the reverse,
compared as values (``EXCEPT ALL``), updates paired by key: only files that
differ between the two versions are read, so files both hold with the same
deletes cost nothing, and rows a compaction rewrote cancel out.

``row_history`` — ``changes`` over every kept version for one key (or a key
range): versions whose data files' statistics cannot hold the key are never
read.

In SQL: ``DESCRIBE HISTORY t``, ``table_history('t')``, ``table_changes('t',
start[, end])`` (versions or timestamps), ``table_diff('t', a, b)`` and
``table_row_history('t', key[, key_hi])``: a query's plan
(:mod:`castsql.engine.sql.plan`) finds the calls, :meth:`Audits.register` makes
each a relation.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from castsql.engine.audits.changes import CHANGE, KIND, TIME, VERSION, ChangeRows, KeyFilter, Step, may_hold
from castsql.engine.physical import duck_type
from castsql.engine.sql.quoting import ident, sql_value
from castsql.engine.views import Views
from castsql.errors import CastSQLError, QueryError, VersionNotFound, one_line
from castsql.format import DataFile, Manifest, TableLog, changeblocks, keyindex
from castsql.format.arrays import py_array
from castsql.format.layout import to_table_key
from castsql.format.manifest import VersionRecord, json_stat, parse_time
from castsql.format.schema import Schema
from castsql.snapshot import Predicate, Snapshot, resolve
from castsql.snapshot.changes import FileRows, all_positions, between
from castsql.snapshot.prune import may_match
from castsql.snapshot.resolve import ResolvedFile
from castsql.storage.base import overlapped

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
        ("rows_inserted", pa.int64()),
        ("rows_updated", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("live_rows", pa.int64()),
        ("statement", pa.string()),  # the SQL text that wrote the version (FORMAT.md summary.statement)
        ("error", pa.string()),  # why this version cannot be read; NULL when it can
    ]
)

CHANGE_TYPE = "_change_type"
_NET, _REP = "_castsql_net", "_castsql_rep"  # a diff's count per distinct row, and its copies (reserved names)
AUDIT_COLUMNS = (CHANGE_TYPE, VERSION, TIME)
_STEPS = 8192  # versions' steps a session keeps
_DIFFS = 16  # diffs between two versions a session keeps
# Up to this many files, changes pair updates by a join (see _typed); past
# it, by a window (20 files: the join faster; 200: the window, for count(*)).
_PAIR_BY_JOIN = 64

Version = int | str | datetime


class Audits:
    """The audits of one session's tables, as relations on its connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views: Views) -> None:
        self.con = con
        self.views = views
        self.rows = ChangeRows(con, views)
        self._cache: OrderedDict[tuple[str, int], Step | None] = OrderedDict()  # see _steps
        self._indexes: OrderedDict[tuple[str, int], dict] = OrderedDict()  # key indexes read (FORMAT.md §3.6)
        self._inlined: dict[str, tuple[str, list[Step]]] = {}  # inline relation -> (table, steps): see explain
        self._diffs: OrderedDict[tuple[str, int, int], Step] = OrderedDict()  # see diff
        self._blocks_seen: set[tuple[str, int, int]] = set()  # change blocks found: (table, size, end)
        self._views: set[str] = set()  # audit views made and not dropped

    # ------------------------------------------------------------ history

    def history(self, log: TableLog) -> pa.Table:
        rows: list[dict[str, Any]] = []
        keyed: dict[int, Step] = {}  # versions whose updates need their keys read
        schema: Schema | None = None  # the newest of theirs
        prev: Snapshot | None = None
        pk = None
        # Versions come from the listing, and each is read on its own: a broken
        # version (latest or not: a bad manifest, a missing metadata object or
        # tombstone, metadata that disagrees with itself) gets a row saying what is
        # wrong in its error column, and the others still read (audits of old
        # versions matter most when the latest is broken).
        for v in log.versions():
            row: dict[str, Any] = {"version": v}
            try:
                m = log.manifest(v)
                pk = m.primary_key
                row.update(
                    committed_at=m.created_at,
                    operation=m.operation,
                    writer=m.writer,
                    data_files=m.file_count,
                    tombstone_files=m.tombstone_count,
                )
                said = m.summary.get("statement")
                row["statement"] = said if isinstance(said, str) else None
                snap = resolve(log, m.version)
                snap.read_objects()  # a missing or bad files object breaks the version: say so here
                row["live_rows"] = self.views.live_rows(snap)
                if m.version == 0:  # its rows are its change
                    row.update(files_added=m.file_count, files_removed=0, rows_inserted=row["live_rows"])
                    row.update(rows_deleted=0, rows_updated=0 if pk else None)
                elif prev is not None and prev.version == m.version - 1:
                    # Counted from the two versions' content, not from what the
                    # manifest's change record claims.
                    if keyindex.changes_no_rows(m):
                        new_keys, gone_keys = snap.file_diff(prev)
                        row.update(files_added=len(new_keys), files_removed=len(gone_keys))
                        row.update(rows_inserted=0, rows_deleted=0, rows_updated=0 if pk else None)
                    else:
                        d = between(prev, snap, self.views.deleted)
                        row.update(files_added=len(d.files_added), files_removed=len(d.files_removed))
                        row["rows_inserted"] = sum(len(r.positions) for r in d.inserted)
                        row["rows_deleted"] = sum(len(r.positions) for r in d.deleted)
                        row["rows_updated"] = 0 if pk else None
                        if pk and d.inserted and d.deleted:
                            keyed[v] = Step(v, m.created_at, _bare(d.inserted), _bare(d.deleted))
                            schema = snap.schema
            except (CastSQLError, duckdb.Error) as e:
                rows.append({**row, "live_rows": None, "error": str(e).splitlines()[0]})
                prev = None
                continue
            rows.append(row)
            prev = snap
        if keyed and pk and schema is not None:
            by_version = {r["version"]: r for r in rows}
            for v, n in self._updates(log, pk, schema, keyed).items():
                r = by_version[v]
                if isinstance(n, str):
                    r.update(rows_inserted=None, rows_updated=None, rows_deleted=None, error=n)
                else:
                    r.update(rows_updated=n, rows_inserted=r["rows_inserted"] - n, rows_deleted=r["rows_deleted"] - n)
        cols = [py_array([r.get(f.name) for r in rows], f.type) for f in HISTORY_SCHEMA]
        return pa.Table.from_arrays(cols, schema=HISTORY_SCHEMA)

    def _updates(self, log: TableLog, pk: str, schema: Schema, steps: dict[int, Step]) -> dict[int, int | str]:
        """Per version, how many keys it both deleted and inserted (its
        updates): the keys of all the versions' changed rows in one read, in
        the newest ``schema`` (columns are only ever added, so it reads every
        file); a version whose rows cannot be read says why instead."""
        name = f"castsql/updates/{log.uri.rstrip('/').rsplit('/', 1)[-1]}"

        def count(batch: list[Step]) -> dict[int, int | str]:
            view = self.rows.create(name, schema, batch)
            try:
                got = self.con.execute(
                    f"SELECT v, count(*) FROM (SELECT {VERSION} AS v FROM {view} GROUP BY {VERSION}, {ident(pk)} "
                    f"HAVING min({KIND}) <> max({KIND})) GROUP BY v"
                ).fetchall()
            finally:
                self.rows.drop(name)
            return {**dict.fromkeys((s.version for s in batch), 0), **dict(got)}

        try:
            return count(list(steps.values()))
        except (CastSQLError, duckdb.Error):
            out: dict[int, int | str] = {}
            for v, s in steps.items():
                try:
                    out.update(count([s]))
                except (CastSQLError, duckdb.Error) as e:
                    out[v] = str(e).splitlines()[0]
            return out

    # ------------------------------------------------------------ changes

    def changes(
        self, log: TableLog, disp: str, name: str, start: Version, end: Version | None = None, *, inline: bool = False
    ) -> str:
        """Create the view ``name`` of the rows each version from ``start`` to
        ``end``, both included, inserted, updated or deleted (Delta's and
        DuckLake's ``table_changes``); returns its quoted name. Timestamps
        (``str`` or ``datetime``) name the commits made from ``start`` up to
        ``end``. With ``inline`` no view is made: returns its SELECT in
        parentheses, to stand where the view's name would (see :meth:`explain`)."""
        first, last = self._range(log, disp, start, end)
        blocks, covered = self._blocks(log, first, last)
        steps = self._steps(log, first, last, covered=covered)
        schema, pk = log.schema_of(last)  # nothing of the version's files is read
        return self._paired(name, disp, schema, pk, steps, inline=inline, blocks=blocks)

    def row_history(
        self, log: TableLog, disp: str, name: str, lo: Any, hi: Any | None = None, *, inline: bool = False
    ) -> str:
        """Create the view ``name`` of every change of the rows whose primary key
        is ``lo`` (or in [``lo``, ``hi``]) over the kept versions (``inline``: as
        :meth:`changes`)."""
        latest = log.latest()  # its schema and key: nothing of the version's files is read
        pk = latest.primary_key
        if pk is None:
            raise CastSQLError(f"table {disp}: table_row_history needs a primary key, and the table has none")
        col = latest.schema.column(pk)
        assert col is not None
        lo, hi = self._key(disp, pk, col.type, lo), self._key(disp, pk, col.type, lo if hi is None else hi)
        types = {pk: col.type}
        preds = [Predicate(pk, ">=", lo), Predicate(pk, "<=", hi)]
        earliest = log.earliest_version()
        span = (json_stat(lo), json_stat(hi))
        # Version 0's rows are its changes; a later earliest kept version's
        # change cannot be told (the one before it is collected).
        first = -1 if earliest == 0 else earliest
        steps = self._steps(log, first, latest.version, lambda entry: may_match(entry, preds, types), span)
        return self._paired(name, disp, latest.schema, pk, steps, KeyFilter(pk, lo, hi), inline=inline)

    def _key(self, disp: str, pk: str, type_: str, value: Any) -> Any:
        try:
            return self.con.execute(f"SELECT CAST({sql_value(value)} AS {duck_type(type_)})").fetchall()[0][0]
        except (duckdb.Error, TypeError):
            raise CastSQLError(f"table {disp}: {value!r} is not a value of the primary key {pk!r} ({type_})") from None

    def diff(self, log: TableLog, disp: str, name: str, a: Version, b: Version) -> str:
        """Create the view ``name``: the rows version ``b`` holds and ``a`` does
        not (``insert``), the reverse (``delete``), paired by key into updates."""
        va, vb = self._version(log, disp, a), self._version(log, disp, b)
        sa, sb = resolve(log, va, probe=True), resolve(log, vb, probe=True)
        # Two versions never change, nor do the rows between them: a diff
        # asked again (the shell's count, then its rows) skips comparing the
        # two versions' files (~50 ms for 1,000 files).
        ck = (log.uri, va, vb)
        step = self._diffs.get(ck)
        if step is None:
            d = between(sa, sb, self.views.deleted)
            step = Step(vb, sb.manifest.created_at, _bare(d.inserted), _bare(d.deleted))
            self._diffs[ck] = step
            while len(self._diffs) > _DIFFS:
                self._diffs.popitem(last=False)
        else:
            self._diffs.move_to_end(ck)
        schema = sb.schema if vb >= va else sa.schema
        _check_names(disp, schema)
        inner = _inner(name)
        view = self._rows(disp, inner, schema, [step] if step.inserted or step.deleted else [])
        cols = ", ".join(ident(c) for c in schema.names)
        # Each side less the other, as whole rows (values a compaction
        # rewrote unchanged cancel out): EXCEPT ALL both ways, computed as one
        # count per distinct row (inserted minus deleted) and that many copies
        # of the side that is ahead. One aggregation, not two set operations
        # that each hash both sides: a fifth less for a diff of 80,000 rows.
        # GROUP BY, like EXCEPT, takes NULLs as equal.
        net = (
            f"WITH c AS (SELECT {cols}, CAST(sum(CASE WHEN {KIND} = 0 THEN 1 ELSE -1 END) AS BIGINT) AS {_NET} "
            f"FROM {view} GROUP BY ALL HAVING {_NET} <> 0) "
            f"SELECT {cols}, CASE WHEN {_NET} > 0 THEN 0 ELSE 1 END AS {KIND} "
            f"FROM c, range(abs({_NET})) AS {_REP}({_REP})"
        )
        pk = sb.primary_key
        kind = _change_type(pk, "")
        order = f"{ident(pk)}, " if pk else ""
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS SELECT {cols}, {kind} AS {CHANGE_TYPE} "
            f"FROM ({net}) ORDER BY {order}{KIND} DESC"
        )
        self._views.add(name)
        return ident(name)

    def drop(self, name: str) -> None:
        self._drop_view(name)
        self.rows.drop(_inner(name))
        self._inlined.pop(name, None)

    def explain(self, e: BaseException, names: Iterable[str]) -> str | None:
        """DuckDB's error ``e`` in a query that read the inline relations
        ``names``, when it names a file one of them reads: the message
        :meth:`_readable` gives where a view is made (the file and the version
        whose change it holds); else None."""
        msg = one_line(e)
        for name in names:
            made = self._inlined.get(name)
            found = _named(made[0], made[1], msg) if made is not None else None
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------ parts

    def _paired(
        self,
        name: str,
        disp: str,
        schema: Schema,
        pk: str | None,
        steps: list[Step],
        keys: KeyFilter | None = None,
        *,
        inline: bool = False,
        blocks: list[tuple[str, int, int]] | None = None,
    ) -> str:
        """The view ``name`` over the steps' rows (and the ``blocks``' rows, see
        :meth:`_blocks`) with Delta's change types, in commit order (and key
        order within a version, an update's preimage first); with ``inline``
        its SELECT in parentheses, no view made."""
        _check_names(disp, schema)
        # One view over the rows' SELECT, not a view over a view of them:
        # DuckDB binds each view when it is made and again in every query.
        with self._readable(disp, steps):
            rows = self.rows.relation(_inner(name), schema, steps, keys, blocks or ())
            body = _typed(schema, pk, rows, steps)
            if inline:
                # No view at all: making one binds the SELECT (its files'
                # footers, its plan) once more than the query does, ~3 ms
                # for one merge in a fresh session.
                self._drop_view(name)
                self._inlined[name] = (disp, steps)
                return f"({body})"
            self._inlined.pop(name, None)
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {body}")
            self._views.add(name)
        return ident(name)

    def _drop_view(self, name: str) -> None:
        """Drop the view ``name`` if this session made one: a statement less
        for each inline audit (~0.3 ms of a one-version query)."""
        if name in self._views:
            self.con.execute(f"DROP VIEW IF EXISTS {ident(name)}")
            self._views.discard(name)

    def _rows(self, disp: str, name: str, schema: Schema, steps: list[Step], keys: KeyFilter | None = None) -> str:
        """:meth:`ChangeRows.create`, a file it cannot read named as :meth:`_readable` does."""
        with self._readable(disp, steps):
            return self.rows.create(name, schema, steps, keys)

    @contextlib.contextmanager
    def _readable(self, disp: str, steps: list[Step]) -> Iterator[None]:
        """DuckDB's error for a file it cannot read, raised as a QueryError
        naming the version whose change the file holds (DuckDB names only the path)."""
        try:
            yield
        except duckdb.Error as e:
            msg = one_line(e)
            raise QueryError(_named(disp, steps, msg) or f"table {disp}: {msg}") from None

    def _blocks(self, log: TableLog, first: int, last: int) -> tuple[list[tuple[str, int, int]], set[int]]:
        """The change blocks (FORMAT.md §3.8) that hold the changes of versions
        in (first, last], as (URI, first version, last version) of each one's
        share, and the versions they cover: from the first version on, the
        largest block holding it that ends in the range, else the version alone."""
        a = max(first + 1, 1)
        if last - a + 1 < min(changeblocks.SIZES):
            return [], set()
        ends = [(n, e) for n in changeblocks.SIZES for e in range(changeblocks.block_end(n, a), last + 1, n)]
        todo = [(n, e) for n, e in ends if (log.uri, n, e) not in self._blocks_seen]
        for (n, e), there in zip(
            todo, overlapped(lambda ne: log.storage.exists(changeblocks.block_key(*ne)), todo), strict=True
        ):
            if there:  # a block never changes; a missing one may yet be written
                self._blocks_seen.add((log.uri, n, e))
        out, covered = [], set[int]()
        v = a
        while v <= last:
            for n in changeblocks.SIZES:
                e = changeblocks.block_end(n, v)
                if e <= last and (log.uri, n, e) in self._blocks_seen:
                    out.append((log.storage.data_uri(changeblocks.block_key(n, e)), v, e))
                    covered.update(range(v, e + 1))
                    v = e + 1
                    break
            else:
                v += 1
        return out, covered

    def _steps(
        self,
        log: TableLog,
        first: int,
        last: int,
        wanted: Callable | None = None,
        keys: tuple | None = None,
        covered: set[int] | None = None,
    ) -> list[Step]:
        """What each version in (first, last] changed; compactions change
        nothing, and version 0 (``first`` -1) inserted its rows.
        ``wanted``: only files whose statistics it accepts; ``keys``: (lo, hi),
        leaving out versions whose recorded keys hold none in that range;
        ``covered``: versions left out (change blocks hold them).

        A version's step never changes, so the session keeps the newest
        ``_STEPS`` of them (rows by file and position, no snapshot): the next
        audit over the same versions, a row's history for another key above
        all, reads no metadata again."""
        out: list[Step] = []
        files: dict = {}  # entries looked up once for the whole walk
        prev: Snapshot | None = None
        rec: VersionRecord | Manifest | None = None  # the last version's record read
        skip = self._indexed_out(log, first, last, keys) if keys is not None else set()
        skip |= covered or set()
        todo = [v for v in range(max(first + 1, 1), last + 1) if (log.uri, v) not in self._cache and v not in skip]
        fetched = log.prefetch_records(sorted({u for v in todo for u in (v - 1, v)})) if len(todo) > 1 else {}
        for v in range(first + 1, last + 1):
            ck = (log.uri, v)
            if v in skip:
                prev = None
                continue
            if ck in self._cache:
                self._cache.move_to_end(ck)
                step = self._cache[ck]
                prev = None
            elif v == 0:
                step = self._origin(log)
                self._cache[ck] = step
            else:
                # Each version's record alone (raises VersionNotFound for a collected one).
                before = rec if rec is not None and rec.version == v - 1 else fetched.get(v - 1) or log.record(v - 1)
                rec = fetched.pop(v, None) or log.record(v)
                known, step = _recorded(log, before, rec)
                if known:
                    prev = None
                else:
                    if prev is None or prev.version != v - 1:
                        prev = resolve(log, v - 1)
                    cur = resolve(log, v)
                    d = between(prev, cur, self.views.deleted, files=files)
                    if d.inserted or d.deleted:
                        step = Step(v, cur.manifest.created_at, _bare(d.inserted), _bare(d.deleted))
                    prev = cur
                self._cache[ck] = step
                if len(self._cache) > _STEPS:
                    self._cache.popitem(last=False)
            if step is not None and keys is not None and not step.may_change(*keys):
                continue
            if step is not None and wanted is not None:
                step = step.only(wanted)
            if step is not None and step.any:
                out.append(step)
        return out

    def _indexed_out(self, log: TableLog, first: int, last: int, keys: tuple) -> set[int]:
        """Versions in (first, last] that the key indexes (FORMAT.md §3.6) say
        changed no key in ``keys`` (lo, hi): a row's history need not read them."""
        ends = range(keyindex.block_end(max(first + 1, 1)), last + 1, keyindex.BLOCK)
        found = {e: self._indexes.get((log.uri, e)) for e in ends}
        todo = [e for e, index in found.items() if index is None]
        for e, index in zip(todo, overlapped(lambda end: keyindex.read_index(log, end), todo), strict=True):
            found[e] = index
            if index is not None:  # an index never changes; a missing one may yet be written
                self._indexes[(log.uri, e)] = index
        while len(self._indexes) > _STEPS // keyindex.BLOCK:
            self._indexes.popitem(last=False)
        out: set[int] = set()
        for index in found.values():
            if index is not None:
                out |= {v for v, k in index.items() if first < v <= last and not may_hold(k, *keys)}
        return out

    def _range(self, log: TableLog, disp: str, start: Version, end: Version | None) -> tuple[int, int]:
        """(first, last): the versions after ``first`` up to ``last`` are the
        ones ``start`` to ``end`` name, ``start`` included."""
        # With both ends given the latest version is never read: changes between
        # old versions stay readable when the latest one is broken.
        try:
            if isinstance(start, int):
                if start < 0:
                    raise CastSQLError(f"table {disp}: table_changes start version {start} is negative")
                first = start - 1
            else:  # the commits made at or after a time: from the version before the first of them
                first = self._before(log, disp, _when(start, disp))
            # Versions named by number are only checked to be kept (their
            # records are read by the walk): a full parse is ~1 ms each.
            last = log.latest_version() if end is None else self._version(log, disp, end, parse=False)
            if first >= last and isinstance(start, int):  # a time span without commits has no changes
                raise CastSQLError(f"table {disp}: table_changes start version {first + 1} is after end version {last}")
            # GC keeps a contiguous run of versions up to the latest: if the one
            # before start (or version 0 itself) is still stored, so is every
            # version after it.
            try:
                log.kept(max(first, 0))
            except VersionNotFound as e:
                why = str(e).split(": ", 1)[-1]
                if first < 0:
                    raise VersionNotFound(f"table {disp}: {why}; {self._earliest(log)}") from None
                raise self._collected(log, disp, first + 1, why) from None
        except VersionNotFound as e:
            raise VersionNotFound(f"table {disp}: {str(e).split(': ', 1)[-1]}") from None
        return first, last

    def _collected(self, log: TableLog, disp: str, start: int, why: str | None = None) -> VersionNotFound:
        """Why the changes from ``start`` on cannot be read: the version before
        it is collected (``why``: what reading it said)."""
        why = why or f"version {start - 1} was garbage-collected (oldest kept is {log.versions()[0]})"
        return VersionNotFound(
            f"table {disp}: the changes of version {start} need the version before it: {why}; {self._earliest(log)}"
        )

    def _earliest(self, log: TableLog) -> str:
        """Where changes can start now, in words."""
        kept = log.versions()
        if kept[0] == 0 or kept[0] < kept[-1]:
            return f"changes can start from version {0 if kept[0] == 0 else kept[0] + 1}"
        return "no kept version's changes can be read"

    def _origin(self, log: TableLog) -> Step | None:
        """Version 0's change: every live row it holds, inserted."""
        snap = resolve(log, 0)
        inserted = []
        for f in snap.files:
            live = all_positions(f.total_rows) - self.views.deleted(snap, f)
            if live:
                inserted.append(FileRows(f, live))
        return Step(0, snap.manifest.created_at, _bare(inserted), []) if inserted else None

    def _version(self, log: TableLog, disp: str, v: Version, parse: bool = True) -> int:
        try:
            if isinstance(v, int):
                return log.manifest(v, probe=True).version if parse else log.kept(v)
            return log.version_at(_when(v, disp))
        except VersionNotFound as e:
            raise VersionNotFound(f"table {disp}: {str(e).split(': ', 1)[-1]}") from None

    def _before(self, log: TableLog, disp: str, when: datetime) -> int:
        try:
            return log.version_at(when - timedelta(microseconds=1))
        except VersionNotFound:
            # Every kept commit is at or after ``when``: from version 0 when it
            # is kept, else the earliest kept one's change is unknown.
            earliest = log.earliest_version()
            if earliest == 0:
                return -1
            raise self._collected(log, disp, earliest) from None


def _recorded(log: TableLog, before: VersionRecord | Manifest, m: VersionRecord | Manifest) -> tuple[bool, Step | None]:
    """``(True, step)`` when version ``m``'s change is known from its own
    manifest (FORMAT.md §3.5, :func:`castsql.format.keyindex.is_recorded`): a
    compaction changes no row; a version that only adds data files and
    tombstones whose rows its change-data file holds inserted its files' rows
    and deleted those. ``(False, None)`` when the change must be found from
    the two versions' content."""
    if keyindex.changes_no_rows(m):
        return True, None
    if not keyindex.is_recorded(before, m):
        return False, None
    assert isinstance(m, VersionRecord)
    c = m.change
    if c.change_file is not None:  # every row it changed, typed: its new files need not be read
        typed = [_whole(log, c.change_file, "change file")] if c.change_file.total_rows else []
        return True, (Step(m.version, m.created_at, [], [], c.keys, typed) if typed else None)
    inserted = [_whole(log, e, "data file") for e in c.added_files if e.total_rows]
    p = c.preimages
    deleted = [_whole(log, p, "change-data file")] if p and p.total_rows else []
    return True, (Step(m.version, m.created_at, inserted, deleted, c.keys) if inserted or deleted else None)


def _whole(log: TableLog, e: DataFile, what: str) -> FileRows:
    """Every row of the file ``e`` names (its path checked to lie in the table)."""
    key = to_table_key(e.path, log.storage.root, what=what)
    return FileRows(ResolvedFile(key, log.storage.data_uri(key), e, e.row_group_rows), all_positions(e.total_rows))


def _bare(rows: list[FileRows]) -> list[FileRows]:
    """``rows`` with files that carry no deletes: what reading them needs, and
    nothing that keeps a version's bitmaps alive in the step cache."""
    return [
        FileRows(ResolvedFile(r.file.key, r.file.uri, r.file.entry, r.file.row_group_rows), r.positions) for r in rows
    ]


def _when(v: str | datetime, disp: str) -> datetime:
    if isinstance(v, datetime):
        return v
    try:
        return parse_time(v.strip())
    except ValueError:
        raise CastSQLError(
            f"table {disp}: {v!r} is neither a version number nor a timestamp (2026-11-01 12:00:00)"
        ) from None


def _change_type(pk: str | None, version: str) -> str:
    """Delta's change type of each row: on a keyed table, a key both deleted
    and inserted by one version (in one diff) is an update."""
    plain = f"CASE WHEN {KIND} = 0 THEN 'insert' ELSE 'delete' END"
    if pk is None:
        return plain
    part = f"PARTITION BY {version + ', ' if version else ''}{ident(pk)}"
    return (
        f"CASE WHEN {ident(pk)} IS NOT NULL AND min({KIND}) OVER ({part}) <> max({KIND}) OVER ({part}) "
        f"THEN CASE WHEN {KIND} = 0 THEN 'update_postimage' ELSE 'update_preimage' END ELSE {plain} END"
    )


def _named(disp: str, steps: list[Step], msg: str) -> str | None:
    """DuckDB's one-line ``msg`` with the version whose change holds the file
    it names (DuckDB names only the path); None when it names none of theirs."""
    for s in steps:
        for kind, rows in (
            ("a file it added", s.inserted),
            ("the rows it deleted", s.deleted),
            ("its change file", s.typed),
        ):
            uri = next((r.file.uri for r in rows if r.file.uri in msg), None)
            if uri is not None:
                return f"table {disp}: version {s.version}: {uri} ({kind}) cannot be read: {msg}"
    return None


def _typed(schema: Schema, pk: str | None, rows: str, steps: list[Step]) -> str:
    """The SELECT of ``rows`` (a relation of :class:`ChangeRows`) with Delta's
    change types, in commit order (and key order within a version, an
    update's preimage first). A key both deleted and inserted by one version
    is an update: the (version, key) pairs with both kinds are found by one
    aggregation of the rows, read once (a materialized CTE), and joined back;
    a window partitioned by (version, key) gives the same types at about
    twice the cost (~7 ms of CPU for one merge's 81 rows in a fresh session),
    but only it lets a query that never reads the types skip reading the
    columns: past ``_PAIR_BY_JOIN`` files, the window."""
    cols = ", ".join(f"r.{ident(c)}" for c in schema.names)
    # A change file's rows carry their type (the writer paired them by the
    # same rule): only the other rows are paired here.
    plain = f"COALESCE(r.{CHANGE}, CASE WHEN r.{KIND} = 0 THEN 'insert' ELSE 'delete' END)"
    if pk is None or not any(s.inserted and s.deleted for s in steps):  # no version can pair a key
        order = f"r.{VERSION}, {f'r.{ident(pk)}, ' if pk else ''}r.{KIND} DESC"
        return f"SELECT {cols}, {plain} AS {CHANGE_TYPE}, r.{VERSION}, r.{TIME} FROM ({rows}) r ORDER BY {order}"
    if sum(len(s.inserted) + len(s.deleted) for s in steps) > _PAIR_BY_JOIN:
        # Many files: the window, which a query that does not read the types
        # drops with the columns it does not read (a materialized CTE reads
        # them all): count(*) over 100 merges' 200 files again in a session,
        # 72-76 ms with the window, 100-112 ms with the CTE.
        cols = ", ".join(ident(c) for c in schema.names)
        order = f"{VERSION}, {ident(pk)}, {KIND} DESC"
        return (
            f"SELECT {cols}, COALESCE({CHANGE}, {_change_type(pk, VERSION)}) AS {CHANGE_TYPE}, {VERSION}, {TIME} "
            f"FROM ({rows}) ORDER BY {order}"
        )
    k = ident(pk)
    return (
        f"WITH r AS MATERIALIZED ({rows}), "
        f"u AS (SELECT {VERSION}, {k} FROM r WHERE {k} IS NOT NULL GROUP BY ALL HAVING min({KIND}) <> max({KIND})) "
        f"SELECT {cols}, CASE WHEN r.{CHANGE} IS NOT NULL THEN r.{CHANGE} WHEN u.{k} IS NOT NULL THEN "
        f"CASE WHEN r.{KIND} = 0 THEN 'update_postimage' ELSE 'update_preimage' END ELSE {plain} END "
        f"AS {CHANGE_TYPE}, r.{VERSION}, r.{TIME} "
        f"FROM r LEFT JOIN u ON r.{VERSION} = u.{VERSION} AND r.{k} = u.{k} ORDER BY r.{VERSION}, r.{k}, r.{KIND} DESC"
    )


def _check_names(disp: str, schema: Schema) -> None:
    clash = [c for c in schema.names if c.lower() in AUDIT_COLUMNS]
    if clash:
        raise CastSQLError(
            f"table {disp}: its column {clash[0]!r} has the name of a column audits add "
            f"({', '.join(AUDIT_COLUMNS)}), so its changes cannot be shown "
            "(Delta Lake refuses such a table's change feed too)"
        )


def _inner(name: str) -> str:
    return name.replace("castsql/", "castsql/rows/", 1)
