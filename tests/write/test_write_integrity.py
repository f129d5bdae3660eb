"""Write integrity on both engines (issue 33's reproductions): the primary key
stays unique and non-NULL whatever a write inserts or changes, a table's
own column names never steer which rows a write hits, merges run whether or
not any key matches, and one type rule holds for every value a write stores.
Each refusal names the table and commits nothing."""

from __future__ import annotations

import contextlib
import threading

import pyarrow as pa
import pytest
from engines import Embedded, Spark, live, version

import castsql
from castsql.errors import CastSQLError, DuplicateKey, MergeError, NullKey, SchemaMismatch, WriteError
from castsql.format import TableLog
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64())])


def start(uri: str, s3=None, schema: pa.Schema = SCHEMA, rows: pa.Table | None = None, pk: str | None = "id") -> str:
    st = open_storage(uri, s3=s3)
    TableLog.create(st, schema, primary_key=pk)
    with castsql.open(st.root, s3=s3) as t:
        t.append(rows if rows is not None else pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "n": [10, 20, 30]}))
    return st.root


def src(ids, vs=None, ns=None) -> pa.Table:
    vs = vs if vs is not None else [f"s{i}" for i in ids]
    ns = ns if ns is not None else [i * 100 for i in ids]
    return pa.table({"id": pa.array(ids, pa.int64()), "v": vs, "n": pa.array(ns, pa.int64())})


def ids(uri: str, s3=None) -> list:
    return sorted((r["id"] for r in live(uri, s3)), key=lambda k: (k is None, k))


# The key-changing writes of the issue, each refused: (operation, arguments, error class, an offending key).
KEY_BREAKERS = [
    ("update", ({"id": "1"}, "id = 2"), DuplicateKey, "id = 1"),
    ("update", ({"id": "NULL"}, "id = 2"), NullKey, "NULL primary key"),
    ("update", ({"id": "id + 1"}, "id < 3"), DuplicateKey, "id = 3"),
    ("merge", (src([2]), "target.id = source.id", [("matched_update", None, {"id": "3"})]), DuplicateKey, "id = 3"),
    ("merge", (src([1], vs=["b"]), "v", [("matched_update", None, None)]), DuplicateKey, "id = 1"),
    ("merge", (src([7, 8], vs=["a", "b"]), "v", [("matched_update", None, None)]), None, None),
    (
        "merge",
        (src([1002]), "id", [("not_matched_insert", None, {"id": "source.id - 1000", "v": "source.v"})]),
        DuplicateKey,
        "id = 2",
    ),
    ("merge", (src([2]), "v", [("matched_update", None, {"id": "NULL"})]), None, None),  # matches nothing
    ("merge", (src([9], vs=["b"]), "v", [("matched_update", None, {"id": "NULL"})]), NullKey, "NULL"),
]


def _apply(engine, op, args):
    return getattr(engine, op)(*args)


@pytest.mark.parametrize("op,args,error,named", KEY_BREAKERS)
def test_embedded_writes_keep_the_key_unique_and_not_null(tmp_path, op, args, error, named):
    uri = start(str(tmp_path / "t"))
    before = live(uri)
    if error is None:
        _apply(Embedded(uri), op, args)
        keys = ids(uri)
        assert None not in keys and len(keys) == len(set(keys))
        return
    with pytest.raises(error) as e:
        _apply(Embedded(uri), op, args)
    msg = str(e.value)
    assert msg.startswith("table t: ") and named in msg and "nothing was committed" in msg and "\n" not in msg
    assert live(uri) == before and version(uri) == 1


def test_keys_may_move_to_free_values_and_swap(tmp_path):
    uri = start(str(tmp_path / "t"))
    e = Embedded(uri)
    assert e.update({"id": "id + 10"}, "id < 3") == 2
    assert ids(uri) == [3, 11, 12]
    assert e.update({"id": "CASE id WHEN 11 THEN 12 ELSE 11 END"}, "id > 10") == 3  # a swap
    assert [(r["id"], r["v"]) for r in live(uri)] == [(3, "c"), (11, "b"), (12, "a")]
    m = e.merge(src([3]), "target.id = source.id", [("matched_update", None, {"id": "4"})])
    assert m == 4 and ids(uri) == [4, 11, 12]


