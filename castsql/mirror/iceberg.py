"""An Iceberg (format version 2) mirror of a CastSQL table, next to it, over
its own Parquet files.

``export_iceberg(log)`` writes ``_iceberg/metadata/v<N>.metadata.json`` for
every CastSQL version N not yet mirrored, up to the one asked for, and
``_iceberg/metadata/version-hint.text`` naming the newest (the layout of
Iceberg's Hadoop tables, which DuckDB's ``iceberg_scan`` and PyIceberg's
``StaticTable`` open). Snapshot id N is CastSQL version N (version 0, the
empty ``CREATE``, has no snapshot, as a new Iceberg table has none).

* Data files are the table's own: an Avro manifest per version lists the
  files it added (and those it removed, as ``DELETED``); a version that
  removes files rewrites only the manifests that listed them, and past 8
  manifests the smallest are merged. Columns are matched to
  the files by name (``schema.name-mapping.default``), as Iceberg does for
  files written without field ids.
* Deletes of every kind become **one delete file per data file** with
  deletes, holding all of its dropped positions, replaced (the old one
  removed) whenever they change: in format version 2 a position delete file
  (Parquet of ``file_path``, ``pos``) scoped to that file by its
  ``file_path`` bounds; with the table property
  ``castsql.mirror.iceberg.formatVersion`` at 3, Iceberg version 3
  **deletion vectors**, one Puffin blob per data file (FORMAT.md §10.2).

Manifests and manifest lists are encoded by
:mod:`castsql.mirror.iceberg_avro`; a process continuing a mirror it did not
write reads the last version back with PyIceberg (``pip install
castsql[iceberg]``). Every object goes through CastSQL's storage layer with a
create-only put, and the metadata file of a version is the last object
written for it.

Example::

    >>> import pyarrow as pa, tempfile, castsql
    >>> from castsql.format import TableLog
    >>> from castsql.storage import open_storage
    >>> root = tempfile.mkdtemp() + "/t"
    >>> _ = castsql.write_table(root, pa.table({"id": [1, 2, 3]}), primary_key="id")
    >>> _ = castsql.open(root).delete("id = 2")
    >>> export_iceberg(TableLog(open_storage(root))).written
    [0, 1, 2]
    >>> from pyiceberg.table import StaticTable
    >>> t = StaticTable.from_metadata(root + "/_iceberg/metadata/v2.metadata.json")
    >>> sorted(t.scan().to_arrow().column("id").to_pylist())
    [1, 3]
"""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.errors import MissingExtra, VersionNotFound
from castsql.format import Manifest, Schema, TableLog
from castsql.format.layout import manifest_key, to_table_key
from castsql.format.properties import iceberg_format_version
from castsql.mirror import iceberg_avro as avro
from castsql.mirror.background import before_export
from castsql.mirror.deletion_vectors import blob as vector_blob
from castsql.mirror.source import (
    Held,
    MirrorError,
    changed_files,
    digest,
    dropped,
    primitive_name,
    put_version,
    rows_before,
    same_deletes,
    still_stored,
)
from castsql.snapshot import ResolvedFile, Snapshot, resolve
from castsql.storage import ObjectNotFound, Storage
from castsql.storage.base import in_background, overlapped

META_DIR = "_iceberg/metadata"
HINT_KEY = f"{META_DIR}/version-hint.text"
# Data manifests past which the smallest are merged, and the most files a
# merged one lists (_merge_small). Every reader opens every listed manifest
# on every scan: Iceberg's default min-count-to-merge (100) would let a
# stream's one-file appends make readers open up to 100.
MANIFESTS_MERGED_AT = 8
MANIFEST_MERGE_ENTRIES = 10_000
# Live delete files (one per data file with deletes) up to which a version
# writes one delete manifest listing them all rather than rewriting the
# manifests that list the ones it replaces.
DELETES_IN_ONE_MANIFEST = 64
# Entries of a metadata file's metadata-log: Iceberg's own default
# (write.metadata.previous-versions-max).
METADATA_LOG_KEPT = 100
# Snapshots a metadata file lists: the newest versions'. Every version stays
# readable through its own metadata file; the newest one (what a catalog
# points at) names only these, so its size does not grow with the history.
SNAPSHOTS_LISTED = 100
_POS_FILE_PATH_ID, _POS_POS_ID = 2147483546, 2147483545  # Iceberg's reserved ids of a position delete file


def metadata_key(version: int) -> str:
    return f"{META_DIR}/v{version}.metadata.json"


