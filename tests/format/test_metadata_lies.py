"""Metadata that lies (issue 17, item 5): every count, bound, list and change
record a table's metadata states is checked before a reader believes it.

Each test builds a real table, writes the lie into its objects the way an
attacker with write access to the bucket would (edited manifests, rewritten
metadata objects, tombstone files), reads it through the public API and
checks for one error naming the object and the version, the same answer
whatever the session read before, and an unchanged table.
"""

from __future__ import annotations

import base64
import importlib
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap
from tables import build_events

import castsql
from castsql.errors import CastSQLError, FormatError
from castsql.format import Manifest, TableLog, fold, write_data_files
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.log import pointer_bytes
from castsql.storage import Storage, open_storage

NAME = "events"


# ---------------------------------------------------------------- helpers


@pytest.fixture
def small_policy(monkeypatch):
    """Tiny fold thresholds: a few commits give files and deletes objects."""
    monkeypatch.setattr(fold, "FILES_INLINE_MAX", 2)
    monkeypatch.setattr(fold, "DELETES_INLINE_MAX", 1)
    monkeypatch.setattr(fold, "FANOUT", 3)
    monkeypatch.setattr(fold, "OBJECT_TARGET", 20)


def _forget_snapshots() -> None:
    """A new process's state: resolved snapshots are cached per process."""
    importlib.import_module("castsql.snapshot.resolve")._cache.clear()


def listing(st: Storage) -> list[tuple[str, int]]:
    return sorted((o.key, o.size) for o in st.list(""))


def edit_manifest(st: Storage, version: int, edit) -> None:
    doc = json.loads(st.get(manifest_key(version)))
    edit(doc)
    st.delete(manifest_key(version))
    st.put_if_absent(manifest_key(version), json.dumps(doc).encode())


def edit_object(st: Storage, key: str, edit) -> None:
    """Rewrite a metadata object with ``edit(rows) -> rows``, same schema and kind."""
    table = pq.read_table(io.BytesIO(st.get(key)))
    rows = edit(table.to_pylist())
    out = pa.Table.from_pylist(rows, schema=table.schema)
    buf = io.BytesIO()
    pq.write_table(out, buf)
    st.put(key, buf.getvalue())


def add_v1_version(ev) -> int:
    """A format-1 manifest on top (as the seed's writers write them), listing
    what the latest version holds: files and tombstones inline."""
    log: TableLog = ev.log
    st = log.storage
    head = log.latest()
    state = log.state(head)
    v = head.version + 1
    m = Manifest(
        version=v,
        previous=head.version,
        created_at=head.created_at,
        schema=head.schema,
        data_files=tuple(state.entries()),
        tombstones=tuple(state.tombstone_keys()),
        primary_key=head.primary_key,
        operation="APPEND",
        format_version=1,
    )
    st.put_if_absent(manifest_key(v), m.to_bytes())
    st.put(POINTER_KEY, pointer_bytes(v, f"c{v}"))
    ev.live[v] = ev.live[head.version]
    return v


def sql(root: str, query: str, s3=None) -> list[dict]:
    with castsql.connect(root, s3=s3) as c:
        return c.sql(query).to_pylist()


def refused(root: str, query: str, *needles: str, s3=None) -> str:
    """The one-line error ``query`` gives, checked to hold every needle."""
    _forget_snapshots()
    with pytest.raises(CastSQLError) as e:
        sql(root, query, s3)
    msg = str(e.value)
    assert "\n" not in msg and "internal error" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


@pytest.fixture
def events_anywhere(storage, s3_config):
    """tests/support/tables.py's ``events`` (versions 0-6, format 2) in a warehouse, on
    local disk and S3: (the model, the warehouse root)."""
    st = open_storage(storage.root.rstrip("/") + "/" + NAME, s3=s3_config)
    try:
        yield build_events(st), storage.root
    finally:
        st.close()


@pytest.fixture
def events(tmp_path):
    """The same on local disk only: for lies whose check does not depend on the storage."""
    root = str(tmp_path / "wh")
    return build_events(open_storage(f"{root}/{NAME}")), root


@pytest.fixture
def local(tmp_path) -> Storage:
    return open_storage(str(tmp_path / "t"))


def _mfile(v: int) -> str:
    return f"manifest/v{v:08d}.json"


