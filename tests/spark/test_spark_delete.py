"""Delete by predicate: one job, one tombstone file, one manifest, the cheapest records."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import events_rows
from paths import SUPPORT

from castsql.engine.session import Session
from castsql.errors import CommitConflict, TableNotFound
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog
from castsql.format.layout import MANIFEST_DIR, POINTER_KEY, TOMBSTONE_DIR
from castsql.spark import append, compact, delete, read
from castsql.spark import deleter as deleter_mod
from castsql.spark.deleter import BadCondition
from castsql.storage import open_storage

pytestmark = pytest.mark.spark

TESTS = SUPPORT.parent  # conftest.py, which the writer processes import (it imports support's modules)


def _kind(i: int) -> str:
    return events_rows([i])["kind"][0].as_py()


def _new_records(log: TableLog, m) -> list:
    [key] = set(m.tombstones) - set(log.manifest(m.version - 1).tombstones)
    return log.tombstones(key)


def test_each_delete_picks_the_cheapest_tombstone(spark, events_df, check_version, storage_root, s3_config):
    uri = storage_root + "/events"
    # One file of 1,000 rows sorted by id, in 10 row groups of 100.
    append(spark, uri, events_df(range(1000)), primary_key="id", s3=s3_config, row_group_size=100)
    log = TableLog(open_storage(uri, s3=s3_config))
    live = {1: set(range(1000))}

    def run(cond: str, gone: set[int]) -> list:
        m = delete(spark, uri, cond, s3=s3_config)
        v = m.version
        live[v] = live[v - 1] - gone
        assert m.summary == {"added_tombstones": 1, "tombstone_records": m.summary["tombstone_records"],
                             "deleted_rows": len(live[v - 1] & gone),
                             "added_files": 0, "added_rows": 0, "added_bytes": 0}  # fmt: skip
        assert m.previous == v - 1 and len(m.tombstones) == len(log.manifest(v - 1).tombstones) + 1
        return _new_records(log, m)

    [r] = run("id >= 200 AND id < 300", set(range(200, 300)))
    assert isinstance(r, RowGroupDelete) and r.row_group == 2
    [r] = run("id BETWEEN 450 AND 520", set(range(450, 521)))
    assert isinstance(r, KeyRangeDelete) and (r.pk_min, r.pk_max) == (450, 520)
    [r] = run("id % 97 = 0", {i for i in range(1000) if i % 97 == 0})
    assert isinstance(r, PositionDelete) and r.row_group is None
    assert list(r.positions) == [0, 97, 194, 388, 582, 679, 776, 873, 970]  # 291 went with row group 2
    recs = run("kind = 'refund'", {i for i in range(1000) if _kind(i) == "refund"})
    assert [type(x) for x in recs] == [PositionDelete] and len(recs[0].positions) > 32
    # Live rows 150-199 and 300-349 are consecutive once row group 2 is gone: one exact key range.
    hit = live[max(live)] & set(range(150, 350))
    [r] = run("id >= 150 AND id < 350", set(range(150, 350)))
    assert isinstance(r, KeyRangeDelete) and (r.pk_min, r.pk_max) == (min(hit), max(hit))
    # Whole live row groups plus a few more rows: row groups and one bitmap beat no key range here.
    recs = run("id >= 600 AND id < 800 OR id = 902", set(range(600, 800)) | {902})
    assert {type(x) for x in recs} == {RowGroupDelete, PositionDelete}

    assert delete(spark, uri, "id = 200", s3=s3_config) is None  # already deleted: nothing matches
    assert log.latest().version == max(live)
    for v, ids in live.items():
        check_version(uri, v, ids)


def test_unsorted_files_never_get_key_ranges(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    shuffled = events_df(range(300)).orderBy("amount", "id")  # ids out of order within the file
    append(spark, uri, shuffled.coalesce(1), primary_key="id", row_group_size=100)
    m = delete(spark, uri, "id BETWEEN 10 AND 20")
    log = TableLog(open_storage(uri))
    assert [type(r) for r in _new_records(log, m)] == [PositionDelete]
    check_version(uri, 2, set(range(300)) - set(range(10, 21)))


def test_tables_without_primary_key_use_row_groups_and_positions(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(300)), row_group_size=100)
    m = delete(spark, uri, "id BETWEEN 100 AND 250")
    recs = _new_records(TableLog(open_storage(uri)), m)
    assert [type(r) for r in recs] == [RowGroupDelete, PositionDelete]
    check_version(uri, 2, set(range(100)) | set(range(251, 300)))


def test_bad_conditions_are_refused_and_change_nothing(spark, events_df, tmp_path):
    from pyspark.errors import AnalysisException, ParseException

    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(100)), primary_key="id")
    log = TableLog(open_storage(uri))
    before = log.latest()
    with pytest.raises(ParseException):
        delete(spark, uri, "id = = 3")
    with pytest.raises(AnalysisException, match=r"UNRESOLVED_COLUMN.*nope"):
        delete(spark, uri, "nope = 1")
    with pytest.raises(BadCondition, match="must be true or false for each row; 'id \\+ 1' is bigint"):
        delete(spark, uri, "id + 1")
    with pytest.raises(BadCondition, match="condition is empty"):
        delete(spark, uri, "  ")
    assert log.latest() == before
    assert list(log.storage.list(TOMBSTONE_DIR + "/")) == []


def test_delete_on_a_missing_table(spark, tmp_path):
    with pytest.raises(TableNotFound, match="no table here"):
        delete(spark, str(tmp_path / "nothing"), "true")


def _append_in_another_process(uri: str, ids: range, env: dict[str, str]) -> int:
    """A real concurrent writer: another process appends ``ids`` and prints the version."""
    code = f"""