@dataclass
class IcebergExport:
    """What one :func:`export_iceberg` call wrote."""

    table: str
    written: list[int] = field(default_factory=list)
    latest: int = -1
    delete_files: int = 0
    bytes_written: int = 0


# ---------------------------------------------------------------------- PyIceberg over CastSQL's storage


def _pyiceberg() -> Any:
    try:
        import pyiceberg.manifest as manifest
    except ImportError:
        raise MissingExtra("the Iceberg mirror", "iceberg", "pyiceberg") from None
    return manifest


class _Files:
    """The mirror's objects in the table's storage: written create-only, and
    read back by PyIceberg through :attr:`io` (a FileIO over the storage)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.written: list[int] = []  # sizes of the objects written
        self._pending: list[tuple[str, bytes]] = []
        self._io: Any = None

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` create-only by the next :meth:`flush`."""
        self._pending.append((key, data))
        self.written.append(len(data))

    def flush(self) -> None:
        """Write the objects :meth:`put` named, together: a version's
        manifests, delete file and manifest list depend on none of each
        other, only its metadata file (written after) on all of them; on an
        object store each is a round trip, on a disk each an fsync, and
        overlapped ones share a journal commit."""
        pending, self._pending = self._pending, []
        overlapped(lambda kv: self.storage.put_new(*kv), pending)

    def flushing(self) -> Callable[[], None]:
        """:meth:`flush` started on a thread of its own; call what it returns
        to wait for it (and raise what it raised). The version's metadata
        file is made meanwhile: a commit waits on the writes, not on both."""
        if not self._pending:
            return lambda: None
        return in_background(self.flush).result

    @property
    def io(self) -> Any:
        if self._io is None:
            self._io = _storage_io(self.storage)
        return self._io


def _storage_io(storage: Storage) -> Any:
    """A PyIceberg FileIO over ``storage`` that reads by key."""
    _pyiceberg()
    from pyiceberg.io import FileIO, InputFile, OutputFile

    st = storage

    class In(InputFile):
        def __len__(self) -> int:
            return len(self._data())

        def _data(self) -> bytes:
            if not hasattr(self, "_bytes"):
                self._bytes = st.get(to_table_key(self.location, st.root, what="Iceberg metadata"))
            return self._bytes

        def exists(self) -> bool:
            return st.exists(to_table_key(self.location, st.root, what="Iceberg metadata"))

        def open(self, seekable: bool = True) -> Any:
            return io.BytesIO(self._data())

    class StorageIO(FileIO):
        def new_input(self, location: str) -> InputFile:
            return In(location)

        def new_output(self, location: str) -> OutputFile:
            raise NotImplementedError("the mirror writes through its own writers (castsql.mirror.iceberg_avro)")

        def delete(self, location: Any) -> None:
            raise NotImplementedError("the mirror never deletes")

    return StorageIO()


# ---------------------------------------------------------------------- schema


def _iceberg_type(t: pa.DataType, where: str) -> str:
    simple = primitive_name(t, "iceberg")
    if simple is not None:
        return simple
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"decimal({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t) and t.unit == "us":
        return "timestamptz" if t.tz is not None else "timestamp"
    raise MirrorError(f"{where}: type {t} has no Iceberg equivalent the mirror writes (nested types come later)")


# ---------------------------------------------------------------------- state


@dataclass
class _State:
    version: int = -1
    field_ids: dict[str, int] = field(default_factory=dict)
    schemas: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, avro.Entry] = field(default_factory=dict)  # table key -> its live entry (EXISTING form)
    data_manifests: list[avro.ManifestFile] = field(default_factory=list)
    members: dict[str, list[str]] = field(default_factory=dict)  # data manifest -> table keys of its live files
    delete_manifests: list[avro.ManifestFile] = field(default_factory=list)
    metadata_log: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = 2
    next_row_id: int = 0  # version 3: the next snapshot's first-row-id
    # Data file key -> its live delete file (version 2, a position delete
    # file of that one file) or deletion vector (version 3).
    vectors: dict[str, avro.Entry] = field(default_factory=dict)
    vector_members: dict[str, list[str]] = field(default_factory=dict)  # delete manifest -> data keys of its entries
    # Read back from a mirror whose delete files are not one per data file
    # (written before they were): the next version writes every file's anew.
    rewrite_deletes: bool = False
    table_uuid: str = ""
    digest: str = ""  # of the metadata file of ``version`` as this process wrote it


_HELD: Held[_State] = Held()


