"""Garbage collection: old versions and unreferenced objects go, nothing a kept version needs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import events_rows
from paths import SUPPORT

from castsql.errors import CastSQLError, CommitConflict, TableNotFound, VersionNotFound
from castsql.format import TableLog, write_data_files
from castsql.format.layout import DATA_DIR, POINTER_KEY, TOMBSTONE_DIR, to_table_key
from castsql.format.log import pointer_bytes
from castsql.snapshot import resolve
from castsql.spark import append, compact, delete, gc
from castsql.storage import open_storage

TESTS = SUPPORT.parent  # conftest.py, which the writer processes import (it imports support's modules)
LATER = timedelta(days=8)  # past the default grace of 7 days
NOW = timedelta(0)  # grace when no writer is in flight: collect everything the rules allow at once
HOUR = timedelta(hours=1)
WRITER_GRACE = timedelta(seconds=30)  # longer than any commit of the test's writer processes


def _keys(st, prefix: str) -> set[str]:
    return {i.key for i in st.list(prefix)}


def _referenced(log: TableLog, versions) -> set[str]:
    out = set()
    for v in versions:
        m = log.manifest(v)
        out |= set(log.state(m).keys().to_pylist())  # every data file, in objects or inline
        out |= {to_table_key(t, log.uri, what="t") for t in m.tombstones}  # inline tombstone files
        out |= {r.path for r in (*m.file_objects, *m.delete_objects)}  # metadata objects
    return out


@pytest.mark.spark
def test_append_delete_compact_gc_keeps_exactly_the_kept_versions(
    spark, events_df, check_version, storage_root, s3_config
):
    uri = storage_root + "/events"
    live: dict[int, set[int]] = {}
    for lo in (0, 300):
        m = append(spark, uri, events_df(range(lo, lo + 300)), primary_key="id", s3=s3_config, row_group_size=100)
        live[m.version] = set(range(lo + 300))
    for cond, gone in (("id < 200", set(range(200))), ("id BETWEEN 300 AND 320", set(range(300, 321)))):
        m = delete(spark, uri, cond, s3=s3_config)
        live[m.version] = live[m.version - 1] - gone
    c = compact(spark, uri, s3=s3_config)  # v5: file A rewritten, its tombstone dropped
    live[c.version] = live[c.version - 1]
    m = delete(spark, uri, "id = 400", s3=s3_config)  # v6
    live[m.version] = live[m.version - 1] - {400}
    st = open_storage(uri, s3=s3_config)
    log = TableLog(st)
    everything = _keys(st, DATA_DIR + "/") | _keys(st, TOMBSTONE_DIR + "/")

    dry = gc(uri, keep_versions=2, grace=NOW, dry_run=True, s3=s3_config)
    assert dry.kept_versions == [5, 6] and dry.removed_versions == [0, 1, 2, 3, 4]
    assert _keys(st, DATA_DIR + "/") | _keys(st, TOMBSTONE_DIR + "/") == everything  # dry: nothing deleted
    assert "would remove 5 version(s) 0-4, 1 data file(s), 1 tombstone file(s), 0 orphan(s)" in dry.summary()

    report = gc(uri, keep_versions=2, grace=NOW, s3=s3_config)
    assert report.removed_keys == dry.removed_keys and report.bytes_freed == dry.bytes_freed > 0
    assert log.versions() == [5, 6]
    kept = _referenced(log, [5, 6])
    assert _keys(st, DATA_DIR + "/") | _keys(st, TOMBSTONE_DIR + "/") == kept
    assert set(report.removed_data_files) | set(report.removed_tombstones) == everything - kept
    for v in (5, 6):
        check_version(uri, v, live[v])
    for v in range(5):
        with pytest.raises(VersionNotFound, match="garbage-collected"):
            log.manifest(v)
    again = gc(uri, keep_versions=2, grace=NOW, s3=s3_config)
    assert again.removed_keys == [] and "removed 0 version(s)" in again.summary()


def _small_table(root: Path) -> TableLog:
    st = open_storage(str(root))
    log = TableLog.create(st, events_rows([]).schema, primary_key="id")
    for lo in (0, 10, 20):
        log.append(write_data_files(st, events_rows(range(lo, lo + 10)), log.latest().schema))
    return log


def test_orphans_and_temp_files_wait_for_the_grace_period(tmp_path):
    log = _small_table(tmp_path / "t")
    st = log.storage
    [orphan] = write_data_files(st, events_rows(range(100, 110)), log.latest().schema)  # a writer not yet committed
    tmp = Path(st.root) / "data" / ".tmp-x.parquet.123"
    tmp.write_bytes(b"half a file")
    report = gc(st.root)
    assert report.removed_keys == [] and report.kept_versions == [0, 1, 2, 3]
    assert st.exists(orphan.path) and tmp.exists()
    report = gc(st.root, grace=timedelta(hours=1), now=datetime.now(UTC) + timedelta(hours=2))
    assert report.removed_orphans == [orphan.path] and report.removed_temp_files == ["data/.tmp-x.parquet.123"]
    assert not st.exists(orphan.path) and not tmp.exists()
    assert log.versions() == [0, 1, 2, 3] and resolve(log, 3).live_rows == 30


def test_older_than_drops_old_versions_but_never_the_latest(tmp_path):
    log = _small_table(tmp_path / "t")
    two_hours_on = datetime.now(UTC) + timedelta(hours=2)
    assert gc(log.uri, older_than=timedelta(hours=3), grace=HOUR, now=two_hours_on).removed_versions == []
    report = gc(log.uri, older_than=timedelta(hours=1), grace=HOUR, now=two_hours_on)
    assert report.removed_versions == [0, 1, 2] and report.kept_versions == [3]
    # Appends only: every data file is still referenced by version 3.
    assert report.removed_data_files == [] and resolve(log, 3).live_rows == 30
    # Both rules: a version is kept if either keeps it.
    log2 = _small_table(tmp_path / "t2")
    half_hour_on = datetime.now(UTC) + timedelta(minutes=30)
    r2 = gc(log2.uri, keep_versions=2, older_than=timedelta(hours=1), grace=NOW, now=half_hour_on)
    assert r2.removed_versions == []


def test_versions_past_a_lagging_pointer_are_kept(tmp_path):
    """A writer that died after its manifest put leaves the pointer behind;
    readers start at the pointer, so its manifest must stay."""
    log = _small_table(tmp_path / "t")
    log.storage.put(POINTER_KEY, pointer_bytes(1, "lagging"))
    report = gc(log.uri, keep_versions=1, grace=NOW)
    assert report.kept_versions == [1, 2, 3] and report.removed_versions == [0]
    assert TableLog(open_storage(log.uri)).latest().version == 3


class _GCRightAfterPointerRead:
    """Storage that lets another writer commit and a GC run between this
    reader's pointer GET and its manifest GET: the interleaving that GC
    running beside writers produces."""

    def __init__(self, inner, interleave) -> None:
        self._inner, self._interleave = inner, interleave

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_with_etag(self, key):
        out = self._inner.get_with_etag(key)
        if key == POINTER_KEY and self._interleave:
            self._interleave.pop()()
        return out


def test_a_reader_overtaken_by_gc_rereads_the_pointer(tmp_path):
    log = _small_table(tmp_path / "t")

    def commit_then_gc():
        log.append(write_data_files(log.storage, events_rows(range(30, 40)), log.latest().schema))
        assert gc(log.uri, keep_versions=1, grace=NOW).removed_versions == [0, 1, 2, 3]

    reader = TableLog(_GCRightAfterPointerRead(open_storage(log.uri), [commit_then_gc]))
    # It read pointer 3, whose manifest is gone by the time it asks for it.
    assert reader.latest().version == 4
    assert resolve(reader, 4).live_rows == 40


class _StallBeforeManifestPut:
    """Storage whose first manifest put waits while ``interleave`` runs: a
    writer stalled between reading its head and creating the next version."""

    def __init__(self, inner, interleave) -> None:
        self._inner, self._interleave = inner, interleave

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def put_if_absent(self, key, data):
        if key.startswith("manifest/") and self._interleave:
            self._interleave.pop()()
        return self._inner.put_if_absent(key, data)


def test_gc_keeps_young_manifests_so_a_stalled_writer_cannot_fork_the_history(tmp_path):
    """Found by tests/storage/test_faults.py: GC deleted version N's manifest while a
    writer that had read head N-1 was about to create it; its create-only put
    then succeeded, and the versions after N (built on the old N) hid its rows."""
    log = _small_table(tmp_path / "t")
    schema = log.latest().schema

    def others_commit_then_gc():
        for lo in (100, 200):
            log.append(write_data_files(log.storage, events_rows(range(lo, lo + 10)), schema))
        report = gc(log.uri, keep_versions=1)  # default grace: versions 4 and 5 are minutes old
        assert report.removed_versions == [] and report.kept_versions == [0, 1, 2, 3, 4, 5]

    stalled = TableLog(_StallBeforeManifestPut(open_storage(log.uri), [others_commit_then_gc]))
    m = stalled.append(write_data_files(log.storage, events_rows(range(300, 310)), schema))
    assert m.version == 6  # lost the race for 4, rebased on 5
    assert TableLog(open_storage(log.uri)).versions() == list(range(7))
    assert resolve(log, 6).live_rows == 60
    # Once the grace has passed, the same call collects them.
    assert gc(log.uri, keep_versions=1, now=datetime.now(UTC) + LATER).removed_versions == [0, 1, 2, 3, 4, 5]


def test_bad_arguments_are_refused_and_change_nothing(tmp_path):
    log = _small_table(tmp_path / "t")
    before = _keys(log.storage, "")
    with pytest.raises(CastSQLError, match="keep_versions must be at least 1"):
        gc(log.uri, keep_versions=0)
    with pytest.raises(CastSQLError, match="grace must not be negative"):
        gc(log.uri, grace=timedelta(seconds=-1))
    with pytest.raises(CastSQLError, match="older_than must not be negative"):
        gc(log.uri, older_than=timedelta(days=-1))
    with pytest.raises(TableNotFound):
        gc(str(tmp_path / "nothing"))
    assert _keys(log.storage, "") == before


def test_gc_runs_without_spark(tmp_path):
    log = _small_table(tmp_path / "t")
    code = f"""
