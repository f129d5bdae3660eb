"""Iceberg's Avro manifests and manifest lists, written without PyIceberg.

The Iceberg mirror writes one manifest (and a manifest list) per version. An
unpartitioned table without column statistics needs only a fixed part of
Iceberg's Avro schemas, so the files are a header made once per process and
one block of records encoded here. PyIceberg's writers rebuilt their schemas
and Avro writers for every file (~3.5 ms of a ~10 ms mirror version,
docs/PERFORMANCE.md "The mirrors' cost per commit"); reading a mirror back
(a process that did not write its last version) still goes through PyIceberg.

The schemas are those of the Iceberg spec, format versions 2 and 3
(https://iceberg.apache.org/spec/#manifests): ``manifest_entry`` with an empty
``partition`` record, and ``manifest_file``; version 3 adds a data file's
``first_row_id``, ``referenced_data_file``, ``content_offset`` and
``content_size_in_bytes`` (a deletion vector's place in its Puffin file) and
a manifest's ``first_row_id``. Optional fields the mirror does not fill
(column statistics, split offsets, key metadata) are written as null, as
PyIceberg writes them. :func:`puffin` writes the Puffin file of a version's
deletion vectors.

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
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

EXISTING, ADDED, DELETED = 0, 1, 2  # manifest entry status
DATA, POSITION_DELETES = 0, 1  # data file content
CONTENT_DATA, CONTENT_DELETES = 0, 1  # manifest content
PUFFIN_MAGIC = b"PFA1"
ROW_POSITION_ID = 2147483545  # Iceberg's reserved field id of a row's position: what a deletion vector is over
FILE_PATH_ID = 2147483546  # ... and of a position delete file's data file path


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
_DATA_FILE_V3 = {**_DATA_FILE, "fields": [
    *_DATA_FILE["fields"],
    _optional("first_row_id", 142, "long"),
    _optional("referenced_data_file", 143, "string"),
    _optional("content_offset", 144, "long"),
    _optional("content_size_in_bytes", 145, "long"),
]}  # fmt: skip


def _entry_schema(data_file: dict) -> str:
    return json.dumps({"type": "record", "name": "manifest_entry", "fields": [
        {"name": "status", "field-id": 0, "type": "int"},
        _optional("snapshot_id", 1, "long"),
        _optional("sequence_number", 3, "long"),
        _optional("file_sequence_number", 4, "long"),
        {"name": "data_file", "field-id": 2, "type": data_file},
    ]}, separators=(",", ":"))  # fmt: skip


ENTRY_SCHEMA = {2: _entry_schema(_DATA_FILE), 3: _entry_schema(_DATA_FILE_V3)}

_SUMMARY = {"type": "record", "name": "r508", "fields": [
    {"name": "contains_null", "field-id": 509, "type": "boolean"},
    _optional("contains_nan", 518, "boolean"),
    _optional("lower_bound", 510, "bytes"),
    _optional("upper_bound", 511, "bytes"),
]}  # fmt: skip

_MANIFEST_FILE_FIELDS = [
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
]


def _manifest_file_schema(fields: list) -> str:
    return json.dumps({"type": "record", "name": "manifest_file", "fields": fields}, separators=(",", ":"))


MANIFEST_FILE_SCHEMA = {
    2: _manifest_file_schema(_MANIFEST_FILE_FIELDS),
    3: _manifest_file_schema([*_MANIFEST_FILE_FIELDS, _optional("first_row_id", 520, "long")]),
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One manifest entry: a data or position delete file and its status.
    A version 3 deletion vector is a position delete entry whose ``path`` is
    its Puffin file, with ``referenced`` the data file it applies to and
    ``content_offset``/``content_size`` its blob."""

    status: int
    snapshot_id: int | None
    sequence_number: int | None
    file_sequence_number: int | None
    content: int
    path: str
    record_count: int
    size: int
    first_row_id: int | None = None  # version 3 data files; None: inherited from the manifest's
    referenced: str | None = None
    content_offset: int | None = None
    content_size: int | None = None

    def existing(self) -> Entry:
        """This live entry as a later manifest carries it on (sequence numbers
        as its snapshot gave them: Iceberg's inheritance, resolved)."""
        seq = self.sequence_number if self.sequence_number is not None else self.snapshot_id
        fseq = self.file_sequence_number if self.file_sequence_number is not None else seq
        return replace(self, status=EXISTING, sequence_number=seq, file_sequence_number=fseq)


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
    first_row_id: int | None = None  # version 3 data manifests, set before the first list that holds it
    encoded: bytes | None = field(default=None, repr=False, compare=False)  # once its sequence numbers are set


