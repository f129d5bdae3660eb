"""Positional deletes applied by DuckDB's own C++ reader, through DuckLake.

DuckLake (https://ducklake.select) is a table format whose catalog is a set of
SQL tables; its DuckDB extension applies per-file positional delete files
natively, per vector, inside the Parquet scan. CastSQL keeps a DuckLake catalog
per session and describes each version it reads with it: the version's data
files are registered where they are (nothing is copied), and each file's
deleted positions are written once as a small local Parquet delete file
(``file_path, pos``) and entered in the catalog's ``ducklake_delete_file``
table as the DuckLake 1.0 specification defines it.

The catalog must never be able to touch a table's files. DuckLake treats the
files of its catalog as its own: compaction rewrites them, expiring snapshots
schedules them for deletion and cleanup deletes what is scheduled. So:

- the catalog's metadata is a DuckDB file in the session's work directory,
  attached **read-only** whenever anything but this class runs: no statement
  can then change the catalog, and with it nothing can be rewritten, expired or
  scheduled. This class re-attaches it writable only for the few milliseconds
  it takes to register a version (``_writable``; ~2 ms each way);
- CastSQL never ends a data file or drops a table in it (every table gets a
  name of its own), so nothing it registered is ever scheduled for deletion:
  ``ducklake_cleanup_old_files`` only deletes scheduled files, and
  ``ducklake_delete_orphaned_files`` only looks inside the catalog's data path,
  which is the session's work directory;
- :mod:`castsql.engine.barrier.guard` refuses every statement that names the catalog
  or calls a DuckLake function, as a second barrier with a clear message.

Measured (bench/read_bench.py, docs/PERFORMANCE.md): with 1% random deletes
scans cost 1.06-1.18x a raw ``read_parquet`` where an anti-join costs 2-38x;
against DuckDB's ``delta_scan`` on deletion vectors it is much faster for
counts and selective filters and at parity on full scans. Versions without deletes never come here.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import hashlib
import itertools
import os
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import AbstractBitMap

from castsql.engine.duckdb import native
from castsql.engine.duckdb.duck import load_extension
from castsql.engine.sql import names
from castsql.engine.sql.quoting import ident as _ident
from castsql.engine.sql.quoting import sql_str as _q
from castsql.engine.sql.quoting import sql_value

CATALOG = names.LAKE_CATALOG
KEEP_VERSIONS = 16  # versions of a table remembered beyond those a view shows (``Lake.trim``)
_META = names.LAKE_METADATA


class Lake:
    """The session's DuckLake catalog; its metadata and delete files live in ``directory``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, directory: str) -> None:
        self.con = con
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        load_extension(con, "ducklake")
        self._metadata = os.path.join(directory, "catalog.ducklake")
        con.execute(
            f"ATTACH {_q('ducklake:' + self._metadata)} AS {CATALOG} "
            f"(DATA_PATH {_q(directory + '/')}, DATA_INLINING_ROW_LIMIT 0)"
        )
        self._reattach(read_only=True)
        self._seq = itertools.count()
        self._lineages: dict[Any, list[_Lineage]] = {}
        self._delete_files: dict[tuple[str, bytes], tuple[str, int, int, int]] = {}
        self._refs: Counter[tuple[str, bytes]] = Counter()  # registrations of each delete file

    def _reattach(self, *, read_only: bool) -> None:
        self.con.execute(f"DETACH {CATALOG}")
        mode = " (READ_ONLY)" if read_only else ""
        self.con.execute(f"ATTACH {_q('ducklake:' + self._metadata)} AS {CATALOG}{mode}")

    @contextlib.contextmanager
    def _writable(self) -> Iterator[None]:
        """The catalog attached writable for the duration; read-only again after, whatever happens."""
        self._reattach(read_only=False)
        try:
            yield
        finally:
            self._reattach(read_only=True)

    # ------------------------------------------------------------------ versions as snapshots

    def has(self, lineage_key: Any) -> bool:
        """Whether a version with ``lineage_key`` (table, physical schema) has a DuckLake table here."""
        return bool(self._lineages.get(lineage_key))

    def scan(
        self, lineage_key: Any, name: str, columns: Signature, version: int, files: dict[str, AbstractBitMap]
    ) -> str:
        """A table expression over ``files`` (URI -> deleted positions, none empty)
        as they are at ``version`` of one CastSQL table: ``<table> AT (VERSION => n)``.

        Versions of one table (and one physical schema, ``lineage_key``) share
        one DuckLake table: version N+1 is a DuckLake snapshot of the table of
        N in which only the files whose deletes changed get a new delete file
        (and new files are added). Files never leave a table (CastSQL never
        ends a data file in the catalog): a version without a file its table
        holds, or older than the table's newest snapshot, starts a table of its own.
        """
        lineages = self._lineages.setdefault(lineage_key, [])
        for lin in lineages:
            if version in lin.snapshots:
                return lin.at(version)
        best = None
        for lin in lineages:
            if lin.head < version and set(lin.files) <= set(files) and (best is None or lin.head > best.head):
                best = lin
        if best is not None and not _changed(best, files):
            # The same files with the same deletes (a version that only added
            # files without deletes, or changed other tables): the head's
            # snapshot, without re-attaching the catalog writable and back.
            best.snapshots[version] = best.snapshots[best.head]
            best.head = version
            return best.at(version)
        with self._writable():
            if best is None:
                best = self._new_lineage(name, columns)
                lineages.append(best)
            self._advance(best, version, files)
        return best.at(version)

    def _new_lineage(self, name: str, columns: Signature) -> _Lineage:
        table = names.internal("lake", next(self._seq), owner=name)
        qualified = f"{CATALOG}.main.{_ident(table)}"
        cols = ", ".join(f"{_ident(n)} {t}" for n, t in columns)
        self.con.execute(f"CREATE TABLE {qualified} ({cols})")
        tid = self.con.execute(
            f"SELECT table_id FROM {_META}.ducklake_table WHERE table_name = {_q(table)} AND end_snapshot IS NULL"
        ).fetchall()[0][0]
        return _Lineage(table, qualified, tid)

    def _advance(self, lin: _Lineage, version: int, files: dict[str, AbstractBitMap]) -> None:
        """Make ``version`` a snapshot of ``lin``: add the files it lacks, swap the
        delete files of those whose deletes changed."""
        con = self.con
        new = [u for u in files if u not in lin.files]
        if new:
            con.execute("BEGIN")
            try:
                for uri in new:
                    con.execute(f"CALL ducklake_add_data_files({_q(CATALOG)}, {_q(lin.table)}, {_q(uri)})")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            ids = dict(
                con.execute(
                    f"SELECT path, data_file_id FROM {_META}.ducklake_data_file WHERE table_id = {int(lin.table_id)}"
                ).fetchall()
            )
            for uri in new:
                lin.files[uri] = _LakeFile(ids[uri])
        changed = _changed(lin, files)
        snap, schema_v, next_cat, next_file = con.execute(
            f"SELECT snapshot_id, schema_version, next_catalog_id, next_file_id FROM {_META}.ducklake_snapshot "
            "ORDER BY snapshot_id DESC LIMIT 1"
        ).fetchall()[0]
        if not changed:
            lin.snapshots[version] = snap
            lin.head = version
            return
        rows, ended = [], []
        for i, (uri, bm) in enumerate(changed):
            lf = lin.files[uri]
            digest = _digest(bm)
            path, count, size, footer = self._delete_file(uri, bm, digest)
            if lf.delete_id is not None:
                assert lf.digest is not None  # a delete file registered is registered with its digest
                ended.append(lf.delete_id)
                lin.retired.append(((uri, lf.digest), lf.since, version))
            rows.append((next_file + i, lin.table_id, snap + 1, lf.data_file_id, path, count, size, footer))
            lin.files[uri] = _LakeFile(lf.data_file_id, digest, next_file + i, bm, version)
        con.execute("BEGIN")
        try:
            # Literals, not bound parameters: binding one imports pandas (quoting.py).
            con.execute(
                f"INSERT INTO {_META}.ducklake_snapshot VALUES "
                f"({_values([snap + 1])}, now(), {_values([schema_v, next_cat, next_file + len(rows)])})"
            )
            con.execute(
                f"INSERT INTO {_META}.ducklake_snapshot_changes (snapshot_id, changes_made) "
                f"VALUES ({_values([snap + 1, f'deleted_from_table:{lin.table_id}'])})"
            )
            if ended:
                con.execute(
                    f"UPDATE {_META}.ducklake_delete_file SET end_snapshot = {int(snap + 1)} "
                    f"WHERE delete_file_id IN ({_values(ended)})"
                )
            values = ", ".join(
                f"({_values(r[:3])}, NULL, {_values(r[3:5])}, false, 'parquet', {_values(r[5:])})" for r in rows
            )
            con.execute(
                f"INSERT INTO {_META}.ducklake_delete_file (delete_file_id, table_id, begin_snapshot, end_snapshot, "
                f"data_file_id, path, path_is_relative, format, delete_count, file_size_bytes, footer_size) "
                f"VALUES {values}"
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        lin.snapshots[version] = snap + 1
        lin.head = version

    def trim(self, lineage_key: Any, pinned: set[int]) -> None:
        """Forget all but the newest ``KEEP_VERSIONS`` versions of the tables of
        ``lineage_key`` and those in ``pinned`` (versions a view shows now), and
        remove the delete files no remembered version reads: a session that
        follows a busy table keeps a bounded set of files, however many
        versions it has seen. A forgotten version read again gets a table of
        its own (``scan``). The catalog keeps a few rows per version."""
        for lin in self._lineages.get(lineage_key, []):
            if len(lin.snapshots) <= KEEP_VERSIONS:
                continue
            newest = sorted(lin.snapshots)[-KEEP_VERSIONS:]
            for v in [v for v in lin.snapshots if v not in pinned and v < newest[0]]:
                del lin.snapshots[v]
            kept = sorted(lin.snapshots)
            still = []
            for ck, since, until in lin.retired:
                # Read by a kept version v only if since <= v < until.
                i = bisect.bisect_left(kept, since)
                if i < len(kept) and kept[i] < until:
                    still.append((ck, since, until))
                else:
                    self._release(ck)
            lin.retired = still

    def _release(self, ck: tuple[str, bytes]) -> None:
        self._refs[ck] -= 1
        if self._refs[ck] <= 0:
            del self._refs[ck]
            path = self._delete_files.pop(ck)[0]
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def _delete_file(self, uri: str, bm: AbstractBitMap, digest: bytes) -> tuple[str, int, int, int]:
        """A Parquet positional delete file (``file_path, pos``) for ``uri``'s
        deleted positions: written once, shared by every version and table
        whose deletes of that file are the same (counted in ``_refs``, removed
        when ``trim`` forgets the last version that reads it)."""
        ck = (uri, digest)
        self._refs[ck] += 1
        found = self._delete_files.get(ck)
        if found is not None:
            return found
        path = os.path.join(self.directory, f"del-{next(self._seq)}.parquet")
        arr = bm.to_array()
        pos = native.buffer_array(pa.uint32(), arr).cast(pa.int64())
        # Sorted positions delta-encode to a fraction of a zstd page and decode
        # 3x faster; DuckLake reads a file's delete file on every query, and
        # writing 200,000 positions takes 10 ms instead of 127 (docs/PERFORMANCE.md).
        pq.write_table(
            pa.table({"file_path": _repeated(uri, len(arr)), "pos": pos}),
            path,
            compression="none",
            use_dictionary=["file_path"],
            column_encoding={"pos": "DELTA_BINARY_PACKED"},
        )
        with open(path, "rb") as fh:
            fh.seek(-8, os.SEEK_END)
            footer, magic = struct.unpack("<I4s", fh.read(8))
        assert magic == b"PAR1"
        found = (path, len(bm), os.path.getsize(path), footer)
        self._delete_files[ck] = found
        return found


Signature = Sequence[tuple[str, str | None]]


def _repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times, as a dictionary array built from buffers
    (``pa.scalar`` of a string imports pandas: quoting.py)."""
    data = text.encode()
    offsets = array.array("i", [0, len(data)])
    dictionary = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    indices = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(bytes(4 * n))])
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _values(values: Sequence[Any]) -> str:
    return ", ".join(sql_value(v) for v in values)


def _changed(lin: _Lineage, files: dict[str, AbstractBitMap]) -> list[tuple[str, AbstractBitMap]]:
    """The files of ``files`` that ``lin`` lacks or holds with other deletes.
    Files whose deletes did not change keep the very bitmap object of the
    version before (the resolver shares them): no digest needed for those."""
    out = []
    for u, bm in files.items():
        lf = lin.files.get(u)
        if lf is None or (lf.bitmap is not bm and lf.digest != _digest(bm)):
            out.append((u, bm))
    return out


def _digest(bm: AbstractBitMap) -> bytes:
    return hashlib.blake2b(bm.serialize(), digest_size=16).digest()


@dataclass
class _LakeFile:
    data_file_id: int
    digest: bytes | None = None  # of the deleted positions its current delete file holds
    delete_id: int | None = None
    bitmap: AbstractBitMap | None = None  # those positions, as the version that registered them had them
    since: int = -1  # the version that registered its delete file


@dataclass
class _Lineage:
    """One DuckLake table and the CastSQL versions that are snapshots of it."""

    table: str
    qualified: str
    table_id: int
    head: int = -1  # newest version registered
    files: dict[str, _LakeFile] = field(default_factory=dict)
    snapshots: dict[int, int] = field(default_factory=dict)  # CastSQL version -> DuckLake snapshot
    # Delete files replaced by a newer one: ((uri, digest), first version, first version without it)
    retired: list[tuple[tuple[str, bytes], int, int]] = field(default_factory=list)

    def at(self, version: int) -> str:
        return f"{self.qualified} AT (VERSION => {self.snapshots[version]})"
