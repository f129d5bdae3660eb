"""Merge, update and CDC batches on Spark (castsql.spark.merge/update/cdc_merge) and
through the CLI (``castsql merge`` / ``castsql update``, both engines): Delta's
semantics, one version each, errors in one line before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import events_rows

import castsql
from castsql.errors import WriteError
from castsql.format import KeyRangeDelete, TableLog
from castsql.spark import append, merge, update
from castsql.spark.engine import cdc_merge
from castsql.spark.errors import WrongType
from castsql.storage import open_storage
from castsql.write.merge import MergeError
from castsql.write_cli import main

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
    # Delta's exception: when the only matched clause is an unconditional delete, the row is deleted once.
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
    # The sequence is stored (later batches are ordered against it): merge_schema adds the column.
    m = cdc_merge(spark, uri, batch, key="id", op_column="op", sequence="seq", merge_schema=True)
    assert m.version == 2 and {k: {c: r[c] for c in COLS} for k, r in _rows(uri).items()} == model
    assert (m.num_target_rows_deleted, m.num_target_rows_updated, m.num_target_rows_inserted) == (1, 2, 1)


# ---------------------------------------------------------------------- CLI


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``castsql *argv`` in this process; delete, update and merge on Spark unless ``--engine`` says otherwise."""
    spark = argv[:1] in (("delete",), ("update",), ("merge",)) and "--engine" not in argv
    rc = main([*argv, "--engine", "spark"] if spark else list(argv))
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


def test_cli_embedded_merge_applies_the_type_rule_to_its_input(spark, tmp_path, capsys):
    """``castsql merge --engine duckdb``: CSV text is parsed into the table's
    types (a bad value names the file, the row and the column); a typed input
    column that is no lossless widening (double into the BIGINT key, even of
    whole numbers) is refused, not cast; nothing is written either way."""
    uri = str(tmp_path / "events")
    _table(spark, uri, range(10))
    rows = events_rows([3, 4]).set_column(4, "amount", pa.array([1.5, 2.5]))
    ok, bad = tmp_path / "ok.csv", tmp_path / "bad.csv"
    pacsv.write_csv(rows, ok)
    merge = ["--on", "id", "--engine", "duckdb"]
    rc, _, err = _cli(capsys, "merge", uri, "--from", str(ok), *merge, "--no-insert")
    assert rc == 0, err
    assert _rows(uri)[3]["amount"] == 1.5 and _rows(uri)[4]["amount"] == 2.5
    before = _objects(uri)
    bad.write_text(ok.read_text().replace(",2.5", ",lots"))
    rc, _, err = _cli(capsys, "merge", uri, "--from", str(bad), *merge)
    assert rc == 1 and str(bad) in err and "data row 2" in err and "'amount'" in err and "'lots'" in err, err
    wide = tmp_path / "double_ids.parquet"
    pq.write_table(events_rows([1, 2]).set_column(0, "id", pa.array([1.0, 2.0])), wide)
    rc, _, err = _cli(capsys, "merge", uri, "--from", str(wide), *merge, "--no-insert")
    assert rc == 1 and "'id'" in err and "double" in err and "int64" in err and len(err.splitlines()) == 1, err
    assert _objects(uri) == before and _rows(uri)[1]["amount"] == _model([1])[1]["amount"]


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
        [*cmd, "delete", uri, "--where", "CAST(kind AS INT) = 5", "--engine", "spark"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and out.stdout == ""
    lines = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln.strip() and "[Stage" not in ln]
    lines = [ln for ln in lines if not ln.startswith("WARNING: Using incubator modules")]
    assert len(lines) == 1 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert "[CAST_INVALID_INPUT] The value 'view'" in lines[0] and "nothing was committed" in lines[0]
    assert TableLog(open_storage(uri)).latest().version == 2


# ---------------------------------------------------------------------- issue 19: type rule and primary key

_TYPED = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("s", pa.int16()), ("b", pa.int64()), ("x", pa.float64())])


def _typed(ids, **cols) -> pa.Table:
    """Rows of the typed table (``id`` BIGINT key, ``n`` INT, ``s`` SMALLINT,
    ``b`` BIGINT, ``x`` DOUBLE); ``cols`` replaces columns (name -> array)."""
    ids = list(ids)
    data = {
        "id": pa.array(ids, pa.int64()),
        "n": pa.array([i * 10 for i in ids], pa.int32()),
        "s": pa.array([i % 100 for i in ids], pa.int16()),
        "b": pa.array([i * 1000 for i in ids], pa.int64()),
        "x": pa.array([i / 4 for i in ids], pa.float64()),
    }
    data.update(cols)
    return pa.table(data)


