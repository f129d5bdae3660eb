"""Schema evolution (FORMAT.md §3.4): columns added and types widened, each a
version of its own or inside an append; every version reads with its own
schema through every reader path (SQL, Table.to_arrow with and without a
pruning filter, time travel, table_changes across the change), on a local
disk and on S3; refusals name the table, the column and both types and
commit nothing; one type rule for the input of every writer."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import castsql
from castsql.errors import SchemaMismatch
from castsql.format import TableLog, write_data_files
from castsql.format.evolution import fits, widens
from castsql.storage import open_storage

BASE = pa.schema(
    [("id", pa.int64()), ("n", pa.int32()), ("d", pa.date32()), ("f", pa.float32()), ("p", pa.decimal128(5, 2))]
)
D = dt.date(2024, 1, 1)


def batch(ids, extra=None, wide=False):
    """Rows whose values derive from their id (so a model can predict them)."""
    cols = {
        "id": pa.array(ids, pa.int64()),
        "n": pa.array([i * 10 for i in ids], pa.int64() if wide else pa.int32()),
        "d": pa.array(
            [dt.datetime(2024, 1, 1 + i % 28, 6) if wide else D + dt.timedelta(days=i % 28) for i in ids],
            pa.timestamp("us") if wide else pa.date32(),
        ),
        "f": pa.array([i + 0.5 for i in ids], pa.float64() if wide else pa.float32()),
        "p": pa.array([f"{i}.25" for i in ids], pa.string()).cast(pa.decimal128(9 if wide else 5, 2)),
    }
    for name, fn in (extra or {}).items():
        cols[name] = fn(ids)
    return pa.table(cols)


@pytest.fixture
def history(storage_root, s3_config):
    """v0 create; v1 append; v2 add c; v3 append with c; v4 delete (a tombstone);
    v5 widen n, d, f, p; v6 append with merge_schema adding e, wide values;
    and the rows each version must read."""
    st = open_storage(storage_root + "/evo", s3=s3_config)
    TableLog.create(st, BASE, primary_key="id")
    t = castsql.open(st.root, s3=s3_config)
    assert t.append(batch(range(0, 10))).version == 1
    m = t.add_columns({"c": "string"})
    assert (m.version, m.operation, m.summary["added_columns"]) == (2, "ALTER", [{"name": "c", "type": "string"}])
    assert t.append(batch(range(10, 15), {"c": lambda ids: [f"c{i}" for i in ids]})).version == 3
    assert t.delete("id IN (3, 12)").version == 4
    m = t.widen_columns({"n": "int64", "d": "timestamp[us]", "f": "double", "p": "decimal128(9, 2)"})
    assert m.version == 5 and m.operation == "ALTER" and len(m.summary["widened_columns"]) == 4
    m = t.append(
        batch(range(15, 18), {"c": lambda ids: ["z"] * len(ids), "e": lambda ids: [True] * len(ids)}, wide=True),
        merge_schema=True,
    )
    assert m.version == 6 and m.summary["added_columns"] == [{"name": "e", "type": "bool"}]
    assert [c.added_in for c in m.schema.columns] == [None, None, None, None, None, 2, 6]
    yield t
    t.close()


def expected(version: int) -> tuple[list[str], list[dict]]:
    cols = ["id", "n", "d", "f", "p"] + (["c"] if version >= 2 else []) + (["e"] if version >= 6 else [])
    ids = [*range(0, 10)] * (version >= 1) + [*range(10, 15)] * (version >= 3) + [*range(15, 18)] * (version >= 6)
    if version >= 4:
        ids = [i for i in ids if i not in (3, 12)]
    from decimal import Decimal

    rows = []
    for i in ids:
        wide_row = i >= 15
        day = D + dt.timedelta(days=i % 28)
        r = {
            "id": i,
            "n": i * 10,
            "d": (dt.datetime(2024, 1, 1 + i % 28, 6) if wide_row else dt.datetime.combine(day, dt.time()))
            if version >= 5
            else day,
            "f": i + 0.5,
            "p": Decimal(f"{i}.25"),
        }
        if version >= 2:
            r["c"] = f"c{i}" if 10 <= i < 15 else ("z" if wide_row else None)
        if version >= 6:
            r["e"] = True if wide_row else None
        rows.append(r)
    return cols, rows


TYPES = {
    4: ["int64", "int32", "date32[day]", "float", "decimal128(5, 2)", "string"],
    5: ["int64", "int64", "timestamp[us]", "double", "decimal128(9, 2)", "string"],
    6: ["int64", "int64", "timestamp[us]", "double", "decimal128(9, 2)", "string", "bool"],
}


def by_id(t: pa.Table) -> list[dict]:
    return sorted(t.to_pylist(), key=lambda r: r["id"])


def test_every_version_reads_with_its_own_schema(history):
    t = history
    session = t._session
    for v in range(7):
        cols, rows = expected(v)
        at = t.at(version=v)
        got = at.to_arrow()
        assert got.column_names == cols, v
        assert [str(x) for x in got.schema.types][: len(TYPES.get(v, TYPES[4]))] == TYPES.get(v, TYPES[4])[
            : len(cols)
        ], v
        assert by_id(got) == rows, v
        sql = session.sql(f"SELECT * FROM {t.name} AS OF VERSION {v}")
        assert sql.column_names == cols and by_id(sql) == rows, v
        assert at.schema.names == cols
        # A pruning filter on a widened column: statistics of old files (dates,
        # int32, float) compare in the new type.
        if v >= 5:
            flt = at.to_arrow(filter="d >= TIMESTAMP '2024-01-05 00:00:00' AND n >= 40 AND f > 3.9")
            want = [r for r in rows if r["d"] >= dt.datetime(2024, 1, 5) and r["n"] >= 40 and r["f"] > 3.9]
            assert by_id(flt) == want, v
            exact = at.to_arrow(filter="d = TIMESTAMP '2024-01-05 00:00:00'")
            assert [r["id"] for r in by_id(exact)] == [4]
        if v >= 2:
            assert at.to_arrow(["id"], filter="c IS NULL").num_rows == sum(r["c"] is None for r in rows)


def test_table_changes_across_schema_changes(history):
    t = history
    for start in range(1, 7):  # both ends included
        ch = t.changes(start, 6)
        cols, _ = expected(6)
        assert ch.column_names[: len(cols)] == cols  # the end version's columns and types
        inserted = {r["id"]: r for r in ch.to_pylist() if r["_change_type"] == "insert"}
        deleted = {r["id"] for r in ch.to_pylist() if r["_change_type"] == "delete"}
        want_ins = {r["id"]: r for r in expected(6)[1]} | {3: None, 12: None}
        want_ins = {
            i: r
            for i, r in want_ins.items()
            if (i < 10 and start <= 1) or (10 <= i < 15 and start <= 3) or (i >= 15 and start <= 6)
        }
        # rows inserted and deleted within the range show both
        assert set(inserted) == set(want_ins), start
        assert deleted == ({3, 12} if start <= 4 else set())
        for i, r in inserted.items():
            if r is not None and i not in (3, 12):
                assert r["c"] == (f"c{i}" if 10 <= i < 15 else ("z" if i >= 15 else None))
                assert r["e"] == (True if i >= 15 else None)
        if start <= 4:  # ending before the widening: version 4's columns and types
            mid = t.changes(start, 4)
            assert mid.column_names[:6] == ["id", "n", "d", "f", "p", "c"]
            assert mid.schema.field("n").type == pa.int32() and mid.schema.field("d").type == pa.date32()


def test_refusals_name_column_and_types_and_commit_nothing(history):
    t = history
    v = t.at().version
    cases = [
        (lambda: t.widen_columns({"n": "int32"}), "column 'n' cannot change from int64 to int32"),
        (lambda: t.widen_columns({"f": "float"}), "column 'f' cannot change from double to float"),
        (lambda: t.widen_columns({"c": "int64"}), "column 'c' cannot change from string to int64"),
        (lambda: t.widen_columns({"p": "decimal128(12, 3)"}), "from decimal128\\(9, 2\\) to decimal128\\(12, 3\\)"),
        (lambda: t.widen_columns({"nope": "int64"}), "no column 'nope' to widen"),
        (lambda: t.widen_columns({"id": "double"}), "column 'id' cannot change from int64 to double"),
        (lambda: t.add_columns({"C": "string"}), "column 'C' already exists \\(as 'c'\\)"),
        (lambda: t.add_columns({"x": "varchar(3"}), "column 'x': unknown type"),
        (
            lambda: t.append(batch([100], {"c": lambda i: ["q"], "e": lambda i: [1]}, wide=True)),
            "column 'e' is int64 in the data, the table has bool",
        ),
        (
            lambda: t.append(batch([100], {"c": lambda i: ["q"], "e": lambda i: [True], "z": lambda i: [1]}, True)),
            "unknown columns \\['z'\\] \\(merge_schema=True",
        ),
        (
            lambda: t.append(batch([100], {"c": lambda i: [1], "e": lambda i: [True]}, wide=True), merge_schema=True),
            "column 'c' is int64 in the data, the table has string",
        ),
    ]
    for call, message in cases:
        with pytest.raises(SchemaMismatch, match=message) as e:
            call()
        assert "\n" not in str(e.value)
        assert t.at().version == v and t.at().to_arrow().num_rows == len(expected(6)[1])


def test_append_fills_missing_columns_with_null_but_not_the_key(storage_root, s3_config):
    """Delta's rule for every append: table columns the data lacks are stored as
    NULL (in the file: older readers and engines see the column); a missing
    primary key is refused naming it, with nothing written."""
    st = open_storage(storage_root + "/fill", s3=s3_config)
    TableLog.create(st, pa.schema([("id", pa.int64()), ("n", pa.int32()), ("c", pa.string())]), primary_key="id")
    with castsql.open(st.root, s3=s3_config) as t:
        t.append(pa.table({"id": [1], "n": pa.array([10], pa.int32()), "c": ["a"]}))
        m = t.append(pa.table({"c": ["b", "c"], "id": [2, 3]}))  # n missing, another column order
        assert m.version == 2 and m.summary["added_rows"] == 2 and "added_columns" not in m.summary
        assert by_id(t.at().to_arrow()) == [
            {"id": 1, "n": 10, "c": "a"},
            {"id": 2, "n": None, "c": "b"},
            {"id": 3, "n": None, "c": "c"},
        ]
        assert t.to_arrow(filter="n IS NULL").column("id").to_pylist() == [2, 3]
        [new] = [f for f in m.data_files if f.path not in {g.path for g in TableLog(st).manifest(1).data_files}]
        assert pq.ParquetFile(pa.BufferReader(st.get(new.path))).schema_arrow.names == ["id", "n", "c"]
        # With merge_schema: a new column added and a missing one NULL, in one version.
        m = t.append(pa.table({"id": [4], "extra": [True]}), merge_schema=True)
        assert m.summary["added_columns"] == [{"name": "extra", "type": "bool"}]
        assert by_id(t.at().to_arrow())[-1] == {"id": 4, "n": None, "c": None, "extra": True}
        files = sorted(o.key for o in st.list("data/"))
        for data, allow in ((pa.table({"n": pa.array([5], pa.int32())}), False), (pa.table({"c": ["x"]}), True)):
            with pytest.raises(SchemaMismatch) as e:
                t.append(data, allow_duplicate_keys=allow)
            assert str(e.value) == (
                f"table {t.name}: append: the data has no column 'id', the table's primary key (every row needs its "
                "key; other missing columns are stored as NULL); nothing was written"
            )
        assert t.at().version == 3 and sorted(o.key for o in st.list("data/")) == files


def test_names_equal_but_for_case_are_refused_and_nothing_is_written(tmp_path):
    """DuckDB and Spark match names without case (as Delta does): a table with
    both ``id`` and ``ID`` would read one column's values under both names."""
    st = open_storage(str(tmp_path / "case"))
    with pytest.raises(SchemaMismatch, match="columns 'A' and 'a' differ only in case"):
        TableLog.create(st, pa.schema([("A", pa.int64()), ("a", pa.int64())]))
    TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key="id")
    with castsql.open(st.root) as t:
        t.append(pa.table({"id": [1], "v": ["a"]}))
        before = sorted(o.key for o in st.list(""))
        with pytest.raises(SchemaMismatch, match=r"unknown columns \['V'\]"):  # merge matches names without case
            t.append(pa.table({"id": [2], "v": ["b"], "V": ["c"]}), merge_schema=True)
        with pytest.raises(SchemaMismatch, match=r"column 'ID' already exists \(as 'id'\)"):
            t.add_columns({"ID": "int64"})
        assert sorted(o.key for o in st.list("")) == before and t.at().version == 1


