"""One after-commit point every commit passes (issue 54): whatever makes a
commit — a ``Table`` method, ``castsql.write_table``, a CLI command, Spark's
functions or ``format("castsql")`` — the Delta mirror a table's properties ask
for reaches the new version, and automatic compaction follows a commit that
changed the rows (never a compaction, never itself). ``castsql alter
--set-property``, ``castsql restore`` and ``castsql upgrade`` once committed
without writing the mirror: each entry point is run here against a real
table and the table's own objects are read back.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import castsql
from castsql.cli import main as cli
from castsql.format import TableLog, write_data_files
from castsql.format.log import after_commit_hooks, register_after_commit
from castsql.format.manifest import Manifest
from castsql.format.properties import AutoCompact
from castsql.format.schema import Schema
from castsql.snapshot import resolve
from castsql.storage import open_storage

MIRROR = {"castsql.mirror.delta": "true"}
AUTO = {**MIRROR, "castsql.autoCompact": "true", "castsql.autoCompact.minNumFiles": "2"}
# Operations after which automatic compaction looks at the table (castsql.embedded.compactor).
DATA_WRITES = {"APPEND", "DELETE", "UPDATE", "MERGE", "OVERWRITE", "RESTORE"}


def rows(ids, tag: str = "a") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids]})


def mirrored(uri: str) -> int:
    """The newest version of the Delta log next to the table (-1: none)."""
    log_dir = Path(uri) / "_delta_log"
    done = [int(p.stem) for p in log_dir.glob("*.json")] if log_dir.exists() else []
    return max(done, default=-1)


def needs_compaction(log: TableLog, version: int) -> bool:
    """Whether version ``version`` holds what castsql.autoCompact compacts."""
    m = log.manifest(version)
    auto = AutoCompact.of(m.properties)
    if auto is None:
        return False
    sizes = resolve(log, version).table().column("size_bytes")
    small = pc.sum(pc.less(sizes, auto.max_file_size)).as_py() or 0
    return small >= auto.min_files or m.tombstone_count >= auto.min_files


class Steps:
    """Runs entry points against one table and checks what followed each commit."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.checked: list[str] = []

    def log(self) -> TableLog:
        return TableLog(open_storage(self.uri))

    def head(self) -> int:
        from castsql.errors import TableNotFound

        try:
            return self.log().latest().version
        except TableNotFound:
            return -1

    def run(self, name: str, step, operation: str, *, compacts: bool | None = None) -> None:
        """Run ``step``; it must commit ``operation`` (one version), the
        mirror must reach the head, and a COMPACT version must follow it
        exactly when it changed the rows past the autoCompact threshold
        (``compacts``: what the test arranged, checked too)."""
        before = self.head()
        step()
        log = self.log()
        head = log.latest().version
        ops = [log.manifest(v).operation for v in range(before + 1, head + 1)]
        if before == -1 and ops[:1] == ["CREATE"]:  # a write that created the table: its version 0 first
            ops, before = ops[1:], 0
        assert ops and ops[0] == operation, f"{name}: committed {ops}"
        expected = operation in DATA_WRITES and needs_compaction(log, before + 1)
        if compacts is not None:
            assert expected == compacts, f"{name}: the test meant the write {'to' if compacts else 'not to'} compact"
        assert ops == [operation] + ["COMPACT"] * expected, f"{name}: {ops} after version {before}"
        assert mirrored(self.uri) == head, f"{name}: the Delta mirror is at {mirrored(self.uri)}, the table at {head}"
        self.checked.append(name)


def test_the_after_commit_point_is_registered_once_in_order():
    import castsql.commits  # noqa: F401 - what `import castsql` registers

    assert after_commit_hooks() == ["mirrors", "autoCompact"]


