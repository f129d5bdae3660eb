"""The rows behind audits, read at the cost of the change.

An audit (``table_changes``, ``table_diff``, ``table_row_history``, history's
counts) is a list of steps, each what a
:class:`~castsql.snapshot.changes.Difference` between two snapshots found:
per data file, the positions that entered or left the live set. This module
turns them into one DuckDB relation of those rows and nothing else:

- one *event* per (file, position, step): which version, inserted or
  deleted, held in a temp table;
- the files are scanned once each, whatever the number of steps naming them
  (a row inserted and later deleted inside a range is read once), and joined
  to the events on (file, position);
- a file of which only a few positions are wanted (a merge's tombstones in a
  large file) is scanned with those positions as an ``IN`` filter on DuckDB's
  ``file_row_number``, which skips every row group holding none of them; the
  reader stops inside a row group after the last one it needs;
- a file of which more positions are wanted, but under half its rows (a diff
  across many merges of a large file), is read with the others bound as
  deleted in CastSQL's extension, so DuckDB's reader decodes only the wanted
  rows and the join with the events probes only those;
- the relation is a view, so DuckDB's projection pushdown applies: a
  ``count(*)`` or a query of two columns reads only those columns.

The finest grain DuckDB's Parquet reader skips is a row group (CastSQL writes
122,880 rows to one): a change scattered over a large file costs the row
groups it touches (docs/PERFORMANCE.md, "Audits").
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import AbstractBitMap, BitMap

from castsql.engine.arrow_tables import temp_table
from castsql.engine.duckdb import native
from castsql.engine.physical import Group, duck_type, projection
from castsql.engine.sql import names
from castsql.engine.sql.quoting import ident, live_parquet, parquet_files, sql_value
from castsql.engine.views import Views, row_groups
from castsql.errors import SchemaMismatch
from castsql.format import DataFile
from castsql.format.arrays import from_numpy
from castsql.format.schema import Schema
from castsql.snapshot import ResolvedFile
from castsql.snapshot.changes import FileRows

INSERTED, DELETED = 0, 1
TYPED = 2  # a change file's rows (FORMAT.md §3.5): each row's kind is its own ``_change_type``
# Columns the relation adds to the table's (reserved names: FORMAT.md §3.1).
KIND, VERSION, TIME = "_castsql_kind", "_commit_version", "_commit_timestamp"
CHANGE = "_castsql_change"  # a change file's row's Delta change type; NULL for other rows
_TYPE_COLUMN = "_change_type"  # the change file's column of it
_INSERTS = "('insert', 'update_postimage')"
_FID, _POS = "_castsql_fid", "_castsql_pos"
# A file scanned for at most this many positions, and for under a quarter of
# its rows, gets them as a filter (row groups without one are skipped); more
# positions than that make the filter cost more than the rows it skips.
_IN_LIST = 20_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TAGS_IN_TEXT = 64  # files read whole whose tags a query spells out; past that, a temp table


@dataclass(frozen=True, slots=True)
class Step:
    """The rows one version inserted and deleted (or, for a diff, the
    difference between two versions), by data file and position."""

    version: int
    committed_at: datetime
    inserted: list[FileRows]
    deleted: list[FileRows]
    keys: tuple | None = None  # every primary key it changed (sorted JSON statistics), when recorded
    typed: list[FileRows] = field(default_factory=list)  # its change file: rows that carry their change type

    @property
    def any(self) -> bool:
        """Whether it names any row."""
        return bool(self.inserted or self.deleted or self.typed)

    def only(self, wanted: Callable[[DataFile], bool]) -> Step:
        """The rows of files ``wanted`` accepts (by their statistics)."""
        return Step(
            self.version,
            self.committed_at,
            [r for r in self.inserted if wanted(r.file.entry)],
            [r for r in self.deleted if wanted(r.file.entry)],
            self.keys,
            [r for r in self.typed if wanted(r.file.entry)],
        )

    def may_change(self, lo: object, hi: object) -> bool:
        """False when its recorded keys hold none in [lo, hi] (JSON statistics)."""
        return may_hold(self.keys, lo, hi)


def may_hold(keys: Sequence[Any] | None, lo: object, hi: object) -> bool:
    """False when the sorted ``keys`` (JSON statistics; None: unknown) hold none in [lo, hi]."""
    if keys is None:
        return True
    try:
        i = bisect.bisect_left(keys, lo)
        return i < len(keys) and keys[i] <= hi
    except TypeError:  # keys of another JSON type: cannot tell
        return True


@dataclass(frozen=True, slots=True)
class KeyFilter:
    """Only rows whose primary key is in [lo, hi] (a row's history)."""

    column: str
    lo: object
    hi: object

    def sql(self) -> str:
        c = ident(self.column)
        if self.lo == self.hi:
            return f"{c} = {sql_value(self.lo)}"
        return f"{c} BETWEEN {sql_value(self.lo)} AND {sql_value(self.hi)}"


class ChangeRows:
    """Makes the relation of a list of steps' rows on one connection; owns the
    temp tables behind each relation it made, by the relation's name."""

    def __init__(self, con: duckdb.DuckDBPyConnection, views: Views) -> None:
        self.con = con
        self.views = views
        self._tables: dict[str, list[str]] = {}  # relation -> its events and tags tables
        self._sets: dict[str, list[int]] = {}  # relation -> the extension's sets its scans bind
        self._views: set[str] = set()  # views create() made and drop() has not dropped

    def create(self, name: str, schema: Schema, steps: Sequence[Step], keys: KeyFilter | None = None) -> str:
        """Create (or replace) the temp view ``name`` of :meth:`relation`'s rows;
        returns its quoted name."""
        body = self.relation(name, schema, steps, keys)
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {body}")
        self._views.add(name)
        return ident(name)

    def relation(
        self,
        name: str,
        schema: Schema,
        steps: Sequence[Step],
        keys: KeyFilter | None = None,
        blocks: Sequence[tuple[str, int, int]] = (),
    ) -> str:
        """The SELECT of every row the steps inserted or deleted, in ``schema``'s
        columns (a column a file predates is NULL, a widened one cast), plus
        ``_castsql_kind`` (0 inserted, 1 deleted), ``_commit_version``,
        ``_commit_timestamp`` and ``_castsql_change`` (a change file's row's
        change type, else NULL); what it reads (an events table, the extension's
        sets) is kept under ``name`` until :meth:`drop`. A caller that wraps it
        in its own view spares DuckDB binding a second one (~1.5 ms a query).
        ``blocks``: change blocks (FORMAT.md §3.8) as (URI, first version,
        last version): their rows of those versions too."""
        uses: dict[str, list[tuple[AbstractBitMap, int, int, datetime]]] = {}
        files: dict[str, ResolvedFile] = {}
        for s in steps:
            for kind, rows in ((INSERTED, s.inserted), (DELETED, s.deleted), (TYPED, s.typed)):
                for fr in rows:
                    files.setdefault(fr.file.uri, fr.file)
                    uses.setdefault(fr.file.uri, []).append((fr.positions, kind, s.version, s.committed_at))
        if keys is not None and uses:
            uses = self._narrow(name, schema, [files[u] for u in uses], uses, keys)
        self._release(name)
        parts = self._blocks(name, schema, blocks) if blocks else []
        if not uses:
            return " UNION ALL ".join(parts) if parts else self._empty(schema)
        cols = ", ".join(f"r.{ident(c)}" for c in schema.names)
        typed = any(k == TYPED for used in uses.values() for _, k, _, _ in used)
        # A change file's row is inserted or deleted as its change type says.
        kind_sql = (
            f"CASE WHEN r.{CHANGE} IS NULL THEN e.k WHEN r.{CHANGE} IN {_INSERTS} THEN {INSERTED} ELSE {DELETED} END"
            if typed
            else "e.k"
        )
        out = f"SELECT {cols}, {kind_sql} AS {KIND}, e.v AS {VERSION}, e.ts AS {TIME}, r.{CHANGE} AS {CHANGE} FROM"
        # A file read whole for one step (a version's new file, a change data
        # file, a diff's file on one side only) takes its step's values by
        # file alone, from a list in the text: only the files read in part
        # fill the events table and join it on (file, position). A diff
        # across 1,000 merges: 1,000 small files tagged, one large file
        # joined on its 3% of positions.
        whole = {u: len(used) == 1 and len(used[0][0]) == files[u].total_rows for u, used in uses.items()}
        tagged = [u for u in uses if whole[u]]
        joined = [u for u in uses if not whole[u]]
        if tagged:
            scans, order = self._scans(name, schema, [files[u] for u in tagged], uses, keys)
            self.views.note_reads(files[u] for u in order)
            body = " UNION ALL ".join(scans)
            if len(order) == 1:
                # One file (a version's change file): its step's values as
                # constants, no join to bind and plan (~1 ms a query).
                _, k, v, ts = uses[order[0]][0]
                e = f"(SELECT {k}::TINYINT AS k, {v}::BIGINT AS v, {sql_value(ts)} AS ts) e"
                parts.append(f"{out} ({body}) r, {e}")
            else:
                tags = self._tags(name, [uses[uri][0] for uri in order])
                parts.append(f"{out} ({body}) r JOIN {tags} ON r.{_FID} = e.fid")
        if joined:
            scans, order = self._scans(name, schema, [files[u] for u in joined], uses, keys)
            self.views.note_reads(files[u] for u in order)
            events = names.internal("events", owner=name)
            self._events(events, order, uses)
            self._tables.setdefault(name, []).append(events)
            body = " UNION ALL ".join(scans)
            parts.append(f"{out} ({body}) r JOIN {ident(events)} e ON r.{_FID} = e.fid AND r.{_POS} = e.pos")
        return " UNION ALL ".join(parts)

    def _blocks(self, name: str, schema: Schema, blocks: Sequence[tuple[str, int, int]]) -> list[str]:
        """The rows of change blocks, each of its versions in the range asked:
        every row carries its version, time and change type."""
        sigs = self.views.signatures.of([u for u, _, _ in blocks])
        out = []
        for uri, lo, hi in blocks:
            proj = self._projection(name, schema, Group(sigs[uri], (uri,)))
            out.append(
                f"SELECT {proj}, (CASE WHEN {_TYPE_COLUMN} IN {_INSERTS} THEN {INSERTED} ELSE {DELETED} END)::TINYINT "
                f"AS {KIND}, {VERSION}::BIGINT AS {VERSION}, {TIME} AS {TIME}, {_TYPE_COLUMN}::VARCHAR AS {CHANGE} "
                f"FROM {parquet_files([uri])} WHERE {VERSION} BETWEEN {lo} AND {hi}"
            )
        return out

    def _scans(
        self,
        name: str,
        schema: Schema,
        files: list[ResolvedFile],
        uses: dict[str, list[tuple[AbstractBitMap, int, int, datetime]]],
        keys: KeyFilter | None,
    ) -> tuple[list[str], list[str]]:
        """One scan per physical schema of the files read (nearly) whole, and
        one per file of which few positions are wanted; returns the scans and
        the file order their file ids follow."""
        by_uri = {f.uri: f for f in files}
        scans: list[str] = []
        order: list[str] = []
        where = f" WHERE {keys.sql()}" if keys is not None else ""
        sieve = self.views.bitmaps is not None and native.scans(self.con)
        for group in self.views.signatures.groups_of(files):
            proj = self._projection(name, schema, group)
            for uris in _by_typed(group.uris, uses):
                # A change file's rows carry their change type; other files' rows NULL.
                ct = f"{ident(_TYPE_COLUMN)}::VARCHAR" if uses[uris[0]][0][1] == TYPED else "NULL::VARCHAR"
                wanted = {u: (by_uri[u], _union([p for p, *_ in uses[u]])) for u in uris}
                scans += self._scans_of(name, f"{proj}, {ct} AS {CHANGE}", wanted, where, sieve, order)
        return scans, order

    def _scans_of(
        self,
        name: str,
        proj: str,
        files: dict[str, tuple[ResolvedFile, AbstractBitMap]],
        where: str,
        sieve: bool,
        order: list,
    ) -> list[str]:
        """The scans of ``files`` (one physical schema; each with the positions
        wanted) through ``proj``; each file read is appended to ``order``."""
        scans = []
        whole, sieved = [], []
        for uri, (f, wanted) in files.items():
            few = len(wanted) <= _IN_LIST and 4 * len(wanted) < f.total_rows and row_groups(f) > 1
            if not few:
                if sieve and 2 * len(wanted) < f.total_rows:
                    sieved.append((f, wanted))
                else:
                    whole.append(uri)
                continue
            inlist = ", ".join(map(str, wanted))
            scans.append(
                f"SELECT * FROM (SELECT {proj}, {len(order)}::UINTEGER AS {_FID}, file_row_number AS {_POS} "
                f"FROM {parquet_files([uri])} WHERE file_row_number IN ({inlist})){where}"
            )
            order.append(uri)
        if whole:
            scans.append(
                f"SELECT * FROM (SELECT {proj}, (file_index + {len(order)})::UINTEGER AS {_FID}, "
                f"file_row_number AS {_POS} FROM {parquet_files(whole)}){where}"
            )
            order += whole
        if sieved:
            scans.append(self._sieve(name, proj, len(order), sieved, where))
            order += [f.uri for f, _ in sieved]
        return scans

    def _sieve(
        self, name: str, proj: str, first: int, files: list[tuple[ResolvedFile, AbstractBitMap]], where: str
    ) -> str:
        """One scan of ``files`` that decodes only the wanted positions of each:
        the others are bound as deleted in CastSQL's extension, so DuckDB's
        reader drops them before decoding a column and the join with the events
        probes only the wanted rows (a diff across 1,000 merges wants 3% of a
        large file's rows, scattered over every row group)."""
        assert self.views.bitmaps is not None
        bound = []
        for f, wanted in files:
            unwanted = BitMap()
            unwanted.add_range(0, f.total_rows)
            bound.append((f.uri, f.total_rows, unwanted - wanted))
        set_id = self.views.bitmaps.bind(bound)
        self._sets.setdefault(name, []).append(set_id)
        scan = live_parquet([f.uri for f, _ in files], set_id)
        return (
            f"SELECT * FROM (SELECT {proj}, (file_index + {first})::UINTEGER AS {_FID}, file_row_number AS {_POS} "
            f"FROM {scan}){where}"
        )

    def _narrow(
        self, name: str, schema: Schema, files: list[ResolvedFile], uses: dict, keys: KeyFilter
    ) -> dict[str, list[tuple[AbstractBitMap, int, int, datetime]]]:
        """``uses`` cut to the positions whose key is in ``keys``' range: one
        scan of the key column, which row-group statistics prune (a row's
        history reads the row groups that may hold its key, not the changes)."""
        scans: list[str] = []
        order: list[str] = []
        for group in self.views.signatures.groups_of(files):
            proj = self._projection(name, schema, group)
            scans.append(
                f"SELECT {_FID}, {_POS} FROM (SELECT {proj}, (file_index + {len(order)})::UINTEGER AS {_FID}, "
                f"file_row_number AS {_POS} FROM {parquet_files(group.uris)}) WHERE {keys.sql()}"
            )
            order += group.uris
        self.views.note_reads(files)
        self.views.settle_threads()
        found = self.con.execute(" UNION ALL ".join(scans)).fetchall()
        at: dict[str, BitMap] = {}
        for fid, pos in found:
            at.setdefault(order[fid], BitMap()).add(pos)
        out = {}
        for uri, used in uses.items():
            here = at.get(uri)
            kept = [(bm & here, k, v, t) for bm, k, v, t in used] if here is not None else []
            kept = [u for u in kept if u[0]]
            if kept:
                out[uri] = kept
        return out

    def _projection(self, name: str, schema: Schema, group: Group) -> str:
        try:
            return projection(schema, group.signature, group.uris[0])
        except SchemaMismatch as e:
            raise SchemaMismatch(f"{names.table_of(name)}: {e}") from None

    def _tags(self, name: str, tags: list[tuple[AbstractBitMap, int, int, datetime]]) -> str:
        """The step values of files read whole, by file id, as ``e(fid, k, v,
        ts)``: a list in the text for a few files (a temp table costs ~3 ms a
        query), a temp table for many (DuckDB binds a VALUES list's thousands
        of casts slower than it fills a table: a diff across 1,000 merges)."""
        if len(tags) <= _TAGS_IN_TEXT:
            values = ", ".join(
                f"({i}::UINTEGER, {k}::TINYINT, {v}::BIGINT, {sql_value(t)})" for i, (_, k, v, t) in enumerate(tags)
            )
            return f"(VALUES {values}) e(fid, k, v, ts)"
        table = names.internal("tags", owner=name)
        cols = {
            "fid": from_numpy(np.arange(len(tags), dtype=np.uint32)),
            "k": from_numpy(np.array([k for _, k, _, _ in tags], dtype=np.int8)),
            "v": from_numpy(np.array([v for _, _, v, _ in tags], dtype=np.int64)),
            "ts": from_numpy(
                np.array([(t - _EPOCH) // timedelta(microseconds=1) for *_, t in tags], dtype=np.int64),
                pa.timestamp("us", tz="UTC"),
            ),
        }
        temp_table(self.con, table, pa.table(cols))
        self._tables.setdefault(name, []).append(table)
        return f"{ident(table)} e"

    def _events(self, table: str, order: list[str], uses: dict) -> None:
        # One array per (file, step) for the positions; the other columns are
        # one value per (file, step), repeated (a diff across 1,000 merges has
        # a thousand of them: per-use arrays cost more than the rows).
        pos, fid, kind, ver, ts, lens = [], [], [], [], [], []
        for i, uri in enumerate(order):
            for bm, k, v, t in uses[uri]:
                pos.append(np.frombuffer(bm.to_array(), dtype=np.uint32))
                lens.append(len(bm))
                fid.append(i)
                kind.append(k)
                ver.append(v)
                ts.append((t - _EPOCH) // timedelta(microseconds=1))
        n = np.array(lens, dtype=np.int64)
        cols = {
            "fid": from_numpy(np.repeat(np.array(fid, dtype=np.uint32), n)),
            "pos": from_numpy(np.concatenate(pos).astype(np.int64)),
            "k": from_numpy(np.repeat(np.array(kind, dtype=np.int8), n)),
            "v": from_numpy(np.repeat(np.array(ver, dtype=np.int64), n)),
            "ts": from_numpy(np.repeat(np.array(ts, dtype=np.int64), n), pa.timestamp("us", tz="UTC")),
        }
        temp_table(self.con, table, pa.table(cols))

    def _empty(self, schema: Schema) -> str:
        cols = ", ".join(f"NULL::{duck_type(c.type)} AS {ident(c.name)}" for c in schema.columns)
        return (
            f"SELECT {cols}, NULL::TINYINT AS {KIND}, NULL::BIGINT AS {VERSION}, NULL::TIMESTAMPTZ AS {TIME}, "
            f"NULL::VARCHAR AS {CHANGE} LIMIT 0"
        )

    def drop(self, name: str) -> None:
        if name in self._views:  # a statement less where none was made (every inline audit)
            self.con.execute(f"DROP VIEW IF EXISTS {ident(name)}")
            self._views.discard(name)
        self._release(name)

    def _release(self, name: str) -> None:
        """Drop what the relation ``name`` used: its events table and its sets."""
        for table in self._tables.pop(name, []):
            self.con.execute(f"DROP TABLE IF EXISTS {ident(table)}")
        for set_id in self._sets.pop(name, []):
            assert self.views.bitmaps is not None
            self.views.bitmaps.forget(set_id)


def _by_typed(uris: Sequence[str], uses: dict[str, list[tuple[AbstractBitMap, int, int, datetime]]]) -> list[list[str]]:
    """``uris`` split into the change files (their rows carry their change type) and the others."""
    typed = [u for u in uris if uses[u][0][1] == TYPED]
    plain = [u for u in uris if uses[u][0][1] != TYPED]
    return [part for part in (plain, typed) if part]


def _union(bitmaps: list[AbstractBitMap]) -> AbstractBitMap:
    return bitmaps[0] if len(bitmaps) == 1 else BitMap.union(*bitmaps)
