"""What a writer wants to commit, as a change that can be re-applied (rebased)
on whatever version won the race before it.

Conflict rules (docs/FORMAT.md, "Concurrent writers"):

- appends never conflict;
- deletes conflict only if a data file their tombstones name has been removed
  since (a concurrent compaction) — rows appended concurrently are not deleted:
  a delete removes the rows that matched in the version it read;
- a compaction (a change that removes files or tombstones) conflicts with any
  tombstone committed after the version it read, and with the loss of any file
  or tombstone it meant to remove;
- an update or merge (adds data files and tombstones in one version) conflicts
  as a delete does, and also (b) with a tombstone committed since that names a
  file its own tombstones name (``conflict_files``: two updates of one row
  would both re-insert it), and (c) when it inserts rows whose key lies in
  ``key_span``, with a data file committed since whose statistics for that
  column overlap the span or are missing (the insert could duplicate a key),
  or with CDC delete markers committed since whose key bounds overlap it
  (FORMAT.md §3.7: a key deleted meanwhile by a later change). The writer
  re-plans from the new head (:mod:`castsql.write.commit`).

Between version-2 manifests these are checked on the ``change`` records of
the versions committed since the one the writer read (a few small manifests),
never by reading the whole table. A conflict raises CommitConflict and commits
nothing; the caller re-reads and recomputes (Spark's delete and compaction do so).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from castsql.errors import CommitConflict, FormatError, ObjectNotFound, WriteError
from castsql.errors import DmlConflict as DmlConflict  # named here before the family held it
from castsql.errors import RestoreRaced as RestoreRaced
from castsql.format import evolution, fold, markers
from castsql.format.layout import to_table_key
from castsql.format.manifest import CdcState, ChangeData, ChangeLog, DataFile, Manifest, MetaRef, Totals
from castsql.format.metadata import TableMetadata
from castsql.format.properties import delete_retention
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
    # Schema evolution (FORMAT.md §3.4): the schema this change gives the table,
    # rebased on whatever schema the head has (columns it adds get added_in).
    new_schema: Schema | None = None
    read_version: int | None = None  # the version a delete or a compaction was computed from
    read_tombstones: frozenset[str] | None = None  # that version's tombstone keys (compaction)
    # Update / merge (rules b and c): table keys of the files its tombstones name, which no
    # tombstone committed since read_version may name; and (column, lo, hi) of the keys it
    # inserts (JSON statistics), which no data file committed since may overlap
    # (column None: any new data file conflicts).
    conflict_files: frozenset[str] = frozenset()
    key_span: tuple[str | None, Any, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    # Table properties this change sets (None removes one; castsql.format.properties).
    properties: dict[str, str | None] | None = None
    # The change-data file of the rows add_tombstones delete, and the keys (FORMAT.md §3.5).
    change_data: ChangeData | None = None
    # A sequenced CDC batch (FORMAT.md §3.7): its (key, sequence) columns, which
    # the table's order must be (the first such batch sets it), and the markers
    # object of the deletes it applied.
    cdc_order: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    add_markers: Any = None  # pa.Table: key and sequence columns, then _castsql_written_at
    # RESTORE: the CDC state of the version restored (the head's otherwise carries on).
    restore_cdc: bool = False
    cdc: CdcState | None = None

    def apply(self, base: Manifest, meta: TableMetadata) -> Manifest:
        """``base`` with this change applied, as a version-2 manifest; version
        fields still base's. Writes the metadata objects the new version needs
        (fold, merge, removal: :mod:`castsql.format.fold`)."""
        where = f"{self.operation} on version {base.version}"
        if self.operation == "RESTORE" and base.version != self.read_version:
            # Its file lists were computed against read_version: a version that
            # landed since may have added rows the restored version lacks.
            raise RestoreRaced(f"{where}: version {base.version} landed after version {self.read_version} was read")
        root = meta.storage.root
        schema = base.schema
        if self.new_schema is not None:
            schema = evolution.rebase(base.schema, self.new_schema, base.version + 1, where)
        if self.schema is not None:
            # Files written before a concurrent evolution still read (§3.4).
            evolution.check_readable(self.schema, schema, f"{where}: data files")
        state = meta.state(base)
        inline = state.inline_entries()
        inline_tombs = [to_table_key(t, root, what="tombstone") for t in base.tombstones]
        since = self._changes_since(base, meta)
        if self.remove_files or self.remove_tombstones:
            self._check_no_newer_tombstones(base, state, since, where)
        added = [replace(f, path=to_table_key(f.path, root, what="data file")) for f in self.add_files]
        inline_keys = {f.path for f in inline}
        for f in added:
            if f.path in inline_keys or (base.format_version == 1 and state.contains(f.path)):
                raise FormatError(f"{where}: data file {f.path} is already part of the table")
        for key in self.add_tombstones:
            if key in inline_tombs:
                raise FormatError(f"{where}: tombstone {key} is already part of the table")
        self._check_targets(state, since, where)
        if self.conflict_files or self.key_span is not None:
            self._check_dml(base, meta, since, where)
        file_objects, files_inline, removed = fold.next_files(
            meta, base, schema, inline, added, set(self.remove_files), where
        )
        delete_objects, tombs_inline = fold.next_deletes(
            meta, base, inline_tombs, self.add_tombstones, set(self.remove_tombstones), where
        )
        t = meta.totals(base)
        totals = Totals(
            files=t.files + len(added) - len(removed),
            rows=t.rows + sum(f.total_rows for f in added) - sum(f.total_rows for f in removed),
            bytes=t.bytes + sum(f.size_bytes for f in added) - sum(f.size_bytes for f in removed),
            tombstones=t.tombstones + len(self.add_tombstones) - len(self.remove_tombstones),
        )
        streams = base.streams
        if (query := self.summary.get("stream_query")) is not None:
            # A micro-batch's commit (stream_query/stream_batch in its summary):
            # the record every later version carries (FORMAT.md §3.2).
            batch = int(self.summary["stream_batch"])
            streams = {**streams, str(query): max(batch, streams.get(str(query), -1))}
        properties = base.properties
        if self.properties:
            merged = {**properties, **self.properties}
            properties = {k: v for k, v in merged.items() if v is not None}
        return base.evolve(
            cdc=self._next_cdc(base, meta, properties, schema, where),
            properties=properties,
            streams=streams,
            format_version=2,
            data_files=tuple(files_inline),
            tombstones=tuple(tombs_inline),
            file_objects=tuple(file_objects),
            delete_objects=tuple(delete_objects),
            totals=totals,
            change=ChangeLog(
                tuple(added),
                tuple(self.remove_files),
                self.add_tombstones,
                self.remove_tombstones,
                **self._change_data(base, since, root),
                markers=self._marker_bounds(),
            ),
            operation=self.operation,
            summary={**self.summary, **evolution.describe(base.schema, schema)},
            schema=schema,
        )

    def _next_cdc(
        self, base: Manifest, meta: TableMetadata, properties: dict[str, str], schema: Schema, where: str
    ) -> CdcState | None:
        """The next version's CDC state (FORMAT.md §3.7): the base's (a
        restore: the restored version's), pinned to this change's key and
        sequence, with its markers added (inline, or folded into an object),
        tiers merged and markers past the table's retention dropped (all of
        them in a compaction)."""
        state = self.cdc if self.restore_cdc else base.cdc
        if self.cdc_order is not None:
            key, seq = self.cdc_order
            if state is None:
                state = CdcState(key, seq)
            elif [c.lower() for c in state.key] != [c.lower() for c in key] or [c.lower() for c in state.sequence] != [
                c.lower() for c in seq
            ]:
                raise WriteError(
                    f"{where}: the table orders CDC changes by key ({', '.join(state.key)}) and sequence "
                    f"({', '.join(state.sequence)}); this batch names key ({', '.join(key)}) and sequence "
                    f"({', '.join(seq)}); nothing was committed"
                )
        if state is None or (not (state.markers or state.inline) and self.add_markers is None):
            return state
        st = meta.storage  # schema: the next version's (a batch's merge_schema may add its sequence)

        def write(table: Any, level: int | None) -> MetaRef:
            ref = markers.write_markers(st, table, level=level, key=state.key)
            meta.wrote_markers(ref, table)
            return ref

        objects, inline = markers.next_markers(
            state,
            None if self.add_markers is None else markers.conform(self.add_markers, state, schema, where),
            inline=markers.inlinable(state, schema),
            load=lambda r: markers.conform(meta.markers_table(r, where), state, schema, where),
            pending=markers.from_inline(state, schema, where),
            write=write,
            retention=delete_retention(properties),
            now=datetime.now(UTC),
            prune=self.operation == "COMPACT",
        )
        return replace(state, markers=objects, inline=inline)

    def _marker_bounds(self) -> Any:
        if self.add_markers is None:
            return None
        assert self.cdc_order is not None, "markers are written only to a CDC-ordered table"
        return markers.bounds(self.add_markers, self.cdc_order[0])

    def _change_data(self, base: Manifest, since: list[ChangeLog] | None, root: str) -> dict[str, Any]:
        """The change-data file and keys (ChangeLog fields), if the file still
        lists exactly the rows this version deletes: a tombstone committed
        since ``read_version`` that names one of its files may have deleted
        some of them first; a change whose conflict rules do not refuse that
        has none after such a rebase (audits then read its rows from the data
        files)."""
        cd = self.change_data
        if cd is None:
            return {}
        # _check_dml refused any tombstone committed since that names a target
        # (conflict_files): then the rows are still exactly the ones deleted.
        guarded = bool(self.tombstone_targets) and self.tombstone_targets <= self.conflict_files
        rebased = self.read_version != base.version and not guarded
        if rebased and (since is None or any(c.added_tombstones for c in since)):
            return {}
        entry = replace(cd.file, path=to_table_key(cd.file.path, root, what="change-data file"))
        return {"change_file" if cd.typed else "preimages": entry, "keys": cd.keys}

    def _changes_since(self, base: Manifest, meta: TableMetadata) -> list[ChangeLog] | None:
        """The change records of the versions after ``read_version`` up to
        ``base``; None when some of them has none (version 1) or is gone."""
        if self.read_version is None:
            return None
        out = []
        for v in range(self.read_version + 1, base.version + 1):
            try:
                m = base if v == base.version else meta.manifest_raw(v)
            except ObjectNotFound:
                return None
            if m.change is None:
                return None
            out.append(m.change)
        return out

    def _check_no_newer_tombstones(self, base: Manifest, state: Any, since: list[ChangeLog] | None, where: str) -> None:
        if self.read_tombstones is None and since is None:
            return
        if since is not None:
            newer = {t for c in since for t in c.added_tombstones}
        else:
            newer = set(state.tombstone_keys()) - (self.read_tombstones or frozenset())
        if newer:
            raise CommitConflict(
                f"{where}: {len(newer)} tombstone(s) were committed after version {self.read_version}, "
                "which this rewrite read"
            )

    def _check_targets(self, state: Any, since: list[ChangeLog] | None, where: str) -> None:
        if not self.tombstone_targets:
            return
        gone: Iterator[str]
        if since is not None:
            # The targets were in the version the writer read (it checked):
            # only a commit since then can have removed one.
            removed = {k for c in since for k in c.removed_files} | set(self.remove_files)
            gone = (k for k in sorted(self.tombstone_targets) if k in removed)
        else:
            gone = (k for k in sorted(self.tombstone_targets) if not state.contains(k) or k in self.remove_files)
        for key in gone:
            raise CommitConflict(
                f"{where}: a new tombstone names data file {key}, which is not in the table "
                "(removed by a concurrent commit, or never part of it)"
            )

    def _check_dml(self, base: Manifest, meta: TableMetadata, since: list[ChangeLog] | None, where: str) -> None:
        if self.read_version is None or self.read_version == base.version:
            return
        if since is None:
            # A version-1 manifest (or a collected one) in between: no change records to go by.
            raise DmlConflict(f"{where}: cannot tell what changed since version {self.read_version}")
        if self.conflict_files:
            names = {posixpath.basename(k) for k in self.conflict_files}
            for c in since:
                for key in c.added_tombstones:
                    for r in meta.tombstones(key):
                        if posixpath.basename(r.file) in names:
                            raise DmlConflict(
                                f"{where}: a concurrent commit deleted rows of data file {r.file}, "
                                f"which this {self.operation.lower()} read at version {self.read_version}"
                            )
        if self.key_span is not None:
            col, lo, hi = self.key_span
            for c in since:
                for f in c.added_files:
                    if col is None or _overlaps(f.min.get(col), f.max.get(col), lo, hi):
                        raise DmlConflict(
                            f"{where}: a concurrent commit added data file {f.path}, which may hold "
                            f"a key this {self.operation.lower()} inserts"
                        )
                mk = c.markers
                if mk is not None and (col is None or _overlaps(mk.min.get(col), mk.max.get(col), lo, hi)):
                    raise DmlConflict(
                        f"{where}: a concurrent commit deleted keys by a later CDC change, which may be "
                        f"keys this {self.operation.lower()} inserts"
                    )


def _overlaps(fmin: Any, fmax: Any, lo: Any, hi: Any) -> bool:
    """May a file with statistics [fmin, fmax] hold a key in [lo, hi]? Yes when unknown."""
    if fmin is None or fmax is None:
        return True
    try:
        return not (fmax < lo or hi < fmin)
    except TypeError:
        return True
