"""Iceberg's Avro manifests and manifest lists, written without PyIceberg.

The Iceberg mirror writes one manifest (and a manifest list) per version. An
unpartitioned table without column statistics needs only a fixed part of
Iceberg's Avro schemas, so the files are a header made once per process and
one block of records encoded here. PyIceberg's writers rebuilt their schemas
and Avro writers for every file (~3.5 ms of a ~10 ms mirror version,
docs/PERFORMANCE.md "The mirrors' cost per commit"); reading a mirror back
(a process that did not write its last version) still goes through PyIceberg.

The schemas are those of the Iceberg spec, format version 2
(https://iceberg.apache.org/spec/#manifests): ``manifest_entry`` with an empty
``partition`` record, and ``manifest_file``. Optional fields the mirror does
not fill (column statistics, split offsets, key metadata) are written as
null, as PyIceberg writes them.

Example::

    >>> e = Entry(status=ADDED, snapshot_id=3, sequence_number=None, file_sequence_number=None,
    ...           content=DATA, path="s3://b/t/data/a.parquet", record_count=10, size=1234)
    >>> body = manifest(b'{"type":"struct","fields":[],"schema-id":0}', "data", [e])
    >>> body[:4]
    b'Obj\\x01'
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

EXISTING, ADDED, DELETED = 0, 1, 2  # manifest entry status
DATA, POSITION_DELETES = 0, 1  # data file content
CONTENT_DATA, CONTENT_DELETES = 0, 1  # manifest content


def _map(name: str, field_id: int, key_id: int, value_id: int, value: str) -> dict:
    items = {"type": "record", "name": f"k{key_id}_v{value_id}", "fields": [
        {"name": "key", "type": "int", "field-id": key_id},
        {"name": "value", "type": value, "field-id": value_id},
    ]}  # fmt: skip
    return {"name": name, "field-id": field_id, "default": None,
            "type": ["null", {"type": "array", "logicalType": "map", "items": items}]}  # fmt: skip


def _optional(name: str, field_id: int, type_: object) -> dict:
    return {"name": name, "field-id": field_id, "type": ["null", type_], "default": None}


_DATA_FILE = {"type": "record", "name": "r2", "fields": [
    {"name": "content", "field-id": 134, "type": "int"},
    {"name": "file_path", "field-id": 100, "type": "string"},
    {"name": "file_format", "field-id": 101, "type": "string"},
    {"name": "partition", "field-id": 102, "type": {"type": "record", "name": "r102", "fields": []}},
    {"name": "record_count", "field-id": 103, "type": "long"},
    {"name": "file_size_in_bytes", "field-id": 104, "type": "long"},
    _map("column_sizes", 108, 117, 118, "long"),
    _map("value_counts", 109, 119, 120, "long"),
    _map("null_value_counts", 110, 121, 122, "long"),
    _map("nan_value_counts", 137, 138, 139, "long"),
    _map("lower_bounds", 125, 126, 127, "bytes"),
    _map("upper_bounds", 128, 129, 130, "bytes"),
    _optional("key_metadata", 131, "bytes"),
    _optional("split_offsets", 132, {"type": "array", "element-id": 133, "items": "long"}),
    _optional("equality_ids", 135, {"type": "array", "element-id": 136, "items": "int"}),
    _optional("sort_order_id", 140, "int"),
]}  # fmt: skip
_NULLS_AFTER_SIZE = 10  # the optional fields above, all null

ENTRY_SCHEMA = json.dumps({"type": "record", "name": "manifest_entry", "fields": [
    {"name": "status", "field-id": 0, "type": "int"},
    _optional("snapshot_id", 1, "long"),
    _optional("sequence_number", 3, "long"),
    _optional("file_sequence_number", 4, "long"),
    {"name": "data_file", "field-id": 2, "type": _DATA_FILE},
]}, separators=(",", ":"))  # fmt: skip

_SUMMARY = {"type": "record", "name": "r508", "fields": [
    {"name": "contains_null", "field-id": 509, "type": "boolean"},
    _optional("contains_nan", 518, "boolean"),
    _optional("lower_bound", 510, "bytes"),
    _optional("upper_bound", 511, "bytes"),
]}  # fmt: skip

MANIFEST_FILE_SCHEMA = json.dumps({"type": "record", "name": "manifest_file", "fields": [
    {"name": "manifest_path", "field-id": 500, "type": "string"},
    {"name": "manifest_length", "field-id": 501, "type": "long"},
    {"name": "partition_spec_id", "field-id": 502, "type": "int"},
    {"name": "content", "field-id": 517, "type": "int"},
    {"name": "sequence_number", "field-id": 515, "type": "long"},
    {"name": "min_sequence_number", "field-id": 516, "type": "long"},
    {"name": "added_snapshot_id", "field-id": 503, "type": "long"},
    {"name": "added_files_count", "field-id": 504, "type": "int"},
    {"name": "existing_files_count", "field-id": 505, "type": "int"},
    {"name": "deleted_files_count", "field-id": 506, "type": "int"},
    {"name": "added_rows_count", "field-id": 512, "type": "long"},
    {"name": "existing_rows_count", "field-id": 513, "type": "long"},
    {"name": "deleted_rows_count", "field-id": 514, "type": "long"},
    _optional("partitions", 507, {"type": "array", "element-id": 508, "items": _SUMMARY}),
    _optional("key_metadata", 519, "bytes"),
]}, separators=(",", ":"))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Entry:
    """One manifest entry: a data or position delete file and its status."""

    status: int
    snapshot_id: int | None
    sequence_number: int | None
    file_sequence_number: int | None
    content: int
    path: str
    record_count: int
    size: int

    def existing(self) -> Entry:
        """This live entry as a later manifest carries it on (sequence numbers
        as its snapshot gave them: Iceberg's inheritance, resolved)."""
        seq = self.sequence_number if self.sequence_number is not None else self.snapshot_id
        fseq = self.file_sequence_number if self.file_sequence_number is not None else seq
        return Entry(EXISTING, self.snapshot_id, seq, fseq, self.content, self.path, self.record_count, self.size)


@dataclass(slots=True)
class ManifestFile:
    """One manifest list entry. ``sequence_number`` is None until the first
    manifest list that holds it assigns its snapshot's."""

    path: str
    length: int
    content: int
    added_snapshot_id: int
    added_files: int
    existing_files: int
    deleted_files: int
    added_rows: int
    existing_rows: int
    deleted_rows: int
    min_sequence_number: int | None = None
    sequence_number: int | None = None
    encoded: bytes | None = field(default=None, repr=False, compare=False)  # once its sequence numbers are set


def manifest(table_schema: bytes, content: str, entries: Sequence[Entry]) -> bytes:
    """An Avro manifest of ``entries`` (``content``: ``data`` or ``deletes``),
    ``table_schema`` the Iceberg schema JSON of the version."""
    meta = {
        "schema": table_schema,
        "partition-spec": b"[]",
        "partition-spec-id": b"0",
        "format-version": b"2",
        "content": content.encode(),
    }
    out = bytearray()
    for e in entries:
        out += _long(e.status)
        for v in (e.snapshot_id, e.sequence_number, e.file_sequence_number):
            out += b"\x00" if v is None else b"\x02" + _long(v)
        out += _long(e.content)
        out += _string(e.path)
        out += b"\x0ePARQUET"
        out += _long(e.record_count)
        out += _long(e.size)
        out += b"\x00" * _NULLS_AFTER_SIZE
    return _container(ENTRY_SCHEMA, meta, len(entries), bytes(out))


def manifest_file_of(path: str, length: int, content: int, snapshot_id: int, entries: Sequence[Entry]) -> ManifestFile:
    """The manifest list entry of a manifest of ``entries`` written by ``snapshot_id``."""
    counts = {EXISTING: [0, 0], ADDED: [0, 0], DELETED: [0, 0]}
    seqs = []
    for e in entries:
        c = counts[e.status]
        c[0] += 1
        c[1] += e.record_count
        if e.status != DELETED and e.sequence_number is not None:
            seqs.append(e.sequence_number)
    return ManifestFile(
        path, length, content, snapshot_id,
        counts[ADDED][0], counts[EXISTING][0], counts[DELETED][0],
        counts[ADDED][1], counts[EXISTING][1], counts[DELETED][1],
        min(seqs) if seqs else None,
    )  # fmt: skip


def manifest_list(snapshot_id: int, parent: int | None, sequence_number: int, files: Sequence[ManifestFile]) -> bytes:
    """An Avro manifest list of ``files`` for snapshot ``snapshot_id``; files
    new in it get its sequence number (set on them, as Iceberg's writers do)."""
    meta = {
        "snapshot-id": str(snapshot_id).encode(),
        "parent-snapshot-id": str(parent).encode() if parent is not None else b"null",
        "sequence-number": str(sequence_number).encode(),
        "format-version": b"2",
    }
    out = bytearray()
    for f in files:
        if f.encoded is None:
            # A list holds every live manifest, so each is encoded once, not once a version.
            if f.sequence_number is None:
                f.sequence_number = sequence_number
            if f.min_sequence_number is None:
                f.min_sequence_number = sequence_number
            b = bytearray(_string(f.path))
            b += _long(f.length)
            b += b"\x00"  # partition spec 0
            b += _long(f.content)
            b += _long(f.sequence_number)
            b += _long(f.min_sequence_number)
            b += _long(f.added_snapshot_id)
            for n in (f.added_files, f.existing_files, f.deleted_files, f.added_rows, f.existing_rows, f.deleted_rows):
                b += _long(n)
            b += b"\x02\x00"  # partitions: an empty list (no partition fields)
            b += b"\x00"  # key_metadata: null
            f.encoded = bytes(b)
        out += f.encoded
    return _container(MANIFEST_FILE_SCHEMA, meta, len(files), bytes(out))


def _container(schema: str, meta: dict[str, bytes], count: int, records: bytes) -> bytes:
    """An Avro object container file: header, one deflated block."""
    sync = os.urandom(16)
    out = bytearray(b"Obj\x01")
    items = {**meta, "avro.codec": b"deflate", "avro.schema": schema.encode()}
    out += _long(len(items))
    for k, v in items.items():
        out += _string(k)
        out += _long(len(v)) + v
    out += b"\x00"
    out += sync
    if count:
        c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
        block = c.compress(records) + c.flush()
        out += _long(count) + _long(len(block)) + block + sync
    return bytes(out)


def _long(n: int) -> bytes:
    """Avro's zig-zag variable-length encoding of an int or long."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _string(s: str) -> bytes:
    b = s.encode()
    return _long(len(b)) + b
