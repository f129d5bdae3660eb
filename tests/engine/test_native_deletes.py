"""CastSQL's DuckDB extensions (castsql/engine/duckdb/native): deleted positions held
as bitmaps and skipped inside DuckDB's Parquet reader (castsql_scan), or tested
in the scan's pipeline (castsql_live alone); the same rows as the anti-join
they replace, out of reach of user SQL, and their memory freed with the views
that use them."""

from __future__ import annotations

import gc
import os
import random

import pyarrow as pa
import pytest
from pyroaring import BitMap

from castsql.engine import Session
from castsql.engine import planner as planner_module
from castsql.engine import views as views_module
from castsql.engine.duckdb import native
from castsql.engine.duckdb.duck import new_connection
from castsql.errors import CastSQLError
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


@pytest.fixture
def table(storage):
    """Five files of 2,000 ids (row groups of 250), four with 40% of their
    positions deleted at random (more runs per row group than a range filter
    takes); returns the log and the live ids."""
    return _table(storage.child("t"))


@pytest.fixture
def local_table(tmp_path):
    return _table(open_storage(str(tmp_path / "t")))


def _table(storage):
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    for k in range(5):
        ids = list(range(k * 2000, k * 2000 + 2000))
        log.append(write_data_files(storage, pa.table({"id": ids, "v": ids}, schema=SCHEMA), row_group_size=250))
    files = sorted(log.state(log.latest()).entries(), key=lambda f: f.min["id"])
    rnd = random.Random(7)
    live = set(range(10_000))
    records = []
    for f in files[1:]:
        pos = rnd.sample(range(2000), 800)
        records.append(PositionDelete(f.path, None, BitMap(pos)))
        live -= {f.min["id"] + p for p in pos}
    log.delete(records)
    return log, live


# Ranges reaching files with deletes: one row group, a few, several files.
SELECTIVE = [(lo, lo + span) for lo, span in [(1990, 40), (2100, 300), (3000, 2500), (5100, 4900)]]


def _pruned_sql(s: Session, sql: str) -> str:
    """The body of the pruned view ``sql`` reads."""
    view = s.prepare(sql).split("FROM ", 1)[1].split()[0].strip('"')
    return s.con.execute(f"SELECT sql FROM duckdb_views() WHERE view_name = '{view}'").fetchone()[0]


def test_setup_built_the_extension_and_sessions_load_it():
    """scripts/setup builds it where a C++ compiler exists, as on every
    machine the README's commands set up; without it CastSQL falls back."""
    assert native.extension() is not None, "run `python -m castsql.engine.duckdb.native.build` (scripts/setup does)"
    assert native.SCAN_BUILT.exists(), "castsql_scan did not build: see scripts/setup's output"
    con = new_connection()
    assert native.loaded(con) and native.scans(con)


# How a view applies scattered deletes: inside the reader, a filter in the
# pipeline (castsql_scan not loaded), an anti-join (no extension at all).
MODES = {
    "reader": ({}, '"castsql/parquet"'),
    "filter": ({"CASTSQL_NATIVE_SCAN": "0"}, '"castsql/live"'),
    "anti-join": ({"CASTSQL_NATIVE": "0"}, "ANTI JOIN"),
}


@pytest.fixture(params=list(MODES))
def mode(request, monkeypatch):
    env, marker = MODES[request.param]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return marker


def test_selective_reads_give_the_live_rows_every_way(table, s3_config, mode):
    log, live = table
    for lo, hi in SELECTIVE:
        want = sorted(i for i in live if lo <= i < hi)
        sql = f"SELECT id FROM t WHERE id >= {lo} AND id < {hi}"
        with Session(log.uri, s3=s3_config) as s:
            assert mode in _pruned_sql(s, sql)
            assert sorted(s.sql(sql).column("id").to_pylist()) == want
            n = s.sql(f"SELECT count(*) AS n FROM t WHERE id >= {lo} AND id < {hi}").column("n").to_pylist()
            assert n == [len(want)]


def test_whole_versions_read_the_live_rows_every_way(table, s3_config, mode):
    """count(*) included: read_parquet answers it from the footers' row
    counts, which know nothing of deletes."""
    log, live = table
    with Session(log.uri, s3=s3_config) as s:
        for _ in range(2):  # provisional, then (without castsql_scan) settled in DuckLake
            assert s.sql("SELECT count(*) AS n FROM t").column("n").to_pylist() == [len(live)]
            assert s.sql("SELECT sum(v) AS n FROM t").column("n").to_pylist() == [sum(live)]
            assert sorted(s.sql("SELECT id FROM t WHERE v % 7 = 3").column("id").to_pylist()) == sorted(
                i for i in live if i % 7 == 3
            )


