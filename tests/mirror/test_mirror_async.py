"""Mirrors written after the commit returns (``castsql.mirror.async``,
castsql/mirror/background.py): the commit does not wait for them, every
version still reaches both mirrors and reads the same there, an export in
the same process waits instead of racing, and a process that ends leaves
its mirrors written."""

from __future__ import annotations

import subprocess
import sys
import threading

import pyarrow as pa
from paths import REPO
from test_mirror_delta import Readers as DeltaReaders
from test_mirror_iceberg import Readers as IcebergReaders

import castsql
import castsql.mirror
from castsql.mirror import delta, iceberg
from castsql.mirror.background import settle
from castsql.storage import open_storage

ASYNC = {"castsql.mirror.delta": "true", "castsql.mirror.iceberg": "true", "castsql.mirror.async": "true"}


def _table(uri: str, n: int = 20) -> castsql.Table:
    data = pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"r{i}" for i in range(n)]})
    castsql.write_table(uri, data, primary_key="id", properties=ASYNC)
    return castsql.open(uri)


def _upsert(t: castsql.Table, ids: list[int], v: str) -> None:
    src = pa.table({"id": pa.array(ids, pa.int64()), "v": [v] * len(ids)})
    t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()


def test_a_commit_returns_before_its_mirrors_are_written_and_they_follow(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    t = _table(uri)
    assert settle(uri, timeout=60)
    release, real = threading.Event(), castsql.mirror.write_one

    def held(log, name, version):  # the mirror's thread waits here until the test lets it go
        release.wait(60)
        return real(log, name, version)

    monkeypatch.setattr(castsql.mirror, "write_one", held)
    _upsert(t, [1, 50], "x")  # returns although its mirrors cannot be written yet
    st = open_storage(uri)
    assert delta.mirrored_versions(st)[-1] == t.version - 1
    assert iceberg.mirrored_versions(st)[-1] == t.version - 1
    assert not settle(uri, timeout=0.2)
    release.set()
    assert settle(uri, timeout=60)
    assert delta.mirrored_versions(st)[-1] == iceberg.mirrored_versions(st)[-1] == t.version


def test_every_version_of_a_fast_stream_reaches_both_mirrors_and_reads_the_same(tmp_path):
    uri = str(tmp_path / "t")
    t = _table(uri)
    for i in range(12):  # faster than the mirrors: requests coalesce, versions are not skipped
        _upsert(t, [i, 100 + i], f"b{i}")
        if i % 4 == 3:
            t.delete(f"id = {i - 1}")
    assert settle(uri, timeout=120)
    st = open_storage(uri)
    versions = list(range(t.version + 1))
    assert delta.mirrored_versions(st) == versions
    assert iceberg.mirrored_versions(st) == versions
    DeltaReaders(uri).check(t, versions[-3:])
    IcebergReaders(uri).check(t, versions[-3:])


def test_an_export_in_the_same_process_waits_for_the_thread_instead_of_racing_it(tmp_path):
    uri = str(tmp_path / "t")
    t = _table(uri)
    for i in range(5):
        _upsert(t, [i], f"e{i}")
        out = t.export_iceberg()  # would be refused as a racing exporter if it did not wait
        assert out.latest == t.version
        assert t.export_delta().latest == t.version


def test_a_process_that_commits_and_ends_leaves_its_mirrors_written(tmp_path):
    uri = str(tmp_path / "t")
    _table(uri)
    settle(uri, timeout=60)
    script = (
        "import castsql, pyarrow as pa\n"
        f"t = castsql.open({uri!r})\n"
        "for i in range(3):\n"
        "    src = pa.table({'id': pa.array([1000 + i], pa.int64()), 'v': ['child']})\n"
        "    t.merge(src, on='id').when_matched_update_all().when_not_matched_insert_all().execute()\n"
        "print(t.version)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    version = int(out.stdout.split()[-1])
    st = open_storage(uri)
    assert delta.mirrored_versions(st)[-1] == iceberg.mirrored_versions(st)[-1] == version
    t = castsql.open(uri)
    DeltaReaders(uri).check(t, [version])
    IcebergReaders(uri).check(t, [version])


def test_a_forked_child_exits_without_waiting_for_its_parents_queue(tmp_path, monkeypatch):
    import os

    uri = str(tmp_path / "t")
    t = _table(uri)
    settle(uri, timeout=60)
    release, real = threading.Event(), castsql.mirror.write_one

    def held(log, name, version):
        release.wait(60)
        return real(log, name, version)

    monkeypatch.setattr(castsql.mirror, "write_one", held)
    _upsert(t, [3], "f")  # queued in the parent, held there
    pid = os.fork()
    if pid == 0:  # the child: exit through the interpreter's exit work, which waits for queues
        code = 0 if settle(timeout=5) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    release.set()
    assert os.waitstatus_to_exitcode(status) == 0
    assert settle(uri, timeout=60)
    assert delta.mirrored_versions(open_storage(uri))[-1] == t.version
