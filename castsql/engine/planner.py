"""From a query's plan to the SQL DuckDB runs, with every view it reads in place.

:class:`Planner` keeps the plans of the texts it has seen (a plan depends on
the text and the catalog's names alone: a repeated query is neither
tokenized nor parsed again) and the views of the versions and pruned file
sets it made. For a plan (:mod:`castsql.engine.sql.plan`) it resolves each
reference's version (a time-travel reference that version, the others the
table's latest, asked for once per query: snapshot isolation), prunes the
files a reference's comparisons cannot match, swaps the references for the
views' names in one splice of the original text and makes sure each view
shows its version.
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import duckdb

from castsql.engine.catalog import Catalog
from castsql.engine.messages import QueryError, one_line
from castsql.engine.sql import names
from castsql.engine.sql.plan import AuditCall, Plan, parse, splice
from castsql.engine.sql.pushdown import duck_value
from castsql.engine.sql.quoting import ident, sql_list
from castsql.engine.views import Views
from castsql.errors import SchemaMismatch
from castsql.format import Manifest, TableLog
from castsql.snapshot import Predicate, Snapshot, resolve
from castsql.storage.base import in_background

_PRUNED_VIEWS = 64  # pruning results (and their views) kept per session
_ANTIJOIN_FILES = 8  # a pruned file set with deletes in at most this many files ...
_ANTIJOIN_POSITIONS = 16_000_000  # ... and at most this many rows in them is anti-joined
_PLANS = 256  # plans kept, by text


class Planner:
    """Plans of query texts, and the views the SQL they become reads."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        catalog: Catalog,
        views: Views,
        audit: Callable[[AuditCall, bool], str | None],
    ) -> None:
        self.con = con
        self.catalog = catalog
        self.views = views
        # Makes an audit call's result: a relation under its label, or (asked
        # to inline it) the SELECT to stand in the call's place, returned.
        self._audit = audit
        self.inlined: list[str] = []  # labels of the audit calls the last SQL made holds inline
        # With speculate, sql() reads each table at the head the session knows
        # and leaves in checks (log, that version, the look for the latest).
        self.speculate = False
        self.checks: list[tuple[TableLog, int, Future[Manifest]]] = []
        self.found: dict[str, int] = {}  # table URI -> the latest version such a look found
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._plans_of = catalog.generation
        # view name (lower) -> (table URI, version) it shows now
        self._views_at: dict[str, tuple[str, int]] = {}
        self._provisional: set[str] = set()  # views whose deletes are an anti-join until read again
        self._read_before: set[str] = set()  # URIs of the tables a view was made for
        # (view, version, predicates) -> view of the files they may match, None if every file
        self._pruned: OrderedDict[tuple, str | None] = OrderedDict()
        # (view, table URI, predicates) -> (newest pruned view made for them, what it shows)
        self._pruned_shows: dict[tuple, tuple[str, tuple]] = {}
        self._pruned_seq = itertools.count()

    def refresh(self) -> None:
        """Forget which version each view shows; the next query re-reads every table."""
        self._views_at.clear()

    # ------------------------------------------------------------ plans

    def plan(self, sql: str) -> Plan:
        """The plan of ``sql`` (see :func:`castsql.engine.sql.plan.parse`), memoised by text."""
        if self._plans_of != self.catalog.generation:  # a table was opened: names may read differently
            self._plans.clear()
            self._plans_of = self.catalog.generation
        p = self._plans.get(sql)
        if p is None:
            p = self._plans[sql] = parse(sql, self.catalog.logs.keys(), self.con)
            while len(self._plans) > _PLANS:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(sql)
        return p

    def sql(self, plan: Plan) -> str:
        """The SQL DuckDB runs for a bound ``plan``, every view it reads in place.

        Only the versions the statement reads are resolved: a table named only
        with ``AS OF`` is never asked for its latest version, so an old version
        reads even when the latest one is broken."""
        if plan.show_tables:
            # The opened tables, not DuckDB's temp views (versions, pruned file sets).
            tables = self.catalog.tables
            values = f"unnest({sql_list(tables)})" if tables else "NULL::VARCHAR"
            return f"SELECT {values} AS name" + ("" if tables else " WHERE false") + " ORDER BY name"
        edits: list[tuple[int, int, str]] = []
        self.inlined = []
        for call in plan.audits:
            alias = _inline_alias(plan, call)
            text = self._audit(call, alias is not None)
            if text is not None:
                self.inlined.append(call.label)
                edits.append((call.start, call.end, text + (alias or "")))
            else:
                edits.append((call.start, call.end, call.replacement))
        # view (lower) -> (view, snapshot, table as spelled); per reference, its view's key
        wanted, keys = self._wanted(plan)
        if plan.count_star is not None:
            # SELECT count(*) FROM t: the version's metadata knows (rows minus
            # deletes), on any table size, without opening a file.
            i, column = plan.count_star
            entry = wanted.get(keys[i])
            if entry is not None:
                return f"SELECT CAST({self.views.live_rows(entry[1])} AS BIGINT) AS {ident(column)}"
        # Each reference bounded by comparisons reads a view of only the files
        # whose manifest min/max can match; time-travel references read their
        # version's view; the others keep the table's name (its latest view).
        shown: Counter[str] = Counter()  # references that still read each wanted view
        for ref, key in zip(plan.refs, keys, strict=True):
            entry = wanted.get(key)
            if entry is None:
                continue
            view = self._pruned_view(entry, ref.conditions)
            if view is not None:
                edits.append((ref.start, ref.end, ident(view) + ("" if ref.has_alias else ref.alias)))
                continue
            if ref.travels:
                edits.append((ref.start, ref.end, ident(entry[0]) + ("" if ref.has_alias else ref.alias)))
            shown[key] += 1
        for key, (name, snap, table) in wanted.items():
            # A view every reference of which was swapped for a pruned one is not needed.
            count = plan.reads.get(key, 0)
            if count is None or shown[key] or count > sum(1 for k in keys if k == key):
                self.ensure_view(name, snap, table)
        return splice(plan.sql, edits) if edits else plan.sql

    def _wanted(self, plan: Plan) -> tuple[dict[str, tuple[str, Snapshot, str]], list[str]]:
        """The snapshot each view of ``plan`` shows (view name -> its name,
        snapshot, the table as the user names it), and each reference's key
        into it: a version named with ``AS OF`` resolved as asked, the latest
        as the session knows it (see :meth:`Executor.sql`'s speculation) or read now."""
        wanted: dict[str, tuple[str, Snapshot, str]] = {}
        keys: list[str] = []
        for ref in plan.refs:
            if ref.travels:
                version = ref.version
                if version is None:
                    version = self.catalog.resolve_time(ref.table, ref.timestamp or "")
                name, snap = self.version_snapshot(ref.table, version)
                wanted[name.lower()] = (name, snap, self.catalog.name(ref.table))
                keys.append(name.lower())
            else:
                keys.append(ref.table)
        for key in plan.reads:
            disp = self.catalog.name(key)
            log = self.catalog.logs[key]
            head = log.known_head() if self.speculate and plan.kinds == ("SELECT",) else None
            if log.uri in self.found:
                wanted[key] = (disp, resolve(log, self.found[log.uri]), disp)
            elif head is not None:
                # Read the head the session knows while the look for a newer
                # one runs beside the query (see Executor.sql).
                self.checks.append((log, head.version, in_background(log.latest)))
                wanted[key] = (disp, resolve(log, head.version), disp)
            else:
                wanted[key] = (disp, resolve(log), disp)
        return wanted, keys

    def _pruned_view(self, entry: tuple[str, Snapshot, str], conditions: Sequence) -> str | None:
        view, snap, table = entry
        if not conditions or snap.file_count <= 1:
            return None
        preds = self.predicates(snap, conditions)
        return self.view_for(view, snap, tuple(preds), table) if preds else None

    def predicates(self, snap: Snapshot, conditions: Sequence) -> list[Predicate]:
        """The plan's comparisons as predicates on ``snap``'s columns (those
        that compare exactly in the column's own type)."""
        columns = {c.name.lower(): c for c in snap.schema.columns}
        preds = []
        for col, op, value, vtype in conditions:
            c = columns.get(col)
            v = None if c is None else duck_value(self.con, value, vtype, c.type)
            if c is not None and v is not None:
                preds.append(Predicate(c.name, op, v))
        return preds

    # ------------------------------------------------------------ views

    def version_snapshot(self, table: str, version: int) -> tuple[str, Snapshot]:
        """The view name of ``table`` at ``version`` and its snapshot; a collected version is refused."""
        snap = self.catalog.version(table, version)
        return names.version_view(self.catalog.name(table), version), snap

    def ensure_view(self, name: str, snap: Snapshot, table: str) -> None:
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
        """``Views.create``; settled (DuckLake) unless this is the first view of
        the table, or, with CastSQL's extension, of the version."""
        # With CastSQL's extension every new version starts provisional
        # (Views.create): settled when the session reads it again.
        kw.setdefault("settle", snap.table_uri in self._read_before and self.views.bitmaps is None)
        self._read_before.add(snap.table_uri)
        try:
            return self.views.create(name, snap, **kw)
        except duckdb.Error as e:
            raise QueryError(f"table {table} version {snap.version}: {one_line(e)}") from None
        except SchemaMismatch as e:
            raise SchemaMismatch(f"table {table} {e}") from None

    def view_for(self, view: str, snap: Snapshot, preds: tuple[Predicate, ...], table: str) -> str | None:
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
            # A commit that left these files and their deletes as they were (one
            # that wrote elsewhere in the table) keeps the view an earlier
            # version made for the same predicates: the first selective query
            # after it builds nothing (docs/PERFORMANCE.md, issue 21).
            shows = _shows(pruned)
            same = (view.lower(), snap.table_uri, preds)
            earlier = self._pruned_shows.get(same)
            if earlier is not None and earlier[1] == shows and earlier[0] in self._pruned.values():
                name = earlier[0]
            else:
                name = names.pruned_view(view, next(self._pruned_seq))
                self._create_view(name, pruned, table, within=preds)
                self._pruned_shows[same] = (name, shows)
        self._pruned[key] = name
        while len(self._pruned) > _PRUNED_VIEWS:
            _, old = self._pruned.popitem(last=False)
            if old is not None and old not in self._pruned.values():
                self.views.drop(old)
                for k in [k for k, (n, _) in self._pruned_shows.items() if n == old]:
                    del self._pruned_shows[k]
        return name


