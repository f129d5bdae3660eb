"""Context-aware completion: tables, columns, versions, timestamps, keywords, functions, meta-commands."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from castsql.engine import Session
from castsql.shell.catalog import Catalog
from castsql.shell.completer import SQLCompleter, table_refs, tokens


@pytest.fixture(scope="module")
def completer(shell_warehouse: str) -> Iterator[SQLCompleter]:
    session = Session(shell_warehouse)
    try:
        yield SQLCompleter(Catalog(lambda: session))
    finally:
        session.close()


def complete(completer: SQLCompleter, text: str, cursor: int | None = None) -> list[str]:
    """Completion texts offered with the cursor at ``cursor`` (default: the end)."""
    doc = Document(text, len(text) if cursor is None else cursor)
    return [c.text for c in completer.get_completions(doc, CompleteEvent(completion_requested=True))]


def test_table_names_after_from_and_join(completer: SQLCompleter) -> None:
    assert complete(completer, "SELECT * FROM ev")[0] == "events"
    assert complete(completer, "SELECT * FROM events e JOIN u")[0] == "users"
    assert complete(completer, "SELECT * FROM events, u")[0] == "users"
    assert complete(completer, "DESCRIBE HISTORY ")[:2] == ["events", "users"]
    assert "range" in complete(completer, "SELECT * FROM ra")  # table functions come after the tables


def test_columns_once_a_table_is_named(completer: SQLCompleter) -> None:
    assert complete(completer, "SELECT * FROM events WHERE g")[0] == "grp"
    # The cursor before FROM: the statement after it still counts.
    text = "SELECT  FROM users"
    assert complete(completer, text, cursor=7)[:3] == ["id", "name", "email"]
    # No table named yet: no column names guessed.
    assert "grp" not in complete(completer, "SELECT g")


def test_columns_after_an_alias_or_table_qualifier(completer: SQLCompleter) -> None:
    text = "SELECT u. FROM users u JOIN events e ON e.id = u.id"
    assert complete(completer, text, cursor=9) == ["id", "name", "email"]
    assert complete(completer, "SELECT events.v FROM events", cursor=15) == ["val"]
    assert complete(completer, "SELECT e.t FROM events AS OF VERSION 3 e", cursor=10) == ["ts"]


def test_versions_after_time_travel_clauses(completer: SQLCompleter) -> None:
    newest_first = ["6", "5", "4", "3", "2", "1", "0"]
    assert complete(completer, "SELECT * FROM events AS OF VERSION ") == newest_first
    assert complete(completer, "SELECT * FROM events VERSION AS OF ") == newest_first
    assert complete(completer, "SELECT * FROM events AT (VERSION => ") == newest_first
    assert complete(completer, "SELECT * FROM users AS OF VERSION ") == ["1", "0"]
    assert complete(completer, "SELECT * FROM events AS OF VERSION 5") == ["5"]
    doc = Document("SELECT * FROM events AS OF VERSION ")
    metas = [c.display_meta_text for c in completer.get_completions(doc, CompleteEvent())]
    assert metas[0].startswith("APPEND ") and metas[3].startswith("DELETE ")


def test_commit_times_after_as_of_timestamp(completer: SQLCompleter) -> None:
    got = complete(completer, "SELECT * FROM users AS OF TIMESTAMP ")
    assert len(got) == 2 and all(g.startswith("'20") and g.endswith("'") for g in got)
    inside = complete(completer, "SELECT * FROM users TIMESTAMP AS OF '")
    assert [g + "" for g in inside] == [g[1:] for g in got]


def test_table_names_inside_audit_functions(completer: SQLCompleter) -> None:
    assert complete(completer, "SELECT * FROM table_history('ev") == ["events'"]
    assert complete(completer, "SELECT * FROM table_changes('") == ["events'", "users'"]
    assert complete(completer, "SELECT 'ev") == []  # any other string: nothing


def test_keywords_follow_the_users_case_and_functions_are_offered(completer: SQLCompleter) -> None:
    assert complete(completer, "sel")[0] == "select"
    assert complete(completer, "SEL")[0] == "SELECT"
    assert "count" in complete(completer, "SELECT coun")
    assert complete(completer, "SELECT * FROM events a")[0] == "as of version"


def test_nothing_inside_comments_or_after_numbers(completer: SQLCompleter) -> None:
    assert complete(completer, "SELECT 1 -- FROM ev") == []
    assert complete(completer, "SELECT 12") == []


def test_meta_commands_and_their_arguments(completer: SQLCompleter) -> None:
    assert complete(completer, ".hi") == [".history"]
    assert complete(completer, ".history ") == ["events", "users"]
    assert complete(completer, ".diff events ")[:2] == ["6", "5"]
    assert complete(completer, ".diff events 4 ")[:1] == ["6"]
    assert complete(completer, ".mode j") == ["json", "jsonlines"]
    assert complete(completer, ".timer o") == ["on", "off"]
    assert complete(completer, ".help .sch") == [".schema"]


def test_paths_for_file_arguments(completer: SQLCompleter, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "script.sql").write_text("SELECT 1;")
    monkeypatch.chdir(tmp_path)
    assert complete(completer, ".read scr") == ["ipt.sql"]


def test_table_references() -> None:
    refs = table_refs(tokens('SELECT * FROM wh.events VERSION AS OF 2 AS e, "Users" u WHERE 1 JOIN x ON true'))
    assert refs == {"events": "events", "e": "events", "users": "Users", "u": "Users", "x": "x"}
