"""Format version 2 (FORMAT.md §3.2): metadata objects instead of full file
lists, commits that scale with the change, readers of every version across
the version-1/version-2 boundary, and bad metadata objects named in one line."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

from castsql.engine import Session
from castsql.errors import CastSQLError, FormatError
from castsql.format import DataFile, Manifest, PositionDelete, Schema, TableLog, fold, write_data_files
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.log import pointer_bytes
from castsql.format.manifest import parse_manifest
from castsql.snapshot import Predicate, resolve
from castsql.spark import gc

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])


@pytest.fixture
def small_policy(monkeypatch):
    """The fold and merge policy with tiny thresholds, so a few dozen commits
    cross every one of them (the real ones: 32 inline, fanout 8, 16,384 rows)."""
    monkeypatch.setattr(fold, "FILES_INLINE_MAX", 2)
    monkeypatch.setattr(fold, "DELETES_INLINE_MAX", 2)
    monkeypatch.setattr(fold, "FANOUT", 3)
    monkeypatch.setattr(fold, "OBJECT_TARGET", 20)


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": list(range(lo, hi)), "k": [f"k{i}" for i in range(lo, hi)]}, schema=SCHEMA)


def ids(log: TableLog, m: Manifest) -> list[int]:
    return sorted(i for f in log.state(m).entries() for i in range(f.min["id"], f.max["id"] + 1))


def check_bounds(m: Manifest) -> None:
    """What the merge policy promises: fewer than FANOUT non-full objects per level."""
    for objects in (m.file_objects, m.delete_objects):
        levels = Counter(r.level for r in objects if r.level is not None)
        assert all(n < fold.FANOUT for n in levels.values()), levels
    assert len(m.data_files) <= fold.FILES_INLINE_MAX and len(m.tombstones) <= fold.DELETES_INLINE_MAX


def test_commits_fold_and_merge_and_every_version_reads(storage, small_policy, s3_config):
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    live: dict[int, set[int]] = {0: set()}
    for i in range(60):
        m = log.append(write_data_files(storage, rows(10 * i, 10 * i + 10)))
        live[m.version] = live[m.version - 1] | set(range(10 * i, 10 * i + 10))
        check_bounds(m)
        assert m.format_version == 2 and m.totals.files == i + 1 and m.totals.rows == 10 * (i + 1)
        assert [f.path for f in m.change.added_files] == [f.path for f in log.state(m).entries()][-1:]
    assert any(r.level is None for r in m.file_objects)  # full objects exist
    assert ids(log, m) == sorted(live[m.version])  # every file exactly once
    entries = log.state(m).entries()
    for i in range(12):  # deletes: tombstones fold into deletes objects and merge
        f = entries[i]
        m = log.delete([PositionDelete(f.path, None, BitMap([i % 10]))])
        live[m.version] = live[m.version - 1] - {f.min["id"] + i % 10}
        check_bounds(m)
    assert m.delete_objects and m.totals.tombstones == 12
    with Session(storage.root, s3=s3_config) as s:
        name = storage.root.rstrip("/").rsplit("/", 1)[-1]
        for v in (0, 1, 7, 33, 60, 65, m.version):
            got = s.sql(f'SELECT id FROM "{name}" AS OF VERSION {v} ORDER BY id').column("id").to_pylist()
            assert got == sorted(live[v]), v
            assert resolve(log, v).live_rows == len(live[v])
        got = s.sql(f'SELECT count(*) AS n FROM "{name}" WHERE id BETWEEN 100 AND 119')["n"][0].as_py()
        assert got == len({i for i in live[m.version] if 100 <= i <= 119})


def test_files_objects_a_commit_wrote_are_kept_as_they_read_back(tmp_path, small_policy):
    """A commit keeps the files objects it writes (the next commit or
    compaction of a stream reads them without a request): what it keeps is
    what a reader of the stored object gets, through folds, removals and
    tier merges alike, and the entries as DataFiles match too."""
    from castsql.format.state import read_part
    from castsql.storage import open_storage

    storage = open_storage(str(tmp_path / "t"))
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    for i in range(40):
        m = log.append(write_data_files(storage, rows(10 * i, 10 * i + 10)))
    entries = log.state(m).entries()
    m = log.delete([PositionDelete(entries[3].path, None, BitMap(range(10)))])  # a removal rewrites an object
    assert m.file_objects
    for ref in m.file_objects:
        assert log.has_part(ref, m)
        kept, stored = log.part(ref, m), read_part(storage, ref, m, "test")
        assert kept.table.equals(stored.table, check_metadata=False) and kept.entries() == stored.entries()


def test_a_one_file_append_writes_the_same_however_big_the_table(tmp_path, small_policy, monkeypatch):
    from castsql.storage import open_storage

    monkeypatch.setattr(fold, "OBJECT_TARGET", 200)  # four levels below full: a merge every 2, 6, 18, 54 commits

    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, SCHEMA)
    written: list[int] = []
    for i in range(400):
        before = {o.key: o.size for o in st.list("")}
        log.append(write_data_files(st, rows(i, i + 1)))
        written.append(sum(o.size for o in st.list("") if o.key not in before and not o.key.startswith("data/")))
    early, late = sum(written[:200]) / 200, sum(written[200:]) / 200
    # Objects grow by level, so some commits write more; the mean over a series
    # stays about flat (a full object only adds a short reference to each manifest).
    assert late < 1.3 * early, (early, late)


def test_a_delete_writes_the_same_however_many_deletes_came_before(tmp_path, small_policy, monkeypatch):
    from castsql.storage import open_storage

    monkeypatch.setattr(fold, "OBJECT_TARGET", 1000)

    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, SCHEMA)
    log.append(write_data_files(st, rows(0, 1000), row_group_size=100))
    f = log.latest().data_files[0]
    sizes = []
    for i in range(300):
        m = log.delete([PositionDelete(f.path, None, BitMap([i]))])
        sizes.append(len(st.get(manifest_key(m.version))))
    # The manifest names only the tombstones not yet folded, and counts the rest:
    # 300 keys would be ~18 KB; it stays near its size after 40 deletes.
    text = st.get(manifest_key(log.latest_version())).decode()
    assert text.count("tombstone/") <= fold.DELETES_INLINE_MAX
    assert sizes[-1] < 2 * sizes[39], (sizes[39], sizes[-1])
    assert resolve(log).live_rows == 700


# ---------------------------------------------------------------- version 1 and the boundary


def commit_v1(log: TableLog, version: int, files: list[DataFile], tombstones: list[str]) -> None:
    """A version-1 manifest, as the seed's writers (or an older CastSQL) write them."""
    st = log.storage
    prev = log.manifest_raw(version - 1) if version else None
    m = Manifest(
        version=version,
        previous=version - 1 if version else None,
        created_at=(prev.created_at if prev else parse_time_now()),
        schema=Schema.from_arrow(SCHEMA),
        data_files=tuple(files),
        tombstones=tuple(tombstones),
        primary_key="id",
        operation="APPEND",
        format_version=1,
    )
    st.put_if_absent(manifest_key(version), m.to_bytes())
    st.put(POINTER_KEY, pointer_bytes(version, f"c{version}"))


