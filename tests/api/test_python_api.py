"""The Python front door: ``castsql.open`` / ``Table`` / ``castsql.connect``, on
real tables with every kind of tombstone, compared with the SQL path."""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa
import pytest
from pyroaring import BitMap

import castsql
from castsql.engine import Session
from castsql.errors import CastSQLError, MissingExtra, VersionNotFound, require
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import open_storage


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "kind": pa.array(["even" if i % 2 == 0 else "odd" for i in ids], pa.string()),
            "amount": pa.array([i * 1.5 for i in ids], pa.float64()),
        }
    )


def build(root: str) -> tuple[TableLog, dict[int, set[int]]]:
    """Three files of 20 rows (row groups of 5); then a row-group delete, a key
    range and positions: the live ids at each version."""
    store = open_storage(root)
    log = TableLog.create(store, rows([]).schema, primary_key="id")
    live = {0: set()}
    for k in range(3):
        ids = range(k * 20, k * 20 + 20)
        log.append(write_data_files(store, rows(ids), log.latest().schema, row_group_size=5))
        live[log.latest().version] = live[max(live)] | set(ids)
    f0, f1, f2 = (f.path for f in log.latest().data_files)
    log.delete([RowGroupDelete(f0, 1)])  # ids 5..9
    live[log.latest().version] = live[max(live)] - set(range(5, 10))
    log.delete([KeyRangeDelete(f1, 22, 27)])
    live[log.latest().version] = live[max(live)] - set(range(22, 28))
    log.delete([PositionDelete(f2, None, BitMap([0, 3, 19]))])  # ids 40, 43, 59
    live[log.latest().version] = live[max(live)] - {40, 43, 59}
    return log, live


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("api") / "events")
    log, live = build(root)
    return root, log, live


def ids(t: pa.Table) -> list[int]:
    return sorted(t.column("id").to_pylist())


def test_open_reads_every_version_with_every_kind_of_tombstone(table):
    root, _, live = table
    with castsql.open(root) as events, Session(root) as s:
        assert events.version == max(live)
        assert events.schema == rows([]).schema
        for v, want in live.items():
            at = events.at(version=v)
            assert at.version == v
            assert ids(at.to_arrow()) == sorted(want)
            # The same rows as the SQL path, through every reader.
            sql = s.sql(f"SELECT * FROM events AS OF VERSION {v} ORDER BY id")
            assert at.to_arrow().sort_by("id") == sql
            assert at.to_batches(batch_size=7).read_all().sort_by("id") == sql
            assert at.to_pandas().sort_values("id").reset_index(drop=True).equals(sql.to_pandas())
            assert at.to_polars().sort("id").to_arrow().column("id").to_pylist() == sorted(want)


def test_columns_and_filter_prune_as_the_sql_path_does(table):
    root, _, live = table
    with castsql.open(root) as events:
        got = events.to_arrow(["id", "kind"], filter="id BETWEEN 20 AND 29 AND kind = 'even'")
        assert got.column_names == ["id", "kind"]
        assert ids(got) == [20, 28]  # 22..27 deleted by key range
        got = events.to_arrow(filter="amount > ? -- a comment".replace("?", "80"))
        assert ids(got) == sorted(i for i in live[max(live)] if i * 1.5 > 80)
        plan = (
            events._session.sql("EXPLAIN ANALYZE " + events._query(None, "id BETWEEN 41 AND 42")).column(1)[0].as_py()
        )
        assert "Total Files Read: 1" in plan  # only the third file


def test_bad_arguments_name_the_table_and_change_nothing(table):
    root, _, live = table
    with castsql.open(root) as events:
        with pytest.raises(CastSQLError, match="no column 'nope'"):
            events.to_arrow(["nope"])
        with pytest.raises(CastSQLError, match="columns must be a list"):
            events.to_arrow("id")
        with pytest.raises(CastSQLError, match="filter must be SQL text"):
            events.to_arrow(filter=" ")
        # A filter is one condition: it cannot close the WHERE it is put in and add rows.
        for escape in ("1=1) UNION ALL SELECT 1, 'x', 1.0 FROM (SELECT 1", "id < 3; SELECT 1", "id < 3) --"):
            with pytest.raises(CastSQLError, match="filter must be one SQL condition"):
                events.to_arrow(filter=escape)
        assert ids(events.to_arrow(filter="(id < 3) OR kind IN (')', 'x')")) == [0, 1, 2]
        # Dollar-quoted and E'…' strings are strings: their parentheses are text, not SQL.
        assert ids(events.to_arrow(filter="(id < 3) OR kind IN ($$a)b$$, $t$)$t$, E'\\')')")) == [0, 1, 2]
        assert ids(events.to_arrow(filter="kind = $$odd$$ AND id < 4")) == [1, 3]
        with pytest.raises(CastSQLError, match="filter must be one SQL condition"):
            events.to_arrow(filter="1=1) UNION ALL SELECT 1, $$x$$, 1.0 FROM (SELECT $$)$$")
        with pytest.raises(VersionNotFound):
            events.at(version=99)
        with pytest.raises(CastSQLError, match="not both"):
            events.at(version=1, timestamp="2020-01-01")
        assert events.version == max(live)
        assert ids(events.to_arrow()) == sorted(live[max(live)])