@pytest.mark.parametrize("new_rows", [30, 30_000], ids=["small-new-files", "large-new-files"])
def test_files_without_deletes_beside_ones_with_deletes(tmp_path, new_rows):
    """A stream's shape: a base file with deletes and new files without. Small
    new files join the base's scan (one scan, no bitmap of theirs); larger
    ones stay a plain read_parquet, whose count(*) comes from their footers.
    Either way every query sees exactly the live rows."""
    storage = open_storage(str(tmp_path / "t"))
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    base = write_data_files(storage, pa.table({"id": range(20_000), "v": range(20_000)}, schema=SCHEMA))
    log.append(base)
    log.delete([PositionDelete(base[0].path, None, BitMap(range(0, 20_000, 3)))])
    live = {i for i in range(20_000) if i % 3}
    for k in range(3):
        ids = range(100_000 + k * new_rows, 100_000 + (k + 1) * new_rows)
        log.append(write_data_files(storage, pa.table({"id": ids, "v": ids}, schema=SCHEMA)))
        live |= set(ids)
    with Session(log.uri) as s:
        for _ in range(2):  # provisional, then settled
            assert s.sql("SELECT count(*) AS n, sum(v) AS s FROM t").to_pylist() == [{"n": len(live), "s": sum(live)}]
            assert sorted(s.sql("SELECT id FROM t WHERE v % 1000 = 1").column("id").to_pylist()) == sorted(
                i for i in live if i % 1000 == 1
            )
        body = s.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 't'").fetchone()[0]
        assert ("read_parquet" in body) == (new_rows > 20_000)


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT "castsql/alloc"(1, 0::UBIGINT, 10)',
        'SELECT "castsql/forget"(1)',
        'SELECT count(*) FROM t WHERE "castsql/live"(1, 0::UBIGINT, id)',
        "SET allow_unsigned_extensions = false",
        "LOAD 'castsql/engine/duckdb/native/castsql_live.duckdb_extension'",
        "SELECT count(*) FROM \"castsql/parquet\"(['x.parquet'], castsql_set = 1)",
    ],
)
def test_sql_cannot_reach_the_extension(local_table, sql):
    """Its functions would let a query un-delete rows of another view (or
    delete them): the guard refuses any name under castsql/, and loading."""
    log, live = local_table
    with Session(log.uri) as s:
        with pytest.raises(CastSQLError):
            s.sql(sql)
        assert s.sql("SELECT count(*) AS n FROM t WHERE id < 4000").column("n").to_pylist() == [
            sum(1 for i in live if i < 4000)
        ]


def bitmaps_held() -> int:
    return new_connection().execute('SELECT "castsql/bitmaps"()').fetchone()[0]


