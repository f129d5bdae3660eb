"""castsql.spark.append to a local table through Spark's own Parquet writer:
the files Spark's committer kept, their manifest entries made from their
footers, one version."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from user_session import run_flaky

import castsql
from castsql.format import TableLog, write_data_files
from castsql.snapshot import resolve
from castsql.spark import append, gc, read
from castsql.spark.native_read import why_not as why_not_read
from castsql.spark.native_write import why_not
from castsql.storage import open_storage
from castsql.write.keys import DuplicateKey

pytestmark = pytest.mark.spark

EVERY_TYPE = [
    "id",
    "CAST(id AS INT) AS i",
    "CAST(id % 100 AS TINYINT) AS b",
    "CAST(id % 1000 AS SMALLINT) AS sm",
    "timestamp_micros(id * 1000001) AS ts",
    "CAST(timestamp_micros(id * 7) AS TIMESTAMP_NTZ) AS ntz",
    "date_add(DATE'1500-01-01', CAST(id AS INT)) AS d",  # before 1582: no rebase
    "IF(id % 7 = 0, NULL, concat('u', id)) AS s",
    "CAST(id AS DOUBLE) / 3 AS f",
    "CAST(id AS FLOAT) AS f32",
    "id % 2 = 0 AS flag",
    "CAST(id AS DECIMAL(10, 2)) AS dec",
    "CAST(id AS DECIMAL(30, 4)) AS wide",
    "CAST(concat('b', id) AS BINARY) AS bin",
    "CAST(NULL AS STRING) AS nothing",
    "id % 3 AS rep",
    "element_at(array('a', 'b'), CAST(id % 2 AS INT) + 1) AS ab",
]


def _data_files(uri: str) -> set[str]:
    return {i.key for i in open_storage(uri).list("data/")}


def _rows(uri: str) -> list[dict]:
    return castsql.open(uri).to_arrow().sort_by("id").to_pylist()


def test_every_type_is_written_by_spark_as_castsqls_writer_writes_it(spark, tmp_path):
    df = spark.range(1000).selectExpr(*EVERY_TYPE)
    native, workers = str(tmp_path / "native"), str(tmp_path / "workers")
    m = append(spark, native, df.repartition(3, "id"), primary_key="id", row_group_size=100)
    # target_file_bytes is the Python workers' setting: the same rows through them.
    w = append(spark, workers, df.coalesce(1), primary_key="id", row_group_size=100, target_file_bytes=1 << 30)
    assert [f.path.split("/")[-1].startswith("part-") for f in m.data_files] == [True] * 3
    assert not any(f.path.split("/")[-1].startswith("part-") for f in w.data_files)
    # Spark's files, all of them in one directory of this write, and nothing else there.
    [folder] = {f.path.rsplit("/", 1)[0] for f in m.data_files}
    assert _data_files(native) == {f.path for f in m.data_files}
    assert folder.startswith("data/") and len(folder.split("/")) == 6
    assert m.summary == {"added_files": 3, "added_rows": 1000, "added_bytes": sum(f.size_bytes for f in m.data_files)}
    assert all(max(f.row_group_rows) <= 100 for f in m.data_files)
    # Numbers and times plain (distinct ids would be a dictionary of every
    # value, and parquet-mr cannot know which repeat), strings a dictionary.
    footer = pq.read_metadata(f"{native}/{m.data_files[0].path}").row_group(0)
    chunks = {footer.column(i).path_in_schema: footer.column(i) for i in range(footer.num_columns)}
    assert not any(chunks[c].has_dictionary_page for c in ("id", "i", "ts", "f", "rep"))
    assert chunks["ab"].has_dictionary_page
    assert m.schema == w.schema

    # Entries from footers say what the workers' entries say of the same rows.
    one = append(spark, str(tmp_path / "one"), df.coalesce(1), row_group_size=100)
    [a], [b] = one.data_files, w.data_files
    assert (a.total_rows, a.row_group_rows, a.min, a.max) == (b.total_rows, b.row_group_rows, b.min, b.max)
    assert set(a.min) == {"id", "i", "b", "sm", "ts", "ntz", "d", "s", "f", "f32", "flag", "rep", "ab"}

    expected = _rows(workers)
    assert _rows(native) == expected and len(expected) == 1000
    assert expected[7]["s"] is None and expected[1]["d"].isoformat() == "1500-01-02"
    snap = resolve(TableLog(open_storage(native)))
    assert why_not_read(open_storage(native), snap, snap.schema.names, spark) is None
    got = read(spark, native).toArrow().sort_by("id")
    assert got.column("dec").to_pylist() == [r["dec"] for r in expected]
    assert got.column("ntz").to_pylist() == [r["ntz"] for r in expected]


def test_an_existing_tables_columns_order_and_types_are_kept(spark, tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("note", pa.string()), ("d", pa.timestamp("us"))])
    st = open_storage(uri)
    log = TableLog.create(st, schema, primary_key="id")
    first = pa.table({"id": [1], "v": [0.5], "note": ["x"], "d": [datetime(2020, 1, 1)]}, schema)
    log.append(write_data_files(st, first, log.latest().schema))
    # Narrower types, another order, a column missing: the files hold the table's.
    df = spark.createDataFrame([(2.5, 2, "2021-03-04"), (3.5, 3, None)], "v float, id int, d string")
    df = df.selectExpr("v", "id", "CAST(d AS DATE) AS d")
    m = append(spark, uri, df)
    assert m.version == 2 and m.schema == log.manifest(1).schema
    assert _rows(uri) == [
        {"id": 1, "v": 0.5, "note": "x", "d": datetime(2020, 1, 1)},
        {"id": 2, "v": 2.5, "note": None, "d": datetime(2021, 3, 4)},
        {"id": 3, "v": 3.5, "note": None, "d": None},
    ]
    assert any(f.path.split("/")[-1].startswith("part-") for f in m.data_files)


def test_a_duplicate_key_is_refused_and_its_files_are_removed(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(100)), primary_key="id")
    before, files = TableLog(open_storage(uri)).latest(), _data_files(uri)
    with pytest.raises(DuplicateKey, match=r"id = 99"):
        append(spark, uri, events_df(range(99, 200), partitions=2))
    assert TableLog(open_storage(uri)).latest() == before
    assert _data_files(uri) == files


def test_an_empty_dataframe_writes_nothing(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(10)), primary_key="id")
    files = _data_files(uri)
    m = append(spark, uri, events_df(range(10)).where("id < 0"))
    assert m.version == 1 and _data_files(uri) == files


def test_types_spark_cannot_store_as_they_are_go_to_the_workers(spark, tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("n", pa.uint32())])
    TableLog.create(open_storage(uri), schema)
    log = TableLog(open_storage(uri))
    assert why_not(log.storage, log.latest().schema, spark) == (
        "column 'n' is uint32, which Spark's writer cannot store as it is"
    )
    m = append(spark, uri, spark.createDataFrame([(1,)], "id bigint"))  # n: NULL
    [f] = m.data_files
    assert not f.path.split("/")[-1].startswith("part-")  # the workers' file
    assert _rows(uri) == [{"id": 1, "n": None}]


FLAKY_APPEND = """
m = cs.append(spark, uri, df, primary_key="id", row_group_size=1000)
assert all("/part-" in f.path for f in m.data_files), m.data_files
"""


def test_a_task_attempt_that_fails_once_commits_one_version_and_leaves_no_file(tmp_path):
    uri = run_flaky(tmp_path, FLAKY_APPEND)
    log = TableLog(open_storage(uri))
    assert [m.version for m in log.history()] == [0, 1]
    assert sorted(castsql.open(uri).to_arrow()["id"].to_pylist()) == list(range(20000))  # every row once
    # Spark's committer removed the failed attempt's files: nothing is left for GC.
    assert _data_files(uri) == {f.path for f in log.latest().data_files}
    report = gc(uri, grace=timedelta(0), now=datetime.now(UTC) + timedelta(seconds=1))
    assert not report.removed_orphans and not report.removed_data_files


def test_a_path_with_a_colon_and_a_space_is_written_and_read_by_spark(spark, tmp_path):
    uri = str(tmp_path / "a:b c" / "t")
    m = append(spark, uri, spark.createDataFrame([(1,), (2,)], "id bigint"))
    assert why_not(open_storage(uri), m.schema) is None
    assert m.data_files[0].path.split("/")[-1].startswith("part-")
    assert _rows(uri) == [{"id": 1}, {"id": 2}]
    snap = resolve(TableLog(open_storage(uri)))
    assert why_not_read(open_storage(uri), snap, ["id"], spark) is None
    assert sorted(r.id for r in read(spark, uri).collect()) == [1, 2]
