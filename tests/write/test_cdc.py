"""CDC as it is delivered (issue 52): batches out of order and at least once,
ties, batch ids, partial changes, Debezium's envelope, bad input, crashes,
racing writers — on the embedded engine, on Spark and on the command line,
each judged by the model of tests/support/cdc_model.py (the highest-ranked change
of each key; a delete leaves the key absent)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdc_model import SCHEMA, arrow, deliveries, history, model, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import REPO, SUPPORT

import castsql
from castsql.errors import CastSQLError, CommitConflict
from castsql.format import TableLog
from castsql.storage import open_storage
from castsql.write.cdc import latest_per_key
from castsql.write.garbage import gc

CDC = {"key": "id", "op_column": "op", "sequence": "seq"}


def _table(path: str, **properties: str) -> castsql.Table:
    castsql.write_table(path, SCHEMA.empty_table(), primary_key="id")
    t = castsql.open(path)
    if properties:
        t.set_properties(properties)
    return t


def _objects(path: str) -> set[str]:
    return {str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file()}


# ---------------------------------------------------------------------- delivery order, replays, ties


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), size=st.integers(1, 12))
def test_any_delivery_order_with_replays_ends_as_the_model(tmp_path_factory, seed, n, size):
    rng = random.Random(seed)
    changes = history(rng, n)
    t = _table(str(tmp_path_factory.mktemp("cdc") / "t"))
    try:
        for b in deliveries(rng, changes, size):
            t.apply_cdc(arrow(b), **CDC)
        assert rows(t.to_arrow()) == model(changes)
    finally:
        t.close()


def test_a_late_change_does_not_roll_a_row_back_and_a_deleted_key_stays_deleted(tmp_path):
    t = _table(str(tmp_path / "t"))
    t.apply_cdc(arrow([{"id": 1, "seq": 10, "name": "new", "score": 1.0, "op": "U"}]), **CDC)
    late = t.apply_cdc(arrow([{"id": 1, "seq": 5, "name": "old", "score": 0.0, "op": "U"}]), **CDC)
    assert late.version is None and late.num_changes_stale == 1 and late.num_changes_applied == 0
    d = t.apply_cdc(arrow([{"id": 2, "seq": 5, "name": None, "score": None, "op": "D"}]), **CDC)
    # A delete of a key the table does not hold is applied: its marker is kept, in a version.
    assert d.version == 2 and d.num_changes_applied == 1 and d.num_delete_markers_added == 1
    back = arrow(
        [
            {"id": 2, "seq": 1, "name": "a", "score": 1.0, "op": "I"},
            {"id": 2, "seq": 3, "name": "b", "score": 2.0, "op": "U"},
        ]
    )
    m = t.apply_cdc(back, **CDC)
    assert (m.version, m.num_changes, m.num_changes_superseded, m.num_changes_stale) == (None, 1, 1, 1)
    assert rows(t.to_arrow()) == {1: (10, "new", 1.0)}
    t.close()


def test_ties_are_decided_by_the_documented_rule(tmp_path):
    """Equal sequences of one key: a delete outranks an upsert; between two
    upserts, the greater values (NULL lowest); the same across batches."""
    t = _table(str(tmp_path / "t"))
    batch = [
        {"id": 1, "seq": 5, "name": "upd", "score": 1.0, "op": "U"},
        {"id": 1, "seq": 5, "name": None, "score": None, "op": "D"},
        {"id": 4, "seq": 2, "name": "y1", "score": 1.0, "op": "U"},
        {"id": 4, "seq": 2, "name": "y2", "score": None, "op": "U"},
        {"id": 6, "seq": 2, "name": None, "score": 3.0, "op": "U"},
    ]
    t.apply_cdc(arrow(batch), **CDC)
    assert rows(t.to_arrow()) == {4: (2, "y2", None), 6: (2, None, 3.0)}
    for r in (*batch, {"id": 6, "seq": 2, "name": "z", "score": None, "op": "U"}):  # one by one, reversed
        t.apply_cdc(arrow([r]), **CDC)
    assert rows(t.to_arrow()) == {4: (2, "y2", None), 6: (2, "z", None)}
    t.close()


@pytest.mark.spark
def test_spark_the_embedded_engine_and_the_model_agree(spark, tmp_path):
    """Seeded histories full of ties, delivered shuffled with repeats, each
    batch cut into Spark partitions at random: after every delivery both
    engines hold the same rows, and at the end the model's."""
    from castsql.spark import cdc_merge

    for seed in (3, 11):
        rng = random.Random(seed)
        changes = history(rng, 36, keys=6, seqs=5)
        a, b = str(tmp_path / f"spark{seed}"), str(tmp_path / f"embedded{seed}")
        embedded = _table(b)
        castsql.write_table(a, SCHEMA.empty_table(), primary_key="id")
        for batch in deliveries(rng, changes, 6):
            df = spark.createDataFrame(arrow(batch)).repartition(rng.randint(1, 4))
            ma = cdc_merge(spark, a, df, **CDC)
            mb = embedded.apply_cdc(arrow(batch), **CDC)
            assert (ma.version, ma.num_changes_applied, ma.num_changes_stale) == (
                mb.version, mb.num_changes_applied, mb.num_changes_stale,
            )  # fmt: skip
            with castsql.open(a) as ta:
                assert rows(ta.to_arrow()) == rows(embedded.to_arrow())
        assert rows(embedded.to_arrow()) == model(changes)
        embedded.close()


