"""The commit protocol on real storage: appends, deletes, rebases, conflicts,
the roll-forward rule, and the errors that leave a table unchanged."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from pyroaring import BitMap
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

from castsql.errors import CommitConflict, FormatError, SchemaMismatch, TableExists, TableNotFound, VersionNotFound
from castsql.format import (
    Change,
    KeyRangeDelete,
    PositionDelete,
    RetryPolicy,
    RowGroupDelete,
    TableLog,
    write_data_files,
)
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.storage import PreconditionFailed

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "name": [f"n{i}" for i in range(start, start + n)]})


def snapshot_objects(storage) -> dict[str, bytes]:
    return {o.key: storage.get(o.key) for o in storage.list("")}


@pytest.fixture
def log(storage):
    return TableLog.create(storage, SCHEMA, primary_key="id")


def append(log, start, n, **kw):
    return log.append(write_data_files(log.storage, rows(start, n), log.latest().schema, **kw))


def test_versions_are_contiguous_and_times_monotonic(log):
    for i in range(5):
        append(log, i * 10, 10)
    hist = log.history()
    assert [m.version for m in hist] == list(range(6))
    assert [m.previous for m in hist] == [None, 0, 1, 2, 3, 4]
    assert all(a.created_at <= b.created_at for a, b in itertools.pairwise(hist))
    assert hist[-1].operation == "APPEND" and hist[-1].summary["added_rows"] == 10
    assert json.loads(log.storage.get(POINTER_KEY))["version"] == 5


def test_create_twice_is_refused_unless_exist_ok(storage, log):
    with pytest.raises(TableExists):
        TableLog.create(storage, SCHEMA)
    assert TableLog.create(storage, SCHEMA, exist_ok=True).latest_version() == 0


def test_open_missing_table(storage):
    with pytest.raises(TableNotFound, match="no table here"):
        TableLog(storage).latest()


def test_schema_mismatch_on_append_changes_nothing(log):
    before = snapshot_objects(log.storage)
    bad = pa.table({"id": ["x"], "name": ["y"]})
    with pytest.raises(SchemaMismatch, match="column 'id'"):
        write_data_files(log.storage, bad, log.latest().schema)
    with pytest.raises(SchemaMismatch, match="unknown columns"):
        write_data_files(log.storage, pa.table({"id": [1], "name": ["a"], "extra": [1]}), log.latest().schema)
    assert snapshot_objects(log.storage) == before


def test_append_of_files_with_another_schema_is_refused(log):
    other = write_data_files(log.storage, pa.table({"x": [1]}))
    with pytest.raises(SchemaMismatch):
        log.append(other, schema=log.latest().schema.__class__.from_arrow(pa.schema([("x", pa.int64())])))
    assert log.latest_version() == 0


def test_delete_kinds_commit_one_tombstone_each(log):
    m = append(log, 0, 100, row_group_size=25)
    f = m.data_files[0]
    assert f.row_group_rows == (25, 25, 25, 25)
    m2 = log.delete(
        [
            RowGroupDelete(f.name, 1),
            KeyRangeDelete(f.name, 60, 64),
            PositionDelete(f.path, 3, BitMap([0, 1])),
            PositionDelete(f.name, None, BitMap([99])),
        ],
        deleted_rows=34,
    )
    assert m2.version == 2 and len(m2.tombstones) == 1
    assert m2.summary["deleted_rows"] == 34
    assert len(log.tombstones(m2.tombstones[0])) == 4


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (lambda f: RowGroupDelete("nope.parquet", 0), "not a data file of this version"),
        (lambda f: RowGroupDelete(f.name, 9), "row group 9"),
        (lambda f: PositionDelete(f.name, 0, BitMap([10])), "past the end of row group 0"),
        (lambda f: PositionDelete(f.name, None, BitMap([20])), "past the end"),
        (lambda f: RowGroupDelete("s3://elsewhere/x/" + f.name, 0), "outside the table root"),
    ],
)
def test_bad_tombstones_change_nothing(log, record, message):
    f = append(log, 0, 20, row_group_size=10).data_files[0]
    before = snapshot_objects(log.storage)
    with pytest.raises(FormatError, match=message):
        log.delete([record(f)])
    assert snapshot_objects(log.storage) == before


def test_key_range_needs_a_primary_key(storage):
    log = TableLog.create(storage, SCHEMA)
    f = append(log, 0, 5).data_files[0]
    with pytest.raises(FormatError, match="no primary key"):
        log.delete([KeyRangeDelete(f.name, 0, 1)])
    assert log.latest_version() == 1


def test_delete_of_nothing_commits_nothing(log):
    assert log.delete([]) is None
    assert log.latest_version() == 0


def test_writer_died_after_manifest_put_rolls_forward(storage, log):
    append(log, 0, 5)
    # A writer that created manifest 2 and died before moving the pointer:
    base = log.latest()
    storage.put_if_absent(manifest_key(2), base.evolve(version=2, previous=1, operation="APPEND").to_bytes())
    fresh = TableLog(storage)
    assert fresh.latest_version() == 2  # readers see the committed version
    assert json.loads(storage.get(POINTER_KEY))["version"] == 1  # readers never write
    append(fresh, 5, 5)
    assert fresh.latest_version() == 3
    assert json.loads(storage.get(POINTER_KEY))["version"] == 3  # the next writer repaired it


def test_a_reader_that_read_the_head_before_sees_every_version_since(storage, log):
    """The check a warm reader makes before each query (on an object store the
    pointer and the manifest past its last head are read together, in one
    round trip): nothing new, a version past a pointer that did not move, a
    moved pointer, several versions at once, and a bad manifest past the head."""
    reader = TableLog(storage)
    assert reader.latest_version() == 0
    assert reader.latest_version() == 0
    # A writer that created manifest 1 and died before moving the pointer.
    storage.put_if_absent(manifest_key(1), log.latest().evolve(version=1, previous=0, operation="APPEND").to_bytes())
    assert reader.latest_version() == 1
    assert json.loads(storage.get(POINTER_KEY))["version"] == 0
    append(log, 0, 5)
    assert reader.latest_version() == 2
    append(log, 5, 5)
    append(log, 10, 5)
    assert reader.latest_version() == 4
    storage.put_if_absent(manifest_key(5), b"{not a manifest")
    with pytest.raises(FormatError, match=r"v00000005\.json"):
        reader.latest_version()


def test_creator_died_before_pointer(storage):
    log = TableLog.create(storage, SCHEMA)
    storage.delete(POINTER_KEY)
    assert TableLog(storage).latest_version() == 0
    append(TableLog(storage), 0, 3)
    assert json.loads(storage.get(POINTER_KEY))["version"] == 1
    assert log.latest_version() == 1


def test_pointer_naming_a_missing_manifest(storage, log):
    storage.put_if_match(POINTER_KEY, b'{"version": 7}', storage.get_with_etag(POINTER_KEY)[1])
    with pytest.raises(FormatError, match=r"names version 7, but manifest/v00000007.json does not exist"):
        TableLog(storage).latest()


def test_corrupt_manifest_is_named_and_commit_refused(storage, log):
    append(log, 0, 5)
    storage.put_if_absent(manifest_key(2), b'{"version": 2, "previ')
    before = snapshot_objects(storage)
    with pytest.raises(FormatError, match=r"v00000002.json: manifest is not valid JSON"):
        TableLog(storage).latest()
    with pytest.raises(FormatError):
        append(TableLog(storage), 5, 5)
    # The refused append wrote its data file (garbage for GC) but committed nothing.
    after = snapshot_objects(storage)
    assert {k for k in after if not k.startswith("data/")} == {k for k in before if not k.startswith("data/")}


def test_losing_writer_rebases_on_the_winner(storage, log):
    a, b = TableLog(storage), TableLog(storage)
    a.latest(), b.latest()
    files_b = write_data_files(storage, rows(100, 3), log.latest().schema)
    append(a, 0, 3)  # a wins version 1 while b holds version 0
    mb = b.append(files_b)
    assert mb.version == 2 and mb.previous == 1
    assert sorted(f.total_rows for f in mb.data_files) == [3, 3]


def test_delete_conflicts_with_compaction_that_removed_its_file(log):
    f = append(log, 0, 10).data_files[0]
    log.commit(Change("COMPACT", remove_files=(f.path,), read_tombstones=frozenset()))
    before = snapshot_objects(log.storage)
    with pytest.raises(FormatError, match="not a data file of this version"):
        log.delete([RowGroupDelete(f.name, 0)])
    # Computed against version 1 (which had the file), it is a conflict at commit time:
    with pytest.raises(CommitConflict, match="not in the table"):
        log.delete([RowGroupDelete(f.name, 0)], read_version=1)
    assert log.latest_version() == 2
    assert {k for k in snapshot_objects(log.storage) if not k.startswith("tombstone/")} == set(before)


def test_compaction_conflicts_with_a_newer_delete(log):
    f = append(log, 0, 10).data_files[0]
    read = log.latest()
    log.delete([PositionDelete(f.name, None, BitMap([1]))])
    change = Change(
        "COMPACT", remove_files=(f.path,), read_version=read.version, read_tombstones=frozenset(read.tombstones)
    )
    with pytest.raises(CommitConflict, match="committed after version 1"):
        log.commit(change)
    assert log.latest_version() == 2


class _AlwaysLoses:
    """Storage whose manifest puts always lose the race, like a hot table."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def put_if_absent(self, key, data):
        if key.startswith("manifest/"):
            raise PreconditionFailed(key, "object already exists")
        return self._inner.put_if_absent(key, data)


