"""The real interactive shell in a pseudo-terminal (pexpect): typing, completion,
time travel, cancelling, meta-commands, history, leaving."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from pty_shell import Shell


@pytest.fixture
def shell(shell_warehouse: str, shell_env: dict[str, str]) -> Iterator[Shell]:
    sh = Shell([shell_warehouse], shell_env)
    try:
        yield sh
    finally:
        sh.close()


def test_banner_lists_tables_and_a_query_that_works(shell: Shell) -> None:
    assert "events v6" in shell.banner and "users v1" in shell.banner
    suggestion = re.search(r"Try:\s+(SELECT .*;)", shell.banner)
    assert suggestion, shell.banner
    assert suggestion.group(1) == "SELECT count(*) FROM events AS OF VERSION 5;"
    out = shell.run(suggestion.group(1))
    assert "1796" in out and "Error" not in out


def test_multiline_statement_and_time_travel(shell: Shell) -> None:
    shell.type("SELECT count(*) AS n\r")
    shell.child.expect_exact("...> ")  # Enter on an unfinished statement: a new line, not a run
    shell.type("FROM events\r")
    shell.child.expect_exact("...> ")
    out = shell.run("  AS OF VERSION 3;")
    assert re.search(r"│\s+1900\s+│", out), out
    out = shell.run("SELECT count(*) AS n FROM events;")
    assert re.search(r"│\s+1896\s+│", out), out
    out = shell.run("SELECT count(*) AS n FROM events VERSION AS OF 1 WHERE id < 500;")
    assert re.search(r"│\s+500\s+│", out), out


def test_tab_completes_table_and_column_names(shell: Shell) -> None:
    shell.type("SELECT * FROM eve")
    time.sleep(0.3)  # like a person: the name is typed before Tab
    shell.type("\t")
    shell.child.expect_exact("events")
    shell.type(" WHERE gr")
    time.sleep(0.3)
    shell.type("\t")
    shell.child.expect_exact("grp")
    out = shell.run(" = 'g3' AND id < 30 ORDER BY id;")
    assert "Error" not in out, out
    assert re.search(r"│\s+3\s+│ g3\s+│", out) and re.search(r"│\s+24\s+│ g3\s+│", out), out
    assert "3 rows" in out  # 3, 10 and 24: id 17 was deleted at version 5


def test_ctrl_c_cancels_a_running_query(shell: Shell) -> None:
    shell.type("SELECT count(*) FROM range(1000000000) a, range(1000000000) b;\r")
    shell.child.expect("Ctrl-C cancels")  # the progress line appears after ~0.5 s
    time.sleep(0.3)
    shell.type("\x03")
    t0 = time.monotonic()
    out = shell.wait_prompt(input_accepted=True)
    assert time.monotonic() - t0 < 5
    assert "cancelled" in out.lower() and "Traceback" not in out
    # Really cancelled: the process goes idle (the cross join would keep every core busy) …
    before = shell.cpu_seconds()
    time.sleep(1.0)
    assert shell.cpu_seconds() - before < 0.5
    # … and the connection answers the next query at once.
    out = shell.run("SELECT 40 + 2 AS answer;")
    assert re.search(r"│\s+42\s+│", out), out


def test_meta_command_then_quit(shell: Shell) -> None:
    out = shell.run(".history events")
    assert re.search(r"│\s+3 │ .* │ DELETE\s+│\s+0 │\s+0 │\s+100 │\s+1900 │", out), out
    assert "7 rows" in out
    shell.type(".quit\r")
    shell.child.expect(pexpect.EOF)
    shell.child.close()
    assert shell.child.exitstatus == 0


def test_ctrl_d_quits_and_ctrl_c_clears_the_line(shell: Shell) -> None:
    shell.type("SELECT this is not finished")
    shell.type("\x03")  # clears the line: nothing runs
    out = shell.wait_prompt()
    assert "Error" not in out
    out = shell.run("SELECT 7 AS seven;")
    assert "Error" not in out and re.search(r"│\s+7\s+│", out), out
    shell.type("\x04")
    shell.child.expect(pexpect.EOF)
    shell.child.close()
    assert shell.child.exitstatus == 0


def test_errors_are_one_line_and_the_session_survives(shell: Shell) -> None:
    out = shell.run("SELEC 1;")
    errors = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "syntax error" in errors[0], out
    assert "Traceback" not in out
    out = shell.run(".nosuch")
    assert "unknown command .nosuch" in out
    out = shell.run("SELECT * FROM events AS OF VERSION 99;")
    assert "version 99 does not exist" in out and "Traceback" not in out
    out = shell.run("SELECT count(*) AS n FROM users;")
    assert re.search(r"│\s+3\s+│", out), out


def test_history_persists_and_ctrl_r_finds_it(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    first = Shell([shell_warehouse], shell_env)
    try:
        first.run("SELECT 40 + 2 AS answer;")
        first.type("\x04")
        first.child.expect(pexpect.EOF)
    finally:
        first.close()
    assert "SELECT 40 + 2 AS answer;" in Path(shell_env["CASTSQL_HISTORY"]).read_text()
    second = Shell([shell_warehouse, "--no-banner"], shell_env)
    try:
        assert "Tables:" not in second.banner
        second.type("\x12")  # Ctrl-R
        second.child.expect("I-search backward|reverse-i-search")
        second.type("40 +")
        second.child.expect_exact("answer")
        second.type("\r")  # leave the search with the match in the buffer …
        time.sleep(0.2)
        out = second.run("")  # … and run it
        assert re.search(r"│\s+42\s+│", out), out
    finally:
        second.close()


def test_a_newcomer_creates_writes_restores_and_reads_history(tmp_path, shell_env: dict[str, str]) -> None:
    """An empty directory opens as an empty warehouse; SQL then makes a
    table, writes it, is refused a duplicate key in one line, deletes,
    restores an earlier version and reads who did what (issue 56)."""
    wh = tmp_path / "wh"
    wh.mkdir()
    sh = Shell([str(wh)], shell_env)
    try:
        out = sh.run("CREATE TABLE users (id BIGINT PRIMARY KEY, name VARCHAR);")
        assert "Error" not in out and "users: version 0 (CREATE" in out, out
        out = sh.run("INSERT INTO users VALUES (1, 'ann'), (2, 'bob');")
        assert re.search(r"│\s+2\s+│", out) and "users: version 1 (INSERT, 2 rows)" in out, out
        out = sh.run("INSERT INTO users VALUES (2, 'again');")
        errors = [ln for ln in out.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1 and "already in the table" in errors[0] and "Traceback" not in out, out
        out = sh.run("DELETE FROM users WHERE name = 'bob';")
        assert "users: version 2 (DELETE, 1 row)" in out, out
        out = sh.run("RESTORE TABLE users TO VERSION AS OF 1;")
        assert "users: version 3 (RESTORE" in out, out
        out = sh.run("SELECT count(*) AS n FROM users;")
        assert re.search(r"│\s+2\s+│", out), out
        assert "statement" in sh.run(".history users")  # a box as wide as the terminal: cut
        sh.run(".mode line")
        out = sh.run(".history users")
        assert "INSERT INTO users VALUES (1, 'ann'), (2, 'bob')" in out, out
        assert "DELETE FROM users WHERE name = 'bob'" in out and "RESTORE TABLE users TO VERSION AS OF 1" in out, out
    finally:
        sh.close()


def test_ctrl_c_during_a_write_leaves_the_table_at_its_version(tmp_path, shell_env: dict[str, str]) -> None:
    """Ctrl-C while an INSERT's query runs: cancelled, nothing committed, and
    the next write commits the next version (issue 56)."""
    wh = tmp_path / "wh"
    wh.mkdir()
    sh = Shell([str(wh)], shell_env)
    try:
        sh.run("CREATE TABLE t (n BIGINT, v VARCHAR);")
        sh.type("INSERT INTO t SELECT count(*), 'x' FROM range(1000000000) a, range(1000000000) b;\r")
        sh.child.expect("Ctrl-C cancels")
        time.sleep(0.3)
        sh.type("\x03")
        out = sh.wait_prompt(input_accepted=True)
        assert "cancelled" in out.lower() and "Traceback" not in out and "version 1" not in out, out
        assert sorted(p.name for p in (wh / "t" / "manifest").iterdir()) == ["v00000000.json"]
        out = sh.run("INSERT INTO t VALUES (1, 'a');")
        assert "t: version 1 (INSERT, 1 row)" in out, out
    finally:
        sh.close()