def manifest(table_schema: bytes, content: str, entries: Sequence[Entry], format_version: int = 2) -> bytes:
    """An Avro manifest of ``entries`` (``content``: ``data`` or ``deletes``),
    ``table_schema`` the Iceberg schema JSON of the version."""
    meta = {
        "schema": table_schema,
        "partition-spec": b"[]",
        "partition-spec-id": b"0",
        "format-version": str(format_version).encode(),
        "content": content.encode(),
    }
    out = bytearray()
    for e in entries:
        out += _long(e.status)
        for v in (e.snapshot_id, e.sequence_number, e.file_sequence_number):
            out += _optional_long(v)
        out += _long(e.content)
        out += _string(e.path)
        out += b"\x0cPUFFIN" if e.content_offset is not None else b"\x0ePARQUET"
        out += _long(e.record_count)
        out += _long(e.size)
        if e.referenced is not None and e.content_offset is None:
            # A position delete file of one data file: its file_path column's
            # bounds name that file, so readers apply it to that file alone.
            bound = _bounds(FILE_PATH_ID, e.referenced.encode())
            out += b"\x00" * 4 + bound + bound + b"\x00" * (_NULLS_AFTER_SIZE - 6)
        else:
            out += b"\x00" * _NULLS_AFTER_SIZE
        if format_version >= 3:
            out += _optional_long(e.first_row_id)
            out += b"\x00" if e.referenced is None else b"\x02" + _string(e.referenced)
            out += _optional_long(e.content_offset)
            out += _optional_long(e.content_size)
    return _container(ENTRY_SCHEMA[format_version], meta, len(entries), bytes(out))


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


def manifest_list(
    snapshot_id: int,
    parent: int | None,
    sequence_number: int,
    files: Sequence[ManifestFile],
    format_version: int = 2,
    first_row_id: int | None = None,
) -> bytes:
    """An Avro manifest list of ``files`` for snapshot ``snapshot_id``; files
    new in it get its sequence number (set on them, as Iceberg's writers do).
    Version 3: ``first_row_id`` is the snapshot's, and every data manifest
    must have its own set already."""
    meta = {
        "snapshot-id": str(snapshot_id).encode(),
        "parent-snapshot-id": str(parent).encode() if parent is not None else b"null",
        "sequence-number": str(sequence_number).encode(),
        "format-version": str(format_version).encode(),
    }
    if format_version >= 3:
        meta["first-row-id"] = str(first_row_id).encode()
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
            if format_version >= 3:
                b += _optional_long(f.first_row_id)
            f.encoded = bytes(b)
        out += f.encoded
    return _container(MANIFEST_FILE_SCHEMA[format_version], meta, len(files), bytes(out))


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


def _bounds(field_id: int, value: bytes) -> bytes:
    """An optional map of one column's bound (``lower_bounds``, ``upper_bounds``): one block of one pair."""
    return b"\x02" + _long(1) + _long(field_id) + _long(len(value)) + value + b"\x00"


def _optional_long(n: int | None) -> bytes:
    return b"\x00" if n is None else b"\x02" + _long(n)


def _string(s: str) -> bytes:
    b = s.encode()
    return _long(len(b)) + b


def puffin(blobs: Sequence[tuple[bytes, str, int]]) -> tuple[bytes, list[tuple[int, int]]]:
    """A Puffin file of deletion vectors (``deletion-vector-v1`` blobs), each
    given as (blob, the data file's location, cardinality); returns the file
    and each blob's (offset, length), which its manifest entry names."""
    out = bytearray(PUFFIN_MAGIC)
    meta, places = [], []
    for blob, referenced, cardinality in blobs:
        places.append((len(out), len(blob)))
        meta.append({
            "type": "deletion-vector-v1", "fields": [ROW_POSITION_ID], "snapshot-id": -1, "sequence-number": -1,
            "offset": len(out), "length": len(blob),
            "properties": {"referenced-data-file": referenced, "cardinality": str(cardinality)},
        })  # fmt: skip
        out += blob
    payload = json.dumps({"blobs": meta, "properties": {"created-by": "CastSQL"}}, separators=(",", ":")).encode()
    out += PUFFIN_MAGIC + payload + struct.pack("<i", len(payload)) + b"\x00\x00\x00\x00" + PUFFIN_MAGIC
    return bytes(out), places
