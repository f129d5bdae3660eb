"""Runs the SQL-level tests in sql/tests/*.test (sqllogictest style) against
the events table, and checks that every shipped audit query in sql/audit runs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import REPO
from tables import build_events

from castsql.engine import Session
from castsql.errors import CastSQLError

SQL_DIR = REPO / "sql"


@dataclass
class Record:
    kind: str  # "query", "ok", "error"
    sql: str
    line: int
    expected: list[str]
    rowsort: bool = False
    error: str = ""


def parse_test_file(path: Path) -> list[Record]:
    records = []
    blocks = re.split(r"\n\s*\n", path.read_text())
    line = 1
    for block in blocks:
        lines = [ln for ln in block.strip("\n").splitlines() if not ln.startswith("#")]
        start = line
        line += block.count("\n") + 2
        if not lines:
            continue
        head, body = lines[0].split(), lines[1:]
        if head[0] == "query":
            sep = body.index("----") if "----" in body else len(body)
            records.append(
                Record("query", "\n".join(body[:sep]), start, body[sep + 1 :], rowsort="rowsort" in head[2:])
            )
        elif head[:2] == ["statement", "ok"]:
            records.append(Record("ok", "\n".join(body), start, []))
        elif head[:2] == ["statement", "error"]:
            records.append(Record("error", "\n".join(body), start, [], error=" ".join(head[2:])))
        else:
            raise ValueError(f"{path}:{start}: unknown record {lines[0]!r}")
    return records


def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float) and not math.isnan(v) and v == int(v):
        return str(int(v))
    return str(v)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    import castsql
    from castsql.storage import open_storage

    root = tmp_path_factory.mktemp("sqlfiles")
    build_events(open_storage(str(root / "events")))
    with castsql.open(str(root / "events")) as t:  # v7: an update, for the audits that pair them
        t.update(set={"val": "val + 1000"}, where="id IN (42, 1042)")
    with Session(str(root)) as s:
        yield s


@pytest.mark.parametrize("path", sorted((SQL_DIR / "tests").glob("*.test")), ids=lambda p: p.name)
def test_sql_file(session, path):
    records = parse_test_file(path)
    assert records, f"{path} holds no tests"
    for r in records:
        where = f"{path.name}:{r.line}"
        if r.kind == "error":
            with pytest.raises(CastSQLError, match=re.escape(r.error)):
                session.sql(r.sql)
            continue
        result = session.sql(r.sql)
        if r.kind == "ok":
            continue
        got = ["\t".join(_cell(v) for v in row.values()) for row in result.to_pylist()]
        want = r.expected
        if r.rowsort:
            got, want = sorted(got), sorted(want)
        assert got == want, f"{where}: {r.sql}"


@pytest.mark.parametrize("path", sorted((SQL_DIR / "audit").glob("*.sql")), ids=lambda p: p.name)
def test_audit_queries_run(session, path):
    result = session.sql(path.read_text())
    assert result.num_rows > 0
