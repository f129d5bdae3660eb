"""SQL over tables: every version, every tombstone kind, time travel, joins,
new commits seen without reopening, and errors that name table and version."""

from __future__ import annotations

import pyarrow as pa
import pytest
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure
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


# ---------------------------------------------------------------- a broken latest version (issue 11.8)


def _break(events, how: str) -> str:
    """Break the latest version of ``events`` in one way; returns what the error must name."""
    from pyroaring import BitMap

    from castsql.format import PositionDelete
    from castsql.format.layout import POINTER_KEY, manifest_key

    st = events.log.storage
    if how == "pointer":
        st.put(POINTER_KEY, b"\xff\xfe garbage")
        return "_latest_manifest"
    if how == "manifest":
        st.put_if_absent(manifest_key(7), b'{"version": 7, "previous": 6, "schema": {')
        return "v00000007.json"
    if how == "tombstone":
        f = events.log.manifest(6).data_files[0]
        m = events.log.delete([PositionDelete(f.name, None, BitMap([1]))])
        st.delete(m.tombstones[-1])
        return "tombstone file is missing"
    assert how == "data file"
    m = events.log.manifest(6)
    new = next(f for f in m.data_files if f.path not in {g.path for g in events.log.manifest(5).data_files})
    st.delete(new.path)
    return new.path.rsplit("/", 1)[-1]


@pytest.mark.parametrize("how", ["pointer", "manifest", "tombstone", "data file"])
def test_a_broken_latest_version_does_not_block_older_ones(events, s3_config, how):
    named = _break(events, how)
    with Session(events.log.uri, s3=s3_config) as s:
        with pytest.raises(CastSQLError, match=named):
            s.sql("SELECT sum(id) FROM events")  # reads data (a bare count(*) needs no file)
        for v in (1, 3, 5):
            assert ids(s.sql(f"SELECT id FROM events AS OF VERSION {v}")) == events.live[v]
            assert ids(s.sql(f"SELECT events.id FROM events AS OF VERSION {v} WHERE events.id >= 0")) == events.live[v]
        both = s.sql("SELECT count(*) AS n FROM events AS OF VERSION 2 a JOIN events AS OF VERSION 5 b USING (id)")
        assert both["n"][0].as_py() == len(events.live[2] & events.live[5])
        assert s.sql("SELECT count(*) AS n FROM table_changes('events', 3, 5)")["n"][0].as_py() == 204
        h = s.sql("SELECT version, live_rows, error FROM table_history('events') ORDER BY version").to_pylist()
    good = [r for r in h if r["error"] is None]
    assert [(r["version"], r["live_rows"]) for r in good][:6] == [(v, len(events.live[v])) for v in range(6)]
    if how in ("manifest", "tombstone"):
        assert named in h[-1]["error"] and h[-1]["version"] == 7


@pytest.mark.parametrize("name", ["data", "source", "name", "type", "value", "year"])
def test_tables_named_like_keywords_need_no_quotes(tmp_path, name):
    st = open_storage_local(tmp_path / "wh" / name)
    log = TableLog.create(st, SCHEMA, primary_key="id")
    log.append(write_data_files(st, rows(0, 10)))
    log.append(write_data_files(st, rows(10, 30)))
    with Session(str(tmp_path / "wh")) as s:
        assert s.sql(f"SELECT count(*) AS n FROM {name}")["n"][0].as_py() == 30
        assert s.sql(f"SELECT count(*) AS n FROM {name} AS OF VERSION 1")["n"][0].as_py() == 10
        assert s.sql(f"SELECT count(*) AS n FROM {name} VERSION AS OF 1 WHERE id > 4")["n"][0].as_py() == 5
        got = s.sql(f"SELECT count(*) AS n FROM {name} AS OF VERSION 2 a JOIN {name} AS OF VERSION 1 b USING (id)")
        assert got["n"][0].as_py() == 10
        assert s.sql(f"SELECT count(*) AS n FROM {name} WHERE id >= 10")["n"][0].as_py() == 20


def test_two_tables_differing_only_in_case_are_refused_by_name(tmp_path):
    for name in ("events", "Events", "users"):
        st = open_storage_local(tmp_path / "wh" / name)
        TableLog.create(st, SCHEMA)
    with pytest.raises(TableNotFound, match=r"'Events' and 'events' differ only in case"):
        Session(str(tmp_path / "wh"))
    with Session(str(tmp_path / "wh" / "Events")) as s:  # one of them, opened directly
        assert s.tables == ["Events"]


def test_a_symlink_leading_out_of_a_warehouse_is_skipped_not_fatal(tmp_path):
    import os

    st = open_storage_local(tmp_path / "wh" / "events")
    TableLog.create(st, SCHEMA).append(write_data_files(st, rows(0, 5)))
    other = open_storage_local(tmp_path / "elsewhere" / "secret")
    TableLog.create(other, SCHEMA)
    os.symlink(tmp_path / "elsewhere" / "secret", tmp_path / "wh" / "secret")
    with Session(str(tmp_path / "wh")) as s:
        assert s.tables == ["events"]
        assert len(s.skipped) == 1 and "secret" in s.skipped[0] and "escapes" in s.skipped[0]
        assert s.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == 5


def open_storage_local(path):
    from castsql.storage import open_storage

    return open_storage(str(path))


def test_count_star_is_answered_from_the_metadata(session, events, tmp_path):
    # No data file is scanned (one with a key-range delete reads its key column once).
    for v in range(7):
        assert session.prepare(f"SELECT count(*) FROM events AS OF VERSION {v}").startswith("SELECT CAST(")
        got = session.sql(f"SELECT count(*) AS n FROM events AS OF VERSION {v}").to_pylist()
        assert got == [{"n": len(events.live[v])}]
    assert session.sql("SELECT COUNT(*) FROM events").column_names == ["count_star()"]
    # Anything more than a bare count is a real query.
    for q in (
        "SELECT count(*) FROM events WHERE id > 5",
        "SELECT count(*), sum(id) FROM events",
        "SELECT count(*) FROM events GROUP BY grp",
        "EXPLAIN SELECT count(*) FROM events",
    ):
        assert not session.prepare(q).startswith("SELECT CAST("), q
    assert session.sql("SELECT count(*) AS n FROM events AS OF VERSION 4").to_pylist() == [{"n": len(events.live[4])}]
