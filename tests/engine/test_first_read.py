"""The first read of a version with deletes (issue 21): no DuckLake set-up and
no pandas import for a script that reads a table once, the same rows as the
views a session reads from its second query on (the same, with deletes skipped
in DuckDB's reader; DuckLake's otherwise), and a bounded work directory for a
session that follows a busy table."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pyarrow as pa
import pytest
from paths import REPO
from pyroaring import BitMap

from castsql.engine import Session
from castsql.engine.duckdb.lake import KEEP_VERSIONS
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])
ROOT = REPO


@pytest.fixture
def table(storage):
    """Six files of 1,000 rows (row groups of 100): one clean, three with
    scattered positions deleted, one with a whole row group deleted and one
    with a key range deleted; returns the log and the live ids."""
    storage = storage.child("t")
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    for k in range(6):
        ids = list(range(k * 1000, k * 1000 + 1000))
        log.append(write_data_files(storage, pa.table({"id": ids, "v": ids}, schema=SCHEMA), row_group_size=100))
    files = sorted(log.state(log.latest()).entries(), key=lambda f: f.min["id"])
    rnd = random.Random(21)
    live = set(range(6000))
    records = []
    for f in files[1:4]:
        pos = rnd.sample(range(1000), 120)
        records.append(PositionDelete(f.path, None, BitMap(pos)))
        live -= {f.min["id"] + p for p in pos}
    records.append(RowGroupDelete(files[4].path, 3))
    live -= set(range(4300, 4400))
    records.append(KeyRangeDelete(files[5].path, 5250, 5520))
    live -= set(range(5250, 5521))
    log.delete(records)
    return log, files, live


def _ids(s: Session, sql: str) -> list[int]:
    return sorted(s.sql(sql).column("id").to_pylist())


QUERIES = [
    ("SELECT id FROM t", lambda i: True),
    ("SELECT id FROM t WHERE id >= 1950 AND id < 4420", lambda i: 1950 <= i < 4420),
    ("SELECT id FROM t WHERE v % 7 = 3", lambda i: i % 7 == 3),
]


@pytest.fixture(params=["reader", "ducklake"])
def reader(request, monkeypatch) -> bool:
    """Whether deletes are skipped in DuckDB's reader (castsql_scan); else
    versions a session reads again are settled in DuckLake."""
    if request.param == "ducklake":
        monkeypatch.setenv("CASTSQL_NATIVE_SCAN", "0")
    return request.param == "reader"


def _lake_tables(s: Session) -> int:
    return s.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'castsql_lake'").fetchone()[0]


@pytest.mark.parametrize("sql,keep", QUERIES, ids=["all", "range", "filter"])
def test_the_first_read_and_the_later_ones_give_the_live_rows(table, s3_config, sql, keep, reader):
    log, _, live = table
    want = sorted(i for i in live if keep(i))
    with Session(log.uri, s3=s3_config) as s:
        assert _ids(s, sql) == want  # provisional: no DuckLake
        assert s.views._lake is None
        assert _ids(s, sql) == want  # the table read again: DuckLake, unless the reader skips the deletes
        for _ in range(2):  # with CastSQL's extension a version's first view is provisional too
            assert _ids(s, "SELECT id FROM t") == sorted(live)
        assert _lake_tables(s) == (0 if reader else 1)
        assert (s.views._lake is None) == reader
        assert _ids(s, sql) == want


def test_a_fresh_process_reads_without_ducklake_or_pandas(table, s3_config, worker_env, reader):
    """What a script that opens a table and reads it once pays: neither
    DuckLake's set-up nor the pandas import DuckDB's client does on its first
    bound parameter (0.2-0.5 s together; docs/PERFORMANCE.md). Reading it
    again builds DuckLake where DuckDB's reader does not skip the deletes,
    still without pandas."""
    log, _, live = table
    child = (
        "import json, sys, traceback\n"
        "class Spy:  # where pandas is imported, for the assertion's message\n"
        "    where = None\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas' and Spy.where is None:\n"
        "            Spy.where = ''.join(traceback.format_stack(limit=12))\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import castsql\n"
        "t = castsql.open(sys.argv[1])\n"
        "a = t.to_arrow().column('id').to_pylist()\n"
        "b = t.to_arrow(filter='id >= 1950 AND id < 4420').column('id').to_pylist()\n"
        "lake = t._session.views._lake is not None\n"
        "c = t.to_arrow().column('id').to_pylist()  # read again: DuckLake\n"
        "built = t._session.views._lake is not None\n"
        "print(json.dumps({'a': sorted(a), 'b': sorted(b), 'c': sorted(c), 'pandas': Spy.where, 'lake': lake,\n"
        "                  'built': built}))\n"
    )
    env = {**os.environ, **worker_env, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", child, log.uri], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["a"] == sorted(live)
    assert got["b"] == sorted(i for i in live if 1950 <= i < 4420)
    assert got["c"] == sorted(live)
    assert got["pandas"] is None, got["pandas"]
    assert got["lake"] is False and got["built"] is not reader


def test_a_version_read_once_leaves_no_position_table_behind(tmp_path):
    st_path = tmp_path / "t"
    from castsql.storage import open_storage

    storage = open_storage(str(st_path))
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    log.append(write_data_files(storage, pa.table({"id": range(1000), "v": range(1000)}, schema=SCHEMA)))
    [f] = log.state(log.latest()).entries()
    with Session(log.uri) as s:
        dead: set[int] = set()
        for k in range(5):
            new = set(range(k * 7, 1000, 97)) - dead
            dead |= new
            log.delete([PositionDelete(f.path, None, BitMap(sorted(new)))])
            # A view of the latest version, replaced by the next: its temporary
            # position table goes with it, whether DuckLake took over or not.
            assert _ids(s, "SELECT id FROM t") == sorted(set(range(1000)) - dead)
            temp = s.con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone()[0]
            assert temp <= 1


def test_a_session_following_a_busy_table_keeps_a_bounded_work_directory(tmp_path, reader):
    from castsql.storage import open_storage

    storage = open_storage(str(tmp_path / "t"))
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    for k in range(2):
        ids = list(range(k * 1000, k * 1000 + 1000))
        log.append(write_data_files(storage, pa.table({"id": ids, "v": ids}, schema=SCHEMA)))
    files = log.state(log.latest()).entries()
    rnd = random.Random(4)
    live = set(range(2000))
    models: dict[int, set[int]] = {}
    lake = None
    with Session(log.uri) as s:
        for n in range(3 * KEEP_VERSIONS):
            f = rnd.choice(files)
            p = rnd.choice(sorted(i - f.min["id"] for i in live if f.min["id"] <= i <= f.max["id"]))
            log.delete([PositionDelete(f.path, None, BitMap([p]))])
            live = live - {f.min["id"] + p}
            models[log.latest_version()] = set(live)
            for _ in range(2):  # the second read settles the version in DuckLake (with CastSQL's extension)
                assert _ids(s, "SELECT id FROM t") == sorted(live)
            lake = os.path.join(s._workdir, "lake")
            if reader:
                assert not os.path.exists(lake) and s.views.bitmaps.sets <= 1  # few runs: a range filter
            elif n > KEEP_VERSIONS + 2:
                # One delete file per version the catalog remembers and per file, no more.
                assert len([x for x in os.listdir(lake) if x.startswith("del-")]) <= KEEP_VERSIONS + len(files)
        # Every version still reads its own rows: a forgotten one gets a DuckLake table of its own.
        for v in sorted(models)[:: KEEP_VERSIONS // 2]:
            assert _ids(s, f"SELECT id FROM t AS OF VERSION {v}") == sorted(models[v]), v
            assert _ids(s, f"SELECT id FROM t AS OF VERSION {v}") == sorted(models[v]), v


def test_a_fresh_process_audits_a_folded_table_without_pandas(storage, worker_env):
    """A table past its inline limit (its files in metadata objects, as any
    table that took many commits): a filtered query, the history, changes,
    a row's history and a diff in a fresh process, none importing pandas
    (pyarrow imports it on its first conversion of Python or NumPy values;
    castsql.format.arrays)."""
    from castsql.format.fold import FILES_INLINE_MAX

    storage = storage.child("folded")
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    for k in range(FILES_INLINE_MAX + 8):
        ids = list(range(k * 10, k * 10 + 10))
        log.append(write_data_files(storage, pa.table({"id": ids, "v": ids}, schema=SCHEMA)))
    f = next(e for e in log.state(log.latest()).entries() if e.min["id"] == 100)
    log.delete([PositionDelete(f.path, None, BitMap([1, 2]))])
    last = log.latest().version
    assert log.latest().format_version == 2 and log.latest().file_objects  # folded
    child = (
        "import json, sys, traceback\n"
        "class Spy:\n"
        "    where = None\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas' and Spy.where is None:\n"
        "            Spy.where = ''.join(traceback.format_stack(limit=14))\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import castsql\n"
        "c = castsql.connect(sys.argv[1])\n"
        "last = int(sys.argv[2])\n"
        "out = [c.sql(q).num_rows for q in (\n"
        "    'SELECT * FROM folded WHERE id BETWEEN 35 AND 44',\n"
        "    'DESCRIBE HISTORY folded',\n"
        "    f'SELECT * FROM table_changes(\\'folded\\', {last - 1})',\n"
        "    'SELECT * FROM table_row_history(\\'folded\\', 5)',\n"
        "    f'SELECT * FROM table_diff(\\'folded\\', 1, {last})')]\n"
        "print(json.dumps({'rows': out, 'pandas': Spy.where}))\n"
    )
    env = {**os.environ, **worker_env, "PYTHONPATH": str(ROOT)}
    uri = storage.root.rsplit("/", 1)[0]
    out = subprocess.run([sys.executable, "-c", child, uri, str(last)], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    n = FILES_INLINE_MAX + 8
    assert got["rows"] == [10, last + 1, 10 + 2, 1, (n - 1) * 10 - 2]
    assert got["pandas"] is None, got["pandas"]
