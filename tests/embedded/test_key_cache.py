"""A handle that merges again and again finds matched rows from its key cache
(castsql/embedded/keycache.py), not by scanning: it must find exactly the rows
a scan finds, whatever happened to the files in between."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

import castsql
from castsql.embedded import keycache


def upsert(t: castsql.Table, src: pa.Table, on: str = "id") -> None:
    t.merge(src, on=on).when_matched_update_all().when_not_matched_insert_all().execute()


def rows(t: castsql.Table, key: str = "id") -> list[dict]:
    return sorted(t.to_arrow().to_pylist(), key=lambda r: (r[key] is None, r[key], str(r)))


def twin(tmp_path, data: pa.Table, **kw):
    """The same table twice: one handle kept open (its cache serves from its
    second merge on), one opened afresh for every write (always a scan)."""
    a, b = str(tmp_path / "kept"), str(tmp_path / "fresh")
    castsql.write_table(a, data, **kw)
    castsql.write_table(b, data, **kw)
    return castsql.open(a), b


def test_a_stream_of_upserts_deletes_and_compactions_matches_a_scan(tmp_path):
    rng = np.random.default_rng(7)
    n = 20_000
    base = pa.table({"id": pa.array(rng.permutation(n), pa.int64()), "v": pa.array(np.zeros(n))})
    kept, fresh_uri = twin(tmp_path, base, primary_key="id")
    next_id = n
    for step in range(40):
        old = rng.choice(next_id, 15, replace=False)
        new = np.arange(next_id, next_id + 5)
        next_id += 5
        ids = np.concatenate([old, new])
        src = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(np.full(len(ids), float(step)))})
        for t in (kept, castsql.open(fresh_uri)):
            upsert(t, src)
            if step % 7 == 3:
                t.delete(f"id % 97 = {step}")  # deletes by position in many files
            if step % 13 == 12:
                t.compact()  # new files, the cached ones gone
        assert rows(kept) == rows(castsql.open(fresh_uri)), step
    assert len(keycache.of(kept._session)) > 0  # the kept handle's merges were served from its cache


def test_keys_repeated_in_a_file_and_nulls(tmp_path):
    """A merge on a column that is not the key: every row with a source's value is matched."""
    base = pa.table(
        {
            "id": pa.array(range(12), pa.int64()),
            "grp": pa.array([3, 1, 3, None, 2, 3, 1, None, 5, 2, 3, 1], pa.int32()),
            "v": pa.array(["x"] * 12),
        }
    )
    kept, fresh_uri = twin(tmp_path, base, primary_key="id")
    for i, groups in enumerate(([1], [3, None, 7], [2, 5], [3])):
        src = pa.table({"grp": pa.array(groups, pa.int32()), "v": pa.array([f"s{i}"] * len(groups))})
        for t in (kept, castsql.open(fresh_uri)):
            t.merge(src, on="grp").when_matched_update(set={"v": "source.v"}).execute()
        assert rows(kept) == rows(castsql.open(fresh_uri)), i


def test_source_keys_of_a_narrower_type_or_refused(tmp_path):
    base = pa.table({"id": pa.array([1, 2, 300], pa.int16()), "v": pa.array([0, 0, 0], pa.int64())})
    kept, fresh_uri = twin(tmp_path, base, primary_key="id")
    for i, (ids, typ) in enumerate(
        (
            ([1, 2], pa.int8()),
            ([300, 4], pa.int16()),
            ([2, 70_000], pa.int32()),
            ([-5, 2], pa.int8()),
            ([1, 2], pa.int8()),
        )
    ):
        src = pa.table({"id": pa.array(ids, typ), "v": pa.array([i + 1] * len(ids), pa.int64())})
        for t in (kept, castsql.open(fresh_uri)):
            try:
                t.merge(src, on="id").when_matched_update_all().execute()
                err = None
            except castsql.CastSQLError as e:  # a wider key type: refused alike
                err = str(e).replace("kept", "T").replace("fresh", "T")
            if t is kept:
                kept_err = err
        assert kept_err == err
        assert rows(kept) == rows(castsql.open(fresh_uri)), i