def test_every_embedded_and_command_line_entry_point_mirrors_and_compacts(tmp_path, monkeypatch):
    from castsql.write.cdc import apply_cdc

    uri = str(tmp_path / "events")
    s = Steps(uri)
    create = lambda: castsql.write_table(uri, rows(range(4)), primary_key="id", properties=AUTO)  # noqa: E731
    s.run("castsql.write_table (create)", create, "APPEND", compacts=False)
    assert [m.operation for m in s.log().history()] == ["CREATE", "APPEND"] and mirrored(uri) == 1
    t = castsql.open(uri)

    # Python: each data write adds a second small file (or tombstone), so a compaction follows.
    s.run("Table.append", lambda: t.append(rows([10])), "APPEND", compacts=True)
    assert t.version == s.head()  # the Table reads what followed its write
    s.run("Table.delete (first tombstone)", lambda: t.delete("id = 0"), "DELETE", compacts=False)
    s.run("Table.delete", lambda: t.delete("id = 1"), "DELETE", compacts=True)
    s.run("Table.update", lambda: t.update({"v": "'u'"}, "id = 2"), "UPDATE", compacts=True)
    s.run("Table.merge", lambda: t.merge(rows([3, 11], "m"), on="id").when_matched_update_all()
          .when_not_matched_insert_all().execute(), "MERGE", compacts=True)  # fmt: skip
    s.run("apply_cdc", lambda: apply_cdc(t, rows([12]).append_column("op", pa.array(["I"])), key="id",
                                         op_column="op"), "MERGE", compacts=True)  # fmt: skip
    s.run("castsql.write_table (append)", lambda: castsql.write_table(uri, rows([13]), mode="append"), "APPEND",
          compacts=True)  # fmt: skip
    s.run("castsql.write_table (overwrite)", lambda: castsql.write_table(uri, rows(range(20, 24)), mode="overwrite"),
          "OVERWRITE", compacts=False)  # fmt: skip
    t = castsql.open(uri)
    t.append(rows([30]))  # two files again, compacted: Table.compact then has files to pack with deletes
    t.append(rows([31]))
    t.delete("id = 20")
    s.run("Table.compact", lambda: t.compact(threshold=0.01), "COMPACT")
    s.run("Table.set_properties", lambda: t.set_properties({"owner": "ops"}), "SET PROPERTIES")
    s.run("Table.add_columns", lambda: t.add_columns({"n": "int32"}), "ALTER")
    s.run("Table.widen_columns", lambda: t.widen_columns({"n": "int64"}), "ALTER")
    s.run("TableLog.restore", lambda: s.log().restore(2), "RESTORE", compacts=True)

    # The command line, in this process as `castsql` runs it.
    src = tmp_path / "in.parquet"
    pq.write_table(rows([40]).append_column("n", pa.array([1], pa.int64())), src)  # the table's columns now
    cdc = tmp_path / "cdc.parquet"
    pq.write_table(rows([41]).append_column("n", pa.array([2], pa.int64())).append_column("op", pa.array(["I"])), cdc)
    monkeypatch.setattr("sys.argv", ["castsql"])
    for name, argv, op in [
        ("castsql append", ["append", uri, "--from", str(src)], "APPEND"),
        ("castsql delete", ["delete", uri, "--where", "id = 40"], "DELETE"),
        ("castsql update", ["update", uri, "--set", "v = 'cli'", "--where", "id = 3"], "UPDATE"),
        ("castsql merge", ["merge", uri, "--from", str(src), "--on", "id"], "MERGE"),
        ("castsql merge --op-column", ["merge", uri, "--from", str(cdc), "--on", "id", "--op-column", "op"], "MERGE"),
        ("castsql compact", ["compact", uri, "--threshold", "0.01"], "COMPACT"),
        ("castsql restore", ["restore", uri, "--version", "3"], "RESTORE"),
        ("castsql alter --add-column", ["alter", uri, "--add-column", "extra", "int64"], "ALTER"),
        ("castsql alter --set-property", ["alter", uri, "--set-property", "team=data"], "SET PROPERTIES"),
    ]:
        if op == "COMPACT":
            t = castsql.open(uri)
            t.delete("id = 40 OR id = 3")  # something to compact with deletes
        s.run(name, lambda argv=argv: _ok(cli(argv)), op)
    t.close()


def _ok(rc: int) -> None:
    assert rc == 0


def test_restore_alter_and_upgrade_commands_write_the_mirror(tmp_path, monkeypatch):
    """The issue's three: `castsql alter --set-property`, `castsql restore` and
    `castsql upgrade` committed through TableLog without the mirror."""
    from castsql.format.layout import POINTER_KEY, manifest_key
    from castsql.format.log import pointer_bytes

    uri = str(tmp_path / "old")
    st = open_storage(uri)
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    files = write_data_files(st, rows(range(5)))
    from datetime import UTC, datetime

    for v, fs in ((0, ()), (1, tuple(files))):
        m = Manifest(
            version=v, previous=v - 1 if v else None, created_at=datetime.now(UTC), schema=Schema.from_arrow(schema),
            data_files=fs, primary_key="id", operation="APPEND" if v else "CREATE", format_version=1,
            properties=dict(MIRROR),
        )  # fmt: skip
        st.put_if_absent(manifest_key(v), m.to_bytes())
        st.put(POINTER_KEY, pointer_bytes(v, f"c{v}"))
    monkeypatch.setattr("sys.argv", ["castsql"])
    s = Steps(uri)
    s.run("castsql upgrade", lambda: _ok(cli(["upgrade", uri])), "UPGRADE")
    s.run("castsql alter --set-property", lambda: _ok(cli(["alter", uri, "--set-property", "a=b"])), "SET PROPERTIES")
    s.run("TableLog.append", lambda: s.log().append(write_data_files(st, rows([9]))), "APPEND")
    s.run("castsql restore", lambda: _ok(cli(["restore", uri, "--version", "1"])), "RESTORE")
    assert castsql.open(uri).to_arrow().num_rows == 5


