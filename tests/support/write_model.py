"""A pure-Python model of a table with a primary key under append, delete,
update and merge (Delta's merge semantics, CastSQL's key rules), and a
generator of random operations it can judge, for the differential suite
(tests/write/test_engines_agree.py): every engine must leave the rows the model
leaves, and refuse what the model refuses, with the same error class.

An operation is generated from a ``random.Random`` so that Hypothesis (its
``randoms()`` strategy, which shrinks) and plain seeded runs (Spark, where
each step costs jobs) share one generator. Every SQL text comes with the
Python function the model evaluates for it (three-valued: None is NULL)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from castsql.errors import DuplicateKey, MergeError, NullKey, WriteError

# Column names a user may give that name machinery of the engines (issue 33).
HOSTILE = ("_pos", "_file", "filename", "pos", "fi", "rowid", "_row_id")  # plain identifiers in DuckDB and Spark SQL
GROUPS = ("a", "b", "c", "d")

Row = dict[str, Any]


def schema(h: str) -> pa.Schema:
    return pa.schema([("id", pa.int64()), ("g", pa.string()), ("n", pa.int64()), (h, pa.int64())])


def _gt(a: Any, b: Any) -> bool | None:
    return None if a is None or b is None else a > b


def _lt(a: Any, b: Any) -> bool | None:
    return None if a is None or b is None else a < b


def _add(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


@dataclass
class Op:
    """One write: ``kind`` and the arguments an engine takes (see tests/support/engines.py)."""

    kind: str
    args: tuple
    label: str
    # The model's own reading of the SQL pieces.
    fns: dict[str, Any] = field(default_factory=dict)


def gen_rows(rng: random.Random, h: str, ids: list[int | None]) -> pa.Table:
    rows = [
        {"id": i, "g": rng.choice(GROUPS), "n": rng.choice([None, *range(-3, 40)]), h: rng.randrange(0, 6)} for i in ids
    ]
    return pa.Table.from_pylist(rows, schema=schema(h))


def gen_op(rng: random.Random, h: str, next_id: int) -> Op:
    kind = rng.choice(("append", "delete", "update", "merge", "merge"))
    if kind == "append":
        n = rng.randrange(1, 6)
        ids: list[int | None] = [rng.choice([next_id + i, rng.randrange(0, next_id + 1)]) for i in range(n)]
        if rng.random() < 0.1:
            ids[rng.randrange(n)] = None
        t = gen_rows(rng, h, ids)
        return Op("append", (t,), f"append {ids}")
    if kind == "delete":
        k, r, c = rng.randrange(2, 5), rng.randrange(2), rng.randrange(0, 30)
        where, fn = rng.choice(
            [
                (f"id % {k} = {r}", lambda x: x["id"] % k == r),
                (f"g = '{rng.choice(GROUPS)}'", None),
                (f"n > {c}", lambda x: _gt(x["n"], c)),
                (f"{h} = {c % 6}", lambda x: x[h] == c % 6),
                (f"{h} < id", lambda x: _lt(x[h], x["id"])),
            ]
        )
        if fn is None:
            grp = where.split("'")[1]
            fn = lambda x, grp=grp: x["g"] == grp  # noqa: E731
        return Op("delete", (where,), f"delete {where}", {"where": fn})
    if kind == "update":
        k, r, c = rng.randrange(2, 5), rng.randrange(2), rng.randrange(0, 40)
        where, cond = rng.choice(
            [
                (f"id % {k} = {r}", lambda x: x["id"] % k == r),
                (f"id = {c}", lambda x: x["id"] == c),
                (f"n < {c}", lambda x: _lt(x["n"], c)),
                (None, lambda x: True),
            ]
        )
        d = rng.randrange(1, 60)
        sets = [
            ({"n": "n + 1"}, {"n": lambda x: _add(x["n"], 1)}),
            ({"g": "'z'"}, {"g": lambda x: "z"}),
            ({"id": f"id + {d}"}, {"id": lambda x: x["id"] + d}),
            ({"id": "NULL"}, {"id": lambda x: None}),
            ({"id": f"{c}"}, {"id": lambda x: c}),
            ({h: "id", "n": "NULL"}, {h: lambda x: x["id"], "n": lambda x: None}),
            ({"n": "n / 2"}, {"n": lambda x: None if x["n"] is None else x["n"] // 2}),  # a fraction is refused
        ]
        text, fns = rng.choice(sets)
        return Op("update", (text, where), f"update {text} where {where}", {"where": cond, "set": fns})
    # merge
    n = rng.randrange(0, 5)
    ids = [rng.randrange(0, next_id + 4) for _ in range(n)]
    if n and rng.random() < 0.1:
        ids[0] = None
    source = gen_rows(rng, h, ids)
    on = rng.choice(["id", "id", "id", "g", "target.id = source.id"])
    pool = [
        ("matched_update", None, None),
        ("matched_update", "source.n > target.n", None),
        ("matched_update", None, {"n": "target.n + source.n"}),
        ("matched_update", None, {"id": "source.id + 100"}),
        ("matched_delete", "source.g = 'd'", None),
        ("matched_delete", None, None),
        ("not_matched_insert", None, None),
        ("not_matched_insert", "source.n > 10", None),
        ("not_matched_insert", None, {"id": "source.id + 1000", "g": "source.g"}),
        ("not_matched_by_source_delete", "target.n < 3", None),
        ("not_matched_by_source_update", None, {"n": "0"}),
    ]
    clauses = [rng.choice(pool) for _ in range(rng.randrange(1, 4))]
    return Op("merge", (source, on, clauses), f"merge on {on} of {ids}: {clauses}")


# The model's reading of the merge pool's SQL.
_COND: dict[str | None, Callable[[Row | None, Row | None], Any]] = {
    None: lambda t, s: True,
    "source.n > target.n": lambda t, s: _gt(s["n"], t["n"]),
    "source.g = 'd'": lambda t, s: s["g"] == "d",
    "source.n > 10": lambda t, s: _gt(s["n"], 10),
    "target.n < 3": lambda t, s: _lt(t["n"], 3),
}
_VALUE: dict[str, Callable[[Row | None, Row | None], Any]] = {
    "target.n + source.n": lambda t, s: _add(t["n"], s["n"]),
    "source.id + 100": lambda t, s: _add(s["id"], 100),
    "source.id + 1000": lambda t, s: _add(s["id"], 1000),
    "source.g": lambda t, s: s["g"],
    "0": lambda t, s: 0,
}


def rows_of(rows: list[Row], h: str) -> list[tuple]:
    """Rows as sorted tuples (id, g, n, h); NULLs sort first."""
    out = [tuple(r[c] for c in ("id", "g", "n", h)) for r in rows]
    return sorted(out, key=lambda t: tuple((v is not None, v if v is not None else 0) for v in t))


class Model:
    """The live rows of a table whose primary key is ``id``; ``apply`` returns
    whether the operation commits a version, or raises the error an engine
    must raise (and then changes nothing)."""

    # ``on`` spellings that name key columns (``Table.merge(on="id")``), which
    # a merge's clauses may not update; SQL's ON is always a condition.
    keyed_on: tuple[str, ...] = ("id", "g")

    def __init__(self, h: str, rows: list[Row]) -> None:
        self.h = h
        self.rows = [dict(r) for r in rows]

    def snapshot(self) -> list[tuple]:
        return rows_of(self.rows, self.h)

    def apply(self, op: Op) -> bool:
        return getattr(self, "_" + op.kind)(op)

    def _commit(self, keep: list[Row], added: list[Row], replaced: list[Row]) -> None:
        new_keys = [r["id"] for r in added]
        if any(k is None for k in new_keys):
            raise NullKey("NULL key")
        if len(set(new_keys)) != len(new_keys):
            raise DuplicateKey("repeated key")
        if {r["id"] for r in keep} & set(new_keys):
            raise DuplicateKey("key in the table")
        self.rows = keep + added

    def _append(self, op: Op) -> bool:
        (t,) = op.args
        self._commit(self.rows, t.to_pylist(), [])
        return True

    def _delete(self, op: Op) -> bool:
        hit = [r for r in self.rows if op.fns["where"](r)]
        self.rows = [r for r in self.rows if not op.fns["where"](r)]
        return bool(hit)

    def _update(self, op: Op) -> bool:
        hit = [r for r in self.rows if op.fns["where"](r)]
        if not hit:
            return False
        keep = [r for r in self.rows if not op.fns["where"](r)]
        if op.args[0] == {"n": "n / 2"} and any(r["n"] is not None and r["n"] % 2 for r in hit):
            raise WriteError("a fraction cannot be stored in a BIGINT column unchanged")
        added = [{**r, **{c: f(r) for c, f in op.fns["set"].items()}} for r in hit]
        if "id" in op.fns["set"]:
            self._commit(keep, added, hit)
        else:
            self.rows = keep + added
        return True

    def _merge(self, op: Op) -> bool:
        source, on, clauses = op.args
        src = source.to_pylist()
        keyed = on in self.keyed_on
        col = "id" if on != "g" else "g"
        for kind, _, values in clauses:
            if keyed and kind.endswith("update") and values and any(c == on for c in values):
                raise MergeError("key column cannot be updated")

        def match(t: Row, s: Row) -> bool:
            return t[col] is not None and t[col] == s[col]

        def first(group: str, t: Row | None, s: Row | None) -> tuple | None:
            for c in clauses:
                kind = c[0]
                if kind.rsplit("_", 1)[0] == group and _COND[c[1]](t, s):
                    return c
            return None

        def new_row(c: tuple, t: Row | None, s: Row | None) -> Row:
            kind, _, values = c
            if values is None:
                return dict(s)  # update_all / insert_all
            base = dict(t) if kind.endswith("update") else {k: None for k in ("id", "g", "n", self.h)}
            for name, expr in values.items():
                base[name] = _VALUE[expr](t, s)
            return base

        matched_clauses = [c for c in clauses if c[0].startswith("matched")]
        all_delete = len(matched_clauses) == 1 and matched_clauses[0][:2] == ("matched_delete", None)
        keep, added, replaced = [], [], []
        changed = False
        for t in self.rows:
            ms = [s for s in src if match(t, s)]
            acts = [(first("matched", t, s), s) for s in ms]
            acts = [(c, s) for c, s in acts if c is not None]
            if len(ms) > 1 and acts and not all_delete:
                raise MergeError("several source rows match one target row")
            if not ms:
                c = first("not_matched_by_source", t, None)
                acts = [(c, None)] if c is not None else []
            if not acts:
                keep.append(t)
                continue
            changed = True
            c, s = acts[0]
            replaced.append(t)
            if not c[0].endswith("delete"):
                added.append(new_row(c, t, s))
        for s in src:
            if any(match(t, s) for t in self.rows):
                continue
            c = first("not_matched", None, s)
            if c is not None:
                changed = True
                added.append(new_row(c, None, s))
        if changed:
            self._commit(keep, added, replaced)
        return changed


def _duck_half(n: int) -> int:
    """DuckDB's ``CAST(n / 2 AS BIGINT)``: ``/`` divides as DOUBLE, and a
    DOUBLE's cast rounds half to even, as Python's ``round`` does."""
    return round(n / 2)


class SQLModel(Model):
    """The model as SQL reads the same operations: an ``UPDATE``'s value is
    cast to its column's type as DuckDB's own ``UPDATE`` casts it (``SET n =
    n / 2`` stores a rounded BIGINT), where ``Table.update`` refuses a lossy
    value, and ``ON target.id = source.id`` is a condition whose column a
    clause may set, as in Delta's SQL. Every other rule is the model's."""

    keyed_on = ()

    def _update(self, op: Op) -> bool:
        if op.args[0] == {"n": "n / 2"}:
            half = {"n": lambda x: None if x["n"] is None else _duck_half(x["n"])}
            op = Op(op.kind, op.args, op.label, {**op.fns, "set": half})
            op.args = ({"n": "n // 2"}, op.args[1])  # not the refused text: the model's own branch skips it
        return super()._update(op)
