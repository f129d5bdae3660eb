"""The SQL that turns a resolved snapshot into a DuckDB view of its live rows.

Design (measured in bench/read_bench.py, see docs/ENGINE.md):

- a version whose files carry no deletes is ``read_parquet([...])`` of them: the
  raw scan, with DuckDB's own filter/projection pushdown and metadata counts;
- the files of a version that carry deletes are a DuckLake table over the same
  files plus one positional delete file per data file
  (:mod:`castsql.engine.lake`), so the deletes are applied inside the C++
  Parquet scan; each version is a snapshot of its table's DuckLake table, so
  the next version only adds what changed. Row-group deletes and key ranges
  become positions first (key ranges with one pushed-down query per file);
- a few files with deletes pruned from a version for a selective query are
  scanned and anti-joined with their deleted positions in the row groups the
  query can reach (cheaper than DuckLake per query);
- audits need row identity, so their views carry ``_file`` and ``_pos`` and
  apply deletes with an anti-join on (file_index, file_row_number).
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from castsql.engine import names
from castsql.engine.lake import Lake
from castsql.engine.physical import Group, Signatures, duck_type, projection
from castsql.errors import SchemaMismatch
from castsql.snapshot import Predicate, ResolvedFile, Snapshot, prune_files


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _file_list(uris: Sequence[str]) -> str:
    return "[" + ", ".join(sql_str(u) for u in uris) + "]"


def _bitmap_array(bm: BitMap) -> pa.Array:
    arr = bm.to_array()
    return pa.Array.from_buffers(pa.uint32(), len(arr), [None, pa.py_buffer(arr)]).cast(pa.int64())


class Views:
    """Creates views of snapshots on one DuckDB connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, workdir: str) -> None:
        self.con = con
        self.workdir = workdir
        self._lake: Lake | None = None
        self._range_cache: dict[tuple[str, tuple], BitMap] = {}
        self.signatures = Signatures(con)
        self._seq = itertools.count()

    @property
    def lake(self) -> Lake:
        if self._lake is None:
            self._lake = Lake(self.con, f"{self.workdir}/lake")
        return self._lake

    def deleted(self, snap: Snapshot, f: ResolvedFile) -> BitMap:
        """Every deleted position of ``f``, key ranges included."""
        if not f.key_ranges:
            return f.deleted
        ck = (f.uri, tuple(f.key_ranges))
        extra = self._range_cache.get(ck)
        if extra is None:
            pk = ident(snap.primary_key or "")
            cond = " OR ".join(f"{pk} BETWEEN ? AND ?" for _ in f.key_ranges)
            params = [v for r in f.key_ranges for v in r]
            sql = f"SELECT CAST(file_row_number AS UINTEGER) AS p FROM read_parquet({sql_str(f.uri)}) WHERE {cond}"
            rows = self.con.execute(sql, params).to_arrow_table()
            positions = rows.column("p").combine_chunks().to_numpy(zero_copy_only=False)
            extra = BitMap(array.array("I", positions.astype(np.uint32).tobytes()))
            self._range_cache[ck] = extra
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
    ) -> None:
        """Create (or replace) the temp view ``name`` holding the live rows of ``snap``.

        ``predicates`` prune files by manifest min/max first; ``positions`` adds
        ``_file`` (table key) and ``_pos`` (row position) columns, for audits;
        ``within``: every query of the view applies these predicates (a view of
        a pruned file set), so deletes in row groups they exclude need not apply;
        ``lake=False``: no DuckLake catalog on this connection (a user's own
        connection, where SQL could reach the catalog's functions), files with
        deletes are filtered or anti-joined. Every view has the manifest's columns, names, order and types, whatever
        the files hold (:mod:`castsql.engine.physical`).
        """
        files = prune_files(snap.files, predicates, {c.name: c.type for c in snap.schema.columns})
        con = self.con
        if positions:
            body = self._positional_body(name, snap, files)
        elif not files:
            body = self._empty(name, snap)
        else:
            # A whole version (not a file set pruned from one) is a snapshot of the
            # table's DuckLake lineage: the next version reuses what this one built.
            whole = lake and not predicates and len(files) == snap.file_count and snap.is_resolved
            branches = []
            for group, members in self._groups(files):
                proj = self._projection(snap, group, members[0])
                clean = [f for f in members if not f.has_deletes]
                dirty = [f for f in members if f.has_deletes]
                if clean:
                    branches.append(f"SELECT {proj} FROM read_parquet({_file_list([f.uri for f in clean])})")
                if dirty and whole:
                    # The DuckLake table holds the files as they are; the projection maps them.
                    scan = self.lake.scan(
                        (snap.table_uri, group.signature),
                        names.table_of(name),
                        group.signature,
                        snap.version,
                        {f.uri: self.deleted(snap, f) for f in dirty},
                    )
                    branches.append(f"SELECT {proj} FROM {scan}")
                elif dirty:
                    branches.append(self._anti_join(name, snap, proj, group, dirty, within))
            body = " UNION ALL ".join(branches)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {body}")

    def _anti_join(
        self, view: str, snap: Snapshot, proj: str, group: Group, files: list[ResolvedFile], within: Sequence
    ) -> str:
        """A few files with deletes (a file set pruned for a selective query),
        each scanned and anti-joined with its deleted positions, only those in
        the row groups whose statistics may match ``within`` (the predicates
        every query of this view applies, so rows of the other row groups never
        reach the result): the join builds a few thousand positions, not every
        one of the file, and skips DuckLake's per-query cost
        (docs/PERFORMANCE.md, "Selective queries")."""
        branches = []
        seq = next(self._seq)
        for i, f in enumerate(files):
            dead = self.deleted(snap, f)
            keep = self._row_groups(f.uri, group, snap, within)
            if keep is not None:
                dead = dead & keep
            name = names.internal("del", seq, i, owner=view)  # owned by the view: dropped with it
            arr = np.frombuffer(dead.to_array(), dtype=np.uint32)
            runs = _runs(arr)
            if len(runs) <= _RANGE_RUNS:  # none, or whole row groups: a filter DuckDB applies while scanning
                cut = " OR ".join(f"file_row_number BETWEEN {a} AND {b}" for a, b in runs)
                where = f" WHERE NOT ({cut})" if runs else ""
                branches.append(f"SELECT {proj} FROM read_parquet({sql_str(f.uri)}){where}")
                continue
            arrow = names.internal("arrow", seq, i, owner=view)
            self.con.register(arrow, pa.table({"pos": pa.array(arr)}))
            try:
                self.con.execute(
                    f"CREATE OR REPLACE TEMP TABLE {ident(name)} AS SELECT CAST(pos AS BIGINT) AS pos "
                    f"FROM {ident(arrow)}"
                )
            finally:
                self.con.unregister(arrow)
            branches.append(
                f"SELECT {proj} FROM (SELECT *, file_row_number AS {_POS} FROM read_parquet({sql_str(f.uri)})) p "
                f"ANTI JOIN {ident(name)} d ON p.{_POS} = d.pos"
            )
        return " UNION ALL ".join(branches)

    def _row_groups(self, uri: str, group: Group, snap: Snapshot, within: Sequence) -> BitMap | None:
        """The positions of the row groups of ``uri`` whose footer statistics may
        match every predicate of ``within`` (conservative: a statistic that is
        missing or of another type keeps the row group); None: all of them."""
        types = {c.name: c.type for c in snap.schema.columns}
        physical = {n.lower(): (n, t) for n, t in group.signature}
        excluded, params = [], []
        for p in within:
            col = physical.get(p.column.lower())
            if col is None or p.value is None or p.column not in types or col[1] != duck_type(types[p.column]):
                continue  # a converted column: its raw statistics are not the manifest's values
            t = col[1]
            lo, hi = f"TRY_CAST(stats_min_value AS {t})", f"TRY_CAST(stats_max_value AS {t})"
            proof = {"=": f"({lo} > ? OR {hi} < ?)", "==": f"({lo} > ? OR {hi} < ?)", "<": f"{lo} >= ?",
                     "<=": f"{lo} > ?", ">": f"{hi} <= ?", ">=": f"{hi} < ?"}.get(p.op)  # fmt: skip
            if proof is None:
                continue
            excluded.append(f"(path_in_schema = ? AND {proof})")
            params += [col[0], *([p.value] * proof.count("?"))]
        if not excluded:
            return None
        rows = self.con.execute(
            f"SELECT row_group_id, max(row_group_num_rows), coalesce(bool_or({' OR '.join(excluded)}), false) "
            "FROM parquet_metadata(?) GROUP BY row_group_id ORDER BY row_group_id",
            [*params, uri],
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
        owned = self.con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, 'castsql/del/')"
        ).fetchall()
        for (table,) in owned:
            if table.split("/", 4)[-1] == name:  # castsql/del/<seq>/<i>/<view>
                self.con.execute(f"DROP TABLE IF EXISTS temp.{ident(table)}")

    def _positional_body(self, name: str, snap: Snapshot, files: list[ResolvedFile]) -> str:
        if not files:
            return f"SELECT *, NULL::VARCHAR AS _file, NULL::BIGINT AS _pos FROM ({self._empty(name, snap)})"
        branches = []
        for n, (group, members) in enumerate(self._groups(files)):
            proj = self._projection(snap, group, members[0])
            keys = pa.table(
                {"file_index": pa.array(range(len(members)), pa.uint64()), "_file": [f.key for f in members]}
            )
            files_view, deletes_view = names.internal("files", n, owner=name), names.internal("deletes", n, owner=name)
            self.con.register(files_view, keys)
            self.con.register(deletes_view, _positions(self, snap, members))
            cols = ", ".join(f"p.{ident(c)}" for c in snap.schema.names)
            branches.append(
                f"SELECT {cols}, k._file, p.{_POS} AS _pos "
                f"FROM (SELECT {proj}, file_index AS {_FI}, file_row_number AS {_POS} "
                f"FROM read_parquet({_file_list([f.uri for f in members])})) p "
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


_RANGE_RUNS = 32  # deleted positions in at most this many runs are a range filter, not an anti-join


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """The runs of consecutive values of sorted ``positions``, as inclusive
    (first, last) pairs; stops counting past ``_RANGE_RUNS``."""
    if not len(positions):
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1)
    if len(breaks) >= _RANGE_RUNS:
        return [(0, 0)] * (_RANGE_RUNS + 1)
    starts = np.concatenate(([positions[0]], positions[breaks + 1]))
    ends = np.concatenate((positions[breaks], [positions[-1]]))
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
