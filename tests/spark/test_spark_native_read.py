"""castsql.spark.read through Spark's own Parquet reader: deletes applied by a
filter on each row's file and position, equal to the engine's answer; and the
versions it leaves to the Python workers, named."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest
from pyroaring import BitMap
from tables import build_events

import castsql
from castsql.engine.session import Session
from castsql.format import KeyRangeDelete, PositionDelete, TableLog, write_data_files
from castsql.snapshot import resolve
from castsql.spark import read
from castsql.spark.native_read import why_not
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def _native(df) -> bool:
    plan = _plan(df)
    return "FileScan parquet" in plan and "MapInArrow" not in plan


@pytest.fixture
def events(tmp_path):
    uri = str(tmp_path / "events")
    return uri, build_events(open_storage(uri))


@pytest.fixture(params=["jvm", "join"])
def bitsets(request, monkeypatch):
    """How positions are tested: castsql.spark.jvm.Deleted in the tasks (the
    jar shipped to them), or the hash join with a broadcast table of bitsets
    (where no jar reaches them). Returns what the plan of each holds."""
    from castsql.spark import native_read

    monkeypatch.setattr(native_read, "JVM_FILTER", request.param == "jvm")
    return "UDF(" if request.param == "jvm" else "_castsql_words"


def test_every_version_and_tombstone_kind_through_sparks_reader(spark, events, bitsets):
    """Row groups, a key range, row-group-relative and file-relative positions,
    a file without deletes: every version equals the engine, read by Spark's
    Parquet reader (no Python worker in the plan)."""
    uri, ev = events
    snap = resolve(TableLog(open_storage(uri)), 5)
    assert any(f.deleted for f in snap.files)
    assert bitsets in _plan(read(spark, uri, 5))
    with Session(uri) as s:
        for version, ids in ev.live.items():
            df = read(spark, uri, version)
            assert _native(df) or not ids, _plan(df)
            got = df.toArrow().sort_by("id")
            assert got["id"].to_pylist() == sorted(ids), f"version {version}"
            want = s.sql(f"SELECT * FROM events AS OF VERSION {version} ORDER BY id")
            assert got.equals(want.cast(got.schema)), f"version {version}"


EXECUTOR_JVMS = """
import sys
from pyspark.sql import SparkSession
import castsql.spark as cs

uri = sys.argv[1]
spark = SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false").getOrCreate()
for v in sys.argv[2:]:
    df = cs.read(spark, uri, version=int(v))
    plan = df._jdf.queryExecution().executedPlan().toString()
    print(v, "UDF(" in plan, ",".join(map(str, sorted(df.select("id").toArrow()["id"].to_pylist()))))
