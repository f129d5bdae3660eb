"""Change blocks: the changes of 8 or 64 consecutive versions in one object (FORMAT.md §3.8).

An audit over a hundred versions would otherwise read a hundred manifests and
a hundred change files (~0.3 ms a manifest's parse and ~0.2 ms a file's open
on a local disk, a round trip each on an object store). Whoever commits a
version ``end`` that is a multiple of 8 (of 64) writes, after its commit, the
rows of the change files of the 8 (64) versions ending there into one
Parquet object, each row with its ``_commit_version`` and
``_commit_timestamp``; an audit reads the blocks that cover its range and
walks only the versions left over, at most 7 at each end.

Example::

    >>> block_key(8, 16), block_key(64, 128)
    ('audit/changes/8/v00000016.parquet', 'audit/changes/64/v00000128.parquet')
    >>> block_end(8, 9), block_end(64, 64)
    (16, 64)
    >>> block_version("audit/changes/64/v00000128.parquet")
    (64, 128)
"""

from __future__ import annotations

import io
import re
import threading
from collections import OrderedDict
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from castsql.format.datafiles import conform
from castsql.format.keyindex import changes_no_rows, is_recorded
from castsql.format.manifest import Manifest, VersionRecord

if TYPE_CHECKING:
    from castsql.format.metadata import TableMetadata
    from castsql.storage import Storage

SIZES = (64, 8)  # largest first: an audit takes the largest block that fits
BLOCKS_DIR = "audit/changes"
TYPE, VERSION, TIME = "_change_type", "_commit_version", "_commit_timestamp"
_KEY_RE = re.compile(rf"^{BLOCKS_DIR}/(8|64)/v(\d{{8,}})\.parquet$")


# The change files this process wrote last, by URI: the writer of every 8th
# version reads the 8 before it back otherwise (~1 ms each, the block's largest
# cost). Change files are create-only under unique names, so an entry stays true.
_RECENT: OrderedDict[str, pa.Table] = OrderedDict()
_RECENT_FILES = 128  # two 64-blocks' worth
_RECENT_ROWS = 4_096  # a larger change file is read back when its block is written
_recent_lock = threading.Lock()


def remember(storage: Storage, path: str, table: pa.Table) -> None:
    """Keep ``table``, the rows just written as change file ``path`` of
    ``storage``, for the block that will hold them (small files only)."""
    if table.num_rows > _RECENT_ROWS:
        return
    with _recent_lock:
        _RECENT[storage.uri(path)] = table
        while len(_RECENT) > _RECENT_FILES:
            _RECENT.popitem(last=False)


def _change_rows(storage: Storage, path: str) -> pa.Table:
    """Change file ``path``'s rows: remembered, else read."""
    with _recent_lock:
        table = _RECENT.get(storage.uri(path))
    return table if table is not None else pq.read_table(io.BytesIO(storage.get(path)))


def block_key(size: int, end: int) -> str:
    return f"{BLOCKS_DIR}/{size}/v{end:08d}.parquet"


def block_version(key: str) -> tuple[int, int] | None:
    """(size, end) of a block's key; None for any other key."""
    m = _KEY_RE.match(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def block_end(size: int, version: int) -> int:
    """The last version of the ``size`` block holding ``version``."""
    return -(-version // size) * size


def _known(before: VersionRecord | Manifest, m: VersionRecord | Manifest) -> bool | None:
    """True when version ``m``'s rows are its change file's; False when it
    changed no row (a compaction, a version adding nothing); None when its
    change is not known from its manifest (it must be audited from content)."""
    if changes_no_rows(m):
        return False
    if not is_recorded(before, m):
        return None
    assert isinstance(m, VersionRecord)
    if m.change.change_file is not None:
        return True
    return None if m.change.added_files or m.change.added_tombstones else False


def write_blocks(log: TableMetadata, end: int) -> list[int]:
    """Write the blocks ending at version ``end`` that are missing; returns
    the sizes written. Best effort, as the key index (§3.6): a block some of
    whose versions are not known from their manifests, or that cannot be read,
    is not written, and nothing raises (the commit it follows has landed)."""
    done = []
    for size in SIZES:
        if end % size == 0 and end > 0:
            try:
                if write_block(log, size, end):
                    done.append(size)
            except Exception:  # the commit it follows has landed: no error here may report it failed
                continue
    return done


def write_block(log: TableMetadata, size: int, end: int) -> bool:
    """Write the ``size`` block ending at ``end`` unless it is there; False
    when one of its versions' changes is not known from its manifest."""
    first = end - size + 1
    key = block_key(size, end)
    if log.storage.exists(key):
        return False
    recs = log.prefetch_records(range(first - 1, end + 1))
    if any(v not in recs for v in range(first - 1, end + 1)):
        return False
    files: list[tuple[int, datetime, str]] = []
    for v in range(first, end + 1):
        known = _known(recs[v - 1], recs[v])
        if known is None:
            return False
        if known:
            change = recs[v].change
            cf = change.change_file if change is not None else None
            assert cf is not None  # _known: True only with a change file
            if cf.total_rows:
                files.append((v, recs[v].created_at, cf.path))
    schema = log.schema_of(end)[0]
    where = f"{log.storage.uri(key)} (versions {first} to {end})"
    parts = []
    arrow = schema.to_arrow()
    for v, at, path in files:  # a change file is in the schema of its version: widened and filled here
        raw = _change_rows(log.storage, path)
        t = conform(raw.select([n for n in schema.names if n in raw.column_names]), schema, where, fill_missing=True)
        t = t.append_column(TYPE, raw.column(TYPE))
        t = t.append_column(VERSION, pa.array([v] * t.num_rows, pa.int64()))
        parts.append(t.append_column(TIME, pa.array([at] * t.num_rows, pa.timestamp("us", tz="UTC"))))
    out = pa.schema([*arrow, (TYPE, pa.string()), (VERSION, pa.int64()), (TIME, pa.timestamp("us", tz="UTC"))])
    table = pa.concat_tables([p.cast(out) for p in parts]) if parts else out.empty_table()
    meta = {"castsql.kind": "changes", "castsql.first": str(first), "castsql.last": str(end)}
    table = table.replace_schema_metadata(meta)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    try:
        log.storage.put_if_absent(key, buf.getvalue())
    except Exception:  # another writer wrote it first: the same rows
        return False
    return True