import sys
sys.path[:0] = {[str(TESTS), str(SUPPORT)]!r}
from conftest import events_rows
from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage
st = open_storage({uri!r})
log = TableLog(st, writer="concurrent-appender")
print(log.append(write_data_files(st, events_rows(range({ids.start}, {ids.stop})), log.latest().schema)).version)
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_concurrent_append_is_not_deleted(
    spark, events_df, check_version, storage_root, s3_config, worker_env, monkeypatch
):
    """FORMAT.md §7: the delete removes the rows that matched in the version it
    read; rows another process appends between its read and its commit stay,
    even though they match."""
    uri = storage_root + "/events"
    append(spark, uri, events_df(range(100)), primary_key="id", s3=s3_config)
    real_plan = deleter_mod.plan_delete
    appended = []

    def plan_then_let_another_writer_commit(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        if not appended:
            appended.append(_append_in_another_process(uri, range(1000, 1010), worker_env))
        return plan

    monkeypatch.setattr(deleter_mod, "plan_delete", plan_then_let_another_writer_commit)
    m = delete(spark, uri, "id % 2 = 0", s3=s3_config)
    assert appended == [2]
    assert (m.version, m.previous) == (3, 2)  # rebased on the concurrent append
    assert m.summary["deleted_rows"] == 50
    check_version(uri, 2, set(range(100)) | set(range(1000, 1010)))
    check_version(uri, 3, {i for i in range(100) if i % 2} | set(range(1000, 1010)))


def test_concurrent_compaction_makes_the_delete_recompute(spark, events_df, check_version, tmp_path, monkeypatch):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(200)), primary_key="id", row_group_size=50)
    delete(spark, uri, "id < 150")  # v2: the file is 75% deleted
    real_plan = deleter_mod.plan_delete
    plans = []

    def plan_then_compact(spark_, log, snap, where):
        plan = real_plan(spark_, log, snap, where)
        plans.append(snap.version)
        if len(plans) == 1:
            assert compact(spark, uri).version == 3  # rewrites the file the plan names
        return plan

    monkeypatch.setattr(deleter_mod, "plan_delete", plan_then_compact)
    m = delete(spark, uri, "id >= 190")
    assert plans == [2, 3] and m.version == 4
    check_version(uri, 4, set(range(150, 190)))
    check_version(uri, 2, set(range(150, 200)))


def test_delete_gives_up_after_bounded_attempts(spark, events_df, tmp_path, monkeypatch):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(200)), primary_key="id", row_group_size=50)
    delete(spark, uri, "id < 150")
    real_plan = deleter_mod.plan_delete

    busy = []

    def plan_then_compact_every_time(spark_, log, snap, where):
        plan = real_plan(spark_, log, snap, where)
        if not busy:  # the delete below plans through this hook too
            busy.append(True)
            delete(spark, uri, f"id = {150 + snap.version}")
            compact(spark, uri, threshold=0.01)  # rewrites the file the plan names
            busy.clear()
        return plan

    monkeypatch.setattr(deleter_mod, "plan_delete", plan_then_compact_every_time)
    with pytest.raises(CommitConflict, match="conflicted with it 2 times"):
        delete(spark, uri, "id = 199", attempts=2)
    assert 199 in {r.id for r in read(spark, uri).collect()}


def test_one_row_and_a_million_rows_each_write_one_tombstone_and_one_manifest(spark, tmp_path):
    uri = str(tmp_path / "big")
    n = 1_100_000
    df = spark.range(0, n, numPartitions=2).selectExpr("id", "id * 3 AS v", "CAST(id % 10 AS STRING) AS tag")
    append(spark, uri, df, primary_key="id")
    st = open_storage(uri)

    def state():
        manifests = sorted(i.key for i in st.list(MANIFEST_DIR + "/"))
        tombstones = sorted(i.key for i in st.list(TOMBSTONE_DIR + "/"))
        return manifests, tombstones, json.loads(st.get(POINTER_KEY))

    for cond, rows in (("id = 123456", 1), ("id >= 50000 AND id < 1050000", 1_000_000)):
        manifests, tombstones, pointer = state()
        m = delete(spark, uri, cond)
        after_m, after_t, after_p = state()
        assert m.summary["deleted_rows"] == rows - (1 if rows > 1 else 0)
        assert len(after_m) == len(manifests) + 1 and len(after_t) == len(tombstones) + 1
        assert (pointer["version"], after_p["version"]) == (m.version - 1, m.version)
        assert after_p["commit_id"] == m.commit_id  # the pointer moved once, by this commit
    live = n - 1_000_000
    assert read(spark, uri).count() == live
    with Session(uri) as s:
        assert s.sql("SELECT count(*) AS n FROM big").to_pylist() == [{"n": live}]