def parse_time_now():
    from datetime import UTC, datetime

    return datetime.now(UTC)


@pytest.fixture
def v1_table(storage):
    """Versions 0-3 in format version 1: two appends and a delete, then version 2 commits on top."""
    from castsql.format.tombstone import serialize_tombstones

    log = TableLog(storage)
    commit_v1(log, 0, [], [])
    a = write_data_files(storage, rows(0, 50), row_group_size=10)
    commit_v1(log, 1, a, [])
    b = write_data_files(storage, rows(50, 100), row_group_size=10)
    commit_v1(log, 2, a + b, [])
    storage.put_new("tombstone/t1.del", serialize_tombstones([PositionDelete(b[0].path, None, BitMap([0, 1]))]))
    commit_v1(log, 3, a + b, ["tombstone/t1.del"])
    live = {0: set(), 1: set(range(50)), 2: set(range(100)), 3: set(range(2, 100)) - {0, 1} | set(range(50))}
    live[3] = set(range(100)) - {50, 51}
    return log, live


def test_a_v1_table_reads_as_before_and_becomes_v2_on_its_next_commit(v1_table, s3_config):
    log, live = v1_table
    assert log.latest().format_version == 1
    m = log.append(write_data_files(log.storage, rows(100, 110)))  # version 4: the first of version 2
    live[4] = live[3] | set(range(100, 110))
    m = log.delete([PositionDelete(log.state(m).entries()[0].path, None, BitMap([3]))])
    live[5] = live[4] - {3}
    assert [log.manifest(v).format_version for v in range(6)] == [1, 1, 1, 1, 2, 2]
    name = log.storage.root.rstrip("/").rsplit("/", 1)[-1]
    with Session(log.storage.root, s3=s3_config) as s:
        for v in range(6):
            got = s.sql(f'SELECT id FROM "{name}" AS OF VERSION {v}').column("id").to_pylist()
            assert sorted(got) == sorted(live[v]), v
        changes = s.sql(f"SELECT id, _change_type, _commit_version FROM table_changes('{name}', 3, 5)").to_pylist()
        assert sorted((r["_commit_version"], r["_change_type"], r["id"]) for r in changes) == sorted(
            [(3, "delete", 50), (3, "delete", 51), (5, "delete", 3)] + [(4, "insert", i) for i in range(100, 110)]
        )
        h = s.sql(f"SELECT version, live_rows, data_files, tombstone_files FROM table_history('{name}')").to_pylist()
        assert [(r["version"], r["live_rows"]) for r in h] == [(v, len(live[v])) for v in range(6)]
        assert h[-1]["data_files"] == 3 and h[-1]["tombstone_files"] == 2


