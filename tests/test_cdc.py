"""A random CDC feed applied batch by batch with the embedded engine equals
an independent Python model at every version, batches touching one key
several times included (the last change by the sequence column wins)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import castsql
from castsql.format import TableLog
from castsql.storage import open_storage
from castsql.write.cdc import apply_cdc, latest_per_key

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def feed(rng: random.Random, batches: int, keys: int):
    seq = 0
    for _ in range(batches):
        rows = []
        for _ in range(rng.randint(1, 25)):
            seq += 1
            op = rng.choice(["I", "U", "U", "D"])
            k = rng.randrange(keys)
            rows.append({"id": k, "name": f"n{seq}", "score": rng.random(), "op": op, "seq": seq})
        rng.shuffle(rows)  # arrival order is not sequence order
        yield rows


def apply_model(model: dict[int, tuple], rows: list[dict]) -> None:
    last: dict[int, dict] = {}
    for r in sorted(rows, key=lambda r: r["seq"]):
        last[r["id"]] = r
    for k, r in last.items():
        if r["op"] == "D":
            model.pop(k, None)
        else:
            model[k] = (r["name"], r["score"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_cdc_feed_equals_the_model_at_every_version(tmp_path, seed):
    rng = random.Random(seed)
    st = open_storage(str(tmp_path / f"cdc{seed}"))
    TableLog.create(st, SCHEMA, primary_key="id")
    t = castsql.open(st.root)
    model: dict[int, tuple] = {}
    at: dict[int, dict[int, tuple]] = {0: {}}
    for batch in feed(rng, batches=12, keys=30):
        src = pa.Table.from_pylist(batch)
        m = apply_cdc(t, src, key="id", op_column="op", sequence="seq")
        apply_model(model, batch)
        if m.version is not None:
            at[m.version] = dict(model)
        else:
            assert model == at[max(at)]  # nothing changed: no version
    for v, want in at.items():
        got = t.at(version=v).to_arrow().to_pylist()
        assert len(got) == len({r["id"] for r in got}), f"version {v}: duplicate key"
        assert {r["id"]: (r["name"], r["score"]) for r in got} == want, f"version {v}"
    t.close()


def test_latest_per_key_orders_by_the_sequence_not_by_arrival():
    batch = pa.table({"id": [1, 2, 1, 1, None, None], "seq": [5, 1, 9, 7, 1, 2], "v": list("abcdef")})
    got = latest_per_key(batch, "id", "seq").to_pylist()
    assert [(r["id"], r["v"]) for r in got] == [(1, "c"), (2, "b"), (None, "f")]


@pytest.mark.parametrize("engine", ["duckdb", pytest.param("spark", marks=pytest.mark.spark)])
def test_the_cli_applies_a_cdc_file(tmp_path, capsys, engine, request):
    """``castsql merge --op-column --sequence`` does what apply_cdc does: the
    last change of each key wins, deletes delete, a delete of an absent key
    inserts nothing, and the op and sequence columns are not stored."""
    import pyarrow.parquet as pq

    from castsql.cli import main

    if engine == "spark":
        request.getfixturevalue("spark")  # the session the suite shares
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), primary_key="id")
    feed = pa.table(
        {
            "id": [1, 1, 2, 4, 5],
            "v": ["x", "y", None, "n", "z"],
            "op": ["U", "U", "D", "I", "D"],
            "seq": [2, 3, 1, 4, 5],
        }
    )
    pq.write_table(feed, tmp_path / "feed.parquet")
    args = ["merge", uri, "--from", str(tmp_path / "feed.parquet"), "--on", "id", "--op-column", "op"]
    assert main([*args, "--sequence", "seq", "--engine", engine]) == 0
    assert "1 inserted, 1 updated, 1 deleted (4 source row(s))" in capsys.readouterr().out
    with castsql.open(uri) as t:
        got = t.to_arrow().sort_by("id")
    assert got.column_names == ["id", "v"] and got.to_pylist() == [
        {"id": 1, "v": "y"},
        {"id": 3, "v": "c"},
        {"id": 4, "v": "n"},
    ]
    assert main([*args, "--no-insert", "--engine", engine]) == 2
    assert "--op-column makes the clauses itself; it does not go with --no-insert" in capsys.readouterr().err
