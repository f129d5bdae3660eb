"""A Delta log of a CastSQL table, next to it, over its own Parquet files.

``export_delta(log)`` writes ``_delta_log/<version>.json`` for every CastSQL
version not yet mirrored, up to the one asked for: Delta version N is CastSQL
version N, so time travel in another engine names the same versions. No data
file is copied or rewritten: each ``add`` names the table's own file
(``data/...``, relative to the table root), and the rows CastSQL's tombstones
drop (row positions, whole row groups, key ranges) become that file's
deletion vector (:mod:`castsql.mirror.deletion_vectors`), written to
``_delta_dv/`` once per mirrored version. A file whose deletes change is
removed and added again with its new vector, as Delta writers do.

The mirror is never a second source of truth: CastSQL's pointer stays the
commit point, and a mirror version is written only from a committed CastSQL
version. Each commit file is a create-only put, so two exporters racing on
one version cannot both write it (the loser is told to run again).

Example::

    >>> import pyarrow as pa, tempfile, castsql
    >>> root = tempfile.mkdtemp() + "/t"
    >>> _ = castsql.write_table(root, pa.table({"id": [1, 2, 3]}), primary_key="id")
    >>> castsql.open(root).delete("id = 2").version
    2
    >>> from castsql.format import TableLog
    >>> from castsql.storage import open_storage
    >>> export_delta(TableLog(open_storage(root))).written
    [0, 1, 2]
    >>> import deltalake                                      # doctest: +SKIP
    >>> deltalake.DeltaTable(root).to_pyarrow_table().column("id").to_pylist()   # doctest: +SKIP
    [1, 3]
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
from pyroaring import BitMap

from castsql.errors import VersionNotFound
from castsql.format import Manifest, Schema, TableLog
from castsql.mirror import checkpoint as checkpoints
from castsql.mirror.background import before_export
from castsql.mirror.deletion_vectors import VectorFile
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
from castsql.storage import ObjectNotFound, PreconditionFailed, Storage

_log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
DV_DIR = "_delta_dv"


@dataclass
class DeltaExport:
    """What one :func:`export_delta` call wrote."""

    table: str
    written: list[int] = field(default_factory=list)  # versions mirrored by this call
    latest: int = -1  # the newest mirrored version after it
    vectors: int = 0  # deletion vectors written
    bytes_written: int = 0


def commit_key(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


def mirrored_versions(storage: Storage) -> list[int]:
    """The versions whose Delta commit file exists, ascending."""
    out = []
    for info in storage.list(LOG_DIR + "/"):
        name = info.key.rsplit("/", 1)[-1]
        if name.endswith(".json") and len(name) == 25 and name[:20].isdigit():
            out.append(int(name[:20]))
    return sorted(out)


# ---------------------------------------------------------------------- schema


def delta_type(t: pa.DataType, where: str) -> Any:
    """The Delta schema type of an Arrow type (PROTOCOL.md, "Schema Serialization Format")."""
    simple = primitive_name(t, "delta")
    if simple is not None:
        return simple
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise MirrorError(f"{where}: {t} is wider than Delta's decimal(38)")
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            raise MirrorError(f"{where}: nanosecond timestamps have no Delta type (Delta stores microseconds)")
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "elementType": delta_type(t.value_type, where), "containsNull": True}
    if pa.types.is_struct(t):
        return {"type": "struct", "fields": [_field(t.field(i), where) for i in range(t.num_fields)]}
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": delta_type(t.key_type, where),
            "valueType": delta_type(t.item_type, where),
            "valueContainsNull": True,
        }
    raise MirrorError(f"{where}: type {t} has no Delta equivalent")


def _field(f: pa.Field, where: str) -> dict[str, Any]:
    return {"name": f.name, "type": delta_type(f.type, f"{where}: column {f.name}"), "nullable": True, "metadata": {}}


def schema_string(schema: Schema, where: str) -> str:
    arrow = schema.to_arrow()
    return json.dumps({"type": "struct", "fields": [_field(f, where) for f in arrow]}, separators=(",", ":"))


def _needs_ntz(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _needs_ntz(t.value_type)
    if pa.types.is_struct(t):
        return any(_needs_ntz(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _needs_ntz(t.key_type) or _needs_ntz(t.item_type)
    return False


def protocol(schema: Schema) -> dict[str, Any]:
    features = ["deletionVectors"]
    if any(_needs_ntz(f.type) for f in schema.to_arrow()):
        features.append("timestampNtz")
    return {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features, "writerFeatures": features}


def _table_id(log: TableLog, first: Manifest) -> str:
    # Stable for the table: the same id whoever mirrors it, from the first kept version's commit.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"castsql:{first.commit_id or log.storage.root}"))


def _ms(m: Manifest) -> int:
    return int(m.created_at.timestamp() * 1000)


# ---------------------------------------------------------------------- actions


def _add(f: ResolvedFile, m: Manifest, dv: dict[str, Any] | None) -> dict[str, Any]:
    add: dict[str, Any] = {
        "path": quote(f.key, safe="/"),
        "partitionValues": {},
        "size": f.entry.size_bytes,
        "modificationTime": _ms(m),
        "dataChange": True,
        "stats": json.dumps({"numRecords": f.total_rows}, separators=(",", ":")),
    }
    if dv is not None:
        add["deletionVector"] = dv
    return add


def _remove(add: dict[str, Any], m: Manifest) -> dict[str, Any]:
    rm = {
        "path": add["path"],
        "deletionTimestamp": _ms(m),
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": add["size"],
    }
    if "deletionVector" in add:
        rm["deletionVector"] = add["deletionVector"]
    return rm


@dataclass
class _State:
    """The mirror at one version: each live file's ``add`` action, by table key; the schema and protocol."""

    version: int
    adds: dict[str, dict[str, Any]]
    schema: str | None
    protocol: dict[str, Any] | None
    digest: str = ""  # of the commit file of ``version``
    meta: dict[str, Any] | None = None  # the last metaData action: its id and creation time carry on
    checkpoint: int = 0  # the version of the last checkpoint (0: none)
    since: int = 0  # bytes of the commit files after it


