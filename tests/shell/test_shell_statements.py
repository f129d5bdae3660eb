"""Where statements end: Enter on an unfinished statement, scripts split statement by statement."""

from __future__ import annotations

import pytest

from castsql.shell.repl import should_run
from castsql.shell.statements import in_string_or_comment, is_complete, iter_commands, split_statements


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ("SELECT 1", False),
        ("SELECT 1;", True),
        ("SELECT 1;   \n  ", True),
        ("SELECT 1; -- trailing comment", True),
        ("SELECT 1; /* open comment", False),
        ("SELECT ';'", False),
        ("SELECT ';';", True),
        ("SELECT 'it''s;'", False),
        ('SELECT 1 AS "a;b"', False),
        ("SELECT $$ ; $$", False),
        ("SELECT $$ ; $$;", True),
        ("SELECT $tag$ $$ ; $tag$;", True),
        ("SELECT 1 -- ;", False),
        ("SELECT /* ; */ 1", False),
        ("SELECT 1;\nSELECT 2", False),
        ("SELECT 1;\nSELECT 2;", True),
    ],
)
def test_is_complete(text: str, complete: bool) -> None:
    assert is_complete(text) is complete


@pytest.mark.parametrize(
    ("text", "runs"),
    [("", True), ("   ", True), (".tables", True), ("  .mode csv", True), ("quit", True), ("SELECT 1", False)],
)
def test_enter_runs_meta_commands_and_finished_statements(text: str, runs: bool) -> None:
    assert should_run(text) is runs


def test_split_keeps_the_unfinished_rest() -> None:
    stmts, rest = split_statements("SELECT 1;; -- nothing\n;SELECT ';' AS s; SELECT")
    assert [s for s, _ in stmts] == ["SELECT 1", "SELECT ';' AS s"]
    assert rest == " SELECT"


def test_script_commands_and_their_lines() -> None:
    script = [
        "-- a comment line\n",
        ".mode csv\n",
        "SELECT 1; SELECT\n",
        "  2;\n",
        "/* a block comment\n",
        ".this is inside the comment, not a command\n",
        "*/ SELECT 3;\n",
        ".tables\n",
        "SELECT 4\n",
    ]
    got = [(c.kind, c.text, c.line) for c in iter_commands(script)]
    assert got == [
        ("meta", ".mode csv", 2),
        ("sql", "SELECT 1", 3),
        ("sql", "SELECT\n  2", 3),
        ("sql", "/* a block comment\n.this is inside the comment, not a command\n*/ SELECT 3", 5),
        ("meta", ".tables", 8),
        ("sql", "SELECT 4", 9),
    ]


def test_dot_inside_a_statement_is_sql() -> None:
    got = [(c.kind, c.text) for c in iter_commands(["SELECT\n", ".5 AS x;\n"])]
    assert got == [("sql", "SELECT\n.5 AS x")]


def test_inside_string_or_comment() -> None:
    assert in_string_or_comment("SELECT 'abc")
    assert in_string_or_comment("SELECT 1 -- note")
    assert not in_string_or_comment("SELECT 'abc' ")