# ---------------------------------------------------------------- totals


@pytest.mark.parametrize("field", ["rows", "files", "bytes"])
def test_totals_that_disagree_with_the_entries_are_refused(events_anywhere, s3_config, field):
    ev, root = events_anywhere
    st = ev.log.storage
    assert sql(root, f"SELECT count(*) AS n FROM {NAME}", s3_config) == [{"n": len(ev.live[6])}]
    edit_manifest(st, 6, lambda d: d["totals"].update({field: d["totals"][field] + 997_899}))
    before = listing(st)
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri(_mfile(6)), "version 6", "totals say", s3=s3_config)
    refused(root, f"SELECT * FROM {NAME}", st.uri(_mfile(6)), "version 6", s3=s3_config)
    # An audit's walk reads each manifest's change and totals alone, and checks them the same.
    refused(root, f"SELECT * FROM table_changes('{NAME}', 6, 6)", st.uri(_mfile(6)), "totals say", s3=s3_config)
    # Other versions still read, and the same in a session that read them first.
    assert sql(root, f"SELECT count(*) AS n FROM {NAME} AS OF VERSION 5", s3_config) == [{"n": len(ev.live[5])}]
    assert listing(st) == before


def test_tombstone_totals_that_disagree_are_refused(events):
    ev, root = events
    st = ev.log.storage
    edit_manifest(st, 6, lambda d: d["totals"].update(tombstones=7))
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri(_mfile(6)), "version 6", "totals say 7 tombstone files")


def test_a_count_after_a_lying_summary_and_totals_never_differs_from_a_scan(local, small_policy):
    """Totals that agree with a lying object summary: a count from metadata
    alone would believe them; the summary is checked whenever the object is
    read, and the count is the sums of the summaries, so a count answers the
    same in every session (what it does not read it cannot refute, see
    RELIABILITY.md) and a scan names the object."""
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(4):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    ref = m.file_objects[0]

    def lie(d):
        d["files"]["objects"][0]["rows"] += 5
        d["totals"]["rows"] += 5

    edit_manifest(local, m.version, lie)
    root = local.root
    name = root.rstrip("/").rsplit("/", 1)[-1]
    _forget_snapshots()
    with castsql.connect(root) as c:
        with pytest.raises(CastSQLError, match="its summary in the manifest says") as e:
            c.sql(f'SELECT * FROM "{name}"')
        assert local.uri(ref.path) in str(e.value)


# ---------------------------------------------------------------- min above max


def _flip_min(entry: dict) -> None:
    entry["min"] = {**entry["min"], "id": entry["max"]["id"] + 1000}


def test_min_above_max_in_a_v2_inline_entry_is_refused(events):
    ev, root = events
    st = ev.log.storage
    path = ev.log.latest().data_files[0].path
    edit_manifest(st, 6, lambda d: _flip_min(d["files"]["inline"][0]))
    before = listing(st)
    msg = refused(root, f"SELECT count(*) FROM {NAME} WHERE id = 150", st.uri(_mfile(6)), "version 6", path,
                  "column 'id'")  # fmt: skip
    assert "above max" in msg
    assert listing(st) == before


def test_min_above_max_in_a_v1_manifest_is_refused(events):
    ev, root = events
    st = ev.log.storage
    v = add_v1_version(ev)
    assert sql(root, f"SELECT count(*) AS n FROM {NAME} WHERE id = 150") == [{"n": 1}]
    edit_manifest(st, v, lambda d: _flip_min(d["data_files"][0]))
    refused(root, f"SELECT count(*) FROM {NAME} WHERE id = 150", st.uri(_mfile(v)), f"version {v}", "column 'id'")


