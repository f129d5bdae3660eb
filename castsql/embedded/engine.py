"""The embedded write engine: append, delete, update and merge on one machine
with DuckDB in-process (no JVM). Delete, update and merge run the one write
sequence of :mod:`castsql.write.pipeline`, as Spark's engine does; this
module supplies only how rows are found (DuckDB queries over the session's
views), how expressions are typed and how files are written.

How a merge stays cheap (a 10,000-key upsert into 10M rows):

- the source's key span prunes the target's files by their min/max (only the
  metadata objects that can match are read);
- when no clause concerns target rows the source does not match (the usual
  upsert), only the key columns of those files are scanned, semi-joined with
  the source inside DuckDB: only matched rows (key, file, position) come back
  to Python, and target columns an update keeps or a condition reads are
  fetched for those rows alone;
- :func:`castsql.write.merge.actions_sql` then runs over the matched rows and
  the source; replaced and deleted rows become one tombstone (row groups,
  positions, or an exact key range where it is smaller), updated and inserted
  rows one new data file, committed as one version.

So what a merge writes is the Parquet of the changed rows plus one tombstone,
whatever the table's size. A merge with ``when_not_matched_by_source_*``
clauses (or an ``on`` predicate) reads every live row of the table instead.

Example::

    >>> import castsql, pyarrow as pa, tempfile
    >>> from castsql.format import TableLog
    >>> from castsql.storage import open_storage
    >>> store = open_storage(tempfile.mkdtemp() + "/kv")
    >>> _ = TableLog.create(store, pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key="id")
    >>> kv = castsql.open(store.root)
    >>> kv.append(pa.table({"id": [1, 2], "v": ["a", "b"]})).version
    1
    >>> m = kv.merge(pa.table({"id": [2, 3], "v": ["B", "c"]}), on="id") \\
    ...       .when_matched_update_all().when_not_matched_insert_all().execute()
    >>> m.num_target_rows_updated, m.num_target_rows_inserted, m.version
    (1, 1, 2)
    >>> sorted(kv.to_arrow().to_pylist(), key=lambda r: r["id"])
    [{'id': 1, 'v': 'a'}, {'id': 2, 'v': 'B'}, {'id': 3, 'v': 'c'}]
    >>> kv.close()
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import AbstractBitMap, BitMap

from castsql.embedded import keycache, rowcache
from castsql.engine.physical import Signatures, duck_type
from castsql.engine.sql.quoting import parquet_files
from castsql.engine.views import ROW_FILE, ROW_POS, ident
from castsql.errors import FormatError, SchemaMismatch, WriteError, one_line
from castsql.format import DataFile, Manifest, TableLog, TombstoneRecord, write_data_files
from castsql.format.datafiles import conform
from castsql.format.evolution import merged
from castsql.format.manifest import added_summary, json_stat
from castsql.format.properties import change_data_feed
from castsql.format.schema import Schema
from castsql.format.tombstone import KeyRangeDelete, serialize_tombstones
from castsql.snapshot import Predicate, ResolvedFile, Snapshot
from castsql.write import pipeline
from castsql.write.arrow import as_arrow
from castsql.write.cdc import Cdc, CdcMetrics, Check, check, deletes, prepare
from castsql.write.commit import commit_overwrite
from castsql.write.keys import check_input_keys, existing_keys
from castsql.write.merge import (
    ACTION_COL,
    ACTION_DELETE,
    ACTION_INSERT,
    ACTION_NONE,
    ACTION_UPDATE,
    MATCHES_COL,
    OLD_KEY_COL,
    MergeError,
    MergeMetrics,
    MergeSpec,
    actions_sql,
    unstorable,
)
from castsql.write.pipeline import ATTEMPTS, Counts
from castsql.write.records import FILE_COL, POS_COL, RG_COL, file_records, key_range_type, position_units

if TYPE_CHECKING:
    from castsql.engine.session import Session

# Positions and file indexes of a scan, beside the table's columns (FORMAT.md §3.1 keeps these names free).
_FI, _POS = "__castsql_fi", "__castsql_pos"
PK_COL = "_castsql_pk"  # a matched row's primary key before the write


_q = ident


class Writer:
    """The write operations of one table of a :class:`Session` (``Table``'s
    ``append``/``delete``/``update``/``merge`` call these)."""

    def __init__(self, session: Session, table: str) -> None:
        self.session = session
        self.table = table
        self._seq = itertools.count()
        self._sorted: dict[str, bool] = {}  # data files never change: is a file's key strictly increasing?

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.session.con

    @property
    def log(self) -> TableLog:
        return self.session.log(self.table)

    def _name(self, what: str) -> str:
        return f"{self.table}$write{next(self._seq)}${what}"

    # ------------------------------------------------------------------ append

    def append(
        self,
        data: Any,
        *,
        merge_schema: bool = False,
        allow_duplicate_keys: bool = False,
        attempts: int = ATTEMPTS,
    ) -> Manifest | None:
        """Commit ``data`` as new rows, one version; None when it has no rows.

        ``merge_schema``: columns the table lacks are added (nullable, at the
        end) and columns whose input type is an allowed widening are widened,
        in the same version (FORMAT.md §3.4). Table columns ``data`` lacks are
        stored as NULL, except the primary key (refused). Unless ``allow_duplicate_keys``,
        rows with a NULL primary key, one repeated in ``data`` or already in the
        table are refused (:mod:`castsql.write.keys`)."""
        where = f"table {self.table}: append"
        t, schema, new_schema, head = self._prepare(data, where, merge_schema)
        if t.num_rows == 0:
            return None
        pk = head.primary_key
        check = pk is not None and not allow_duplicate_keys
        if check and pk is not None:
            check_input_keys(self.table, pk, t.column(pk))  # before any file is written
        files = self.write_files(t, schema)
        return pipeline.append(
            self.log, self.table, files, schema=schema, new_schema=new_schema,
            keys=t.column(pk) if check else None, base=head, keys_checked=True, attempts=attempts,
        )  # fmt: skip

    def write_files(self, data: pa.Table | Iterator[pa.RecordBatch], schema: Schema, **options: Any) -> list[DataFile]:
        """``data`` (in ``schema``'s columns and types) as new data files of the
        table, their footers remembered (:meth:`Signatures.remember`)."""
        files = write_data_files(self.log.storage, data, schema, **options)
        Signatures.remember(self.log.storage, files, schema)
        return files

    def _prepare(self, data: Any, where: str, merge_schema: bool) -> tuple[pa.Table, Schema, Schema | None, Manifest]:
        """``data`` as Arrow in the table's columns and types (or the merged
        schema's), with that schema, the new schema to commit (None: unchanged)
        and the latest version they were taken from."""
        t = as_arrow(data, where)
        head = self.log.write_base()
        schema, new_schema = head.schema, None
        if merge_schema:
            new_schema = merged(head.schema, t.schema, where, head.primary_key)
            if new_schema == head.schema:
                new_schema = None
            else:
                schema = new_schema
        try:
            # Table columns the data lacks are stored as NULL, but for the primary key (FORMAT.md §3.4).
            t = conform(t, schema, where, fill_missing=True, primary_key=head.primary_key)
        except KeyError as e:
            raise SchemaMismatch(f"{where}: column {e} is missing from the data") from None
        return t, schema, new_schema, head

    def overwrite(
        self, data: Any, *, merge_schema: bool = False, allow_duplicate_keys: bool = False, attempts: int = ATTEMPTS
    ) -> Manifest:
        """Replace every row with ``data``, one ``OVERWRITE`` version (the files
        and tombstones of the version it replaces are no longer in it; older
        versions keep them for time travel until gc). The same schema and key
        rules as :meth:`append`; keys are checked within ``data`` only, as no
        other row survives."""
        where = f"table {self.table}: overwrite"
        t, schema, new_schema, head = self._prepare(data, where, merge_schema)
        pk = head.primary_key
        if pk is not None and not allow_duplicate_keys and t.num_rows:
            check_input_keys(self.table, pk, t.column(pk), "overwrite")
        files = self.write_files(t, schema) if t.num_rows else []
        return commit_overwrite(
            self.log, files, schema=schema, new_schema=new_schema, summary=added_summary(files), attempts=attempts
        )

    def existing_keys(self, snap: Snapshot, pk: str, keys: pa.Array, limit: int = 1000) -> list[Any]:
        """Up to ``limit`` of ``keys`` that live rows of ``snap`` hold
        (:func:`castsql.write.keys.existing_keys`, which Spark's append uses too:
        key-range pruned, row groups skipped by their footer statistics, only
        the key column read)."""
        return existing_keys(self.log.storage, snap, pk, keys, limit)

    # ------------------------------------------------------------------ delete / update

    def _check_text(self, text: str, op: str) -> None:
        """Refuse user SQL text that is not one expression, or that names what
        no statement may (the session's internal catalog, dynamic SQL, …): it
        runs on the session's connection, inside CastSQL's own statements, so
        the barriers of :mod:`castsql.engine.barrier.guard` must hold for it too."""
        from castsql.engine.barrier.guard import ForbiddenStatement, check_one_condition, check_statement

        check_one_condition(self.table, text)
        try:
            check_statement(f"SELECT ({text}\n)", private_paths=(self.session._workdir,))
        except ForbiddenStatement as e:
            raise WriteError(f"table {self.table}: {op}: {e}") from None

    def _condition(self, snap: Snapshot, where: str | None, op: str) -> tuple[str, list[Predicate]]:
        """The SQL condition (text the pipeline checked with :meth:`check_texts`;
        here: one boolean expression over the table's columns) and the
        predicates that prune files by min/max."""
        if where is None:
            return "TRUE", []
        empty = self._name("empty")
        self.con.register(empty, snap.schema.to_arrow().empty_table())
        try:
            kind = self.con.sql(f"SELECT ({where}\n) AS c FROM {ident(empty)}").types[0]
        except duckdb.Error as e:
            raise WriteError(f"table {self.table}: {op}: condition {where!r}: {_explain(e)}") from None
        finally:
            self.con.unregister(empty)
        if str(kind) != "BOOLEAN":
            raise WriteError(
                f"table {self.table}: {op}: the condition must be true or false for each row; {where!r} is {kind}"
            )
        plan = self.session.planner.plan(f"SELECT * FROM {ident(self.table)} WHERE ({where}\n)")
        preds = []
        if len(plan.refs) == 1:
            preds = self.session.planner.predicates(snap, plan.refs[0].conditions)
        return where, preds

    def _matched(self, snap: Snapshot, cond: str, preds: list[Predicate], exprs: Sequence[str], op: str) -> pa.Table:
        """(file, position, ``exprs``…) of the live rows where ``cond`` holds
        (WriteError naming the table and ``op`` for a failing expression)."""
        view = self._name("rows")
        self.session.views.create(view, snap.prune(preds) if preds else snap, positions=True)
        try:
            cols = "".join(f", {e}" for e in exprs)
            # A bare WHERE already drops NULL as not true; wrapped in COALESCE the
            # condition was opaque to DuckDB, which then decoded every row of the
            # table instead of pushing it into the Parquet scan (row groups
            # skipped by their statistics: a one-row delete 2.5x faster at 1M).
            return self.con.sql(
                f"SELECT {ROW_FILE} AS {_q(FILE_COL)}, {ROW_POS} AS {_q(POS_COL)}{cols} FROM {ident(view)} "
                f"WHERE ({cond}\n)"
            ).to_arrow_table()
        except duckdb.Error as e:
            raise WriteError(f"table {self.table}: {op}: {_explain(e)}; nothing was committed") from None
        finally:
            self.session.views.drop(view)

    # ------------------------------------------------------------------ the pipeline's engine

    def check_texts(self, texts: Sequence[str], op: str) -> None:
        for text in texts:
            self._check_text(text, op)

    def delete(self, where: str, *, attempts: int = ATTEMPTS) -> Manifest | None:
        """Delete the live rows where ``where`` holds: one tombstone, one
        version; None when no row matches (:func:`castsql.write.pipeline.delete`)."""
        return pipeline.delete(self, where, attempts=attempts)

    def find_delete(self, snap: Snapshot, where: str) -> _Found | None:
        cond, preds = self._condition(snap, where, "delete")
        pk = snap.primary_key
        extra = [f"{ident(pk)} AS {_q(PK_COL)}"] if pk is not None else []
        hit = self._matched(snap, cond, preds, extra, "delete")
        if hit.num_rows == 0:
            return None
        return _Found(self, snap, Counts(deleted=hit.num_rows), gone=hit)

    def update(
        self,
        set: Mapping[str, str],
        where: str | None = None,
        *,
        merge_schema: bool = False,
        attempts: int = ATTEMPTS,
    ) -> Manifest | None:
        """:func:`castsql.write.pipeline.update` on this engine."""
        return pipeline.update(self, set, where, merge_schema=merge_schema, attempts=attempts)

    def find_update(self, snap: Snapshot, set: Mapping[str, str], where: str | None) -> _Found | None:
        op = "update"
        cond, preds = self._condition(snap, where, op)
        got = self._check_exprs(snap, set, op)
        wants = {c.name: duck_type(c.type) for c in snap.schema.columns}
        lossy = _lossy([(c, wants[c], got[c], f"({e}\n)", e) for c, e in set.items()])
        exprs = []
        for c in snap.schema.columns:
            e = set.get(c.name)
            body = ident(c.name) if e is None else f"({e}\n)"
            exprs.append(f"{_cast(c.name, lossy)}({body} AS {wants[c.name]}) AS {ident(c.name)}")
        pk = snap.primary_key
        if pk is not None:
            exprs.append(f"{ident(pk)} AS {_q(PK_COL)}")  # the key the row has now
        exprs += [flag for *_, flag in lossy]
        hit = self._matched(snap, cond, preds, exprs, op)
        if hit.num_rows == 0:
            return None
        new = hit.select(snap.schema.names)
        return _Found(self, snap, Counts(updated=hit.num_rows), gone=hit, new=new,
                      inserted=np.zeros(hit.num_rows, dtype=bool), lossy=lossy, rows=hit)  # fmt: skip

    def expression_types(self, snap: Snapshot, set: Mapping[str, str], op: str) -> dict[str, pa.DataType]:
        where = f"table {self.table}: {op}"
        empty = self._name("nulls")  # one row of NULLs: typeof() tells a bare NULL from a typed one
        self.con.register(empty, pa.table({f.name: pa.nulls(1, f.type) for f in snap.schema.to_arrow()}))
        out = {}
        try:
            for col, expr in set.items():
                try:
                    got = self.con.sql(
                        f"SELECT ({expr}\n) AS v, typeof(({expr}\n)) AS t FROM {ident(empty)}"
                    ).to_arrow_table()
                except duckdb.Error as e:
                    raise WriteError(f"{where}: column {col!r} = {expr!r}: {_explain(e)}") from None
                out[col] = pa.null() if got.column("t")[0].as_py() == '"NULL"' else got.schema[0].type
        finally:
            self.con.unregister(empty)
        return out

    def _check_exprs(self, snap: Snapshot, set: Mapping[str, str], op: str) -> dict[str, str]:
        """Bind each ``set`` expression against the table's columns and cast it
        to the column's type, so an unknown column or a wrong type is named;
        each expression's DuckDB type."""
        empty = self._name("empty")
        self.con.register(empty, snap.schema.to_arrow().empty_table())
        try:
            return self._check_typed(snap.schema, set, ident(empty), op)
        finally:
            self.con.unregister(empty)

    def _check_typed(self, schema: Schema, set: Mapping[str, str], relation: str, op: str) -> dict[str, str]:
        """The one rule for a value an update or a merge clause computes (as
        Spark's): text only into a text column, and no text into another; an
        expression that does not bind is named."""
        columns = {c.name.lower(): c.type for c in schema.columns}
        error = MergeError if op == "merge" else WriteError
        types: dict[str, str] = {}
        for col, expr in set.items():
            want = duck_type(columns[col.lower()])
            try:
                got = str(self.con.sql(f"SELECT ({expr}\n) FROM {relation}").types[0])
            except duckdb.Error as e:
                raise error(f"table {self.table}: {op}: column {col!r} = {expr!r}: {_explain(e)}") from None
            if (got == "VARCHAR") != (want == "VARCHAR") and got != "NULL":
                raise error(
                    f"table {self.table}: {op}: column {col!r} is {want}, but {expr!r} is {got} (CAST it "
                    "explicitly); nothing was committed"
                )
            types[col] = got
        return types

    def _check_values(self, spec: MergeSpec, target: str, source: str, schema: Schema) -> None:
        """:meth:`_check_typed` for every value a merge clause computes, bound
        where the clause runs: over the target and the source rows."""
        sets = [c.set for c in spec.clauses if c.set and c.action != ACTION_DELETE]
        if not sets:
            return
        relation = (
            f"(SELECT * FROM {ident(target)} LIMIT 0) AS {ident(spec.target_alias)}, "
            f"(SELECT * FROM {ident(source)} LIMIT 0) AS {ident(spec.source_alias)}"
        )
        for values in sets:
            self._check_typed(schema, values, relation, "merge")

    # ------------------------------------------------------------------ tombstones

    def _pk_ok(self, snap: Snapshot) -> bool:
        pk = snap.primary_key
        return pk is not None and key_range_type(snap.schema.to_arrow().field(pk).type)

    def _records(self, snap: Snapshot, hit: pa.Table) -> tuple[list[TombstoneRecord], int]:
        """The cheapest records deleting the rows (``_castsql_file``,
        ``_castsql_pos``[, ``_castsql_pk``]) of ``hit`` in ``snap``, and how many."""
        files = hit.column(FILE_COL).to_numpy(zero_copy_only=False)
        pos = hit.column(POS_COL).to_numpy(zero_copy_only=False).astype(np.int64)
        pk = hit.column(PK_COL) if PK_COL in hit.column_names and self._pk_ok(snap) else None
        order = np.lexsort((pos, files))
        files, pos = files[order], pos[order]
        cuts = np.flatnonzero(files[1:] != files[:-1]) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), len(files)]
        by_key = {str(files[s]): (s, e) for s, e in zip(starts, ends, strict=True)}
        records: list[TombstoneRecord] = []
        total = 0
        for f in snap.resolved(sorted(by_key, key=str)):
            s, e = by_key[f.key]
            deleted = self.session.views.deleted(snap, f)
            rgr = f.row_group_rows if f.row_group_rows is not None else (f.total_rows,)
            units = position_units(f.key, pos[s:e], rgr, deleted)
            if not units:
                continue
            recs, n = file_records(f.key, units, False)
            if pk is not None:
                recs = self._maybe_range(snap, f, recs, pos[s:e], pk.take(pa.array(order[s:e])), deleted, n)
            records += recs
            total += n
        return records, total

    def _maybe_range(
        self,
        snap: Snapshot,
        f: ResolvedFile,
        recs: list[TombstoneRecord],
        pos: np.ndarray,
        keys: pa.Array,
        deleted: AbstractBitMap,
        n: int,
    ) -> list[TombstoneRecord]:
        """One key range instead of ``recs`` when it is shorter and provably
        exact: the file's keys strictly increase (all its rows: then live rows
        with a key in [lo, hi] are exactly the live rows between the two
        positions) and every live row between the first and last matched
        position matched."""
        lo_pos, hi_pos = int(pos[0]), int(pos[-1])
        between = hi_pos - lo_pos + 1 - (deleted.range_cardinality(lo_pos, hi_pos + 1) if deleted else 0)
        if between != n:
            return recs
        lo, hi = json_stat(keys[0].as_py()), json_stat(keys[-1].as_py())
        if lo is None or hi is None:
            return recs
        rng = [KeyRangeDelete(f.key, lo, hi)]
        if len(serialize_tombstones(rng)) >= len(serialize_tombstones(recs)) or not self._file_sorted(snap, f):
            return recs
        return rng  # type: ignore[return-value]

    def _file_sorted(self, snap: Snapshot, f: ResolvedFile) -> bool:
        """Is the primary key strictly increasing over every row of ``f`` (one scan of that column, remembered)?"""
        got = self._sorted.get(f.uri)
        if got is None:
            pk = snap.primary_key or ""
            keys = (
                self.con.sql(f"SELECT {ident(pk)} AS k FROM {parquet_files([f.uri])} ORDER BY file_row_number")
                .to_arrow_table()
                .column("k")
                .combine_chunks()
            )
            got = keys.null_count == 0 and (
                len(keys) < 2 or bool(pc.all(pc.greater(keys.slice(1), keys.slice(0, len(keys) - 1))).as_py())
            )
            self._sorted[f.uri] = got
        return got

    # ------------------------------------------------------------------ merge

    def merge(
        self,
        spec: MergeSpec,
        source: Any,
        *,
        attempts: int = ATTEMPTS,
        merge_schema: bool = False,
        allow_duplicate_keys: bool = False,
    ) -> MergeMetrics:
        """Run ``spec`` with ``source`` (Arrow, pandas or polars) against the
        newest version: one version, or none when nothing changes
        (:func:`castsql.write.pipeline.merge`).

        ``merge_schema``: the source's columns the table lacks are added (and
        allowed widenings made) in the same version; older rows read NULL
        there. Rows that would leave the primary key NULL or repeated are
        refused unless ``allow_duplicate_keys``."""
        name = self.use_source(source)
        try:
            options = pipeline.Options(attempts, merge_schema, allow_duplicate_keys)
            return pipeline.merge(self, spec, options)
        finally:
            self.con.unregister(name)

    # ------------------------------------------------------------------ CDC

    dialect = "duckdb"

    def apply_cdc(
        self,
        cdc: Cdc,
        batch: Any,
        *,
        attempts: int = ATTEMPTS,
        merge_schema: bool = False,
        stream: tuple[str, int] | None = None,
    ) -> CdcMetrics:
        """Apply ``batch`` (Arrow, pandas or polars) as one CDC batch
        (:func:`castsql.write.pipeline.apply_cdc`)."""
        self._batch = as_arrow(batch, f"table {self.table}: cdc")
        self._src = self._batch
        self._src_name: str | None = None
        try:
            return pipeline.apply_cdc(self, cdc, pipeline.Options(attempts, merge_schema, stream=stream))
        finally:
            if self._src_name is not None:
                self.con.unregister(self._src_name)

    def cdc_check(self, cdc: Cdc) -> Check:
        return check(cdc, self._batch)

    def cdc_changes(self, cdc: Cdc, markers: pa.Table | None) -> tuple[int, pa.Table]:
        if self._src_name is not None:
            self.con.unregister(self._src_name)
        self._src, self._src_name = prepare(cdc, self._batch, markers), self._name("changes")
        self.con.register(self._src_name, self._src)
        return self._src.num_rows, deletes(cdc, self._src)

    def use_source(self, source: Any) -> str:
        """Register a merge's ``source`` (Arrow, pandas or polars) on the connection; its view's name."""
        self._src = as_arrow(source, f"table {self.table}: merge")
        self._src_name = self._name("source")
        self.con.register(self._src_name, self._src)
        return self._src_name

    def source_schema(self) -> pa.Schema:
        return self._src.schema

    def source_rows(self) -> int:
        return self._src.num_rows

    def find_merge(self, snap: Snapshot, spec: MergeSpec, unchanged: bool = False) -> _Found:
        """What ``spec`` does, in one DuckDB query (:func:`castsql.write.merge.actions_sql`)
        over the source and the live target rows it can reach."""
        where = f"table {self.table}: merge"
        src, src_name = self._src, self._src_name
        assert src_name is not None, "use_source() registers the source first"
        schema = snap.schema
        columns = schema.names
        fast = spec.keys is not None and not spec.of("not_matched_by_source")
        made: list[tuple[str, str]] = []
        held = None
        try:
            if fast:
                target, tied, held = self._matched_targets(spec, src, src_name, snap, made)
                if spec.untied is not None and not tied:
                    spec = dataclasses.replace(spec, clauses=spec.untied)
            else:
                target = self._name("target")
                view = self._name("all")
                self.session.views.create(view, snap, positions=True)
                made.append(("view", view))
                cols = ", ".join(ident(c) for c in columns)
                self.con.execute(
                    f"CREATE OR REPLACE TEMP VIEW {ident(target)} AS SELECT {cols}, {ROW_FILE} AS {_q(FILE_COL)}, "
                    f"CAST(NULL AS INTEGER) AS {_q(RG_COL)}, {ROW_POS} AS {_q(POS_COL)} FROM {ident(view)}"
                )
                made.append(("view", target))
            pk = snap.primary_key
            sql = actions_sql(spec, ident(target), ident(src_name), columns, _q, old_key=pk, keep_unchanged=unchanged)
            old = f", {_q(OLD_KEY_COL)}" if pk is not None else ""
            try:
                self._check_values(spec, target, src_name, schema)
                texts = {n.lower(): e for c in spec.clauses if c.set for n, e in c.set.items()}
                lossy = []
                if texts:  # values the clauses compute (a source's own columns passed the type rule)
                    rel = self.con.sql(f"SELECT * FROM ({sql}) LIMIT 0")
                    got = dict(zip(rel.columns, map(str, rel.types), strict=True))
                    lossy = _lossy(
                        [(c.name, duck_type(c.type), got[c.name], ident(c.name), texts.get(c.name.lower()))
                         for c in schema.columns]
                    )  # fmt: skip
                flags = "".join(f", {flag}" for *_, flag in lossy)
                casts = ", ".join(
                    f"{_cast(c.name, lossy)}({ident(c.name)} AS {duck_type(c.type)}) AS {ident(c.name)}"
                    for c in schema.columns
                )
                out = self.con.sql(
                    f"SELECT {_q(FILE_COL)}, {_q(POS_COL)}, {_q(ACTION_COL)}, {_q(MATCHES_COL)}{old}, {casts}"
                    f"{flags} FROM ({sql})"
                ).to_arrow_table()
            except duckdb.Error as e:
                raise MergeError(f"{where}: {_explain(e)}; nothing was committed") from None
        finally:
            for kind, name in reversed(made):
                if kind == "table":
                    self.con.execute(f"DROP TABLE IF EXISTS temp.{ident(name)}")
                else:
                    self.session.views.drop(name)
        action = out.column(ACTION_COL).to_numpy(zero_copy_only=False)
        changes = (action == ACTION_UPDATE) | (action == ACTION_DELETE)
        many = np.flatnonzero((out.column(MATCHES_COL).to_numpy(zero_copy_only=False) > 1) & changes)
        gone = _distinct_rows(out.filter(pa.array((action == ACTION_UPDATE) | (action == ACTION_DELETE))))
        if pk is not None:
            gone = gone.append_column(PK_COL, gone.column(OLD_KEY_COL))
        adds = (action == ACTION_UPDATE) | (action == ACTION_INSERT)
        gone_action = gone.column(ACTION_COL).to_numpy(zero_copy_only=False) if gone.num_rows else np.array([])
        counts = Counts(
            updated=int((gone_action == ACTION_UPDATE).sum()),
            deleted=int((gone_action == ACTION_DELETE).sum()),
            inserted=int((action == ACTION_INSERT).sum()),
        )
        if unchanged:
            matched = out.column(FILE_COL).is_valid().to_numpy(zero_copy_only=False)
            counts.matched_unchanged = int(((action == ACTION_NONE) & matched).sum())
            counts.unmatched_unchanged = int(((action == ACTION_NONE) & ~matched).sum())
        found = _Found(self, snap, counts, gone=gone, new=out.filter(pa.array(adds)).select(columns),
                       inserted=action[adds] == ACTION_INSERT, op="merge", lossy=lossy, rows=out,
                       held=held)  # fmt: skip
        if len(many):
            found.multiple = True
            found.labels = _labels(spec, out.take(pa.array(many)), pk)
        return found

    def _matched_targets(
        self, spec: MergeSpec, src: pa.Table, src_name: str, snap: Snapshot, made: list[tuple[str, str]]
    ) -> tuple[str, bool, pa.Table | None]:
        """A temp table of the live target rows some source row matches on the
        keys: the columns the clauses use, and row identity; whether some
        such row equals its source row in ``spec.order``; and, under
        ``castsql.changeDataFeed``, those rows with every column (the
        change-data file's rows, taken from here instead of read again).
        Files whose key statistics cannot hold a source key are never opened;
        only the key (and order) columns of the others are scanned, other
        columns only for matched rows."""
        keys = spec.keys or ()
        preds: list[Predicate] = []
        nothing = False
        for k in keys:
            col = next(c for c in src.column_names if c.lower() == k.lower())
            mm = pc.min_max(src.column(col))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is None:  # every source key is NULL: no target row can match
                nothing = True
                break
            tname = next(c for c in snap.schema.names if c.lower() == k.lower())
            preds += [Predicate(tname, ">=", lo), Predicate(tname, "<=", hi)]
        files = [] if nothing else snap.prune(preds).files
        feed = change_data_feed(snap.manifest.properties)
        # Under the feed the deleted rows are written whole: fetched here with
        # the columns the clauses use, they cost one read, not a second one of
        # the row groups they lie in (FORMAT.md §3.5).
        used = list(snap.schema.names) if feed else spec.target_columns_used(snap.schema.names)
        if snap.primary_key is not None and snap.primary_key not in used:
            used.append(snap.primary_key)  # the key a changed row had (the key check)
        first = [c for c in snap.schema.names if c.lower() in {k.lower() for k in keys}]
        # Columns the conditions order rows by come with the keys (a column's
        # scan costs less than a fetch by position); tie-breaking ones only when
        # some matched row ties (else NULL: the conditions do not look at them).
        order = [c for c in snap.schema.names if c.lower() in {o.lower() for o in spec.order} and c not in first]
        hits = self._key_scan(snap, files, first, spec, src_name, carry=order, src=src)
        first += order
        extra = [c for c in used if c not in first]
        tied = bool(order) and self._ties(hits, src, first)
        lower = {c.lower() for c in spec.tiebreak}
        unread = [c for c in extra if c.lower() in lower] if lower and not tied and not feed else []
        extra = [c for c in extra if c not in unread]
        if extra and hits.num_rows:
            hits = self._fetch_held(snap, hits, extra) if feed and self._rows_warm() else self._fetch(snap, hits, extra)
        elif extra:  # no source key matched: the columns, without rows
            arrow = snap.schema.to_arrow()
            for c in extra:
                hits = hits.append_column(arrow.field(c), pa.array([], arrow.field(c).type))
        arrow_schema = snap.schema.to_arrow()
        for c in unread:
            hits = hits.append_column(arrow_schema.field(c), pa.nulls(hits.num_rows, arrow_schema.field(c).type))
        cols = [c for c in snap.schema.names if c in first or c in extra or c in unread]
        table = hits.select([*cols, FILE_COL, POS_COL])
        table = table.append_column(RG_COL, pa.nulls(table.num_rows, pa.int32()))
        # Columns the clauses do not use are NULL: a reference to one fails to
        # bind only if the guess in target_columns_used missed it (it keeps every name it sees).
        name = self._name("target")
        arrow = name + "$arrow"
        self.con.register(arrow, table)
        try:
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {ident(name)} AS SELECT * FROM {ident(arrow)}")
        finally:
            self.con.unregister(arrow)
        made.append(("table", name))
        return name, tied, table if feed else None

    @staticmethod
    def _ties(hits: pa.Table, src: pa.Table, columns: list[str]) -> bool:
        """Whether a matched row equals its source row in ``columns`` (keys and order)."""
        if not hits.num_rows:
            return False
        have = {c.lower(): c for c in src.column_names}
        # A batch's few rows: Python tuples cost less than a join's set-up (its values are the table's types).
        mine = set(zip(*(src.column(have[c.lower()]).to_pylist() for c in columns), strict=True))
        return any(r in mine for r in zip(*(hits.column(c).to_pylist() for c in columns), strict=True))

    def _key_scan(
        self,
        snap: Snapshot,
        files: list[ResolvedFile],
        keys: list[str],
        spec: MergeSpec | None,
        src_name: str,
        carry: Sequence[str] = (),
        src: pa.Table | None = None,
    ) -> pa.Table:
        """(keys…, carry…, file, position) of the live rows of ``files`` whose keys a source row has."""
        empty = {k: pa.array([], snap.schema.to_arrow().field(k).type) for k in (*keys, *carry)}
        empty_t = pa.table({**empty, FILE_COL: pa.array([], pa.string()), POS_COL: pa.array([], pa.int64())})
        if not files:
            return empty_t
        if src is not None:
            cached = self._cached_key_scan(snap, files, keys, src, carry, empty_t)
            if cached is not None:
                return cached
        views = self.session.views
        parts = []
        src_cols = {c.lower(): c for c in self.con.sql(f"SELECT * FROM {ident(src_name)} LIMIT 0").columns}
        on = " AND ".join(f"p.{ident(k)} = s.{ident(src_cols[k.lower()])}" for k in keys)
        klist = ", ".join(f"p.{ident(k)}" for k in (*keys, *carry))
        for group, members in views._groups(files):
            proj = views._projection(snap, group, members[0])
            scan = parquet_files([f.uri for f in members])
            got = self.con.sql(
                f"SELECT {klist}, p.{_FI} AS {_FI}, p.{_POS} AS {_POS} FROM (SELECT {proj}, file_index AS {_FI}, "
                f"file_row_number AS {_POS} FROM {scan}) p SEMI JOIN {ident(src_name)} s ON {on}"
            ).to_arrow_table()
            if not got.num_rows:
                continue
            fi = got.column(_FI).to_numpy(zero_copy_only=False).astype(np.int64)
            pos = got.column(_POS).to_numpy(zero_copy_only=False).astype(np.int64)
            keep = np.ones(len(fi), dtype=bool)
            for i in np.unique(fi):
                f = members[int(i)]
                if f.has_deletes:
                    dead = views.deleted(snap, f)
                    sel = np.flatnonzero(fi == i)
                    keep[sel] = [p not in dead for p in pos[sel].tolist()]
            names = np.array([f.key for f in members], dtype=object)
            part = got.select([*keys, *carry]).append_column(FILE_COL, pa.array(names[fi], pa.string()))
            part = part.append_column(POS_COL, pa.array(pos, pa.int64()))
            parts.append(part.filter(pa.array(keep)))
        if not parts:
            return empty_t
        return pa.concat_tables(parts).cast(empty_t.schema)

    def _cached_key_scan(
        self, snap: Snapshot, files: list[ResolvedFile], keys: list[str], src: pa.Table, carry: Sequence[str],
        empty: pa.Table,
    ) -> pa.Table | None:  # fmt: skip
        """What :meth:`_key_scan` returns, from the handle's :mod:`key cache
        <castsql.embedded.keycache>` (files it lacks read into it); None where
        the cache does not serve this merge (several keys, a key type it does
        not keep, a source key of another type, a handle's first merge)."""
        if len(keys) != 1:
            return None
        k = keys[0]
        t = empty.schema.field(k).type
        wanted = _cacheable_keys(src, k, t)
        if wanted is None:
            return None
        cache = keycache.of(self.session)
        if not cache.enabled:
            return None
        if not cache.warm:
            cache.warm = True  # a one-off merge scans; a handle that merges again keeps the keys
            return None
        wanted = wanted.combine_chunks() if isinstance(wanted, pa.ChunkedArray) else wanted
        types = {c: empty.schema.field(c).type for c in carry}
        found: dict[str, pa.Table] = {}
        missing = []
        for f in files:
            got = self._lookup(cache, f, k, t, wanted, types)
            if got is None:
                missing.append(f)
            else:
                found[f.uri] = got
        if missing:
            found.update(self._load_keys(snap, missing, k, t, wanted, types, cache))
        views = self.session.views
        parts = []
        for f in files:
            part = found[f.uri]
            if not part.num_rows:
                continue
            if f.has_deletes:
                dead = views.deleted(snap, f)
                part = part.filter(pa.array([p not in dead for p in part.column(POS_COL).to_pylist()], pa.bool_()))
                if not part.num_rows:
                    continue
            parts.append(part.append_column(FILE_COL, pa.array([f.key] * part.num_rows, pa.string())))
        if not parts:
            return empty
        return pa.concat_tables(parts).select(empty.schema.names).cast(empty.schema)

    @staticmethod
    def _lookup(
        cache: keycache.KeyCache, f: ResolvedFile, k: str, t: pa.DataType, wanted: pa.Array,
        carry: Mapping[str, pa.DataType],
    ) -> pa.Table | None:  # fmt: skip
        """(key, carried columns…, position) of the rows of ``f`` whose key is
        one of ``wanted``, from ``cache``; None if it lacks one of them."""
        got = cache.find(f.uri, k, t, wanted)
        if got is None:
            return None
        pos, keys = got
        cols: dict[str, pa.Array] = {k: keys}
        for c, ct in carry.items():
            v = cache.values(f.uri, c, ct, pos)
            if v is None:
                return None
            cols[c] = v
        cols[POS_COL] = pa.array(pos, pa.int64())
        return pa.table(cols)

    def _load_keys(
        self, snap: Snapshot, files: list[ResolvedFile], k: str, t: pa.DataType, wanted: pa.Array,
        carry: Mapping[str, pa.DataType], cache: keycache.KeyCache,
    ) -> dict[str, pa.Table]:  # fmt: skip
        """Read the key ``k`` and the ``carry`` columns of every row of
        ``files`` into ``cache``, and answer the lookup of ``wanted`` in them
        (from what was read, where the cache's budget kept a file out)."""
        views = self.session.views
        out: dict[str, pa.Table] = {}
        names = {c: f"c{i}" for i, c in enumerate(carry)}
        extra = "".join(f", p.{ident(c)} AS {n}" for c, n in names.items())
        for group, members in views._groups(files):
            proj = views._projection(snap, group, members[0])
            got = self.con.sql(
                f"SELECT p.{ident(k)} AS k{extra}, p.{_FI} AS {_FI}, p.{_POS} AS {_POS} FROM (SELECT {proj}, "
                f"file_index AS {_FI}, file_row_number AS {_POS} FROM {parquet_files([f.uri for f in members])}) p"
            ).to_arrow_table()
            fi = got.column(_FI).to_numpy(zero_copy_only=False).astype(np.int64)
            pos = got.column(_POS).to_numpy(zero_copy_only=False).astype(np.int64)
            by_file = np.lexsort((pos, fi))  # each file's rows in row order
            fi, pos = fi[by_file], pos[by_file]
            order = pa.array(by_file)
            values = got.column("k").cast(t).combine_chunks().take(order)
            carried = {c: got.column(n).cast(carry[c]).combine_chunks().take(order) for c, n in names.items()}
            bounds = np.searchsorted(fi, np.arange(len(members) + 1))
            for i, f in enumerate(members):
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                if hi - lo != f.total_rows or (hi > lo and (pos[lo] != 0 or pos[hi - 1] != hi - lo - 1)):
                    raise FormatError(f"{f.uri}: holds {hi - lo} rows, the manifest says {f.total_rows}")
                mine = values.slice(lo, hi - lo)
                cache.put(f.uri, k, t, mine)
                for c, v in carried.items():
                    cache.put_values(f.uri, c, v.slice(lo, hi - lo))
                hit = self._lookup(cache, f, k, t, wanted, carry)
                if hit is None:  # past the budget: this once, from what was read
                    at = pa.array(np.flatnonzero(pc.is_in(mine, value_set=wanted).to_numpy(zero_copy_only=False)))
                    cols = {k: mine.take(at), **{c: v.slice(lo, hi - lo).take(at) for c, v in carried.items()}}
                    hit = pa.table({**cols, POS_COL: at.cast(pa.int64())})
                out[f.uri] = hit
        return out

    def _rows_warm(self) -> bool:
        """Whether this merge takes rows from the handle's row cache: not a
        handle's first merge under the feed (a one-off merge reads what it
        did), and not with the caches off."""
        cache = rowcache.of(self.session)
        if not cache.enabled:
            return False
        warm, cache.warm = cache.warm, True
        return warm

    def _fetch_held(self, snap: Snapshot, hits: pa.Table, columns: list[str]) -> pa.Table:
        """What :meth:`_fetch` returns, taken from the handle's
        :mod:`row cache <castsql.embedded.rowcache>`: a file it lacks is read
        whole into it once; one past its budget is fetched by position."""
        cache = rowcache.of(self.session)
        views = self.session.views
        keys = hits.column(FILE_COL).to_numpy(zero_copy_only=False)
        pos = hits.column(POS_COL).to_numpy(zero_copy_only=False).astype(np.int64)
        files = snap.resolved(sorted(set(keys.tolist())))
        names = snap.schema.names
        parts: list[pa.Table] = []
        order: list[np.ndarray] = []
        for group, members in views._groups(files):
            proj = views._projection(snap, group, members[0])
            for f in members:
                idx = np.flatnonzero(keys == f.key)
                got = cache.take(f.uri, proj, pos[idx])
                if got is None and cache.fits(_in_memory(f, len(names))):
                    cache.put(f.uri, proj, self._read_whole(f, proj, names))
                    got = cache.take(f.uri, proj, pos[idx])
                if got is None:  # past the budget: this file's rows by position
                    got = self._fetch(snap, hits.take(pa.array(idx)), columns).select(columns)
                parts.append(got.select(columns))
                order.append(idx)
        table = pa.concat_tables(parts)
        back = np.empty(hits.num_rows, dtype=np.int64)
        back[np.concatenate(order)] = np.arange(hits.num_rows)
        table = table.take(pa.array(back))
        for c in columns:
            hits = hits.append_column(c, table.column(c))
        return hits

    def _read_whole(self, f: ResolvedFile, proj: str, names: list[str]) -> pa.Table:
        """Every row of ``f`` through ``proj`` (the columns of ``names``), in row order."""
        cols = ", ".join(f"p.{ident(c)}" for c in names)
        got = self.con.sql(
            f"SELECT {cols}, p.{_POS} AS {_POS} FROM (SELECT {proj}, file_row_number AS {_POS} "
            f"FROM {parquet_files([f.uri])}) p"
        ).to_arrow_table()
        pos = got.column(_POS).to_numpy(zero_copy_only=False)
        if len(pos) != f.total_rows:
            raise FormatError(f"{f.uri}: holds {len(pos)} rows, the manifest says {f.total_rows}")
        if len(pos) > 1 and not (np.diff(pos) == 1).all():
            got = got.take(pa.array(np.argsort(pos, kind="stable")))
        return got.select(names)

    def _fetch(self, snap: Snapshot, hits: pa.Table, columns: list[str]) -> pa.Table:
        """``hits`` with ``columns`` of those rows, read from their files by position."""
        views = self.session.views
        by_file = defaultdict(list)
        keys = hits.column(FILE_COL).to_pylist()
        for i, k in enumerate(keys):
            by_file[k].append(i)
        files = {f.key: f for f in snap.resolved(sorted(by_file))}
        pos_all = hits.column(POS_COL).to_numpy(zero_copy_only=False)
        fetched = []
        order = []
        cols = ", ".join(f"p.{ident(c)}" for c in columns)
        for group, members in views._groups([files[k] for k in sorted(by_file)]):
            proj = views._projection(snap, group, members[0])
            for f in members:
                idx = by_file[f.key]
                want = pa.table({_POS: pa.array(pos_all[idx], pa.int64())})
                name = self._name("want")
                self.con.register(name, want)
                try:
                    lo, hi = int(want.column(_POS).to_numpy().min()), int(want.column(_POS).to_numpy().max())
                    got = self.con.sql(
                        f"SELECT {cols}, p.{_POS} AS {_POS} FROM (SELECT {proj}, file_row_number AS {_POS} "
                        f"FROM {parquet_files([f.uri])} WHERE file_row_number BETWEEN {lo} AND {hi}) p "
                        f"JOIN {ident(name)} w ON p.{_POS} = w.{_POS}"
                    ).to_arrow_table()
                finally:
                    self.con.unregister(name)
                at = dict(zip(got.column(_POS).to_pylist(), range(got.num_rows), strict=True))
                fetched.append(got.take(pa.array([at[int(p)] for p in pos_all[idx]])).select(columns))
                order += idx
        table = pa.concat_tables(fetched)
        back = np.empty(len(order), dtype=np.int64)
        back[np.array(order)] = np.arange(len(order))
        table = table.take(pa.array(back))
        for c in columns:
            hits = hits.append_column(c, table.column(c))
        return hits


_NUMERIC = re.compile(r"(U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\))")


def _lossy(values: list[tuple[str, str, str, str, str | None]]) -> list[tuple[str, str, str, str | None, str]]:
    """For each (column, its type, the value's type, the value's SQL, the
    user's text) whose value is a number of another numeric type: (column,
    types, text, a SELECT item ``_castsql_lossyJ`` that is the value as text
    where the cast to the column's type would change it, else NULL)."""
    out: list[tuple[str, str, str, str | None, str]] = []
    for col, want, got, value, text in values:
        if got == want or not (_NUMERIC.fullmatch(got) and _NUMERIC.fullmatch(want)):
            continue
        stored = f"TRY_CAST({value} AS {want})"
        # Back in the value's own type (as Spark's engine compares): compared in
        # the wider type, 2^53 + 1 rounded into a DOUBLE would look unchanged.
        back = f"TRY_CAST({stored} AS {got})"
        flag = (
            f"CASE WHEN {value} IS NOT NULL AND ({stored} IS NULL OR {back} IS DISTINCT FROM {value}) "
            f"THEN CAST({value} AS VARCHAR) END AS {_q(f'_castsql_lossy{len(out)}')}"
        )
        out.append((col, want, got, text, flag))
    return out


def _cast(column: str, lossy: list[tuple]) -> str:
    """``TRY_CAST`` for a column whose number may not fit (refuse_unstorable
    names the value before anything is written), ``CAST`` for the others."""
    return "TRY_CAST" if any(col == column for col, *_ in lossy) else "CAST"


def _labels(spec: MergeSpec, rows: pa.Table, pk: str | None) -> list[str]:
    """Up to five target rows of ``rows`` (actions of several matching source
    rows), by their keys where the merge has key columns (a deleted row's new
    values are NULL: the primary key it had, where the merge is on it)."""
    keys = list(spec.keys or ())
    on_pk = pk is not None and [k.lower() for k in keys] == [pk.lower()]
    seen: list[str] = []
    for r in rows.to_pylist():
        if keys and r.get(keys[0]) is not None:
            label = ", ".join(f"{k}={r.get(k)!r}" for k in keys)
        elif on_pk and r.get(OLD_KEY_COL) is not None:
            label = f"{keys[0]}={r[OLD_KEY_COL]!r}"
        else:
            label = f"row {r[POS_COL]} of {r[FILE_COL]}"
        if label not in seen:
            seen.append(label)
        if len(seen) == 5:
            break
    return seen


class _Found:
    """What the embedded engine found for one attempt (:class:`castsql.write.pipeline.Found`):
    Arrow tables in this process. ``gone``: the replaced and deleted rows
    (file, position, their key before the write); ``new``: the rows the write
    adds, ``inserted`` marking those that are inserts."""

    def __init__(
        self,
        writer: Writer,
        snap: Snapshot,
        counts: Counts,
        *,
        gone: pa.Table,
        new: pa.Table | None = None,
        inserted: np.ndarray | None = None,
        op: str = "update",
        lossy: list[tuple[str, str, str, str | None, str]] | None = None,
        rows: pa.Table | None = None,
        held: pa.Table | None = None,
    ) -> None:
        self.writer, self.snap, self.counts = writer, snap, counts
        self.held = held
        self.written: pa.Table | None = None
        self.gone, self.new, self.inserted, self.op = gone, new, inserted, op
        self.lossy, self.rows = lossy or [], rows
        self.multiple = False
        self.labels: list[str] = []

    def multiple_labels(self) -> list[str]:
        return self.labels

    def refuse_unstorable(self) -> None:
        """The rule Spark's engine applies: a number stored in another numeric
        type only where the conversion changes no value."""
        for j, (col, want, got, text, _) in enumerate(self.lossy):
            assert self.rows is not None
            values = self.rows.column(f"_castsql_lossy{j}").drop_null()
            if len(values):
                raise unstorable(self.writer.table, self.op, col, want, got, text, values[0].as_py())

    def insert_stats(self, column: str) -> pipeline.KeyStats:
        assert self.new is not None and self.inserted is not None
        col = self.new.column(column).filter(pa.array(self.inserted))
        mm = pc.min_max(col)
        return pipeline.KeyStats(col.null_count, pc.count_distinct(col).as_py(), mm["min"].as_py(), mm["max"].as_py())

    def keys(self, pk: str) -> tuple[pa.Array, pa.Array, np.ndarray]:
        assert self.new is not None and self.inserted is not None
        old = self.gone.column(PK_COL) if self.gone.num_rows else pa.array([], self.new.schema.field(pk).type)
        return self.new.column(pk).combine_chunks(), pa.chunked_array(old).combine_chunks(), self.inserted

    def tombstones(self) -> tuple[list[TombstoneRecord], int]:
        return self.writer._records(self.snap, self.gone) if self.gone.num_rows else ([], 0)

    def deleted_positions(self) -> dict[str, BitMap]:
        out: dict[str, BitMap] = {}
        if not self.gone.num_rows:
            return out
        files = self.gone.column(FILE_COL).to_numpy(zero_copy_only=False)
        pos = self.gone.column(POS_COL).to_numpy(zero_copy_only=False).astype(np.uint32)
        for key in np.unique(files):
            out[str(key)] = BitMap(array.array("I", pos[files == key].tobytes()))
        return out

    def held_rows(self) -> pa.Table | None:
        return self.held

    def write(self) -> list[DataFile]:
        if self.new is None or not self.new.num_rows:
            return []
        schema = self.snap.schema
        where = f"table {self.writer.table}: {self.op}"
        self.written = conform(self.new, schema, where)
        return self.writer.write_files(self.written, schema)

    def written_rows(self) -> pa.Table | None:
        return self.written

    def close(self) -> None:
        return None


def _cacheable_keys(src: pa.Table, k: str, t: pa.DataType) -> pa.Array | pa.ChunkedArray | None:
    """The source's non-NULL values of key ``k`` in the table's type ``t``,
    where the key cache can look them up: a type it keeps, and a source
    column of that type or an integer that fits it (else None: the scan's
    rules decide)."""
    name = next((c for c in src.column_names if c.lower() == k.lower()), None)
    if name is None or not keycache.cacheable(t):
        return None
    wanted = src.column(name).drop_null()
    if wanted.type == t:
        return wanted
    if not (pa.types.is_integer(wanted.type) and pa.types.is_integer(t)):
        return None
    try:
        return wanted.cast(t)
    except pa.ArrowInvalid:  # a source key past the column's range
        return None


def _in_memory(f: ResolvedFile, columns: int) -> int:
    """A guess, before reading it, of the bytes file ``f``'s rows take in
    memory: its Parquet bytes inflated, at least 8 bytes a value (past the
    row cache's budget, the file is not read whole)."""
    return max(4 * f.entry.size_bytes, 8 * columns * f.total_rows)


def _distinct_rows(t: pa.Table) -> pa.Table:
    """One row per (file, position): several source rows deleting one target row delete it once."""
    if t.num_rows < 2:
        return t
    ident_ = pc.binary_join_element_wise(t.column(FILE_COL), pc.cast(t.column(POS_COL), pa.string()), "#")
    _, first = np.unique(ident_.to_numpy(zero_copy_only=False).astype(str), return_index=True)
    return t.take(pa.array(np.sort(first)))


_BINDER = re.compile(r'Referenced column "?([^"\s]+)"? not found', re.I)
_NO_COLUMN = re.compile(r'Values list "([^"]+)" does not have a column named "([^"]+)"', re.I)
_CAST = re.compile(r"Conversion Error: (.*?) when casting from source column (\S+)", re.I)


def _explain(e: duckdb.Error) -> str:
    """DuckDB's error in one line, naming the column: an unknown one, or one
    whose values do not convert (``kind = 5`` on a text column)."""
    text = one_line(e, excerpt=False)
    m = _BINDER.search(str(e))
    if m:
        return f"column {m.group(1)!r} does not exist"
    m = _NO_COLUMN.search(text)
    if m:
        return f"column {m.group(1) + '.' + m.group(2)!r} does not exist"
    m = _CAST.search(text)
    if m:
        return f"column {m.group(2)!r} has values of another type: {m.group(1)}"
    return text