def test_retries_are_bounded_with_a_clear_error(storage, log):
    files = write_data_files(storage, rows(0, 2), log.latest().schema)
    hot = TableLog(_AlwaysLoses(storage), retry=RetryPolicy(max_attempts=5, base_delay=0.0001))
    with pytest.raises(CommitConflict, match="lost the commit race 5 times; nothing was committed"):
        hot.append(files)
    assert log.latest_version() == 0


def test_time_travel_by_timestamp(log):
    for i in range(3):
        append(log, i, 1)
    hist = log.history()
    assert log.version_at(hist[2].created_at) == 2
    assert log.version_at(hist[3].created_at + timedelta(days=1)) == 3
    with pytest.raises(VersionNotFound, match="no version at or before"):
        log.version_at(datetime(2000, 1, 1, tzinfo=UTC))


def test_missing_versions(storage, log):
    append(log, 0, 1)
    append(log, 1, 1)
    with pytest.raises(VersionNotFound, match=r"version 9 does not exist \(latest is 2\)"):
        log.manifest(9)
    storage.delete(manifest_key(0))
    with pytest.raises(VersionNotFound, match=r"version 0 was garbage-collected \(oldest kept is 1\)"):
        TableLog(storage).manifest(0)


def test_a_retried_commit_with_the_same_id_commits_once(storage, log):
    files = write_data_files(storage, rows(0, 3), log.latest().schema)
    first = log.append(files, commit_id="c-123")
    append(TableLog(storage), 10, 2)  # someone else commits meanwhile
    # The caller never heard back from the first call and retries it:
    again = TableLog(storage).append(files, commit_id="c-123")
    assert again.version == first.version == 1
    assert TableLog(storage).latest_version() == 2