@pytest.mark.parametrize("engine", ["duckdb", pytest.param("spark", marks=pytest.mark.spark)])
def test_the_cli_applies_batches_in_any_order(tmp_path, capsys, engine, request):
    """``castsql merge --op-column --sequence``, four files of one key
    delivered as delete@5, update@3, insert@1, update@3: the key stays deleted."""
    from castsql.cli import main

    if engine == "spark":
        request.getfixturevalue("spark")
    uri = str(tmp_path / "t")
    castsql.write_table(
        uri, pa.table({"id": [1, 2], "v": ["a", "b"], "seq": pa.array([0, 0], pa.int64())}), primary_key="id"
    )
    files = []
    for n, (op, seq, v) in enumerate([("D", 5, None), ("U", 3, "u3"), ("I", 1, "i1"), ("U", 3, "u3")]):
        path = tmp_path / f"b{n}.parquet"
        pq.write_table(pa.table({"id": [1], "v": pa.array([v], pa.string()), "op": [op], "seq": [seq]}), path)
        files.append(str(path))
    outs = []
    for f in files:
        assert (
            main(
                ["merge", uri, "--from", f, "--on", "id", "--op-column", "op", "--sequence", "seq", "--engine", engine]
            )
            == 0
        )
        outs.append(capsys.readouterr().out)
    assert "changes: 1 applied, 0 stale" in outs[0] and "nothing committed" in outs[1], outs
    with castsql.open(uri) as t:
        assert t.to_arrow().to_pylist() == [{"id": 2, "v": "b", "seq": 0}]


def test_latest_per_key_orders_by_the_sequence_not_by_arrival():
    batch = pa.table({"id": [1, 2, 1, 1, None, None], "seq": [5, 1, 9, 7, 1, 2], "v": list("abcdef")})
    got = latest_per_key(batch, "id", "seq").to_pylist()
    assert [(r["id"], r["v"]) for r in got] == [(1, "c"), (2, "b"), (None, "f")]


def test_a_sequence_of_several_columns_compares_them_in_order(tmp_path):
    p = str(tmp_path / "t")
    castsql.write_table(
        p, pa.schema([("id", pa.int64()), ("part", pa.int32()), ("off", pa.int64()), ("v", pa.string())]).empty_table(),
        primary_key="id",
    )  # fmt: skip
    t = castsql.open(p)
    seq = {"key": "id", "op_column": "op", "sequence": ["part", "off"]}

    def change(part: int, off: int, v: str, op: str = "U") -> pa.Table:
        return pa.table({"id": [1], "part": pa.array([part], pa.int32()), "off": [off], "v": [v], "op": [op]})

    t.apply_cdc(change(1, 100, "p1"), **seq)
    t.apply_cdc(change(0, 999, "p0"), **seq)  # a lower first column: older, whatever the second
    t.apply_cdc(change(1, 101, "next"), **seq)
    assert t.to_arrow().column("v").to_pylist() == ["next"]
    t.apply_cdc(change(2, 0, "", "D"), **seq)
    t.apply_cdc(change(1, 500, "late"), **seq)
    assert t.to_arrow().num_rows == 0
    t.close()


# ---------------------------------------------------------------------- batch ids


