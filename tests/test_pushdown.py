"""Filters and projections reach the Parquet scan, with and without deletes
(checked in DuckDB's EXPLAIN ANALYZE, as a user would)."""

from __future__ import annotations

import re

import pytest
from tables import build_events

from castsql.engine import Session


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from castsql.storage import open_storage

    root = tmp_path_factory.mktemp("pushdown") / "events"
    build_events(open_storage(str(root)))
    with Session(str(root)) as s:
        yield s


def scan_node(session: Session, sql: str) -> str:
    plan = session.con.sql(session.prepare("EXPLAIN ANALYZE " + sql)).fetchall()[0][1]
    nodes = plan.split("┌─────────────┴─────────────┐")
    scans = [n for n in nodes if "TABLE_SCAN" in n]
    assert len(scans) == 1, plan
    return re.sub(r"[│\s]+", " ", scans[0])


@pytest.mark.parametrize("version", [2, 6], ids=["no-deletes", "with-deletes"])
def test_filter_and_projection_are_pushed_into_the_scan(session, version):
    node = scan_node(session, f"SELECT sum(val) FROM events AS OF VERSION {version} WHERE id >= 1950")
    assert "Projections: val" in node
    assert "Filters: id>=1950" in node
    # The scan itself emits only the matching rows (row groups skipped by statistics).
    emitted = int(re.search(r"(\d+) rows", node).group(1))
    assert emitted == (50 if version == 2 else 149)


def test_files_outside_the_filter_are_not_read_with_deletes(session):
    # ids 1990.. are in the second file (it has deletes) and the third (it has
    # none): the version's DuckLake table reads those two and skips the first.
    node = scan_node(session, "SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 1990")
    assert "Total Files Read: 2" in node
    # Only the clean third file can match: CastSQL reads it with plain read_parquet.
    assert '"events@v6#p' in session.prepare("SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 2000")
    assert "Total Files Read: 1" in scan_node(session, "SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 2000")