class _CountingGets:
    """The log's storage, counting reads of the pointer."""

    def __init__(self, inner):
        self._inner, self.pointer_reads = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_with_etag(self, key):
        self.pointer_reads += key == POINTER_KEY
        return self._inner.get_with_etag(key)


def test_a_commit_planned_on_the_head_just_read_does_not_read_the_pointer_again(storage, log):
    counting = _CountingGets(storage)
    mine = TableLog(counting)
    files = write_data_files(storage, rows(0, 3), log.latest().schema)
    head = mine.latest()
    assert counting.pointer_reads == 1
    m = mine.commit(Change("APPEND", add_files=tuple(files)), base=head)
    assert (m.version, counting.pointer_reads) == (1, 1)  # issue 36: an append's two requests fewer on S3


def test_a_commit_planned_on_a_stale_head_still_lands_after_the_commit_that_beat_it(storage, log):
    mine = TableLog(storage)
    stale = mine.latest()  # version 0, remembered with the pointer's ETag
    log.append(write_data_files(storage, rows(0, 3), log.latest().schema))  # another writer: version 1
    files = write_data_files(storage, rows(10, 2), stale.schema)
    m = mine.commit(Change("APPEND", add_files=tuple(files)), base=stale)
    assert m.version == 2 and m.previous == 1
    assert mine.latest().version == 2 and json.loads(storage.get(POINTER_KEY))["version"] == 2
    assert sorted(f.total_rows for f in mine.state(m).entries()) == [2, 3]  # neither commit lost


@pytest.mark.parametrize("write", ["delete", "update", "merge", "append"])
def test_a_write_behind_a_lagging_pointer_sees_the_versions_past_it(storage, s3_config, write):
    """Writers plan their first attempt on the pointer's version without the
    roll-forward probe (FORMAT.md §6.1). A row that only a version past a
    lagging pointer holds (its writer died before moving the pointer, or GCS
    refused the pointer move) is still deleted, updated, matched or refused as
    a duplicate key: "nothing to do" is confirmed with the probe, and a commit
    planned on the stale version loses its manifest put and plans again."""
    import castsql
    from castsql.errors import DuplicateKey
    from castsql.format.log import pointer_bytes

    uri = storage.root
    events = pa.table({"id": pa.array(range(10), pa.int64()), "v": pa.array(range(10), pa.int64())})
    castsql.write_table(uri, events, primary_key="id", s3=s3_config)
    lagging = storage.get_with_etag(POINTER_KEY)
    castsql.open(uri, s3=s3_config).append(pa.table({"id": pa.array([10], pa.int64()), "v": pa.array([10])}))
    head = TableLog(storage).latest().version
    storage.put(POINTER_KEY, pointer_bytes(head - 1, "lagging"))  # as if the last writer died before the move
    assert lagging[0] != storage.get(POINTER_KEY)
    t = castsql.open(uri, s3=s3_config)
    row = pa.table({"id": pa.array([10], pa.int64()), "v": pa.array([-1], pa.int64())})
    if write == "delete":
        m = t.delete("id = 10")
    elif write == "update":
        m = t.update({"v": "-1"}, "id = 10")
    elif write == "merge":
        m = t.merge(row, on="id").when_matched_update_all().execute()
    else:
        with pytest.raises(DuplicateKey, match="id = 10"):
            t.append(row)
        assert TableLog(storage).latest().version == head  # nothing committed
        return
    assert m is not None and (getattr(m, "version", None) or m.version) == head + 1
    rows = {r["id"]: r["v"] for r in castsql.open(uri, s3=s3_config).to_arrow().to_pylist()}
    assert rows.get(10) == (None if write == "delete" else -1) and len(rows) == (10 if write == "delete" else 11)