def _typed_table(spark, uri: str, ids) -> None:
    append(spark, uri, spark.createDataFrame(_typed(ids)).coalesce(1), primary_key="id")


def _upsert(spark, uri: str, t: pa.Table, **kw):
    return (
        merge(spark, uri, spark.createDataFrame(t), on="id", **kw)
        .when_matched_update_all()
        .when_not_matched_insert_all()
    )


def test_merge_type_rule_refuses_narrowing_before_any_job(spark, tmp_path):
    """The one type rule (issue 19): a source column must fit its table column
    losslessly; a double into BIGINT, BIGINT into INT, BIGINT into DOUBLE or a
    string into a number is refused naming the column and both types, and
    nothing is written. Widenings (INT into BIGINT, SMALLINT into INT) merge."""
    from castsql.errors import SchemaMismatch

    uri = str(tmp_path / "typed")
    _typed_table(spark, uri, range(10))
    before = _objects(uri)
    ids = [3, 4, 20]
    cases = [
        ({"b": pa.array([3.0, 4.0, 20.0], pa.float64())}, "column 'b' is double in the data, the table has int64"),
        ({"n": pa.array([1, 2, 3], pa.int64())}, "column 'n' is int64 in the data, the table has int32"),
        ({"s": pa.array([1, 2, 3], pa.int32())}, "column 's' is int32 in the data, the table has int16"),
        ({"x": pa.array([1, 2, 3], pa.int64())}, "column 'x' is int64 in the data, the table has double"),
        ({"n": pa.array(["1", "2", "3"], pa.string())}, "column 'n' is string in the data, the table has int32"),
    ]
    for cols, needle in cases:
        src = _typed(ids, **cols)
        for build in (
            lambda src=src: _upsert(spark, uri, src),
            lambda src=src: merge(spark, uri, spark.createDataFrame(src), on="id").when_not_matched_insert_all(),
        ):
            with pytest.raises(SchemaMismatch) as e:
                build().execute()
            msg = str(e.value)
            assert needle in msg and uri in msg and "nothing was written" in msg and "\n" not in msg, msg
    assert _objects(uri) == before and TableLog(open_storage(uri)).latest().version == 1
    # Lossless widenings are cast: INT into BIGINT, SMALLINT into INT, INT into DOUBLE.
    src = _typed(
        ids,
        b=pa.array([7, 8, 9], pa.int32()),
        n=pa.array([-1, -2, -3], pa.int16()),
        x=pa.array([1, 2, 3], pa.int32()),
    )
    m = _upsert(spark, uri, src).execute()
    assert (m.version, m.num_target_rows_updated, m.num_target_rows_inserted) == (2, 2, 1)
    got = _rows(uri)
    assert [(got[i]["b"], got[i]["n"], got[i]["x"]) for i in ids] == [(7, -1, 1.0), (8, -2, 2.0), (9, -3, 3.0)]
    with castsql.open(uri) as t:
        assert t.to_arrow().schema == _TYPED  # the table's types, unchanged


def test_merge_expression_values_are_stored_only_unchanged(spark, tmp_path):
    """A number a clause's SQL computes in another type (Spark types ``1`` as
    INT, ``target.b / 2`` as DOUBLE) is stored when no value changes (``0``
    into SMALLINT); one it would change is refused naming the column, the
    expression and a value, before anything is written."""
    uri = str(tmp_path / "typed")
    _typed_table(spark, uri, range(10))
    src = spark.createDataFrame(_typed([2, 3]))
    m = merge(spark, uri, src, on="id").when_matched_update(set={"s": "target.s + 1", "b": "target.b / 2"}).execute()
    assert m.version == 2 and m.num_target_rows_updated == 2
    got = _rows(uri)
    assert [(got[i]["s"], got[i]["b"]) for i in (2, 3)] == [(3, 1000), (4, 1500)]
    before = _objects(uri)
    for set_, needle in [
        ({"b": "target.b / 7"}, "column b is bigint, and the value 'target.b / 7' is double: 142.857"),
        (
            {"n": "source.x"},
            "column n is int, and the value 'source.x' is double: 0.5 cannot be stored as int unchanged",
        ),
        ({"s": "source.b * 100"}, "column s is smallint, and the value 'source.b * 100' is bigint: 200000"),
    ]:
        with pytest.raises(MergeError) as e:
            merge(spark, uri, src, on="id").when_matched_update(set=set_).execute()
        msg = str(e.value)
        assert needle in msg and "nothing was committed" in msg and "\n" not in msg, msg
    with pytest.raises(WriteError, match="update: column b is bigint, and the value 'b / 7' is double"):
        update(spark, uri, {"b": "b / 7"}, "id = 2")
    assert _objects(uri) == before and TableLog(open_storage(uri)).latest().version == 2


