"""How a commit turns the previous version's metadata into the next (format version 2).

A commit never rewrites what it does not change. It adds its data file
entries to the manifest's inline list and its tombstone files to the inline
tombstone list, and keeps every metadata object of the previous version by
reference. Three rules keep the number of objects a version references
bounded, each paid by the commit that crosses its threshold (so amortised over
commits; no separate checkpoint job):

- **fold**: when the inline files exceed ``FILES_INLINE_MAX`` entries (or the
  inline tombstones ``DELETES_INLINE_MAX`` files), they are written into new
  metadata objects (files in chunks of at most ``OBJECT_TARGET``) and the
  inline list starts empty again;
- **merge**: objects have a *level* by their size (entries below
  ``INLINE_MAX * FANOUT**(L+1)`` are level L; ``OBJECT_TARGET`` or more:
  *full*, never merged again). When ``FANOUT`` objects of one level exist, they
  are merged, in their order, into one object of a higher level (cut into full
  objects of ``OBJECT_TARGET`` rows and one remainder) — a size-tiered LSM:
  every entry is rewritten at most once per level (three levels), and a
  version references at most ``3 * (FANOUT - 1)`` objects that are not full;
- **removal** (compaction, data files or tombstones going away): the objects
  holding what goes are rewritten without it, keeping their level; all others
  are kept.

With the constants below, a table of N data files references
``ceil(N / 16384)`` full files objects plus at most 21 others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from castsql.errors import CommitConflict
from castsql.format.manifest import DataFile, Manifest, MetaRef
from castsql.format.metadata import TableMetadata
from castsql.format.metafiles import (
    conform_files,
    deletes_to_arrow,
    files_to_arrow,
    write_deletes_object,
    write_files_object,
)
from castsql.format.schema import Schema
from castsql.format.state import may_hold

FILES_INLINE_MAX = 32
DELETES_INLINE_MAX = 16
FANOUT = 8
OBJECT_TARGET = 16384


def level_for(entries: int, inline_max: int) -> int | None:
    """The merge level of an object of ``entries`` rows (None: full).

    >>> [level_for(n, 32) for n in (1, 255, 256, 2048, 16383, 16384)]
    [0, 0, 1, 2, 2, None]
    """
    if entries >= OBJECT_TARGET:
        return None
    level, bound = 0, inline_max * FANOUT
    while entries >= bound:
        level, bound = level + 1, bound * FANOUT
    return level


def _merge_tiers(
    objects: list[MetaRef],
    inline_max: int,
    load: Callable[[MetaRef], pa.Table],
    write: Callable[[pa.Table, int | None], MetaRef],
) -> list[MetaRef]:
    while True:
        by_level: dict[int, list[int]] = {}
        for i, ref in enumerate(objects):
            if ref.level is not None:
                by_level.setdefault(ref.level, []).append(i)
        due = sorted(level for level, idx in by_level.items() if len(idx) >= FANOUT)
        if not due:
            return objects
        members = by_level[due[0]][:FANOUT]
        table = pa.concat_tables([load(objects[i]) for i in members])
        # Objects stay near OBJECT_TARGET rows: a selective reader fetches little.
        merged = [write(chunk, level_for(chunk.num_rows, inline_max)) for chunk in _chunks(table)]
        first = members[0]
        out: list[MetaRef] = []
        for i, r in enumerate(objects):
            if i == first:
                out += merged
            elif i not in members:
                out.append(r)
        objects = out


def _chunks(table: pa.Table) -> list[pa.Table]:
    return [table.slice(s, OBJECT_TARGET) for s in range(0, table.num_rows, OBJECT_TARGET)]


def next_files(
    meta: TableMetadata,
    base: Manifest,
    schema: Schema,
    inline: Sequence[DataFile],
    add: Sequence[DataFile],
    remove: set[str],
    where: str,
) -> tuple[list[MetaRef], list[DataFile], list[DataFile]]:
    """The files objects and inline entries of the next version: ``base``'s
    (``inline`` its entries with table keys for paths) without ``remove`` and
    with ``add``. Also returns the entries removed. CommitConflict if a key to
    remove is not in ``base``."""
    st = meta.storage

    def write(table: pa.Table, level: int | None) -> MetaRef:
        ref = write_files_object(st, table, level=level)
        meta.wrote_part(ref, table, schema)
        return ref

    kept = [f for f in inline if f.path not in remove]
    removed = [f for f in inline if f.path in remove]
    left = remove - {f.path for f in removed}
    objects: list[MetaRef | None] = list(base.file_objects)
    for i, ref in enumerate(base.file_objects):
        if not left or not any(may_hold(ref, k) for k in left):
            continue
        part = meta.part(ref, base)
        table = part.table
        hit = pc.is_in(table.column("path"), pa.array(sorted(left), pa.string()))
        if not pc.any(hit).as_py():
            continue
        gone = table.filter(hit)
        removed += part.entries_where(hit)
        left -= set(gone.column("path").to_pylist())
        rest = conform_files(table.filter(pc.invert(hit)), schema)
        objects[i] = write(rest, ref.level) if rest.num_rows else None
    if left:
        raise CommitConflict(f"{where}: data file {sorted(left)[0]} was removed by a concurrent commit")
    live = [r for r in objects if r is not None]
    kept += list(add)
    if len(kept) > FILES_INLINE_MAX:
        for chunk in _chunks(files_to_arrow(kept, schema)):
            live.append(write(chunk, level_for(chunk.num_rows, FILES_INLINE_MAX)))
        kept = []
    live = _merge_tiers(
        live,
        FILES_INLINE_MAX,
        lambda ref: conform_files(meta.part(ref, base).table, schema),
        write,
    )
    return live, kept, removed


def next_deletes(
    meta: TableMetadata,
    base: Manifest,
    inline: Sequence[str],
    add: Sequence[str],
    remove: set[str],
    where: str,
) -> tuple[list[MetaRef], list[str]]:
    """The deletes objects and inline tombstone keys of the next version:
    ``base``'s (``inline`` its inline tombstones as table keys) without
    ``remove`` and with ``add``. CommitConflict if one to remove is not in ``base``."""
    st = meta.storage
    kept = [t for t in inline if t not in remove]
    left = remove - set(inline)  # not found yet
    in_objects = pa.array(sorted(left), pa.string())
    objects: list[MetaRef | None] = list(base.delete_objects)
    if left:
        # One tombstone's records may be spread over several objects (a fold
        # cuts chunks): every object is checked, not only until each is found once.
        for i, ref in enumerate(base.delete_objects):
            table = meta.deletes_table(ref)
            hit = pc.is_in(table.column("tombstone"), in_objects)
            if not pc.any(hit).as_py():
                continue
            left -= set(table.filter(hit).column("tombstone").to_pylist())
            rest = table.filter(pc.invert(hit))
            objects[i] = write_deletes_object(st, rest, level=ref.level) if rest.num_rows else None
    if left:
        raise CommitConflict(f"{where}: tombstone {sorted(left)[0]} was removed by a concurrent commit")
    live = [r for r in objects if r is not None]
    kept += list(add)
    if len(kept) > DELETES_INLINE_MAX:
        records = deletes_to_arrow([(t, r) for t in kept for r in meta.tombstones(t)])
        for chunk in _chunks(records):
            live.append(write_deletes_object(st, chunk, level=level_for(chunk.num_rows, DELETES_INLINE_MAX)))
        kept = []
    live = _merge_tiers(
        live,
        DELETES_INLINE_MAX,
        meta.deletes_table,
        lambda table, level: write_deletes_object(st, table, level=level),
    )
    return live, kept