def _shows(snap: Snapshot) -> tuple:
    """What a view of ``snap``'s files shows: its schema, its files and their
    deletes (compared with ``==``: bitmaps by content)."""
    return (snap.schema, snap.primary_key, tuple((f.uri, f.deleted, f.key_ranges) for f in snap.files))


# Words that end a FROM item and cannot be its alias: a relation followed by
# one of them (or by nothing, ``;``, ``)`` or ``,``) takes no alias of the user's.
_AFTER_FROM_ITEM = frozenset(
    {"WHERE", "GROUP", "ORDER", "LIMIT", "OFFSET", "UNION", "EXCEPT", "INTERSECT", "JOIN", "INNER", "LEFT", "RIGHT"}
    | {"FULL", "CROSS", "NATURAL", "POSITIONAL", "ASOF", "ANTI", "SEMI", "HAVING", "WINDOW", "QUALIFY", "ON", "USING"}
)


def _inline_alias(plan: Plan, call: AuditCall) -> str | None:
    """What follows an audit call's SELECT put in its place, where it is a
    FROM item (after ``FROM`` or ``JOIN``): `` AS "<label>"`` when the user
    gave it no alias (columns and DuckDB's messages still name it as the view
    would), "" before the user's alias; None elsewhere (``DESCRIBE``, ``COPY``
    …: a subquery is no table name there), where the view is made instead."""
    if call.kind not in ("changes", "row_history"):
        return None
    toks = plan.tokens
    at = next((i for i, t in enumerate(toks) if t.start == call.start), None)
    if at is None or at == 0 or toks[at - 1].word not in ("FROM", "JOIN"):
        return None
    nxt = next((t for t in toks[at:] if t.start >= call.end and t.kind != "comment"), None)
    if nxt is None or nxt.text in (";", ")", ",") or nxt.word in _AFTER_FROM_ITEM:
        return f" AS {call.replacement}"
    if nxt.word == "AS" or nxt.kind == "identifier":
        return ""
    return None
