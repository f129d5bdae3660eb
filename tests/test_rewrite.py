"""Time-travel rewriting: SQL in, SQL out (in the style of sqlglot's tests)."""

from __future__ import annotations

import pytest

from castsql.engine.rewrite import SQLRewriteError, TimeTravel, rewrite


def name(ref: TimeTravel) -> str:
    at = f"v{ref.version}" if ref.version is not None else f"ts[{ref.timestamp}]"
    return f'"{".".join(ref.name)}@{at}"'


CASES = [
    ("SELECT * FROM t AS OF VERSION 3", 'SELECT * FROM "t@v3" AS "t"'),
    ("SELECT * FROM t VERSION AS OF 3", 'SELECT * FROM "t@v3" AS "t"'),
    ("SELECT * FROM t AT (VERSION => 3)", 'SELECT * FROM "t@v3" AS "t"'),
    ("select * from t as of version 3 where x=1", 'select * from "t@v3" AS "t" where x=1'),
    ("SELECT * FROM t AS OF TIMESTAMP '2025-01-01'", 'SELECT * FROM "t@ts[2025-01-01]" AS "t"'),
    ("SELECT * FROM t TIMESTAMP AS OF '2025-01-01 10:00'", 'SELECT * FROM "t@ts[2025-01-01 10:00]" AS "t"'),
    ("SELECT * FROM t TIMESTAMP AS OF TIMESTAMP '2025-01-01'", 'SELECT * FROM "t@ts[2025-01-01]" AS "t"'),
    ("SELECT * FROM t AT (TIMESTAMP => '2025-01-01')", 'SELECT * FROM "t@ts[2025-01-01]" AS "t"'),
    ("SELECT * FROM t FOR SYSTEM_TIME AS OF '2025-01-01'", 'SELECT * FROM "t@ts[2025-01-01]" AS "t"'),
    # aliases are kept; without one the table's own name is the alias, so t.col works
    ("SELECT a.x FROM t AS OF VERSION 3 a", 'SELECT a.x FROM "t@v3" a'),
    ("SELECT a.x FROM t AS OF VERSION 3 AS a", 'SELECT a.x FROM "t@v3" AS a'),
    ("SELECT t.x FROM t AS OF VERSION 3 WHERE t.x > 0", 'SELECT t.x FROM "t@v3" AS "t" WHERE t.x > 0'),
    # self-join of two versions
    (
        "SELECT * FROM t AS OF VERSION 3 a JOIN t VERSION AS OF 7 b ON a.id = b.id",
        'SELECT * FROM "t@v3" a JOIN "t@v7" b ON a.id = b.id',
    ),
    ("SELECT * FROM t AS OF VERSION 3 JOIN u ON t.id = u.id", 'SELECT * FROM "t@v3" AS "t" JOIN u ON t.id = u.id'),
    # quoted and qualified names
    ('SELECT * FROM "My Table" AS OF VERSION 1', 'SELECT * FROM "My Table@v1" AS "My Table"'),
    ("SELECT * FROM wh.t AS OF VERSION 1", 'SELECT * FROM "wh.t@v1" AS "t"'),
    # subqueries and CTEs
    (
        "WITH old AS (SELECT * FROM t AS OF VERSION 1) SELECT count(*) FROM old",
        'WITH old AS (SELECT * FROM "t@v1" AS "t") SELECT count(*) FROM old',
    ),
    # the words inside strings, comments and quoted identifiers are left alone
    ("SELECT 'x AS OF VERSION 3' FROM t", "SELECT 'x AS OF VERSION 3' FROM t"),
    ("SELECT 1 -- t AS OF VERSION 3\nFROM t", "SELECT 1 -- t AS OF VERSION 3\nFROM t"),
    ("SELECT 1 /* t AS OF VERSION 3 */ FROM t", "SELECT 1 /* t AS OF VERSION 3 */ FROM t"),
    ('SELECT "t AS OF VERSION 3" FROM t', 'SELECT "t AS OF VERSION 3" FROM t'),
    ("SELECT 'it''s t AS OF VERSION 3' FROM t", "SELECT 'it''s t AS OF VERSION 3' FROM t"),
    # a column called version, TIMESTAMP literals elsewhere, AT TIME ZONE
    (
        "SELECT version FROM t WHERE ts > TIMESTAMP '2025-01-01'",
        "SELECT version FROM t WHERE ts > TIMESTAMP '2025-01-01'",
    ),
    ("SELECT ts AT TIME ZONE 'UTC' FROM t", "SELECT ts AT TIME ZONE 'UTC' FROM t"),
    # non-ASCII text before the clause (DuckDB's token offsets are UTF-8 bytes)
    ("SELECT 'déjà vu ✓' FROM t AS OF VERSION 2", 'SELECT \'déjà vu ✓\' FROM "t@v2" AS "t"'),
    ('SELECT * FROM "données" AS OF VERSION 1', 'SELECT * FROM "données@v1" AS "données"'),
]


@pytest.mark.parametrize(("sql", "expected"), CASES)
def test_rewrite(sql, expected):
    assert rewrite(sql, name)[0] == expected


def test_refs_are_reported_in_order():
    _, refs = rewrite("SELECT * FROM t AS OF VERSION 3 a, u TIMESTAMP AS OF '2025-01-01' b", name)
    assert refs == [TimeTravel(("t",), version=3), TimeTravel(("u",), timestamp="2025-01-01")]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM t AS OF VERSION 'x'", "expected a version number"),
        ("SELECT * FROM t AS OF VERSION 1.5", "expected a version number"),
        ("SELECT * FROM t AS OF TIMESTAMP 5", "expected a timestamp"),
        ("SELECT * FROM t AT (VERSION => 3", "expected '\\)'"),
        ("SELECT * FROM t AS OF VERSION", "ends early"),
    ],
)
def test_malformed_clauses(sql, message):
    with pytest.raises(SQLRewriteError, match=message):
        rewrite(sql, name)