def test_float_keys_compare_as_sql_does(tmp_path):
    schema = pa.schema([("k", pa.float64()), ("v", pa.string())])
    uri = start(str(tmp_path / "f"), schema=schema, rows=pa.table({"k": [0.0, 1.5], "v": ["a", "b"]}), pk="k")
    with castsql.open(uri) as t:
        with pytest.raises(DuplicateKey, match=r"k = 0\.0"):
            t.append(pa.table({"k": [-0.0], "v": ["z"]}))  # -0.0 = 0.0 in DuckDB and Spark
        with pytest.raises(DuplicateKey, match="more than once"):
            t.append(pa.table({"k": [7.0, -7.0 * -1.0], "v": ["y", "z"]}))
        with pytest.raises(NullKey, match="NaN primary key"):
            t.append(pa.table({"k": [float("nan")], "v": ["z"]}))
        with pytest.raises(NullKey, match="NaN"):
            t.update(set={"k": "'nan'::DOUBLE"}, where="k = 1.5")
        assert t.at().version == 1


@pytest.mark.parametrize("name", ["_pos", "_file", "filename", "pos", "fi", "__fi", "_castsql", "rowid", "p", "s"])
def test_column_names_never_steer_a_write(tmp_path, name):
    schema = pa.schema([("id", pa.int64()), (name, pa.int64())])
    rows = pa.table({"id": [0, 1, 2, 3], name: [3, 2, 1, 0]})  # the column's values are other rows' positions
    uri = start(str(tmp_path / "t"), schema=schema, rows=rows)
    e = Embedded(uri)
    assert e.delete("id = 0") == 2
    assert e.update({name: "100"}, "id = 1") == 3
    upsert = [("matched_update", None, None), ("not_matched_insert", None, None)]
    assert e.merge(pa.table({"id": [2, 9], name: [7, 8]}), "id", upsert) == 4
    assert [(r["id"], r[name]) for r in live(uri)] == [(1, 100), (2, 7), (3, 0), (9, 8)]
    with castsql.open(uri) as t:
        changes = t.changes(2, 4).to_pylist()
    assert sorted((r["id"], r["_change_type"]) for r in changes if r["_change_type"] != "update_postimage") == [
        (0, "delete"), (1, "update_preimage"), (2, "update_preimage"), (9, "insert")
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["file_row_number", "FILE_INDEX", "_castsql_pos", "__CastSQL_x"])
def test_names_the_machinery_needs_are_refused_when_a_table_is_made_or_evolves(tmp_path, name):
    st = open_storage(str(tmp_path / "t"))
    with pytest.raises(SchemaMismatch, match=f"column name {name!r} is reserved"):
        TableLog.create(st, pa.schema([("id", pa.int64()), (name, pa.int64())]), primary_key="id")
    assert not list(st.list(""))
    uri = start(str(tmp_path / "u"))
    with castsql.open(uri) as t:
        with pytest.raises(SchemaMismatch, match="is reserved"):
            t.append(pa.table({"id": [9], name: [1]}), merge_schema=True)
        with pytest.raises(CastSQLError, match="is reserved"):
            t.update(set={name: "1"}, where="id = 1", merge_schema=True)
        assert t.at().version == 1


MERGES_WITHOUT_MATCHES = [
    [("matched_update", "target.v <> 'zz'", {"v": "source.v"}), ("not_matched_insert", None, None)],
    [("matched_update", "source.n > target.n", None), ("not_matched_insert", "source.n > 0", None)],
    [("not_matched_insert", None, {"id": "source.id", "v": "source.v"})],
    [("matched_delete", "target.n > 0", None), ("not_matched_insert", None, {"id": "source.id", "n": "7"})],
    [("matched_update", None, {"n": "target.n + source.n"}), ("not_matched_by_source_update", None, {"n": "0"})],
]