def mirrored_versions(storage: Storage) -> list[int]:
    out = []
    for info in storage.list(META_DIR + "/"):
        name = info.key.rsplit("/", 1)[-1]
        if name.startswith("v") and name.endswith(".metadata.json") and name[1:-14].isdigit():
            out.append(int(name[1:-14]))
    return sorted(out)


def _read_avro(files: _Files, path: str, schema: Any, types: dict[int, Any]) -> list[Any]:
    """The records of an Avro file read with PyIceberg's reader in ``schema``
    (its version 3 schemas: PyIceberg's own readers read as version 2, which
    drops a deletion vector's place and the row ids)."""
    from pyiceberg.avro.file import AvroFile

    with AvroFile[Any](files.io.new_input(path), schema, read_types=types) as reader:
        return list(reader)


def _read_state(storage: Storage, version: int, files: _Files) -> _State:
    """The state of mirrored ``version``, read back from its metadata and manifests."""
    manifest = _pyiceberg()
    meta = json.loads(storage.get(metadata_key(version)))
    st = _State(version=version, table_uuid=meta["table-uuid"], schemas=meta["schemas"],
                snapshots=meta.get("snapshots", []), metadata_log=meta.get("metadata-log", []),
                format_version=meta["format-version"], next_row_id=meta.get("next-row-id", 0))  # fmt: skip
    st.field_ids = {f["name"]: f["id"] for s in meta["schemas"] for f in s["fields"]}
    current = meta.get("current-snapshot-id")
    if current is None or current < 0:
        return st
    list_schema = manifest.MANIFEST_LIST_FILE_SCHEMAS[3]
    at = {f.name: i for i, f in enumerate(manifest.DATA_FILE_TYPE[3].fields)}
    first_row_id_at = [f.name for f in list_schema.fields].index("first_row_id")
    snap = next(s for s in st.snapshots if s["snapshot-id"] == current)
    for mf in _read_avro(files, snap["manifest-list"], list_schema, {-1: manifest.ManifestFile}):
        ours = avro.ManifestFile(
            mf.manifest_path, mf.manifest_length, int(mf.content), mf.added_snapshot_id,
            mf.added_files_count, mf.existing_files_count, mf.deleted_files_count,
            mf.added_rows_count, mf.existing_rows_count, mf.deleted_rows_count,
            mf.min_sequence_number, mf.sequence_number, mf[first_row_id_at],
        )  # fmt: skip
        deletes = int(mf.content) == avro.CONTENT_DELETES
        if deletes:
            st.delete_manifests.append(ours)
        else:
            st.data_manifests.append(ours)
        keys = (st.vector_members if deletes else st.members)[ours.path] = []
        types = {-1: manifest.ManifestEntry, 2: manifest.DataFile}
        row_id = ours.first_row_id
        for e in _read_avro(files, mf.manifest_path, manifest.MANIFEST_ENTRY_SCHEMAS[3], types):
            if e.status == manifest.ManifestEntryStatus.DELETED:
                continue
            e = manifest._inherit_from_manifest(e, mf)
            df = e.data_file
            first_row_id = df[at["first_row_id"]]
            if first_row_id is None and row_id is not None and not deletes:
                first_row_id = row_id  # inherited: the manifest's, plus the rows of the files before it
                row_id += df.record_count
            entry = avro.Entry(avro.EXISTING, e.snapshot_id, e.sequence_number, e.file_sequence_number,
                               int(df.content), df.file_path, df.record_count, df.file_size_in_bytes,
                               first_row_id, df[at["referenced_data_file"]], df[at["content_offset"]],
                               df[at["content_size_in_bytes"]])  # fmt: skip
            if deletes:
                referenced = entry.referenced or _scoped_to(df.lower_bounds, df.upper_bounds)
                if referenced is None and st.format_version < 3:
                    st.rewrite_deletes = True  # a delete file of several data files: the older layout
                    continue
                if referenced is None:
                    raise MirrorError(f"{mf.manifest_path}: a deletion vector names no data file")
                entry = dataclasses.replace(entry, referenced=referenced)
                key = to_table_key(referenced, storage.root, what="data file")
                st.vectors[key] = entry.existing()
            else:
                key = to_table_key(df.file_path, storage.root, what="data file")
                st.data[key] = entry.existing()
            keys.append(key)
    return st


def _scoped_to(lower: dict[int, bytes] | None, upper: dict[int, bytes] | None) -> str | None:
    """The one data file a version 2 position delete file holds positions of:
    its ``file_path`` column's bounds, equal (Iceberg's file-scoped delete
    files); None when it may hold several."""
    lo, hi = (lower or {}).get(_POS_FILE_PATH_ID), (upper or {}).get(_POS_FILE_PATH_ID)
    return lo.decode() if lo is not None and lo == hi else None


