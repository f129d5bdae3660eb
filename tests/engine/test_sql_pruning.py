"""SQL queries read only the data files whose manifest min/max can match their
WHERE, and get exactly the rows they would get from every file."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from castsql.engine import Session
from castsql.engine import planner as planner_module
from castsql.engine import views as views_module
from castsql.engine.duckdb import native
from castsql.engine.views import sql_str
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.storage import open_storage

T0 = datetime(2025, 1, 1, tzinfo=UTC)
FILES, ROWS = 10, 10  # file k holds ids 10k .. 10k+9


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "s": pa.array([f"k{i:03d}" for i in ids], pa.string()),
            "ts": pa.array([T0 + timedelta(hours=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "d": pa.array([(T0 + timedelta(days=i)).date() for i in ids], pa.date32()),
            # NaN sorts above every number in DuckDB and is in no statistic.
            "x": pa.array([float("nan") if i % 10 == 9 else float(i) for i in ids], pa.float64()),
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pruning") / "t")
    st_ = open_storage(root)
    log = TableLog.create(st_, rows([]).schema, primary_key="id")
    for k in range(FILES):
        log.append(write_data_files(st_, rows(range(k * ROWS, (k + 1) * ROWS)), log.latest().schema))
    return log


@pytest.fixture(scope="module")
def session(table):
    with Session(table.uri) as s:
        yield s


def every_file(log: TableLog) -> str:
    """The reference: DuckDB reading every data file of the latest version."""
    files = ", ".join(sql_str(log.storage.uri(f.path)) for f in log.latest().data_files)
    return f"read_parquet([{files}])"


def files_read(session: Session, sql: str) -> int:
    plan = session.sql("EXPLAIN ANALYZE " + sql).column(1)[0].as_py()
    return sum(int(n) for n in re.findall(r"Total Files Read:\s*(\d+)", plan))


def test_a_selective_query_reads_only_the_files_that_can_match(session):
    assert files_read(session, "SELECT count(*) FROM t") == FILES
    assert files_read(session, "SELECT count(*) FROM t WHERE id BETWEEN 25 AND 34") == 2
    assert session.sql("SELECT count(*) AS n FROM t WHERE id BETWEEN 25 AND 34").to_pylist() == [{"n": 10}]
    assert files_read(session, "SELECT * FROM t WHERE s >= 'k095'") == 1
    assert files_read(session, "SELECT * FROM t WHERE ts < TIMESTAMPTZ '2025-01-01 05:00:00+00'") == 1
    assert files_read(session, "SELECT * FROM t WHERE d = DATE '2025-01-15'") == 1
    assert files_read(session, "SELECT * FROM t WHERE id IN (3, 12)") == 2
    assert files_read(session, "SELECT * FROM t WHERE id > 1000") == 0
    assert session.sql("SELECT * FROM t WHERE id > 1000").num_rows == 0


def test_time_travel_and_self_joins_prune_each_reference(session):
    assert files_read(session, "SELECT * FROM t AS OF VERSION 3 WHERE id < 5") == 1
    q = "SELECT count(*) AS n FROM t a, t AS OF VERSION 4 b WHERE a.id < 15 AND b.id >= 30"
    assert files_read(session, q) == 2 + 1  # a: files 0-1; b (version 4: files 0-3): file 3
    assert session.sql(q).to_pylist() == [{"n": 15 * 10}]


def test_what_cannot_be_proved_is_not_pruned(session, table):
    # Floats: DuckDB sorts NaN above every number, and statistics leave NaN
    # out, so CastSQL never prunes on a float column, and its files carry no
    # float statistics for DuckDB's row-group skipping to drop the NaN rows by.
    q = "SELECT count(*) AS n FROM {} WHERE x > 1000"
    assert "castsql/p/" not in session.prepare(q.format("t"))
    nans = [{"n": FILES}]  # one NaN per file
    assert session.sql(q.format("t")).to_pylist() == nans
    assert session.con.sql(q.format(every_file(table))).to_arrow_table().to_pylist() == nans
    assert session.sql("SELECT count(*) AS n FROM t WHERE x = 'NaN'::DOUBLE").to_pylist() == nans
    # A CTE named like the table is not the table.
    assert session.sql("WITH t AS (SELECT 1000 AS id) SELECT id FROM t WHERE id = 1000").to_pylist() == [{"id": 1000}]
    # Outer joins and OR are left alone, and still right.
    q = "SELECT count(*) AS n FROM range(3) r(i) LEFT JOIN t ON t.id = r.i WHERE t.id IS NULL OR t.id > 50"
    assert session.sql(q).to_pylist() == [{"n": 0}]
    # A non-integer constant against an integer column: id > 5.5 must keep id 6.
    assert session.sql("SELECT min(id) AS m FROM t WHERE id > 9.5").to_pylist() == [{"m": 10}]
    # An unqualified column of an outer query is not this table's.
    q = "SELECT count(*) AS n FROM (SELECT 95 AS k) o WHERE EXISTS (SELECT 1 FROM t WHERE t.id = k)"
    assert session.sql(q).to_pylist() == [{"n": 1}]


def test_time_zones_mean_what_they_mean_in_the_query(table):
    with Session(table.uri) as s:
        s.con.execute("SET TimeZone = 'America/New_York'")  # UTC-5 in January
        # 2025-01-01 03:00 in New York is 08:00 UTC: ids 0..7 are before it.
        q = "SELECT count(*) AS n FROM t WHERE ts < '2025-01-01 03:00:00'"
        assert s.sql(q).to_pylist() == [{"n": 8}]


@pytest.mark.parametrize(
    "text",
    [
        "2025-01-01 05:00:00+00:00",
        "2025-01-01T05:00:00Z",
        "2025-01-01 05:00:00+00",
        "2025-01-01 05:00:00-0330",
        "2025-01-01 05:00:00.5-05:30",
        "2025-01-01",
        "2025-01-01 05:00:00",
        "2024-02-29 23:59:59.999999",
        "0001-01-01 00:00:00+00:00",
        "0001-01-01 00:00:00+05:00",
        "9999-12-31 23:59:59-05:00",
        "2025-02-29",
        "2025-01-01 24:00:00",
        "2025-01-01 05:00",
        "20250101",
        "\uff12\uff10\uff12\uff15-01-01",  # full-width digits
        "epoch",
        "infinity",
        "2025-01-01 05:00:00 America/New_York",
    ],
)
@pytest.mark.parametrize("target", ["DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE"])
def test_time_literals_prune_by_the_value_duckdb_gives_them(session, text, target):
    """Common ISO forms are read without asking DuckDB; whatever is read must
    be the value DuckDB's own cast gives (in a session whose TimeZone is not
    UTC, so that a time read without its zone would differ)."""
    from castsql.engine.sql.pushdown import duck_value

    column = {"DATE": "date32[day]", "TIMESTAMP": "timestamp[us]"}.get(target, "timestamp[us, tz=UTC]")
    zone = session.con.execute("SELECT current_setting('TimeZone')").fetchone()[0]
    session.con.execute("SET TimeZone = 'Asia/Kolkata'")
    try:
        got = duck_value(session.con, text, "VARCHAR", column)
        try:
            want = session.con.execute(f"SELECT CAST({sql_str(text)} AS {target})").fetchone()[0]
        except Exception:
            want = None
    finally:
        session.con.execute(f"SET TimeZone = {sql_str(zone)}")
    assert got == want and type(got) is type(want)


def test_non_ascii_text_before_the_table_name(session):
    q = "SELECT 'ünïcödé' AS u, count(*) AS n FROM t WHERE id = 42"
    assert session.sql(q).to_pylist() == [{"u": "ünïcödé", "n": 1}]
    assert files_read(session, q) == 1


def three_files_one_delete(root: str, positions: BitMap) -> str:
    """Three files of ids 0-9, 10-19, 20-29 (versions 1-3), then ``positions``
    of the second deleted (version 4)."""
    st_ = open_storage(root)
    log = TableLog.create(st_, rows([]).schema, primary_key="id")
    for k in range(3):
        log.append(write_data_files(st_, rows(range(k * 10, k * 10 + 10)), log.latest().schema))
    log.delete([PositionDelete(log.latest().data_files[1].name, None, positions)])
    return root


def test_versions_with_deletes_still_drop_their_rows(tmp_path, monkeypatch):
    root = three_files_one_delete(str(tmp_path / "t"), BitMap([0, 1]))  # ids 10, 11
    with Session(root) as s:
        assert s.sql("SELECT count(*) AS n FROM t WHERE id BETWEEN 5 AND 14").to_pylist() == [{"n": 8}]
        # A few files with deletes left: each filtered by its runs of deleted
        # positions (skipped in DuckDB's reader, with CastSQL's extensions) ...
        assert "castsql/p/" in s.prepare("SELECT * FROM t WHERE id BETWEEN 5 AND 14")
        sql = s.con.sql("SELECT sql FROM duckdb_views() WHERE view_name = 'castsql/p/0/latest/t'").fetchone()[0]
        assert ('"castsql/parquet"' if native.scans(s.con) else "file_row_number BETWEEN 0 AND 1") in sql
        # ... or, past a few runs, skipped by DuckDB's reader with CastSQL's
        # extensions where they are built, else anti-joined with the positions.
        monkeypatch.setattr(views_module, "_RANGE_RUNS", 0)
        assert s.sql("SELECT count(*) AS n FROM t WHERE id BETWEEN 4 AND 14").to_pylist() == [{"n": 9}]
        sql = s.con.sql("SELECT sql FROM duckdb_views() WHERE view_name = 'castsql/p/1/latest/t'").fetchone()[0]
        assert ('"castsql/parquet"' in sql) == native.scans(s.con)
        assert ("ANTI JOIN" in sql) != native.loaded(s.con)
        # More than the anti-join is worth: the version's DuckLake table, which skips files itself.
        monkeypatch.setattr(planner_module, "_ANTIJOIN_FILES", 0)
        assert "castsql/p/" not in s.prepare("SELECT * FROM t WHERE id BETWEEN 6 AND 14")
        assert s.sql("SELECT count(*) AS n FROM t WHERE id BETWEEN 6 AND 14").to_pylist() == [{"n": 7}]
        # Only clean files left: a plain read_parquet of them, without DuckLake.
        assert "castsql/p/" in s.prepare("SELECT * FROM t WHERE id >= 20")
        assert s.sql("SELECT count(*) AS n FROM t WHERE id >= 20").to_pylist() == [{"n": 10}]
        assert s.sql("SELECT count(*) AS n FROM t WHERE id >= 10").to_pylist() == [{"n": 18}]
        assert s.sql("SELECT count(*) AS n FROM t AS OF VERSION 3 WHERE id BETWEEN 5 AND 14").to_pylist() == [{"n": 10}]


def test_forgotten_pruned_views_take_their_position_tables_with_them(tmp_path, monkeypatch):
    root = three_files_one_delete(str(tmp_path / "t"), BitMap([9]))  # id 19
    monkeypatch.setattr(planner_module, "_PRUNED_VIEWS", 2)
    monkeypatch.setattr(views_module, "_RANGE_RUNS", 0)  # anti-joins, whose position tables must go
    with Session(root) as s:
        for k in range(1, 6):
            assert s.sql(f"SELECT count(*) AS n FROM t WHERE id >= {10 + k}").to_pylist() == [{"n": 19 - k}]
        left = s.con.sql("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name LIKE 'castsql/del/%'")
        # One per pruned view still kept: a position table, or with CastSQL's
        # extension a set of its bitmaps.
        if native.loaded(s.con):
            assert left.fetchone()[0] == 0 and s.views.bitmaps.sets == 2
        else:
            assert left.fetchone()[0] == 2


def test_a_commit_elsewhere_keeps_the_pruned_view_and_one_in_its_files_rebuilds_it(tmp_path):
    """The first selective query after a commit builds nothing when the commit
    left the files it reads as they were; it sees the commit when it did not."""

    root = three_files_one_delete(str(tmp_path / "t"), BitMap([0, 1]))  # ids 10, 11
    log = TableLog(open_storage(root))
    query = "SELECT id FROM t WHERE id BETWEEN 12 AND 14 ORDER BY id"

    def pruned_view() -> str:
        (name,) = re.findall(r'"(castsql/p/[^"]+)"', s.prepare(query))
        return name

    def ids() -> list[int]:
        return [r["id"] for r in s.sql(query).to_pylist()]

    with Session(root) as s:
        first = pruned_view()
        assert ids() == [12, 13, 14]
        log.delete([PositionDelete(log.latest().data_files[0].name, None, BitMap([3]))])  # id 3: elsewhere
        log.append(write_data_files(log.storage, rows(range(30, 40)), log.latest().schema))  # elsewhere
        assert pruned_view() == first
        assert ids() == [12, 13, 14]
        assert s.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 37}]  # the new version is read
        log.delete([PositionDelete(log.latest().data_files[1].name, None, BitMap([3]))])  # id 13: in its file
        assert pruned_view() != first
        assert ids() == [12, 14]
        after_delete = pruned_view()
        log.alter(add={"extra": "int64"})  # the same files and deletes, one more column
        assert pruned_view() != after_delete
        assert s.sql("SELECT * FROM t WHERE id BETWEEN 12 AND 14").column_names[-1] == "extra"
        assert s.sql("SELECT id FROM t AS OF VERSION 4 WHERE id BETWEEN 12 AND 14").to_pylist() == [
            {"id": 12},
            {"id": 13},
            {"id": 14},
        ]


# ---------------------------------------------------------------- property: same rows as every file


def _literal(col: str, v: int) -> str:
    if col == "id":
        return str(v)
    if col == "s":
        return f"'k{v:03d}'"
    if col == "ts":
        return f"TIMESTAMPTZ '{(T0 + timedelta(hours=v)).isoformat()}'"
    if col == "d":
        return f"DATE '{(date(2025, 1, 1) + timedelta(days=v)).isoformat()}'"
    return f"{v}.0"


# Values at and around every file boundary (file k holds 10k .. 10k+9), and anywhere.
values = st.one_of(
    st.integers(-1, 10).flatmap(lambda k: st.sampled_from([10 * k - 1, 10 * k, 10 * k + 9, 10 * k + 10])),
    st.integers(-5, 105),
)
atoms = st.one_of(
    st.tuples(st.sampled_from(["id", "s", "ts", "d", "x"]), st.sampled_from(["=", "<", "<=", ">", ">="]), values).map(
        lambda a: f"{a[0]} {a[1]} {_literal(a[0], a[2])}"
    ),
    st.tuples(st.sampled_from(["id", "s", "d", "ts"]), values, values).map(
        lambda a: f"{a[0]} BETWEEN {_literal(a[0], a[1])} AND {_literal(a[0], a[2])}"
    ),
    st.tuples(st.sampled_from(["<", ">="]), values, values, values).map(
        lambda a: f"{_literal('id', a[1])} {a[0]} id AND id IN ({a[2]}, {a[3]})"
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(where=st.lists(atoms, min_size=1, max_size=3).map(" AND ".join))
def test_pruned_queries_return_what_every_file_returns(session, table, where):
    got = session.sql(f"SELECT id FROM t WHERE {where} ORDER BY id").column("id").to_pylist()
    want = session.con.sql(f"SELECT id FROM {every_file(table)} WHERE {where} ORDER BY id").fetchall()
    assert got == [r[0] for r in want], where


def test_many_distinct_predicates_keep_working_past_the_view_cache(table):
    # 219 distinct (version, file set) pairs: well past the 64 views a session keeps.
    with Session(table.uri) as s:
        for rnd in range(2):  # the second round finds the first round's views evicted
            for v in range(2, FILES + 1):
                for i in range(v):
                    for j in range(i, v):
                        q = f"SELECT count(*) AS n FROM t AS OF VERSION {v} WHERE id BETWEEN {10 * i} AND {10 * j + 9}"
                        assert s.sql(q).to_pylist() == [{"n": 10 * (j - i + 1)}], (rnd, q)


def test_times_before_year_1000_are_pruned_by_their_order(tmp_path):
    """Statistics of times and dates keep four-digit years: year 201 written as
    "201-…" sorted after "2000-…" and a filter lost the rows of its file. A
    manifest an older writer left with such a statistic keeps the file."""
    from castsql.format.manifest import DataFile
    from castsql.snapshot import Predicate, resolve

    t = pa.table(
        {"id": pa.array([1, 2], pa.int64()), "ts": pa.array([datetime(201, 5, 1), datetime(2021, 5, 1)])},
    )
    st_ = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st_, t.schema, primary_key="id")
    log.append(write_data_files(st_, t.slice(0, 1)))
    log.append(write_data_files(st_, t.slice(1, 1)))
    assert log.latest().data_files[0].min["ts"] == "0201-05-01T00:00:00.000000"
    with Session(log.uri) as s:
        got = s.sql("SELECT id FROM t WHERE ts < TIMESTAMP '2000-01-01' ORDER BY id").to_pylist()
        assert got == [{"id": 1}]
        assert files_read(s, "SELECT id FROM t WHERE ts < TIMESTAMP '2000-01-01'") == 1
    snap = resolve(log)
    assert len(snap.prune([Predicate("ts", "<", datetime(2000, 1, 1))]).files) == 1
    old = DataFile.from_json(
        {**log.latest().data_files[0].to_json(), "min": {"ts": "201-05-01T00:00:00.000000"}}, "test"
    )
    from castsql.snapshot.prune import may_match

    assert may_match(old, [Predicate("ts", "<", datetime(2000, 1, 1))], {"ts": "timestamp[us]"})
    assert may_match(old, [Predicate("ts", ">", datetime(2000, 1, 1))], {"ts": "timestamp[us]"})
