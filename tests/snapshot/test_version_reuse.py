"""A new version reuses what the version before it built (issue 13): only the
files whose deletes changed get a new delete file, every version of a table is
a snapshot of one DuckLake table, and every version still reads exactly its
rows, whichever order a session visits them in."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from pyroaring import BitMap

from castsql.engine import Session
from castsql.format import Change, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


def _delete_files(s: Session) -> set[str]:
    lake = os.path.join(s._workdir, "lake")
    return {n for n in os.listdir(lake) if n.startswith("del-")} if os.path.isdir(lake) else set()


def _tables(s: Session) -> int:
    return s.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'castsql_lake'").fetchone()[0]


@pytest.fixture(autouse=True)
def ducklake(monkeypatch):
    """DuckLake holds the versions whose deletes DuckDB's reader does not skip
    itself: where castsql_scan is not built, or their bitmaps would pass its
    memory bound. Its path, tested here, is forced by not loading castsql_scan
    (with it, versions never reach DuckLake: test_native_deletes.py)."""
    monkeypatch.setenv("CASTSQL_NATIVE_SCAN", "0")


@pytest.fixture
def table(tmp_path):
    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, SCHEMA, primary_key="id")
    for k in range(4):
        ids = list(range(k * 1000, k * 1000 + 1000))
        log.append(write_data_files(st, pa.table({"id": ids, "v": ids}, schema=SCHEMA), row_group_size=100))
    files = log.state(log.latest()).entries()
    live = set(range(4000))
    rnd = random.Random(5)
    for f in files:  # every file gets some deletes: version 5..8
        pos = rnd.sample(range(1000), 50)
        log.delete([PositionDelete(f.path, None, BitMap(pos))])
        live -= {f.min["id"] + p for p in pos}
    return log, files, live


def test_a_one_row_delete_writes_one_delete_file_and_no_new_table(table):
    log, files, live = table
    with Session(log.uri) as s:
        for _ in range(2):  # the first read anti-joins, the second builds the DuckLake table
            assert s.sql("SELECT count(id) AS n FROM t")["n"][0].as_py() == len(live)
        before_files, before_tables = _delete_files(s), _tables(s)
        assert len(before_files) == 4 and before_tables == 1
        models = {log.latest_version(): set(live)}
        for i in range(3):
            f = files[i]
            log.delete([PositionDelete(f.path, None, BitMap([999]))])
            live = live - {f.min["id"] + 999}
            models[log.latest_version()] = set(live)
            # Read twice: where CastSQL's extension is built a new version's
            # first read binds its bitmaps, the second settles it in DuckLake.
            for _ in range(2):
                got = s.sql("SELECT id FROM t").column("id").to_pylist()
                assert sorted(got) == sorted(live)
            assert len(_delete_files(s)) == len(before_files) + i + 1  # only the file that changed
            assert _tables(s) == 1  # the same DuckLake table, one snapshot more
        for v, ids in models.items():  # every version still reads its own rows
            got = s.sql(f"SELECT id FROM t AS OF VERSION {v}").column("id").to_pylist()
            assert sorted(got) == sorted(ids), v


def test_an_older_version_after_newer_ones_and_a_compaction_read_right(table):
    log, files, live = table
    with Session(log.uri) as s:
        latest = log.latest_version()
        for _ in range(2):  # the first read anti-joins, the second builds the DuckLake table
            assert s.sql("SELECT count(id) AS n FROM t")["n"][0].as_py() == len(live)
        # Version 5 (one file with deletes) after version 8: a table of its own.
        for _ in range(2):  # the second read settles it (a provisional first one with CastSQL's extension)
            v5 = s.sql("SELECT count(id) AS n FROM t AS OF VERSION 5")["n"][0].as_py()
            assert v5 == 4000 - 50
        assert _tables(s) == 2
        # A version without one of the files the lineage holds: a new table too.
        [tomb] = log.manifest(5).change.added_tombstones  # the deletes of files[0]
        m = log.commit(Change("COMPACT", remove_files=(files[0].path,), remove_tombstones=(tomb,), read_version=latest))
        gone = set(range(files[0].min["id"], files[0].max["id"] + 1))
        assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live - gone)
        assert sorted(s.sql(f"SELECT id FROM t AS OF VERSION {latest}").column("id").to_pylist()) == sorted(live)
        assert m.version == latest + 1


def test_selective_queries_on_files_with_deletes_read_the_right_rows(table):
    log, files, live = table
    with Session(log.uri) as s:
        for lo, hi in ((0, 99), (950, 1049), (2500, 2600), (3999, 3999), (10, 3990)):
            q = f"SELECT id FROM t WHERE id BETWEEN {lo} AND {hi}"
            got = s.sql(q).column("id").to_pylist()
            assert sorted(got) == sorted(i for i in live if lo <= i <= hi), (lo, hi)
        # ... and with whole row groups gone too.
        log.delete([RowGroupDelete(files[1].path, 3)])
        live -= set(range(files[1].min["id"] + 300, files[1].min["id"] + 400))
        got = s.sql("SELECT id FROM t WHERE id BETWEEN 1250 AND 1450").column("id").to_pylist()
        assert sorted(got) == sorted(i for i in live if 1250 <= i <= 1450)
