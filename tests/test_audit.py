"""Audits: history of versions and the rows each version inserted or deleted."""

from __future__ import annotations

import itertools

import pytest

from castsql.engine import Session
from castsql.errors import CastSQLError, VersionNotFound


@pytest.fixture
def session(events, s3_config):
    with Session(events.log.uri, s3=s3_config) as s:
        yield s


def test_history_counts_are_exact(session, events):
    h = session.history("events").to_pylist()
    assert [r["version"] for r in h] == list(range(7))
    assert [r["operation"] for r in h] == ["CREATE", "APPEND", "APPEND", "DELETE", "DELETE", "DELETE", "APPEND"]
    assert [r["live_rows"] for r in h] == [len(events.live[v]) for v in range(7)]
    assert [r["rows_added"] for r in h] == [None, 1000, 1000, 0, 0, 0, 100]
    assert [r["rows_deleted"] for r in h] == [None, 0, 0, 100, 100, 4, 0]
    assert [r["files_added"] for r in h] == [None, 1, 1, 0, 0, 0, 1]
    assert h[6]["tombstone_files"] == 3 and h[6]["data_files"] == 3
    assert all(a["committed_at"] <= b["committed_at"] for a, b in itertools.pairwise(h))


def test_history_in_sql(session):
    a = session.sql("DESCRIBE HISTORY events").to_pylist()
    b = session.sql("SELECT * FROM table_history('events')").to_pylist()
    assert a == b and len(a) == 7
    n = session.sql("SELECT sum(rows_deleted) AS d FROM table_history('events') WHERE operation = 'DELETE'")
    assert n["d"][0].as_py() == 204


@pytest.mark.parametrize(("start", "end"), [(0, 6), (2, 5), (3, 4), (0, 1), (5, 6), (4, 4)])
def test_changes_match_the_model(session, events, start, end):
    got = session.changes("events", start, end).to_pylist()
    for v in range(start + 1, end + 1):
        inserted = {r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "insert"}
        deleted = {r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "delete"}
        assert inserted == events.live[v] - events.live[v - 1]
        assert deleted == events.live[v - 1] - events.live[v]
    assert all(start < r["_commit_version"] <= end for r in got)


def test_changes_carry_the_row_and_commit_time(session, events):
    got = session.sql("SELECT * FROM table_changes('events', 4, 5) ORDER BY id").to_pylist()
    assert [r["id"] for r in got] == [0, 5, 17, 1999]
    assert {r["_change_type"] for r in got} == {"delete"}
    assert got[0]["grp"] == "g0" and got[3]["val"] == 999.5
    assert got[0]["_commit_timestamp"] == events.log.manifest(5).created_at


def test_changes_errors(session):
    with pytest.raises(VersionNotFound, match=r"table events: version 9 does not exist \(latest is 6\)"):
        session.changes("events", 1, 9)
    with pytest.raises(CastSQLError, match="start version 5 is after end version 2"):
        session.sql("SELECT * FROM table_changes('events', 5, 2)")
    with pytest.raises(CastSQLError, match="table_changes takes"):
        session.sql("SELECT * FROM table_changes('events')")