spark.stop()
"""


def test_executors_in_their_own_jvms_load_the_filter_the_driver_sent(events, tmp_path):
    """A cluster's executors have no castsql-spark.jar of their own: the driver
    sends it (SparkContext.addJar), and their tasks test deletes with its UDF.
    ``local-cluster`` runs two executors, each in a JVM of its own."""
    uri, ev = events
    script = tmp_path / "cluster.py"
    script.write_text(EXECUTOR_JVMS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    versions = [3, 5, 6]
    out = subprocess.run(
        [sys.executable, str(script), uri, *map(str, versions)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln.split(" ") for ln in out.stdout.splitlines() if ln.split(" ")[0] in map(str, versions)]
    assert [(int(v), udf) for v, udf, _ in lines] == [(v, "True") for v in versions]
    for v, _, ids in lines:
        assert [int(i) for i in ids.split(",")] == sorted(ev.live[int(v)]), f"version {v}"


@pytest.mark.parametrize(
    "where",
    [
        "id < 20",  # row group 0 only: positions 0, 5, 17 of the first file are deleted
        "id >= 250 AND id < 330",  # row groups 0-1 skipped by Spark, 2 deleted whole
        "id >= 1990",  # the second file's last row group: file position 999 deleted
        "id BETWEEN 1590 AND 1610",  # across the end of the key range 1500-1599
        "grp = 'g3'",  # no pruning: every row group read
    ],
)
def test_sparks_row_group_pruning_keeps_positions_right(spark, events, where, bitsets):
    """Spark skips row groups by the query's filter before the deletes are
    applied; a skipped row group must not shift the positions after it."""
    uri, _ = events
    df = read(spark, uri, 5).where(where)
    assert _native(df) and bitsets in _plan(df)
    got = sorted(df.toArrow()["id"].to_pylist())
    with Session(uri) as s:
        want = s.sql(f"SELECT id FROM events AS OF VERSION 5 WHERE {where} ORDER BY id")["id"].to_pylist()
    assert got == want and got


def test_a_column_subset_without_the_key_still_drops_key_ranges(spark, events):
    uri, ev = events
    df = read(spark, uri, 5, columns=["grp", "val"])
    assert df.columns == ["grp", "val"] and _native(df)
    got = sorted(df.toArrow().to_pylist(), key=lambda r: (r["grp"], r["val"]))
    with Session(uri) as s:
        want = s.sql("SELECT grp, val FROM events AS OF VERSION 5 ORDER BY grp, val").to_pylist()
    assert got == want and len(got) == len(ev.live[5])
    none = read(spark, uri, 5, columns=[])
    assert none.columns == [] and none.count() == len(ev.live[5])
    assert read(spark, uri, 5, columns=["val", "id"]).columns == ["val", "id"]


def test_an_added_column_reads_null_in_older_files(spark, tmp_path):
    uri = str(tmp_path / "t")
    TableLog.create(open_storage(uri), pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key="id")
    t = castsql.open(uri)
    t.append(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    t.add_columns({"c": "int32"})
    t.append(pa.table({"id": [4], "v": ["d"], "c": pa.array([7], pa.int32())}))
    t.delete("id = 2")
    df = read(spark, uri)
    assert _native(df)
    assert sorted(tuple(r) for r in df.collect()) == [(1, "a", None), (3, "c", None), (4, "d", 7)]


def test_versions_left_to_the_python_workers_are_named_and_still_right(spark, tmp_path):
    """A file holding a narrower type than the version's, and two files of the
    same size: why_not names each, and read() gives the right rows anyway."""
    uri = str(tmp_path / "w")
    TableLog.create(open_storage(uri), pa.schema([("id", pa.int64()), ("n", pa.int32())]), primary_key="id")
    t = castsql.open(uri)
    t.append(pa.table({"id": [1, 2], "n": pa.array([10, 20], pa.int32())}))
    t.widen_columns({"n": "int64"})
    t.append(pa.table({"id": [3], "n": [30]}))
    log = TableLog(open_storage(uri))
    assert "holds 'n' as int32, the version as int64" in why_not(log.storage, resolve(log), ["id", "n"])
    df = read(spark, uri)
    assert not _native(df)
    assert sorted(tuple(r) for r in df.collect()) == [(1, 10), (2, 20), (3, 30)]

    uri2 = str(tmp_path / "same")
    st = open_storage(uri2)
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    log2 = TableLog.create(st, rows.schema)
    a = log2.append(write_data_files(st, rows, log2.latest().schema)).data_files[0]
    b = log2.append(write_data_files(st, rows, log2.latest().schema)).data_files[-1]
    log2.delete([PositionDelete(a.name, None, BitMap([0])), PositionDelete(b.name, None, BitMap([1]))])
    assert why_not(st, resolve(log2), ["id"]) == "two data files with deletes have the same size"
    assert sorted(r.id for r in read(spark, uri2).collect()) == [1, 2]


def test_s3_tables_are_read_by_the_workers(spark, storage_root, s3_config):
    if s3_config is None:
        pytest.skip("local tables are read by Spark's reader")
    uri = storage_root + "/events"
    st = open_storage(uri, s3=s3_config)
    ev = build_events(st)
    assert why_not(st, resolve(TableLog(st)), ["id"]) == "the table is not on a local disk"
    df = read(spark, uri, 5, s3=s3_config)
    assert not _native(df) and df.count() == len(ev.live[5])


def test_ancient_dates_and_times_read_as_written(spark, tmp_path):
    """pyarrow writes proleptic Gregorian values; Spark's reader would refuse
    (or shift) dates before 1582 from a writer it does not know."""
    from datetime import date, datetime

    uri = str(tmp_path / "old")
    t = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "d": pa.array([date(1000, 1, 1), date(2024, 5, 6)], pa.date32()),
        "ts": pa.array([datetime(1200, 3, 4, 5, 6, 7), datetime(2024, 1, 1)], pa.timestamp("us")),
    })  # fmt: skip
    TableLog.create(open_storage(uri), t.schema, primary_key="id")
    castsql.open(uri).append(t)
    df = read(spark, uri)
    assert _native(df)
    got = df.orderBy("id").collect()
    assert [(r.d, r.ts) for r in got] == [
        (date(1000, 1, 1), datetime(1200, 3, 4, 5, 6, 7)),
        (date(2024, 5, 6), datetime(2024, 1, 1)),
    ]


def test_a_size_the_manifest_lies_about_sends_the_read_to_the_workers(spark, events):
    """Spark's reader finds a row's deletes by its file's size: a manifest
    entry whose size is not the file's would silently drop (or keep) rows, so
    the driver checks every footer against the manifest first."""
    import json

    from castsql.format.layout import manifest_key

    uri, ev = events
    st = ev.log.storage
    v = ev.log.latest().version
    doc = json.loads(st.get(manifest_key(v)))
    entry = doc["files"]["inline"][0]
    entry["size_bytes"] += 1
    doc["totals"]["bytes"] += 1  # a consistent lie: the totals agree with the entry
    st.delete(manifest_key(v))
    st.put_if_absent(manifest_key(v), json.dumps(doc).encode())
    log = TableLog(open_storage(uri))
    why = why_not(log.storage, resolve(log, v), ["id"])
    assert why is not None and "the manifest says" in why and entry["path"].rsplit("/", 1)[-1] in why
    df = read(spark, uri, v)
    assert not _native(df)
    assert sorted(r.id for r in df.select("id").collect()) == sorted(ev.live[v])


# ---------------------------------------------------------------- found by a red-team pass


def _table(uri: str, t: pa.Table, pk: str) -> tuple[TableLog, str]:
    st = open_storage(uri)
    log = TableLog.create(st, t.schema, primary_key=pk)
    f = log.append(write_data_files(st, t, log.latest().schema)).data_files[0]
    return log, f.name


def _engine(uri: str, order: str) -> list[tuple]:
    name = uri.rsplit("/", 1)[-1]
    with Session(uri) as s:
        return [tuple(r.values()) for r in s.sql(f'SELECT * FROM "{name}" ORDER BY {order}').to_pylist()]


def test_names_with_dots_and_backticks_are_columns_not_paths(spark, tmp_path):
    uri = str(tmp_path / "names")
    t = pa.table({"k.e": pa.array(range(10), pa.int64()), "a`b": pa.array(range(100, 110), pa.int64())})
    log, f = _table(uri, t, "k.e")
    log.delete([KeyRangeDelete(f, 2, 4), PositionDelete(f, None, BitMap([7]))])
    df = read(spark, uri)
    assert _native(df)
    assert sorted(tuple(r) for r in df.collect()) == _engine(uri, '"k.e"')
    assert sorted(r[0] for r in read(spark, uri, columns=["a`b"]).collect()) == [100, 101, 105, 106, 108, 109]


def test_naive_timestamp_key_ranges_ignore_the_session_time_zone(spark, tmp_path):
    """02:30 on 2025-03-09 does not exist in New York: a bound compared
    through the session's zone would move and bring the row back."""
    from datetime import datetime, timedelta

    uri = str(tmp_path / "dst")
    keys = [datetime(2025, 3, 9) + timedelta(minutes=30 * i) for i in range(12)]
    log, f = _table(uri, pa.table({"k": pa.array(keys, pa.timestamp("us")), "v": range(12)}), "k")
    log.delete([KeyRangeDelete(f, "2025-03-09T01:00:00", "2025-03-09T03:00:00")])
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = read(spark, uri)
        assert _native(df)
        assert sorted(r.v for r in df.collect()) == [0, 1, 7, 8, 9, 10, 11]
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_sparks_v2_parquet_source_goes_to_the_workers(spark, events):
    uri, ev = events
    key = "spark.sql.sources.useV1SourceList"
    before = spark.conf.get(key)
    spark.conf.set(key, "avro,csv,json,kafka,orc,text")
    try:
        log = TableLog(open_storage(uri))
        assert "V2 source" in why_not(log.storage, resolve(log), ["id"], spark)
        df = read(spark, uri, 5)
        assert not _native(df) and df.count() == len(ev.live[5])
    finally:
        spark.conf.set(key, before)