def test_an_append_planned_before_a_schema_change_still_commits(storage_root, s3_config):
    st = open_storage(storage_root + "/race", s3=s3_config)
    log = TableLog.create(st, pa.schema([("id", pa.int64()), ("n", pa.int32())]))
    old = log.latest().schema
    files = write_data_files(st, pa.table({"id": [1], "n": pa.array([7], pa.int32())}), old)
    with castsql.open(st.root, s3=s3_config) as t:
        t.add_columns({"x": "double"})
        t.widen_columns({"n": "int64"})
        m = log.append(files, schema=old)  # rebased on the evolved head
        assert m.version == 3 and [c.name for c in m.schema.columns] == ["id", "n", "x"]
        assert t.at().to_arrow().to_pylist() == [{"id": 1, "n": 7, "x": None}]


def test_concurrent_alters_merge_or_fail_naming_the_column(tmp_path):
    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    from castsql.format.change import Change
    from castsql.format.evolution import altered

    base = log.latest().schema
    a = altered(base, add={"x": "int64"}, where="a")
    b = altered(base, add={"y": "string"}, where="b")
    c = altered(base, add={"x": "string"}, where="c")
    log.commit(Change("ALTER", new_schema=a))
    m = log.commit(Change("ALTER", new_schema=b))  # planned on v0, lands on v1: both columns
    assert [(col.name, col.added_in) for col in m.schema.columns] == [("id", None), ("x", 1), ("y", 2)]
    with pytest.raises(SchemaMismatch, match="column 'x' is int64 in the table now, this change makes it string"):
        log.commit(Change("ALTER", new_schema=c))
    assert log.latest().version == 2


