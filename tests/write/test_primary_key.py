"""Primary-key uniqueness on append (embedded writer): a NULL key, a key
repeated in the input or one already live in the table is refused by
default, naming the first offending keys, with nothing committed; only the
files whose key statistics overlap the input are read; allow_duplicate_keys
writes them anyway. Local and S3."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import castsql
from castsql.format import TableLog
from castsql.storage import open_storage
from castsql.write.keys import DuplicateKey

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(ids):
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


@pytest.fixture
def table(storage_root, s3_config):
    st = open_storage(storage_root + "/pk", s3=s3_config)
    TableLog.create(st, SCHEMA, primary_key="id")
    t = castsql.open(st.root, s3=s3_config)
    for lo in range(0, 50, 10):  # five files, keys [0, 10), [10, 20) ...
        t.append(rows(range(lo, lo + 10)))
    t.delete("id = 25")  # a deleted key may be written again
    yield t
    t.close()


def ids(t):
    return sorted(t.to_arrow(["id"]).column("id").to_pylist())


def test_duplicates_of_the_table_are_refused_naming_the_keys(table):
    t = table
    v = t.version
    with pytest.raises(DuplicateKey) as e:
        t.append(rows([100, 7, 101, 42, 25]))
    msg = str(e.value)
    assert msg.startswith("table pk: append: 2 key(s) are already in the table at version 6 (id = 7, id = 42)")
    assert "allow_duplicate_keys=True" in msg and "nothing was committed" in msg and "\n" not in msg
    assert t.at().version == v
    m = t.append(rows([25, 100]))  # 25 was deleted: no longer a key of the table
    assert m.version == v + 1 and ids(t).count(25) == 1


def test_duplicates_within_the_input_and_null_keys_are_refused(table):
    t = table
    v = t.version
    with pytest.raises(DuplicateKey, match="the data holds key id = 200 more than once"):
        t.append(rows([200, 201, 200]))
    with pytest.raises(DuplicateKey, match="1 row\\(s\\) have a NULL primary key 'id'"):
        t.append(pa.table({"id": pa.array([300, None], pa.int64()), "v": ["a", "b"]}))
    assert t.at().version == v


def test_allow_duplicate_keys_writes_them(table):
    t = table
    m = t.append(rows([1, 1, 2]), allow_duplicate_keys=True)
    assert m.version == t.version and ids(t).count(1) == 3


def test_only_candidate_files_are_read(table, monkeypatch):
    """Keys above every file's max open no data file at all; keys inside one
    file's range open that file only."""
    from castsql.write import keys

    seen = []
    real = keys._file_hits

    def spy(storage, f, *args):
        seen.append(f.entry.min["id"])
        return real(storage, f, *args)

    monkeypatch.setattr(keys, "_file_hits", spy)
    t = table
    t.append(rows(range(1000, 1010)))  # above every file: none is opened
    assert seen == []
    with pytest.raises(DuplicateKey, match="\\(id = 15, id = 16\\)"):
        t.append(rows([15, 16, 25]))  # 25 was deleted; keys [15, 25] overlap two files
    assert sorted(seen) == [10, 20]


def test_row_groups_without_an_input_key_are_not_read(tmp_path, monkeypatch):
    """Inside a candidate file, row groups whose footer min/max hold no input
    key are skipped; a key deleted by position or by key range is free again."""
    import pyarrow.parquet as pq

    from castsql.format import write_data_files
    from castsql.snapshot import resolve
    from castsql.write.keys import existing_keys

    st = open_storage(str(tmp_path / "rg"))
    log = TableLog.create(st, SCHEMA, primary_key="id")
    log.append(write_data_files(st, rows(range(0, 1000, 2)), log.latest().schema, row_group_size=100))
    reads = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, *a, **k):
        reads.append(i)
        return real(self, i, *a, **k)

    with castsql.open(st.root) as t:
        t.delete("id IN (10, 600)")
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
        got = existing_keys(st, resolve(log), "id", pa.array([10, 11, 12, 601, 602, 999], pa.int64()))
    assert sorted(got) == [12, 602]
    # groups hold [0, 198], [200, 398] …: 10, 11, 12 fall in group 0 and 601, 602
    # in group 3; 999 is above the file's max 998, so nothing else is read
    assert sorted(reads) == [0, 3]


def test_pruned_check_refuses_inside_one_file(table):
    t = table
    with pytest.raises(DuplicateKey, match="\\(id = 12\\)"):
        t.append(rows([12, 13000]))


def test_concurrent_appends_of_one_key_commit_once(tmp_path):
    st = open_storage(str(tmp_path / "race"))
    TableLog.create(st, SCHEMA, primary_key="id")
    results: list[object] = []
    barrier = threading.Barrier(4)

    def one(i):
        with castsql.open(st.root) as t:
            barrier.wait()
            try:
                results.append(t.append(rows([7, 100 + i])).version)
            except DuplicateKey as e:
                results.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with castsql.open(st.root) as t:
        assert ids(t).count(7) == 1
    assert sum(isinstance(r, int) for r in results) == 1
