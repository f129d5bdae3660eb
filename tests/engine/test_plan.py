"""A query's plan (castsql/engine/sql/plan.py): what it holds for the SQL forms, and
that a query's text is tokenized and parsed once."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from castsql.engine import Session
from castsql.engine.barrier import policy
from castsql.engine.sql import plan, tokens
from castsql.engine.sql.plan import parse
from castsql.errors import CastSQLError
from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage

CATALOG = {"events", "users", "data"}


@pytest.fixture(scope="module")
def con():
    return duckdb.connect()


def refs(p):
    return [(r.table, p.sql[r.start : r.end], r.version, r.timestamp, r.param, r.conditions) for r in p.refs]


def test_a_plain_select(con):
    p = parse("SELECT * FROM events e JOIN users USING (id) WHERE e.id > 5 AND 'x' = users.name", CATALOG, con)
    assert p.kinds == ("SELECT",)
    assert refs(p) == [
        ("events", "events", None, None, None, (("id", ">", 5, "INTEGER"),)),
        ("users", "users", None, None, None, (("name", "=", "x", "VARCHAR"),)),
    ]
    assert dict(p.reads) == {"events": 1, "users": 1}
    assert p.count_star is None and not p.audits and p.used_params == frozenset()


def test_time_travel_forms_are_lowered_in_one_place(con):
    q = (
        "SELECT * FROM events AS OF VERSION 3 a, events VERSION AS OF ? b, users AT (VERSION => 1), "
        "events AS OF TIMESTAMP '2025-01-01' c, users FOR SYSTEM_TIME AS OF TIMESTAMP '2025-01-02' "
        "WHERE a.id = ?"
    )
    p = parse(q, CATALOG, con)
    assert refs(p) == [
        ("events", "events AS OF VERSION 3", 3, None, None, ()),  # a.id = ?: no constant to prune with
        ("events", "events VERSION AS OF ?", None, None, 0, ()),
        ("users", "users AT (VERSION => 1)", 1, None, None, ()),
        ("events", "events AS OF TIMESTAMP '2025-01-01'", None, "2025-01-01", None, ()),
        ("users", "users FOR SYSTEM_TIME AS OF TIMESTAMP '2025-01-02'", None, "2025-01-02", None, ()),
    ]
    assert dict(p.reads) == {}  # a table named only with AS OF is not read at its latest version
    bound = p.bind([7, 5])
    assert [r.version for r in bound.refs][:2] == [3, 7] and bound.used_params == frozenset({0})
    with pytest.raises(CastSQLError, match="needs a value"):
        p.bind(None)
    # the alias a replacement keeps when the query gave none
    assert [(r.has_alias, r.alias) for r in p.refs][2] == (False, ' AS "users"')


def test_ctes_unions_and_subqueries(con):
    q = (
        "WITH old AS (SELECT * FROM events AS OF VERSION 1 WHERE id < 10), events2 AS (SELECT 1) "
        "SELECT id FROM old UNION ALL SELECT id FROM events WHERE id >= 2 "
        "UNION SELECT u.id FROM users u WHERE u.id IN (SELECT id FROM data WHERE id = 4)"
    )
    p = parse(q, CATALOG | {"old"}, con)
    assert p.kinds == ("SELECT",)
    assert refs(p) == [
        ("events", "events AS OF VERSION 1", 1, None, None, (("id", "<", 10, "INTEGER"),)),
        ("events", "events", None, None, None, (("id", ">=", 2, "INTEGER"),)),
        ("users", "users", None, None, None, ()),  # IN (subquery) bounds nothing
        ("data", "data", None, None, None, (("id", "=", 4, "INTEGER"),)),
    ]
    assert dict(p.reads) == {"events": 1, "users": 1, "data": 1}  # the CTE `old` is not the table `old`


def test_strings_and_comments_are_never_read_as_sql(con):
    q = (
        "SELECT $$a) FROM users AS OF VERSION 2$$ AS s, 'events AS OF VERSION 3' -- FROM users\n"
        "FROM /* users AS OF VERSION 4 */ events WHERE note = $tag$x AS OF VERSION 5$tag$"
    )
    p = parse(q, CATALOG, con)
    assert refs(p) == [("events", "events", None, None, None, (("note", "=", "x AS OF VERSION 5", "VARCHAR"),))]
    assert dict(p.reads) == {"events": 1}


def test_audit_calls(con):
    p = parse(
        "SELECT * FROM table_changes('events', 1, 3) c JOIN table_history('users') h USING (version)", CATALOG, con
    )
    assert [(a.kind, a.table, a.args, p.sql[a.start : a.end], a.replacement) for a in p.audits] == [
        ("changes", "events", (1, 3), "table_changes('events', 1, 3)", '"castsql/changes/0/events"'),
        ("history", "users", (), "table_history('users')", '"castsql/history/1/users"'),
    ]
    assert p.kinds == ("SELECT",) and not p.refs and not p.reads
    p = parse("DESCRIBE HISTORY events", CATALOG, con)
    assert [(a.kind, a.replacement) for a in p.audits] == [("history", 'SELECT * FROM "castsql/history/events"')]
    assert p.kinds == ("SELECT",)
    bad = parse("SELECT * FROM table_changes('events')", CATALOG, con)
    with pytest.raises(CastSQLError, match="table_changes takes"):
        bad.bind(None)  # raised after the guard has read the tokens
    p = parse(
        "SELECT * FROM table_changes('events', '2026-11-01', '2026-11-02 12:00') "
        "UNION ALL SELECT * FROM table_row_history(events, -42) UNION ALL SELECT * FROM table_diff('events', 2, 9)",
        CATALOG,
        con,
    )
    assert [(a.kind, a.args) for a in p.audits] == [
        ("changes", ("2026-11-01", "2026-11-02 12:00")),
        ("row_history", (-42,)),
        ("diff", (2, 9)),
    ]
    for text in ("table_diff('events', 2)", "table_changes('events', 1.5)", "table_row_history('events')"):
        with pytest.raises(CastSQLError, match=f"{text.split('(')[0]} takes"):
            parse(f"SELECT * FROM {text}", CATALOG, con).bind(None)


def test_count_star_and_explain(con):
    p = parse("SELECT count(*) AS n FROM events AS OF VERSION 2", CATALOG, con)
    assert p.count_star == (0, "n") and p.refs[0].version == 2
    assert parse("SELECT count(*) FROM events WHERE id > 1", CATALOG, con).count_star is None
    p = parse("EXPLAIN ANALYZE SELECT count(*) FROM events WHERE id > 1", CATALOG, con)
    assert p.kinds is None and p.count_star is None  # EXPLAIN: the policy parses what runs
    assert refs(p) == [("events", "events", None, None, None, (("id", ">", 1, "INTEGER"),))]


def test_statements_duckdb_cannot_serialize(con):
    p = parse("CREATE TEMP TABLE x AS SELECT * FROM events AS OF VERSION 2 JOIN data USING (id)", CATALOG, con)
    assert p.kinds is None
    assert refs(p) == [("events", "events AS OF VERSION 2", 2, None, None, ())]
    assert dict(p.reads) == {"data": None}  # named outside AS OF: read at its latest version
    assert parse("SELECT 1; SELECT 2 FROM users", CATALOG, con).kinds == ("SELECT", "SELECT")
    assert parse("SELECT 1; PRAGMA version", CATALOG, con).kinds is None
    assert parse("SHOW TABLES", CATALOG, con).show_tables


def test_non_ascii_text_keeps_offsets(con):
    q = "SELECT 'é€😀' AS x FROM events AS OF VERSION 1 WHERE id = 3 AND note <> 'ü'"
    p = parse(q, CATALOG, con)
    assert refs(p) == [
        ("events", "events AS OF VERSION 1", 1, None, None, (("id", "=", 3, "INTEGER"),)),  # <> bounds nothing
    ]


# ---------------------------------------------------------------- once per query


@pytest.fixture
def root(tmp_path) -> str:
    root = str(tmp_path / "events")
    log = TableLog.create(open_storage(root), pa.schema([("id", pa.int64()), ("note", pa.string())]))
    log.append(write_data_files(log.storage, pa.table({"id": [1, 2, 3], "note": ["a)b", "x", "y"]})))
    log.append(write_data_files(log.storage, pa.table({"id": [4, 5], "note": ["z", "w"]})))
    return root


@pytest.fixture
def counted(monkeypatch):
    """Calls of DuckDB's tokenizer, of its parser through json_serialize_sql
    (the plan's parse), and of the policy's own parse of the SQL that runs."""
    calls = {"tokenize": 0, "serialize": 0, "policy parse": 0}
    real_tokenize, real_serialize, real_refuse = duckdb.tokenize, plan.serialize, policy._refuse_import

    def tokenize(sql):
        calls["tokenize"] += 1
        return real_tokenize(sql)

    def serialize(con, sql):
        calls["serialize"] += 1
        return real_serialize(con, sql)

    def refuse(sql, safe):  # runs right before the policy's con.extract_statements(sql)
        calls["policy parse"] += 1
        return real_refuse(sql, safe)

    tokens._tokenize.cache_clear()
    monkeypatch.setattr(duckdb, "tokenize", tokenize)
    monkeypatch.setattr(plan, "serialize", serialize)
    monkeypatch.setattr(policy, "_refuse_import", refuse)
    return calls


QUERIES = [
    ("SELECT count(*) AS n FROM events WHERE id > 3", 2),
    ("SELECT count(*) AS n FROM events AS OF VERSION 1 e WHERE e.id >= 2 AND note <> $$a)b$$", 2),
    ("WITH old AS (SELECT * FROM events AS OF VERSION ?) SELECT count(*) AS n FROM old -- note\n", 3),
    ("SELECT count(*) AS n FROM (SELECT id FROM events UNION ALL SELECT id FROM events VERSION AS OF 1) u", 8),
    ("SELECT count(*) AS n FROM events AS OF VERSION 1", 3),
]


@pytest.mark.parametrize(("query", "n"), QUERIES)
def test_a_query_is_tokenized_and_parsed_once(root, counted, query, n):
    s = Session(root)
    params = [1] if "?" in query else None
    assert s.sql(query, params).to_pylist() == [{"n": n}]
    assert counted == {"tokenize": 1, "serialize": 1, "policy parse": 0}
    assert s.sql(query, params).to_pylist() == [{"n": n}]  # the plan is remembered by text
    assert counted == {"tokenize": 1, "serialize": 1, "policy parse": 0}


def test_what_the_plan_cannot_vouch_for_the_policy_parses(root, counted):
    s = Session(root)
    s.sql("CREATE TEMP TABLE mine AS SELECT * FROM events AS OF VERSION 1")
    assert counted == {"tokenize": 1 + 1, "serialize": 1, "policy parse": 1}  # + the final text's tokens
    assert s.sql("SELECT count(*) AS n FROM mine").to_pylist() == [{"n": 3}]


def test_safe_mode_parses_what_runs(root, counted):
    s = Session(root, safe=True)
    assert s.sql("SELECT count(*) AS n FROM events WHERE id > 3").to_pylist() == [{"n": 2}]
    # The policy reads the text that runs (a pruned view's name in it): its
    # tokens, DuckDB's statements and (safety.check_select) its parse tree.
    assert counted == {"tokenize": 2, "serialize": 1, "policy parse": 1}
