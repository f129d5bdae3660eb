"""Delta deletion vectors: deleted row positions as Delta readers load them
(PROTOCOL.md, "Deletion Vector Format").

A vector is a ``RoaringBitmapArray``: the magic number 1681511377 (int32,
little-endian), then a 64-bit roaring bitmap in the portable layout (the
number of 32-bit bitmaps as int64, then each one's high 32 bits as int32 and
its standard roaring serialization). Vectors are stored in a file of
``deletion_vector_<uuid>.bin``: a version byte (1), then per vector its size
(int32, big-endian), its bytes and their CRC-32 (big-endian); a descriptor
names the file by the Z85 spelling of its UUID (storage type ``u``) and the
vector by its offset (where the size field starts).

Example::

    >>> from pyroaring import BitMap
    >>> f = VectorFile()
    >>> d = f.add(BitMap([1, 5, 7]))
    >>> d["cardinality"], d["offset"], d["storageType"]
    (3, 1, 'u')
    >>> sorted(read_vector(f.content(), d["offset"], d["sizeInBytes"]))
    [1, 5, 7]
    >>> z85_decode(z85_encode(b"0123456789abcdef")) == b"0123456789abcdef"
    True
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

from pyroaring import BitMap

MAGIC = 1681511377
FILE_FORMAT_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 (Delta's base85 for UUIDs and inline vectors); ``data``'s length a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"z85 needs a multiple of 4 bytes, got {len(data)}")
    out: list[str] = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"z85 text must be a multiple of 5 characters, got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        v = 0
        for c in text[i : i + 5]:
            v = v * 85 + _Z85_INDEX[c]
        out += v.to_bytes(4, "big")
    return bytes(out)


def serialize(positions: BitMap) -> bytes:
    """``positions`` (row indexes of one file, each < 2**32) as a RoaringBitmapArray."""
    body = positions.serialize() if positions else BitMap().serialize()
    return struct.pack("<iqi", MAGIC, 1, 0) + body


def deserialize(data: bytes) -> BitMap:
    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic {magic})")
    out, at = BitMap(), 12
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, at)
        if high:
            raise ValueError("row positions at or past 2**32 are not supported")
        bm = BitMap.deserialize(data[at + 4 :])
        out |= bm
        at += 4 + len(bm.serialize())
    return out


def blob(positions: BitMap) -> bytes:
    """``positions`` as one framed vector: its size (int32, big-endian), the
    vector and its CRC-32 (big-endian). Delta's vector files hold these one
    after another; an Iceberg version 3 ``deletion-vector-v1`` Puffin blob is
    exactly one of them (the Puffin spec chose the framing for that)."""
    data = serialize(positions)
    return struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))


def read_vector(file_bytes: bytes, offset: int, size: int) -> BitMap:
    """The vector at ``offset`` of a deletion vector file, its size and checksum checked."""
    (n,) = struct.unpack_from(">i", file_bytes, offset)
    if n != size:
        raise ValueError(f"deletion vector at {offset}: size {n}, descriptor says {size}")
    data = file_bytes[offset + 4 : offset + 4 + n]
    (crc,) = struct.unpack_from(">I", file_bytes, offset + 4 + n)
    if crc != zlib.crc32(data):
        raise ValueError(f"deletion vector at {offset}: checksum mismatch")
    return deserialize(data)


def file_name(u: uuid.UUID) -> str:
    return f"deletion_vector_{u}.bin"


class VectorFile:
    """One deletion vector file being built: vectors added one by one, each
    returning the descriptor an ``add`` action carries."""

    def __init__(self, u: uuid.UUID | None = None, prefix: str = "") -> None:
        self.uuid = u or uuid.uuid4()
        self.prefix = prefix  # a directory under the table root ("" : the root)
        self._parts: list[bytes] = [bytes([FILE_FORMAT_VERSION])]
        self._size = 1

    @property
    def path(self) -> str:
        """The file's key relative to the table root."""
        return f"{self.prefix}/{file_name(self.uuid)}" if self.prefix else file_name(self.uuid)

    @property
    def empty(self) -> bool:
        return self._size == 1

    def add(self, positions: BitMap) -> dict[str, Any]:
        framed = blob(positions)
        offset = self._size
        self._parts.append(framed)
        self._size += len(framed)
        return {
            "storageType": "u",
            "pathOrInlineDv": self.prefix + z85_encode(self.uuid.bytes),
            "offset": offset,
            "sizeInBytes": len(framed) - 8,
            "cardinality": len(positions),
        }

    def content(self) -> bytes:
        return b"".join(self._parts)