def test_min_above_max_in_a_files_object_is_refused(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(4):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    ref = m.file_objects[0]

    def lie(rows):
        rows[0]["min"] = {"id": rows[0]["max"]["id"] + 1}  # the object's own bounds stay inside its summary's
        return rows

    edit_object(local, ref.path, lie)
    before = listing(local)
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    msg = refused(local.root, f'SELECT count(*) FROM "{name}" WHERE id = 5', local.uri(ref.path),
                  f"version {m.version}", "column 'id' has a min above its max")  # fmt: skip
    assert "data/" in msg  # the file
    assert listing(local) == before


def test_a_summary_with_min_above_max_is_refused(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(4):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    edit_manifest(local, m.version, lambda d: d["files"]["objects"][0]["min"].update(id=10**6))
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    refused(local.root, f'SELECT count(*) FROM "{name}" WHERE id = 5', m.file_objects[0].path,
            f"version {m.version}", "column 'id' has min 1000000 above max")  # fmt: skip


# ---------------------------------------------------------------- listed twice


def test_a_tombstone_listed_twice_is_refused_v1_and_v2(events):
    ev, root = events
    st = ev.log.storage
    edit_manifest(st, 6, lambda d: d["deletes"]["inline"].append(d["deletes"]["inline"][0]))
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri(_mfile(6)), "is listed twice")
    assert sql(root, f"SELECT count(*) AS n FROM {NAME} AS OF VERSION 5") == [{"n": len(ev.live[5])}]


def test_a_data_file_listed_twice_is_refused_v1(events):
    ev, root = events
    st = ev.log.storage
    v = add_v1_version(ev)
    # The same file as a key and as a full URI: two spellings, one file.
    edit_manifest(
        st, v, lambda d: d["data_files"].append({**d["data_files"][0], "path": st.uri(d["data_files"][0]["path"])})
    )
    refused(root, f"SELECT * FROM {NAME}", st.uri(_mfile(v)), f"version {v}", "is listed twice")


def test_a_data_file_in_an_object_and_inline_is_refused(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(4):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    twice = log.part(m.file_objects[0], m).table.slice(0, 1).to_pylist()[0]

    def lie(d):
        entry = {k: twice[k] for k in ("path", "size_bytes", "row_group_count", "total_rows", "row_group_rows")}
        d["files"]["inline"].append({**entry, "min": {}, "max": {}})
        d["totals"].update(files=d["totals"]["files"] + 1, rows=d["totals"]["rows"] + 10,
                           bytes=d["totals"]["bytes"] + twice["size_bytes"])  # fmt: skip

    edit_manifest(local, m.version, lie)
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    for q in (f'SELECT * FROM "{name}"', f'SELECT count(*) FROM "{name}" WHERE id < 5'):
        refused(local.root, q, f"version {m.version}", twice["path"], "is listed twice")


# ---------------------------------------------------------------- positions records


def _deletes_table(storage: Storage):
    """A table whose tombstone records are in a deletes object (rows 0..99, row groups of 10)."""
    log = TableLog.create(storage, pa.schema([("id", pa.int64())]))
    log.append(write_data_files(storage, pa.table({"id": list(range(100))}), row_group_size=10))
    f = log.latest().data_files[0]
    from castsql.format import PositionDelete

    log.delete([PositionDelete(f.path, 3, BitMap([1]))])  # id 31
    m = log.delete([PositionDelete(f.path, 4, BitMap([2]))])  # id 42
    assert m.delete_objects, "the records should be folded into a deletes object"
    return log, m, f


def test_a_negative_row_group_in_a_deletes_object_is_refused(local, small_policy):
    _, m, _ = _deletes_table(local)
    ref = m.delete_objects[0]
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    assert sql(local.root, f'SELECT count(*) AS n FROM "{name}" WHERE id IN (31, 42, 81, 82)') == [{"n": 2}]

    def lie(rows):
        rows[0]["row_group"] = -2  # Python's rgr[-2] would be row group 8: ids 81.. deleted instead
        return rows

    edit_object(local, ref.path, lie)
    before = listing(local)
    refused(local.root, f'SELECT count(*) FROM "{name}"', local.uri(ref.path), f"version {m.version}",
            "'row_group' must be a non-negative integer")  # fmt: skip
    assert listing(local) == before


def test_a_negative_row_group_in_a_tombstone_file_is_refused(events):
    ev, root = events
    st = ev.log.storage
    f = ev.log.latest().data_files[0]
    st.put_new("tombstone/evil.del", json.dumps({"file": f.name, "row_group": -2, "deleted_rows": [0]}).encode())
    v = add_v1_version(ev)
    edit_manifest(st, v, lambda d: d["tombstones"].append("tombstone/evil.del"))
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri("tombstone/evil.del"), "non-negative")


@pytest.mark.parametrize("fmt", [1, 2])
def test_positions_past_the_row_group_are_refused(events, fmt):
    ev, root = events
    st = ev.log.storage
    f = ev.log.latest().data_files[0]
    st.put_new("tombstone/evil.del", json.dumps({"file": f.name, "row_group": 9, "deleted_rows": [100]}).encode())
    if fmt == 1:
        v = add_v1_version(ev)
        edit_manifest(st, v, lambda d: d["tombstones"].append("tombstone/evil.del"))
    else:
        v = 6
        edit_manifest(st, v, lambda d: (d["deletes"]["inline"].append("tombstone/evil.del"),
                                        d["totals"].update(tombstones=d["totals"]["tombstones"] + 1)))  # fmt: skip
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri("tombstone/evil.del"), f"version {v}",
            "row 100 is past the end of row group 9")  # fmt: skip


