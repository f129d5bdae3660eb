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