import sys
from datetime import timedelta
from castsql.spark import gc
print(gc({log.uri!r}, keep_versions=1, grace=timedelta(0)).removed_versions, "pyspark" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["[0,", "1,", "2]", "False"], out.stderr


def test_a_table_collects_its_own_old_versions_in_process(tmp_path):
    """``castsql.Table.gc``: what a DuckDB-only user calls (deltalake's
    ``vacuum``); old versions go, the latest reads the same, a pinned table
    refuses, a dry run deletes nothing."""
    import pyarrow as pa

    import castsql

    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), primary_key="id")
    t = castsql.open(uri)
    t.update(set={"v": "'B'"}, where="id = 2")
    t.delete("id = 3")
    t.append(pa.table({"id": [4], "v": ["d"]}))
    assert t.history().column("version").to_pylist() == [0, 1, 2, 3, 4]  # create, append, update, delete, append
    before = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])

    with pytest.raises(CastSQLError, match="pinned at version 1"):
        t.at(1).gc(keep_versions=1, grace=NOW)
    dry = t.gc(keep_versions=1, grace=NOW, dry_run=True)
    assert dry.dry_run and dry.removed_versions == [0, 1, 2, 3]
    assert TableLog(open_storage(uri)).versions() == [0, 1, 2, 3, 4]

    report = t.gc(keep_versions=1, grace=NOW)
    assert report.removed_versions == [0, 1, 2, 3] and report.bytes_freed > 0
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == before
    with pytest.raises(VersionNotFound, match="garbage-collected"):
        t.at(1).to_arrow()
    assert TableLog(open_storage(uri)).versions() == [4]


