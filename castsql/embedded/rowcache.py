"""Whole rows of a table's data files, kept in memory by a handle that merges again and again under the change feed.

Under ``castsql.changeDataFeed`` a merge writes the rows it replaces, every
column, into the version's change file (FORMAT.md §3.5). A stream's updates
hit random keys, so 20 replaced rows lie in every row group of a 1M-row
file, and fetching them by position decoded every page of every column: 32
of a 64 ms commit, growing with the table (docs/PERFORMANCE.md, "Commits at
1M-10M rows"). Data files never change once written, so a file's rows read
once stay true while it is in the table; this cache keeps them, per file and
per projection (the SQL that maps the file's columns onto the version's
schema: a schema change makes a new entry, never a wrong one), and a merge
takes its replaced rows from them: the cost of the change, once a file is
held. Deleted rows are not its business (the caller asks for live positions).

It is filled only by a handle's second merge or later (as the key cache,
:mod:`castsql.embedded.keycache`: a one-off merge reads what it did), and at
most :data:`BUDGET` bytes are kept, the least recently used files dropped
first; a file larger than that is never kept (its rows are fetched by
position, as before). ``CASTSQL_KEY_CACHE=0`` turns it off with the key cache.

Example::

    >>> import pyarrow as pa
    >>> cache = RowCache()
    >>> cache.put("f1", "p", pa.table({"v": ["a", "b", "c"]}))
    >>> cache.take("f1", "p", [2, 0]).to_pylist()
    [{'v': 'c'}, {'v': 'a'}]
    >>> cache.take("f1", "other projection", [0]) is None
    True
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

# Bytes of rows kept per handle: a 10M-row table of five columns is ~400 MB in Arrow.
BUDGET = 1024 * 2**20


class RowCache:
    """The rows of data files by (file, projection): see the module's doc."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = BUDGET if budget is None else budget
        self._files: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.warm = False  # a merge under the feed has run: the next fills the cache
        self.enabled = os.environ.get("CASTSQL_KEY_CACHE", "1") != "0"

    def fits(self, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` in memory may be kept at all."""
        return nbytes <= self.budget

    def put(self, uri: str, projection: str, rows: pa.Table) -> None:
        """Keep ``rows``, every row of file ``uri`` in row order read through
        ``projection``, unless past the budget."""
        rows = rows.combine_chunks()
        if rows.nbytes > self.budget:
            return
        key = (uri, projection)
        with self._lock:
            old = self._files.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._files[key] = rows
            self._bytes += rows.nbytes
            while self._bytes > self.budget:
                _, dropped = self._files.popitem(last=False)
                self._bytes -= dropped.nbytes

    def take(self, uri: str, projection: str, positions: Sequence[int] | np.ndarray) -> pa.Table | None:
        """The rows of file ``uri`` at ``positions`` (in that order), or None if not kept."""
        key = (uri, projection)
        with self._lock:
            rows = self._files.get(key)
            if rows is None:
                return None
            self._files.move_to_end(key)
        return rows.take(pa.array(np.asarray(positions, dtype=np.int64)))

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._files)


_CACHES: weakref.WeakKeyDictionary[Any, RowCache] = weakref.WeakKeyDictionary()


def of(owner: Any) -> RowCache:
    """The cache of ``owner`` (a session: one per table handle), made on first use."""
    cache = _CACHES.get(owner)
    if cache is None:
        cache = _CACHES[owner] = RowCache()
    return cache