def _load(storage: Storage, version: int, files: _Files) -> _State:
    """:func:`_read_state`, or MirrorError naming a metadata file it cannot follow."""
    try:
        return _read_state(storage, version, files)
    except (KeyError, ValueError, TypeError, StopIteration) as e:
        raise MirrorError(
            f"{storage.uri(metadata_key(version))}: not Iceberg metadata this mirror can continue from "
            f"({type(e).__name__}: {e}); delete {META_DIR}/ to write the mirror again"
        ) from None


# ---------------------------------------------------------------------- writing one version


def _schema_json(schema: Schema, state: _State, where: str, primary_key: str | None) -> dict[str, Any]:
    """The Iceberg schema; the primary key is its identifier field (required:
    CastSQL's writers keep it non-NULL), except a floating-point one, which
    Iceberg does not allow as an identifier."""
    fields = []
    ident: list[int] = []
    for f in schema.to_arrow():
        if f.name not in state.field_ids:
            state.field_ids[f.name] = max(state.field_ids.values(), default=0) + 1
        key = f.name == primary_key and not pa.types.is_floating(f.type)
        if key:
            ident.append(state.field_ids[f.name])
        fields.append({"id": state.field_ids[f.name], "name": f.name, "required": key,
                       "type": _iceberg_type(f.type, f"{where}: column {f.name}")})  # fmt: skip
    return {"type": "struct", "fields": fields, **({"identifier-field-ids": ident} if ident else {})}


def _position_deletes(uri: str, rows: BitMap) -> bytes:
    """A position delete file of one data file (at ``uri``): its dropped ``rows``."""
    positions = pa.array(np.frombuffer(rows.to_array(), dtype=np.uint32).astype(np.int64), pa.int64())
    # The one path as a dictionary, written as Parquet's dictionary-encoded
    # string (no Arrow schema stored, so every reader reads a string): not
    # thousands of copies of it made and hashed again.
    paths = pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(positions), np.int32)), pa.array([uri]))
    schema = pa.schema(
        [
            pa.field("file_path", paths.type, False, {b"PARQUET:field_id": str(_POS_FILE_PATH_ID).encode()}),
            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(_POS_POS_ID).encode()}),
        ]
    )
    buf = io.BytesIO()
    # The file is written again whenever its data file's deletes change, so
    # it is kept small: sorted positions delta-encoded take ~1/8 of plain
    # int64 (14 KB, not 109 KB, for 18,000 positions) and write in half the time.
    pq.write_table(pa.table([paths, positions], schema=schema), buf, compression="zstd", store_schema=False,
                   use_dictionary=["file_path"], column_encoding={"pos": "DELTA_BINARY_PACKED"})  # fmt: skip
    return buf.getvalue()


