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
- the relation is a view, so DuckDB's projection pushdown applies: a
  ``count(*)`` or a query of two columns reads only those columns.

The finest grain DuckDB's Parquet reader skips is a row group (CastSQL writes
122,880 rows to one): a change scattered over a large file costs the row
groups it touches (docs/PERFORMANCE.md, "Audits").
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from castsql.engine import names
from castsql.engine.arrow_tables import temp_table
from castsql.engine.physical import Group, duck_type, projection
from castsql.engine.quoting import ident, parquet_files, sql_value
from castsql.engine.views import Views
from castsql.errors import SchemaMismatch
from castsql.format import DataFile
from castsql.format.arrays import from_numpy
from castsql.format.schema import Schema
from castsql.snapshot import ResolvedFile
from castsql.snapshot.changes import FileRows

INSERTED, DELETED = 0, 1
# Columns the relation adds to the table's (reserved names: FORMAT.md §3.1).
KIND, VERSION, TIME = "_castsql_kind", "_commit_version", "_commit_timestamp"
_FID, _POS = "_castsql_fid", "_castsql_pos"
# A file scanned for at most this many positions, and for under a quarter of
# its rows, gets them as a filter (row groups without one are skipped); more
# positions than that make the filter cost more than the rows it skips.
_IN_LIST = 20_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Step:
    """The rows one version inserted and deleted (or, for a diff, the
    difference between two versions), by data file and position."""

    version: int
    committed_at: datetime
    inserted: list[FileRows]
    deleted: list[FileRows]
    keys: tuple | None = None  # every primary key it changed (sorted JSON statistics), when recorded

    def only(self, wanted: Callable[[DataFile], bool]) -> Step:
        """The rows of files ``wanted`` accepts (by their statistics)."""
        return Step(
            self.version,
            self.committed_at,
            [r for r in self.inserted if wanted(r.file.entry)],
            [r for r in self.deleted if wanted(r.file.entry)],
            self.keys,
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
        self._tables: dict[str, str] = {}  # relation -> its events table

    def create(self, name: str, schema: Schema, steps: Sequence[Step], keys: KeyFilter | None = None) -> str:
        """Create (or replace) the temp view ``name``: every row the steps
        inserted or deleted, in ``schema``'s columns (a column a file predates is
        NULL, a widened one cast), plus ``_castsql_kind`` (0 inserted, 1 deleted),
        ``_commit_version`` and ``_commit_timestamp``. Returns its quoted name."""
        uses: dict[str, list[tuple[BitMap, int, int, datetime]]] = {}
        files: dict[str, ResolvedFile] = {}
        for s in steps:
            for kind, rows in ((INSERTED, s.inserted), (DELETED, s.deleted)):
                for fr in rows:
                    files.setdefault(fr.file.uri, fr.file)
                    uses.setdefault(fr.file.uri, []).append((fr.positions, kind, s.version, s.committed_at))
        if keys is not None and uses:
            uses = self._narrow(name, schema, [files[u] for u in uses], uses, keys)
        old = self._tables.pop(name, None)
        if old is not None:
            self.con.execute(f"DROP TABLE IF EXISTS {ident(old)}")
        if not uses:
            return self._empty(name, schema)
        scans, order = self._scans(name, schema, [files[u] for u in uses], uses, keys)
        events = names.internal("events", owner=name)
        self._events(events, order, uses)
        self._tables[name] = events
        body = " UNION ALL ".join(scans)
        cols = ", ".join(f"r.{ident(c)}" for c in schema.names)
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS SELECT {cols}, e.k AS {KIND}, e.v AS {VERSION}, "
            f"e.ts AS {TIME} FROM ({body}) r JOIN {ident(events)} e ON r.{_FID} = e.fid AND r.{_POS} = e.pos"
        )
        return ident(name)

    def _scans(
        self,
        name: str,
        schema: Schema,
        files: list[ResolvedFile],
        uses: dict[str, list[tuple[BitMap, int, int, datetime]]],
        keys: KeyFilter | None,
    ) -> tuple[list[str], list[str]]:
        """One scan per physical schema of the files read (nearly) whole, and
        one per file of which few positions are wanted; returns the scans and
        the file order their file ids follow."""
        by_uri = {f.uri: f for f in files}
        scans, order = [], []
        where = f" WHERE {keys.sql()}" if keys is not None else ""
        for group in self.views.signatures.groups_of(files):
            proj = self._projection(name, schema, group)
            whole = []
            for uri in group.uris:
                f = by_uri[uri]
                wanted = _union([p for p, *_ in uses[uri]])
                few = len(wanted) <= _IN_LIST and 4 * len(wanted) < f.total_rows and _groups(f) > 1
                if not few:
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
        return scans, order

    def _narrow(
        self, name: str, schema: Schema, files: list[ResolvedFile], uses: dict, keys: KeyFilter
    ) -> dict[str, list[tuple[BitMap, int, int, datetime]]]:
        """``uses`` cut to the positions whose key is in ``keys``' range: one
        scan of the key column, which row-group statistics prune (a row's
        history reads the row groups that may hold its key, not the changes)."""
        scans, order = [], []
        for group in self.views.signatures.groups_of(files):
            proj = self._projection(name, schema, group)
            scans.append(
                f"SELECT {_FID}, {_POS} FROM (SELECT {proj}, (file_index + {len(order)})::UINTEGER AS {_FID}, "
                f"file_row_number AS {_POS} FROM {parquet_files(group.uris)}) WHERE {keys.sql()}"
            )
            order += group.uris
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

    def _events(self, table: str, order: list[str], uses: dict) -> None:
        fid, pos, kind, ver, ts = [], [], [], [], []
        for i, uri in enumerate(order):
            for bm, k, v, t in uses[uri]:
                p = np.frombuffer(bm.to_array(), dtype=np.uint32)
                fid.append(np.full(len(p), i, dtype=np.uint32))
                pos.append(p)
                kind.append(np.full(len(p), k, dtype=np.int8))
                ver.append(np.full(len(p), v, dtype=np.int64))
                ts.append(np.full(len(p), (t - _EPOCH) // timedelta(microseconds=1), dtype=np.int64))
        cols = {
            "fid": from_numpy(np.concatenate(fid)),
            "pos": from_numpy(np.concatenate(pos).astype(np.int64)),
            "k": from_numpy(np.concatenate(kind)),
            "v": from_numpy(np.concatenate(ver)),
            "ts": from_numpy(np.concatenate(ts), pa.timestamp("us", tz="UTC")),
        }
        temp_table(self.con, table, pa.table(cols))

    def _empty(self, name: str, schema: Schema) -> str:
        cols = ", ".join(f"NULL::{duck_type(c.type)} AS {ident(c.name)}" for c in schema.columns)
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS SELECT {cols}, NULL::TINYINT AS {KIND}, "
            f"NULL::BIGINT AS {VERSION}, NULL::TIMESTAMPTZ AS {TIME} LIMIT 0"
        )
        return ident(name)

    def drop(self, name: str) -> None:
        self.con.execute(f"DROP VIEW IF EXISTS {ident(name)}")
        events = self._tables.pop(name, None)
        if events is not None:
            self.con.execute(f"DROP TABLE IF EXISTS {ident(events)}")


def _union(bitmaps: list[BitMap]) -> BitMap:
    return bitmaps[0] if len(bitmaps) == 1 else BitMap.union(*bitmaps)


def _groups(f: ResolvedFile) -> int:
    return len(f.row_group_rows) if f.row_group_rows is not None else f.entry.row_group_count
