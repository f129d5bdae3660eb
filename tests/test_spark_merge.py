"""Merge, update and CDC batches on Spark (castsql.spark.merge/update/cdc_merge) and
through the CLI (``castsql merge`` / ``castsql update``, both engines): Delta's
semantics, one version each, errors in one line before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import events_rows

import castsql
from castsql.format import KeyRangeDelete, TableLog
from castsql.spark import append, merge, update
from castsql.spark.cli import main
from castsql.spark.errors import WrongType
from castsql.spark.merge import cdc_merge
from castsql.storage import open_storage
from castsql.write.merge import MergeError

pytestmark = pytest.mark.spark

COLS = ["id", "ts", "user", "kind", "amount"]


def _model(ids) -> dict[int, dict]:
    return {r["id"]: r for r in events_rows(ids).to_pylist()}


def _rows(uri: str, version: int | None = None, s3=None) -> dict[int, dict]:
    with castsql.open(uri, version=version, s3=s3) as t:
        return {r["id"]: r for r in t.to_arrow().to_pylist()}


def _objects(uri: str, s3=None) -> list[tuple[str, int]]:
    return sorted((i.key, i.size) for i in open_storage(uri, s3=s3).list("") if not i.key.startswith("data/"))


def _table(spark, uri: str, ids, s3=None, row_group_size: int = 40) -> None:
    df = spark.createDataFrame(events_rows(ids)).coalesce(1)
    append(spark, uri, df, primary_key="id", s3=s3, row_group_size=row_group_size)


def test_merge_every_clause_kind_in_one_version(spark, tmp_path):
    uri = str(tmp_path / "events")
    _table(spark, uri, range(100))
    src_rows = events_rows([*range(80, 120), 2000]).to_pylist()
    for r in src_rows:
        r["kind"] = "gone" if r["id"] % 10 == 3 else "new"
    src = spark.createDataFrame(pa.Table.from_pylist(src_rows, schema=events_rows([1]).schema))
    m = (
        merge(spark, uri, src, on="id")
        .when_matched_delete(condition="source.kind = 'gone'")
        .when_matched_update(set={"amount": "source.amount + 1000"}, condition="target.id % 2 = 0")
        .when_matched_update_all()
        .when_not_matched_insert_all(condition="source.id < 1000")
        .when_not_matched_by_source_delete(condition="target.id < 10")
        .execute()
    )
    before = _model(range(100))
    model = dict(before)
    src_by = {r["id"]: r for r in src_rows}
    for i in range(80, 120):
        s = src_by[i]
        if i < 100:
            if s["kind"] == "gone":
                del model[i]
            elif i % 2 == 0:
                model[i] = {**model[i], "amount": s["amount"] + 1000}
            else:
                model[i] = s
        else:
            model[i] = s
    for i in range(10):
        del model[i]
    assert m.version == 2 and m.attempts == 1
    assert (m.num_source_rows, m.num_target_rows_inserted, m.num_target_rows_updated) == (41, 20, 18)
    assert m.num_target_rows_deleted == 2 + 10 and m.num_output_rows == 38
    assert m.num_target_files_added == 1 and m.num_tombstones_added == 1 and m.bytes_written > 0
    assert m.num_target_rows_copied == 0 and m.num_target_files_removed == 0
    assert _rows(uri) == model
    assert _rows(uri, 1) == before  # the old version reads as it was
    log = TableLog(open_storage(uri))
    man = log.manifest(2)
    assert man.operation == "MERGE" and len(man.tombstones) == 1  # delete and insert in one version
    assert man.summary["inserted_rows"] == 20 and man.summary["deleted_rows"] == 30
    # Engines agree: the same merge through the embedded engine from the same start.
    uri2 = str(tmp_path / "events2")
    _table(spark, uri2, range(100))
    with castsql.open(uri2) as t:
        m2 = (
            t.merge(pa.Table.from_pylist(src_rows, schema=events_rows([1]).schema), on="id")
            .when_matched_delete(condition="source.kind = 'gone'")
            .when_matched_update(set={"amount": "source.amount + 1000"}, condition="target.id % 2 = 0")
            .when_matched_update_all()
            .when_not_matched_insert_all(condition="source.id < 1000")
            .when_not_matched_by_source_delete(condition="target.id < 10")
            .execute()
        )
    assert _rows(uri2) == model
    keys = ("num_source_rows", "num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted")
    assert {k: getattr(m2, k) for k in keys} == {k: getattr(m, k) for k in keys}


def test_multiple_matches_are_refused_and_nothing_is_written(spark, tmp_path):
    uri = str(tmp_path / "events")
    _table(spark, uri, range(50))
    before = _objects(uri)
    dup = spark.createDataFrame(events_rows([5, 5, 7, 60]))
    with pytest.raises(MergeError, match=r"several source rows match one target row .*\(id=5\)"):
        merge(spark, uri, dup, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    assert _objects(uri) == before and TableLog(open_storage(uri)).latest().version == 1
    # Delta's exception: when every matched clause deletes, the row is deleted once.
    m = merge(spark, uri, dup, on="id").when_matched_delete().execute()
    assert (m.num_target_rows_deleted, m.num_target_rows_inserted) == (2, 0)
    assert set(_rows(uri)) == set(range(50)) - {5, 7}


def test_merge_errors_name_the_table_and_the_column(spark, tmp_path):
    uri = str(tmp_path / "events")
    _table(spark, uri, range(20))
    before = _objects(uri)
    src = spark.createDataFrame(events_rows([1, 30]))
    cases = [
        (lambda: merge(spark, uri, src, on="nope").when_matched_update_all(), "key column 'nope'"),
        (lambda: merge(spark, uri, src.drop("amount"), on="id").when_matched_update_all(), "column 'amount'"),
        (lambda: merge(spark, uri, src, on="id").when_matched_update(set={"amount": "source.kind"}), "column amount"),
        (lambda: merge(spark, uri, src, on="id").when_matched_update(set={"amount": "source.nope"}), "`nope`"),
        (lambda: merge(spark, uri, src, on="id").when_matched_delete(condition="source.kind = 3"), "column kind"),
        (lambda: merge(spark, uri, src, on="id"), "no clause"),
    ]
    for build, needle in cases:
        with pytest.raises((MergeError, WrongType)) as e:
            build().execute()
        msg = str(e.value)
        assert needle in msg and uri in msg and "\n" not in msg, msg
    assert _objects(uri) == before


def test_update_local_and_s3(spark, storage_root, s3_config):
    uri = storage_root + "/events"
    _table(spark, uri, range(200), s3=s3_config)
    m = update(spark, uri, {"amount": "amount * 2", "kind": "'x'"}, "id >= 50 AND id < 120", s3=s3_config)
    model = _model(range(200))
    for i in range(50, 120):
        model[i] = {**model[i], "amount": model[i]["amount"] * 2, "kind": "x"}
    assert m.version == 2 and m.operation == "UPDATE"
    assert m.summary["updated_rows"] == 70 and m.summary["added_rows"] == 70 and m.summary["added_tombstones"] == 1
    assert _rows(uri, s3=s3_config) == model
    log = TableLog(open_storage(uri, s3=s3_config))
    [key] = set(m.tombstones) - set(log.manifest(1).tombstones)
    assert [type(r) for r in log.tombstones(key)] == [KeyRangeDelete]  # a contiguous run of a sorted file
    assert update(spark, uri, {"amount": "0"}, "id < 0", s3=s3_config) is None  # nothing matched: no version
    m = update(spark, uri, {"user": "upper(user)"}, s3=s3_config)  # every row
    assert m.summary["updated_rows"] == 200
    model = {i: {**r, "user": r["user"].upper()} for i, r in model.items()}
    assert _rows(uri, s3=s3_config) == model
    with pytest.raises(WrongType, match="column kind is string, and the condition 'kind = 5'"):
        update(spark, uri, {"amount": "1"}, "kind = 5", s3=s3_config)
    assert log.latest().version == 3


def test_cdc_batches_last_change_per_key_wins(spark, tmp_path):
    uri = str(tmp_path / "users")
    _table(spark, uri, range(30))
    model = _model(range(30))
    rows = []
    changes = [(3, "U"), (3, "D"), (4, "D"), (4, "U"), (40, "I"), (41, "I"), (41, "D"), (5, "U"), (42, "D")]
    for seq, (i, op) in enumerate(changes, 1):
        r = events_rows([i]).to_pylist()[0]
        r.update(amount=float(seq), op=op, seq=seq)
        rows.append(r)
    for r in rows:  # the model: changes in sequence order
        if r["op"] == "D":
            model.pop(r["id"], None)
        else:
            model[r["id"]] = {k: r[k] for k in COLS}
    batch = spark.createDataFrame(pa.Table.from_pylist(rows[::-1]))  # order in the batch does not matter
    m = cdc_merge(spark, uri, batch, key="id", op_column="op", sequence="seq")
    assert m.version == 2 and _rows(uri) == model
    assert (m.num_target_rows_deleted, m.num_target_rows_updated, m.num_target_rows_inserted) == (1, 2, 1)


# ---------------------------------------------------------------------- CLI


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out.strip(), err.strip()


@pytest.mark.parametrize("engine", ["spark", "duckdb"])
def test_cli_merge_and_update(spark, tmp_path, capsys, engine):
    uri = str(tmp_path / "events")
    _table(spark, uri, range(100))
    changes = events_rows(range(90, 110)).append_column(
        "op", pa.array(["D" if i % 5 == 0 else "U" for i in range(90, 110)])
    )
    pq.write_table(changes, path := str(tmp_path / "changes.parquet"))
    rc, out, err = _cli(
        capsys,
        "merge",
        uri,
        "--from",
        path,
        "--on",
        "id",
        "--delete-matched-when",
        "source.op = 'D'",
        "--engine",
        engine,
    )
    assert rc == 0, err
    # 90..99 matched: 90, 95 deleted, 8 updated; 100..109 new: 100, 105 are deletes of absent keys, 8 inserted.
    assert out.startswith("merge: committed version 2; 8 inserted, 8 updated, 2 deleted (20 source row(s)); 1 file(s)")
    model = _model([i for i in range(110) if i not in (90, 95, 100, 105)])
    assert _rows(uri) == model
    sets = ["--set", "amount = amount + 1", "--set", "kind = 'z'"]
    rc, out, err = _cli(capsys, "update", uri, *sets, "--where", "id < 10", "--engine", engine)
    assert rc == 0 and out.startswith("update: committed version 3; 1 file(s), 10 row(s)"), err
    assert "10 row(s) replaced in 1 tombstone record(s)" in out
    for i in range(10):
        model[i] = {**model[i], "amount": model[i]["amount"] + 1, "kind": "z"}
    assert _rows(uri) == model
    no_clause = ["--no-update", "--no-insert", "--engine", engine]
    rc, out, err = _cli(capsys, "merge", uri, "--from", path, "--on", "id", *no_clause)
    assert rc == 1 and "no clause" in err and len(err.splitlines()) == 1
    before = _objects(uri)
    for argv, needle, code in [
        (["update", uri, "--set", "amount = 1", "--where", "kind = 5"], "kind", 1),
        (["update", uri, "--set", "amount = nope"], "nope", 1),
        (["update", uri, "--set", "nope = 1"], "nope", 1),
        (["update", uri, "--set", "amount"], "is not an assignment", 2),
        (["merge", uri, "--from", path, "--on", "nope"], "nope", 1),
        (["merge", uri, "--from", str(tmp_path / "none.parquet"), "--on", "id"], "no such file", 2),
    ]:
        rc, out, err = _cli(capsys, *argv, "--engine", engine)
        assert (rc, out) == (code, "") and needle in err and len(err.splitlines()) == 1, err
        assert "Traceback" not in err
    assert _objects(uri) == before


def test_cli_in_a_real_process_without_pyspark_or_tracebacks(spark, tmp_path):
    """``--engine duckdb`` never imports pyspark; a failing Spark job prints one
    line (no BrokenPipeError tracebacks from pyspark's daemon for the tasks
    Spark cancels: the table is read by two tasks here)."""
    uri = str(tmp_path / "events")
    df = spark.range(0, 1_100_000, numPartitions=2).selectExpr("id", "IF(id % 2 = 0, 'view', 'click') AS kind")
    append(spark, uri, df, primary_key="id")
    code = (
        "import sys; from castsql.cli import main; rc = main(sys.argv[1:]); "
        "print('pyspark imported' if 'pyspark' in sys.modules else 'no pyspark'); sys.exit(rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "update", uri, "--set", "kind = 'x'", "--where", "id = 7", "--engine", "duckdb"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [out.stdout.splitlines()[0], "no pyspark"]
    assert out.stdout.startswith("update: committed version 2; 1 file(s), 1 row(s)")
    cmd = [sys.executable, "-m", "castsql.cli"]
    out = subprocess.run(
        [*cmd, "delete", uri, "--where", "CAST(kind AS INT) = 5"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and out.stdout == ""
    lines = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln.strip() and "[Stage" not in ln]
    lines = [ln for ln in lines if not ln.startswith("WARNING: Using incubator modules")]
    assert len(lines) == 1 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert "[CAST_INVALID_INPUT] The value 'view'" in lines[0] and "nothing was committed" in lines[0]
    assert TableLog(open_storage(uri)).latest().version == 2
