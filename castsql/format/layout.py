"""Where each object of a table lives, relative to the table root."""

from __future__ import annotations

import os
import posixpath
import re
import time
from datetime import UTC, datetime

from castsql.errors import FormatError
from castsql.storage.base import is_normal_key, key_problem
from castsql.storage.uris import canonical_uri  # storage owns it; importable here too for the old path

POINTER_KEY = "_latest_manifest"
MANIFEST_DIR = "manifest"
DATA_DIR = "data"
TOMBSTONE_DIR = "tombstone"
META_DIR = "meta"
CDC_DIR = "cdc"  # CDC delete markers (FORMAT.md §3.7): outside meta/, which older GCs list

_MANIFEST_RE = re.compile(r"^manifest/v(\d{8,})\.json$")

# The largest version number: a signed 64-bit integer, what DuckDB's BIGINT,
# Arrow's int64 and Delta's long hold. A pointer or manifest naming a larger
# one is refused when parsed (a 400-digit version would name a manifest key
# no store takes: "File name too long").
MAX_VERSION = 2**63 - 1


def manifest_key(version: int) -> str:
    """``manifest/v00000123.json``; versions past 10^8 simply get more digits."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return f"{MANIFEST_DIR}/v{version:08d}.json"


def manifest_version(key: str) -> int | None:
    """The version a manifest key names, or None if ``key`` is not a manifest."""
    m = _MANIFEST_RE.match(key)
    return int(m.group(1)) if m else None


def _hour_dir(now: datetime | None) -> str:
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return now.strftime("%Y/%m/%d/%H")


def time_ordered_id() -> str:
    """A UUID version 7 (RFC 9562) in hex: 48 bits of Unix milliseconds, then
    random bits. Names made of it sort by creation time, so the files a
    metadata object lists (appended together) span a narrow range of keys,
    and a reader looking for one key skips the objects whose path bounds
    exclude it.

    >>> import uuid
    >>> a = time_ordered_id()
    >>> len(a), a[12], uuid.UUID(a).version
    (32, '7', 7)
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 64) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return f"{value:032x}"


def new_data_key(now: datetime | None = None) -> str:
    return f"{DATA_DIR}/{_hour_dir(now)}/{time_ordered_id()}.parquet"


def new_data_dir(now: datetime | None = None) -> str:
    """``data/YYYY/MM/DD/HH/<uuid>``: a directory for the files of one write
    made by another writer (Spark's, which names its files itself)."""
    return f"{DATA_DIR}/{_hour_dir(now)}/{time_ordered_id()}"


def new_tombstone_key(now: datetime | None = None) -> str:
    return f"{TOMBSTONE_DIR}/{_hour_dir(now)}/{time_ordered_id()}.del"


def new_markers_key(now: datetime | None = None) -> str:
    return f"{CDC_DIR}/{_hour_dir(now)}/{time_ordered_id()}.markers.parquet"


def new_meta_key(kind: str, now: datetime | None = None) -> str:
    """``meta/YYYY/MM/DD/HH/<uuid>.files.parquet`` (or ``.deletes.parquet``)."""
    return f"{META_DIR}/{_hour_dir(now)}/{time_ordered_id()}.{kind}.parquet"


def to_table_key(path: str, table_root: str, *, what: str) -> str:
    """Turn a path as written in a manifest into a key relative to the table root.

    Manifests written by CastSQL hold relative keys; the seed's manifests hold
    full URIs (``s3://bucket/table/data/…``). Both are accepted, but the object
    must lie inside the table root and its key must be plain (no query string,
    glob or control characters, see :func:`castsql.storage.base.key_problem`):
    a manifest cannot make a reader open arbitrary files or URLs.
    """
    if is_normal_key(path):  # "://" contains "//": URLs take the full path below
        return path  # already a normalised relative key: the common case, kept cheap
    root = table_root.rstrip("/")
    if "://" in path or path.startswith("/"):
        full = canonical_uri(path.removeprefix("file://"))
        root = canonical_uri(root)
        if not full.startswith(root + "/"):
            raise FormatError(f"{what} {path!r} lies outside the table root {table_root}")
        key = full[len(root) + 1 :]
    else:
        key = path
    problem = key_problem(key)
    if problem is not None:
        raise FormatError(f"{what} {path!r} is not a plain object key: it {problem}")
    norm = posixpath.normpath(key)
    if norm.startswith("../") or norm == ".." or norm.startswith("/") or norm == ".":
        raise FormatError(f"{what} {path!r} lies outside the table root {table_root}")
    return norm