# ---------------------------------------------------------------- row_group_rows against the footer


@pytest.mark.parametrize("fmt", [1, 2])
def test_row_group_rows_that_disagree_with_the_footer_are_refused(events, fmt):
    ev, root = events
    st = ev.log.storage
    f = ev.log.latest().data_files[0]
    v = add_v1_version(ev) if fmt == 1 else 6

    def lie(d):
        entries = d["data_files"] if fmt == 1 else d["files"]["inline"]
        e = next(x for x in entries if x["path"] == f.path)
        e["row_group_rows"] = [50, 150] + [100] * 8  # the same total: the deletes land on other rows

    edit_manifest(st, v, lie)
    before = listing(st)
    msg = refused(root, f"SELECT * FROM {NAME}", st.uri(f.path), f"version {v}", "the manifest says 1000 rows")
    assert "row groups of [100, 100," in msg and "[50, 150," in msg
    refused(root, f"SELECT id FROM {NAME} WHERE id < 10", st.uri(f.path), f"version {v}")
    _forget_snapshots()
    with pytest.raises(CastSQLError, match="the manifest says 1000 rows"):
        castsql.open(st.root).to_arrow()
    assert listing(st) == before


def test_total_rows_that_disagree_with_the_footer_are_refused_when_the_file_is_opened(events):
    ev, root = events
    st = ev.log.storage
    f = ev.log.latest().data_files[-1]  # ids 2000-2099, no deletes

    def lie(d):
        e = next(x for x in d["files"]["inline"] if x["path"] == f.path)
        e["total_rows"] += 100
        e["row_group_rows"][-1] += 100
        d["totals"]["rows"] += 100

    edit_manifest(st, 6, lie)
    refused(root, f"SELECT count(id) FROM {NAME}", st.uri(f.path), "version 6", "holds 100 rows")


# ---------------------------------------------------------------- roaring bitmaps


def _huge_bitmap() -> bytes:
    bm = BitMap()
    bm.add_range(0, 2**32)
    bm.run_optimize()
    return bm.serialize()  # ~900 KB claiming 2^32 positions


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_bitmap_claiming_more_positions_than_the_file_has_is_refused(events_anywhere, s3_config, fmt):
    ev, root = events_anywhere
    st = ev.log.storage
    f = ev.log.latest().data_files[0]
    line = {"file": f.name, "deleted_rows_bitmap": base64.b64encode(_huge_bitmap()).decode()}
    st.put_new("tombstone/evil.del", (json.dumps(line) + "\n").encode())
    if fmt == 1:
        v = add_v1_version(ev)
        edit_manifest(st, v, lambda d: d["tombstones"].append("tombstone/evil.del"))
    else:
        v = 6
        edit_manifest(st, v, lambda d: (d["deletes"]["inline"].append("tombstone/evil.del"),
                                        d["totals"].update(tombstones=d["totals"]["tombstones"] + 1)))  # fmt: skip
    before = listing(st)
    for q in (f"SELECT count(*) FROM {NAME}", f"SELECT * FROM {NAME}"):
        msg = refused(root, q, st.uri("tombstone/evil.del"), f"version {v}", s3=s3_config)
        assert "past the end of" in msg and "4294967296 positions" in msg and "(1000 rows" in msg
    assert listing(st) == before


def test_a_huge_bitmap_in_a_deletes_object_is_refused(local, small_policy):
    _, m, _ = _deletes_table(local)
    ref = m.delete_objects[0]

    def lie(rows):
        rows[0]["positions"] = _huge_bitmap()
        return rows

    edit_object(local, ref.path, lie)
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    refused(local.root, f'SELECT count(*) FROM "{name}"', f"version {m.version}", "4294967296 positions")