@pytest.fixture
def still_gc():
    """No garbage collection while a test counts the process's bitmaps: a
    session an earlier test dropped would free its own in the middle."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_bitmaps_are_freed_with_their_views(local_table, monkeypatch, still_gc):
    """They live in the process, outside DuckDB's memory limit: a session
    holds those of the views it keeps, and none once closed."""
    log, live = local_table
    monkeypatch.setattr(planner_module, "_PRUNED_VIEWS", 2)
    before = bitmaps_held()
    with Session(log.uri) as s:
        s.views.bitmaps.idle = 0  # no bitmap kept for a later version
        for lo in range(2000, 9000, 500):
            got = s.sql(f"SELECT count(*) AS n FROM t WHERE id >= {lo} AND id < {lo + 400}").column("n")
            assert got.to_pylist() == [sum(1 for i in live if lo <= i < lo + 400)]
        # Two pruned views of one file each: a set and a bitmap each.
        assert s.views.bitmaps.sets == 2
        assert bitmaps_held() - before == 4
    assert bitmaps_held() == before


@pytest.mark.parametrize("scan", [True, False], ids=["reader", "filter"])
def test_the_first_query_after_a_commit_binds_only_what_changed(local_table, still_gc, scan, monkeypatch):
    """A one-row delete: the next version's first query binds one new bitmap
    (the others are the version before's) and writes nothing to DuckLake's
    catalog. Skipped inside the reader, versions never go to DuckLake; with
    the pipeline filter, reading a version again settles it there. Every
    version reads right."""
    if not scan:
        monkeypatch.setenv("CASTSQL_NATIVE_SCAN", "0")
    log, live = local_table
    files = sorted(log.state(log.latest()).entries(), key=lambda f: f.min["id"])
    with Session(log.uri) as s:
        catalog_file = os.path.join(s._workdir, "lake", "catalog.ducklake")

        def catalog() -> int | None:
            return os.stat(catalog_file).st_mtime_ns if os.path.exists(catalog_file) else None

        for _ in range(2):  # provisional, then settled (without castsql_scan)
            assert s.sql("SELECT count(id) AS n FROM t").column("n").to_pylist() == [len(live)]
        assert (catalog() is None) == scan
        rnd = random.Random(3)
        for k in range(4):
            f = files[1 + k]
            p = rnd.choice([i - f.min["id"] for i in live if f.min["id"] <= i <= f.max["id"]])
            log.delete([PositionDelete(f.path, None, BitMap([p]))])
            live = live - {f.min["id"] + p}
            held, before = bitmaps_held(), catalog()
            assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live)
            # The changed file's bitmap, and the view's set (in the reader, in
            # place of the version before's; else that one's went with DuckLake).
            assert bitmaps_held() - held == (1 if scan else 2)
            assert s.views.bitmaps.sets == 1
            assert catalog() == before
            assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live)  # settled, or as it was
            assert (catalog() is None) == scan


def test_a_session_dropped_without_close_frees_its_bitmaps(local_table, still_gc):
    log, live = local_table
    before = bitmaps_held()
    s = Session(log.uri)
    assert s.sql("SELECT count(*) AS n FROM t WHERE id >= 2100 AND id < 2400").column("n").to_pylist() == [
        sum(1 for i in live if 2100 <= i < 2400)
    ]
    assert bitmaps_held() > before
    del s
    gc.collect()
    assert bitmaps_held() == before


@pytest.mark.parametrize(
    "rows,density",
    [((1 << 24) + 50_000, 0.0005), (50_000, 0.001), (50_000, 0.2)],
    ids=["large-sparse", "small-sparse", "dense"],
)
def test_bitmaps_grown_version_by_version_test_exactly_their_positions(rows, density, still_gc):
    """A file's deletes grow with each version; each new bitmap is the one
    before it plus the new positions (copied, then merged in order). Every
    row's answer is checked, for the sorted-array form (a file past 2**24
    rows with sparse deletes) and the bitset form."""
    rnd = random.Random(11)
    con = new_connection()
    bitmaps = native.Bitmaps(con)
    dead = BitMap(rnd.sample(range(rows), int(rows * density)))
    sets = []
    for step in range(5):
        if step:
            dead = dead | BitMap(rnd.sample(range(rows), 1 + step * 7))  # anywhere: before and after the old ones
        held = bitmaps_held()
        set_id = bitmaps.bind([("a.parquet", 1000, BitMap([1])), ("b.parquet", rows, dead)])
        if step:
            assert bitmaps_held() - held == 2  # b's new bitmap and the set; a's is shared
        got = con.execute(
            f'SELECT i FROM range({rows}) t(i) WHERE NOT "castsql/live"({set_id}, 1::UBIGINT, i) ORDER BY i'
        ).fetchall()
        assert [i for (i,) in got] == list(dead)
        sets.append(set_id)
    for set_id in sets:
        bitmaps.forget(set_id)
    bitmaps.close()
    assert bitmaps.sets == 0


def test_deletes_past_the_bound_are_anti_joined_as_before(local_table, monkeypatch):
    """The extension's memory is outside DuckDB's limit: a view whose bitmaps
    would pass ``_NATIVE_BYTES`` anti-joins instead, with the same rows, and a
    new version of a table DuckLake holds goes straight to DuckLake."""
    log, live = local_table
    monkeypatch.setattr(views_module, "_NATIVE_BYTES", 0)
    files = sorted(log.state(log.latest()).entries(), key=lambda f: f.min["id"])
    with Session(log.uri) as s:
        held = s.views.bitmaps.sets
        assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live)
        sql = s.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 't'").fetchone()[0]
        assert "ANTI JOIN" in sql and '"castsql/live"' not in sql and '"castsql/parquet"' not in sql
        assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live)  # settled
        f = files[1]
        p = next(i - f.min["id"] for i in sorted(live) if f.min["id"] <= i <= f.max["id"])
        log.delete([PositionDelete(f.path, None, BitMap([p]))])
        live = live - {f.min["id"] + p}
        assert sorted(s.sql("SELECT id FROM t").column("id").to_pylist()) == sorted(live)
        sql = s.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 't'").fetchone()[0]
        assert "castsql_lake" in sql
        assert s.views.bitmaps.sets == held


def test_a_failed_build_keeps_the_last_good_one(monkeypatch):
    """A compiler that fails: an error naming the command, the extension
    that was built before untouched, no half-written file left."""
    import subprocess

    from castsql.engine.duckdb.native import build

    before = native.BUILT.read_bytes()
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(subprocess.CalledProcessError):
        build.build(force=True)
    assert native.BUILT.read_bytes() == before
    assert not native.BUILT.with_suffix(".part").exists()
    before = native.SCAN_BUILT.read_bytes()
    with pytest.raises(subprocess.CalledProcessError):
        build.build_scan(force=True)
    assert native.SCAN_BUILT.read_bytes() == before
    assert not native.SCAN_BUILT.with_suffix(".part").exists()


@pytest.mark.parametrize(
    "rows,group,density",
    [(50_003, 997, 0.01), (50_003, 997, 0.3), ((1 << 24) + 4_099, 1 << 20, 0.0005)],
    ids=["sparse-bitset", "dense-bitset", "sorted-array"],
)
def test_the_reader_skips_exactly_the_deleted_positions(tmp_path, rows, group, density, still_gc):
    """``"castsql/parquet"`` straight: row groups whose sizes are no multiple of
    a vector or a bitmap word, scanned by several threads, a file with no
    bitmap beside one with; a column filter after the deletes; and both of
    the extension's forms (a file past 2**24 rows with sparse deletes keeps a
    sorted array). count(*) and the positions that come out are checked."""
    import numpy as np
    import pyarrow.parquet as pq

    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    # A small column that repeats: a 2**24-row file stays a few MB.
    pq.write_table(pa.table({"x": np.arange(rows, dtype=np.int64) % 5}), a, row_group_size=group)
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.int64) % 5}), b)
    rnd = np.random.default_rng(5)
    dead = BitMap(rnd.choice(rows, int(rows * density), replace=False).tolist()) | BitMap([0, rows - 1])
    con = new_connection(threads=4)
    bitmaps = native.Bitmaps(con)
    set_id = bitmaps.bind([(a, rows, dead)])  # b (index 1): no bitmap, no deletes
    scan = f"\"castsql/parquet\"(['{a}', '{b}'], castsql_set = {set_id})"
    live = rows - len(dead)
    assert con.execute(f"SELECT count(*) FROM {scan}").fetchone()[0] == live + 1000
    total = rows * (rows - 1) // 2 - sum(dead)
    got = con.execute(f"SELECT sum(file_row_number), count(*) FROM {scan} WHERE file_index = 0").fetchone()
    assert got == (total, live)
    kept = [p for p in range(0, rows, 5) if p not in dead]
    got = con.execute(f"SELECT count(*), sum(file_row_number) FROM {scan} WHERE x = 0 AND file_index = 0").fetchone()
    assert got == (len(kept), sum(kept))
    # The positions themselves, around the row groups' edges.
    edges = sorted({p for g in range(0, rows, group) for p in range(max(g - 70, 0), min(g + 70, rows))})
    got = con.execute(
        f"SELECT file_row_number FROM {scan} WHERE file_index = 0 AND file_row_number IN ({','.join(map(str, edges))})"
    ).fetchall()
    assert sorted(p for (p,) in got) == [p for p in edges if p not in dead]
    with pytest.raises(Exception, match="no such set"):
        con.execute(f"SELECT count(*) FROM \"castsql/parquet\"(['{a}'], castsql_set = {set_id + 10_000})").fetchall()
    bitmaps.close()


def test_whole_row_groups_are_filled_as_runs_and_skipped(tmp_path, still_gc):
    """Deletes that are a few runs (whole row groups) fill a bitset a word at
    a time instead of marking each position; the reader then skips exactly
    those rows, and a later version's clone adds scattered ones to them."""
    import numpy as np
    import pyarrow.parquet as pq

    rows, group = 50_003, 997
    a = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": np.arange(rows, dtype=np.int64)}), a, row_group_size=group)
    dead = BitMap(range(group * 3, group * 5)) | BitMap(range(group * 9, group * 10 + 1)) | BitMap([rows - 1])
    con = new_connection()
    bitmaps = native.Bitmaps(con)
    for _ in range(2):  # fresh (filled), then a clone plus marks
        set_id = bitmaps.bind([(a, rows, dead)])
        got = con.execute(f"SELECT x FROM \"castsql/parquet\"(['{a}'], castsql_set = {set_id}) ORDER BY x").fetchall()
        assert [x for (x,) in got] == [x for x in range(rows) if x not in dead]
        dead = dead | BitMap([5, 70, 40_000])
    bitmaps.close()
