"""Rows a version changed, read back from the files it names: what the
change-file tests (test_change_data, test_row_cache) compare a version's
change file with."""

from __future__ import annotations

import pyarrow as pa

from castsql.format import TableLog
from castsql.write.preimages import read_preimages


def added_rows(log: TableLog, v: int) -> pa.Table:
    """The rows of the data files version ``v`` added, with their file and position."""
    parts = []
    for f in log.manifest(v).change.added_files:
        t = read_preimages(log.storage, f)
        t = t.append_column("_castsql_file", pa.array([f.path] * t.num_rows))
        parts.append(t.append_column("_castsql_pos", pa.array(range(t.num_rows), pa.int64())))
    return pa.concat_tables(parts)


def by_place(t: pa.Table) -> list[dict]:
    """``t``'s rows ordered by (file, position): how two answers are compared."""
    return sorted(t.to_pylist(), key=lambda r: (r["_castsql_file"], r["_castsql_pos"]))
