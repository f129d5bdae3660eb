"""What a writer wants to commit, as a change that can be re-applied (rebased)
on whatever version won the race before it.

Conflict rules (docs/FORMAT.md, "Concurrent writers"):

- appends never conflict;
- deletes conflict only if a data file their tombstones name has been removed
  since (a concurrent compaction) — rows appended concurrently are not deleted:
  a delete removes the rows that matched in the version it read;
- a compaction (a change that removes files or tombstones) conflicts with any
  tombstone committed after the version it read, and with the loss of any file
  or tombstone it meant to remove.

A conflict raises CommitConflict and commits nothing; the caller re-reads and
recomputes (Spark's delete and compaction do so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from castsql.errors import CommitConflict, FormatError
from castsql.format.files import FileIndex
from castsql.format.layout import to_table_key
from castsql.format.manifest import DataFile, Manifest
from castsql.format.schema import Schema


@dataclass(frozen=True)
class Change:
    operation: str
    add_files: tuple[DataFile, ...] = ()
    remove_files: tuple[str, ...] = ()  # table keys
    add_tombstones: tuple[str, ...] = ()  # table keys
    remove_tombstones: tuple[str, ...] = ()  # table keys
    tombstone_targets: frozenset[str] = frozenset()  # table keys of the files new tombstones name
    schema: Schema | None = None  # schema of add_files, checked against the base
    read_version: int | None = None  # the version a compaction was computed from
    read_tombstones: frozenset[str] | None = None  # that version's tombstone keys
    summary: dict[str, Any] = field(default_factory=dict)

    def apply(self, base: Manifest, table_root: str) -> Manifest:
        """``base`` with this change applied; version fields still base's."""
        where = f"{self.operation} on version {base.version}"
        if self.schema is not None:
            base.schema.check_compatible(self.schema, f"{where}: data files")
        index = FileIndex(base, table_root)
        files = dict(index.by_key)
        for key in self.remove_files:
            if key not in files:
                raise CommitConflict(f"{where}: data file {key} was removed by a concurrent commit")
            del files[key]
        for f in self.add_files:
            key = to_table_key(f.path, table_root, what="data file")
            if key in files:
                raise FormatError(f"{where}: data file {key} is already part of the table")
            files[key] = replace(f, path=key)
        tombs = {to_table_key(t, table_root, what="tombstone"): t for t in base.tombstones}
        if (self.remove_files or self.remove_tombstones) and self.read_tombstones is not None:
            newer = set(tombs) - self.read_tombstones
            if newer:
                raise CommitConflict(
                    f"{where}: {len(newer)} tombstone(s) were committed after version {self.read_version}, "
                    "which this rewrite read"
                )
        for key in self.remove_tombstones:
            if key not in tombs:
                raise CommitConflict(f"{where}: tombstone {key} was removed by a concurrent commit")
            del tombs[key]
        for key in self.add_tombstones:
            if key in tombs:
                raise FormatError(f"{where}: tombstone {key} is already part of the table")
            tombs[key] = key
        for key in self.tombstone_targets:
            if key not in files:
                raise CommitConflict(
                    f"{where}: a new tombstone names data file {key}, which is not in the table "
                    "(removed by a concurrent commit, or never part of it)"
                )
        return base.evolve(
            data_files=tuple(files.values()),
            tombstones=tuple(tombs.values()),
            operation=self.operation,
            summary=dict(self.summary),
        )