def _write_version(
    log: TableLog, m: Manifest, snap: Snapshot, prev: Snapshot | None, state: _State, files: _Files, upgrade: bool
) -> int:
    """Write mirror version ``m.version``; returns the delete files written."""
    storage = log.storage
    where = f"{storage.root}: Iceberg mirror of version {m.version}"
    v = m.version
    schema = _schema_json(snap.schema, state, where, snap.primary_key)
    if not state.schemas or state.schemas[-1]["fields"] != schema["fields"]:
        state.schemas.append({**schema, "schema-id": len(state.schemas)})
    schema_id = len(state.schemas) - 1
    table_schema = json.dumps({"type": "struct", **state.schemas[-1]}, separators=(",", ":")).encode()
    tag = uuid.uuid4().hex
    written = 0

    def added_entry(f: ResolvedFile) -> avro.Entry:
        return avro.Entry(avro.ADDED, v, None, None, avro.DATA, storage.uri(f.key), f.total_rows, f.entry.size_bytes)

    def put_manifest(name: str, entries: list[avro.Entry], deletes: bool = False) -> avro.ManifestFile:
        key = f"{META_DIR}/{tag}-{name}.avro"
        body = avro.manifest(table_schema, "deletes" if deletes else "data", entries, state.format_version)
        files.put(key, body)
        content = avro.CONTENT_DELETES if deletes else avro.CONTENT_DATA
        return avro.manifest_file_of(storage.uri(key), len(body), content, v, entries)

    now, before, gone = changed_files(snap, prev, state.data.keys())
    added = [k for k in sorted(now) if k not in state.data]
    change = _Change(storage, snap, prev, now, before, gone, set(added))
    members = state.members
    # A manifest whose every file went (its DELETED entries told the version
    # that removed them) leaves the list.
    state.data_manifests = _listing(state.data_manifests, members)
    if gone:
        # Only the manifests that list a removed file are rewritten, with their
        # other files as EXISTING; the removals (DELETED) and the additions go
        # into one new manifest. A compaction of a few files of a large table
        # costs those files, not the table.
        kept = _without(state.data_manifests, members, state.data, gone, lambda i, e: put_manifest(f"r{i}", e))
        removals = [dataclasses.replace(state.data[k], status=avro.DELETED, snapshot_id=v) for k in sorted(gone)]
        first = put_manifest("m0", removals + [added_entry(now[k]) for k in added])
        members[first.path] = list(added)
        state.data_manifests = [*kept, first]
        for k in gone:
            del state.data[k]
    elif added:
        first = put_manifest("m0", [added_entry(now[k]) for k in added])
        members[first.path] = list(added)
        state.data_manifests.append(first)
    for k in added:
        state.data[k] = added_entry(now[k]).existing()
    _merge_small(state.data_manifests, members, state.data, put_manifest)

    # Rows a restore brings back (or a file it brings back) cannot be un-deleted
    # by adding delete files, and readers differ on older ones (DuckDB applies a
    # delete file whatever its sequence number; PyIceberg applies every blob of
    # a listed Puffin file): the version writes every dropped row anew.
    reset = upgrade or m.operation == "RESTORE" or state.rewrite_deletes
    state.rewrite_deletes = False
    written += _write_deletes(change, state, files, put_manifest, tag, v, reset)

    parent = state.snapshots[-1]["snapshot-id"] if state.snapshots else None
    list_key = f"{META_DIR}/snap-{v}-{tag}.avro"
    first_row_id = state.next_row_id
    if state.format_version >= 3:
        _assign_row_ids(state)
    files.put(list_key, avro.manifest_list(v, parent, v, [*state.data_manifests, *state.delete_manifests],
                                           state.format_version, first_row_id))  # fmt: skip
    ms = int(m.created_at.timestamp() * 1000)
    state.snapshots.append({
        "snapshot-id": v, "parent-snapshot-id": parent, "sequence-number": v, "timestamp-ms": ms,
        "manifest-list": storage.uri(list_key), "schema-id": schema_id,
        "summary": {"operation": "overwrite", "castsql-operation": m.operation, "castsql-version": str(v),
                    "castsql-commit-id": m.commit_id or ""},
        **({"first-row-id": first_row_id, "added-rows": state.next_row_id - first_row_id}
           if state.format_version >= 3 else {}),
    })  # fmt: skip
    del state.snapshots[:-SNAPSHOTS_LISTED]
    return written


@dataclass(frozen=True)
class _Change:
    """What a mirror version is written from: the version, the one before it
    (None for the first), the files whose rows may differ as each has them
    (:func:`changed_files`), the mirrored files it no longer has, and the
    files new to the mirror."""

    storage: Storage
    snap: Snapshot
    prev: Snapshot | None
    now: dict[str, ResolvedFile]
    before: dict[str, ResolvedFile]
    gone: set[str]
    is_added: set[str]

    def deletes(self, mirrored: Callable[[str], bool]) -> Iterator[tuple[str, BitMap, BitMap]]:
        """For each changed file whose deletes may differ from the previous
        version's (or whose deletes the mirror does not hold yet: ``mirrored``
        false): its key, every position the version drops of it, and every
        position the previous version dropped (none for a file new to the mirror)."""
        for k, f in self.now.items():
            old = None if k in self.is_added else self.before.get(k)
            if old is not None and same_deletes(old, f) and mirrored(k):
                continue
            rows = dropped(self.storage, self.snap, f) if f.has_deletes else BitMap()
            yield k, rows, rows_before(self.storage, self.prev, old)

    def every_dropped(self) -> dict[str, BitMap]:
        """Every position the version drops, by file: what a reset writes."""
        return {f.key: r for f in self.snap.files if f.has_deletes and (r := dropped(self.storage, self.snap, f))}