def test_a_dry_run_held_back_by_the_grace_period_says_so(tmp_path):
    log = _small_table(tmp_path / "t")
    cli = [sys.executable, "-m", "castsql.cli", "gc", log.uri, "--keep-versions", "1", "--dry-run"]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "would remove 0 version(s)" in out.stdout
    assert "3 version(s) or object(s) kept because they are younger than the grace period (7d)" in out.stdout
    assert "--grace 0" in out.stdout
    # --grace 0 (no unit needed for zero) lets the same dry run see them.
    out = subprocess.run([*cli, "--grace", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "would remove 3 version(s) 0-2" in out.stdout and "grace period" not in out.stdout
    assert log.versions() == [0, 1, 2, 3]  # dry runs remove nothing


# -- GC while other processes commit --------------------------------------------

WRITER = """
import random, sys, time
sys.path[:0] = {paths!r}
from conftest import events_rows
from pyroaring import BitMap
import pyarrow.parquet as pq
from castsql.errors import CommitConflict
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.snapshot import resolve
from castsql.storage import open_storage

role, n, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
st = open_storage({uri!r})
log = TableLog(st, writer=role)
rnd = random.Random(base)
for i in range(n):
    if role == "append":
        ids = range(base + 10 * i, base + 10 * i + 10)
        log.append(write_data_files(st, events_rows(ids), log.latest().schema))
        print("added", *ids, flush=True)
        continue
    while True:  # delete one live row of some file; recompute on conflict
        snap = resolve(log)
        f = rnd.choice(snap.files)
        live = [p for p in range(f.total_rows) if p not in f.deleted]
        p = rnd.choice(live)
        try:  # a compaction and a GC may have removed the file since we resolved: then start over
            row_id = pq.read_table(st.uri(f.key), columns=["id"])["id"][p].as_py()
        except OSError:
            continue
        try:
            log.delete([PositionDelete(f.key, None, BitMap([p]))], read_version=snap.version)
            break
        except CommitConflict:
            continue
    print("deleted", row_id, flush=True)
    time.sleep(0.05)
"""


@pytest.mark.spark
def test_gc_never_removes_what_a_kept_version_needs_while_writers_commit(spark, events_df, check_version, tmp_path):
    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(100)), primary_key="id", row_group_size=50)
    code = WRITER.format(paths=[str(TESTS), str(SUPPORT)], uri=uri)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, role, str(n), str(base)], stdout=subprocess.PIPE, text=True)
        for role, n, base in (("append", 12, 10_000), ("append", 12, 20_000), ("delete", 25, 1))
    ]
    rounds = 0
    deadline = time.monotonic() + 240
    # Compact and collect with the tightest settings while the writers run.
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        # The deleter keeps committing tombstones: a compaction losing to it is the rule, not a failure.
        with contextlib.suppress(CommitConflict):
            compact(spark, uri, threshold=0.02, attempts=2)
        gc(uri, keep_versions=1, grace=WRITER_GRACE)
        rounds += 1
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert rounds >= 2
    added, deleted = set(range(100)), set()
    for out in outs:
        for line in out.splitlines():
            word, *ids = line.split()
            (added if word == "added" else deleted).update(int(i) for i in ids)
    assert len(deleted) == 25
    log = TableLog(open_storage(uri))
    gc(uri, keep_versions=3, grace=NOW)  # the writers are done
    for v in log.versions():  # every kept version opens and reads: nothing it references is gone
        assert _referenced(log, [v]) <= _keys(log.storage, "")
        resolve(log, v)
    check_version(uri, log.latest().version, added - deleted)


