"""Which rows one snapshot has that another lacks, by row identity, from metadata.

A row is identified by its data file and its position in it (data files are
immutable), so the rows that entered or left the live set between two
snapshots are found from what each says about the files that differ between
them: files only one of them lists, and files whose deletes differ. Nothing
here reads a data file; positions deleted by key ranges come from the
``dead`` callback (the engine resolves them with a pushed-down scan of the key
column), so this module stays below the query engine.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from pyroaring import BitMap
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files, PositionDelete
    >>> from castsql.snapshot import resolve
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    >>> f = log.append(write_data_files(st, pa.table({"id": range(10)}))).data_files[0]
    >>> _ = log.delete([PositionDelete(f.name, None, BitMap([2, 3]))])
    >>> d = between(resolve(log, 1), resolve(log, 2), lambda snap, rf: rf.deleted)
    >>> [(rows.file.key == f.path, list(rows.positions)) for rows in d.deleted], d.inserted
    ([(True, [2, 3])], [])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyroaring import AbstractBitMap, BitMap

from castsql.snapshot.resolve import ResolvedFile, Snapshot

# Every deleted position of a file in a snapshot, key ranges included.
Dead = Callable[[Snapshot, ResolvedFile], AbstractBitMap]


@dataclass(frozen=True, slots=True)
class FileRows:
    """Positions of one data file."""

    file: ResolvedFile
    positions: AbstractBitMap


@dataclass(slots=True)
class Difference:
    """The rows ``after`` holds and ``before`` does not (``inserted``), and the
    reverse (``deleted``), file by file; and the keys of the data files only
    ``after`` lists (``files_added``) and only ``before`` lists (``files_removed``)."""

    files_added: set[str]
    files_removed: set[str]
    inserted: list[FileRows] = field(default_factory=list)
    deleted: list[FileRows] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(len(r.positions) for r in self.inserted) + sum(len(r.positions) for r in self.deleted)


def between(
    before: Snapshot,
    after: Snapshot,
    dead: Dead,
    files: dict[str, ResolvedFile] | None = None,
) -> Difference:
    """The rows that differ between two resolved snapshots of one table (either
    may be the older). Files both list with the same deletes are never looked
    at; ``files`` caches file entries across calls (a walk over many versions
    looks each file up once: entries never change, only deletes do)."""
    if not before.is_resolved or not after.is_resolved:
        raise ValueError("between() compares resolved snapshots")
    added, removed = after.file_diff(before)
    keys = added | removed
    for k in after.deletes.keys() | before.deletes.keys():
        a, b = after.deletes.get(k), before.deletes.get(k)
        if a is None or b is None or (a is not b and (a.deleted != b.deleted or a.key_ranges != b.key_ranges)):
            keys.add(k)
    files = {} if files is None else files
    _look_up(files, after, [k for k in keys if k not in files and k not in removed])
    _look_up(files, before, [k for k in keys if k not in files and k not in added])
    out = Difference(added, removed)
    for k in sorted(keys):
        f = files.get(k)
        if f is None:
            continue  # every row deleted on both sides
        # A side that does not list the file, or lists it with every row
        # deleted, has every position dead.
        dead_b = all_positions(f.total_rows) if k in added or k in before.gone else dead(before, _as_of(before, f))
        dead_a = all_positions(f.total_rows) if k in removed or k in after.gone else dead(after, _as_of(after, f))
        left, came = dead_a - dead_b, dead_b - dead_a
        if left:
            out.deleted.append(FileRows(f, left))
        if came:
            out.inserted.append(FileRows(f, came))
    return out


def _look_up(files: dict[str, ResolvedFile], snap: Snapshot, keys: list[str]) -> None:
    for f in snap.resolved(sorted(keys)) if keys else ():
        files[f.key] = f


def _as_of(snap: Snapshot, f: ResolvedFile) -> ResolvedFile:
    """``f`` with the deletes ``snap`` gives it."""
    d = snap.deletes.get(f.key)
    if d is None:
        return ResolvedFile(f.key, f.uri, f.entry, f.row_group_rows, version=snap.version)
    rgr = d.row_group_rows if d.row_group_rows is not None else f.row_group_rows
    return ResolvedFile(f.key, f.uri, f.entry, rgr, d.deleted, d.key_ranges, snap.version)


def all_positions(rows: int) -> BitMap:
    """Every position of a file of ``rows`` rows."""
    out = BitMap()
    out.add_range(0, rows)
    return out