def _write_deletes(
    change: _Change,
    state: _State,
    files: _Files,
    put_manifest: Callable[..., avro.ManifestFile],
    tag: str,
    v: int,
    reset: bool,
) -> int:
    """One delete file per data file with deletes, holding all of its dropped
    positions: in version 2 a position delete file scoped to that file (its
    ``file_path`` bounds name it), in version 3 a deletion vector (Iceberg
    keeps at most one per file). A file whose deletes changed gets a new one
    and its old one is removed, as is that of a file the version removed;
    only the delete manifests that list a replaced one are rewritten. Readers
    then open one delete file per data file, not one per version, and polars
    reads them natively (it falls back to PyIceberg for a delete file of
    several data files). With ``reset`` (the first version 3 snapshot of a
    version 2 mirror, a restore, a mirror of the older layout) or, in
    version 3, when a file's dropped rows shrink, every file's is written
    anew and no earlier delete manifest is listed: a removed vector whose
    Puffin file still holds a live one is applied again by PyIceberg, which
    reads every blob of a listed Puffin file, so rows could not come back
    otherwise. Returns the delete files written."""
    state.delete_manifests = _listing(state.delete_manifests, state.vector_members)
    vectors: dict[str, BitMap] = {}
    v3 = state.format_version >= 3
    for k, rows, was in () if reset else change.deletes(lambda k: k in state.vectors):
        if v3 and not was.issubset(rows):
            reset = True
            break
        if rows or k in state.vectors:
            vectors[k] = rows
    if reset:
        state.delete_manifests, state.vectors, state.vector_members = [], {}, {}
        vectors = change.every_dropped()
    replaced = {k for k in (*vectors, *change.gone) if k in state.vectors}
    if not vectors and not replaced:
        return 0
    live = sorted(k for k, rows in vectors.items() if rows)
    carried: list[str] = []
    if len(state.vectors) - len(replaced) + len(live) <= DELETES_IN_ONE_MANIFEST:
        # Few delete files in all: the version's one delete manifest lists
        # them all, so no other is rewritten (a version's objects are
        # written, durably, before its metadata file: fewer, sooner).
        carried = sorted(state.vectors.keys() - replaced)
        kept, state.vector_members = [], {}
    else:
        kept = _without(state.delete_manifests, state.vector_members, state.vectors, replaced,
                        lambda i, e: put_manifest(f"dr{i}", e, deletes=True))  # fmt: skip
    removals = [dataclasses.replace(state.vectors.pop(k), status=avro.DELETED, snapshot_id=v) for k in sorted(replaced)]
    added = (_vector_entries if v3 else _delete_file_entries)(change.storage, vectors, live, files, tag, v)
    state.delete_manifests = kept
    if removals or added or carried:
        mf = put_manifest("d0", removals + [state.vectors[k] for k in carried] + added, deletes=True)
        state.vector_members[mf.path] = carried + live
        state.delete_manifests.append(mf)
    for k, e in zip(live, added, strict=True):
        state.vectors[k] = e.existing()
    _merge_small(state.delete_manifests, state.vector_members, state.vectors,
                 lambda name, e: put_manifest("d" + name, e, deletes=True))  # fmt: skip
    return len(live)


def _vector_entries(
    storage: Storage, vectors: dict[str, BitMap], live: list[str], files: _Files, tag: str, v: int
) -> list[avro.Entry]:
    """Version 3: the deletion vector of each of ``live``'s files, each in a
    Puffin file of its own: DuckDB 1.5.5's ``iceberg_scan`` applied the first
    vector of a Puffin file holding several (a 200,000-row file's) to every
    data file whose vector it held."""
    out = []
    for i, k in enumerate(live):
        key = f"{META_DIR}/{tag}-{i}-deletes.puffin"
        u = storage.uri(k)
        body, [(offset, length)] = avro.puffin([(vector_blob(vectors[k]), u, len(vectors[k]))])
        files.put(key, body)
        out.append(avro.Entry(avro.ADDED, v, None, None, avro.POSITION_DELETES, storage.uri(key), len(vectors[k]),
                              len(body), referenced=u, content_offset=offset, content_size=length))  # fmt: skip
    return out


def _delete_file_entries(
    storage: Storage, vectors: dict[str, BitMap], live: list[str], files: _Files, tag: str, v: int
) -> list[avro.Entry]:
    """Version 2: a position delete file of each of ``live``'s files."""
    out = []
    for i, k in enumerate(live):
        key = f"{META_DIR}/{tag}-{i}-deletes.parquet"
        uri = storage.uri(k)
        body = _position_deletes(uri, vectors[k])
        files.put(key, body)
        out.append(avro.Entry(avro.ADDED, v, None, None, avro.POSITION_DELETES, storage.uri(key), len(vectors[k]),
                              len(body), referenced=uri))  # fmt: skip
    return out


