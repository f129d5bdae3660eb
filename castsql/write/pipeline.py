"""The one write sequence of append, delete, update and merge, whichever engine runs it.

::

    evolve the schema → validate → find the affected rows → refuse multiple
    matches → refuse values a column cannot hold → check the primary key →
    plan tombstones → write the new rows → commit with the conflict rules →
    metrics; on a conflict, all of it again from the new head

An engine supplies only how to scan, evaluate expressions and write files:
the embedded one (:mod:`castsql.embedded.engine`, DuckDB in-process) and Spark's
(:mod:`castsql.spark.engine`) implement
:class:`Engine`, and what they find for one attempt is a :class:`Found`,
held where the engine holds it (an Arrow table in-process, a persisted
DataFrame on a cluster). Every rule is here, once: schema evolution, the
type rule for a merge's source, Delta's multiple-match refusal, the primary
key (unique and non-NULL after every commit, :mod:`castsql.write.keys`), the
conflict span taken on the primary key, retries, exactly-once stream
batches, the summary and the metrics. As PyIceberg's ``_SnapshotProducer``
owns its commit sequence with per-operation hooks, this module owns ours.

Example (the embedded engine; ``castsql.Table`` calls these)::

    >>> import castsql, pyarrow as pa, tempfile
    >>> from castsql.format import TableLog
    >>> from castsql.storage import open_storage
    >>> st = open_storage(tempfile.mkdtemp() + "/kv")
    >>> _ = TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key="id")
    >>> kv = castsql.open(st.root)
    >>> _ = kv.append(pa.table({"id": [1, 2], "v": ["a", "b"]}))
    >>> kv.update(set={"id": "1"}, where="id = 2")
    Traceback (most recent call last):
    castsql.errors.DuplicateKey: table kv: update: 1 key(s) are already in the table at version 1 (id = 1); ...
    >>> kv.close()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from castsql.errors import MergeError, WriteError
from castsql.format import Change, DataFile, Manifest, Schema, TableLog, TombstoneRecord
from castsql.format.evolution import fits, merged, rebase, refusal, widens
from castsql.format.manifest import ChangeData, added_summary, json_stat
from castsql.format.markers import WRITTEN_AT, conform, from_inline
from castsql.format.properties import change_data_feed
from castsql.format.schema import normalize_type, type_from_name, type_name
from castsql.format.tombstone import serialize_tombstones
from castsql.snapshot import Snapshot, resolve
from castsql.write.cdc import Cdc, CdcMetrics, Check, Dialect
from castsql.write.commit import commit_dml, with_retries
from castsql.write.keys import check_input_keys, check_written_keys, existing_keys, refuse_existing
from castsql.write.merge import MergeMetrics, MergeSpec, inserts_unmatched, moves_keys, validate
from castsql.write.preimages import write_change_file

ATTEMPTS = 5  # plans made before a conflicting operation gives up (FORMAT.md §7)


@dataclass
class Counts:
    """Target rows an attempt updates and deletes (distinct rows) and rows it
    inserts; with ``unchanged`` asked of :meth:`Engine.find_merge`, also the
    source rows that matched a row and changed nothing, and those that
    matched none and inserted nothing."""

    updated: int = 0
    deleted: int = 0
    inserted: int = 0
    matched_unchanged: int = 0
    unmatched_unchanged: int = 0

    @property
    def any(self) -> bool:
        return bool(self.updated or self.deleted or self.inserted)


@dataclass
class KeyStats:
    """One column over the rows a merge inserts: NULLs, distinct values, min and max."""

    nulls: int
    distinct: int
    lo: Any
    hi: Any


class Found(Protocol):
    """What an engine found for one attempt, held where the engine holds it."""

    counts: Counts
    multiple: bool  # a target row several source rows match, which a matched clause changes

    def multiple_labels(self) -> list[str]:
        """Up to five such target rows, as ``id=7`` (their keys) or ``row N of F``."""
        ...

    def refuse_unstorable(self) -> None:
        """Raise for a value its column cannot hold unchanged (an engine whose
        expressions may compute another numeric type checks it here)."""
        ...

    def insert_stats(self, column: str) -> KeyStats:
        """``column`` over the inserted rows."""
        ...

    def keys(self, pk: str) -> tuple[pa.Array, pa.Array, np.ndarray]:
        """The primary keys of the rows the write adds (in the table's type),
        of the live rows it replaces, and a mask over the first of inserted rows."""
        ...

    def tombstones(self) -> tuple[list[TombstoneRecord], int]:
        """The records deleting the replaced and deleted rows, and how many rows they delete."""
        ...

    def deleted_positions(self) -> dict[str, BitMap]:
        """The file positions (by table key) of the rows those records delete
        (after :meth:`tombstones`): what the change-data file holds."""
        ...

    def held_rows(self) -> pa.Table | None:
        """Rows the engine read whole while finding (every column of the
        snapshot's schema, ``_castsql_file``, ``_castsql_pos``), which the
        change-data file takes its rows from instead of reading them again;
        None when it holds none."""
        ...

    def write(self) -> list[DataFile]:
        """Write the updated and inserted rows as data files (not committed)."""
        ...

    def written_rows(self) -> pa.Table | None:
        """After :meth:`write`: the rows it wrote, in the snapshot's schema, in
        the order of its files and of their rows (the change file takes its
        inserted rows from here instead of reading the files back); None when
        the engine does not hold them."""
        ...

    def close(self) -> None: ...


class Engine(Protocol):
    """How one engine scans, evaluates expressions and writes files for the pipeline."""

    table: str  # the table as messages name it

    @property
    def log(self) -> TableLog:
        """The table's log, which the pipeline commits through."""
        ...

    def check_texts(self, texts: Sequence[str], op: str) -> None:
        """Refuse user SQL text the engine must not run (raise WriteError)."""
        ...

    def expression_types(self, snap: Snapshot, set: Mapping[str, str], op: str) -> dict[str, pa.DataType]:
        """The type of each ``set`` expression over the rows of ``snap`` (``pa.null()`` for a bare NULL)."""
        ...

    def find_delete(self, snap: Snapshot, where: str) -> Found | None:
        """The live rows where ``where`` holds; None when none."""
        ...

    def find_update(self, snap: Snapshot, set: Mapping[str, str], where: str | None) -> Found | None:
        """The live rows where ``where`` holds with ``set`` (table column names) applied; None when none."""
        ...

    def source_schema(self) -> pa.Schema:
        """The merge source's columns as Arrow types (SchemaMismatch for one no column can take)."""
        ...

    def source_rows(self) -> int: ...

    def find_merge(self, snap: Snapshot, spec: MergeSpec, unchanged: bool = False) -> Found:
        """What ``spec`` does to the live rows of ``snap`` (``unchanged``: also
        count the source rows that change nothing, :class:`Counts`)."""
        ...

    # A CDC batch (apply_cdc): the engine runs castsql.write.cdc's Arrow functions on it.
    dialect: str  # "duckdb" or "spark": how the merge's conditions are spelled

    def cdc_check(self, cdc: Cdc) -> Check:
        """:func:`castsql.write.cdc.check` of the batch (the merge's source as given)."""
        ...

    def cdc_changes(self, cdc: Cdc, markers: pa.Table | None) -> tuple[int, pa.Table]:
        """The merge's source becomes :func:`castsql.write.cdc.prepare` of the
        batch (again from the batch, at every attempt); its rows, and
        :func:`castsql.write.cdc.deletes` of it."""
        ...


@dataclass
class Options:
    """A merge's options (the builder's and ``castsql.spark.merge``'s arguments)."""

    attempts: int = ATTEMPTS
    merge_schema: bool = False
    allow_duplicate_keys: bool = False
    stream: tuple[str, int] | None = None  # (query, micro-batch id): exactly once


# ---------------------------------------------------------------------- schema evolution


def evolve(snap: Snapshot, schema: Schema, where: str) -> Snapshot:
    """``snap`` seen through ``schema``, the schema a ``merge_schema`` write
    gives it (itself when that is its own): added columns carry ``added_in``
    (the next version), so its files, which lack them, read NULL there, and
    widened columns read in the wider type, as the committed version will."""
    if schema == snap.schema:
        return snap
    provisional = rebase(snap.schema, schema, snap.version + 1, where)
    return Snapshot(
        snap.table_uri, snap.version, snap.manifest.evolve(schema=provisional), snap.files, snap.primary_key
    )


def _evolved_for_set(engine: Engine, snap: Snapshot, set: Mapping[str, str], where: str, op: str) -> Snapshot:
    """``snap`` seen through the schema an update with ``merge_schema`` gives
    it: ``set`` columns it lacks added with their expression's type, columns
    whose expression's type is an allowed widening of theirs widened."""
    have = {c.name.lower(): c for c in snap.schema.columns}
    fields = []
    for col, t in engine.expression_types(snap, set, op).items():
        c = have.get(col.lower())
        if c is None:
            fields.append(pa.field(col, t))  # merged() refuses a bare NULL: it has no type
            continue
        if pa.types.is_null(t):
            continue
        try:
            wider = type_name(normalize_type(t))
        except Exception:  # a type no column has: the update's own type check names it
            continue
        if wider != c.type and widens(c.type, wider):
            fields.append(pa.field(c.name, t))
    if not fields:
        return snap
    return evolve(snap, merged(snap.schema, pa.schema(fields), where, snap.primary_key), where)


# ---------------------------------------------------------------------- delete


def delete(engine: Engine, where: str, *, attempts: int = ATTEMPTS) -> Manifest | None:
    """Delete the live rows where ``where`` holds: one tombstone, one version;
    None when no row matches."""
    if where is None or (isinstance(where, str) and not where.strip()):
        raise WriteError(f"table {engine.table}: delete: no condition (to delete every row, say so: 'true')")
    if not isinstance(where, str):
        raise WriteError(f'table {engine.table}: delete: the condition must be SQL text such as "id < 100"')
    engine.check_texts([where], "delete")

    def attempt(i: int) -> Manifest | None:
        snap = _planned(engine.log, i)
        found = engine.find_delete(snap, where)
        if found is None:
            return None if _stands(engine.log, snap, i) else attempt(i + 1)
        try:
            records, n = found.tombstones()
            if not records:
                return None if _stands(engine.log, snap, i) else attempt(i + 1)
            return commit_dml(
                engine.log, operation="DELETE", read_version=snap.version, records=records, files=[],
                summary={"deleted_rows": n}, change_data=_change_data(engine, snap, found, []),
            )  # fmt: skip
        finally:
            found.close()

    return with_retries(f"table {engine.table}: delete", attempts, attempt)


def _change_data(
    engine: Engine, snap: Snapshot, found: Found, files: Sequence[DataFile]
) -> Callable[[], ChangeData | None] | None:
    """What writes the change file of the rows ``found``'s tombstones delete
    and the written ``files`` hold, with their keys, under
    ``castsql.changeDataFeed`` (FORMAT.md §3.5; :func:`commit_dml` runs it
    beside the tombstone file's write); None without it. What it needs of
    ``found`` is taken here, in the caller's thread."""
    if not change_data_feed(snap.manifest.properties):
        return None
    storage, gone, held = engine.log.storage, found.deleted_positions(), found.held_rows()
    written = found.written_rows() if files else None
    return lambda: write_change_file(storage, snap, gone, files, held=held, written=written)


def _planned(log: TableLog, i: int) -> Snapshot:
    """The version attempt ``i`` plans on: the first attempt on the pointer's
    (:meth:`TableMetadata.write_base`: no roll-forward probe, one request
    fewer), later ones on the latest. A version past a lagging pointer makes
    the first attempt's manifest put fail, and the commit rebases or conflicts
    as after any lost race."""
    return resolve(log, log.write_base().version) if i == 0 else resolve(log)


def _stands(log: TableLog, snap: Snapshot, i: int) -> bool:
    """Whether "nothing to do", found on ``snap`` by attempt ``i``, is the
    answer: a first attempt planned on the pointer's version confirms that no
    version lies past it (a row that only a later version holds must still be
    deleted or updated), with the probe it skipped."""
    return i > 0 or log.latest().version == snap.version


# ---------------------------------------------------------------------- update


def _check_set(table: str, schema: Schema, set: Mapping[str, str]) -> dict[str, str]:
    """``set`` (checked by :func:`update`: names and SQL text) with the
    table's spelling of each column, or WriteError for one it lacks."""
    names = {c.lower(): c for c in schema.names}
    for col in set:
        if col.lower() not in names:
            raise WriteError(
                f"table {table}: update: column {col!r} does not exist "
                f"(columns: {', '.join(schema.names)}; merge_schema=True adds it)"
            )
    return {names[col.lower()]: expr for col, expr in set.items()}


def update(
    engine: Engine,
    set: Mapping[str, str],
    where: str | None = None,
    *,
    merge_schema: bool = False,
    attempts: int = ATTEMPTS,
) -> Manifest | None:
    """Set columns (SQL expressions over the row) of the live rows where
    ``where`` holds (every row without it): the old rows tombstoned, the new
    ones appended, one version; None when no row matches. With
    ``merge_schema``, ``set`` columns the table lacks are added and allowed
    widenings made in the same version (FORMAT.md §3.4)."""
    op = "update"
    table = engine.table
    if not isinstance(set, Mapping) or not set:
        raise WriteError(f"table {table}: update: set must name columns, e.g. set={{'v': 'v * 2'}}")
    for col, expr in set.items():
        if not isinstance(col, str) or not col:
            raise WriteError(f"table {table}: update: {col!r} is not a column name")
        if not isinstance(expr, str) or not expr.strip():
            raise WriteError(f"table {table}: update: column {col!r}: expression must be SQL text")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise WriteError(f'table {table}: update: the condition must be SQL text such as "id < 100"')
    engine.check_texts([*set.values(), *([where] if where else [])], op)

    def attempt(i: int) -> Manifest | None:
        snap = _planned(engine.log, i)
        new_schema = None
        if merge_schema:
            evolved = _evolved_for_set(engine, snap, set, f"table {table}: {op}", op)
            if evolved is not snap:
                snap, new_schema = evolved, evolved.schema
        assign = _check_set(table, snap.schema, set)
        found = engine.find_update(snap, assign, where)
        if found is None:
            return None if _stands(engine.log, snap, i) else attempt(i + 1)
        try:
            found.refuse_unstorable()
            pk = snap.primary_key
            span = None
            if pk is not None and pk in assign:  # keys may move: unique and non-NULL after it too
                added, replaced, _ = found.keys(pk)
                span = check_written_keys(table, op, pk, engine.log.storage, snap, added, replaced=replaced)
            records, n = found.tombstones()
            if not records:
                return None if _stands(engine.log, snap, i) else attempt(i + 1)
            files = found.write()
            return commit_dml(
                engine.log, operation="UPDATE", read_version=snap.version, records=records, files=files,
                summary={"updated_rows": n, "deleted_rows": n}, insert_key_span=span,
                schema=snap.schema if new_schema is not None else None, new_schema=new_schema,
                change_data=_change_data(engine, snap, found, files),
            )  # fmt: skip
        finally:
            found.close()

    return with_retries(f"table {table}: {op}", attempts, attempt)


# ---------------------------------------------------------------------- append


def append(
    log: TableLog,
    table: str,
    files: Sequence[DataFile],
    *,
    schema: Schema,
    new_schema: Schema | None = None,
    keys: pa.Array | pa.ChunkedArray | None = None,
    summary: Mapping[str, Any] | None = None,
    base: Manifest | None = None,
    keys_checked: bool = False,
    attempts: int = ATTEMPTS,
) -> Manifest:
    """Commit written ``files`` as new rows, one ``APPEND`` version, whichever
    engine wrote them.

    ``keys``: the primary-key values of exactly those rows (None: the table
    has no primary key, or the caller allows duplicates). They are refused if
    NULL, repeated, or already live in the table; the commit then conflicts
    with any commit since its check that touched the keys' span, and checks
    again from the new head (up to ``attempts`` times). ``base``: the version
    the input was fitted to, checked on the first attempt instead of reading
    the pointer again (an append's S3 requests, issue 36).
    ``keys_checked``: the caller already refused NULL and repeated keys
    within the input, before writing a file (the embedded engine knows its
    keys first; Spark reads them back from what it wrote). Nothing is
    committed when a check refuses; the caller removes its files.
    """
    summary = {**(summary or {}), **added_summary(files)}
    if keys is None:
        change = Change("APPEND", add_files=tuple(files), schema=schema, new_schema=new_schema, summary=summary)
        return log.commit(change, base=base)
    head = base or log.latest()  # read once: the first attempt plans on it
    pk = head.primary_key
    if pk is None:
        raise WriteError(f"table {table}: append: keys were given for a table without a primary key")
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if not keys_checked:
        check_input_keys(table, pk, keys)
    mm = pc.min_max(keys)
    span = (pk, json_stat(mm["min"].as_py()), json_stat(mm["max"].as_py()))

    def attempt(i: int) -> Manifest:
        snap = resolve(log, head.version) if i == 0 else resolve(log)
        found = existing_keys(log.storage, snap, pk, keys)
        if found:
            raise refuse_existing(table, pk, found, snap.version)
        change = Change(
            "APPEND", add_files=tuple(files), schema=schema, new_schema=new_schema, summary=summary,
            read_version=snap.version, key_span=span,
        )  # fmt: skip
        return log.commit(change, base=snap.manifest)

    return with_retries(f"table {table}: append", attempts, attempt)


# ---------------------------------------------------------------------- merge


def last_batch(log: TableLog, query: str, batch: int | None = None) -> int:
    """The highest micro-batch id of stream ``query`` committed to the table, or -1:
    the head's record (every version carries it, whatever GC dropped), else, for
    batches committed before manifests carried it, the versions' summaries.

    Given ``batch``, the pointer's version answers when it holds ``batch``
    already (records only grow): a replay costs the pointer and one manifest,
    without the probe for versions past the pointer."""
    if batch is not None and (known := log.write_base().streams.get(query, -1)) >= batch:
        return known
    head = log.latest()
    if query in head.streams:
        return head.streams[query]
    for m in reversed(log.history()):
        s = m.summary or {}
        if s.get("stream_query") == query:
            return int(s["stream_batch"])
    return -1


def _source_fits(engine: Engine, spec: MergeSpec, schema: Schema, source: pa.Schema, where: str) -> None:
    """The merge's shape (:func:`castsql.write.merge.validate`) and the one
    type rule (:func:`castsql.format.evolution.fits`) for the source's table columns."""
    validate(spec, engine.table, schema.names, source.names)
    types = {c.name.lower(): c for c in schema.columns}
    for f in source:
        col = types.get(f.name.lower())
        if col is not None and not fits(f.type, type_from_name(col.type)):
            raise refusal(where, col.name, f.type, type_from_name(col.type))


def merge(engine: Engine, spec: MergeSpec, options: Options | None = None) -> MergeMetrics:
    """Run ``spec`` with the engine's source against the newest version: one
    version, or none when nothing changes (:class:`MergeMetrics`; ``version``
    None). A micro-batch of ``options.stream`` the table already has commits
    nothing (``extra["skipped_batch"]``)."""
    o = options or Options()
    table = engine.table
    where = f"table {table}: merge"
    if o.stream is not None and last_batch(engine.log, *o.stream) >= o.stream[1]:
        return MergeMetrics(extra={"skipped_batch": True})
    head = engine.log.latest()
    source = engine.source_schema()
    target = merged(head.schema, source, where, head.primary_key) if o.merge_schema else head.schema
    _source_fits(engine, spec, target, source, where)
    engine.check_texts(spec.texts(), "merge")
    metrics = MergeMetrics(num_source_rows=engine.source_rows())

    def attempt(i: int) -> MergeMetrics:
        metrics.attempts = i + 1
        if i and o.stream is not None and last_batch(engine.log, o.stream[0]) >= o.stream[1]:
            metrics.extra["skipped_batch"] = True  # committed meanwhile by an earlier run of the batch
            return metrics
        snap = _planned(engine.log, i)
        out = merge_once(engine, spec, snap, o, metrics)
        if out.version is None and not out.extra.get("skipped_batch") and not _stands(engine.log, snap, i):
            return attempt(i + 1)
        return out

    return with_retries(f"table {table}: merge", o.attempts, attempt)


def merge_once(
    engine: Engine, spec: MergeSpec, snap: Snapshot, options: Options, metrics: MergeMetrics | None = None
) -> MergeMetrics:
    """One attempt of a merge planned from ``snap``: CommitConflict when a
    commit since then makes the plan stale (:func:`merge` plans again)."""
    metrics = metrics if metrics is not None else MergeMetrics(num_source_rows=engine.source_rows())
    new_schema = None
    if options.merge_schema:
        where = f"table {engine.table}: merge"
        evolved = evolve(snap, merged(snap.schema, engine.source_schema(), where, snap.primary_key), where)
        if evolved is not snap:
            snap, new_schema = evolved, evolved.schema
    found = engine.find_merge(snap, spec)
    try:
        return _commit_merge(engine, snap, spec, found, metrics, options, new_schema)
    finally:
        found.close()


def _commit_merge(
    engine: Engine, snap: Snapshot, spec: MergeSpec, found: Found, metrics: MergeMetrics, o: Options,
    new_schema: Schema | None, cdc: Cdc | None = None, markers: pa.Table | None = None,
) -> MergeMetrics:  # fmt: skip
    """Commit what ``found`` holds; a sequenced CDC batch (``cdc``) also keeps
    ``markers``, the key and sequence of each delete it applied (FORMAT.md
    §3.7), and commits for them alone when no row changed."""
    table = engine.table
    if found.multiple and not spec.multiple_matches_allowed:
        raise MergeError(
            f"table {table}: merge: several source rows match one target row and a matched clause would change "
            f"it ({'; '.join(found.multiple_labels())}); make the source's keys unique (one row per key: "
            "castsql.write.cdc.latest_per_key) — nothing was committed"
        )
    found.refuse_unstorable()
    c = found.counts
    metrics.num_target_rows_updated, metrics.num_target_rows_deleted = c.updated, c.deleted
    metrics.num_target_rows_inserted, metrics.num_output_rows = c.inserted, c.updated + c.inserted
    metrics.version = None
    keep = markers is not None and markers.num_rows > 0
    if not c.any and not keep:
        return metrics
    span = _merge_keys(engine, snap, spec, found, o.allow_duplicate_keys) if c.any else None
    if keep:
        span = _with_markers(span, snap, spec, markers)
    records, n_gone = found.tombstones()
    if n_gone != c.updated + c.deleted:
        raise WriteError(
            f"table {table}: merge: planned {n_gone} tombstoned row(s) for {c.updated + c.deleted} changed"
        )
    files = found.write() if c.updated + c.inserted else []
    stream = o.stream
    m = commit_dml(
        engine.log,
        operation="MERGE",
        read_version=snap.version,
        records=records,
        files=files,
        summary={
            "inserted_rows": c.inserted,
            "updated_rows": c.updated,
            "deleted_rows": n_gone,
            "source_rows": metrics.num_source_rows,
            **({"stream_query": stream[0], "stream_batch": stream[1]} if stream is not None else {}),
            **({"delete_markers": markers.num_rows} if keep and markers is not None else {}),
        },
        insert_key_span=span,
        schema=snap.schema if new_schema is not None else None,
        new_schema=new_schema,  # merge_schema: the schema changes in this version (FORMAT.md §3.4)
        change_data=_change_data(engine, snap, found, files),  # None without deleted rows
        cdc_order=(cdc.key, cdc.sequence) if cdc is not None and cdc.sequence else None,
        markers=markers if keep else None,
    )
    metrics.version = m.version
    metrics.num_target_files_added = len(files)
    metrics.num_tombstones_added = 1 if records else 0
    metrics.bytes_written = sum(f.size_bytes for f in files)
    metrics.extra["tombstone_records"] = len(records)
    metrics.extra["tombstone_bytes"] = len(serialize_tombstones(records)) if records else 0
    return metrics


def _merge_keys(engine: Engine, snap: Snapshot, spec: MergeSpec, found: Found, allow: bool) -> tuple | None:
    """The primary-key rule for a merge, and its conflict span.

    Where keys may move (an update sets the key, or copies it from a source
    row matched on other columns) or inserted keys may already be live (a
    merge not on the key alone, a computed key), every added and replaced key
    is checked (:func:`castsql.write.keys.check_written_keys`). An upsert on
    the key (the usual merge) only needs its inserted keys non-NULL and
    distinct: counted where the engine holds them, fetched only to name the
    offenders. Without a primary key (or with ``allow_duplicate_keys``) the
    span is the merge's first key over the inserted rows."""
    table, c = engine.table, found.counts
    pk = snap.primary_key
    if pk is not None and not allow:
        floating = pa.types.is_floating(type_from_name(snap.schema.column_named(pk).type))  # NaN: counted as a value
        unmatched = inserts_unmatched(spec, pk)
        if moves_keys(spec, pk) or not unmatched or floating:
            added, replaced, inserted = found.keys(pk)
            return check_written_keys(
                table, "merge", pk, engine.log.storage, snap, added, replaced=replaced,
                absent=inserted if unmatched else None,
            )  # fmt: skip
        if not c.inserted:
            return None
        st = found.insert_stats(pk)
        if st.nulls or st.distinct != c.inserted:
            added, _, inserted = found.keys(pk)
            check_input_keys(table, pk, added.filter(pa.array(inserted)), "merge")
        return pk, json_stat(st.lo), json_stat(st.hi)
    if not c.inserted:
        return None
    if spec.keys is None:
        return (None, None, None)  # any concurrent data file conflicts
    col = next((n for n in snap.schema.names if n.lower() == spec.keys[0].lower()), spec.keys[0])
    st = found.insert_stats(col)
    lo, hi = json_stat(st.lo), json_stat(st.hi)
    return (col, lo, hi) if lo is not None and hi is not None else (None, None, None)


def _with_markers(span: tuple | None, snap: Snapshot, spec: MergeSpec, markers: pa.Table) -> tuple:
    """``span`` (the keys a merge inserts) widened to the keys of the delete
    markers it keeps: a concurrent commit that adds a row of such a key made
    the delete's plan stale (FORMAT.md §3.7)."""
    pk = snap.primary_key
    col = pk if pk is not None and any(k.lower() == pk.lower() for k in spec.keys or ()) else (spec.keys or (None,))[0]
    if col is None or (span is not None and span[0] != col):
        return (None, None, None)
    mm = pc.min_max(markers.column(next(n for n in markers.column_names if n.lower() == col.lower())))
    lo, hi = json_stat(mm["min"].as_py()), json_stat(mm["max"].as_py())
    if lo is None or hi is None:
        return (None, None, None)
    if span is None:
        return (col, lo, hi)
    try:
        return (col, min(lo, span[1]), max(hi, span[2]))
    except TypeError:
        return (None, None, None)


# ---------------------------------------------------------------------- change data capture


def apply_cdc(engine: Engine, cdc: Cdc, options: Options | None = None) -> CdcMetrics:
    """Apply the engine's source as one CDC batch (:mod:`castsql.write.cdc`):
    one version, or none when no change outranks the table's. A batch id of
    ``options.stream`` the table already has commits nothing and reads
    nothing past the head (``batch_replayed``)."""
    o = options or Options()
    log = engine.log
    where = f"table {engine.table}: cdc"
    metrics = CdcMetrics()
    if o.stream is not None and last_batch(log, *o.stream) >= o.stream[1]:
        metrics.batch_replayed = True
        metrics.extra["skipped_batch"] = True
        return metrics
    if not engine.source_rows():
        return metrics  # an empty poll: nothing to apply (nor to check its columns against)
    head = log.latest()
    batch = engine.source_schema()
    stored = pa.schema([f for f in batch if f.name.lower() != cdc.op_column.lower()])
    pk = head.primary_key
    target = merged(head.schema, stored, where, pk) if o.merge_schema else head.schema
    cdc = cdc.bind(where, target, batch)
    state = head.cdc
    if state is not None and not cdc.sequence:
        raise MergeError(
            f"{where}: the table orders CDC changes by sequence ({', '.join(state.sequence)}); give sequence= "
            "(a change without one could bring back a key deleted by a later change); nothing was committed"
        )
    if state is not None and (_lower(state.key), _lower(state.sequence)) != (_lower(cdc.key), _lower(cdc.sequence)):
        raise MergeError(
            f"{where}: the table orders CDC changes by key ({', '.join(state.key)}) and sequence "
            f"({', '.join(state.sequence)}); this batch names key ({', '.join(cdc.key)}) and sequence "
            f"({', '.join(cdc.sequence)}); nothing was committed"
        )
    spec = cdc.merge_spec(cdc.columns, Dialect(engine.dialect))
    _source_fits(engine, spec, target, stored, where)
    check = engine.cdc_check(cdc)
    if check.problem is not None:
        raise MergeError(f"{where}: {check.problem}; nothing was committed")
    metrics.num_source_rows, metrics.num_changes = check.rows, check.changes
    metrics.num_changes_superseded = check.rows - check.changes

    def attempt(i: int) -> CdcMetrics:
        metrics.attempts = i + 1
        if i and o.stream is not None and last_batch(log, o.stream[0]) >= o.stream[1]:
            metrics.batch_replayed = True  # committed meanwhile by an earlier run of the batch
            metrics.extra["skipped_batch"] = True
            return metrics
        snap = _planned(log, i)
        new_schema = None
        if o.merge_schema:
            evolved = evolve(snap, merged(snap.schema, stored, where, snap.primary_key), where)
            if evolved is not snap:
                snap, new_schema = evolved, evolved.schema
        n_fresh, dels = engine.cdc_changes(cdc, _markers(log, snap, cdc) if cdc.sequence else None)
        found = engine.find_merge(snap, spec, unchanged=True)
        try:
            out = _commit_merge(engine, snap, spec, found, metrics, o, new_schema, cdc, dels if cdc.sequence else None)
        finally:
            found.close()
        c = found.counts
        if out.version is None and not _stands(log, snap, i):
            return attempt(i + 1)
        metrics.num_changes_stale = metrics.num_changes - n_fresh + c.matched_unchanged
        # A delete of a key the table does not hold is applied when its marker is kept.
        remembered = c.unmatched_unchanged if cdc.sequence else 0
        metrics.num_changes_applied = c.updated + c.deleted + c.inserted + remembered
        metrics.num_delete_markers_added = dels.num_rows if cdc.sequence and out.version is not None else 0
        return metrics

    return with_retries(where, o.attempts, attempt)


def _lower(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(n.lower() for n in names)


def _markers(log: TableLog, snap: Snapshot, cdc: Cdc) -> pa.Table | None:
    """The key and sequence of the delete markers ``snap`` holds (FORMAT.md
    §3.7), or None when it holds none."""
    state = snap.manifest.cdc
    if state is None or not (state.markers or state.inline):
        return None
    where = log.where(snap.version)
    parts = [conform(log.markers_table(r, where), state, snap.schema, where) for r in state.markers]
    parts.append(from_inline(state, snap.schema, where))
    table = pa.concat_tables(parts).drop_columns([WRITTEN_AT])
    return table
