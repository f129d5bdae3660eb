"""The SQL that turns a resolved snapshot into a DuckDB view of its live rows.

Design (measured in bench/read_bench.py, see docs/ENGINE.md):

- a version whose files carry no deletes is ``read_parquet([...])`` of them: the
  raw scan, with DuckDB's own filter/projection pushdown and metadata counts;
- the files of a version that carry deletes are a DuckLake table over the same
  files plus one positional delete file per data file
  (:mod:`castsql.engine.duckdb.lake`), so the deletes are applied inside the C++
  Parquet scan; each version is a snapshot of its table's DuckLake table, so
  the next version only adds what changed. Row-group deletes and key ranges
  become positions first (key ranges with one pushed-down query per file);
- a few files with deletes pruned from a version for a selective query, and
  a version's provisional view (its table's first in the session; with
  CastSQL's extension, any new version's first), are scanned and filtered by
  their deleted positions in the row groups the query can reach: through
  CastSQL's extension (:mod:`castsql.engine.duckdb.native`, a bit per row read in
  the pipeline) where it is built, else with an anti-join;
- audits need row identity, so their views carry ``_castsql_file`` and ``_castsql_pos`` and
  apply deletes with an anti-join on (file_index, file_row_number).
"""

from __future__ import annotations

import array
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import AbstractBitMap, BitMap

from castsql.engine.arrow_tables import temp_table
from castsql.engine.duckdb import native
from castsql.engine.duckdb.stores import know_sizes
from castsql.engine.physical import Group, Signatures, duck_type, projection
from castsql.engine.sql import names
from castsql.engine.sql.quoting import ident, live_parquet, parquet_files, sql_str, sql_value
from castsql.errors import SchemaMismatch
from castsql.format.schema import type_from_name
from castsql.format.tombstone import key_bound
from castsql.snapshot import Predicate, ResolvedFile, Snapshot, prune_files

if TYPE_CHECKING:
    from castsql.engine.duckdb.lake import Lake
    from castsql.engine.duckdb.threads import RemoteThreads


def types_of(snap: Snapshot) -> dict[str, str]:
    """Column name -> manifest type of ``snap``."""
    return {c.name: c.type for c in snap.schema.columns}


def _uint32(values: np.ndarray | array.array) -> pa.Array:
    return native.buffer_array(pa.uint32(), values)


def _bitmap_array(bm: AbstractBitMap) -> pa.Array:
    return _uint32(bm.to_array()).cast(pa.int64())