def _listing(manifests: list[avro.ManifestFile], members: dict[str, list[str]]) -> list[avro.ManifestFile]:
    """``manifests`` without those left with no live entry (their DELETED
    entries told the version that removed them), and ``members`` without
    their keys: what a process reading the list back holds."""
    kept = []
    for mf in manifests:
        if members.get(mf.path):
            kept.append(mf)
        else:
            members.pop(mf.path, None)
    return kept


def _without(
    manifests: list[avro.ManifestFile],
    members: dict[str, list[str]],
    live: dict[str, avro.Entry],
    gone: Collection[str],
    rewrite: Callable[[int, list[avro.Entry]], avro.ManifestFile],
) -> list[avro.ManifestFile]:
    """``manifests`` without the entries of ``gone``: only those that list one
    are rewritten, their other entries carried on as EXISTING."""
    kept = []
    for i, mf in enumerate(manifests):
        keys = members[mf.path]
        if not any(k in gone for k in keys):
            kept.append(mf)
            continue
        survivors = [k for k in keys if k not in gone]
        del members[mf.path]
        if survivors:
            rewritten = rewrite(i, [live[k] for k in survivors])
            members[rewritten.path] = survivors
            kept.append(rewritten)
    return kept


def _assign_row_ids(state: _State) -> None:
    """Version 3 row lineage: each data manifest new to the list gets the
    next range of row ids, and each of its files without one the id its
    position inherits (the manifest's plus the rows of the files before it),
    which the file keeps, written out, when a later manifest carries it."""
    for mf in state.data_manifests:
        if mf.first_row_id is not None:
            continue
        mf.first_row_id = state.next_row_id
        at = state.next_row_id
        for k in state.members[mf.path]:
            e = state.data[k]
            if e.first_row_id is None:
                state.data[k] = dataclasses.replace(e, first_row_id=at)
                at += e.record_count
        state.next_row_id += mf.added_rows + mf.existing_rows


def _metadata(log: TableLog, m: Manifest, state: _State) -> dict[str, Any]:
    storage = log.storage
    mapping = [{"field-id": i, "names": [n]} for n, i in sorted(state.field_ids.items(), key=lambda kv: kv[1])]
    current = state.snapshots[-1]["snapshot-id"] if state.snapshots else None
    meta: dict[str, Any] = {
        "format-version": state.format_version,
        "table-uuid": state.table_uuid,
        "location": storage.root,
        "last-sequence-number": m.version,
        "last-updated-ms": int(m.created_at.timestamp() * 1000),
        "last-column-id": max(state.field_ids.values(), default=0),
        "schemas": state.schemas,
        "current-schema-id": len(state.schemas) - 1,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "default-spec-id": 0,
        "last-partition-id": 999,
        "properties": {
            "schema.name-mapping.default": json.dumps(mapping, separators=(",", ":")),
            "castsql.version": str(m.version),
            **({"castsql.primary-key": m.primary_key} if m.primary_key else {}),
        },
        "snapshots": state.snapshots,
        "snapshot-log": [{"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]} for s in state.snapshots],
        "metadata-log": state.metadata_log,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "default-sort-order-id": 0,
        "refs": {"main": {"snapshot-id": current, "type": "branch"}} if current is not None else {},
    }
    if current is not None:
        meta["current-snapshot-id"] = current
    if state.format_version >= 3:
        meta["next-row-id"] = state.next_row_id
    return meta


def export_iceberg(log: TableLog, version: int | None = None) -> IcebergExport:
    """Mirror the table's versions as Iceberg metadata, up to ``version``
    (default: the latest), writing only the versions not mirrored yet.

    Refused with MirrorError for a type the mirror cannot write, with
    VersionNotFound when a version to mirror was garbage-collected, and with
    CommitConflict when another exporter wrote the same version first (run
    it again). A version's metadata file is written last and create-only:
    until it exists, nothing of that version is visible to any reader.
    """
    before_export(log.storage.root)
    storage = log.storage
    target = log.latest().version if version is None else log.manifest(version).version
    held = _HELD.take(storage.root)
    if held is not None and still_stored(storage, metadata_key, held.version, held.digest):
        done = [held.version]  # its versions were checked when it was read or written
    else:
        held, done = None, mirrored_versions(storage)
        if done and done != list(range(done[0], done[-1] + 1)):
            raise MirrorError(f"{storage.root}: {META_DIR} has gaps in its versions")
    out = IcebergExport(storage.root, latest=done[-1] if done else -1)
    if done and done[-1] >= target:
        if held is not None:
            _HELD.put(storage.root, held)
        return out
    if not done and log.earliest_version() != 0:
        raise VersionNotFound(
            f"{storage.root}: version 0 was garbage-collected; the Iceberg mirror starts at version 0"
        )
    files = _Files(storage)
    if done:
        state = held if held is not None else _load(storage, done[-1], files)
    else:
        first = log.manifest(0)  # the mirror's first version: the table's id
        state = _State(table_uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"castsql:{first.commit_id or storage.root}")))
    prev = resolve(log, state.version) if state.version >= 0 else None
    state_from = state.version
    for v in range(state.version + 1, target + 1):
        m = log.manifest(v)
        snap = resolve(log, v)
        # A mirror's format version only goes up, from the version whose
        # properties ask for more (Iceberg tables upgrade, never downgrade).
        wanted = max(state.format_version, iceberg_format_version(m.properties))
        upgrade = wanted > state.format_version and bool(state.data_manifests or state.delete_manifests)
        state.format_version = wanted
        if upgrade:
            for mf in state.data_manifests:
                mf.encoded = None  # its list entry gains a first_row_id
        if v == 0:
            where = f"{storage.root}: Iceberg mirror of version 0"
            state.schemas.append({**_schema_json(snap.schema, state, where, snap.primary_key), "schema-id": 0})
        else:
            out.delete_files += _write_version(log, m, snap, prev, state, files, upgrade)
        written = files.flushing()
        if (
            v == state_from + 1
            and state.snapshots
            and not storage.exists(manifest_key(state.snapshots[0]["snapshot-id"]))
        ):
            # gc collected the oldest version listed (one request to ask, per export): no
            # metadata file lists a snapshot whose files may be gone.
            _expire(state, log.earliest_version())
        body = json.dumps(_metadata(log, m, state), separators=(",", ":")).encode()
        written()  # every object the metadata file names is stored before it
        put_version(storage, metadata_key(v), body, "Iceberg", v)
        state.digest = digest(body)
        state.metadata_log.append(
            {"metadata-file": storage.uri(metadata_key(v)), "timestamp-ms": int(m.created_at.timestamp() * 1000)}
        )
        del state.metadata_log[:-METADATA_LOG_KEPT]
        state.version = v
        out.bytes_written += len(body)
        out.written.append(v)
        out.latest = v
        prev = snap
    out.bytes_written += sum(files.written)
    # A hint, like Iceberg's Hadoop tables': readers may list instead, so it
    # costs the commit no durable round of its own (FORMAT.md §10).
    storage.put_hint(HINT_KEY, str(out.latest).encode())
    _HELD.put(storage.root, state)
    return out


