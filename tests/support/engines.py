"""The two write engines behind one face, for tests that run the same
operation on both and compare: the embedded engine (``castsql.Table``) and
Spark (``castsql.spark``). A merge is given as its source (Arrow), ``on``
and clauses ``(kind, condition, set)`` as :class:`castsql.write.merge.Clause`
holds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

import castsql
from castsql.engine.sql.quoting import ident, sql_str
from castsql.write.merge import Clause, MergeBuilder

Clauses = Sequence[tuple[str, str | None, dict[str, str] | None]]


def build(b: MergeBuilder, clauses: Clauses) -> MergeBuilder:
    for kind, condition, values in clauses:
        b.add(Clause(kind, condition, values))
    return b


class Embedded:
    name = "embedded"

    def __init__(self, uri: str, s3: Any = None) -> None:
        self.uri, self.s3 = uri, s3

    def _t(self) -> castsql.Table:
        return castsql.open(self.uri, s3=self.s3)

    def append(self, rows: pa.Table) -> int | None:
        with self._t() as t:
            m = t.append(rows)
        return m and m.version

    def delete(self, where: str) -> int | None:
        with self._t() as t:
            m = t.delete(where)
        return m and m.version

    def update(self, set: dict[str, str], where: str | None = None) -> int | None:
        with self._t() as t:
            m = t.update(set=set, where=where)
        return m and m.version

    def merge(self, source: pa.Table, on: str | list[str], clauses: Clauses) -> int | None:
        with self._t() as t:
            return build(t.merge(source, on=on), clauses).execute().version


class Spark:
    name = "spark"

    def __init__(self, spark: Any, uri: str, s3: Any = None) -> None:
        self.spark, self.uri, self.s3 = spark, uri, s3

    def _df(self, rows: pa.Table) -> Any:
        return self.spark.createDataFrame(rows).coalesce(1)

    def append(self, rows: pa.Table) -> int | None:
        from castsql.spark import append

        m = append(self.spark, self.uri, self._df(rows), s3=self.s3)
        return m and m.version

    def delete(self, where: str) -> int | None:
        from castsql.spark import delete

        m = delete(self.spark, self.uri, where, s3=self.s3)
        return m and m.version

    def update(self, set: dict[str, str], where: str | None = None) -> int | None:
        from castsql.spark import update

        m = update(self.spark, self.uri, set, where, s3=self.s3)
        return m and m.version

    def merge(self, source: pa.Table, on: str | list[str], clauses: Clauses) -> int | None:
        from castsql.spark import merge

        return build(merge(self.spark, self.uri, self._df(source), on, s3=self.s3), clauses).execute().version


def live(uri: str, s3: Any = None, version: int | None = None) -> list[dict]:
    """The live rows of a version, sorted."""
    with castsql.open(uri, version=version, s3=s3) as t:
        rows = t.to_arrow().to_pylist()
    return sorted(rows, key=lambda r: tuple((v is None, str(type(v)), v) for v in r.values()))


def version(uri: str, s3: Any = None) -> int:
    with castsql.open(uri, s3=s3) as t:
        return t.version


def _literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return sql_str(v)
    return repr(v)


def values_query(rows: pa.Table) -> str:
    """``rows`` as a query DuckDB runs: typed by the first (cast) row, empty
    when ``rows`` is (a MERGE source that matches nothing)."""
    from castsql.engine.physical import duck_type

    casts = [duck_type(str(f.type)) for f in rows.schema]
    names = ", ".join(ident(n) for n in rows.column_names)
    data = rows.to_pylist() or [dict.fromkeys(rows.column_names)]
    tuples = [
        "(" + ", ".join(f"CAST({_literal(r[n])} AS {t})" for n, t in zip(rows.column_names, casts, strict=True)) + ")"
        for r in data
    ]
    where = "" if rows.num_rows else " WHERE false"
    return f"SELECT * FROM (VALUES {', '.join(tuples)}) AS v({names}){where}"


class SQL:
    """The embedded engine driven by SQL text through ``Session.sql``, as a
    person in the shell writes: each operation is one statement."""

    name = "sql"

    def __init__(self, uri: str, s3: Any = None) -> None:
        self.uri, self.s3 = uri, s3
        self.warehouse, self.table = uri.rstrip("/").rsplit("/", 1)

    def _run(self, sql: str) -> int | None:
        from castsql.engine.session import Session

        with Session(self.warehouse, s3=self.s3) as s:
            got = s.sql(sql)
        v = (got.schema.metadata or {}).get(b"castsql.version", b"").decode()
        return int(v) if v else None

    def append(self, rows: pa.Table) -> int | None:
        return self._run(f"INSERT INTO {self.table} {values_query(rows)}")

    def delete(self, where: str) -> int | None:
        return self._run(f"DELETE FROM {self.table} WHERE {where}")

    def update(self, set: dict[str, str], where: str | None = None) -> int | None:
        sets = ", ".join(f"{ident(c)} = {e}" for c, e in set.items())
        return self._run(f"UPDATE {self.table} SET {sets}" + (f" WHERE {where}" if where else ""))

    def merge(self, source: pa.Table, on: str | list[str], clauses: Clauses) -> int | None:
        cond = on if "=" in on else f"target.{ident(on)} = source.{ident(on)}"  # type: ignore[operator]
        whens = [_when(kind, condition, values) for kind, condition, values in clauses]
        return self._run(
            f"MERGE INTO {self.table} AS target USING ({values_query(source)}) AS source ON {cond} " + " ".join(whens)
        )


def _when(kind: str, condition: str | None, values: dict[str, str] | None) -> str:
    group, action = kind.rsplit("_", 1)
    head = {"matched": "MATCHED", "not_matched": "NOT MATCHED", "not_matched_by_source": "NOT MATCHED BY SOURCE"}[group]
    cond = f" AND {condition}" if condition else ""
    if action == "delete":
        return f"WHEN {head}{cond} THEN DELETE"
    if action == "update":
        sets = "SET *" if values is None else "SET " + ", ".join(f"{ident(c)} = {e}" for c, e in values.items())
        return f"WHEN {head}{cond} THEN UPDATE {sets}"
    if values is None:
        return f"WHEN {head}{cond} THEN INSERT *"
    cols = ", ".join(ident(c) for c in values)
    return f"WHEN {head}{cond} THEN INSERT ({cols}) VALUES ({', '.join(values.values())})"
