"""Spark appends: executors write Parquet through castsql.storage, the driver commits once."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from castsql.errors import SchemaMismatch
from castsql.format import TableLog
from castsql.format.layout import DATA_DIR
from castsql.spark import append
from castsql.spark.errors import SparkJobFailed
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


def _log(uri: str, s3) -> TableLog:
    return TableLog(open_storage(uri, s3=s3))


def test_append_creates_table_then_adds_versions(spark, events_df, check_version, storage_root, s3_config):
    uri = storage_root + "/events"
    m1 = append(spark, uri, events_df(range(0, 30_000)), primary_key="id", s3=s3_config, row_group_size=25_000)
    log = _log(uri, s3_config)
    assert [m.version for m in log.history()] == [0, 1]
    assert m1.version == 1 and m1.operation == "APPEND" and m1.primary_key == "id"
    assert m1.schema.to_arrow() == pa.schema(
        [("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("user", pa.string()), ("kind", pa.string()),
         ("amount", pa.float64())]
    )  # fmt: skip
    [f] = m1.data_files
    # Spark hands over 10,000-row batches; the writer buffers them into full row groups.
    assert f.row_group_rows == (25_000, 5_000) and f.total_rows == 30_000
    assert m1.summary == {"added_files": 1, "added_rows": 30_000, "added_bytes": f.size_bytes}

    m2 = append(spark, uri, events_df(range(30_000, 40_000), partitions=2), s3=s3_config)
    assert m2.version == 2 and len(m2.data_files) == 3 and m2.summary["added_files"] == 2
    check_version(uri, 1, range(30_000))
    check_version(uri, 2, range(40_000))


def test_timestamps_are_utc_microseconds_not_int96(spark, events_df, storage_root, s3_config):
    uri = storage_root + "/events"
    m = append(spark, uri, events_df(range(100)), s3=s3_config)
    st = open_storage(uri, s3=s3_config)
    md = pq.ParquetFile(io.BytesIO(st.get(m.data_files[0].path))).metadata
    col = md.schema.column(1)
    assert col.name == "ts" and col.physical_type == "INT64"
    logical = json.loads(col.logical_type.to_json())
    assert (logical["Type"], logical["isAdjustedToUTC"], logical["timeUnit"]) == ("Timestamp", True, "microseconds")
    assert m.data_files[0].min["ts"] == "2025-01-01T00:00:00.000000Z"


def test_session_time_zone_does_not_shift_instants(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Seoul")
    try:
        append(spark, uri, events_df(range(50)))
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    check_version(uri, 1, range(50))


def test_empty_dataframe_creates_the_table_and_commits_nothing(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    m = append(spark, uri, events_df(range(10)).where("id < 0"), primary_key="id")
    assert m.version == 0 and m.primary_key == "id"
    assert append(spark, uri, events_df(range(10)).where("id < 0")).version == 0


def test_schema_mismatch_is_refused_before_writing(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(10)), primary_key="id")
    before = _log(uri, None).latest()
    with pytest.raises(SchemaMismatch, match="the data has no column 'id', the table's primary key"):
        append(spark, uri, events_df(range(10, 20)).drop("id"))
    with pytest.raises(SchemaMismatch, match="column 'id' is string in the data, the table has int64"):
        append(
            spark, uri, events_df(range(10, 20)).selectExpr("CAST(id AS STRING) AS id", "ts", "user", "kind", "amount")
        )
    with pytest.raises(SchemaMismatch, match="primary key is 'id', not 'user'"):
        append(spark, uri, events_df(range(10, 20)), primary_key="user")
    with pytest.raises(SchemaMismatch, match="primary key 'nope' is not a column"):
        append(spark, uri, events_df(range(10, 20)), primary_key="nope")
    log = _log(uri, None)
    assert log.latest() == before
    assert len(list(log.storage.list(DATA_DIR + "/"))) == len(before.data_files)


def test_unsupported_spark_types_are_refused(spark, tmp_path):
    uri = str(tmp_path / "t")
    df = spark.range(3).selectExpr("id", "array(id, id) AS xs")
    with pytest.raises(SchemaMismatch, match="unsupported column type"):
        append(spark, uri, df)
    assert not open_storage(uri).exists("_latest_manifest")


def test_failed_job_commits_nothing_and_its_files_are_garbage(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(100)), primary_key="id")
    log = _log(uri, None)
    before = log.latest()
    # Partition 0 (ids < 5000) writes its file; partition 1 fails on id 7000.
    bad = events_df(range(100, 10_000), partitions=2).selectExpr(
        "id", "ts", "user", "kind", "IF(id = 7000, raise_error('bad row 7000'), amount) AS amount"
    )
    with pytest.raises(SparkJobFailed, match=r"append failed, nothing was committed: .*bad row 7000"):
        append(spark, uri, bad)
    assert log.latest() == before
    referenced = {f.path for f in before.data_files}
    on_disk = {i.key for i in log.storage.list(DATA_DIR + "/")}
    # Whatever a finished task left behind is unreferenced garbage; whether partition 0
    # finished before Spark cancelled the job depends on scheduling.
    assert referenced <= on_disk


def test_new_table_is_not_created_by_a_failed_job(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    bad = events_df(range(10)).selectExpr("id", "ts", "user", "kind", "raise_error('nope') AS amount")
    with pytest.raises(SparkJobFailed):
        append(spark, uri, bad.selectExpr("id", "ts", "user", "kind", "CAST(amount AS DOUBLE) AS amount"))
    assert not open_storage(uri).exists("_latest_manifest")


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize("native", [True, False], ids=["spark-writer", "python-workers"])
def test_a_first_append_refused_for_its_keys_leaves_no_table(spark, events_df, tmp_path, native):
    """Issue 54: the table was created after the job and before the key check,
    so a first append of repeated keys left an empty version 0 (and its data
    directory) behind. The keys are checked before version 0 exists: nothing
    is left, and the corrected append creates the table."""
    from castsql.errors import DuplicateKey

    uri = tmp_path / "events"
    twice = events_df(range(5)).union(events_df([3]))
    size = None if native else 1 << 20  # target_file_bytes takes the Python workers' path
    with pytest.raises(DuplicateKey, match="the data holds key id = 3 more than once"):
        append(spark, str(uri), twice, primary_key="id", target_file_bytes=size)
    assert _files(uri) == []
    m = append(spark, str(uri), events_df(range(5)), primary_key="id", target_file_bytes=size)
    assert (m.version, m.primary_key) == (1, "id")


def test_a_table_created_by_spark_takes_its_properties_in_version_0(spark, events_df, tmp_path, capsys):
    """Issue 54, as `castsql append NEW --set-property … --engine spark`: the
    properties are version 0's (the first write is mirrored), a bad property
    is refused before the job, and an existing table's are not changed by the
    way."""
    from castsql.errors import CastSQLError
    from castsql.write_cli import main

    uri = tmp_path / "events"
    pq.write_table(events_df(range(5)).toArrow(), tmp_path / "in.parquet")
    argv = ["append", str(uri), "--from", str(tmp_path / "in.parquet"), "--primary-key", "id", "--engine", "spark"]
    assert main([*argv, "--set-property", "castsql.mirror.delta=true"]) == 0, capsys.readouterr().err
    log = _log(str(uri), None)
    assert [m.operation for m in log.history()] == ["CREATE", "APPEND"]
    assert log.manifest(0).properties == {"castsql.mirror.delta": "true"}
    assert (uri / "_delta_log" / "00000000000000000001.json").exists()
    with pytest.raises(CastSQLError, match=r"its property 'castsql\.mirror\.delta' is 'true', not 'false'"):
        append(spark, str(uri), events_df([7]), properties={"castsql.mirror.delta": "false"})
    with pytest.raises(CastSQLError, match="unknown property"):
        append(spark, str(tmp_path / "other"), events_df([7]), properties={"castsql.nope": "1"})
    assert not (tmp_path / "other").exists() and log.latest().version == 1