def test_a_batch_id_at_or_below_the_last_one_commits_nothing(tmp_path):
    t = _table(str(tmp_path / "t"))
    first = arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}])
    assert t.apply_cdc(first, **CDC, app_id="orders", batch_id=7).version == 1
    # Another writer's change; then batch 7 again (a replay) and batch 5 (older): nothing.
    t.apply_cdc(arrow([{"id": 1, "seq": 9, "name": "z", "score": 0.0, "op": "U"}]), **CDC)
    for b in (7, 5):
        m = t.apply_cdc(
            arrow([{"id": 2, "seq": 1, "name": "b", "score": 1.0, "op": "I"}]), **CDC, app_id="orders", batch_id=b
        )
        assert m.batch_replayed and m.version is None and m.num_changes_applied == 0
    assert t.apply_cdc(first, **CDC, app_id="other", batch_id=7).num_changes_stale == 1  # another app's batch 7
    hist = {r["version"]: r for r in t.history().to_pylist()}
    log = TableLog(open_storage(t.uri))
    assert log.manifest(1).summary["stream_batch"] == 7 and log.latest().streams == {"orders": 7}
    assert len(hist) == 3
    t.close()


@pytest.mark.s3
def test_a_replayed_batch_on_s3_reads_the_pointer_and_one_manifest(s3_server, s3_root):
    import dataclasses

    from faultproxy import FaultProxy

    uri = f"{s3_root}/t"
    castsql.write_table(uri, SCHEMA.empty_table(), primary_key="id", s3=s3_server.config)
    batch = arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}])
    with castsql.open(uri, s3=s3_server.config) as t:
        t.apply_cdc(batch, **CDC, app_id="feed", batch_id=0)
    proxy = FaultProxy(s3_server.ports["s3"], rate=0)
    proxy.start()
    try:
        with castsql.open(uri, s3=dataclasses.replace(s3_server.config, endpoint_url=proxy.endpoint_url)) as t:
            proxy.requests.clear()
            assert t.apply_cdc(batch, **CDC, app_id="feed", batch_id=0).batch_replayed
            got = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in proxy.requests]
    finally:
        proxy.stop()
    assert [m for m, _ in got] == ["GET"] * len(got), got  # writes nothing
    assert [p for _, p in got if p.startswith("_latest")] == ["_latest_manifest"], got
    assert len([p for _, p in got if p.endswith(".json")]) <= 1, got


@pytest.mark.spark
def test_batch_ids_on_spark_cdc_merge_and_format_castsql(spark, tmp_path):
    from castsql.spark import cdc_merge

    uri = str(tmp_path / "t")
    castsql.write_table(uri, SCHEMA.empty_table(), primary_key="id")
    df = spark.createDataFrame(arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}]))
    assert cdc_merge(spark, uri, df, **CDC, app_id="feed", batch_id=3).version == 1
    again = cdc_merge(spark, uri, df, **CDC, app_id="feed", batch_id=2)
    assert again.batch_replayed and again.version is None
    rows_df = spark.createDataFrame(pa.table({"id": [5], "seq": [1], "name": ["x"], "score": [1.0]}))
    for _ in range(2):  # Delta's idempotent batch writes: txnAppId / txnVersion
        rows_df.write.format("castsql").mode("append").option("txnAppId", "loader").option("txnVersion", 4).save(uri)
    log = TableLog(open_storage(uri))
    assert log.latest().version == 2 and log.latest().streams == {"feed": 3, "loader": 4}
    with pytest.raises(Exception, match="txnAppId and txnVersion together"):
        rows_df.write.format("castsql").mode("append").option("txnAppId", "loader").save(uri)


def test_the_cli_names_its_batches(tmp_path, capsys):
    from castsql.cli import main

    uri = str(tmp_path / "t")
    castsql.write_table(uri, SCHEMA.empty_table(), primary_key="id")
    f = tmp_path / "b.parquet"
    pq.write_table(arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}]), f)
    args = ["merge", uri, "--from", str(f), "--on", "id", "--op-column", "op", "--sequence", "seq", "--app-id", "feed"]
    assert main([*args, "--batch-id", "0"]) == 0
    assert "committed version 1" in capsys.readouterr().out
    assert main([*args, "--batch-id", "0"]) == 0
    assert "already committed" in capsys.readouterr().out
    assert main([*args, "--batch-id", "-1"]) == 1
    assert "batch_id must be an integer >= 0, got -1" in capsys.readouterr().err
    assert main(["merge", uri, "--from", str(f), "--on", "id", "--batch-id", "3"]) == 2
    assert "--batch-id goes with a CDC batch" in capsys.readouterr().err


