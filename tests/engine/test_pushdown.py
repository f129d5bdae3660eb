"""Filters and projections reach the Parquet scan, with and without deletes
(checked in DuckDB's EXPLAIN ANALYZE, as a user would)."""

from __future__ import annotations

import json
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


def scan_nodes(session: Session, sql: str) -> list[str]:
    """Every table scan of the plan DuckDB ran, as ``key: value`` lines of its
    details plus ``N rows`` (the rows it emitted)."""
    plan = json.loads(session.con.sql(session.prepare("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)).fetchall()[0][1])
    out = []

    def walk(op: dict) -> None:
        if op.get("operator_type") == "TABLE_SCAN":
            info = op.get("extra_info") or {}
            lines = [f"{k}: {v}" for k, v in info.items()]
            out.append("\n".join([*lines, f"{op.get('operator_cardinality')} rows"]))
        for child in op.get("children") or ():
            walk(child)

    walk(plan)
    return out


def scan_node(session: Session, sql: str) -> str:
    scans = scan_nodes(session, sql)
    assert len(scans) == 1, scans
    return scans[0]


def _total(nodes: list[str], pattern: str) -> int:
    return sum(int(m.group(1)) for n in nodes if (m := re.search(pattern, n)))


@pytest.mark.parametrize("version", [2, 6], ids=["no-deletes", "with-deletes"])
def test_filter_and_projection_are_pushed_into_the_scan(session, version):
    # A version with deletes reads its files without deletes in the same scan
    # as those with (they hold fewer rows here; views.py, _anti_join), with
    # the pushdown.
    nodes = scan_nodes(session, f"SELECT sum(val) FROM events AS OF VERSION {version} WHERE id >= 1950")
    assert len(nodes) == 1
    for node in nodes:
        assert "Projections: val" in node
    # (DuckDB drops the filter from a scan whose statistics prove every row
    # matches; a provisional view's scan lists its row-range filter beside it.)
    assert any("id>=1950" in line for node in nodes for line in node.splitlines() if line.startswith("Filters:"))
    # The scans emit only the matching rows (row groups skipped by statistics).
    assert _total(nodes, r"(\d+) rows") == (50 if version == 2 else 149)


def test_files_outside_the_filter_are_not_read_with_deletes(session):
    # ids 1990.. are in the second file (it has deletes) and the third (it has
    # none): the query's pruned view reads those two and skips the first (and
    # EXPLAIN, with or without options, shows the plan the query runs).
    nodes = scan_nodes(session, "SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 1990")
    assert _total(nodes, r"Total Files Read: (\d+)") == 2
    # Only the clean third file can match: CastSQL reads it with plain read_parquet.
    assert '"castsql/p/' in session.prepare("SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 2000")
    assert "Total Files Read: 1" in scan_node(session, "SELECT sum(val) FROM events AS OF VERSION 6 WHERE id >= 2000")