def test_a_failing_hook_never_fails_the_commit_and_a_hook_commit_runs_no_compaction(tmp_path, caplog):
    """A hook's failure is logged and the write stands; a version a hook
    commits (the automatic compaction's) gets its mirror and no compaction of
    its own."""
    uri = str(tmp_path / "t")
    seen: list[tuple[str, int]] = []

    def spy(log: TableLog, m: Manifest) -> None:
        seen.append((m.operation, m.version))
        if m.operation == "SET PROPERTIES":
            raise RuntimeError("the spy broke")

    register_after_commit("spy", spy, after_hook_commits=True)
    try:
        castsql.write_table(uri, rows(range(2)), primary_key="id", properties=AUTO)
        t = castsql.open(uri)
        t.append(rows([5]))
        with caplog.at_level(logging.WARNING, logger="castsql.format.log"):
            m = t.set_properties({"owner": "x"})
        assert m.version == t.version == TableLog(open_storage(uri)).latest().version
        assert "spy after version" in caplog.text and "the spy broke" in caplog.text
    finally:
        from castsql.format import log as log_module

        log_module._HOOKS[:] = [h for h in log_module._HOOKS if h.name != "spy"]
    # Registered after autoCompact, the spy hears of the compaction (made inside APPEND 2's hooks) first.
    assert seen == [("CREATE", 0), ("APPEND", 1), ("COMPACT", 3), ("APPEND", 2), ("SET PROPERTIES", 4)]
    assert mirrored(uri) == 4


@pytest.mark.spark
def test_every_spark_entry_point_mirrors_and_compacts(spark, events_df, tmp_path):
    """Spark's driver commits through the same point: the mirror follows every
    Spark commit, and automatic compaction (DuckDB in the driver's process, no
    JVM needed) follows Spark's data writes as the embedded engine's."""
    import castsql.spark as cs

    uri = str(tmp_path / "events")
    s = Steps(uri)
    from conftest import events_rows

    cs.register(spark)
    castsql.write_table(uri, events_rows(range(4)), primary_key="id", properties=AUTO)
    s.run("castsql.spark.append", lambda: cs.append(spark, uri, events_df([10])), "APPEND", compacts=True)
    s.run("format('castsql') append", lambda: events_df([11]).write.format("castsql").mode("append").save(uri),
          "APPEND", compacts=True)  # fmt: skip
    castsql.open(uri).delete("id = 0")
    s.run("castsql.spark.delete", lambda: cs.delete(spark, uri, "id = 1"), "DELETE", compacts=True)
    s.run("castsql.spark.update", lambda: cs.update(spark, uri, {"amount": "amount + 1"}, "id = 2"), "UPDATE",
          compacts=True)  # fmt: skip
    s.run("castsql.spark.merge", lambda: cs.merge(spark, uri, events_df([3, 12]), on="id").when_matched_update_all()
          .when_not_matched_insert_all().execute(), "MERGE", compacts=True)  # fmt: skip
    feed = events_df([13]).selectExpr("*", "'I' AS op")  # the event time orders the feed: a stored column
    s.run("castsql.spark.cdc_merge", lambda: cs.cdc_merge(spark, uri, feed, key="id", op_column="op", sequence="ts"),
          "MERGE", compacts=True)  # fmt: skip
    s.run("format('castsql') overwrite", lambda: events_df(range(20, 23)).write.format("castsql").mode("overwrite")
          .save(uri), "OVERWRITE", compacts=False)  # fmt: skip
    castsql.open(uri).delete("id = 20")
    s.run("castsql.spark.compact", lambda: cs.compact(spark, uri, threshold=0.01), "COMPACT")