@pytest.mark.parametrize("clauses", MERGES_WITHOUT_MATCHES)
def test_merges_run_whether_or_not_a_key_matches(tmp_path, clauses):
    for case, keys in (("none", [8, 9]), ("some", [2, 9]), ("all", [1, 2, 3])):
        uri = start(str(tmp_path / case / "t"))
        Embedded(uri).merge(src(keys), "id", clauses)
        got = ids(uri)
        assert len(got) == len(set(got)) and None not in got


def test_one_type_rule_for_set_values_and_update_all(tmp_path):
    uri = start(str(tmp_path / "t"))
    e = Embedded(uri)
    with pytest.raises(MergeError, match="column 'v' is VARCHAR, but '5' is INTEGER"):
        e.merge(src([1]), "id", [("matched_update", None, {"v": "5"})])
    with pytest.raises(MergeError, match=r"column 'n' is BIGINT, but 'source\.v' is VARCHAR"):
        e.merge(src([9]), "id", [("not_matched_insert", None, {"id": "source.id", "n": "source.v"})])
    with pytest.raises(WriteError, match="column 'v' is VARCHAR, but '5' is INTEGER"):
        e.update({"v": "5"}, "id = 1")
    with pytest.raises(SchemaMismatch, match="column 'n'"):
        e.merge(pa.table({"id": [1], "v": ["x"], "n": ["7"]}), "id", [("matched_update", None, None)])
    # A number of another numeric type is stored only where the conversion changes no value (Spark's rule).
    with pytest.raises(WriteError, match=r"column n is BIGINT, and the value 'n / 3' is DOUBLE: 3\.33"):
        e.update({"n": "n / 3"}, "id = 1")
    with pytest.raises(MergeError, match=r"the value 'target\.n \* 1e30' is DOUBLE: 1e\+31 cannot be stored"):
        e.merge(src([1]), "id", [("matched_update", None, {"n": "target.n * 1e30"})])
    assert version(uri) == 1
    assert e.update({"n": "n / 2"}, "id = 1") == 2 and live(uri)[0]["n"] == 5


def test_a_merge_on_two_columns_racing_an_append_of_its_key_conflicts_on_the_primary_key(tmp_path, monkeypatch):
    """The merge plans an insert of id 5 (no live (day, id) matches); an append
    of id 5 commits before the merge does. The merge's conflict span is on the
    primary key, so it plans again, sees id 5 and refuses it."""
    import castsql.write.pipeline as dml

    schema = pa.schema([("day", pa.int64()), ("id", pa.int64()), ("v", pa.string())])
    uri = start(str(tmp_path / "t"), schema=schema, rows=pa.table({"day": [1], "id": [1], "v": ["a"]}))
    real = dml.commit_dml
    raced = threading.Event()

    def append_first(log, **kw):
        if not raced.is_set():
            raced.set()
            with castsql.open(uri) as other:
                other.append(pa.table({"day": [2], "id": [5], "v": ["appended"]}))
        return real(log, **kw)

    monkeypatch.setattr(dml, "commit_dml", append_first)
    with castsql.open(uri) as t, pytest.raises(DuplicateKey, match="id = 5"):
        t.merge(pa.table({"day": [1], "id": [5], "v": ["merged"]}), on=["day", "id"]).when_not_matched_insert_all(
        ).execute()  # fmt: skip
    assert raced.is_set()
    assert [(r["id"], r["v"]) for r in live(uri)] == [(1, "a"), (5, "appended")]


