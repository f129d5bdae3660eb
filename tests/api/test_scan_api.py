"""The Python API: scan with columns, filters and versions; Arrow readers; pruning."""

from __future__ import annotations

import pyarrow as pa
import pytest

from castsql.engine import Session
from castsql.errors import CastSQLError
from castsql.snapshot import Predicate, prune_files


@pytest.fixture
def session(events, s3_config):
    with Session(events.log.uri, s3=s3_config) as s:
        yield s


def test_scan_columns_filter_version(session, events):
    got = session.scan("events", ["id"], [Predicate("id", ">=", 1400), Predicate("id", "<", 1700)], version=4)
    assert got.column_names == ["id"]
    assert set(got["id"].to_pylist()) == {i for i in events.live[4] if 1400 <= i < 1700}
    assert session.scan("events").num_rows == len(events.live[6])


def test_scan_unknown_column(session):
    with pytest.raises(CastSQLError, match="table events: no column 'nope'"):
        session.scan("events", ["nope"])


def test_pruning_drops_files_by_min_max(session):
    snap = session.snapshot("events", 6)
    types = {c.name: c.type for c in snap.schema.columns}
    assert len(prune_files(snap.files, [Predicate("id", ">=", 2000)], types)) == 1
    assert len(prune_files(snap.files, [Predicate("id", "=", 1500)], types)) == 1
    assert len(prune_files(snap.files, [Predicate("grp", "=", "g1")], types)) == 3
    from datetime import UTC, datetime

    late = [Predicate("ts", ">", datetime(2025, 1, 2, 10, tzinfo=UTC))]  # minute 2040 onwards
    assert len(prune_files(snap.files, late, types)) == 1


def test_reader_streams_batches(session, events):
    reader = session.reader("SELECT * FROM events ORDER BY id", batch_size=500)
    assert isinstance(reader, pa.RecordBatchReader)
    total = sum(b.num_rows for b in reader)
    assert total == len(events.live[6])


def test_a_reader_gives_every_row_when_other_queries_run_before_it_is_read(session, events):
    """DuckDB ends a connection's pending result when another statement runs on
    it: the session reads a reader's rest ahead first, so interleaving a
    reader with other queries (and audits, scans, opens) loses no row."""
    want = sorted(events.live[6])
    a = session.reader("SELECT id FROM events ORDER BY id", batch_size=100)
    b = session.reader("SELECT id FROM events AS OF VERSION 6 ORDER BY id", batch_size=100)
    first = a.read_next_batch()
    assert session.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(want)
    session.scan("events", ["id"])
    session.changes("events", 5, 6)
    got_a = [*first.column(0).to_pylist(), *(i for batch in a for i in batch.column(0).to_pylist())]
    got_b = [i for batch in b for i in batch.column(0).to_pylist()]
    assert got_a == want and got_b == want


def test_snapshot_live_rows(session, events):
    assert session.snapshot("events", 3).live_rows == len(events.live[3])
    assert session.snapshot("events", 4).live_rows is None  # key range: unknown without a scan
