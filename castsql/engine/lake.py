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
- :mod:`castsql.engine.guard` refuses every statement that names the catalog
  or calls a DuckLake function, as a second barrier with a clear message.

Measured (bench/read_bench.py, docs/PERFORMANCE.md): with 1% random deletes
scans cost 1.06-1.18x a raw ``read_parquet`` where an anti-join costs 2-38x;
against DuckDB's ``delta_scan`` on deletion vectors it is much faster for
counts and selective filters and at parity on full scans. Versions without deletes never come here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from collections.abc import Iterator, Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

from castsql.engine.duck import load_extension
from castsql.engine.guard import INTERNAL_CATALOG

CATALOG = INTERNAL_CATALOG
_META = f"__ducklake_metadata_{CATALOG}"


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


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

    def table(self, name: str, columns: Sequence[tuple[str, str | None]], files: list[tuple[str, BitMap]]) -> str:
        """A new DuckLake table of ``columns`` (name, DuckDB type: the files'
        own) over ``files`` (URI, deleted positions); returns its qualified name.

        Every call makes a table of its own (never replacing or dropping one),
        named after ``name``.
        """
        con = self.con
        table = f"{name}#{next(self._seq)}"
        qualified = f"{CATALOG}.main.{_ident(table)}"
        cols = ", ".join(f"{_ident(n)} {t}" for n, t in columns)
        with self._writable():
            con.execute(f"CREATE TABLE {qualified} ({cols})")
            con.execute("BEGIN")
            try:
                for uri, _ in files:
                    con.execute(f"CALL ducklake_add_data_files({_q(CATALOG)}, {_q(table)}, {_q(uri)})")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            with_deletes = [(uri, bm) for uri, bm in files if bm]
            if with_deletes:
                self._add_deletes(table, with_deletes)
        return qualified

    def _add_deletes(self, name: str, files: list[tuple[str, BitMap]]) -> None:
        con = self.con
        tid = con.execute(
            f"SELECT table_id FROM {_META}.ducklake_table WHERE table_name = ? AND end_snapshot IS NULL", [name]
        ).fetchone()[0]
        ids = dict(
            con.execute(
                f"SELECT path, data_file_id FROM {_META}.ducklake_data_file "
                "WHERE table_id = ? AND end_snapshot IS NULL",
                [tid],
            ).fetchall()
        )
        snap, schema_v, next_cat, next_file = con.execute(
            f"SELECT snapshot_id, schema_version, next_catalog_id, next_file_id FROM {_META}.ducklake_snapshot "
            "ORDER BY snapshot_id DESC LIMIT 1"
        ).fetchone()
        rows = []
        for i, (uri, bm) in enumerate(files):
            path = os.path.join(self.directory, f"del-{next_file + i}.parquet")
            arr = bm.to_array()
            pos = pa.Array.from_buffers(pa.uint32(), len(arr), [None, pa.py_buffer(arr)]).cast(pa.int64())
            pq.write_table(
                pa.table({"file_path": pa.array([uri] * len(arr), pa.string()), "pos": pos}),
                path,
                compression="zstd",
            )
            with open(path, "rb") as fh:
                fh.seek(-8, os.SEEK_END)
                footer, magic = struct.unpack("<I4s", fh.read(8))
            assert magic == b"PAR1"
            rows.append((next_file + i, tid, snap + 1, ids[uri], path, len(bm), os.path.getsize(path), footer))
        con.execute("BEGIN")
        try:
            con.execute(
                f"INSERT INTO {_META}.ducklake_snapshot VALUES (?, now(), ?, ?, ?)",
                [snap + 1, schema_v, next_cat, next_file + len(rows)],
            )
            con.execute(
                f"INSERT INTO {_META}.ducklake_snapshot_changes (snapshot_id, changes_made) VALUES (?, ?)",
                [snap + 1, f"deleted_from_table:{tid}"],
            )
            con.executemany(
                f"INSERT INTO {_META}.ducklake_delete_file (delete_file_id, table_id, begin_snapshot, end_snapshot, "
                "data_file_id, path, path_is_relative, format, delete_count, file_size_bytes, footer_size) "
                "VALUES (?, ?, ?, NULL, ?, ?, false, 'parquet', ?, ?, ?)",
                rows,
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
