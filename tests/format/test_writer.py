"""The single-node writer: Arrow in, Parquet data files and manifest entries out."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from castsql.format import write_data_files
from castsql.storage import open_storage


@pytest.fixture
def local(tmp_path):
    return open_storage(str(tmp_path))


def test_row_groups_stats_and_layout(local):
    t = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "ts": pa.array(
                [datetime(2025, 1, 1, tzinfo=UTC)] * 999 + [datetime(2025, 2, 1, tzinfo=UTC)],
                pa.timestamp("ns", tz="UTC"),
            ),
            "s": [f"k{i:04d}" for i in range(1000)],
            "b": pa.array([b"x"] * 1000),
        }
    )
    [f] = write_data_files(local, t, row_group_size=300)
    assert f.path.startswith("data/") and f.path.endswith(".parquet")
    assert f.row_group_rows == (300, 300, 300, 100) and f.total_rows == 1000 and f.row_group_count == 4
    assert f.min == {"id": 0, "ts": "2025-01-01T00:00:00.000000Z", "s": "k0000"}
    assert f.max == {"id": 999, "ts": "2025-02-01T00:00:00.000000Z", "s": "k0999"}
    pf = pq.ParquetFile(local.uri(f.path))
    assert pf.metadata.num_row_groups == 4
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    assert pf.schema_arrow.field("ts").type == pa.timestamp("us", tz="UTC")
    assert f.size_bytes == len(local.get(f.path))


def test_small_batches_are_buffered_into_full_row_groups(local):
    batches = [pa.record_batch({"x": list(range(i * 7, i * 7 + 7))}) for i in range(30)]
    [f] = write_data_files(local, iter(batches), row_group_size=50)
    assert f.row_group_rows == (50, 50, 50, 50, 10)
    assert pq.read_table(local.uri(f.path)).column("x").to_pylist() == list(range(210))


def test_files_are_cut_at_the_target_size(local):
    t = pa.table({"x": pa.array(range(200_000), pa.int64())})
    files = write_data_files(local, t, row_group_size=10_000, target_file_bytes=50_000)
    assert len(files) > 1
    assert sum(f.total_rows for f in files) == 200_000
    assert files[0].max["x"] < files[1].min["x"]


def test_empty_input_writes_nothing(local):
    assert write_data_files(local, pa.table({"x": pa.array([], pa.int64())})) == []
    assert list(local.list("")) == []


def test_nan_infinite_and_all_null_columns_have_no_stats(local):
    """NaN sorts above every number (DuckDB, Spark): bounds that leave it out
    would let a reader prune ``x > 5`` away from a file whose NaN matches.
    The same for an infinity, which JSON cannot state, in any row group."""
    t = pa.table(
        {
            "f": [1.0, 2.0, float("nan"), 1.0],
            "g": [1.0, 2.0, 3.0, float("inf")],
            "h": [1.0, None, 2.0, 3.0],
            "n": pa.array([None] * 4, pa.int64()),
        }
    )
    [f] = write_data_files(local, t, row_group_size=2)
    assert f.row_group_rows == (2, 2)
    assert (f.min, f.max) == ({"h": 1.0}, {"h": 3.0})


def test_dictionaries_only_where_values_repeat(local):
    """Distinct ids and times are stored plain (a dictionary of every value
    plus an index per row is bigger and slower), repeated numbers, strings
    and decimals as a dictionary; the rows read back are the same."""
    from decimal import Decimal

    n = 10_000
    t = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC).timestamp() + i for i in range(n)], pa.float64()),
            "status": pa.array([i % 5 for i in range(n)], pa.int32()),
            "user": [f"u{i}" for i in range(n)],
            "amount": pa.array([Decimal(i) / 100 for i in range(n)], pa.decimal128(14, 2)),
        }
    )
    (f,) = write_data_files(local, t, row_group_size=4000)
    md = pq.ParquetFile(local.uri(f.path)).metadata
    for rg in range(md.num_row_groups):
        enc = {md.row_group(rg).column(i).path_in_schema: md.row_group(rg).column(i).encodings for i in range(5)}
        assert "RLE_DICTIONARY" not in enc["id"] and "RLE_DICTIONARY" not in enc["ts"], enc
        assert all("RLE_DICTIONARY" in enc[c] for c in ("status", "user", "amount")), enc
    assert pq.read_table(local.uri(f.path)).equals(t)
