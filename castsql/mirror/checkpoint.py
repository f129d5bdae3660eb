"""Delta checkpoints of the mirror: the whole state at a version in one Parquet file.

A Delta reader finds the newest checkpoint through ``_delta_log/_last_checkpoint``
and replays only the commit files after it; without one it replays every commit
file since version 0, which after thousands of CastSQL versions costs a
reader thousands of small reads (one GET each on an object store). A
checkpoint holds every live file, so its cost grows with the table while a
commit's does not: the mirror writes one when the commit files since the last
have grown as large as a checkpoint would be (:func:`due`), at least
:data:`MIN_INTERVAL` versions apart (Delta's own default interval) and at
most :data:`MAX_INTERVAL`. A reader then reads about twice a checkpoint's
bytes at most, and a writer's checkpoints cost it, per commit, about one
commit file more (FORMAT.md §10.1).

The file is the protocol's classic single-file checkpoint
(``<version>.checkpoint.parquet``): one row per action, a ``protocol``, a
``metaData`` and an ``add`` for each live file (with its deletion vector);
removes are left out (they only matter to ``VACUUM``'s retention, and the
mirror's files are the table's own).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MIN_INTERVAL = 10  # Delta's default delta.checkpointInterval
MAX_INTERVAL = 1000  # the most commit files a reader replays
BYTES_PER_FILE = 24  # a checkpoint's size per live file (zstd Parquet; 17 B measured at 100,000 files)
FIXED_BYTES = 2048  # ... and its protocol, metaData and footer
LAST_CHECKPOINT = "_delta_log/_last_checkpoint"

_STR_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
    ]
)
_ADD = pa.struct(
    [
        ("path", pa.string()),
        ("partitionValues", _STR_MAP),
        ("size", pa.int64()),
        ("modificationTime", pa.int64()),
        ("dataChange", pa.bool_()),
        ("stats", pa.string()),
        ("tags", _STR_MAP),
        ("deletionVector", _DV),
    ]
)
_META = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("description", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", _STR_MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", pa.list_(pa.string())),
        ("configuration", _STR_MAP),
        ("createdTime", pa.int64()),
    ]
)
_PROTOCOL = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", pa.list_(pa.string())),
        ("writerFeatures", pa.list_(pa.string())),
    ]
)
SCHEMA = pa.schema([("protocol", _PROTOCOL), ("metaData", _META), ("add", _ADD)])


def checkpoint_key(version: int) -> str:
    return f"_delta_log/{version:020d}.checkpoint.parquet"


def due(version: int, last: int, since: int, files: int) -> bool:
    """Whether mirror version ``version`` gets a checkpoint, the last one
    being at version ``last`` (0: none), with ``since`` bytes of commit files
    written after it and ``files`` live files.

    >>> due(10, 0, 6_000, 12), due(10, 0, 6_000, 100_000), due(1000, 0, 6_000, 100_000)
    (True, False, True)
    """
    n = version - last
    return n >= MAX_INTERVAL or (n >= MIN_INTERVAL and since >= BYTES_PER_FILE * files + FIXED_BYTES)


def checkpoint(protocol: dict[str, Any], meta: dict[str, Any], adds: list[dict[str, Any]]) -> tuple[bytes, int]:
    """The checkpoint file of a state (its protocol, metaData and live files'
    add actions), and its number of actions.

    >>> body, n = checkpoint({"minReaderVersion": 1, "minWriterVersion": 2}, {"id": "x", "schemaString": "{}"},
    ...                      [{"path": "a.parquet", "size": 1, "modificationTime": 0, "dataChange": True}])
    >>> n, pq.ParquetFile(io.BytesIO(body)).metadata.num_rows
    (3, 3)
    """
    rows: list[dict[str, Any]] = [
        {"protocol": _protocol(protocol), "metaData": None, "add": None},
        {"protocol": None, "metaData": _meta(meta), "add": None},
    ]
    rows += [{"protocol": None, "metaData": None, "add": _add(a)} for a in adds]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), buf, compression="zstd")
    return buf.getvalue(), len(rows)


def last_checkpoint(version: int, size: int) -> bytes:
    """The ``_last_checkpoint`` pointer's body."""
    return json.dumps({"version": version, "size": size}, separators=(",", ":")).encode()


def _maps(d: dict[str, str] | None) -> list[tuple[str, str]]:
    return list((d or {}).items())


def _protocol(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "minReaderVersion": p["minReaderVersion"],
        "minWriterVersion": p["minWriterVersion"],
        "readerFeatures": p.get("readerFeatures"),
        "writerFeatures": p.get("writerFeatures"),
    }


def _meta(m: dict[str, Any]) -> dict[str, Any]:
    fmt = m.get("format") or {"provider": "parquet", "options": {}}
    return {
        "id": m["id"],
        "name": m.get("name"),
        "description": m.get("description"),
        "format": {"provider": fmt.get("provider", "parquet"), "options": _maps(fmt.get("options"))},
        "schemaString": m["schemaString"],
        "partitionColumns": list(m.get("partitionColumns") or []),
        "configuration": _maps(m.get("configuration")),
        "createdTime": m.get("createdTime"),
    }


def _add(a: dict[str, Any]) -> dict[str, Any]:
    return {
        "path": a["path"],
        "partitionValues": _maps(a.get("partitionValues")),
        "size": a["size"],
        "modificationTime": a["modificationTime"],
        "dataChange": a.get("dataChange", True),
        "stats": a.get("stats"),
        "tags": _maps(a.get("tags")) if a.get("tags") else None,
        "deletionVector": a.get("deletionVector"),
    }
