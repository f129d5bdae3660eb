"""Restore: one new version whose content equals an older one, nothing
rewritten, on local disk and S3; refused when the version was collected."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from pyroaring import BitMap

import castsql
from castsql.engine import Session
from castsql.errors import CastSQLError, VersionNotFound
from castsql.format import Change, KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.write.garbage import gc


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([i * 2 for i in ids], pa.int64())})


def live(storage_root: str, s3, version: int) -> list[int]:
    with castsql.open(storage_root, version=version, s3=s3) as t:
        return sorted(t.to_arrow(["id"]).column("id").to_pylist())


def history(storage, s3) -> tuple[TableLog, dict[int, list[int]]]:
    """Appends, every kind of delete and a compaction that removes a file and a tombstone."""
    log = TableLog.create(storage, rows([]).schema, primary_key="id")
    for k in range(3):
        log.append(write_data_files(storage, rows(range(k * 10, k * 10 + 10)), log.latest().schema, row_group_size=5))
    f0, f1, f2 = (f.path for f in log.latest().data_files)
    log.delete([RowGroupDelete(f0, 0)])
    log.delete([KeyRangeDelete(f1, 12, 13), PositionDelete(f2, None, BitMap([9]))])
    # A compaction: file 0 rewritten without its deleted rows, its tombstone dropped.
    [tomb] = log.manifest(4).change.added_tombstones
    new = write_data_files(storage, rows(range(5, 10)), log.latest().schema)
    log.commit(Change("COMPACT", add_files=tuple(new), remove_files=(f0,), remove_tombstones=(tomb,), read_version=5))
    log.append(write_data_files(storage, rows(range(100, 103)), log.latest().schema))
    models = {v: live(storage.root, s3, v) for v in log.versions()}
    return log, models


def test_restore_commits_the_old_content_as_a_new_version(storage, s3_config):
    log, models = history(storage, s3_config)
    latest = log.latest().version
    for target in (4, 1, 0, latest - 1):
        before = sorted(o.key for o in storage.list("data/"))
        m = log.restore(target)
        assert m.operation == "RESTORE" and m.version == latest + 1
        assert m.summary["restored_version"] == target
        assert live(storage.root, s3_config, m.version) == models[target]
        assert sorted(o.key for o in storage.list("data/")) == before  # nothing rewritten
        latest = m.version
    # Older versions still read as they did.
    for v, want in models.items():
        assert live(storage.root, s3_config, v) == want
    assert log.restore(latest) is None  # already that content: nothing committed
    assert log.latest().version == latest


def test_restore_is_refused_for_a_collected_version(storage, s3_config):
    log, _ = history(storage, s3_config)
    latest = log.latest().version
    gc(storage.root, keep_versions=2, grace=__import__("datetime").timedelta(0), s3=s3_config)
    with pytest.raises(VersionNotFound):
        log.restore(1)
    assert log.latest().version == latest


def test_restore_is_refused_when_an_object_it_brings_back_is_gone(storage, s3_config):
    log, models = history(storage, s3_config)
    latest = log.latest().version
    # The compaction (version 6) removed file 0; losing that object behind GC's back
    # makes the versions before it unrestorable.
    [f0] = {f.path for f in log.state(log.manifest(4)).entries()} - {f.path for f in log.state(log.latest()).entries()}
    storage.delete(f0)
    with pytest.raises(CastSQLError, match=rf"restore to version 4: {f0} is gone"):
        log.restore(4)
    assert log.latest().version == latest
    assert live(storage.root, s3_config, latest) == models[latest]


def test_restore_from_the_command_line_and_history(tmp_path):
    from castsql.storage import open_storage

    root = str(tmp_path / "events")
    store = open_storage(root)
    log = TableLog.create(store, rows([]).schema, primary_key="id")
    log.append(write_data_files(store, rows(range(5)), log.latest().schema))
    log.delete([PositionDelete(log.latest().data_files[0].path, None, BitMap([0, 1]))])
    cli = [sys.executable, "-m", "castsql.cli", "restore", root]
    p = subprocess.run([*cli, "--version", "1"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "restore to version 1: committed version 3" in p.stdout
    with Session(root) as s:
        assert s.sql("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 5}]
        h = s.history("events")
        assert h.column("operation").to_pylist()[-1] == "RESTORE"
    p = subprocess.run([*cli, "--version", "9"], capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "9" in p.stderr
    p = subprocess.run([*cli, "--timestamp", "yesterday"], capture_output=True, text=True)
    assert p.returncode == 2 and "not a timestamp" in p.stderr  # a usage error, as every command's
    assert len(log.versions()) == 4


def test_a_commit_that_lands_while_restoring_is_not_lost(tmp_path, monkeypatch):
    from castsql.storage import open_storage

    root = str(tmp_path / "events")
    store = open_storage(root)
    log = TableLog.create(store, rows([]).schema, primary_key="id")
    log.append(write_data_files(store, rows(range(5)), log.latest().schema))
    log.append(write_data_files(store, rows(range(5, 9)), log.latest().schema))
    other = TableLog(open_storage(root))
    real = log.commit
    raced = []

    def commit_after_a_rival(change, **kw):
        if not raced:
            raced.append(other.append(write_data_files(store, rows([50]), other.latest().schema)))
        return real(change, **kw)

    monkeypatch.setattr(log, "commit", commit_after_a_rival)
    m = log.restore(1)
    assert m.version == 4 and raced[0].version == 3
    # Version 1's content exactly: the rival's row is not kept by a stale plan.
    assert live(root, None, 4) == [0, 1, 2, 3, 4]
    assert live(root, None, 3) == [*range(9), 50]


def test_nothing_to_restore_to_is_a_clear_error(tmp_path):
    from castsql.storage import open_storage

    store = open_storage(str(tmp_path / "t"))
    log = TableLog.create(store, rows([]).schema, primary_key="id")
    with pytest.raises(CastSQLError, match="version 7"):
        log.restore(7)