def test_a_long_lived_session_refuses_versions_collected_after_it_read_them(tmp_path):
    from castsql.engine import Session

    log = _small_table(tmp_path / "t")
    with Session(log.uri) as s:
        assert s.sql("SELECT count(*) AS n FROM t AS OF VERSION 1").to_pylist() == [{"n": 10}]
        assert s.scan("t", ["id"], version=2).num_rows == 20
        gc(log.uri, keep_versions=1, grace=NOW)
        # The session still holds views and snapshots of 1 and 2; the table no longer has them.
        with pytest.raises(VersionNotFound, match=r"table t: version 1 was garbage-collected \(oldest kept is 3\)"):
            s.sql("SELECT count(*) FROM t AS OF VERSION 1")
        with pytest.raises(VersionNotFound, match="version 2 was garbage-collected"):
            s.scan("t", ["id"], version=2)
        with pytest.raises(VersionNotFound, match="version 1 was garbage-collected"):
            s.changes("t", 2, 3)  # version 2's changes need version 1
        with pytest.raises(VersionNotFound, match="version 3 need the version before it: version 2 was garbage"):
            s.changes("t", 3)
        with pytest.raises(VersionNotFound, match="version 3 need the version before it"):
            s.changes("t", "2000-01-01")  # every kept commit is later: from version 3, whose change is unknown
        with pytest.raises(
            VersionNotFound, match=r"^table t: version 0 was garbage-collected \(oldest kept is 3\); no kept"
        ):
            s.changes("t", 0)
        assert s.sql("SELECT count(*) AS n FROM t AS OF VERSION 3").to_pylist() == [{"n": 30}]
