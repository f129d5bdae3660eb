"""Spark on evolved tables (FORMAT.md §3.4) and Spark's primary-key check.

One history, local and S3: a table created with an int32 key, a date, a
float; widened (int64, timestamp, double) and given a column by ALTER
versions; then a Spark append with ``merge_schema=True`` adding another
column; a Spark delete on a widened column; a compaction rewriting the old
file; ``castsql restore`` to the first version. At every version the Spark
reader equals the embedded engine. Then the key check of Spark's append."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import castsql
from castsql.engine.session import Session
from castsql.errors import SchemaMismatch, WriteError
from castsql.format import TableLog
from castsql.format.layout import DATA_DIR
from castsql.spark import append, read
from castsql.storage import open_storage
from castsql.write.keys import DuplicateKey

pytestmark = pytest.mark.spark

V1 = pa.schema([("id", pa.int32()), ("d", pa.date32()), ("x", pa.float32()), ("v", pa.string())])


def v1_rows(ids):
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "d": pa.array([date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
            "x": pa.array([i / 4 for i in ids], pa.float32()),
            "v": [f"v{i}" for i in ids],
        }
    )


def engine_rows(uri, s3, version):
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    with Session(uri, s3=s3) as s:
        return s.sql(f"SELECT * FROM {name} AS OF VERSION {version} ORDER BY id")


def spark_rows(spark, uri, s3, version):
    return read(spark, uri, version, s3=s3).toArrow().sort_by("id")


def same(spark, uri, s3, version):
    """Spark and the engine read ``version`` alike: names, values (types as Spark has them)."""
    got, want = spark_rows(spark, uri, s3, version), engine_rows(uri, s3, version)
    assert got.column_names == want.column_names, f"v{version}"
    assert got.to_pylist() == want.to_pylist(), f"v{version}: spark reader differs from the engine"
    return got


def test_spark_on_an_evolved_table(spark, storage_root, s3_config, capsys):
    from castsql.spark import compact, delete
    from castsql.write_cli import main

    uri = storage_root + "/evo"
    st = open_storage(uri, s3=s3_config)
    TableLog.create(st, V1, primary_key="id")
    with castsql.open(uri, s3=s3_config) as t:
        t.append(v1_rows(range(10)))  # v1
        t.widen_columns({"id": "int64", "d": "timestamp[us]", "x": "double"})  # v2
        t.add_columns({"note": "string"})  # v3
    df = spark.createDataFrame(
        [(i, datetime(2024, 2, 1, i), i / 2, f"v{i}", f"n{i}", i * 10) for i in range(10, 20)],
        "id long, d timestamp_ntz, x double, v string, note string, extra long",
    ).coalesce(1)
    m4 = append(spark, uri, df, s3=s3_config, merge_schema=True)  # v4
    assert m4.version == 4 and m4.summary["added_columns"] == [{"name": "extra", "type": "int64"}]
    assert m4.schema.column("extra").added_in == 4

    v1 = same(spark, uri, s3_config, 1)
    assert v1.schema.field("id").type == pa.int32() and v1.schema.field("d").type == pa.date32()
    assert v1.column_names == ["id", "d", "x", "v"]
    v2 = same(spark, uri, s3_config, 2)
    assert v2.schema.field("id").type == pa.int64() and v2.schema.field("d").type == pa.timestamp("us")
    assert v2.column("d")[3].as_py() == datetime(2024, 1, 4) and v2.column("x")[1].as_py() == 0.25
    assert same(spark, uri, s3_config, 3).column("note").null_count == 10
    v4 = same(spark, uri, s3_config, 4)
    assert v4.column_names == ["id", "d", "x", "v", "note", "extra"] and v4.num_rows == 20
    assert v4.column("extra").to_pylist() == [None] * 10 + [i * 10 for i in range(10, 20)]

    # A delete whose condition reads a widened column and an added one.
    m5 = delete(spark, uri, "d < TIMESTAMP_NTZ'2024-01-04 00:00:00' AND extra IS NULL", s3=s3_config)
    assert m5.summary["deleted_rows"] == 3
    assert same(spark, uri, s3_config, 5).column("id").to_pylist() == list(range(3, 20))

    # Compaction rewrites the old file (int32, date, float, no note or extra) in the head's schema.
    m6 = compact(spark, uri, threshold=0.2, s3=s3_config)
    assert m6.summary["removed_files"] == 1 and m6.schema == m4.schema
    after = same(spark, uri, s3_config, 6)
    assert after.to_pylist() == same(spark, uri, s3_config, 5).to_pylist()
    new = [f for f in m6.data_files if f.path not in {g.path for g in m4.data_files}]
    [key] = [f.path for f in new]
    pf = pq.ParquetFile(pa.BufferReader(st.get(key)))
    assert pf.schema_arrow.field("id").type == pa.int64() and pf.schema_arrow.field("d").type == pa.timestamp("us")
    assert "extra" in pf.schema_arrow.names

    # Restore to version 1: its rows, in the head's (grown, widened) schema.
    if s3_config is None:
        assert main(["restore", uri, "--version", "1"]) == 0
        assert "restore to version 1: committed version 7" in capsys.readouterr().out
    else:
        TableLog(st).restore(1)
    got = same(spark, uri, s3_config, 7)
    assert got.column_names == v4.column_names and got.column("id").to_pylist() == list(range(10))
    assert got.column("extra").null_count == 10


def test_spark_append_keys_are_unique(spark, events_df, tmp_path):
    uri = str(tmp_path / "pk")
    append(spark, uri, events_df(range(0, 100), partitions=2), primary_key="id")
    v = TableLog(open_storage(uri)).latest().version
    data = open_storage(uri).child(DATA_DIR)
    files_before = sorted(o.key for o in data.list())
    with pytest.raises(DuplicateKey) as e:
        append(spark, uri, events_df([500, 7, 42, 501]))
    assert str(e.value).startswith(
        f"table {open_storage(uri).root}: append: 2 key(s) are already in the table at version {v} (id = 7, id = 42)"
    )
    with pytest.raises(DuplicateKey, match="the data holds key id = 600 more than once"):
        append(spark, uri, events_df([600, 600, 601], partitions=2))
    assert TableLog(open_storage(uri)).latest().version == v
    assert sorted(o.key for o in data.list()) == files_before  # refused appends leave no file behind
    m = append(spark, uri, events_df([7, 700]), allow_duplicate_keys=True)
    assert m.version == v + 1
    with castsql.open(uri) as t:
        assert t.to_arrow(["id"]).column("id").to_pylist().count(7) == 2


def test_cli_append_merge_schema_and_bad_csv_values(spark, tmp_path, capsys):
    from conftest import events_rows

    from castsql.write_cli import main

    uri = str(tmp_path / "events")
    src = tmp_path / "a.parquet"
    pq.write_table(events_rows(range(5)), src)
    assert main(["append", "--engine", "spark", uri, "--from", str(src), "--primary-key", "id"]) == 0
    header = "id,ts,user,kind,amount,country\n"
    good = tmp_path / "new.csv"
    good.write_text(header + "".join(f"{i},2025-01-01 00:00:00Z,u{i},view,{i}.5,c{i}\n" for i in range(5, 8)))
    capsys.readouterr()
    assert main(["append", "--engine", "spark", uri, "--from", str(good)]) == 1
    err = capsys.readouterr().err
    assert "unknown columns ['country'] (merge_schema=True / --merge-schema adds them)" in err
    assert main(["append", "--engine", "spark", uri, "--from", str(good), "--merge-schema"]) == 0
    assert "committed version 2" in capsys.readouterr().out
    m = TableLog(open_storage(uri)).latest()
    assert m.schema.names[-1] == "country" and m.schema.column("country").added_in == 2
    with castsql.open(uri) as t:
        got = t.to_arrow(["id", "amount", "country"]).sort_by("id").to_pylist()
    assert got[4] == {"id": 4, "amount": events_rows([4]).column("amount")[0].as_py(), "country": None}
    assert got[5] == {"id": 5, "amount": 5.5, "country": "c5"}

    bad = tmp_path / "bad.csv"
    bad.write_text(header + "8,2025-01-01 00:00:00Z,u8,view,1.5,x\n9,2025-01-01 00:00:00Z,u9,view,abc,x\n")
    assert main(["append", "--engine", "spark", uri, "--from", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"castsql append: error: {bad} line 3: column 'amount': 'abc' (string in the file) is not a double value, "
        "the table's type; nothing was written"
    )
    assert main(["append", "--engine", "spark", uri, "--from", str(good)]) == 1  # keys 5-7 are taken
    assert "3 key(s) are already in the table at version 2 (id = 5, id = 6, id = 7)" in capsys.readouterr().err
    assert TableLog(open_storage(uri)).latest().version == 2


def test_spark_merge_and_update_with_merge_schema(spark, storage_root, s3_config):
    """``castsql.spark.merge`` / ``update`` take ``merge_schema`` as the embedded
    engine does: new columns (nullable, at the end) and widenings in the
    version that writes the rows; without it, update refuses the new column."""
    from castsql.spark import merge, update

    uri = storage_root + "/mrg"
    st = open_storage(uri, s3=s3_config)
    TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.int32())]), primary_key="id")
    with castsql.open(uri, s3=s3_config) as t:
        t.append(pa.table({"id": [1, 2, 3], "v": pa.array([10, 20, 30], pa.int32())}))  # v1
    src = spark.createDataFrame([(2, 200, "upd"), (4, 2**40, "new")], "id long, v long, note string")
    m = (
        merge(spark, uri, src, on="id", s3=s3_config, merge_schema=True)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    assert (m.version, m.num_target_rows_updated, m.num_target_rows_inserted) == (2, 1, 1)
    man = TableLog(st).manifest(2)
    assert man.operation == "MERGE" and man.summary["added_columns"] == [{"name": "note", "type": "string"}]
    assert man.summary["widened_columns"] == [{"name": "v", "from": "int32", "to": "int64"}]
    assert man.schema.column("note").added_in == 2
    assert same(spark, uri, s3_config, 2).to_pylist() == [
        {"id": 1, "v": 10, "note": None},
        {"id": 2, "v": 200, "note": "upd"},
        {"id": 3, "v": 30, "note": None},
        {"id": 4, "v": 2**40, "note": "new"},
    ]
    assert same(spark, uri, s3_config, 1).column_names == ["id", "v"]

    with pytest.raises(WriteError, match=r"update: column 'country' does not exist .*merge_schema=True adds it"):
        update(spark, uri, {"country": "'NL'"}, "id = 1", s3=s3_config)
    with pytest.raises(SchemaMismatch, match="new column 'gone' holds only nulls"):
        update(spark, uri, {"gone": "NULL"}, s3=s3_config, merge_schema=True)
    assert TableLog(st).latest().version == 2
    m = update(spark, uri, {"country": "'NL'", "ID2": "id * 2"}, "id >= 3", s3=s3_config, merge_schema=True)
    assert (m.version, m.operation, m.summary["updated_rows"]) == (3, "UPDATE", 2)
    assert m.summary["added_columns"] == [{"name": "country", "type": "string"}, {"name": "ID2", "type": "int64"}]
    assert [c.added_in for c in m.schema.columns] == [None, None, 2, 3, 3]
    got = same(spark, uri, s3_config, 3)
    assert got.column("country").to_pylist() == [None, None, "NL", "NL"]
    assert got.column("ID2").to_pylist() == [None, None, 6, 8]
    # A column already there is updated, not added again (any case); nothing changes the schema.
    m = update(spark, uri, {"id2": "0"}, "id = 1", s3=s3_config, merge_schema=True)
    assert "added_columns" not in m.summary and m.schema == TableLog(st).manifest(3).schema
    assert same(spark, uri, s3_config, 4).column("ID2").to_pylist() == [0, None, 6, 8]


@pytest.mark.parametrize("engine", ["spark", "duckdb"])
def test_cli_merge_and_update_merge_schema(spark, tmp_path, capsys, engine):
    from castsql.write_cli import main

    uri = str(tmp_path / "t")
    TableLog.create(open_storage(uri), pa.schema([("id", pa.int64()), ("v", pa.int32())]), primary_key="id")
    with castsql.open(uri) as t:
        t.append(pa.table({"id": [1, 2, 3], "v": pa.array([10, 20, 30], pa.int32())}))  # v1
    src = tmp_path / "src.parquet"
    pq.write_table(pa.table({"id": [3, 4], "v": pa.array([33, 44], pa.int32()), "note": ["u", "i"]}), src)
    capsys.readouterr()
    args = ["merge", uri, "--from", str(src), "--on", "id", "--engine", engine]
    assert main(args) == 0  # without the flag the source's new column is not written (Delta's rule)
    assert "note" not in TableLog(open_storage(uri)).latest().schema.names
    assert main([*args, "--merge-schema"]) == 0
    out = capsys.readouterr().out
    assert "merge: committed version 3; 0 inserted, 2 updated" in out and "schema: added note string" in out
    upd = ["update", uri, "--set", "country = 'NL'", "--where", "id = 1", "--engine", engine]
    assert main(upd) == 1
    assert "merge_schema=True adds it" in capsys.readouterr().err
    assert main([*upd, "--merge-schema"]) == 0
    assert "schema: added country string" in capsys.readouterr().out
    m = TableLog(open_storage(uri)).latest()
    assert (m.version, m.schema.names) == (4, ["id", "v", "note", "country"])
    with castsql.open(uri) as t:
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "v": 10, "note": None, "country": "NL"},
            {"id": 2, "v": 20, "note": None, "country": None},
            {"id": 3, "v": 33, "note": "u", "country": None},
            {"id": 4, "v": 44, "note": "i", "country": None},
        ]


def test_spark_writers_fill_missing_columns_with_null_but_not_the_key(spark, tmp_path, capsys):
    """``castsql.spark.append``, ``format("castsql")`` writes and ``castsql append``
    store table columns their input lacks as NULL (Delta's rule, the embedded
    writer's too); a missing primary key is refused naming it, nothing written."""
    from conftest import events_rows

    from castsql.write_cli import main

    uri = str(tmp_path / "events")
    src = tmp_path / "a.parquet"
    pq.write_table(events_rows(range(5)), src)
    assert main(["append", "--engine", "spark", uri, "--from", str(src), "--primary-key", "id"]) == 0  # v1
    rows = spark.createDataFrame(events_rows(range(5, 10))).coalesce(1)
    m = append(spark, uri, rows.drop("amount", "user"))  # v2
    assert m.version == 2 and m.summary["added_rows"] == 5
    spark.createDataFrame(events_rows(range(10, 15))).drop("kind").write.format("castsql").mode("append").save(uri)
    csv = tmp_path / "b.csv"
    csv.write_text("id,kind,ts\n20,view,2025-01-01 00:00:00Z\n21,click,2025-01-02 00:00:00Z\n")
    capsys.readouterr()
    assert main(["append", "--engine", "spark", uri, "--from", str(csv)]) == 0  # v4
    assert "append: committed version 4; 1 file(s), 2 row(s)" in capsys.readouterr().out
    got = same(spark, uri, None, 4)
    assert got.column_names == ["id", "ts", "user", "kind", "amount"]
    want = events_rows(range(15)).to_pylist()
    for r in want:
        if 5 <= r["id"] < 10:
            r["amount"] = r["user"] = None
        elif r["id"] >= 10:
            r["kind"] = None
    want += [{"id": 20, "user": None, "kind": "view", "amount": None}, {"id": 21, "user": None, "kind": "click",
                                                                          "amount": None}]  # fmt: skip
    cols = ["id", "user", "kind", "amount"]
    assert got.select(cols).to_pylist() == [{c: r[c] for c in cols} for r in want]
    assert got.column("ts").to_pylist()[:15] == events_rows(range(15)).column("ts").to_pylist()
    assert str(got.column("ts")[15].as_py()) == "2025-01-01 00:00:00+00:00"

    files = sorted(o.key for o in open_storage(uri).list("data/"))
    with pytest.raises(SchemaMismatch, match="the data has no column 'id', the table's primary key"):
        append(spark, uri, rows.drop("id"), allow_duplicate_keys=True)
    with pytest.raises(Exception, match=r"the data has no column id \(int64\), the table's primary key"):
        rows.drop("id").write.format("castsql").mode("overwrite").save(uri)
    csv.write_text("kind,amount\nview,1.5\n")
    assert main(["append", "--engine", "spark", uri, "--from", str(csv)]) == 1
    err = capsys.readouterr().err
    assert "the data has no column 'id', the table's primary key" in err and len(err.splitlines()) == 1
    assert TableLog(open_storage(uri)).latest().version == 4
    assert sorted(o.key for o in open_storage(uri).list("data/")) == files


def test_cli_append_csv_text_is_parsed_into_the_table_types(spark, tmp_path, capsys):
    """CSV carries no types: ``castsql append`` parses each table column's text
    into the table's type, whatever Spark would infer (``1.25`` into a decimal,
    ``0007`` into a string, ``3`` into a float), and refuses a value that does
    not parse, or would not be stored as written, naming the file and the line."""
    from castsql.write_cli import main

    uri = str(tmp_path / "t")
    schema = pa.schema(
        [("id", pa.int64()), ("n", pa.int32()), ("d", pa.date32()), ("p", pa.decimal128(5, 2)),
         ("f", pa.float32()), ("t", pa.timestamp("us")), ("code", pa.string())]
    )  # fmt: skip
    TableLog.create(open_storage(uri), schema, primary_key="id")
    header = "id,n,d,p,f,t,code\n"
    good = tmp_path / "good.csv"
    good.write_text(header + "1,7,2024-01-05,1.25,3,2024-01-05 10:00:00,0007\n2,8,2024-01-06,2,0.5,2024-01-06,12\n")
    capsys.readouterr()
    assert main(["append", "--engine", "spark", uri, "--from", str(good)]) == 0, capsys.readouterr().err
    with castsql.open(uri) as t:
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "n": 7, "d": date(2024, 1, 5), "p": Decimal("1.25"), "f": 3.0,
             "t": datetime(2024, 1, 5, 10), "code": "0007"},
            {"id": 2, "n": 8, "d": date(2024, 1, 6), "p": Decimal("2.00"), "f": 0.5,
             "t": datetime(2024, 1, 6), "code": "12"},
        ]  # fmt: skip
    ok = "3,9,2024-01-07,1.5,1.5,2024-01-07 00:00:00,x\n"
    cases = [
        ("4,1,2024-01-07,1.5,1.5,2024-01-07,x\n", "abc,1,2024-01-07,1.5,1.5,2024-01-07,x\n",
         "column 'id': 'abc' (string in the file) is not a int64 value, the table's type"),
        ("4,2.5,2024-01-07,1.5,1.5,2024-01-07,x\n", None,
         "column 'n': '2.5' (string in the file) is not a int32 value, the table's type"),
        ("4,99999999999,2024-01-07,1.5,1.5,2024-01-07,x\n", None,
         "column 'n': '99999999999' (string in the file) is not a int32 value, the table's type"),
        ("4,1,2024-02-30,1.5,1.5,2024-01-07,x\n", None,
         "column 'd': '2024-02-30' (string in the file) is not a date32[day] value, the table's type"),
        ("4,1,2024-01-07 10:30:00,1.5,1.5,2024-01-07,x\n", None,
         "column 'd': '2024-01-07 10:30:00' (string in the file) is not a date32[day] value (it has a time of day)"),
        ("4,1,2024-01-07,1.234,1.5,2024-01-07,x\n", None,
         "column 'p': '1.234' (string in the file) is not a decimal128(5, 2) value (it would be rounded)"),
        ("4,1,2024-01-07,1.5,1e300,2024-01-07,x\n", None,
         "column 'f': '1e300' (string in the file) is not a float value (it is out of range)"),
        ("4,1,2024-01-07,1.5,1.5,2024-01-07T10:00:00+02:00,x\n", None,
         "column 't': '2024-01-07T10:00:00+02:00' (string in the file) is not a timestamp[us] value "
         "(its time zone would be dropped)"),
    ]  # fmt: skip
    for i, (line2, line3, message) in enumerate(cases):
        bad = tmp_path / f"bad{i}.csv"
        bad.write_text(header + ok + line2 + (line3 or ""))
        assert main(["append", "--engine", "spark", uri, "--from", str(bad)]) == 1
        err = capsys.readouterr().err.strip()
        line = 4 if line3 else 3
        assert err.startswith(f"castsql append: error: {bad} line {line}: {message}"), err
        assert err.endswith("nothing was written") and "\n" not in err
    assert TableLog(open_storage(uri)).latest().version == 1
