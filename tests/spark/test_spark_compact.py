"""Compaction: heavily deleted files rewritten, tombstones merged, results unchanged."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from castsql.format import KeyRangeDelete, PositionDelete, TableLog
from castsql.format.layout import DATA_DIR
from castsql.spark import append, compact, delete
from castsql.spark import compactor as compactor_mod
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


def _three_files(spark, events_df, uri, s3=None) -> dict[int, set[int]]:
    """v1-v3: files A (ids 0-299), B (300-599), C (600-899), row groups of 100."""
    for lo in (0, 300, 600):
        append(spark, uri, events_df(range(lo, lo + 300)), primary_key="id", s3=s3, row_group_size=100)
    return {v: set(range(300 * v)) for v in range(4)}


def test_compaction_rewrites_heavy_files_and_merges_tombstones(
    spark, events_df, check_version, storage_root, s3_config
):
    uri = storage_root + "/events"
    live = _three_files(spark, events_df, uri, s3_config)
    log = TableLog(open_storage(uri, s3=s3_config))
    files = {f.min["id"]: log.storage.uri(f.path) and f.path for f in log.latest().data_files}
    deletes = [
        ("id < 200", set(range(200))),  # A: two row groups
        ("id BETWEEN 300 AND 340", set(range(300, 341))),  # B: a key range, 14%
        ("id % 10 = 0 AND id >= 600", set(range(600, 900, 10))),  # C: a bitmap, 10%
        ("id >= 250 AND id < 300", set(range(250, 300))),  # A: now 250 of 300 rows gone
    ]
    for cond, gone in deletes:
        m = delete(spark, uri, cond, s3=s3_config)
        live[m.version] = live[m.version - 1] - gone
    before = log.latest()
    assert before.version == 7 and len(before.tombstones) == 4

    m = compact(spark, uri, threshold=0.5, s3=s3_config)
    assert (m.version, m.operation, m.previous) == (8, "COMPACT", 7)
    live[8] = live[7]
    kept = {f.path for f in m.data_files}
    assert files[0] not in kept and {files[300], files[600]} <= kept
    [new] = [f for f in m.data_files if f.path not in files.values()]
    assert new.total_rows == 50 and new.min["id"] == 200 and new.max["id"] == 249
    # The live rows are written in their order.
    assert pq.read_table(io.BytesIO(log.storage.get(new.path)))["id"].to_pylist() == list(range(200, 250))
    # A's two tombstones went; B's and C's were merged into one naming only files still there.
    [t] = m.tombstones
    assert t not in before.tombstones
    recs = log.tombstones(t)
    assert sorted(type(r).__name__ for r in recs) == ["KeyRangeDelete", "PositionDelete"]
    assert {r.file for r in recs} == {files[300], files[600]}
    log.validate_tombstones(recs, m, where="test")
    assert next(r for r in recs if isinstance(r, KeyRangeDelete)).pk_min == 300
    assert len(next(r for r in recs if isinstance(r, PositionDelete)).positions) == 30
    assert m.summary == {
        "added_files": 1, "added_rows": 50, "added_bytes": new.size_bytes, "removed_files": 1,
        "removed_tombstones": 4, "added_tombstones": 1, "tombstone_records": 2,
    }  # fmt: skip
    # Old versions still time-travel: their files are still there until GC.
    for v, ids in live.items():
        check_version(uri, v, ids)


def test_key_range_deletes_are_counted_by_a_scan(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    live = _three_files(spark, events_df, uri)
    m = delete(spark, uri, "id BETWEEN 310 AND 500")  # B: 64% gone, as one key range
    live[m.version] = live[m.version - 1] - set(range(310, 501))
    log = TableLog(open_storage(uri))
    assert isinstance(log.tombstones(m.tombstones[-1])[0], KeyRangeDelete)
    assert compact(spark, uri, threshold=0.7) is None  # 64% < 70%: nothing to do
    c = compact(spark, uri, threshold=0.6)
    assert c.summary["removed_files"] == 1 and c.summary["added_rows"] == 109 and c.tombstones == ()
    live[c.version] = live[m.version]
    for v, ids in live.items():
        check_version(uri, v, ids)


def test_a_fully_deleted_file_is_dropped_without_a_rewrite(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    live = _three_files(spark, events_df, uri)
    m = delete(spark, uri, "id >= 300 AND id < 600")
    live[m.version] = live[m.version - 1] - set(range(300, 600))
    c = compact(spark, uri, threshold=1.0)
    assert c.summary["added_files"] == 0 and c.summary["removed_files"] == 1 and c.tombstones == ()
    assert len(c.data_files) == 2
    live[c.version] = live[m.version]
    for v, ids in live.items():
        check_version(uri, v, ids)


def test_small_tombstones_are_merged_even_without_rewrites(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    live = _three_files(spark, events_df, uri)
    for i in (1, 302, 603):
        m = delete(spark, uri, f"id = {i}")
        live[m.version] = live[m.version - 1] - {i}
    c = compact(spark, uri)
    assert c.summary["removed_files"] == 0 and c.summary["removed_tombstones"] == 3 and len(c.tombstones) == 1
    live[c.version] = live[m.version]
    check_version(uri, c.version, live[c.version])
    assert compact(spark, uri) is None  # one tombstone file left, no heavy file: nothing to do


def test_nothing_to_compact_commits_nothing(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    _three_files(spark, events_df, uri)
    assert compact(spark, uri) is None
    delete(spark, uri, "id < 10")
    assert compact(spark, uri) is None
    assert TableLog(open_storage(uri)).latest().version == 4


def test_bad_threshold_is_refused(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    _three_files(spark, events_df, uri)
    log = TableLog(open_storage(uri))
    before = log.latest()
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
            compact(spark, uri, threshold=bad)
    assert log.latest() == before


def test_a_concurrent_delete_makes_the_compaction_recompute(spark, events_df, check_version, tmp_path, monkeypatch):
    """FORMAT.md §7: a compaction conflicts with any tombstone committed after
    the version it read; nothing is committed and it is recomputed."""
    uri = str(tmp_path / "events")
    live = _three_files(spark, events_df, uri)
    m = delete(spark, uri, "id < 200")
    live[m.version] = live[m.version - 1] - set(range(200))
    real_plan = compactor_mod.plan_compaction
    read_versions = []

    def plan_then_delete(spark_, log, snap, *args):
        plan = real_plan(spark_, log, snap, *args)
        read_versions.append(snap.version)
        if len(read_versions) == 1:
            d = delete(spark, uri, "id = 250")
            live[d.version] = live[d.version - 1] - {250}
        return plan

    monkeypatch.setattr(compactor_mod, "plan_compaction", plan_then_delete)
    c = compact(spark, uri)
    assert read_versions == [4, 5] and c.version == 6
    live[6] = live[5]
    for v, ids in live.items():
        check_version(uri, v, ids)
    # The rewrite of the first attempt was never committed: its file is garbage.
    referenced = {f.path for m in TableLog(open_storage(uri)).history() for f in m.data_files}
    assert len({i.key for i in open_storage(uri).list(DATA_DIR + "/")} - referenced) == 1