def test_upgrade_command_commits_no_data_change(v1_table, worker_env):
    import subprocess
    import sys

    log, live = v1_table
    args = [sys.executable, "-m", "castsql.cli", "upgrade", log.storage.root]
    r = subprocess.run(args, capture_output=True, text=True, env=worker_env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "committed version 4 (format version 2" in r.stdout
    m = log.latest()
    assert m.operation == "UPGRADE" and m.format_version == 2 and m.change.added_files == ()
    assert resolve(log, 4).live_rows == len(live[3]) and m.totals.files == 2 and m.totals.tombstones == 1
    r = subprocess.run(args, capture_output=True, text=True, env=worker_env, timeout=120)
    assert r.returncode == 0 and "already format version 2; nothing committed" in r.stdout
    assert log.latest_version() == 4


# ---------------------------------------------------------------- reading only what is needed


class Counting:
    """A storage wrapper that counts GETs by key prefix."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.gets: Counter[str] = Counter()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get(self, key):
        self.gets[key.split("/", 1)[0]] += 1
        return self._inner.get(key)

    def get_with_etag(self, key):
        self.gets[key.split("/", 1)[0]] += 1
        return self._inner.get_with_etag(key)


def test_a_cold_selective_reader_reads_only_the_objects_that_can_match(tmp_path, small_policy):
    from castsql.storage import open_storage

    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, SCHEMA)
    for i in range(100):
        log.append(write_data_files(st, rows(10 * i, 10 * i + 10)))
    m = log.latest()
    cold = TableLog(Counting(st))
    snap = resolve(cold, m.version)
    pruned = snap.prune([Predicate("id", ">=", 500), Predicate("id", "<", 510)])
    assert [f.entry.min["id"] for f in pruned.files] == [500]
    assert cold.storage.gets["meta"] <= 2 < len(m.file_objects)  # of the table's objects
    # The next version, in the same session, is resolved from this one.
    log.delete([PositionDelete(pruned.files[0].key, None, BitMap([1]))])
    before = sum(cold.storage.gets.values())
    nxt = resolve(cold)
    assert nxt.live_rows == 999 and sum(cold.storage.gets.values()) - before <= 4


# ---------------------------------------------------------------- bad metadata objects


@pytest.fixture
def folded(storage, small_policy):
    log = TableLog.create(storage, SCHEMA)
    for i in range(8):
        log.append(write_data_files(storage, rows(10 * i, 10 * i + 10)))
    m = log.latest()
    assert m.file_objects
    return log, m


def _rewrite_manifest(log: TableLog, version: int, edit) -> None:
    st = log.storage
    doc = json.loads(st.get(manifest_key(version)))
    edit(doc)
    st.delete(manifest_key(version))
    st.put_if_absent(manifest_key(version), json.dumps(doc).encode())


BREAKS = {
    "missing": lambda log, ref: log.storage.delete(ref.path),
    "truncated": lambda log, ref: log.storage.put(ref.path, log.storage.get(ref.path)[:100]),
    "foreign": lambda log, ref: log.storage.put(ref.path, _parquet(pa.table({"x": [1]}))),
    "summary": lambda log, ref: _rewrite_manifest(  # totals kept equal to the summaries: only the object disagrees
        log,
        log.latest_version(),
        lambda d: (
            d["files"]["objects"][0].update(rows=ref.rows + 1),
            d["totals"].update(rows=d["totals"]["rows"] + 1),
        ),
    ),
    "outside": lambda log, ref: _rewrite_manifest(
        log, log.latest_version(), lambda d: d["files"]["objects"][0].update(path="../other/x.files.parquet")
    ),
    "newer": lambda log, ref: _rewrite_manifest(log, log.latest_version(), lambda d: d.update(format_version=3)),
}
MESSAGES = {
    "missing": "is missing",
    "truncated": "is not a Parquet file",
    "foreign": "is not a files object",
    "summary": "its summary in the manifest says",
    "outside": "outside the table root",
    "newer": "format_version 3 is newer than this CastSQL reads",
}


def _parquet(t: pa.Table) -> bytes:
    import io

    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


@pytest.mark.parametrize("how", list(BREAKS))
def test_a_bad_metadata_object_is_one_error_naming_it_and_the_version(folded, s3_config, how):
    log, m = folded
    ref = m.file_objects[0]
    BREAKS[how](log, ref)
    before = sorted((o.key, o.size) for o in log.storage.list(""))
    name = log.storage.root.rstrip("/").rsplit("/", 1)[-1]
    with Session(log.storage.root, s3=s3_config) as s:
        with pytest.raises(CastSQLError) as e:
            s.sql(f'SELECT count(id) FROM "{name}" AS OF VERSION {m.version}')  # count(*) needs no object
        msg = str(e.value)
        assert MESSAGES[how] in msg and "\n" not in msg
        assert f"v{m.version:08d}.json" in msg or "version" in msg
        if how != "outside":
            assert ref.path in msg or "format_version" in msg
        # Versions that do not hold the broken object still read.
        assert s.sql(f'SELECT count(*) AS n FROM "{name}" AS OF VERSION 2')["n"][0].as_py() == 20
    assert sorted((o.key, o.size) for o in log.storage.list("")) == before  # nothing written


def test_gc_keeps_the_objects_kept_versions_need_and_drops_the_rest(storage, small_policy, s3_config):
    log = TableLog.create(storage, SCHEMA)
    for i in range(40):
        log.append(write_data_files(storage, rows(10 * i, 10 * i + 10)))
    latest = log.latest()
    from datetime import timedelta

    report = gc(storage.root, keep_versions=1, grace=timedelta(0), s3=s3_config)
    assert report.removed_metadata
    left = {o.key for o in storage.list("meta/")}
    assert left == {r.path for r in (*latest.file_objects, *latest.delete_objects)}
    assert resolve(TableLog(storage), latest.version).live_rows == 400


def test_manifest_v2_round_trips_and_refuses_v1_keys():
    m = Manifest(0, None, parse_time_now(), Schema.from_arrow(SCHEMA), format_version=2)
    doc = json.loads(m.to_bytes())
    assert "data_files" not in doc and "tombstones" not in doc and doc["files"] == {"objects": [], "inline": []}
    assert parse_manifest(m.to_bytes(), "m").format_version == 2
    del doc["files"]
    with pytest.raises(FormatError, match="manifest has no 'files' field"):
        parse_manifest(json.dumps(doc).encode(), "m")


def test_stream_batches_are_carried_into_every_later_version(storage):
    """A micro-batch's commit records (query, batch) in ``streams``; appends,
    deletes and restores after it carry the record, so dropping the version
    that committed the batch does not lose it (FORMAT.md §3.2)."""
    from castsql.format import Change

    log = TableLog.create(storage, SCHEMA)
    batch = write_data_files(storage, rows(0, 10))
    log.commit(Change("APPEND", add_files=tuple(batch), summary={"stream_query": "q", "stream_batch": 4}))
    log.append(write_data_files(storage, rows(10, 20)))
    log.restore(0)
    m = TableLog(storage).latest()  # a fresh reader: read back from storage
    assert m.version == 3 and m.streams == {"q": 4}
    doc = json.loads(m.to_bytes())
    assert doc["streams"] == {"q": 4}
    for bad in ({"q": "4"}, {"q": -1}, {"": 2}, [], 0, None):
        doc["streams"] = bad
        with pytest.raises(FormatError, match="m: 'streams' must map stream queries to micro-batch ids"):
            parse_manifest(json.dumps(doc).encode(), "m")


def test_entry_statistics_round_trip_through_a_files_object():
    """What a files object stores of each entry's statistics reads back as the
    writer gave them (JSON values: times as ISO text in UTC with 'Z', naive
    times without it), at the limits of Python's times, for every unit and
    with statistics missing; NaN and infinities are no statistic."""
    from datetime import UTC, datetime

    from castsql.format.manifest import json_stat
    from castsql.format.metafiles import files_from_arrow, files_to_arrow

    schema = Schema.from_arrow(
        pa.schema(
            [("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
             ("ms", pa.timestamp("ms", tz="UTC")), ("x", pa.float64()), ("y", pa.float32()), ("s", pa.string())]
        )
    )  # fmt: skip
    times = [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(201, 5, 1, 3, 4, 5, 6, tzinfo=UTC),
        datetime(2025, 1, 4, 16, 0, 0, 20000, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]
    floats = [0.1, -0.0, 1e300, float("nan"), float("inf"), 3.5]
    entries = []
    for i in range(40):  # past the few an entry lookup formats one by one
        t = times[i % len(times)]
        ms = t.replace(microsecond=t.microsecond // 1000 * 1000)
        stats = {"id": i, "at": t, "local": t.replace(tzinfo=None), "ms": ms,
                 "x": floats[i % len(floats)], "y": 0.25 * i, "s": f"é{i}"}  # fmt: skip
        if i % 5 == 4:
            stats = {"id": i}  # an entry with statistics of its key only
        st_ = {k: json_stat(v) for k, v in stats.items()}
        st_ = {k: v for k, v in st_.items() if v is not None}
        entries.append(DataFile(f"data/{i}.parquet", 10 + i, 1, 5, min=st_, max=st_, row_group_rows=(5,)))
    back = files_from_arrow(files_to_arrow(entries, schema))
    assert back == entries
    assert back[2].min["at"] == "2025-01-04T16:00:00.020000Z" and back[2].min["local"] == "2025-01-04T16:00:00.020000"
    # Another writer's object may hold NaN or an infinity as a statistic: none.
    table = files_to_arrow(entries[:20], schema)
    lo = table.column("min").combine_chunks()
    fields = [f for f in lo.type]
    kids = [pa.array([float("nan"), float("-inf")] * 10) if f.name == "x" else lo.field(f.name) for f in fields]
    at = table.schema.get_field_index("min")
    table = table.set_column(at, "min", pa.StructArray.from_arrays(kids, fields=fields))
    back = files_from_arrow(table)
    assert not any("x" in f.min for f in back) and back[0].max["x"] == 0.1
