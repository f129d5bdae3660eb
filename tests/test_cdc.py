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
