"""DuckDB threads as requests in flight, only while a query has objects to fetch.

DuckDB 1.5 reads a remote file on the thread that scans it, so a session on
S3 needs many threads for a cold read of many files or row groups (one round
trip each, waiting on the network). Once read, a data file's blocks are in
DuckDB's external file cache and its size in the HTTP metadata cache (data
files never change: FORMAT.md §2), so a warm query makes no data request, and
on a machine with few cores the extra threads only cost: a warm aggregate of a
stream's table took 15.4 ms on 16 threads against 11.0 ms on 2
(docs/OBJECT_STORES.md, "Threads are requests in flight").

So the session counts, per query, the row groups of remote data files its
views and audits read for the first time, and runs the query on many threads
only when there are more of them than cores. Changing the setting costs
~1 ms, so it changes only when the answer does.

Example::

    >>> import duckdb
    >>> con = duckdb.connect(config={"threads": 2})
    >>> t = RemoteThreads(con, cores=2, most=16)
    >>> t.note([("s3://b/t/a.parquet", 8)]); t.settle(); t.now
    16
    >>> t.note([("s3://b/t/a.parquet", 8)]); t.settle(); t.now
    2
    >>> _ = con.execute("SET threads = 3")  # the user's: kept
    >>> t.note([("s3://b/t/b.parquet", 8)]); t.settle(); t.released
    True
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb

_KEPT = 1_000_000  # URIs remembered as read; past this the set starts again (a re-read is a cold read)


class RemoteThreads:
    """Sets a connection's threads per query: ``most`` when it reads more new
    row groups than ``cores``, else ``cores``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, cores: int, most: int) -> None:
        self.con = con
        self.cores = cores
        self.most = max(cores, most)
        self.now = cores
        self.released = False  # threads set by someone else: left alone from then on
        self._read: set[str] = set()
        self._new = 0

    def fix(self) -> None:
        """Run every query on ``most`` threads from now on (a safe session,
        whose settings are locked once it starts)."""
        if not self.released:
            self.con.execute(f"SET threads = {self.most}")
            self.now = self.most
            self.released = True

    def release(self) -> None:
        """Never choose the threads again (a user set them)."""
        self.released = True

    def note(self, files: Iterable[tuple[str, int]]) -> None:
        """Files (URI, row groups) a view or audit of the coming query reads."""
        read = self._read
        for uri, groups in files:
            if uri not in read:
                if len(read) >= _KEPT:
                    read.clear()
                read.add(uri)
                self._new += max(1, groups)

    def settle(self) -> None:
        """Set the threads for the query about to run, from what was noted
        since the last; never again once something else set them (the
        session releases them when a user's statement sets them; a value
        other than the last one set here is taken as someone else's too)."""
        want = self.most if self._new > self.cores else self.cores
        self._new = 0
        if want != self.now and not self.released:
            if int(self.con.execute("SELECT current_setting('threads')").fetchall()[0][0]) != self.now:
                self.released = True
                return
            self.con.execute(f"SET threads = {want}")
            self.now = want
