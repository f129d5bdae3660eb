"""The model of CDC as delivered (castsql.write.cdc), independent of CastSQL:
the table is, for each key, its highest-ranked change ever delivered; a
delete leaves the key absent. A change's rank: its sequence, then a delete
above an upsert, then (two upserts of one sequence) its values in column
order, NULL lowest. Delivery order and repeats do not matter, by definition.

Histories are random changes over few keys and few sequence values, so
equal sequences (ties) are common, cut into batches that are delivered
shuffled, some of them more than once."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("seq", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
BATCH = SCHEMA.append(pa.field("op", pa.string()))
VALUES = ("name", "score")


def rank(c: dict[str, Any]) -> tuple:
    def low_null(v: Any) -> tuple:
        return (0,) if v is None else (1, v)

    delete = c["op"].lower() in ("d", "delete")
    return (c["seq"], int(delete), () if delete else tuple(low_null(c[n]) for n in VALUES))


def model(changes: list[dict[str, Any]]) -> dict[int, tuple]:
    """key -> (seq, name, score) of the live rows."""
    best: dict[int, dict[str, Any]] = {}
    for c in changes:
        b = best.get(c["id"])
        if b is None or rank(c) > rank(b):
            best[c["id"]] = c
    return {k: (c["seq"], c["name"], c["score"]) for k, c in best.items() if c["op"].lower() not in ("d", "delete")}


def history(rng: random.Random, n: int, keys: int = 8, seqs: int = 8) -> list[dict[str, Any]]:
    return [
        {
            "id": rng.randrange(keys),
            "seq": rng.randrange(seqs),
            "op": rng.choice(["I", "U", "D", "u", "delete", "c"]),
            "name": rng.choice([None, "a", "b", "c"]),
            "score": rng.choice([None, 1.0, 2.0, -0.5]),
        }
        for _ in range(n)
    ]


def deliveries(rng: random.Random, changes: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """``changes`` cut into batches of ``size``, shuffled, a third of them twice."""
    batches = [changes[i : i + size] for i in range(0, len(changes), size)]
    out = batches + rng.sample(batches, len(batches) // 3)
    rng.shuffle(out)
    return out


def arrow(batch: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(batch, schema=BATCH)


def rows(table: pa.Table) -> dict[int, tuple]:
    got = table.to_pylist()
    assert len(got) == len({r["id"] for r in got}), "a key is live twice"
    return {r["id"]: (r["seq"], r["name"], r["score"]) for r in got}