def test_files_objects_written_before_a_widening_still_prune(tmp_path):
    """More than 32 files fold into files objects typed by the old schema."""
    st = open_storage(str(tmp_path / "many"))
    TableLog.create(st, pa.schema([("id", pa.int64()), ("d", pa.date32()), ("n", pa.int16())]), primary_key="id")
    with castsql.open(st.root) as t:
        for i in range(40):
            t.append(pa.table({"id": [i], "d": [D + dt.timedelta(days=i)], "n": pa.array([i], pa.int16())}))
        assert t._session.log(t.name).latest().file_objects
        t.widen_columns({"d": "timestamp[us]", "n": "int32"})
        t.add_columns({"s": "string"})
        got = t.to_arrow(["id", "d", "s"], filter="d >= TIMESTAMP '2024-01-31 00:00:00' AND n < 35")
        assert [r["id"] for r in by_id(got)] == [30, 31, 32, 33, 34]
        assert got.schema.field("d").type == pa.timestamp("us") and got.column("s").null_count == 5
        assert t.to_arrow(filter="d = TIMESTAMP '2024-01-01 00:00:00'").column("id").to_pylist() == [0]
        assert t.at(version=40).to_arrow().schema.field("d").type == pa.date32()


def test_one_type_rule_for_input():
    ok = [(pa.int32(), pa.int64()), (pa.int8(), pa.int16()), (pa.uint32(), pa.int64()), (pa.int32(), pa.float64()),
          (pa.int16(), pa.float32()), (pa.float32(), pa.float64()), (pa.int32(), pa.decimal128(12, 2)),
          (pa.decimal128(5, 2), pa.decimal128(9, 3)), (pa.date32(), pa.timestamp("us")), (pa.null(), pa.string()),
          (pa.large_string(), pa.string()), (pa.timestamp("ms"), pa.timestamp("us"))]  # fmt: skip
    bad = [(pa.int64(), pa.float64()), (pa.int64(), pa.int32()), (pa.float64(), pa.float32()),
           (pa.string(), pa.int64()), (pa.int32(), pa.float32()), (pa.uint64(), pa.int64()),
           (pa.int64(), pa.decimal128(10, 0)), (pa.decimal128(9, 3), pa.decimal128(9, 2)), (pa.float64(), pa.int64()),
           (pa.date32(), pa.timestamp("us", "UTC")), (pa.int64(), pa.string()), (pa.bool_(), pa.int8())]  # fmt: skip
    assert all(fits(s, d) for s, d in ok), [(s, d) for s, d in ok if not fits(s, d)]
    assert not any(fits(s, d) for s, d in bad), [(s, d) for s, d in bad if fits(s, d)]
    assert widens("int8", "int64") and widens("date32[day]", "timestamp[us]")
    assert not widens("int64", "double") and not widens("timestamp[us]", "date32[day]")