_HELD: Held[_State] = Held()


def _known_versions(storage: Storage) -> tuple[list[int], bool]:
    """The mirrored versions, and whether the state this process holds is
    still what is stored. With a held state that is, two requests (its last
    commit file, and the next one's absence) instead of listing the log."""
    held = _HELD.peek(storage.root)
    if held is not None and still_stored(storage, commit_key, held.version, held.digest):
        return list(range(held.version + 1)), True
    return mirrored_versions(storage), False


def _replay(storage: Storage, versions: list[int], verified: bool = False) -> _State:
    """The mirror's state after its last commit: the one this process holds,
    brought forward over commit files written since, or rebuilt from them all."""
    held = _HELD.take(storage.root)
    start, adds, schema, proto, meta = -1, {}, None, None, None
    last, since = 0, 0
    # Held, and its last commit file is still the one it wrote (a mirror
    # deleted and written again by someone else has other vectors).
    if (
        held is not None
        and held.version in versions
        and (verified or digest(storage.get(commit_key(held.version))) == held.digest)
    ):
        start, adds, schema, proto, meta = held.version, held.adds, held.schema, held.protocol, held.meta
        last, since = held.checkpoint, held.since
        versions = [v for v in versions if v > start]
    else:
        last = _last_checkpoint(storage)
    for v in versions:
        key = commit_key(v)
        body = storage.get(key)
        if v > last:
            since += len(body)
        for line in body.decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except ValueError as e:
                raise MirrorError(
                    f"{storage.uri(key)}: not a Delta commit this mirror can continue from ({e}); "
                    f"delete {LOG_DIR}/ and {DV_DIR}/ to write the mirror again"
                ) from None
            if "add" in action:
                adds[unquote(action["add"]["path"])] = action["add"]
            elif "remove" in action:
                adds.pop(unquote(action["remove"]["path"]), None)
            elif "metaData" in action:
                meta = action["metaData"]
                schema = meta["schemaString"]
            elif "protocol" in action:
                proto = action["protocol"]
    state = _State(versions[-1] if versions else start, adds, schema, proto, meta=meta, checkpoint=last, since=since)
    if versions:
        state.digest = digest(storage.get(commit_key(state.version)))
    elif held is not None and start >= 0:
        state.digest = held.digest
    return state


def _actions(
    log: TableLog, m: Manifest, snap: Snapshot, prev: Snapshot | None, state: _State
) -> tuple[list[dict[str, Any]], VectorFile]:
    """The actions of mirror version ``m.version`` and the vectors they name."""
    storage = log.storage
    where = f"{storage.root}: Delta mirror of version {m.version}"
    vectors = VectorFile(prefix=DV_DIR)
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": _ms(m),
                "operation": m.operation,
                "operationParameters": {},
                "engineInfo": "castsql",
                "castsql": {"version": m.version, "commitId": m.commit_id},
            }
        }
    ]
    schema = schema_string(snap.schema, where)
    proto = protocol(snap.schema)
    if proto != state.protocol:
        actions.append({"protocol": proto})
    if schema != state.schema:
        if state.meta is None:  # the mirror's first version: the table's id and creation time
            first = log.manifest(0)
            state.meta = {
                "id": _table_id(log, first),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema,
                "partitionColumns": [],
                "configuration": {"delta.enableDeletionVectors": "true"},
                "createdTime": _ms(first),
            }
        state.meta = {**state.meta, "schemaString": schema}
        actions.append({"metaData": state.meta})
    now, before, gone = changed_files(snap, prev, state.adds.keys())
    for key in sorted(gone):
        actions.append({"remove": _remove(state.adds.pop(key), m)})
    for key in sorted(now):
        f = now[key]
        old = before.get(key)
        if key in state.adds and same_deletes(old, f):
            continue
        rows = dropped(storage, snap, f) if f.has_deletes else BitMap()
        if key in state.adds:
            # New tombstones that drop no row of the file (a key range or row
            # group already gone) change nothing here; and a remove and an add
            # of one file with no vector would name one file twice in one
            # version, which readers resolve as a removal.
            if rows == rows_before(storage, prev, old):
                continue
            actions.append({"remove": _remove(state.adds[key], m)})
        dv = vectors.add(rows) if rows else None
        add = _add(f, m, dv)
        state.adds[key] = add
        actions.append({"add": add})
    state.schema, state.protocol, state.version = schema, proto, m.version
    return actions, vectors


