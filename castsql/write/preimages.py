"""The change file of a delete, update or merge: every row it changed, typed as Delta's change feed types them.

Under ``castsql.changeDataFeed`` a version whose tombstones delete rows also
commits one Parquet file of the rows it deleted, as they were, and the rows
it inserted, each with its ``_change_type`` (FORMAT.md §3.5), so an audit of
the version reads that small file instead of the row groups its tombstones
hit in the table's large files (one random update in a 10M-row table costs a
122,880-row row group otherwise), and does not pair its rows by key. It is
what Delta's ``_change_data`` files are, written by the same code whichever
engine ran the write: the engine says which rows it deletes
(``Found.deleted_positions``), and this module takes them from the rows the
engine already read (``Found.held_rows``: the embedded engine's keyed merge)
or reads exactly those from the data files, reads the version's new files
back, and writes them. :func:`write_preimages` writes the older record (the
deleted rows alone), which readers still read.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from pyroaring import BitMap
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files
    >>> from castsql.snapshot import resolve
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.string())]))
    >>> f = log.append(write_data_files(st, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))).data_files[0]
    >>> cd = write_preimages(st, resolve(log), {f.path: BitMap([1])})
    >>> read_preimages(st, cd.file).to_pylist() == [{"id": 2, "v": "b", FILE_COL: f.path, POS_COL: 1}]
    True
    >>> cd.keys is None  # the table has no primary key
    True
    >>> cf = write_change_file(st, resolve(log), {f.path: BitMap([0])})
    >>> cf.typed, [(r["id"], r["_change_type"]) for r in read_preimages(st, cf.file).to_pylist()]
    (True, [(1, 'delete')])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.errors import FormatError
from castsql.format import DataFile
from castsql.format.changeblocks import remember
from castsql.format.datafiles import conform, write_file
from castsql.format.manifest import KEYS_MAX, ChangeData, json_stat
from castsql.storage.base import overlapped
from castsql.storage.ranged import open_ranged
from castsql.write.keys import open_data_file
from castsql.write.records import FILE_COL, POS_COL, key_range_type

CHANGE_TYPE_COL = "_change_type"  # a change file's Delta change type of each row (FORMAT.md §3.5)

if TYPE_CHECKING:
    from castsql.format.schema import Schema
    from castsql.snapshot import ResolvedFile, Snapshot
    from castsql.storage import Storage


def write_preimages(
    storage: Storage,
    snap: Snapshot,
    gone: Mapping[str, BitMap],
    added: Sequence[DataFile] = (),
    held: pa.Table | None = None,
) -> ChangeData | None:
    """Write the rows at ``gone``'s positions (table key → file positions) of
    ``snap``'s files, in ``snap``'s schema plus ``_castsql_file`` and
    ``_castsql_pos``, as one Parquet file under ``data/`` (not committed);
    with the primary keys of those rows and of the ``added`` files' rows
    when at most KEYS_MAX. None when no row is deleted.

    ``held``: rows of ``snap`` the engine already read (every column of
    ``snap``'s schema, ``_castsql_file`` and ``_castsql_pos``; a merge's
    matched rows). When it holds every deleted row they are taken from it;
    otherwise they are read from the data files."""
    keys = sorted(k for k, bm in gone.items() if bm)
    if not keys:
        return None
    table = _deleted_rows(storage, snap, gone, keys, held, f"table {storage.root}: change data")
    return _write(storage, snap, table, added)


def write_change_file(
    storage: Storage,
    snap: Snapshot,
    gone: Mapping[str, BitMap],
    added: Sequence[DataFile] = (),
    held: pa.Table | None = None,
    written: pa.Table | None = None,
) -> ChangeData | None:
    """Write the change file of a version that deletes the rows at ``gone``'s
    positions of ``snap``'s files and adds the ``added`` data files (FORMAT.md
    §3.5): every one of those rows, in ``snap``'s schema, with
    ``_change_type`` (``delete`` and ``insert``; on a keyed table a non-NULL
    key both deleted and inserted is ``update_preimage`` and
    ``update_postimage``, the rule audits pair updates by), ``_castsql_file``
    and ``_castsql_pos`` (the row's data file and position: where it was,
    where it is). ``held`` as :func:`write_preimages`; ``written``: the
    rows of the ``added`` files in their order, as the engine wrote them (not
    read back when it has exactly their rows). None when no row is deleted
    (the version's new files are then its whole change)."""
    keys = sorted(k for k, bm in gone.items() if bm)
    if not keys:
        return None
    schema = snap.schema
    where = f"table {storage.root}: change file"
    old = _deleted_rows(storage, snap, gone, keys, held, where)
    new = _inserted_rows(storage, schema, added, written, where).cast(old.schema) if added else old.schema.empty_table()
    pk = snap.primary_key
    gone_type = pa.array(["delete"] * old.num_rows, pa.string())
    new_type = pa.array(["insert"] * new.num_rows, pa.string())
    if pk is not None and old.num_rows and new.num_rows:
        # A key both deleted and inserted (not NULL) is an update, as audits pair them.
        both = pc.is_in(old.column(pk), value_set=new.column(pk).combine_chunks().drop_null())
        gone_type = pc.if_else(pc.fill_null(both, False), "update_preimage", gone_type)
        both = pc.is_in(new.column(pk), value_set=old.column(pk).combine_chunks().drop_null())
        new_type = pc.if_else(pc.fill_null(both, False), "update_postimage", new_type)
    types = pa.chunked_array([*_chunks(gone_type), *_chunks(new_type)], pa.string())
    table = pa.concat_tables([old, new]).append_column(CHANGE_TYPE_COL, types)
    cd = _write(storage, snap, table, (), keys_of=table)
    return replace(cd, typed=True)


def _inserted_rows(
    storage: Storage, schema: Schema, added: Sequence[DataFile], written: pa.Table | None, where: str
) -> pa.Table:
    """Every row of the ``added`` files, in ``schema`` plus ``_castsql_file``
    and ``_castsql_pos``: from ``written`` when it holds exactly their rows in
    their order, else read back from the files."""
    if written is not None and written.num_rows == sum(f.total_rows for f in added):
        t = conform(written.select([n for n in schema.names if n in written.column_names]), schema, where,
                    fill_missing=True)  # fmt: skip
        paths = np.repeat(np.array([f.path for f in added], dtype=object), [f.total_rows for f in added])
        pos = np.concatenate([np.arange(f.total_rows, dtype=np.int64) for f in added])
        return t.append_column(FILE_COL, pa.array(paths, pa.string())).append_column(POS_COL, pa.array(pos))
    parts = []
    for f in added:
        t = pq.ParquetFile(open_ranged(storage, f.path, f.size_bytes)).read()
        t = conform(t.select([n for n in schema.names if n in t.column_names]), schema, where, fill_missing=True)
        t = t.append_column(FILE_COL, pa.array([f.path] * t.num_rows, pa.string()))
        parts.append(t.append_column(POS_COL, pa.array(np.arange(t.num_rows, dtype=np.int64))))
    return pa.concat_tables(parts)


def _chunks(a: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return a.chunks if isinstance(a, pa.ChunkedArray) else [a]


def _deleted_rows(
    storage: Storage, snap: Snapshot, gone: Mapping[str, BitMap], keys: list[str], held: pa.Table | None, where: str
) -> pa.Table:
    """The rows at ``gone``'s positions, in ``snap``'s schema plus ``_castsql_file`` and ``_castsql_pos``."""
    schema = snap.schema
    taken = _taken(held, gone, keys, schema.names) if held is not None else None
    if taken is not None:
        table = conform(taken.select(schema.names), schema, where, fill_missing=True)
        return table.append_column(FILE_COL, taken.column(FILE_COL)).append_column(POS_COL, taken.column(POS_COL))
    files = snap.resolved(keys)

    def rows(f: ResolvedFile) -> pa.Table:
        t = _rows_at(storage, f, gone[f.key], schema.names)
        t = conform(t, schema, where, fill_missing=True)
        t = t.append_column(FILE_COL, pa.array([f.key] * t.num_rows, pa.string()))
        return t.append_column(POS_COL, pa.array(np.asarray(gone[f.key].to_array(), dtype=np.int64)))

    if len(files) == 1:
        return rows(files[0])
    return pa.concat_tables(overlapped(rows, files))  # storage's I/O threads: the files' round trips overlap


def _taken(held: pa.Table, gone: Mapping[str, BitMap], keys: list[str], names: list[str]) -> pa.Table | None:
    """The rows of ``held`` at ``gone``'s positions, ordered by file (``keys``)
    then position, as they are read from the files; None unless ``held`` has
    every column of ``names`` and every one of those rows exactly once."""
    if any(n not in held.column_names for n in (*names, FILE_COL, POS_COL)):
        return None
    files = held.column(FILE_COL).to_numpy(zero_copy_only=False)
    pos = held.column(POS_COL).to_numpy(zero_copy_only=False).astype(np.int64)
    picks = []
    for key in keys:
        want = np.asarray(gone[key].to_array(), dtype=np.int64)
        at = np.flatnonzero(files == key)
        at = at[np.isin(pos[at], want)]
        at = at[np.argsort(pos[at], kind="stable")]
        if len(at) != len(want) or (len(at) and np.any(np.diff(pos[at]) == 0)):
            return None  # a row missing or held twice: read them all from the files
        picks.append(at)
    t = held.take(pa.array(np.concatenate(picks)))
    return t.select([*names, FILE_COL, POS_COL]).replace_schema_metadata(None)


def _write(
    storage: Storage, snap: Snapshot, table: pa.Table, added: Sequence[DataFile], keys_of: pa.Table | None = None
) -> ChangeData:
    """Write the change-data file ``table`` and its entry (statistics of the
    table's columns only), with the keys of ``keys_of`` (default: ``table``)
    and of the ``added`` files' rows."""
    entry = write_file(storage, table)
    if table.schema.get_field_index(CHANGE_TYPE_COL) >= 0:
        remember(storage, entry.path, table)  # its change block takes it from here
    own = (FILE_COL, POS_COL, CHANGE_TYPE_COL)  # statistics of the table's columns only: nobody prunes by these
    entry = replace(
        entry,
        min={k: v for k, v in entry.min.items() if k not in own},
        max={k: v for k, v in entry.max.items() if k not in own},
    )
    return ChangeData(entry, _keys(storage, snap, table if keys_of is None else keys_of, added))


def _keys(storage: Storage, snap: Snapshot, old: pa.Table, added: Sequence[DataFile]) -> tuple[Any, ...] | None:
    """The distinct primary keys of the deleted rows and the added files'
    rows, as sorted JSON statistics; None without a key of a type listed
    exactly (integers, strings, dates, times), or past KEYS_MAX rows (a row
    history then reads the files)."""
    pk = snap.primary_key
    t = old.schema.field(pk).type if pk is not None else None
    # Integers, strings, dates and times only (FORMAT.md §3.5): a float's JSON
    # form need not round-trip to the value a lookup compares.
    if t is None or pa.types.is_floating(t) or not key_range_type(t):
        return None
    if old.num_rows + sum(f.total_rows for f in added) > KEYS_MAX:
        return None
    values = old.column(pk).to_pylist()
    for f in added:
        pf = pq.ParquetFile(open_ranged(storage, f.path, f.size_bytes))
        values += pf.read(columns=[pk]).column(0).to_pylist()
    return tuple(sorted({json_stat(v) for v in values if v is not None}))


def read_preimages(storage: Storage, entry: DataFile) -> pa.Table:
    """A change-data file's rows (for tests and tools; audits scan it in DuckDB)."""
    return pq.ParquetFile(open_ranged(storage, entry.path, entry.size_bytes)).read()


def _rows_at(storage: Storage, f: ResolvedFile, positions: BitMap, names: list[str]) -> pa.Table:
    """The rows of data file ``f`` at ``positions`` (ascending), the columns of
    ``names`` it has: only the row groups holding one are read."""
    pf = open_data_file(storage, f)
    md = pf.metadata
    rgr = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    if sum(rgr) != f.total_rows:
        raise FormatError(f"{f.uri}: holds {sum(rgr)} rows, the manifest says {f.total_rows}")
    have = set(pf.schema_arrow.names)
    cols = [n for n in names if n in have]
    pos = np.asarray(positions.to_array(), dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(rgr)))
    rg_of = np.searchsorted(starts, pos, side="right") - 1
    wanted = np.unique(rg_of)
    table = pf.read_row_groups(wanted.tolist(), columns=cols)
    # Positions within the concatenation of the row groups read.
    read_start = np.concatenate(([0], np.cumsum(np.asarray(rgr)[wanted])[:-1]))
    local = pos - starts[rg_of] + read_start[np.searchsorted(wanted, rg_of)]
    return table.take(pa.array(local))