def test_writers_apply_the_type_rule(tmp_path):
    st = open_storage(str(tmp_path / "types"))
    TableLog.create(st, pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    with castsql.open(st.root) as t:
        t.append(pa.table({"id": pa.array([1], pa.int32()), "x": pa.array([2], pa.int32())}))  # both lossless
        assert t.to_arrow().to_pylist() == [{"id": 1, "x": 2.0}]
        with pytest.raises(SchemaMismatch, match="column 'x' is int64 in the data, the table has double"):
            t.append(pa.table({"id": [2], "x": [2**53 + 1]}))
        with pytest.raises(SchemaMismatch, match="column 'x' is string in the data, the table has double"):
            t.append(pa.table({"id": [2], "x": ["2.5"]}))
        assert t.at().version == 1


def test_cli_alter_without_spark(tmp_path):
    st = open_storage(str(tmp_path / "cli"))
    TableLog.create(st, pa.schema([("id", pa.int64()), ("n", pa.int32())]))
    code = (
        "import sys; from castsql.cli import main; rc = main(sys.argv[1:]); "
        "assert 'pyspark' not in sys.modules, 'Spark imported'; sys.exit(rc)"
    )

    def run(*args):
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)

    r = run("alter", st.root, "--add-column", "country", "VARCHAR", "--widen", "n", "BIGINT")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "alter: committed version 1; added country string, widened n int32 -> int64"
    r = run("alter", st.root, "--widen", "n", "int32")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "column 'n' cannot change from int64 to int32" in r.stderr
    r = run("alter", st.root)
    assert r.returncode == 2
    assert [c.name for c in TableLog(st).latest().schema.columns] == ["id", "n", "country"]
    # Table properties, as Delta's ALTER TABLE ... SET TBLPROPERTIES: checked before anything commits.
    r = run("alter", st.root, "--add-column", "x", "BIGINT", "--set-property", "castsql.changeDataFeed=yes")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "castsql.changeDataFeed" in r.stderr
    assert TableLog(st).latest().version == 1
    r = run("alter", st.root, "--set-property", "castsql.changeDataFeed=true", "--set-property", "owner=data")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("committed version 2; castsql.changeDataFeed = true, owner = data")
    r = run("alter", st.root, "--unset-property", "owner")
    assert r.returncode == 0 and TableLog(st).latest().properties == {"castsql.changeDataFeed": "true"}
    r = run("alter", st.root, "--set-property", "castsql.changeDataFeed=true")
    assert r.returncode == 0 and "nothing committed" in r.stdout and TableLog(st).latest().version == 3