# ---------------------------------------------------------------------- bad input


BAD = {
    "null sequence": (
        arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"},
               {"id": 2, "seq": None, "name": "b", "score": 2.0, "op": "I"}]),
        {}, r"sequence column 'seq' is NULL in the change of key \(id\) = \(2\)",
    ),
    "a sequence of another type": (
        pa.table({"id": [1], "seq": ["x"], "name": ["a"], "score": [1.0], "op": ["I"]}),
        {}, r"column 'seq' is string in the data, the table has int64",
    ),
    "an unknown operation": (
        pa.table({"id": [1, 3], "seq": [1, 2], "name": ["a", "b"], "score": [1.0, 2.0], "op": ["I", "X"]}),
        {}, r"operation column 'op' holds 'X' in the change of key \(id\) = \(3\), which is neither an upsert",
    ),
    "a NULL operation": (
        pa.table({"id": [4], "seq": [1], "name": ["a"], "score": [1.0], "op": pa.array([None], pa.string())}),
        {}, r"operation column 'op' is NULL in the change of key \(id\) = \(4\)",
    ),
    "a NULL key": (
        pa.table({"id": pa.array([None], pa.int64()), "seq": [1], "name": ["a"], "score": [1.0], "op": ["I"]}),
        {}, r"key column 'id' is NULL in a change",
    ),
    "a negative batch id": (
        pa.table({"id": [1], "seq": [1], "name": ["a"], "score": [1.0], "op": ["I"]}),
        {"app_id": "feed", "batch_id": -1}, r"batch_id must be an integer >= 0, got -1",
    ),
    "a batch id without its app": (
        pa.table({"id": [1], "seq": [1], "name": ["a"], "score": [1.0], "op": ["I"]}),
        {"batch_id": 3}, r"give app_id and batch_id together",
    ),
    "a sequence the table lacks": (
        pa.table({"id": [1], "lsn": [1], "seq": [1], "name": ["a"], "score": [1.0], "op": ["I"]}),
        {"sequence": "lsn"}, r"sequence column 'lsn' is not a column of the table; a row keeps the sequence",
    ),
    "a missing column": (
        pa.table({"id": [1], "seq": [1], "name": ["a"], "op": ["I"]}), {},
        r"table column 'score' is missing from the batch \(partial=True keeps",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_naming_the_column_and_commits_nothing(tmp_path, case):
    batch, options, message = BAD[case]
    path = str(tmp_path / "t")
    t = _table(path)
    t.apply_cdc(arrow([{"id": 9, "seq": 1, "name": "z", "score": 0.0, "op": "D"}]), **CDC)  # pins key and sequence
    before = _objects(path)
    with pytest.raises(CastSQLError) as e:
        t.apply_cdc(batch, **{**CDC, **options})
    assert len(str(e.value).splitlines()) == 1, str(e.value)
    assert re.search(message, str(e.value)), str(e.value)
    assert _objects(path) == before and TableLog(open_storage(path)).latest().version == 1
    t.close()


def test_a_table_ordered_by_a_sequence_refuses_batches_without_it_or_with_another(tmp_path):
    p = str(tmp_path / "t")
    castsql.write_table(p, SCHEMA.append(pa.field("lsn", pa.int64())).empty_table(), primary_key="id")
    t = castsql.open(p)
    rec = {"id": 1, "seq": 1, "lsn": 1, "name": "a", "score": 1.0, "op": "I"}
    t.apply_cdc(pa.Table.from_pylist([rec]), **CDC)
    with pytest.raises(
        CastSQLError,
        match=r"by key \(id\) and sequence \(seq\); this batch names key \(id\) and sequence \(lsn\)",
    ):
        t.apply_cdc(pa.Table.from_pylist([rec]), key="id", op_column="op", sequence="lsn")
    with pytest.raises(CastSQLError, match=r"orders CDC changes by sequence \(seq\); give sequence="):
        t.apply_cdc(pa.Table.from_pylist([rec]), key="id", op_column="op")
    assert t.at().version == 1
    t.close()


def test_a_nan_sequence_is_refused(tmp_path):
    p = str(tmp_path / "t")
    castsql.write_table(p, pa.schema([("id", pa.int64()), ("ts", pa.float64())]).empty_table(), primary_key="id")
    with (
        castsql.open(p) as t,
        pytest.raises(CastSQLError, match=r"column 'ts' is NaN in the change of key \(id\) = \(1\)"),
    ):
        t.apply_cdc(pa.table({"id": [1], "ts": [float("nan")], "op": ["U"]}), key="id", op_column="op", sequence="ts")


def test_merge_schema_adds_the_sequence_in_the_batchs_version(tmp_path):
    """A table without the sequence column: merge_schema adds it in the
    version that applies the batch, deletes' markers included."""
    p = str(tmp_path / "t")
    castsql.write_table(p, pa.table({"id": [1, 2], "v": ["a", "b"]}), primary_key="id")
    with castsql.open(p) as t:
        batch = pa.table({"id": [1, 2], "v": ["x", None], "op": ["U", "D"], "lsn": [5, 6]})
        m = t.apply_cdc(batch, key="id", op_column="op", sequence="lsn", merge_schema=True)
        assert m.version == 2 and t.to_arrow().to_pylist() == [{"id": 1, "v": "x", "lsn": 5}]
        late = pa.table({"id": [2], "v": ["late"], "op": ["I"], "lsn": [3]})
        assert t.apply_cdc(late, key="id", op_column="op", sequence="lsn").num_changes_stale == 1


# ---------------------------------------------------------------------- partial changes, Debezium


def test_partial_changes_keep_the_stored_values(tmp_path):
    t = _table(str(tmp_path / "t"))
    t.apply_cdc(arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}]), **CDC)
    only_score = pa.table({"id": [1, 2], "seq": [2, 2], "score": [5.0, 6.0], "op": ["U", "I"]})
    t.apply_cdc(only_score, **CDC, partial=True)
    assert rows(t.to_arrow()) == {1: (2, "a", 5.0), 2: (2, None, 6.0)}
    # A placeholder keeps the stored value; two changes of one key in a batch fold.
    ph = "__debezium_unavailable_value"
    batch = arrow([
        {"id": 1, "seq": 3, "name": "b", "score": None, "op": "U"},
        {"id": 1, "seq": 4, "name": ph, "score": 7.0, "op": "U"},
        {"id": 2, "seq": 3, "name": ph, "score": 8.0, "op": "U"},
    ])  # fmt: skip
    t.apply_cdc(batch, **CDC, unavailable=ph)
    assert rows(t.to_arrow()) == {1: (4, "b", 7.0), 2: (3, None, 8.0)}
    with pytest.raises(CastSQLError, match="table column 'name' is missing from the batch"):
        t.apply_cdc(only_score, **CDC)
    t.close()


