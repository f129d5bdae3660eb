"""The key index (FORMAT.md §3.6): a row's history reads one object per
block of 64 versions and the manifests of the versions that may hold its
key, not every manifest; a missing or damaged index costs speed, never rows."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pytest

import castsql
from castsql.format import TableLog, keyindex, write_data_files
from castsql.format.layout import manifest_key
from castsql.storage import open_storage

CDF = {"castsql.changeDataFeed": "true"}
SCHEMA = pa.schema([("id", pa.int64()), ("score", pa.float64())])
HOT = 42  # updated at versions 10 and 50 only


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A keyed table with the change data feed: version 1 appends ids 0-99,
    then one-row updates (versions 2-70), key 42 at versions 10 and 50,
    version 30 a compaction."""
    root = str(tmp_path_factory.mktemp("keyindex") / "t")
    st = open_storage(root)
    log = TableLog.create(st, SCHEMA, primary_key="id", properties=CDF)
    log.append(write_data_files(st, pa.table({"id": range(100), "score": [0.0] * 100}, schema=SCHEMA)))
    with castsql.open(root) as t:
        for v in range(2, 71):
            if v == 30:
                t.compact()
            else:
                key = HOT if v in (10, 50) else (v * 7) % 100 if (v * 7) % 100 != HOT else 1
                t.update(set={"score": f"{v}"}, where=f"id = {key}")
        assert t.version == 70
    return root


def history(root: str, key: int) -> list[tuple]:
    with castsql.open(root) as t:
        return [(r["_commit_version"], r["_change_type"], r["score"]) for r in t.row_history(key).to_pylist()]


WANT = [(1, "insert", 0.0), (10, "update_preimage", 0.0), (10, "update_postimage", 10.0),
        (50, "update_preimage", 10.0), (50, "update_postimage", 50.0)]  # fmt: skip


def test_the_writer_of_a_blocks_last_version_indexes_its_keys(table):
    st = open_storage(table)
    index = keyindex.read_index(TableLog(st), 64)
    assert index is not None and sorted(index) == list(range(1, 65))
    assert index[10] == [HOT] and index[30] == [] and index[1] is None  # v1: before the feed's first record
    assert keyindex.read_index(TableLog(st), 128) is None  # not reached yet


def test_a_rows_history_reads_only_the_manifests_the_index_leaves(table, tmp_path):
    """Versions of the indexed block that cannot hold the key are never read:
    their manifests made unreadable, the history is unchanged (and the walk
    without the index fails on them, so the test can fail)."""
    import shutil

    root = str(tmp_path / "t")
    shutil.copytree(table, root)
    assert history(root, HOT) == WANT
    needed = {0, 1, 9, 10, 49, 50} | set(range(64, 71))
    for v in set(range(2, 64)) - needed:
        (tmp_path / "t" / manifest_key(v)).write_text("{")
    assert history(root, HOT) == WANT
    (tmp_path / "t" / keyindex.index_key(64)).unlink()
    with pytest.raises(castsql.errors.CastSQLError, match=r"manifest/v0000000\d\.json"):
        history(root, HOT)


def test_a_damaged_index_is_passed_over(table, tmp_path):
    """Malformed, or a list out of order (the lookup bisects: a red-team pass
    lost rows to one), the index is read as saying nothing."""
    import shutil

    root = str(tmp_path / "t")
    shutil.copytree(table, root)
    bools = '{"first": 1, "last": 64, "keys": [' + ",".join(["[true]"] * 64) + "]}"
    index = tmp_path / "t" / keyindex.index_key(64)
    doc = json.loads(index.read_text())
    backwards = json.dumps({**doc, "keys": [sorted([*k, -1, 10**6], reverse=True) if k else k for k in doc["keys"]]})
    for text in ("{", '{"first": 1, "last": 64, "keys": [[1]]}', bools, "[]", backwards):
        (tmp_path / "t" / keyindex.index_key(64)).write_text(text)
        assert history(root, HOT) == WANT


def test_gc_writes_a_missing_index_and_removes_one_whose_block_is_collected(table, tmp_path):
    import shutil

    root = str(tmp_path / "t")
    shutil.copytree(table, root)
    index = tmp_path / "t" / keyindex.index_key(64)
    written = index.read_bytes()
    index.unlink()  # as a writer that died after its commit leaves it
    with castsql.open(root) as t:
        t.gc(grace=timedelta(0))  # keeps every version: writes the block's missing index
        assert index.read_bytes() == written
        report = t.gc(keep_versions=10, grace=timedelta(0))
        assert keyindex.index_key(64) not in report.removed_metadata  # versions 61-70 are kept
        assert (tmp_path / "t" / keyindex.index_key(64)).exists()
        report = t.gc(keep_versions=1, grace=timedelta(0))
        assert keyindex.index_key(64) in report.removed_metadata
        assert not (tmp_path / "t" / keyindex.index_key(64)).exists()
        assert [r["_commit_version"] for r in t.row_history(HOT).to_pylist()] == []


def test_keys_out_of_order_in_a_manifest_say_nothing(table, tmp_path):
    """The walk bisects a version's change.keys too: a list out of order is
    read as no list (the version is read), not as a list without the key."""
    import shutil

    root = str(tmp_path / "t")
    shutil.copytree(table, root)
    shutil.rmtree(tmp_path / "t" / keyindex.INDEX_DIR)
    path = tmp_path / "t" / manifest_key(50)
    doc = json.loads(path.read_text())
    assert doc["change"]["keys"] == [HOT]
    doc["change"]["keys"] = [1000, HOT, -5]
    path.write_text(json.dumps(doc))
    assert history(root, HOT) == WANT