def test_merge_with_merge_schema_adds_the_source_columns_in_one_version(storage_root, s3_config):
    st = open_storage(storage_root + "/mrg", s3=s3_config)
    TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.int32())]), primary_key="id")
    with castsql.open(st.root, s3=s3_config) as t:
        t.append(pa.table({"id": [1, 2, 3], "v": pa.array([10, 20, 30], pa.int32())}))
        src = pa.table({"id": [2, 4], "v": [200, 2**40], "note": ["upd", "new"]})
        with pytest.raises(SchemaMismatch, match="column 'v' is int64 in the data, the table has int32"):
            t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        m = t.merge(src, on="id", merge_schema=True).when_matched_update_all().when_not_matched_insert_all().execute()
        assert (m.version, m.num_target_rows_updated, m.num_target_rows_inserted) == (2, 1, 1)
        man = TableLog(st).manifest(2)
        assert man.operation == "MERGE" and man.summary["added_columns"] == [{"name": "note", "type": "string"}]
        assert man.summary["widened_columns"] == [{"name": "v", "from": "int32", "to": "int64"}]
        assert by_id(t.at().to_arrow()) == [
            {"id": 1, "v": 10, "note": None},
            {"id": 2, "v": 200, "note": "upd"},
            {"id": 3, "v": 30, "note": None},
            {"id": 4, "v": 2**40, "note": "new"},
        ]
        assert t.at(version=1).to_arrow().column_names == ["id", "v"]