def _event(op: str, before: dict | None, after: dict | None, lsn: int, ts: int) -> dict:
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn, "txId": lsn // 10}, "ts_ms": ts}


DEBEZIUM = [
    {"schema": {"type": "struct"}, "payload": _event("r", None, {"id": 1, "name": "a", "note": "long text"}, 100, 1)},
    _event("c", None, {"id": 2, "name": "b", "note": "x"}, 120, 2),
    _event("u", None, {"id": 1, "name": "a2", "note": "__debezium_unavailable_value"}, 130, 3),
    None,  # a tombstone record
    _event("d", {"id": 2, "name": None, "note": None}, None, 140, 4),
    _event("c", None, {"id": 2, "name": "late", "note": "y"}, 110, 5),
]
DEBEZIUM_TABLE = {1: {"id": 1, "name": "a2", "note": "long text", "_event_lsn": 130}}


def _debezium_table(path: str) -> None:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("note", pa.string()), ("_event_lsn", pa.int64())])
    castsql.write_table(path, schema.empty_table(), primary_key="id")


def test_debezium_events_apply_as_they_come(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in DEBEZIUM) + "\n")
    uri = str(tmp_path / "t")
    _debezium_table(uri)
    with castsql.open(uri) as t:
        m = t.apply_cdc(str(path), key="id", format="debezium")
        assert (m.num_source_rows, m.num_changes, m.num_changes_applied) == (5, 2, 2)
        assert {r["id"]: r for r in t.to_arrow().to_pylist()} == DEBEZIUM_TABLE
        # The flattened envelope, as an Arrow table, replayed: stale.
        flat = pa.Table.from_pylist([e.get("payload", e) for e in DEBEZIUM if e is not None])
        assert t.apply_cdc(flat, key="id", format="debezium").num_changes_stale == 2
    with pytest.raises(CastSQLError, match="event 0 has op 't'; CastSQL applies c, u, r"):
        castsql.open(uri).apply_cdc([{"op": "t", "source": {"lsn": 1}}], key="id", format="debezium")