class Views:
    """Creates views of snapshots on one DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, workdir: str) -> None:
        self.con = con
        self.workdir = workdir
        self._lake: Lake | None = None
        self._range_cache: OrderedDict[tuple[str, tuple], AbstractBitMap] = OrderedDict()  # at most _RANGE_CACHE
        self._reach_cache: OrderedDict[tuple, AbstractBitMap | None] = OrderedDict()  # at most _RANGE_CACHE
        self.signatures = Signatures(con)
        self._seq = itertools.count()
        self._lake_at: dict[str, tuple[object, int]] = {}  # view -> (DuckLake lineage, version) it reads
        # view -> what its deletes read: position tables (names) and bitmap sets
        # of CastSQL's extension (numbers)
        self._tables: dict[str, list[str | int]] = {}
        self._new_tables: list[str | int] = []  # made for the view being created
        self.bitmaps = native.Bitmaps(con) if native.loaded(con) else None
        self.threads: RemoteThreads | None = None  # set by a session on S3

    def note_reads(self, files: Iterable[ResolvedFile]) -> None:
        """Data files the coming query reads (for its threads: castsql.engine.duckdb.threads)."""
        if self.threads is not None:
            self.threads.note((f.uri, row_groups(f)) for f in files if "://" in f.uri)

    def release_threads(self) -> None:
        """Never choose the threads again (a user set them)."""
        if self.threads is not None:
            self.threads.release()

    def settle_threads(self) -> None:
        """Set the threads of the query about to run (castsql.engine.duckdb.threads)."""
        if self.threads is not None:
            self.threads.settle()

    @property
    def lake(self) -> Lake:
        if self._lake is None:
            from castsql.engine.duckdb.lake import Lake  # with DuckLake: not imported by a read that needs none

            self._lake = Lake(self.con, f"{self.workdir}/lake")
        return self._lake

    def deleted(self, snap: Snapshot, f: ResolvedFile) -> AbstractBitMap:
        """Every deleted position of ``f``, key ranges included."""
        if not f.key_ranges:
            return f.deleted
        ck = (f.uri, tuple(f.key_ranges))
        extra = self._range_cache.get(ck)
        if extra is not None:
            self._range_cache.move_to_end(ck)
        else:
            pk = ident(snap.primary_key or "")
            col = snap.schema.column(snap.primary_key or "")
            t = type_from_name(col.type) if col is not None else pa.null()
            # Bounds as the key's own values (FORMAT.md §4: times as instants, a
            # naive key's in UTC), not as text DuckDB would cast its own way.
            cond = " OR ".join(
                f"{pk} BETWEEN {sql_value(key_bound(lo, t))} AND {sql_value(key_bound(hi, t))}"
                for lo, hi in f.key_ranges
            )
            sql = f"SELECT CAST(file_row_number AS UINTEGER) AS p FROM {parquet_files([f.uri])} WHERE {cond}"
            rows = self.con.execute(sql).to_arrow_table()
            col = rows.column("p").combine_chunks()  # UINTEGER, no NULLs: its data buffer is the positions
            positions = (
                np.frombuffer(col.buffers()[1], dtype=np.uint32, count=len(col), offset=4 * col.offset)
                if len(col)
                else np.empty(0, np.uint32)
            )
            extra = BitMap(array.array("I", positions.tobytes()))  # not to_numpy: that imports pandas
            self._range_cache[ck] = extra
            while len(self._range_cache) > _RANGE_CACHE:
                self._range_cache.popitem(last=False)
        return f.deleted | extra

    def live_rows(self, snap: Snapshot) -> int:
        """Live rows of ``snap``: its stored rows minus its deleted positions, from
        the metadata; a file with key-range deletes reads its key column once
        (the positions are kept for its views)."""
        n = snap.live_rows
        if n is not None:
            return n
        ranged = [k for k, d in snap.deletes.items() if d.key_ranges and k not in snap.gone]
        n = snap.stored_rows - sum(len(d.deleted) for k, d in snap.deletes.items() if k not in ranged)
        return n - sum(len(self.deleted(snap, f)) for f in snap.resolved(sorted(ranged)))

    def create(
        self,
        name: str,
        snap: Snapshot,
        *,
        predicates: Sequence[Predicate] = (),
        positions: bool = False,
        within: Sequence[Predicate] = (),
        lake: bool = True,
        settle: bool = False,
    ) -> bool:
        """Create (or replace) the temp view ``name`` holding the live rows of ``snap``.

        ``predicates`` prune files by manifest min/max first; ``positions`` adds
        ``ROW_FILE`` (table key) and ``ROW_POS`` (row position) columns, for
        audits and writes (names no table column can have: FORMAT.md §3.1);
        ``within``: every query of the view applies these predicates (a view of
        a pruned file set), so deletes in row groups they exclude need not apply;
        ``lake=False``: no DuckLake catalog on this connection (a user's own
        connection, where SQL could reach the catalog's functions), files with
        deletes are filtered or anti-joined. Every view has the manifest's columns, names, order and types, whatever
        the files hold (:mod:`castsql.engine.physical`).

        A whole version of a table that has no DuckLake table in this session
        yet applies its deletes with an anti-join: setting DuckLake up costs a
        fixed ~0.2 s that only pays back over several queries, and a script that
        reads a version once should not pay it (docs/PERFORMANCE.md, "The first
        read in a fresh process"). Returns True for such a provisional view;
        ``settle=True`` builds the DuckLake table instead (the session does that
        when the view is queried again).
        """
        files = prune_files(snap.files, predicates, {c.name: c.type for c in snap.schema.columns})
        know_sizes((f.uri, f.entry.size_bytes) for f in files)
        self.note_reads(files)
        con = self.con
        self._drop_tables(self._new_tables)  # left by a create that failed before its view existed
        self._new_tables = []
        provisional = False
        lake_at: tuple[object, int] | None = None
        if positions:
            body = self._positional_body(name, snap, files)
        elif not files:
            body = self._empty(name, snap)
        else:
            # A whole version (not a file set pruned from one) is a snapshot of the
            # table's DuckLake lineage: the next version reuses what this one built.
            whole = lake and not predicates and len(files) == snap.file_count and snap.is_resolved
            branches: list[str] = []
            for group, members in self._groups(files):
                proj = self._projection(snap, group, members[0])
                clean = [f for f in members if not f.has_deletes]
                dirty = [f for f in members if f.has_deletes]
                clean_at = len(branches)  # clean files come first, as they always have
                lineage = (snap.table_uri, group.signature)
                # With CastSQL's extension a new version of a table DuckLake
                # already holds is provisional too: its first query binds the
                # bitmaps of the files the commit changed instead of waiting for
                # a catalog write (~70 ms); the session settles it when read again.
                # (A key range counts as every row deleted: its positions are not read yet.)
                sizes = [(f.total_rows, f.total_rows if f.key_ranges else len(f.deleted)) for f in dirty]
                known = self._lake is not None and self._lake.has(lineage) and not self._fits_native(sizes)
                if dirty and whole and (settle or known):
                    # The DuckLake table holds the files as they are; the projection maps them.
                    scan = self.lake.scan(
                        lineage,
                        names.table_of(name),
                        group.signature,
                        snap.version,
                        {f.uri: self.deleted(snap, f) for f in dirty},
                    )
                    branches.append(f"SELECT {proj} FROM {scan}")
                    lake_at = (lineage, snap.version)
                elif dirty:
                    # Deletes skipped inside DuckDB's reader cost a scan no more than
                    # DuckLake's would: such a version is never moved into DuckLake.
                    provisional = provisional or (whole and not self._in_reader(sizes))
                    scan, clean = self._anti_join(name, snap, proj, group, dirty, within, clean)
                    if scan:
                        branches.append(scan)
                if clean:
                    branches.insert(clean_at, f"SELECT {proj} FROM {parquet_files([f.uri for f in clean])}")
            body = " UNION ALL ".join(branches) if branches else self._empty(name, snap)
        made, self._new_tables = self._new_tables, []
        try:
            con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {body}")
        except BaseException:
            self._drop_tables(made)
            raise
        # The position tables of what the view showed before.
        self._drop_tables(self._tables.pop(name, []))
        if made:
            self._tables[name] = made
        before = self._lake_at.pop(name, None)
        if lake_at is not None:
            self._lake_at[name] = lake_at
        for pinned in {pin[0] for pin in (before, lake_at) if pin is not None}:
            self._trim(pinned)
        return provisional

    def _trim(self, lineage: object) -> None:
        """Let the lake forget versions of ``lineage`` no view shows (``Lake.trim``)."""
        if self._lake is not None:
            self._lake.trim(lineage, {v for lk, v in self._lake_at.values() if lk == lineage})

    def _anti_join(
        self,
        view: str,
        snap: Snapshot,
        proj: str,
        group: Group,
        files: list[ResolvedFile],
        within: Sequence,
        clean: list[ResolvedFile],
    ) -> tuple[str, list[ResolvedFile]]:
        """A few files with deletes (a file set pruned for a selective query),
        each scanned and anti-joined with its deleted positions, only those in
        the row groups whose statistics may match ``within`` (the predicates
        every query of this view applies, so rows of the other row groups never
        reach the result): the join builds a few thousand positions, not every
        one of the file, and skips DuckLake's per-query cost
        (docs/PERFORMANCE.md, "Selective queries"). Returns the SQL and the
        files of ``clean`` (the group's files without deletes) it did not
        take: where the deletes are skipped inside DuckDB's reader and the
        clean files hold fewer rows than these (a stream's small new files
        beside a large base), they join that one scan (no bitmap bound to
        them), as a union of two scans cost such a table's aggregate a fifth
        more than one."""
        branches: list[str] = []
        # (file, its deleted positions as an array where counted, the bitmap)
        scattered: list[tuple[ResolvedFile, Any, AbstractBitMap]] = []
        seq = next(self._seq)
        deads = []
        for f in files:
            dead = self.deleted(snap, f)
            keep = self._reachable(f.uri, group, snap, within)
            if keep is not None and not keep:
                continue  # no row group can match what every query of this view asks
            deads.append((f, dead if keep is None else dead & keep))
        live = self._fits_native((f.total_rows, len(dead)) for f, dead in deads)
        # Inside DuckDB's reader a bitmap costs no more than a range filter,
        # which must project file_row_number: runs (whole row groups) too.
        in_reader = live and native.scans(self.con)
        for f, dead in deads:
            if (in_reader and dead) or (live and self.bitmaps is not None and self.bitmaps.holds(f.uri, dead)):
                scattered.append((f, None, dead))  # scattered when bound before: no runs to count
                continue
            arr = np.frombuffer(dead.to_array(), dtype=np.uint32)
            runs = _runs(arr)
            if len(runs) <= _RANGE_RUNS:  # none, or whole row groups: a filter DuckDB applies while scanning
                cut = " OR ".join(f"file_row_number BETWEEN {a} AND {b}" for a, b in runs)
                where = f" WHERE NOT ({cut})" if runs else ""
                branches.append(f"SELECT {proj} FROM {parquet_files([f.uri])}{where}")
            else:
                scattered.append((f, arr, dead))
        if scattered and live:
            # Not when the clean files hold more rows: read_parquet answers their
            # count(*) from the footers, which this scan cannot (castsql_scan.cpp).
            small = sum(f.total_rows for f in clean) <= sum(f.total_rows for f, _, _ in scattered)
            took = clean if in_reader and small else []
            branches.append(self._live_filter(proj, [(f, None) for f in took] + [(f, d) for f, _, d in scattered]))
            clean = clean[len(took) :]
        elif len(scattered) == 1:
            ((f, arr, _),) = scattered
            table = self._positions_table(names.internal("del", seq, 0, owner=view), {"pos": _uint32(arr)})
            branches.append(
                f"SELECT {proj} FROM (SELECT *, file_row_number AS {_POS} FROM {parquet_files([f.uri])}) p "
                f"ANTI JOIN {table} d ON p.{_POS} = d.pos"
            )
        elif scattered:
            # One scan of them all, not a branch per file: a plan of thousands of
            # branches takes longer to bind than the join takes to run.
            index = np.concatenate([np.full(len(a), i, dtype=np.uint32) for i, (_, a, _) in enumerate(scattered)])
            pos = np.concatenate([a for _, a, _ in scattered])
            table = self._positions_table(
                names.internal("del", seq, 0, owner=view), {"file_index": _uint32(index), "pos": _uint32(pos)}
            )
            files_sql = parquet_files([f.uri for f, _, _ in scattered])
            branches.append(
                f"SELECT {proj} FROM (SELECT *, file_index AS {_FI}, file_row_number AS {_POS} "
                f"FROM {files_sql}) p ANTI JOIN {table} d ON p.{_FI} = d.file_index AND p.{_POS} = d.pos"
            )
        return " UNION ALL ".join(branches), clean

    def _fits_native(self, files: Iterable[tuple[int, int]]) -> bool:
        """Whether the extension is loaded and can hold the deletes of ``files``
        (rows, deleted rows) within ``_NATIVE_BYTES``."""
        if self.bitmaps is None:
            return False
        return sum(native.bitmap_bytes(rows, deleted) for rows, deleted in files) <= _NATIVE_BYTES

    def _in_reader(self, files: Iterable[tuple[int, int]]) -> bool:
        """Whether the deletes of ``files`` (rows, deleted rows) are skipped
        inside DuckDB's Parquet reader (``"castsql/parquet"``)."""
        return native.scans(self.con) and self._fits_native(files)

    def _live_filter(self, proj: str, files: list[tuple[ResolvedFile, AbstractBitMap | None]]) -> str:
        """One scan of ``files`` that skips their deleted positions, held as
        bitmaps by CastSQL's extension: inside DuckDB's Parquet reader, which
        then decodes only the live rows (``"castsql/parquet"``), or, without
        ``castsql_scan``, a bit read per row in the pipeline; an anti-join
        would hash every position and probe every row (docs/PERFORMANCE.md,
        "Deletes applied in the pipeline")."""
        assert self.bitmaps is not None
        set_id = self.bitmaps.bind([(f.uri, f.total_rows, dead) for f, dead in files])
        self._new_tables.append(set_id)
        uris = [f.uri for f, _ in files]
        if native.scans(self.con):
            return f"SELECT {proj} FROM {live_parquet(uris, set_id)}"
        return f'SELECT {proj} FROM {parquet_files(uris)} WHERE "castsql/live"({set_id}, file_index, file_row_number)'

    def _positions_table(self, name: str, columns: dict[str, pa.Array]) -> str:
        """A temp table of ``columns`` (BIGINT), named ``name``; returns its quoted name."""
        cols = ", ".join(f"CAST({c} AS BIGINT) AS {c}" for c in columns)
        quoted = temp_table(self.con, name, pa.table(columns), cols)
        self._new_tables.append(name)
        return quoted

    def _reachable(self, uri: str, group: Group, snap: Snapshot, within: Sequence) -> AbstractBitMap | None:
        """``_row_groups``, remembered: data files never change, and the first
        query after a commit usually asks what the one before it asked."""
        types = tuple((p.column, types_of(snap).get(p.column)) for p in within)
        ck = (uri, group.signature, tuple(within), types)
        if ck in self._reach_cache:
            self._reach_cache.move_to_end(ck)
            return self._reach_cache[ck]
        keep = self._row_groups(uri, group, snap, within)
        self._reach_cache[ck] = keep
        while len(self._reach_cache) > _RANGE_CACHE:
            self._reach_cache.popitem(last=False)
        return keep

    def _row_groups(self, uri: str, group: Group, snap: Snapshot, within: Sequence) -> AbstractBitMap | None:
        """The positions of the row groups of ``uri`` whose footer statistics may
        match every predicate of ``within`` (conservative: a statistic that is
        missing or of another type keeps the row group); None: all of them."""
        types = {c.name: c.type for c in snap.schema.columns}
        physical = {n.lower(): (n, t) for n, t in group.signature}
        excluded = []
        for p in within:
            col = physical.get(p.column.lower())
            if col is None or p.value is None or p.column not in types or col[1] != duck_type(types[p.column]):
                continue  # a converted column: its raw statistics are not the manifest's values
            t = col[1]
            try:
                v = sql_value(p.value)
            except TypeError:
                continue
            lo, hi = f"TRY_CAST(stats_min_value AS {t})", f"TRY_CAST(stats_max_value AS {t})"
            proof = {"=": f"({lo} > {v} OR {hi} < {v})", "==": f"({lo} > {v} OR {hi} < {v})", "<": f"{lo} >= {v}",
                     "<=": f"{lo} > {v}", ">": f"{hi} <= {v}", ">=": f"{hi} < {v}"}.get(p.op)  # fmt: skip
            if proof is not None:
                excluded.append(f"(path_in_schema = {sql_str(col[0])} AND {proof})")
        if not excluded:
            return None
        rows = self.con.execute(
            f"SELECT row_group_id, max(row_group_num_rows), coalesce(bool_or({' OR '.join(excluded)}), false) "
            f"FROM parquet_metadata({sql_str(uri)}) GROUP BY row_group_id ORDER BY row_group_id"
        ).fetchall()
        keep, start = BitMap(), 0
        for _, n, gone in rows:
            if not gone:
                keep.add_range(start, start + n)
            start += n
        return keep

    def _groups(self, files: list[ResolvedFile]) -> list[tuple[Group, list[ResolvedFile]]]:
        by_uri = {f.uri: f for f in files}
        return [(g, [by_uri[u] for u in g.uris]) for g in self.signatures.groups_of(files)]

    def _projection(self, snap: Snapshot, group: Group, first: ResolvedFile) -> str:
        try:
            return projection(snap.schema, group.signature, first.uri)
        except SchemaMismatch as e:
            raise SchemaMismatch(f"version {snap.version}: {e}") from None

    def _empty(self, name: str, snap: Snapshot) -> str:
        empty = names.internal("empty", owner=name)
        self.con.register(empty, snap.schema.to_arrow().empty_table())
        return f"SELECT * FROM {ident(empty)}"

    def drop(self, name: str) -> None:
        """Drop the view ``name`` and the position tables of its anti-joins (one
        over files without deletes: no DuckLake table behind it)."""
        self.con.execute(f"DROP VIEW IF EXISTS {ident(name)}")
        self._drop_tables(self._tables.pop(name, []))
        before = self._lake_at.pop(name, None)
        if before is not None:
            self._trim(before[0])

    def close(self) -> None:
        """Free the extension's bitmaps (they live in the process, not in the
        connection, which is about to close)."""
        if self.bitmaps is not None:
            self.bitmaps.close()
        self._tables = {k: [t for t in v if not isinstance(t, int)] for k, v in self._tables.items()}

    def _drop_tables(self, tables: Sequence[str | int]) -> None:
        for table in tables:
            if isinstance(table, int):
                assert self.bitmaps is not None
                self.bitmaps.forget(table)
            else:
                self.con.execute(f"DROP TABLE IF EXISTS temp.{ident(table)}")

    def _positional_body(self, name: str, snap: Snapshot, files: list[ResolvedFile]) -> str:
        if not files:
            return f"SELECT *, NULL::VARCHAR AS {ROW_FILE}, NULL::BIGINT AS {ROW_POS} FROM ({self._empty(name, snap)})"
        branches = []
        for n, (group, members) in enumerate(self._groups(files)):
            proj = self._projection(snap, group, members[0])
            keys = pa.table(
                {"file_index": pa.array(range(len(members)), pa.uint64()), ROW_FILE: [f.key for f in members]}
            )
            files_view, deletes_view = names.internal("files", n, owner=name), names.internal("deletes", n, owner=name)
            self.con.register(files_view, keys)
            self.con.register(deletes_view, _positions(self, snap, members))
            cols = ", ".join(f"p.{ident(c)}" for c in snap.schema.names)
            branches.append(
                f"SELECT {cols}, k.{ROW_FILE}, p.{_POS} AS {ROW_POS} "
                f"FROM (SELECT {proj}, file_index AS {_FI}, file_row_number AS {_POS} "
                f"FROM {parquet_files([f.uri for f in members])}) p "
                f"JOIN {ident(files_view)} k ON p.{_FI} = k.file_index "
                f"ANTI JOIN {ident(deletes_view)} d ON p.{_FI} = d.file_index AND p.{_POS} = d.pos"
            )
        return " UNION ALL ".join(branches)


def _positions(views: Views, snap: Snapshot, files: list[ResolvedFile]) -> pa.Table:
    """(file_index, pos) of every deleted position of ``files``, indexed in their order."""
    idx, pos = [], []
    for i, f in enumerate(files):
        bm = views.deleted(snap, f)
        if bm:
            idx.append(pa.array(np.full(len(bm), i, dtype=np.uint64)))
            pos.append(_bitmap_array(bm))
    return pa.table(
        {
            "file_index": pa.concat_arrays(idx) if idx else pa.array([], pa.uint64()),
            "pos": pa.concat_arrays(pos) if pos else pa.array([], pa.int64()),
        }
    )


_FI, _POS = "__castsql_file_index", "__castsql_pos"
# A row's identity in a positional view: its file's table key and position.
ROW_FILE, ROW_POS = "_castsql_file", "_castsql_pos"


_RANGE_CACHE = 1024  # files' key-range positions kept (a session's memory stays bounded)
_NATIVE_BYTES = 256 << 20  # a whole version's deletes the extension may hold for its provisional view
_RANGE_RUNS = 32  # deleted positions in at most this many runs are a range filter, not an anti-join


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """The runs of consecutive values of sorted ``positions``, as inclusive
    (first, last) pairs; stops counting past ``_RANGE_RUNS``."""
    if not len(positions):
        return []
    head = positions[: 64 * _RANGE_RUNS]  # scattered positions show it early: no pass over all of them
    if len(head) < len(positions) and np.count_nonzero(np.diff(head) != 1) >= _RANGE_RUNS:
        return [(0, 0)] * (_RANGE_RUNS + 1)
    breaks = np.flatnonzero(np.diff(positions) != 1)
    if len(breaks) >= _RANGE_RUNS:
        return [(0, 0)] * (_RANGE_RUNS + 1)
    starts = np.concatenate(([positions[0]], positions[breaks + 1]))
    ends = np.concatenate((positions[breaks], [positions[-1]]))
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def row_groups(f: ResolvedFile) -> int:
    """Row groups of ``f`` as its entry (or its deletes) record them."""
    return len(f.row_group_rows) if f.row_group_rows is not None else f.entry.row_group_count