def test_update_with_merge_schema_adds_and_widens_in_one_version(storage_root, s3_config):
    st = open_storage(storage_root + "/upd", s3=s3_config)
    TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.int32())]), primary_key="id")
    with castsql.open(st.root, s3=s3_config) as t:
        t.append(pa.table({"id": [1, 2, 3], "v": pa.array([10, 20, 30], pa.int32())}))
        with pytest.raises(castsql.CastSQLError, match=r"column 'note' does not exist .*merge_schema=True adds it"):
            t.update(set={"note": "'x'"}, where="id = 2")
        assert t.at().version == 1
        m = t.update(set={"note": "'big'", "v": "CAST(v AS BIGINT) * 1000000000"}, where="id >= 2", merge_schema=True)
        assert (m.version, m.operation, m.summary["updated_rows"]) == (2, "UPDATE", 2)
        assert m.summary["added_columns"] == [{"name": "note", "type": "string"}]
        assert m.summary["widened_columns"] == [{"name": "v", "from": "int32", "to": "int64"}]
        assert m.schema.column("note").added_in == 2
        assert by_id(t.at().to_arrow()) == [
            {"id": 1, "v": 10, "note": None},
            {"id": 2, "v": 20_000_000_000, "note": "big"},
            {"id": 3, "v": 30_000_000_000, "note": "big"},
        ]
        assert t.at(version=1).to_arrow().column_names == ["id", "v"]
        with pytest.raises(SchemaMismatch, match="new column 'gone' holds only nulls"):
            t.update(set={"gone": "NULL"}, merge_schema=True)
        assert t.update(set={"v": "v + 1"}, where="id = 1", merge_schema=True).summary.get("added_columns") is None


def test_restore_across_schema_changes_keeps_the_head_schema(history):
    """Restoring version 1 (before c and e were added and before n, d, f, p
    widened) brings back its rows, read in the head's schema: the schema only
    grows and widens, so c and e stay (NULL) and the types stay wide."""
    t = history
    log = t._session.log(t.name)
    m = log.restore(1)
    assert (m.version, m.operation, m.summary["restored_version"]) == (7, "RESTORE", 1)
    assert m.schema == log.manifest(6).schema and "added_columns" not in m.summary
    cols, rows = expected(1)
    got = by_id(t.at().to_arrow())
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    assert all(r["c"] is None and r["e"] is None for r in got)
    assert got[3]["d"] == dt.datetime(2024, 1, 4) and got[3]["n"] == 30
    assert str(t.at().to_arrow().schema.field("n").type) == "int64"
    # Older versions still read with their own schemas.
    assert by_id(t.at(version=1).to_arrow()) == rows and t.at(version=1).to_arrow().column_names == cols