def test_the_cli_refuses_a_key_update_in_one_line(tmp_path, capsys):
    from castsql.cli import main

    uri = start(str(tmp_path / "t"))
    rc = main(["update", uri, "--set", "id = 1", "--where", "id = 2", "--engine", "duckdb"])
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.err
    assert "table t: update: 1 key(s) are already in the table" in out.err and "id = 1" in out.err
    assert version(uri) == 1


# ---------------------------------------------------------------------- Spark


def test_spark_writes_keep_the_key_and_ignore_column_names(spark, tmp_path):
    """The same reproductions on Spark (one test: one table per case is cheap, a job is not)."""
    for i, (op, args, error, named) in enumerate(KEY_BREAKERS):
        uri = start(str(tmp_path / f"k{i}"))
        before = live(uri)
        engine = Spark(spark, uri)
        if error is None:
            _apply(engine, op, args)
            keys = ids(uri)
            assert None not in keys and len(keys) == len(set(keys)), (op, args)
            continue
        with pytest.raises(error) as e:
            _apply(engine, op, args)
        assert named in str(e.value) and "nothing was committed" in str(e.value), (op, args, str(e.value))
        assert live(uri) == before and version(uri) == 1, (op, args)
    schema = pa.schema([("id", pa.int64()), ("_pos", pa.int64()), ("filename", pa.int64())])
    uri = start(
        str(tmp_path / "names"), schema=schema, rows=pa.table({"id": [0, 1, 2, 3], "_pos": [3, 2, 1, 0],
                                                                "filename": [3, 2, 1, 0]})
    )  # fmt: skip
    s = Spark(spark, uri)
    assert s.delete("id = 0") == 2
    assert s.update({"_pos": "100"}, "id = 1") == 3
    assert s.merge(pa.table({"id": [2], "_pos": [7], "filename": [7]}), "id", [("matched_update", None, None)]) == 4
    assert [(r["id"], r["_pos"]) for r in live(uri)] == [(1, 100), (2, 7), (3, 0)]
    for j, clauses in enumerate(MERGES_WITHOUT_MATCHES):
        uri = start(str(tmp_path / f"m{j}"))
        Spark(spark, uri).merge(src([8, 9]), "id", clauses)
        got = ids(uri)
        assert len(got) == len(set(got)) and None not in got