def test_a_bitmap_that_is_not_one_is_refused(events):
    ev, root = events
    st = ev.log.storage
    f = ev.log.latest().data_files[0]
    bad = bytearray(BitMap(range(0, 500)).serialize())
    bad[10] ^= 0x01  # a run that its container's header does not have
    line = {"file": f.name, "deleted_rows_bitmap": base64.b64encode(bytes(bad)).decode()}
    st.put_new("tombstone/evil.del", (json.dumps(line) + "\n").encode())
    edit_manifest(st, 6, lambda d: (d["deletes"]["inline"].append("tombstone/evil.del"),
                                    d["totals"].update(tombstones=d["totals"]["tombstones"] + 1)))  # fmt: skip
    refused(root, f"SELECT count(*) FROM {NAME}", st.uri("tombstone/evil.del"), "not a portable roaring bitmap")


# ---------------------------------------------------------------- change records


@pytest.mark.parametrize(
    "lie",
    [
        lambda c: c.update(added_tombstones=[]),
        lambda c: c.update(added_tombstones=["tombstone/none.del"]),
        lambda c: c.update(removed_files=["data/x.parquet"]),
        lambda c: c.update(added_files=[]),
    ],
    ids=["no-added-tombstone", "other-tombstone", "removed-file", "no-added-file"],
)
def test_a_change_record_that_disagrees_gives_the_same_answer_in_every_session(events, lie):
    ev, root = events
    st = ev.log.storage
    for v in (3, 4, 5, 6):
        edit_manifest(st, v, lambda d: lie(d["change"]))
    before = listing(st)
    queries = [f"SELECT count(*) AS n FROM {NAME} AS OF VERSION {v}" for v in range(1, 7)]
    queries += [f"SELECT count(id) AS n FROM {NAME} AS OF VERSION {v}" for v in range(1, 7)]
    # Each version read alone, in a fresh process state ...
    alone = []
    for q in queries:
        _forget_snapshots()
        alone.append(sql(root, q))
    # ... and all in order in one session (each version stepped from the one before).
    _forget_snapshots()
    with castsql.connect(root) as c:
        together = [c.sql(q).to_pylist() for q in queries]
        history = c.sql(f"SELECT version, files_added, rows_inserted, rows_deleted, live_rows, error "
                        f"FROM table_history('{NAME}') ORDER BY version").to_pylist()  # fmt: skip
        changes = c.sql(f"SELECT count(*) AS n FROM table_changes('{NAME}', 3, 6)").to_pylist()
    expected = [[{"n": len(ev.live[v])}] for v in range(1, 7)] * 2
    assert alone == together == expected
    assert [r["live_rows"] for r in history] == [len(ev.live[v]) for v in range(7)]
    assert [r["files_added"] for r in history][1:] == [1, 1, 0, 0, 0, 1]  # counted from content
    assert all(r["error"] is None for r in history)
    # v3: 100 rows, v4: 100, v5: 4 deleted; v6: 100 inserted.
    assert changes == [{"n": 304}]
    assert listing(st) == before


# ---------------------------------------------------------------- JSON bombs


def test_a_json_bomb_in_a_files_object_extra_is_one_error(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(4):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    ref = m.file_objects[0]

    def lie(rows):
        rows[0]["extra"] = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
        return rows

    edit_object(local, ref.path, lie)
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    msg = refused(local.root, f'SELECT * FROM "{name}"', local.uri(ref.path), f"version {m.version}", "'extra'")
    assert "RecursionError" not in msg


def test_a_json_bomb_in_a_key_range_bound_is_one_error(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]), primary_key="id")
    log.append(write_data_files(local, pa.table({"id": list(range(100))}), row_group_size=10))
    f = log.latest().data_files[0]
    from castsql.format import KeyRangeDelete

    log.delete([KeyRangeDelete(f.name, 1, 2)])
    m = log.delete([KeyRangeDelete(f.name, 5, 6)])
    ref = m.delete_objects[0]

    def lie(rows):
        rows[0]["pk_min"] = "[" * 100_000 + "]" * 100_000
        return rows

    edit_object(local, ref.path, lie)
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    msg = refused(local.root, f'SELECT count(*) FROM "{name}"', local.uri(ref.path), "pk_min")
    assert "RecursionError" not in msg


