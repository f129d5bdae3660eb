"""The Spark reader: live rows of any version, equal to the engine's, on both backends."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tables import build_events

from castsql.engine.session import Session
from castsql.errors import CastSQLError, VersionNotFound
from castsql.format import write_data_files
from castsql.spark import FILE_COL, POS_COL, read
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


def test_every_version_equals_the_model_and_the_engine(spark, storage_root, s3_config):
    """tests/support/tables.py's table holds every tombstone kind: a row group, a key
    range, row-group-relative positions and a file-relative position."""
    uri = storage_root + "/events"
    st = open_storage(uri, s3=s3_config)
    ev = build_events(st)
    with Session(uri, s3=s3_config) as s:
        for version, ids in ev.live.items():
            got = read(spark, uri, version, s3=s3_config).toArrow().sort_by("id")
            assert got["id"].to_pylist() == sorted(ids), f"version {version}"
            want = s.sql(f"SELECT * FROM events AS OF VERSION {version} ORDER BY id")
            assert got.equals(want.cast(got.schema)), f"version {version}"


def test_positions_name_the_row_in_its_file(spark, storage_root, s3_config):
    uri = storage_root + "/events"
    st = open_storage(uri, s3=s3_config)
    ev = build_events(st)
    df = read(spark, uri, 5, s3=s3_config, positions=True)
    assert df.columns[-2:] == [FILE_COL, POS_COL]
    got = df.toArrow()
    assert got.num_rows == len(ev.live[5])
    files = {}
    for row in got.select(["id", FILE_COL, POS_COL]).to_pylist():
        key = row[FILE_COL]
        if key not in files:
            files[key] = pq.read_table(io.BytesIO(st.get(key)))["id"].to_pylist()
        assert files[key][row[POS_COL]] == row["id"]
    with Session(uri, s3=s3_config) as s:
        positional = s.sql("SELECT * FROM events AS OF VERSION 5").num_rows
    assert positional == got.num_rows


def test_a_read_is_fixed_to_its_version(spark, tmp_path):
    uri = str(tmp_path / "events")
    ev = build_events(open_storage(uri))
    df = read(spark, uri)
    write_data_files(ev.log.storage, pa.table({"id": [1]}), None)  # an orphan: must not show up
    ev.log.append(write_data_files(ev.log.storage, pa.table({
        "id": pa.array([5000], pa.int64()), "grp": ["x"], "val": [1.0],
        "ts": pa.array([None], pa.timestamp("us", tz="UTC"))
    })))  # fmt: skip
    assert df.count() == len(ev.live[6])
    assert read(spark, uri).count() == len(ev.live[6]) + 1


def test_empty_versions_and_unknown_versions(spark, tmp_path):
    uri = str(tmp_path / "events")
    build_events(open_storage(uri))
    empty = read(spark, uri, 0)
    assert empty.count() == 0 and empty.columns == ["id", "grp", "val", "ts"]
    with pytest.raises(VersionNotFound, match="version 99 does not exist"):
        read(spark, uri, 99)


def test_bad_column_lists_are_one_line_errors(spark, tmp_path):
    uri = str(tmp_path / "events")
    build_events(open_storage(uri))
    with pytest.raises(CastSQLError, match=r"no column 'nope' \(columns: id, grp, val, ts\)"):
        read(spark, uri, columns=["id", "nope"])
    with pytest.raises(CastSQLError, match=r"columns names 'id' more than once$"):
        read(spark, uri, columns=["id", "val", "id"])
    with pytest.raises(CastSQLError, match=r"columns must be a list of names, not 'id'"):
        read(spark, uri, columns="id")


def test_unsigned_and_naive_types_are_widened_for_spark(spark, tmp_path):
    from castsql.format import TableLog

    uri = str(tmp_path / "t")
    st = open_storage(uri)
    t = pa.table({
        "u8": pa.array([1, 255], pa.uint8()), "u64": pa.array([0, 2**64 - 1], pa.uint64()),
        "naive": pa.array([0, 1_000_000], pa.timestamp("us")), "d": pa.array([0, 1], pa.date32()),
    })  # fmt: skip
    log = TableLog.create(st, t.schema)
    log.append(write_data_files(st, t, log.latest().schema))
    rows = read(spark, uri).orderBy("u8").collect()
    assert [r.u8 for r in rows] == [1, 255]
    assert [int(r.u64) for r in rows] == [0, 2**64 - 1]
    assert str(rows[1].naive) == "1970-01-01 00:00:01"
    assert str(read(spark, uri).schema["naive"].dataType) == "TimestampNTZType()"