def test_spark_racing_embedded_writers_keeps_the_key_at_every_version(spark, storage_root, s3_config):
    """Four embedded writers (threads, each its own session) and Spark write
    one table at once, with writes that move keys, insert computed keys and
    upsert overlapping keys; the losers are refused (DuplicateKey, NullKey) or
    give up (CommitConflict), and every version ever committed has a unique,
    non-NULL primary key."""
    import random

    from castsql.errors import CommitConflict

    uri = start(storage_root + "/race", s3_config, rows=src(list(range(20))))
    allowed = (DuplicateKey, NullKey, CommitConflict)
    failures: list[BaseException] = []

    def embedded(seed: int) -> None:
        rng = random.Random(seed)
        e = Embedded(uri, s3_config)
        for _ in range(6):
            k = rng.randrange(0, 40)
            kind = rng.randrange(5)
            try:
                if kind == 0:
                    e.append(src([k, k + 1]))
                elif kind == 1:
                    e.update({"id": f"id + {rng.randrange(1, 30)}"}, f"id = {k}")
                elif kind == 2:  # on v: the source's id moves the matched row's key
                    e.merge(src([k], vs=[f"s{k + 1}"]), "v", [("matched_update", None, None)])
                elif kind == 3:
                    upsert = [("matched_update", None, None), ("not_matched_insert", None, None)]
                    e.merge(src([k, k + 3]), "id", upsert)
                else:
                    e.merge(src([k]), "id", [("not_matched_insert", None, {"id": "source.id + 7"})])
            except allowed:
                pass
            except BaseException as exc:  # reported below
                failures.append(exc)

    threads = [threading.Thread(target=embedded, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    s = Spark(spark, uri, s3_config)
    upsert = [("matched_update", None, None), ("not_matched_insert", None, None)]
    computed = [("not_matched_insert", None, {"id": "source.id - 20", "v": "source.v"})]
    for op, args in (
        ("update", ({"id": "id + 11"}, "id % 7 = 0")),
        ("merge", (src([3, 5, 50]), "id", upsert)),
        ("merge", (src([30, 31]), "id", computed)),
    ):
        with contextlib.suppress(*allowed):
            getattr(s, op)(*args)
    for t in threads:
        t.join()
    assert not failures, failures
    last = version(uri, s3_config)
    assert last > 3
    for v in range(1, last + 1):
        keys = [r["id"] for r in live(uri, s3_config, v)]
        assert None not in keys and len(keys) == len(set(keys)), (v, sorted(k for k in keys if keys.count(k) > 1))


# ---------------------------------------------------------------------- found by a red-team pass


def test_a_number_rounded_into_a_float_column_is_refused(tmp_path):
    """Compared in the wider type, 2^53 + 1 rounded into a DOUBLE looked unchanged; it is compared back in its own."""
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("f", pa.float32())])
    rows = pa.table({"id": [1, 2], "x": [0.0, 0.0], "f": pa.array([0, 0], pa.float32())})
    uri = start(str(tmp_path / "t"), schema=schema, rows=rows)
    e = Embedded(uri)
    with pytest.raises(WriteError, match="9007199254740993 cannot be stored as DOUBLE unchanged"):
        e.update({"x": "9007199254740993::BIGINT"}, "id = 1")
    with pytest.raises(WriteError, match="16777217 cannot be stored as FLOAT unchanged"):
        e.update({"f": "16777217"}, "id = 1")
    with pytest.raises(MergeError, match="cannot be stored as DOUBLE unchanged"):
        e.merge(pa.table({"id": [2], "q": [2**53 + 1]}), "id", [("matched_update", None, {"x": "source.q"})])
    assert version(uri) == 1
    assert e.update({"x": "9007199254740992::BIGINT", "f": "16777216"}, "id = 1") == 2  # exact: stored


def test_a_quoted_column_name_is_read_by_a_keyed_merge(tmp_path):
    schema = pa.schema([("id", pa.int64()), ('a"b', pa.int64())])
    uri = start(str(tmp_path / "t"), schema=schema, rows=pa.table({"id": [1, 2], 'a"b': [10, 20]}))
    e = Embedded(uri)
    assert e.merge(pa.table({"id": [1, 2]}), "id", [("matched_delete", 'target."a""b" = 10', None)]) == 2
    assert [r["id"] for r in live(uri)] == [2]
    with pytest.raises(MergeError, match="Ambiguous reference"):  # as for any name both sides have
        e.merge(pa.table({"id": [2], 'a"b': [20]}), "id", [("matched_delete", '"a""b" = 20', None)])
    assert version(uri) == 2


def test_a_source_column_with_a_reserved_name_is_refused(tmp_path):
    uri = start(str(tmp_path / "t"))
    source = src([1, 3]).append_column("__castsql_sp", pa.array([None, None], pa.int64()))
    clauses = [("matched_update", None, {"v": "source.v"}), ("not_matched_by_source_delete", None, None)]
    with pytest.raises(MergeError, match="the source's column '__castsql_sp' has a reserved name"):
        Embedded(uri).merge(source, "id", clauses)
    assert version(uri) == 1


def test_several_source_rows_may_only_meet_one_unconditional_delete(tmp_path):
    """Delta's exception is one unconditional matched delete; a conditional one is refused like an update."""
    uri = start(str(tmp_path / "t"))
    e = Embedded(uri)
    with pytest.raises(MergeError, match=r"several source rows match one target row .*\(id=1\)"):
        e.merge(src([1, 1]), "id", [("matched_delete", "source.n > 5", None)])
    assert e.merge(src([1, 1]), "id", [("matched_delete", None, None)]) == 2 and ids(uri) == [2, 3]
