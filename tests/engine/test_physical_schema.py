"""Data files whose physical schema differs from the manifest (other writers):
every version, pruned or not, with or without deletes, returns the manifest's
columns, names, order and types; lossless differences are converted, anything
else is one clear error naming the file, the column and both types."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap

from castsql.engine import Session
from castsql.errors import SchemaMismatch
from castsql.format import DataFile, PositionDelete, Schema, TableLog
from castsql.format.layout import new_data_key

SCHEMA = pa.schema(
    [("id", pa.int64()), ("k", pa.string()), ("ts", pa.timestamp("us")), ("tz", pa.timestamp("us", tz="UTC"))]
)
NOON = datetime(2025, 6, 1, 12, 0)


def put_file(st, table: pa.Table, lo: int, hi: int) -> DataFile:
    """A Parquet file written as another writer would, with its manifest entry."""
    buf = io.BytesIO()
    pq.write_table(table, buf)
    key = new_data_key()
    st.put_new(key, buf.getvalue())
    return DataFile(key, len(buf.getvalue()), 1, table.num_rows, {"id": lo}, {"id": hi}, (table.num_rows,))


@pytest.fixture
def table(storage):
    st = storage.child("t")
    log = TableLog.create(st, SCHEMA, primary_key="id")
    exact = pa.table(
        {"id": [1, 2], "k": ["a", "b"], "ts": [NOON, NOON], "tz": [NOON.replace(tzinfo=UTC)] * 2}, schema=SCHEMA
    )
    # Another writer: other column order and case, an extra column, int32 ids,
    # ts stored as an instant (Spark's default) and tz stored naive (UTC by the format's rule).
    other = pa.table(
        {
            "K": ["c", "d"],
            "extra": [9, 9],
            "TS": pa.array([NOON.replace(tzinfo=UTC)] * 2, pa.timestamp("us", tz="UTC")),
            "Id": pa.array([3, 4], pa.int32()),
            "tz": pa.array([NOON] * 2, pa.timestamp("ms")),
        }
    )
    a = put_file(st, exact, 1, 2)
    b = put_file(st, other, 3, 4)
    log.append([a, b])  # v1
    log.delete([PositionDelete(b.name, None, BitMap([1]))])  # v2: id 4 gone
    bad = pa.table({"id": [5], "k": pa.array([7], pa.int64()), "ts": [NOON], "tz": [NOON.replace(tzinfo=UTC)]})
    c = put_file(st, bad, 5, 5)
    log.append([c])  # v3: k is a number in this file
    return log, c


EXPECTED = {
    1: [(1, "a"), (2, "b"), (3, "c"), (4, "d")],
    2: [(1, "a"), (2, "b"), (3, "c")],
}


@pytest.mark.parametrize("tz", ["UTC", "America/New_York", "Asia/Tokyo"])
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("where", ["", "WHERE id >= 3", "WHERE id <= 2", "WHERE k = 'c'"])
def test_every_version_reads_the_manifest_schema(table, s3_config, tz, version, where):
    log, _ = table
    with Session(log.uri, s3=s3_config) as s:
        s.con.execute(f"SET TimeZone = '{tz}'")
        got = s.sql(f"SELECT * FROM t AS OF VERSION {version} {where} ORDER BY id")
    assert got.schema.names == ["id", "k", "ts", "tz"]
    assert [f.type for f in got.schema] == [pa.int64(), pa.string(), pa.timestamp("us"), got.schema.field("tz").type]
    assert pa.types.is_timestamp(got.schema.field("tz").type) and got.schema.field("tz").type.tz is not None
    want = [r for r in EXPECTED[version] if eval_where(where, r)]
    assert [(r["id"], r["k"]) for r in got.to_pylist()] == want
    # The same wall-clock time and the same instant in every file, whatever the session's TimeZone.
    assert {r["ts"] for r in got.to_pylist()} <= {NOON}
    assert {r["tz"].astimezone(UTC) for r in got.to_pylist()} <= {NOON.replace(tzinfo=UTC)}


def eval_where(where: str, row: tuple[int, str]) -> bool:
    if not where:
        return True
    if where == "WHERE id >= 3":
        return row[0] >= 3
    if where == "WHERE id <= 2":
        return row[0] <= 2
    return row[1] == "c"


def test_a_lossy_difference_is_one_error_naming_file_column_and_types(table, s3_config):
    log, bad = table
    with Session(log.uri, s3=s3_config) as s:
        with pytest.raises(SchemaMismatch) as e:
            s.sql("SELECT * FROM t")
        msg = str(e.value)
        assert bad.path.rsplit("/", 1)[-1] in msg and "'k'" in msg and "BIGINT in the file" in msg
        assert "manifest says VARCHAR" in msg and "version 3" in msg and "\n" not in msg
        # Other versions still read; a pruned query that never opens the bad file too.
        assert s.sql("SELECT count(*) AS n FROM t AS OF VERSION 2")["n"][0].as_py() == 3
        assert s.sql("SELECT count(*) AS n FROM t WHERE id <= 2")["n"][0].as_py() == 2


def test_footers_a_writer_remembers_are_what_the_files_hold(tmp_path):
    """The embedded writers remember the signature and row groups of the files
    they write (no footer read when a stream's compaction reads them back):
    for every column type a table can hold, what they remember is what
    DuckDB finds in the footer."""
    import castsql
    from castsql.engine.duckdb.duck import new_connection
    from castsql.engine.physical import Signatures
    from castsql.format.schema import _SIMPLE

    types = {*_SIMPLE.values(), pa.timestamp("us"), pa.timestamp("us", tz="UTC"), pa.decimal128(10, 2)}
    types |= {pa.decimal128(38, 5)}
    data = pa.table({f"c{i}": pa.nulls(3, t) for i, t in enumerate(sorted(types, key=str))})
    data = data.append_column("id", pa.array([1, 2, 3]))
    uri = str(tmp_path / "every")
    castsql.write_table(uri, data)
    with castsql.open(uri) as t:
        t.append(data)
        t.delete("id = 2")
        paths = [f.uri for f in t._session.snapshot("every").files]
    remembered = {u: (Signatures._cache[u], Signatures._rows[u]) for u in paths}
    con = new_connection()
    read = Signatures(con)._read(paths)  # the footers themselves, not the class's cache
    for u in paths:
        groups = con.execute(
            "SELECT row_group_id, max(row_group_num_rows) FROM parquet_metadata(?) GROUP BY ALL ORDER BY 1", [u]
        ).fetchall()
        assert remembered[u] == (read[u], tuple(n for _, n in groups))


@pytest.mark.parametrize("unit", ["s", "ms", "ns"])
def test_a_foreign_manifests_timestamp_unit_reads_the_same_in_the_writing_process(tmp_path, unit):
    """A manifest may name timestamps of other units (a foreign writer's):
    the files an embedded write adds hold that unit, which the footer says,
    so the writing process reads them as a fresh one does (microseconds)."""
    import castsql
    from castsql.format.schema import Column
    from castsql.storage import open_storage

    uri = str(tmp_path / "tn")
    TableLog.create(open_storage(uri), Schema((Column("id", "int64"), Column("ts", f"timestamp[{unit}]"))))
    with castsql.open(uri) as t:
        t.append(pa.table({"id": [1], "ts": pa.array([NOON], pa.timestamp(unit))}))
        got = t.to_arrow()
    assert got.schema.field("ts").type == pa.timestamp("us") and got.column("ts").to_pylist() == [NOON]
