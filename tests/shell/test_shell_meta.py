"""Meta-commands, run in-process through the shell core (the pty tests drive the same code through a terminal)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator

import pyarrow as pa
import pytest

from castsql.engine import Session
from castsql.format import TableLog, write_data_files
from castsql.shell.core import Settings, Shell
from castsql.shell.special import COMMANDS
from castsql.storage import open_storage


class Run:
    """A shell writing into buffers; ``run(*lines)`` returns (ok, stdout, stderr) of those lines."""

    def __init__(self, uri: str | None, mode: str = "csv") -> None:
        self.out, self.err = io.StringIO(), io.StringIO()
        self.shell = Shell(Session(uri), settings=Settings(mode=mode), stdout=self.out, stderr=self.err)

    def __call__(self, *lines: str) -> tuple[bool, str, str]:
        start_out, start_err = self.out.tell(), self.err.tell()
        ok = self.shell.run_lines([ln + "\n" for ln in lines], "<test>")
        return ok, self.out.getvalue()[start_out:], self.err.getvalue()[start_err:]


@pytest.fixture
def run(shell_warehouse: str) -> Iterator[Run]:
    r = Run(shell_warehouse)
    try:
        yield r
    finally:
        r.shell.close()


def test_help_lists_every_command(run: Run) -> None:
    ok, out, _ = run(".help")
    assert ok
    for name, cmd in COMMANDS.items():
        assert cmd.usage in out, name
    ok, out, _ = run(".help diff")
    assert ok
    assert out.startswith(".diff TABLE FROM [TO]\n")


def test_tables_and_schema(run: Run, shell_warehouse: str) -> None:
    ok, out, _ = run(".tables")
    assert ok
    assert out == (
        "table,latest_version,location\n"
        f"events,6,{os.path.join(shell_warehouse, 'events')}\n"
        f"users,1,{os.path.join(shell_warehouse, 'users')}\n"
    )
    ok, out, _ = run(".schema users")
    assert ok
    assert out == "column,type,key\nid,int64,primary key\nname,string,\nemail,string,\n"
    ok, out, _ = run(".schema")
    assert ok
    assert out.splitlines()[0] == "table,column,type,key" and len(out.splitlines()) == 8


def test_history_and_diff(run: Run) -> None:
    ok, out, _ = run(".history events")
    assert ok
    lines = out.splitlines()
    assert lines[0] == "version,committed_at,operation,rows_inserted,rows_updated,rows_deleted,live_rows"
    assert re.fullmatch(r"3,\S+ \S+,DELETE,0,0,100,1900", lines[4])
    ok, out, _ = run(".diff events 4 5")
    assert ok
    lines = out.splitlines()
    assert lines[0] == "events: version 5 against 4: 0 rows inserted, 0 updated, 4 deleted"
    assert lines[1] == "_change_type,id,grp,val,ts"
    assert sorted(int(ln.split(",")[1]) for ln in lines[2:]) == [0, 5, 17, 1999]
    ok, out, _ = run(".diff events 6 2")  # backwards: what version 2 has that 6 lacks
    assert ok
    assert out.splitlines()[0] == "events: version 2 against 6: 204 rows inserted, 0 updated, 100 deleted"
    ok, out, _ = run(".diff users 0")
    assert ok
    assert out.splitlines()[0] == "users: version 1 against 0: 3 rows inserted, 0 updated, 0 deleted"


def test_bad_arguments_get_a_one_line_hint(run: Run) -> None:
    cases = {
        ".histroy events": "unknown command .histroy; did you mean .history? (.help lists the commands)",
        ".diff events": "usage: .diff TABLE FROM [TO]",
        ".diff events x 3": "FROM must be a version number, not 'x'",
        ".diff nosuch 1 2": "no table named 'nosuch' (tables: events, users)",
        ".mode xml": "unknown mode 'xml' (modes: box, table, csv, tabs, list, json, jsonlines, markdown, line)",
        ".timer maybe": "usage: .timer on|off",
        ".maxrows lots": "usage: .maxrows N (a number of rows, not 'lots')",
        ".maxwidth -3": "usage: .maxwidth N (0 or more; 0 fits the terminal)",
        ".headers maybe": "usage: .headers on|off",
        '.separator ""': "usage: .separator SEP (one or more characters)",
        ".read /no/such/file.sql": "cannot read /no/such/file.sql: No such file or directory",
        ".history": "usage: .history TABLE (tables: events, users)",
        ".output 'unterminated": "No closing quotation",
        ".diff events 9 10": "version 9 does not exist (latest is 6)",
    }
    for line, message in cases.items():
        ok, _, err = run(line)
        assert not ok
        assert err.count("\n") == 1 and err.startswith("Error: ") and message in err, (line, err)
    ok, out, _ = run("SELECT 1 AS still_here, NULL AS n;")
    assert ok and out == "still_here,n\n1,NULL\n"  # headers, separator and null text as they were


def test_mode_timer_types_maxrows(run: Run) -> None:
    ok, out, _ = run(".mode line", "SELECT 1 AS a, 'x' AS b;")
    assert ok
    assert out == "    a = 1\n    b = x\n"
    ok, out, _ = run(".mode", ".timer on", "SELECT 1 AS a;", ".timer off")
    assert ok
    assert out.startswith("mode: line")
    assert re.search(r"^    a = 1\nRun Time \(s\): real \d+\.\d{3}$", out, re.M)
    ok, out, _ = run(".mode table", ".types on", ".maxrows 4", "SELECT id FROM events ORDER BY id;")
    assert ok
    lines = out.splitlines()
    assert lines[2] == "| bigint |"
    assert [ln.strip("| ") for ln in lines[4:9]] == ["1", "2", "·", "2098", "2099"]
    assert lines[-1] == "1,896 rows (4 shown)"


def test_output_and_once(run: Run, tmp_path) -> None:
    once, always = tmp_path / "once.csv", tmp_path / "all.csv"
    ok, out, err = run(f".once {once}", "SELECT 1 AS a;", "SELECT 2 AS b;")
    assert ok, err
    assert once.read_text() == "a\n1\n" and out == "b\n2\n"
    ok, out, _ = run(f".output {always}", "SELECT 3 AS c;", ".tables", ".output", "SELECT 4 AS d;")
    assert ok
    assert always.read_text().startswith("c\n3\ntable,latest_version,location\n")
    assert out == "d\n4\n"


def _objects(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_output_and_once_never_write_into_a_table_or_warehouse(tmp_path, shell_env) -> None:
    """Issue 54: ``.output WH/t/_latest_manifest`` opened the pointer with a
    plain open() and replaced it by CSV, where ``COPY … TO`` the same path is
    refused. Every output target now passes COPY's barrier
    (castsql.engine.barrier.policy.check_write_target): nothing inside or above an
    opened table or warehouse, however the path is spelled; the error says
    why and the table is byte for byte as it was."""
    import subprocess
    import sys

    wh = tmp_path / "wh"
    st = open_storage(str(wh / "t"))
    log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
    log.append(write_data_files(st, pa.table({"id": [1, 2, 3]})))
    data = next(p for p in (wh / "t" / "data").rglob("*.parquet"))
    os.symlink(wh / "t", tmp_path / "link")
    before = _objects(wh)
    targets = [
        wh / "t" / "_latest_manifest",
        data,
        wh / "t" / "new.csv",
        wh,
        tmp_path,  # above the warehouse
        tmp_path / "link" / "_latest_manifest",  # through a symbolic link
        f"{wh}/t/../t/_latest_manifest",
    ]
    r = Run(str(wh))
    try:
        for target in targets:
            for command in (".output", ".once"):
                ok, _, err = r(f"{command} {target}", "SELECT 42 AS answer;")
                assert not ok, (command, target)
                assert "the target overlaps" in err and "outside every opened table and warehouse" in err, err
        assert _objects(wh) == before
        # Relative to the current directory, as open() reads it.
        cwd = os.getcwd()
        os.chdir(wh / "t")
        try:
            ok, _, err = r(".output _latest_manifest", "SELECT 1;")
        finally:
            os.chdir(cwd)
        assert not ok and "the target overlaps" in err
        # A file set before a table was opened there is checked again at the next result.
        fresh = tmp_path / "later"
        fresh.mkdir()
        ok, _, err = r(f".output {fresh}/x.csv", "SELECT 1 AS a;")
        assert ok, err
        ok, _, err = r(f".open --add {wh / 't'} t2", "SELECT 2 AS b;")  # not an overlap: still written
        assert ok, err
        assert (fresh / "x.csv").read_text() == "a\n1\nb\n2\n"
    finally:
        r.shell.close()
    assert _objects(wh) == before
    # The reproduction, through the command line.
    p = subprocess.run(
        [sys.executable, "-m", "castsql.cli", str(wh), "-c", f".output {wh}/t/_latest_manifest", "-c", "SELECT 1"],
        capture_output=True, text=True, env=shell_env, timeout=120,
    )  # fmt: skip
    assert p.returncode == 1 and "the target overlaps" in p.stderr, p.stderr
    assert _objects(wh) == before


def test_an_output_file_a_later_open_puts_inside_a_table_is_dropped(tmp_path) -> None:
    wh = tmp_path / "wh"
    st = open_storage(str(wh / "t"))
    TableLog.create(st, pa.schema([("id", pa.int64())]))
    r = Run(None)
    try:
        ok, _, err = r(f".output {wh}/t/notes.csv", "SELECT 1 AS a;")
        assert ok, err
        ok, _, err = r(f".open {wh}", "SELECT 2 AS b;")
        assert not ok and "the target overlaps" in err, err
        ok, out, err = r("SELECT 3 AS c;")  # back on the console
        assert ok and out == "c\n3\n", err
    finally:
        r.shell.close()
    assert (wh / "t" / "notes.csv").read_text() == "a\n1\n"


def test_read_runs_a_file_and_stops_at_its_first_error(run: Run, tmp_path) -> None:
    script = tmp_path / "script.sql"
    script.write_text("SELECT 1 AS a;\n.mode line\nSELECT\n  nosuch_column\nFROM users;\nSELECT 2 AS b;\n")
    ok, out, err = run(f".read {script}", "SELECT 3 AS c;")
    assert not ok  # the error inside .read stops the outer script too
    assert out == "a\n1\n"
    assert err.startswith(f'Error: {script}:3: Binder Error: Referenced column "nosuch_column" not found')
    assert err.count("\n") == 1
    selfish = tmp_path / "selfish.sql"
    selfish.write_text(f".read {selfish}\n")
    ok, _, err = run(f".read {selfish}")
    assert not ok and "nested more than 16 deep" in err


def test_open_refresh_and_new_commits(tmp_path, shell_warehouse: str) -> None:
    root = str(tmp_path / "live")
    st = open_storage(root)
    log = TableLog.create(st, pa.schema([("x", pa.int64())]))
    log.append(write_data_files(st, pa.table({"x": [1, 2]})))
    r = Run(shell_warehouse)
    try:
        ok, out, err = r(f".open {root}")
        assert ok, err
        assert out == "Tables: live v1\n"
        ok, out, _ = r("SELECT count(*) AS n FROM live;")
        assert out == "n\n2\n"
        log.append(write_data_files(st, pa.table({"x": [3]})))
        ok, out, _ = r("SELECT count(*) AS n FROM live;", ".refresh")  # queries see new commits by themselves
        assert out == "n\n3\nLatest versions: live v2\n"
        ok, out, err = r(f".open --add {shell_warehouse}")
        assert out == "Tables: events v6, live v2, users v1\n"
        # A second table of a name already open: said as such, and addable under a name of its own.
        ok, _, err = r(f".open --add {root}")
        assert not ok and "a table of the same name is open already: 'live'" in err and "NAME" in err
        ok, out, err = r(f".open --add {root} live2", "SELECT count(*) AS n FROM live2;")
        assert ok and out == "Tables: events v6, live v2, live2 v2, users v1\nn\n3\n", err
        ok, _, err = r(f".open --add {shell_warehouse} other")
        assert not ok and "a name is given to one table" in err
        ok, _, err = r(f".open {tmp_path / 'missing'}")
        assert not ok and "neither a table nor a warehouse" in err
        ok, out, _ = r("SELECT count(*) AS n FROM users;")  # the failed .open left the session as it was
        assert out == "n\n3\n"
    finally:
        r.shell.close()


def test_quit_words(run: Run) -> None:
    for word in (".quit", ".exit", "quit", "exit"):
        run.shell.exit_requested = False
        ok, _, _ = run(word, "SELECT 1;")
        assert ok and run.shell.exit_requested


def test_control_characters_in_names_never_reach_the_terminal(tmp_path) -> None:
    """A directory name can hold escape sequences (retitle, clear, recolour the
    terminal): the banner, meta-commands and error lines show them escaped."""
    from castsql.shell.banner import banner_text

    evil = "ev\x1b]0;pwned\x07\x1b[2J"
    st = open_storage(str(tmp_path / "wh" / evil))
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    log.append(write_data_files(st, pa.table({"id": [1]})))
    r = Run(str(tmp_path / "wh"), mode="box")
    try:
        r.shell.say(banner_text(r.shell.session))
        for line in (".tables", ".schema", ".history", f'SELECT * FROM "{evil}" AS OF VERSION 7;', ".refresh"):
            r(line)
        out, err = r.out.getvalue(), r.err.getvalue()
    finally:
        r.shell.close()
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text
    assert "ev\\x1b]0;pwned\\x07\\x1b[2J" in out
    assert "version 7 does not exist" in err
