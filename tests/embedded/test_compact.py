"""Compaction with the embedded engine (no JVM): small files packed to a target
size, heavily deleted files rewritten, tombstones folded, optionally sorted;
one COMPACT version that changes no result and loses no concurrent write."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

import castsql
from castsql.cli import main
from castsql.embedded import compactor as compactor_mod
from castsql.errors import CastSQLError
from castsql.format import KeyRangeDelete, TableLog
from castsql.storage import open_storage


def rows(ids, ts=None) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array(ts if ts is not None else [i * 10 for i in ids], pa.int64()),
            "v": [f"v{i}" for i in ids],
        }
    )


def stream(uri: str, batches: int, s3=None) -> castsql.Table:
    """A table fed like a CDC stream: one small file per batch, a delete every fifth."""
    castsql.write_table(uri, rows(range(100)), primary_key="id", s3=s3)
    t = castsql.open(uri, s3=s3)
    for b in range(batches):
        t.append(rows(range(100 + 20 * b, 120 + 20 * b)))
        if b % 5 == 0:
            t.delete(f"id = {b}")
    return t


def content(t: castsql.Table, version: int | None = None) -> list[dict]:
    src = t if version is None else t.at(version=version)
    return src.to_arrow().sort_by("id").to_pylist()


def test_small_files_become_one_and_nothing_else_changes(storage_root, s3_config):
    t = stream(storage_root + "/events", 30, s3_config)
    before, v = content(t), t.version
    assert len(t._session.snapshot("events").files) == 31
    m = t.compact()
    assert (m.version, m.operation) == (v + 1, "COMPACT")
    assert m.summary["removed_files"] == 31 and m.summary["added_files"] == 1
    assert m.summary["removed_tombstones"] == 6 and m.summary["added_rows"] == len(before)
    assert content(t) == before == content(t, v)  # the old version still reads its own files
    assert len(t._session.snapshot("events").files) == 1 and t._session.snapshot("events").manifest.tombstone_count == 0
    h = t.history().to_pylist()[-1]
    assert (h["operation"], h["rows_inserted"], h["rows_updated"], h["rows_deleted"]) == ("COMPACT", 0, 0, 0)
    assert t.changes(v).num_rows == 20  # the last append only: the compaction changed no row
    assert t.compact() is None  # one file, no deletes: nothing to do


def test_deleted_files_are_rewritten_past_the_threshold(tmp_path):
    uri = str(tmp_path / "events")
    castsql.write_table(uri, rows(range(1000)), primary_key="id")
    t = castsql.open(uri)
    big = t.compact(target_file_size=1)  # files over the target are never packed
    assert big is None
    t.delete("id < 300")  # 30% of the file
    assert t.compact(threshold=0.5, target_file_size=1) is None
    t.delete("id < 600")  # 60%
    log = TableLog(open_storage(uri))
    f = log.latest().data_files[0] if log.latest().data_files else None
    m = t.compact(threshold=0.5, target_file_size=1)
    assert m.summary["removed_files"] == 1 and m.summary["added_rows"] == 400
    assert [r["id"] for r in content(t)] == list(range(600, 1000))
    assert f is None or f.path not in {x.path for x in TableLog(open_storage(uri)).state(m).entries()}


def test_key_ranges_and_positions_are_applied_when_rewriting(tmp_path):
    uri = str(tmp_path / "events")
    t = stream(uri, 3)
    log = TableLog(open_storage(uri))
    first = next(f for f in log.state(log.latest()).entries() if f.total_rows == 100)
    log.delete([KeyRangeDelete(first.path, 10, 19)])
    t = t.at()
    before = content(t)
    assert t.compact() is not None
    assert content(t) == before and not {r["id"] for r in before} & set(range(10, 20))


def test_sort_by_clusters_the_new_files(tmp_path):
    uri = str(tmp_path / "events")
    castsql.write_table(uri, rows(range(50), ts=[(i * 37) % 50 for i in range(50)]), primary_key="id")
    t = castsql.open(uri)
    for b in range(1, 20):
        ids = range(50 * b, 50 * b + 50)
        t.append(rows(ids, ts=[(i * 37) % 1000 for i in ids]))  # every batch spans all times
    before = content(t)
    m = t.compact(sort_by="ts", target_file_size=4000, row_group_size=100)
    assert m.summary["added_files"] > 1
    files = sorted(TableLog(open_storage(uri)).state(m).entries(), key=lambda f: f.min["ts"])
    assert all(a.max["ts"] <= b.min["ts"] for a, b in itertools.pairwise(files))  # disjoint time ranges
    assert content(t) == before
    with pytest.raises(CastSQLError, match=r"no column 'when' to sort by \(columns: id, ts, v\)"):
        t.compact(sort_by="when")
    with pytest.raises(CastSQLError, match=r"threshold must be in \(0, 1\], got 0"):
        t.compact(threshold=0)
    with pytest.raises(CastSQLError, match="pinned at version"):
        t.at(version=3).compact()
    assert t.at().version == m.version


def test_a_concurrent_write_makes_the_compaction_plan_again(tmp_path, monkeypatch):
    """FORMAT.md §7: a compaction conflicts with a tombstone committed after
    the version it read; it plans again, and neither write is lost."""
    uri = str(tmp_path / "events")
    t = stream(uri, 10)
    other = castsql.open(uri)
    real = compactor_mod.plan_compaction
    read: list[int] = []

    def plan_then_delete(log, snap, *args, **kwargs):
        plan = real(log, snap, *args, **kwargs)
        read.append(snap.version)
        if len(read) == 1:
            other.delete("id = 150")  # a row of a file the compaction rewrites
        return plan

    monkeypatch.setattr(compactor_mod, "plan_compaction", plan_then_delete)
    m = t.compact()
    assert read == [m.version - 2, m.version - 1]
    ids = [r["id"] for r in content(t.at())]
    assert 150 not in ids and len(ids) == len(set(ids))
    other.close()


def test_the_cli_compacts_in_process(tmp_path, capsys):
    uri = str(tmp_path / "events")
    stream(uri, 12).close()
    assert main(["compact", uri, "--sort-by", "ts"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compact: committed version") and "13 file(s) removed" in out
    assert main(["compact", uri]) == 0
    assert capsys.readouterr().out.strip() == "compact: nothing to compact; nothing committed"
    assert main(["compact", uri, "--sort-by", "nope"]) == 1
    assert "no column 'nope' to sort by" in capsys.readouterr().err


# ---------------------------------------------------------------- automatic


def test_auto_compaction_keeps_a_stream_bounded(storage_root, s3_config):
    uri = storage_root + "/events"
    props = {"castsql.autoCompact": "true", "castsql.autoCompact.minNumFiles": "8", "castsql.compact.sortBy": "ts"}
    castsql.write_table(uri, rows(range(100)), primary_key="id", properties=props, s3=s3_config)
    t = castsql.open(uri, s3=s3_config)
    model = set(range(100))
    most_files = most_tombs = 0
    for b in range(40):
        ids = range(100 + 10 * b, 110 + 10 * b)
        t.append(rows(ids))
        model |= set(ids)
        t.merge(rows([b]), on="id").when_matched_delete().execute()  # a tombstone file each time
        model.discard(b)
        snap = t._session.snapshot("events")
        most_files = max(most_files, len(snap.files))
        most_tombs = max(most_tombs, snap.manifest.tombstone_count)
    assert most_files <= 8 and most_tombs <= 8  # compacted whenever 8 accumulate
    assert sorted(r["id"] for r in t.to_arrow(["id"]).to_pylist()) == sorted(model)
    ops = [r["operation"] for r in t.history().to_pylist()]
    assert ops.count("COMPACT") >= 5 and t.properties == props  # every 7 batches; carried by every version
    t.close()


def test_auto_compaction_leaves_a_large_base_file_alone(tmp_path):
    """Automatic compaction merges the lowest size tier: a stream's base file
    is not rewritten to add a few batches to it, so no commit of the stream
    pays for the whole table; the small files stay bounded all the same."""
    uri = str(tmp_path / "events")
    props = {"castsql.autoCompact": "true", "castsql.autoCompact.minNumFiles": "6"}
    castsql.write_table(uri, rows(range(50_000)), primary_key="id", properties=props)
    t = castsql.open(uri)
    base = t._session.snapshot("events").files[0].key
    model = set(range(50_000))
    most_files = 0
    for b in range(60):
        ids = range(100_000 + 10 * b, 100_010 + 10 * b)
        t.append(rows(ids))
        model |= set(ids)
        snap = t._session.snapshot("events")
        assert base in {f.key for f in snap.files}, f"batch {b}: the base file was rewritten"
        most_files = max(most_files, len(snap.files))
    assert most_files <= 6
    assert sum(r["operation"] == "COMPACT" for r in t.history().to_pylist()) >= 10
    assert sorted(r["id"] for r in t.to_arrow(["id"]).to_pylist()) == sorted(model)
    # Asked for by hand, compaction packs every small file, the base file too.
    t.compact()
    assert len(t._session.snapshot("events").files) == 1
    t.close()


def test_properties_are_checked_set_and_removed(tmp_path):
    uri = str(tmp_path / "events")
    castsql.write_table(uri, rows(range(3)), properties={"owner": "growth"})
    t = castsql.open(uri)
    assert t.properties == {"owner": "growth"}
    m = t.set_properties({"castsql.autoCompact": "true", "owner": None, "team": "data"})
    assert m.operation == "SET PROPERTIES" and t.properties == {"castsql.autoCompact": "true", "team": "data"}
    assert t.set_properties({"team": "data"}) is None
    assert t.at(version=1).properties == {"owner": "growth"}
    with pytest.raises(CastSQLError, match=r"property 'castsql\.autoCompact\.minNumFiles' takes a positive integer"):
        t.set_properties({"castsql.autoCompact.minNumFiles": "0"})
    with pytest.raises(CastSQLError, match=r"unknown property 'castsql\.autoOptimize'"):
        t.set_properties({"castsql.autoOptimize": "true"})
    with pytest.raises(CastSQLError, match="unknown property"):
        castsql.write_table(str(tmp_path / "other"), rows([1]), properties={"castsql.nope": "1"})
    assert t.at().version == m.version and not (tmp_path / "other" / "_latest_manifest").exists()