# ---------------------------------------------------------------- history


def test_history_reports_a_version_whose_files_object_is_missing(local, small_policy):
    log = TableLog.create(local, pa.schema([("id", pa.int64())]))
    for i in range(6):
        log.append(write_data_files(local, pa.table({"id": list(range(10 * i, 10 * i + 10))})))
    m = log.latest()
    gone = m.file_objects[0]
    local.delete(gone.path)
    users = [v for v in range(m.version + 1) if any(r.path == gone.path for r in log.manifest(v).file_objects)]
    assert users
    name = local.root.rstrip("/").rsplit("/", 1)[-1]
    _forget_snapshots()
    with castsql.connect(local.root) as c:
        for q in (f"SELECT * FROM table_history('{name}') ORDER BY version", f'DESCRIBE HISTORY "{name}"'):
            h = c.sql(q).to_pylist()
            assert [r["version"] for r in sorted(h, key=lambda r: r["version"])] == list(range(m.version + 1))
            for r in h:
                if r["version"] in users:
                    assert "is missing" in r["error"] and gone.path in r["error"], r
                else:
                    assert r["error"] is None and r["live_rows"] == 10 * r["version"], r


# ---------------------------------------------------------------- fuzzing the object readers

json_texts = (
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=10,
    ).map(json.dumps)
    | st.text(max_size=30)
    | st.just("[" * 5000)
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["row_group", "key_range", "positions", "other"]),
                "row_group": st.none() | st.integers(-(2**40), 2**40),
                "pk_min": st.none() | json_texts,
                "pk_max": st.none() | json_texts,
                "positions": st.none() | st.binary(max_size=40) | st.just(BitMap([1, 2, 70000]).serialize()),
                "file": st.sampled_from(["a.parquet", "data/a.parquet", "x?y", ""]),
            }
        ),
        max_size=4,
    )
)
def test_deletes_object_rows_give_records_or_one_error(rows):
    from castsql.format.metafiles import DELETES_SCHEMA, deletes_from_arrow

    table = pa.Table.from_pylist([{"tombstone": "tombstone/t.del", **r} for r in rows], schema=DELETES_SCHEMA)
    try:
        records = deletes_from_arrow(table, "meta/x.deletes.parquet")
    except FormatError as e:
        assert str(e).startswith("meta/x.deletes.parquet: record ") and "\n" not in str(e)
        return
    for _, r in records:
        assert getattr(r, "row_group", None) is None or r.row_group >= 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "size_bytes": st.integers(-5, 10),
                "row_group_count": st.integers(-1, 3),
                "total_rows": st.integers(-1, 30),
                "row_group_rows": st.none() | st.lists(st.integers(-3, 12), max_size=3),
                "min": st.fixed_dictionaries({"id": st.none() | st.integers(-5, 5)}),
                "max": st.fixed_dictionaries({"id": st.none() | st.integers(-5, 5)}),
                "extra": st.none() | json_texts,
            }
        ),
        max_size=4,
    )
)
def test_files_object_rows_are_accepted_only_when_possible(rows):
    from castsql.format.metafiles import check_entries, files_from_arrow, files_to_arrow
    from castsql.format.schema import Schema

    schema = Schema.from_arrow(pa.schema([("id", pa.int64())]))
    target = files_to_arrow([], schema).schema
    table = pa.Table.from_pylist([{"path": f"data/{i}.parquet", **r} for i, r in enumerate(rows)], schema=target)
    try:
        check_entries(table, "meta/x.files.parquet")
    except FormatError as e:
        assert str(e).startswith("meta/x.files.parquet: data file data/") and "\n" not in str(e)
        return
    for r, f in zip(rows, files_from_arrow(table), strict=True):
        assert min(f.size_bytes, f.row_group_count, f.total_rows) >= 0
        lo, hi = r["min"]["id"], r["max"]["id"]
        assert lo is None or hi is None or lo <= hi
        if f.row_group_rows is not None:
            assert len(f.row_group_rows) == f.row_group_count and sum(f.row_group_rows) == f.total_rows
        assert isinstance(f.extra, dict)