def _merge_small(
    manifests: list[avro.ManifestFile],
    members: dict[str, list[str]],
    live: dict[str, avro.Entry],
    put_manifest: Callable[[str, list[avro.Entry]], avro.ManifestFile],
) -> None:
    """Past ``MANIFESTS_MERGED_AT`` data manifests, the smallest are merged
    into one of up to ``MANIFEST_MERGE_ENTRIES`` files, as Iceberg's writers
    merge manifests (``commit.manifest-merge.enabled``): a stream's one-file
    appends would otherwise make every reader open one manifest per append."""
    if len(manifests) <= MANIFESTS_MERGED_AT:
        return
    by_size = sorted(manifests, key=lambda mf: len(members[mf.path]))
    take: list[Any] = []
    count = 0
    for mf in by_size:
        n = len(members[mf.path])
        if count + n > MANIFEST_MERGE_ENTRIES and len(take) >= 2:
            break
        take.append(mf)
        count += n
    if len(take) < 2:
        return
    keys = [k for mf in take for k in members[mf.path]]
    merged = put_manifest("merged", [live[k] for k in keys])
    gone = {mf.path for mf in take}
    for path in gone:
        del members[path]
    members[merged.path] = keys
    manifests[:] = [mf for mf in manifests if mf.path not in gone] + [merged]


def _expire(state: _State, earliest: int) -> None:
    """Drop the snapshots of versions the table no longer keeps (its ``gc``
    collected them): a metadata file lists every snapshot, so without this
    each mirror version would cost the table's whole history. Their
    manifest lists stay where they are; the mirror never deletes."""
    state.snapshots = [s for s in state.snapshots if s["snapshot-id"] >= earliest]


def read_metadata(storage: Storage, version: int) -> dict[str, Any]:
    try:
        return json.loads(storage.get(metadata_key(version)))
    except ObjectNotFound:
        raise VersionNotFound(f"{storage.root}: Iceberg version {version} is not mirrored") from None