def export_delta(log: TableLog, version: int | None = None) -> DeltaExport:
    """Mirror the table's versions as a Delta log, up to ``version`` (default:
    the latest), writing only the versions not mirrored yet.

    Refused with MirrorError when the table holds something Delta cannot
    express (a type without a Delta equivalent), with VersionNotFound when a
    version to mirror was garbage-collected, and with CommitConflict when
    another exporter wrote the same version first (run it again). Nothing of
    a refused version is written: its vectors land before its commit file,
    and a vector file no commit names is inert.
    """
    before_export(log.storage.root)
    storage = log.storage
    target = log.latest().version if version is None else log.manifest(version).version
    done, verified = _known_versions(storage)
    if done and done != list(range(done[0], done[-1] + 1)):
        raise MirrorError(f"{storage.root}: {LOG_DIR} has gaps in its versions ({done[0]}..{done[-1]})")
    out = DeltaExport(storage.root, latest=done[-1] if done else -1)
    if done and done[-1] >= target:
        return out
    if not done and log.earliest_version() != 0:
        raise VersionNotFound(
            f"{storage.root}: version 0 was garbage-collected, and a Delta log starts at version 0 "
            "(mirroring from a checkpoint is not supported yet)"
        )
    state = _replay(storage, done, verified)
    prev = resolve(log, state.version) if state.version >= 0 else None
    for v in range(state.version + 1, target + 1):
        m = log.manifest(v)
        snap = resolve(log, v)
        actions, vectors = _actions(log, m, snap, prev, state)
        if not vectors.empty:
            data = vectors.content()
            storage.put_new(vectors.path, data)
            out.vectors += sum(1 for a in actions if "deletionVector" in a.get("add", {}))
            out.bytes_written += len(data)
        body = ("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n").encode()
        put_version(storage, commit_key(v), body, "Delta", v)
        out.bytes_written += len(body)
        state.digest = digest(body)
        out.written.append(v)
        out.latest = v
        prev = snap
        state.since += len(body)
        if checkpoints.due(v, state.checkpoint, state.since, len(state.adds)):
            out.bytes_written += _checkpoint(storage, v, state)
            state.checkpoint, state.since = v, 0
    _HELD.put(storage.root, state)  # only a state that matches what is stored (a failed put above drops it)
    return out


def _last_checkpoint(storage: Storage) -> int:
    """The version ``_last_checkpoint`` names; 0 when there is none (or it is unreadable)."""
    try:
        v = json.loads(storage.get(checkpoints.LAST_CHECKPOINT)).get("version")
    except (ObjectNotFound, ValueError, AttributeError):
        return 0
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _checkpoint(storage: Storage, version: int, state: _State) -> int:
    """Write the checkpoint of mirror version ``version`` and point
    ``_last_checkpoint`` at it; the bytes written. A checkpoint is only ever a
    shortcut for readers: one already there (another exporter's, the same
    state) is kept, and an older ``_last_checkpoint`` left by a racing
    exporter makes readers replay a few more commit files, nothing worse."""
    assert state.protocol is not None and state.meta is not None
    body, n = checkpoints.checkpoint(state.protocol, state.meta, [state.adds[k] for k in sorted(state.adds)])
    try:
        storage.put_if_absent(checkpoints.checkpoint_key(version), body)
    except PreconditionFailed:
        return 0
    pointer = checkpoints.last_checkpoint(version, n)
    storage.put(checkpoints.LAST_CHECKPOINT, pointer)
    return len(body) + len(pointer)


def read_commit(storage: Storage, version: int) -> list[dict[str, Any]]:
    """The actions of mirrored version ``version`` (for tests and audits)."""
    try:
        data = storage.get(commit_key(version))
    except ObjectNotFound:
        raise VersionNotFound(f"{storage.root}: Delta version {version} is not mirrored") from None
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