@pytest.mark.parametrize("engine", ["duckdb", pytest.param("spark", marks=pytest.mark.spark)])
def test_the_cli_reads_debezium_events(tmp_path, capsys, engine, request):
    from castsql.cli import main

    if engine == "spark":
        request.getfixturevalue("spark")
    path = tmp_path / "events.json"  # one form per file, as a topic's converter writes them: no wrapper
    path.write_text("\n".join(json.dumps(e.get("payload", e)) for e in DEBEZIUM if e is not None) + "\n")
    uri = str(tmp_path / "t")
    _debezium_table(uri)
    assert main(["merge", uri, "--from", str(path), "--format", "debezium", "--on", "id", "--engine", engine]) == 0, (
        capsys.readouterr()
    )
    assert "changes: 2 applied" in capsys.readouterr().out
    with castsql.open(uri) as t:
        assert {r["id"]: r for r in t.to_arrow().to_pylist()} == DEBEZIUM_TABLE


# ---------------------------------------------------------------------- delete markers over time


def test_delete_markers_are_merged_kept_by_gc_and_expire_by_retention(tmp_path):
    from castsql.format.markers import FANOUT, INLINE_MAX

    path = str(tmp_path / "t")
    t = _table(path)
    n = 40 * 10
    for b in range(40):  # deletes of keys the table lacks: remembered, inline, then in objects merged by tiers
        t.apply_cdc(
            arrow([{"id": i, "seq": 10, "name": None, "score": None, "op": "D"} for i in range(b * 10, b * 10 + 10)]),
            **CDC,
        )
    state = TableLog(open_storage(path)).latest().cdc
    assert sum(r.entries for r in state.markers) + len(state.inline) == n
    assert len(state.inline) <= INLINE_MAX and 0 < len(state.markers) < FANOUT  # eight objects were merged
    report = gc(path, keep_versions=1, grace=timedelta(0))
    assert any(k.startswith("cdc/") for k in report.removed_metadata)  # merged-away objects only
    late = arrow([{"id": i, "seq": 1, "name": "late", "score": 1.0, "op": "I"} for i in range(n)])
    assert t.apply_cdc(late, **CDC).num_changes_stale == n  # the markers outlived the versions that wrote them
    # Retention: markers older than castsql.cdc.deleteRetention go (any commit drops inline ones and objects
    # whose every marker is that old, a compaction the rest); then a late change lands.
    t.set_properties({"castsql.cdc.deleteRetention": "0 seconds"})
    t.compact()
    state = TableLog(open_storage(path)).latest().cdc
    assert not state.markers and not state.inline
    assert t.apply_cdc(late, **CDC).num_changes_applied == n
    t.close()


def test_a_restore_takes_the_restored_versions_markers(tmp_path):
    path = str(tmp_path / "t")
    t = _table(path)
    t.apply_cdc(arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "I"}]), **CDC)
    t.apply_cdc(arrow([{"id": 1, "seq": 5, "name": None, "score": None, "op": "D"}]), **CDC)
    log = TableLog(open_storage(path))
    log.restore(1)
    with castsql.open(path) as again:
        assert rows(again.to_arrow()) == {1: (1, "a", 1.0)}
        assert (
            again.apply_cdc(arrow([{"id": 1, "seq": 3, "name": "b", "score": 1.0, "op": "U"}]), **CDC).version
            is not None
        )
    t.close()


# ---------------------------------------------------------------------- racing writers, crashes