def test_a_fractional_bound_on_an_integer_key_goes_to_the_workers(spark, tmp_path):
    """Another tool's range 1.5-3.5 keeps id 1; an Arrow array of int64 would
    truncate it to 1-3 and drop it."""
    uri = str(tmp_path / "frac")
    log, f = _table(uri, pa.table({"id": pa.array(range(10), pa.int64())}), "id")
    log.delete([KeyRangeDelete(f, 1.5, 3.5)])
    assert "is not a int64 value" in why_not(log.storage, resolve(log), ["id"])
    assert sorted(r.id for r in read(spark, uri).collect()) == [0, 1, 4, 5, 6, 7, 8, 9]


def test_row_groups_the_manifest_lies_about_are_refused_not_read(spark, events):
    """Same total, different row groups: a deleted row group would become the
    wrong positions. The driver sends the version to the workers, which refuse."""
    import json

    from castsql.format.layout import manifest_key

    uri, ev = events
    st = ev.log.storage
    v = ev.log.latest().version
    doc = json.loads(st.get(manifest_key(v)))
    entry = doc["files"]["inline"][0]
    assert entry["row_group_rows"][:4] == [100, 100, 100, 100]
    entry["row_group_rows"][2:4] = [50, 150]
    st.delete(manifest_key(v))
    st.put_if_absent(manifest_key(v), json.dumps(doc).encode())
    log = TableLog(open_storage(uri))
    assert "the manifest says [100, 100, 50, 150" in why_not(log.storage, resolve(log, v), ["id"])
    with pytest.raises(Exception, match="holds 100 rows, expected 150"):
        read(spark, uri, v).collect()