def test_open_of_a_warehouse_says_to_name_a_table_or_connect(tmp_path):
    # Was "ValueError: too many values to unpack".
    wh = tmp_path / "wh"
    build(str(wh / "events"))
    TableLog.create(open_storage(str(wh / "users")), rows([]).schema)
    with pytest.raises(CastSQLError) as e:
        castsql.open(str(wh))
    assert str(e.value) == (
        f"{wh} is a warehouse of 2 tables (events, users): open one table "
        f"(castsql.open('{wh}/events')) or use castsql.connect('{wh}')"
    )
    # A warehouse of one table is still not that table: the same advice, and its advice works.
    one = tmp_path / "one"
    build(str(one / "events"))
    with pytest.raises(CastSQLError, match=r"warehouse of 1 table \(events\): open one table"):
        castsql.open(str(one))
    with castsql.open(f"{one}/events") as t, castsql.connect(str(one)) as s:
        assert t.to_arrow().num_rows == s.sql("SELECT count(*) FROM events").column(0)[0].as_py() == 46


def test_a_table_stays_at_its_version_and_at_gives_the_newest(tmp_path):
    root = str(tmp_path / "events")
    log, _ = build(root)
    events = castsql.open(root)
    before = events.version
    con = duckdb.connect()
    rel = events.to_duckdb(con)
    own = events.to_duckdb()
    store = open_storage(root)
    log.append(write_data_files(store, rows(range(100, 110)), log.latest().schema))
    log.delete([PositionDelete(log.latest().data_files[0].path, None, BitMap([0]))])  # id 0
    assert events.version == before
    # The user's connection and the table's own relation both stay at the version.
    assert sorted(r[0] for r in rel.fetchall()) == ids(events.to_arrow())
    assert sorted(r[0] for r in con.sql(f"SELECT id FROM events_v{before}").fetchall()) == ids(events.to_arrow())
    assert own.aggregate("count(*)").fetchone()[0] == events.to_arrow().num_rows
    newest = events.at()
    assert newest.version == before + 2
    got = ids(newest.to_arrow())
    assert 0 not in got and 109 in got
    # The user's connection gets no CastSQL catalog it could write through.
    attached = {r[0] for r in con.sql("SELECT database_name FROM duckdb_databases()").fetchall()}
    assert not any("castsql" in a or "lake" in a for a in attached)
    events.close()


def test_timestamps_pick_the_version_committed_at_or_before(tmp_path):
    root = str(tmp_path / "events")
    store = open_storage(root)
    log = TableLog.create(store, rows([]).schema, primary_key="id")
    log.append(write_data_files(store, rows(range(5)), log.latest().schema))
    t1 = log.latest().created_at
    time.sleep(0.01)
    log.append(write_data_files(store, rows(range(5, 9)), log.latest().schema))
    with castsql.open(root, timestamp=t1) as events:
        assert events.version == 1
        assert events.to_arrow().num_rows == 5
        assert events.at().to_arrow().num_rows == 9
        assert events.at(timestamp=log.latest().created_at).version == 2
        assert events.history().num_rows == 3
        changes = events.at().changes(2)
        assert sorted(changes.column("id").to_pylist()) == [5, 6, 7, 8]


def test_connect_takes_parameters_and_time_travel(table):
    root, _, live = table
    with castsql.connect(root) as s:
        got = s.sql("SELECT id FROM events AS OF VERSION 4 WHERE id < ? ORDER BY id", [12])
        assert got.column("id").to_pylist() == sorted(i for i in live[4] if i < 12)
        got = s.sql("SELECT count(*) AS n FROM events WHERE kind = $k", {"k": "odd"})
        assert got.to_pylist() == [{"n": sum(1 for i in live[max(live)] if i % 2)}]


def test_connect_on_the_users_connection_sees_each_new_version(tmp_path):
    root = str(tmp_path / "events")
    log, _ = build(root)
    con = duckdb.connect()
    con.sql("CREATE TABLE mine AS SELECT 40 AS id UNION ALL SELECT 41")
    s = castsql.connect(root, connection=con)
    q = "SELECT count(*) AS n FROM events JOIN mine USING (id)"
    assert s.sql(q).to_pylist() == [{"n": 1}]  # 40 is deleted
    log.delete([PositionDelete(log.latest().data_files[2].path, None, BitMap([1]))])  # id 41
    assert s.sql(q).to_pylist() == [{"n": 0}]
    s.close()


def test_a_missing_extra_names_the_pip_install():
    with pytest.raises(MissingExtra, match=r"pip install 'castsql\[polars\]'"):
        require("castsql_no_such_module", "polars", "Table.to_polars")


def test_a_table_under_a_folder_named_like_a_partition_reads_its_own_values(tmp_path):
    """DuckDB's read_parquet takes a path component ``v=7`` as a hive
    partition and would read 7 for the column ``v``: CastSQL's scans turn
    that off, with deletes or without, in reads, writes and audits."""
    uri = str(tmp_path / "v=7" / "th")
    castsql.write_table(uri, pa.table({"id": pa.array(range(5), pa.int64()), "v": pa.array(range(5), pa.int64())}),
                        primary_key="id")  # fmt: skip
    with castsql.open(uri) as t:
        assert sorted(t.to_arrow().column("v").to_pylist()) == [0, 1, 2, 3, 4]
        t.update({"v": "v + 10"}, "id = 1")
        t.delete("v = 3")
        assert sorted(t.to_arrow().column("v").to_pylist()) == [0, 2, 4, 11]
        assert t._session.sql("SELECT sum(v) AS s FROM th WHERE id < 2").to_pylist() == [{"s": 11}]
        changed = {(r["v"], r["_change_type"]) for r in t.changes(2).to_pylist()}
        assert changed == {(1, "update_preimage"), (11, "update_postimage"), (3, "delete")}