def test_racing_writers_end_as_the_model(tmp_path):
    """Three writers apply the shuffled batches of one history (with repeats)
    at once: conflicts make them plan again (a delete's marker against an
    insert of its key included), and the table ends as the model."""
    rng = random.Random(5)
    changes = history(rng, 90, keys=10, seqs=12)
    path = str(tmp_path / "t")
    _table(path).close()
    parts = deliveries(rng, changes, 5)
    errors = []

    def writer(batches: list) -> None:
        with castsql.open(path) as t:
            for b in batches:
                for _ in range(20):
                    try:
                        t.apply_cdc(arrow(b), **CDC)
                        break
                    except CommitConflict:
                        continue
                else:
                    errors.append("conflicted 20 times")

    threads = [threading.Thread(target=writer, args=(parts[i::3],)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    with castsql.open(path) as t:
        assert rows(t.to_arrow()) == model(changes)


CRASH_STEPS = ["data:after", "tombstone:after", "cdc:after", "manifest:before", "manifest:after", "pointer:before"]


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_killed_consumer_restarted_from_its_last_batch_ends_as_the_model(tmp_path, step):
    rng = random.Random(8)
    if step.startswith("cdc"):
        # Deletes enough that a batch folds the inline markers into an object (the step killed).
        changes = [{**c, "op": "D" if i % 3 else c["op"]} for i, c in enumerate(history(rng, 120, keys=60, seqs=200))]
    else:
        changes = history(rng, 60, keys=6, seqs=20)
    batches = deliveries(rng, changes, 6 if not step.startswith("cdc") else 20)
    uri = str(tmp_path / "t")
    _table(uri).close()
    feed = tmp_path / "batches.json"
    feed.write_text(json.dumps(batches))
    worker = [sys.executable, str(SUPPORT / "cdc_worker.py"), uri, str(feed)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([*worker, "0", step, "1"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == -9, r.stderr[-2000:]  # killed at that step, in the second batch or a later one
    done = TableLog(open_storage(uri)).latest().streams.get("feed", -1)
    assert done < len(batches) - 1
    # Resume one batch before the last committed one: at least once.
    r = subprocess.run([*worker, str(max(done - 1, 0))], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with castsql.open(uri) as t:
        assert rows(t.to_arrow()) == model(changes)


# ---------------------------------------------------------------------- found by a red-team pass (each failed before)


def test_an_unchanged_placeholder_keeps_the_stored_value_in_a_batch_without_ties(tmp_path):
    t = _table(str(tmp_path / "t"))
    ph = "__debezium_unavailable_value"
    t.apply_cdc(arrow([{"id": 1, "seq": 10, "name": "big", "score": 1.0, "op": "i"}]), **CDC, unavailable=ph)
    t.apply_cdc(arrow([{"id": 1, "seq": 20, "name": ph, "score": 2.0, "op": "u"}]), **CDC, unavailable=ph)
    assert rows(t.to_arrow()) == {1: (20, "big", 2.0)}
    t.close()


def test_an_empty_batch_commits_nothing(tmp_path):
    t = _table(str(tmp_path / "t"))
    m = t.apply_cdc(arrow([]), **CDC)
    assert (m.version, m.num_source_rows) == (None, 0)
    assert t.apply_cdc([None, {"op": None, "before": None, "after": None}], key="id", format="debezium").version is None
    t.close()


def test_float_keys_and_sequences_infinite_or_signed_zero(tmp_path):
    p = str(tmp_path / "t")
    castsql.write_table(p, pa.schema([("k", pa.float64()), ("s", pa.float64()), ("v", pa.string())]).empty_table())
    with castsql.open(p) as t:
        fcdc = {"key": "k", "op_column": "op", "sequence": "s"}
        t.apply_cdc(
            pa.table({"k": [float("inf"), 0.0], "s": [float("inf"), 9.0], "v": [None, None], "op": ["d", "d"]}), **fcdc
        )
        t.apply_cdc(pa.table({"k": [-0.0, 5.0], "s": [1.0, 1.0], "v": ["back", "new"], "op": ["i", "i"]}), **fcdc)
        assert t.to_arrow().to_pylist() == [{"k": 5.0, "s": 1.0, "v": "new"}]  # -0.0 is the deleted key 0.0
        t.append(pa.table({"k": [7.0], "s": [1.0], "v": ["x"]}))  # the table is still written to


def test_the_placeholder_never_stands_for_a_key_or_a_sequence(tmp_path):
    p = str(tmp_path / "t")
    castsql.write_table(
        p, pa.schema([("k", pa.string()), ("s", pa.string()), ("v", pa.string())]).empty_table(), primary_key="k"
    )
    with castsql.open(p) as t:
        ph = "-"
        t.apply_cdc(
            pa.table({"k": ["-"], "s": ["-"], "v": ["a"], "op": ["i"]}),
            key="k",
            op_column="op",
            sequence="s",
            unavailable=ph,
        )
        assert t.to_arrow().to_pylist() == [{"k": "-", "s": "-", "v": "a"}]


def _one(**extra) -> pa.Table:
    return pa.table({"id": [1], "seq": [1], "name": ["a"], "score": [1.0], **extra})


@pytest.mark.parametrize(
    ("batch", "options", "message"),
    [
        (_one(op=["i"], OP=["d"]), {}, "two columns named 'OP'"),
        (_one(_castsql_del=["i"]), {"op_column": "_castsql_del"}, "reserved name"),
        (_one(op=["i"]), {"delete_values": [None]}, "must be texts"),
        (_one(extra=[1], op=["i"]), {}, "column 'extra' is not a column of the table"),
        (_one(op=["x"]).set_column(2, "name", pa.array(["a\nb" * 100])), {}, "holds 'x'"),
    ],
)
def test_more_bad_input_is_one_line(tmp_path, batch, options, message):
    t = _table(str(tmp_path / "t"))
    with pytest.raises(CastSQLError, match=message) as e:
        t.apply_cdc(batch, **{**CDC, **options})
    assert len(str(e.value).splitlines()) == 1 and t.at().version == 0
    t.close()


def test_a_retention_past_a_century_is_refused(tmp_path):
    t = _table(str(tmp_path / "t"))
    with pytest.raises(CastSQLError, match="at most 100 years"):
        t.set_properties({"castsql.cdc.deleteRetention": "1000000 days"})
    t.close()


def test_debezium_times_by_the_events_schema_and_snapshot_events_without_an_lsn(tmp_path):
    from datetime import datetime

    from castsql.write.debezium import read_debezium

    times = [{"field": "ts", "name": "io.debezium.time.MicroTimestamp"},
             {"field": "ns", "name": "io.debezium.time.NanoTimestamp"}]  # fmt: skip
    schema = {"fields": [{"field": "after", "fields": times}]}
    ev = [{"schema": schema, "payload": {"op": "r", "after": {"id": 1, "ts": 86_400_000_000, "ns": 86_400_000_000_000},
           "source": {"commit_lsn": "0001", "change_lsn": None, "event_serial_no": None}}},
          {"schema": schema, "payload": {"op": "u", "after": {"id": 1, "ts": -1, "ns": 0},
           "source": {"commit_lsn": "0002", "change_lsn": "0002:1", "event_serial_no": 1}}}]  # fmt: skip
    tz = pa.timestamp("us", tz="UTC")
    b = read_debezium(ev, pa.schema([("id", pa.int64()), ("ts", tz), ("ns", tz)]))
    assert b.sequence == ("_event_commit_lsn", "_event_change_lsn", "_event_serial_no")
    got = b.table.to_pylist()
    assert got[0]["ts"] == got[0]["ns"] == datetime.fromisoformat("1970-01-02T00:00:00+00:00")
    assert got[1]["ts"] == datetime.fromisoformat("1969-12-31T23:59:59.999999+00:00")
    assert (got[0]["_event_change_lsn"], got[0]["_event_serial_no"]) == ("", 0)  # a snapshot's: lowest


def test_a_debezium_delete_that_carries_the_key_alone_applies(tmp_path):
    uri = str(tmp_path / "t")
    _debezium_table(uri)
    with castsql.open(uri) as t:
        t.apply_cdc([_event("c", None, {"id": 3, "name": "c", "note": "n"}, 10, 1)], key="id", format="debezium")
        t.apply_cdc([_event("d", {"id": 3}, None, 11, 2)], key="id", format="debezium")
        assert t.to_arrow().num_rows == 0


def test_the_cli_refuses_a_plain_merge_with_a_sequence_on_a_cdc_table(tmp_path, capsys):
    from castsql.cli import main

    uri = str(tmp_path / "t")
    t = _table(uri)
    t.apply_cdc(arrow([{"id": 1, "seq": 5, "name": None, "score": None, "op": "D"}]), **CDC)
    f = tmp_path / "b.parquet"
    pq.write_table(arrow([{"id": 1, "seq": 1, "name": "a", "score": 1.0, "op": "d"}]).drop_columns(["op"]), f)
    assert main(["merge", uri, "--from", str(f), "--on", "id", "--sequence", "seq"]) == 2
    assert "give --op-column" in capsys.readouterr().err and t.at().version == 1
    t.close()