def test_timestamp_keys_and_a_widened_key(tmp_path):
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    times = [t0 + dt.timedelta(seconds=s) for s in range(6)]
    base = pa.table({"at": pa.array(times, pa.timestamp("us", tz="UTC")), "v": pa.array(range(6), pa.int64())})
    kept, fresh_uri = twin(tmp_path, base, primary_key="at")
    for i in range(4):
        src = pa.table({"at": pa.array([times[i], times[5], t0 - dt.timedelta(days=i + 1)], base.schema.field(0).type),
                        "v": pa.array([100 + i] * 3, pa.int64())})  # fmt: skip
        for t in (kept, castsql.open(fresh_uri)):
            upsert(t, src, on="at")
        assert rows(kept, "at") == rows(castsql.open(fresh_uri), "at"), i

    # A key widened by a schema change: cached as INTEGER, asked as BIGINT.
    base = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "v": pa.array([0, 0, 0], pa.int64())})
    kept, fresh_uri = twin(tmp_path / "w", base, primary_key="id")
    wide = pa.table({"id": pa.array([2, 5_000_000_000], pa.int64()), "v": pa.array([7, 7], pa.int64())})
    for t in (kept, castsql.open(fresh_uri)):
        upsert(t, pa.table({"id": pa.array([1], pa.int32()), "v": pa.array([1], pa.int64())}))
        t.merge(wide, on="id", merge_schema=True).when_matched_update_all().when_not_matched_insert_all().execute()
        upsert(t, pa.table({"id": pa.array([3, 5_000_000_000], pa.int64()), "v": pa.array([9, 9], pa.int64())}))
    assert rows(kept) == rows(castsql.open(fresh_uri))


@pytest.mark.parametrize("budget", [0, 200])
def test_a_cache_past_its_budget_still_finds_every_row(tmp_path, budget, monkeypatch):
    monkeypatch.setattr(keycache, "BUDGET", budget)
    base = pa.table({"id": pa.array(range(1000), pa.int64()), "v": pa.array([0] * 1000, pa.int64())})
    kept, fresh_uri = twin(tmp_path, base, primary_key="id")
    for i in range(5):
        src = pa.table({"id": pa.array([i, 500 + i, 999 - i, 2000 + i], pa.int64()), "v": pa.array([i + 1] * 4)})
        for t in (kept, castsql.open(fresh_uri)):
            upsert(t, src)
        assert rows(kept) == rows(castsql.open(fresh_uri)), i
    assert keycache.of(kept._session)._bytes <= budget


def test_a_cdc_stream_compares_sequences_from_the_cache(tmp_path):
    """CDC batches, late ones included: the sequence of each matched row comes from the cache too."""
    rng = np.random.default_rng(3)
    n = 200  # a batch hits several rows of one file
    base = pa.table({"id": pa.array(range(n), pa.int64()), "seq": pa.array([10] * n, pa.int64()),
                     "v": pa.array(["base"] * n)})  # fmt: skip
    kept, fresh_uri = twin(tmp_path, base, primary_key="id")
    for b in range(25):
        ids = rng.choice(n + 50, 12, replace=False)
        seq = rng.integers(0, 40, 12)  # some older than what is stored: ignored
        ops = np.where(rng.random(12) < 0.2, "d", "u")
        batch = pa.table({"id": pa.array(ids, pa.int64()), "seq": pa.array(seq, pa.int64()),
                          "v": pa.array([f"b{b}"] * 12), "op": pa.array(ops)})  # fmt: skip
        for t in (kept, castsql.open(fresh_uri)):
            t.apply_cdc(batch, key="id", op_column="op", sequence="seq", delete_values=["d"])
        assert rows(kept) == rows(castsql.open(fresh_uri)), b
    cache = keycache.of(kept._session)
    assert any(k[3] == "values" for k in cache._files)  # sequences were kept beside the keys
