"""SQL over tables: every version, every tombstone kind, time travel, joins,
new commits seen without reopening, and errors that name table and version."""

from __future__ import annotations

import pyarrow as pa
import pytest
from tables import SCHEMA, rows

from castsql.engine import Session
from castsql.errors import CastSQLError, TableNotFound, VersionNotFound
from castsql.format import TableLog, write_data_files


@pytest.fixture
def session(events, storage, s3_config):
    s = Session(events.log.uri, s3=s3_config)
    yield s
    s.close()


def ids(table: pa.Table) -> set[int]:
    return set(table.column("id").to_pylist())


@pytest.mark.parametrize("version", range(7))
def test_every_version_matches_the_model(session, events, version):
    got = session.sql(f"SELECT id FROM events AS OF VERSION {version}")
    assert len(got) == len(events.live[version])
    assert ids(got) == events.live[version]


def test_latest_is_the_plain_name(session, events):
    assert ids(session.sql("SELECT id FROM events")) == events.live[6]
    assert session.sql("SELECT count(*) AS n FROM events").column("n")[0].as_py() == len(events.live[6])


@pytest.mark.parametrize("clause", ["AS OF VERSION 3", "VERSION AS OF 3", "AT (VERSION => 3)"])
def test_version_syntaxes(session, events, clause):
    assert ids(session.sql(f"SELECT id FROM events {clause}")) == events.live[3]


def test_timestamp_travel(session, events):
    hist = events.log.history()
    at = hist[4].created_at.isoformat()
    for clause in (f"AS OF TIMESTAMP '{at}'", f"TIMESTAMP AS OF '{at}'", f"AT (TIMESTAMP => '{at}')"):
        assert ids(session.sql(f"SELECT id FROM events {clause}")) == events.live[4]


def test_self_join_of_two_versions(session, events):
    got = session.sql(
        "SELECT b.id FROM events AS OF VERSION 6 b ANTI JOIN events AS OF VERSION 2 a ON a.id = b.id ORDER BY 1"
    )
    assert ids(got) == events.live[6] - events.live[2]
    got = session.sql("SELECT a.id FROM events VERSION AS OF 2 a ANTI JOIN events VERSION AS OF 5 b ON a.id = b.id")
    assert ids(got) == events.live[2] - events.live[5]


def test_filters_group_by_and_projection(session, events):
    live = events.live[6]
    got = session.sql("SELECT grp, count(*) AS n, sum(val) AS s FROM events WHERE id >= 1000 GROUP BY grp ORDER BY grp")
    want = {}
    for i in live:
        if i >= 1000:
            n, s = want.get(f"g{i % 7}", (0, 0.0))
            want[f"g{i % 7}"] = (n + 1, s + i * 0.5)
    assert {r["grp"]: (r["n"], r["s"]) for r in got.to_pylist()} == want


def test_a_new_commit_is_seen_by_the_next_query(session, events, storage):
    assert session.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(events.live[6])
    writer = TableLog(storage.child("events"))
    writer.append(write_data_files(writer.storage, rows(5000, 5010)))
    assert session.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(events.live[6]) + 10
    assert session.sql("SELECT count(*) AS n FROM events AS OF VERSION 6")["n"][0].as_py() == len(events.live[6])


def test_warehouse_and_joins(storage, events, s3_config):
    users = TableLog.create(storage.child("users"), pa.schema([("grp", pa.string()), ("owner", pa.string())]))
    users.append(write_data_files(users.storage, pa.table({"grp": ["g0", "g1"], "owner": ["ann", "bob"]})))
    with Session(storage.root, s3=s3_config) as s:
        assert s.tables == ["events", "users"]
        assert s.sql("SHOW TABLES").to_pylist() == [{"name": "events"}, {"name": "users"}]  # before any query
        got = s.sql(
            "SELECT u.owner, count(*) AS n FROM events AS OF VERSION 1 e JOIN users u USING (grp) GROUP BY 1 ORDER BY 1"
        ).to_pylist()
        assert got == [
            {"owner": "ann", "n": sum(1 for i in range(1000) if i % 7 == 0)},
            {"owner": "bob", "n": sum(1 for i in range(1000) if i % 7 == 1)},
        ]
        # Version views and pruned file sets are not tables of the warehouse.
        s.sql("SELECT count(*) FROM events WHERE id < 10")
        assert s.sql("show tables;").to_pylist() == [{"name": "events"}, {"name": "users"}]


def test_empty_table(storage, s3_config):
    TableLog.create(storage.child("empty"), SCHEMA)
    with Session(storage.child("empty").root, s3=s3_config) as s:
        got = s.sql("SELECT * FROM empty")
        assert got.num_rows == 0 and got.column_names == ["id", "grp", "val", "ts"]


@pytest.mark.parametrize(
    ("sql", "error", "message"),
    [
        (
            "SELECT * FROM events AS OF VERSION 99",
            VersionNotFound,
            r"table events: version 99 does not exist \(latest is 6\)",
        ),
        ("SELECT * FROM events AS OF TIMESTAMP '2000-01-01'", VersionNotFound, "table events: no version at or before"),
        ("SELECT * FROM nope AS OF VERSION 1", TableNotFound, "no table named 'nope' \\(tables: events\\)"),
        ("SELECT * FROM events AS OF TIMESTAMP 'soon'", CastSQLError, "'soon' is not a timestamp"),
        ("SELEC 1", CastSQLError, "syntax error"),
    ],
)
def test_errors_name_table_and_version(session, sql, error, message):
    with pytest.raises(error, match=message) as e:
        session.sql(sql)
    assert "\n" not in str(e.value)


def test_missing_data_file_names_the_table(session, events, storage):
    f = events.log.manifest(1).data_files[0]
    storage.child("events").delete(f.path)
    with pytest.raises(CastSQLError, match="events") as e:
        session.sql("SELECT count(*) FROM events AS OF VERSION 1 WHERE val > 0")
    assert f.path.rsplit("/", 1)[-1] in str(e.value)


def test_garbage_collected_version(session, events, storage):
    storage.child("events").delete("manifest/v00000001.json")
    with pytest.raises(VersionNotFound, match=r"table events: version 1 was garbage-collected \(oldest kept is 0\)"):
        session.sql("SELECT * FROM events AS OF VERSION 1")
