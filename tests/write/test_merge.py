"""Merge with the embedded engine (DuckDB, no JVM): Delta's semantics, one
version per merge, the cheapest tombstone, refusals that commit nothing, and
concurrent merges that never duplicate a key or lose an update."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from paths import SUPPORT

import castsql
from castsql.errors import CommitConflict
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import open_storage
from castsql.write.merge import MergeError

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64())])
WORKER = str(SUPPORT / "merge_worker.py")


def make(root: str, s3=None, n: int = 1000) -> castsql.Table:
    """ids 0..n-1 sorted, v = 'old', n = id, in row groups of 100."""
    st = open_storage(root, s3=s3)
    log = TableLog.create(st, SCHEMA, primary_key="id")
    data = pa.table({"id": list(range(n)), "v": ["old"] * n, "n": list(range(n))}, schema=SCHEMA)
    log.append(write_data_files(st, data, log.latest().schema, row_group_size=100))
    return castsql.open(root, s3=s3)


def rows(t: castsql.Table, version: int | None = None) -> dict[int, tuple]:
    got = (t if version is None else t.at(version=version)).to_arrow().to_pylist()
    out = {r["id"]: (r["v"], r["n"]) for r in got}
    assert len(out) == len(got), "a key appears twice"
    return out


def src(ids, v="new", n=None) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "v": [v] * len(ids), "n": n if n is not None else [i * 10 for i in ids]})


def new_tombstone(t: castsql.Table) -> list:
    log = TableLog(open_storage(t.uri, s3=t._session.s3))
    [key] = log.latest().change.added_tombstones
    return log.tombstones(key)


def test_upsert_is_one_version_with_delete_and_insert_together(storage_root, s3_config):
    t = make(storage_root + "/kv", s3_config)
    before = rows(t)
    m = t.merge(src(range(990, 1010)), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    assert (m.num_source_rows, m.num_target_rows_updated, m.num_target_rows_inserted) == (20, 10, 10)
    assert (m.num_target_rows_deleted, m.num_target_rows_copied, m.num_target_files_removed) == (0, 0, 0)
    assert (m.version, t.version, m.num_target_files_added, m.num_tombstones_added) == (2, 2, 1, 1)
    assert m.num_output_rows == 20 and m.execution_time_ms >= 0
    expected = {**before, **{i: ("new", i * 10) for i in range(990, 1010)}}
    assert rows(t) == expected
    assert rows(t, 1) == before  # no version in between holds the delete without the insert
    log = TableLog(open_storage(t.uri, s3=s3_config))
    assert log.latest().operation == "MERGE" and log.versions() == [0, 1, 2]
    # Bytes written: one data file of the 20 changed rows (its size is what was written) and one tombstone.
    [f] = log.latest().change.added_files
    assert f.total_rows == 20 and m.bytes_written == f.size_bytes
    ch = t.changes(2, 2).to_pylist()
    assert len(ch) == 30  # 10 old rows out, 20 rows in, all in version 2
    t.close()


def test_every_clause_kind_conditions_and_first_match_wins(tmp_path):
    t = make(str(tmp_path / "kv"), n=10)
    s = src([1, 2, 3, 4, 20, 21], v="s", n=[1, 2, 3, 4, 20, 21])
    m = (
        t.merge(s, on="id")
        .when_matched_delete(condition="source.id = 1")
        .when_matched_update(set={"v": "'first'"}, condition="target.n < 3")  # id 2 (1 went to the delete)
        .when_matched_update(set={"v": "'second'", "n": "target.n + source.n"}, condition="target.n < 4")  # id 3
        .when_not_matched_insert(values={"id": "source.id", "v": "'ins'"}, condition="source.id = 20")
        .when_not_matched_by_source_update(set={"v": "'orphan'"}, condition="target.id >= 8")
        .when_not_matched_by_source_delete(condition="target.id = 0")
        .execute()
    )
    want = {i: ("old", i) for i in range(10)}
    del want[1], want[0]
    want[2] = ("first", 2)
    want[3] = ("second", 6)
    want[20] = ("ins", None)  # n is not set by the insert: NULL
    want[8], want[9] = ("orphan", 8), ("orphan", 9)
    assert rows(t) == want  # id 4: matched, no clause held: unchanged; 21: no insert clause held
    assert (m.num_target_rows_deleted, m.num_target_rows_updated, m.num_target_rows_inserted) == (2, 4, 1)
    t.close()


def test_update_all_with_a_condition_and_composite_keys(tmp_path):
    root = str(tmp_path / "kk")
    st = open_storage(root)
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("x", pa.float64())])
    log = TableLog.create(st, schema)
    data = pa.table({"a": [1, 1, 2], "b": ["p", "q", "p"], "x": [1.0, 2.0, 3.0]})
    log.append(write_data_files(st, data, log.latest().schema))
    t = castsql.open(root)
    s = pa.table({"a": [1, 2, 3], "b": ["q", "p", "p"], "x": [20.0, 0.5, 9.0], "extra": [0, 0, 0]})
    t.merge(s, on=["a", "b"]).when_matched_update_all(
        condition="source.x > target.x"
    ).when_not_matched_insert_all().execute()
    got = sorted((r["a"], r["b"], r["x"]) for r in t.to_arrow().to_pylist())
    assert got == [(1, "p", 1.0), (1, "q", 20.0), (2, "p", 3.0), (3, "p", 9.0)]
    t.close()


def test_two_source_rows_for_one_target_row_is_refused_and_nothing_is_committed(tmp_path):
    t = make(str(tmp_path / "kv"), n=10)
    dup = src([3, 3, 4, 50])
    with pytest.raises(MergeError, match=r"table kv: merge: several source rows match one target row .*id=3"):
        t.merge(dup, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    assert t.at().version == 1 and t.version == 1
    log = TableLog(open_storage(t.uri))
    assert not list(log.storage.list("data/"))[1:] and not list(log.storage.list("tombstone/"))  # nothing written
    # Delta's exception: when the only matched clause is an unconditional delete, the row is deleted once.
    m = t.merge(dup, on="id").when_matched_delete().execute()
    assert m.num_target_rows_deleted == 2 and set(rows(t)) == set(range(10)) - {3, 4}
    t.close()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda b: b, "no clause"),
        (lambda b: b.when_matched_update(set={"nope": "1"}), "column 'nope' in set is not a column"),
        (lambda b: b.when_matched_update(set={"v": "source.zzz"}), "column 'source.zzz' does not exist"),
        (lambda b: b.when_matched_update(set={"id": "source.id + 1"}), "key column 'id' cannot be updated"),
        (lambda b: b.when_not_matched_by_source_update(set=None), "needs set="),
    ],
)
def test_bad_merges_are_one_line_naming_the_table_and_commit_nothing(tmp_path, build, message):
    t = make(str(tmp_path / "kv"), n=10)
    with pytest.raises(MergeError) as e:
        build(t.merge(src([1, 2]), on="id")).execute()
    text = str(e.value)
    assert "\n" not in text and text.startswith("table kv: merge") and re.search(message, text)
    assert t.at().version == 1
    t.close()


def test_key_columns_must_exist_in_both(tmp_path):
    t = make(str(tmp_path / "kv"), n=10)
    with pytest.raises(MergeError, match="table kv: merge: key column 'key' is not a column of the table"):
        t.merge(src([1]), on="key").when_matched_delete().execute()
    with pytest.raises(MergeError, match="table kv: merge: key column 'id' is missing from the source"):
        t.merge(pa.table({"ident": [1]}), on="id").when_matched_delete().execute()
    with pytest.raises(MergeError, match="column 'n' is missing from it"):
        t.merge(pa.table({"id": [1], "v": ["x"]}), on="id").when_matched_update_all().execute()
    assert t.at().version == 1
    t.close()


def test_tombstones_are_row_groups_key_ranges_or_positions_whichever_is_smaller(tmp_path):
    t = make(str(tmp_path / "kv"))
    t.merge(src(range(200, 300)), on="id").when_matched_delete().execute()  # row group 2, whole
    assert [type(r) for r in new_tombstone(t)] == [RowGroupDelete]
    # 150..349 are consecutive live rows now (200..299 are gone): one exact key range.
    t.merge(src(range(150, 350)), on="id").when_matched_update_all().execute()
    [r] = new_tombstone(t)
    assert isinstance(r, KeyRangeDelete) and (r.pk_min, r.pk_max) == (150, 349)
    t.merge(src(range(500, 1000, 7)), on="id").when_matched_delete().execute()  # scattered
    assert [type(r) for r in new_tombstone(t)] == [PositionDelete]
    want = set(range(1000)) - set(range(200, 300)) - set(range(500, 1000, 7))
    got = rows(t)
    assert set(got) == want and all(got[i] == ("new", i * 10) for i in [*range(150, 200), *range(300, 350)])
    t.close()


def test_the_source_key_span_prunes_target_files(tmp_path):
    root = str(tmp_path / "kv")
    make(root, n=100).close()
    st = open_storage(root)
    log = TableLog(st)
    for lo in range(100, 1000, 100):  # nine more files, disjoint key ranges
        data = pa.table({"id": list(range(lo, lo + 100)), "v": ["old"] * 100, "n": list(range(lo, lo + 100))})
        log.append(write_data_files(st, data, log.latest().schema))
    t = castsql.open(root)
    # A file the span excludes is never opened: make one unreadable and merge around it.
    first = next(f for f in log.state(log.latest()).entries() if f.min["id"] == 0)
    (Path(root) / first.path).write_bytes(b"not parquet")
    m = t.merge(src([550, 1500]), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    assert (m.num_target_rows_updated, m.num_target_rows_inserted) == (1, 1)
    t.close()


def test_merge_from_pandas_and_polars(tmp_path):
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    t = make(str(tmp_path / "kv"), n=5)
    t.merge(
        pd.DataFrame({"id": [1, 7], "v": ["pd", "pd"], "n": [1, 7]}), on="id"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    t.merge(
        pl.DataFrame({"id": [2, 8], "v": ["pl", "pl"], "n": [2, 8]}), on="id"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    got = rows(t)
    assert got[1] == ("pd", 1) and got[7] == ("pd", 7) and got[2] == ("pl", 2) and got[8] == ("pl", 8)
    assert t.version == 3
    t.close()


def test_a_merge_that_changes_nothing_commits_nothing(tmp_path):
    t = make(str(tmp_path / "kv"), n=5)
    m = t.merge(src([100]), on="id").when_matched_update_all().execute()
    assert m.version is None and t.at().version == 1
    t.close()


def test_a_pinned_table_refuses_writes(tmp_path):
    t = make(str(tmp_path / "kv"), n=5)
    old = t.at(version=1)
    with pytest.raises(castsql.errors.CastSQLError, match="table kv is pinned at version 1; writes go to the newest"):
        old.merge(src([1]), on="id").when_matched_delete().execute()
    t.close()


# ---------------------------------------------------------------------- concurrency


def test_racing_increments_of_one_key_never_lose_an_update(tmp_path):
    """Two merges adding 1 to one key at once: each either commits on top of the
    other (re-planned from the new head) or fails with CommitConflict; the
    final value counts exactly the merges that committed, and the key stays unique."""
    root = str(tmp_path / "kv")
    make(root, n=50).close()
    ok = []
    errors = []

    def bump(barrier: threading.Barrier) -> None:
        t = castsql.open(root)
        try:
            barrier.wait()
            m = t.merge(pa.table({"id": [7], "n": [1]}), on="id").when_matched_update(
                set={"n": "target.n + source.n"}).execute()  # fmt: skip
            ok.append(m.version)
        except CommitConflict as e:
            errors.append(str(e))
        finally:
            t.close()

    for _ in range(4):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=bump, args=(barrier,)) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    t = castsql.open(root)
    got = rows(t)
    assert got[7] == ("old", 7 + len(ok)) and len(ok) + len(errors) == 8
    assert all("nothing was committed; retry" in e for e in errors)
    assert len(set(ok)) == len(ok)
    t.close()


def test_a_merge_racing_an_append_of_its_new_key_plans_again(tmp_path):
    root = str(tmp_path / "kv")
    t = make(root, n=10)
    from castsql.embedded.engine import Writer
    from castsql.snapshot import resolve
    from castsql.write.pipeline import Options, merge_once

    w = Writer(t._session, t.name)
    stale = resolve(w.log)  # the merge read version 1 ...
    t.append(src([42], v="appended"))  # ... then an append of the key it inserts landed
    spec = t.merge(src([42]), on="id").when_matched_update_all().when_not_matched_insert_all().spec()
    w.use_source(src([42]))
    with pytest.raises(CommitConflict, match="may hold a key this merge inserts"):
        merge_once(w, spec, stale, Options())
    # The engine's own loop re-plans from the new head: the key is matched and updated, not duplicated.
    m = t.merge(src([42]), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    assert (m.num_target_rows_updated, m.num_target_rows_inserted) == (1, 0)
    assert rows(t)[42] == ("new", 420)
    t.close()


def test_an_append_elsewhere_in_the_key_space_does_not_conflict(tmp_path):
    root = str(tmp_path / "kv")
    t = make(root, n=10)
    from castsql.embedded.engine import Writer
    from castsql.snapshot import resolve
    from castsql.write.pipeline import Options, merge_once

    w = Writer(t._session, t.name)
    stale = resolve(w.log)
    t.append(src([500]))
    spec = t.merge(src([42]), on="id").when_not_matched_insert_all().spec()
    w.use_source(src([42]))
    m = merge_once(w, spec, stale, Options())
    assert m.version == 3 and set(rows(t.at())) == {*range(10), 42, 500}
    t.close()


# ---------------------------------------------------------------------- crash


@pytest.mark.parametrize(
    ("step", "committed"),
    [("data:after", False), ("tombstone:after", False), ("manifest:before", False), ("manifest:after", True)],
)
def test_a_merge_killed_before_its_commit_leaves_the_table_unchanged(tmp_path, step, committed):
    root = str(tmp_path / "kv")
    t = make(root, n=20)
    before = rows(t)
    t.close()
    r = subprocess.run([sys.executable, WORKER, root, step], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    t = castsql.open(root)
    after = {**before, 5: ("new", 50), 100: ("new", 1000)}
    assert rows(t) == (after if committed else before)
    assert t.version == (2 if committed else 1)
    # The next merge commits normally on top; the crashed one's files are garbage, never read.
    t.merge(src([6]), on="id").when_matched_update_all().execute()
    assert rows(t)[6] == ("new", 60)
    t.close()