def test_merge_inserted_keys_must_be_unique_and_not_null(spark, tmp_path):
    """Issue 19: a merge's inserts may not write a NULL primary key or one key
    twice (the source repeating a key no row matches), nor, when the inserted
    key is not the source's ``on`` key, a key a live row holds; DuplicateKey
    names the first keys and nothing is written. ``allow_duplicate_keys=True``
    writes them."""
    from castsql.write.keys import DuplicateKey

    uri = str(tmp_path / "typed")
    _typed_table(spark, uri, range(10))
    log = TableLog(open_storage(uri))
    before = _objects(uri)
    repeated = _typed([3, 40, 40, 41, 41, 42])
    nulls = _typed([3, 50, 51], id=pa.array([3, None, 51], pa.int64()))
    cases = [
        (
            lambda: _upsert(spark, uri, repeated),
            "the data holds key id = 40 more than once (and 1 more duplicated key: 41)",
        ),
        (lambda: _upsert(spark, uri, nulls), "1 row(s) have a NULL primary key 'id'"),
        # Not on the key: a source row matching nothing may carry a key the table has.
        (
            lambda: merge(
                spark, uri, spark.createDataFrame(_typed([7, 60], n=pa.array([-1, 0], pa.int32()))), on="n"
            ).when_not_matched_insert_all(),
            "1 key(s) are already in the table at version 1 (id = 7)",
        ),
        (
            lambda: merge(spark, uri, spark.createDataFrame(_typed([103, 104, 200])), on="id").when_not_matched_insert(
                values={"id": "source.id - 100", "n": "source.n"}
            ),
            "2 key(s) are already in the table at version 1 (id = 3, id = 4)",
        ),
        (
            lambda: merge(
                spark, uri, spark.createDataFrame(_typed([5, 61])), on="target.n = source.n + 1"
            ).when_not_matched_insert_all(),
            "1 key(s) are already in the table at version 1 (id = 5)",
        ),
    ]
    for build, needle in cases:
        with pytest.raises(DuplicateKey) as e:
            build().execute()
        msg = str(e.value)
        assert needle in msg and uri in msg and "nothing was committed" in msg and "\n" not in msg, msg
        assert "NULL" in msg or "allow_duplicate_keys=True" in msg, msg
    assert _objects(uri) == before and log.latest().version == 1
    # A merge on the key inserting its source keys: keys the table has match, so nothing is looked up.
    m = _upsert(spark, uri, _typed([3, 70, 71])).execute()
    assert (m.version, m.num_target_rows_updated, m.num_target_rows_inserted) == (2, 1, 2)
    # The option writes the duplicates and the NULL key.
    m = _upsert(spark, uri, repeated, allow_duplicate_keys=True).execute()
    assert (m.version, m.num_target_rows_inserted) == (3, 5)
    m = _upsert(spark, uri, nulls, allow_duplicate_keys=True).execute()
    assert (m.version, m.num_target_rows_inserted) == (4, 2)
    with castsql.open(uri) as t:
        ids = t.to_arrow().column("id").to_pylist()
    assert sorted(ids, key=lambda i: (i is None, i)) == [*range(10), 40, 40, 41, 41, 42, 51, 70, 71, None]


def test_cli_merge_allow_duplicate_keys_and_type_rule(spark, tmp_path, capsys):
    uri = str(tmp_path / "typed")
    _typed_table(spark, uri, range(10))
    pq.write_table(_typed([5, 30, 30]), dup := str(tmp_path / "dup.parquet"))
    pq.write_table(_typed([5, 31], b=pa.array([2.5, 3.0])), wide := str(tmp_path / "double.parquet"))
    before = _objects(uri)
    rc, out, err = _cli(capsys, "merge", uri, "--from", dup, "--on", "id")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "key id = 30 more than once" in err and "--allow-duplicate-keys" in err
    rc, out, err = _cli(capsys, "merge", uri, "--from", wide, "--on", "id")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "column 'b' is double in the data, the table has int64" in err
    assert _objects(uri) == before
    rc, out, err = _cli(capsys, "merge", uri, "--from", dup, "--on", "id", "--allow-duplicate-keys")
    assert rc == 0 and out.startswith("merge: committed version 2; 2 inserted, 1 updated"), err
    assert sorted(_rows_list(uri)) == [*range(10), 30, 30]


def _rows_list(uri: str) -> list:
    with castsql.open(uri) as t:
        return t.to_arrow().column("id").to_pylist()
