"""Time-travel rewriting: SQL in, SQL out (in the style of sqlglot's tests)."""

from __future__ import annotations

import pytest

from castsql.engine.sql.rewrite import SQLRewriteError, TimeTravel, rewrite


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


# -- the tokenizer: DuckDB's token starts, CastSQL's token ends ----------------

# Dollar quotes, E'…' escapes, literals continued on the next line and nested
# comments: text DuckDB reads as one literal must be one token here, else a
# ")" or "AS OF" inside it is taken for SQL ("SELECT $$a)b$$" was an internal
# error, ValueError: substring not found).
LITERALS = [
    ("SELECT $$a)b$$", "$$a)b$$", "a)b"),
    ("SELECT $tag$x $$ y$tag$ AS c", "$tag$x $$ y$tag$", "x $$ y"),
    ("SELECT $é$ ' \" $é$", "$é$ ' \" $é$", " ' \" "),
    ("SELECT $A$ $a$ $A$", "$A$ $a$ $A$", " $a$ "),
    ("SELECT E'a\\'b)' AS c", "E'a\\'b)'", "a'b)"),
    ("SELECT e'\\\\' AS c", "e'\\\\'", "\\"),
    ("SELECT 'it''s' AS c", "'it''s'", "it's"),
    ("SELECT 'a'\n'b' AS c", "'a'\n'b'", "ab"),
    ("SELECT 'a' -- note\n  'b' AS c", "'a' -- note\n  'b'", "ab"),
]


@pytest.mark.parametrize(("sql", "text", "value"), LITERALS)
def test_literals_are_one_token(sql, text, value):
    import duckdb

    from castsql.engine.sql.rewrite import string_value, tokenize

    assert [t.start for t in tokenize(sql)] == [s for s, _ in duckdb.tokenize(sql)]
    lit = tokenize(sql)[1]
    assert (lit.kind, lit.text, string_value(lit)) == ("string_const", text, value)
    assert duckdb.sql(sql).fetchone()[0] == value


def test_time_travel_with_dollar_quoted_timestamp_and_strings_holding_clauses():
    sql = "SELECT $$t AS OF VERSION 1$$ FROM t AS OF TIMESTAMP $x$2025-01-01$x$ /* t AS OF VERSION 2 */"
    assert rewrite(sql, name) == (
        'SELECT $$t AS OF VERSION 1$$ FROM "t@ts[2025-01-01]" AS "t" /* t AS OF VERSION 2 */',
        [TimeTravel(("t",), timestamp="2025-01-01")],
    )


def test_operators_duckdb_calls_keywords_are_whole_tokens():
    from castsql.engine.sql.rewrite import tokenize

    assert [t.text for t in tokenize("x::int, a->>b, $1")] == ["x", "::", "int", ",", "a", "->>", "b", ",", "$1"]


def _generated_sql():
    from hypothesis import strategies as st

    text = st.text(alphabet="ab é$'\"();-/*\\\n", max_size=8)
    tag = st.sampled_from(["", "a", "tag", "é", "T_1"])

    def dollar(t_b):
        t, b = t_b
        delim = f"${t}$"
        return ("string_const", f"{delim}{b}{delim}", b)

    def ok_dollar(t_b):
        delim = f"${t_b[0]}$"
        return (t_b[1] + delim).find(delim) == len(t_b[1])

    def e_string(b):
        return ("string_const", "E'" + b.replace("\\", "\\\\").replace("'", "\\'") + "'", b)

    token = st.one_of(
        st.sampled_from(["SELECT", "FROM", "WHERE", "AND", "x", "t_1", "a$b", "données"]).map(
            lambda w: ("word", w, None)
        ),
        st.sampled_from(["1", "42", "3.5", "1e3"]).map(lambda n: ("number", n, None)),
        st.sampled_from(["=", "<>", "(", ")", ",", "::", "+", "||", ";"]).map(lambda o: ("op", o, None)),
        text.map(lambda b: ("string_const", "'" + b.replace("'", "''") + "'", b)),
        text.map(e_string),
        st.tuples(tag, text).filter(ok_dollar).map(dollar),
        text.filter(bool).map(lambda b: ("quoted", '"' + b.replace('"', '""') + '"', None)),  # "" is no name
    )
    gap = st.sampled_from([" ", "\n", " /* c */ ", " -- c ' $$\n", " /* a /* b */ ' */ ", "\t"])
    return st.lists(st.tuples(token, gap, st.booleans()), min_size=1, max_size=12)


def test_token_boundaries_agree_with_duckdb():
    """Generated SQL with known token boundaries: DuckDB's tokenizer must find
    the same starts (the generator is right), CastSQL's the same ends and values."""
    import duckdb
    from hypothesis import HealthCheck, given, settings

    from castsql.engine.sql.rewrite import string_value, tokenize

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(_generated_sql())
    def check(parts):
        sql, expected, prev = "", [], None
        for (kind, text, value), gap, tight in parts:
            if prev is not None:
                punct = prev[1] in "()," or text in "(),"
                lines = prev[0] == "string_const" == kind and "'" in prev[1][:2] and "'" in text[:2]
                # no gap only beside punctuation; two '…' literals on two lines are one literal
                sql += "" if tight and punct else (" " if lines else gap)
            expected.append((len(sql), len(sql) + len(text), kind, value))
            sql += text
            prev = (kind, text)
        starts = [s for s, _ in duckdb.tokenize(sql)]
        if not sql.isascii():
            starts = [len(sql.encode()[:s].decode()) for s in starts]
        assert starts == [e[0] for e in expected], sql
        toks = tokenize(sql)
        assert [(t.start, t.end) for t in toks] == [e[:2] for e in expected], sql
        for t, (_, _, kind, value) in zip(toks, expected, strict=True):
            if kind == "string_const":
                assert (t.kind, string_value(t)) == ("string_const", value), sql

    check()
