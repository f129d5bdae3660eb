"""Which primary keys each version of a block of versions changed (FORMAT.md §3.6).

A row's history asks, for every kept version, whether it changed a key. A
recorded version lists the keys it changed in its manifest (§3.5), so
answering needs no data file, but it still needs one manifest per version:
one read and one JSON parse each, ~0.3 ms on a local disk and a round trip
on an object store, 300 ms over 1,000 versions where the question is about
3 of them. The key index puts the lists of ``BLOCK`` consecutive versions in
one small object, ``audit/keys/v<end>.json``, which the writer of version
``end`` (a multiple of ``BLOCK``) writes after its commit: a history reads
one object per block and only the manifests of the versions that may hold
the key.

The object is derived from manifests that never change, so it is written
once, create-only, by whoever commits the block's last version; a writer
that dies first leaves the block without one and readers walk its
manifests, as before. It never decides what a query returns.

Example::

    >>> block_end(1), block_end(64), block_end(65), index_key(128)
    (64, 64, 128, 'audit/keys/v00000128.json')
    >>> index_version(index_key(128)), index_version(index_key(10**9)), index_version("audit/keys/v12.json")
    (128, 1000000000, None)
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from castsql.errors import FormatError, ObjectNotFound
from castsql.format.jsonio import load_json
from castsql.format.manifest import Manifest, VersionRecord, ascending, is_key_list

if TYPE_CHECKING:
    from castsql.format.metadata import TableMetadata

BLOCK = 64
INDEX_DIR = "audit/keys"
_INDEX_RE = re.compile(rf"^{INDEX_DIR}/v(\d{{8,}})\.json$")  # as manifest keys: past 10^8, more digits
NO_DATA_CHANGE = frozenset({"COMPACT", "OPTIMIZE"})  # operations that rewrite rows without changing them


def index_key(end: int) -> str:
    return f"{INDEX_DIR}/v{end:08d}.json"


def index_version(key: str) -> int | None:
    """The last version of the block whose index is at ``key``; None for another key."""
    m = _INDEX_RE.match(key)
    return int(m.group(1)) if m else None


def block_end(version: int) -> int:
    """The last version of the block that holds ``version`` (>= 1)."""
    return -(-version // BLOCK) * BLOCK


def changes_no_rows(m: VersionRecord | Manifest) -> bool:
    """A compaction: it rewrites rows, inserting, updating and deleting none."""
    return (m.operation or "").upper() in NO_DATA_CHANGE


def is_recorded(before: VersionRecord | Manifest, m: VersionRecord | Manifest) -> bool:
    """Whether version ``m``'s change is known from its own manifest (§3.5):
    ``previous`` is ``version - 1``, it removed no data file and no tombstone,
    it added no tombstone or has a change-data file, and its change agrees
    with the two versions' totals (files, stored rows and tombstones added)."""
    if not isinstance(m, VersionRecord) or not isinstance(before, VersionRecord):
        return False  # a version-1 manifest: no change record
    c = m.change
    if m.previous != m.version - 1 or c.removed_files or c.removed_tombstones:
        return False
    if c.added_tombstones and c.preimages is None and c.change_file is None:
        return False
    t, b = m.totals, before.totals
    return (t.files - b.files, t.rows - b.rows, t.tombstones - b.tombstones) == (
        len(c.added_files),
        sum(e.total_rows for e in c.added_files),
        len(c.added_tombstones),
    )


def version_keys(before: VersionRecord | Manifest, m: VersionRecord | Manifest) -> list[Any] | None:
    """What the index says of version ``m``: the keys it changed (``[]`` for
    a compaction), or None when they are not known from its manifest."""
    if changes_no_rows(m):
        return []
    if is_recorded(before, m) and isinstance(m, VersionRecord) and m.change.keys is not None:
        return list(m.change.keys)
    return None


def write_index(log: TableMetadata, end: int) -> bool:
    """Write the index of the block ending at version ``end`` unless it is
    there; False (nothing written) when a version of it or the one before it
    cannot be read (collected, broken). Best effort: never raises for the
    store's or the metadata's sake, since the commit it follows has landed."""
    first = end - BLOCK + 1
    try:
        recs = log.prefetch_records(range(first - 1, end + 1))
        if any(v not in recs for v in range(first - 1, end + 1)):
            return False
        doc = {
            "first": first,
            "last": end,
            "keys": [version_keys(recs[v - 1], recs[v]) for v in range(first, end + 1)],
        }
        log.storage.put_if_absent(index_key(end), json.dumps(doc, separators=(",", ":")).encode())
        return True
    except Exception:  # the commit it follows has landed: no error here may report it failed
        return False


def read_index(log: TableMetadata, end: int) -> dict[int, list[Any] | None] | None:
    """Version -> keys (None: not known) of the block ending at ``end``;
    None when it has no index, or one that does not read as §3.6 says
    (then the reader walks the manifests)."""
    key = index_key(end)
    try:
        data = log.storage.get(key)
    except ObjectNotFound:
        return None
    where = log.storage.uri(key)
    try:
        doc = load_json(data, where, "key index")
        keys = doc.get("keys") if isinstance(doc, dict) else None
        if doc.get("first") != end - BLOCK + 1 or doc.get("last") != end or not isinstance(keys, list):
            raise FormatError(f"{where}: not a key index of versions {end - BLOCK + 1} to {end}")
        if len(keys) != BLOCK or not all(k is None or is_key_list(k) for k in keys):
            raise FormatError(f"{where}: 'keys' must hold {BLOCK} lists of numbers or strings, or nulls")
    except (FormatError, AttributeError):
        return None
    # A list out of order would hide keys from the bisecting lookup: it says nothing.
    return {end - BLOCK + 1 + i: (k if k is None or ascending(k) else None) for i, k in enumerate(keys)}
