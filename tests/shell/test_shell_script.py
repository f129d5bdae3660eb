"""``castsql URI -c SQL`` and SQL on standard input: output modes, exit status, one-line errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from castsql.shell.app import MODES as APP_MODES
from castsql.shell.app import main
from castsql.shell.render import MODES


def castsql(args: list[str], env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


# ---------------------------------------------------------------- real processes


def test_command_prints_csv_into_a_pipe(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    r = castsql([shell_warehouse, "-c", "SELECT id, name FROM users ORDER BY id"], shell_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "id,name\n1,ann\n2,bob\n3,NULL\n"  # NULL spelled out, as DuckDB's CLI does
    assert r.stderr == ""


def test_stdin_script_runs_statements_and_meta_commands(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    script = """
-- counts now and before the deletes
SELECT count(*) AS n FROM events;
SELECT count(*) AS n
  FROM events AS OF VERSION 2;
.mode json
SELECT id FROM users WHERE name IS NULL;
"""
    r = castsql([shell_warehouse], shell_env, stdin=script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == 'n\n1896\nn\n2000\n[{"id":3}]\n'


def test_an_error_in_standard_input_gives_status_1(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    """As DuckDB's CLI: a script on standard input goes on after an error and
    exits with status 1; with -bail it stops there; -c and -f always stop."""
    script = "SELECT 1 AS a;\nSELECT * FROM nosuch;\nSELECT 2 AS b;\n"
    r = castsql([shell_warehouse], shell_env, stdin=script)
    assert r.returncode == 1
    assert r.stdout == "a\n1\nb\n2\n"
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("Error: <stdin>:2: no table named nosuch (tables: events, users)")
    r = castsql([shell_warehouse, "-bail"], shell_env, stdin=script)
    assert (r.returncode, r.stdout) == (1, "a\n1\n")  # the statement after the error never ran
    r = castsql([shell_warehouse], shell_env, stdin=".bail on\n" + script)
    assert (r.returncode, r.stdout) == (1, "a\n1\n")
    r = castsql([shell_warehouse, "-c", script], shell_env)
    assert (r.returncode, r.stdout) == (1, "a\n1\n")


def test_bad_uri_and_bad_arguments(tmp_path, shell_env: dict[str, str]) -> None:
    r = castsql([str(tmp_path / "nothing-here"), "-c", "SELECT 1"], shell_env)
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "neither a table nor a warehouse" in r.stderr
    r = castsql(["--mode", "xml", "-c", "SELECT 1"], shell_env)
    assert r.returncode == 2 and "invalid choice: 'xml'" in r.stderr


def test_ctrl_c_cancels_a_script_with_status_130(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "castsql.cli",
            shell_warehouse,
            "-c",
            "SELECT 42 AS started; SELECT count(*) FROM range(1000000000) a, range(1000000000) b",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=shell_env,
    )
    # Past start-up (seconds on a loaded machine: a fixed sleep let the signal
    # land during imports) and into the cross join.
    assert p.stdout is not None and p.stdout.readline() == "started\n"
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=10)
    assert p.returncode == 130
    assert err.strip() == "Error: cancelled"


def test_closed_pipe_ends_quietly(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "castsql.cli", shell_warehouse, "-c", "SELECT * FROM range(3000000)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=shell_env,
    )
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline() == b"range\n"
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=20)
    assert p.returncode == 141
    assert "Traceback" not in err


# ---------------------------------------------------------------- in-process


@pytest.fixture
def run(shell_warehouse: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``run(args, stdin=None)`` -> (status, stdout, stderr) of ``castsql WAREHOUSE *args`` in this process."""
    import io

    def go(args: list[str], stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        status = main([shell_warehouse, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return go


def test_modes_of_command(run) -> None:
    q = "SELECT id, name FROM users WHERE id <= 2 ORDER BY id"
    status, out, _ = run(["--mode", "json", "-c", q])
    assert status == 0 and json.loads(out) == [{"id": 1, "name": "ann"}, {"id": 2, "name": "bob"}]
    status, out, _ = run(["--mode", "jsonlines", "-c", q])
    assert [json.loads(x) for x in out.splitlines()] == [{"id": 1, "name": "ann"}, {"id": 2, "name": "bob"}]
    status, out, _ = run(["--mode", "markdown", "-c", q])
    assert out == "| id | name |\n|---:|------|\n| 1  | ann  |\n| 2  | bob  |\n"
    status, out, _ = run(["--mode", "line", "-c", q])
    assert out == "   id = 1\n name = ann\n\n   id = 2\n name = bob\n"
    status, out, _ = run(["--mode", "box", "-c", q])
    assert out.splitlines()[0].startswith("┌") and out.endswith("2 rows\n")
    status, out, _ = run(["--mode", "table", "-c", q])
    assert out.splitlines()[0] == "+----+------+"


def test_command_with_several_statements_and_a_meta_command(run) -> None:
    status, out, err = run(["-c", "SELECT 1 AS a; SELECT 2 AS b;\n.mode line\nSELECT 3 AS c"])
    assert status == 0, err
    assert out == "a\n1\nb\n2\n    c = 3\n"


def test_meta_command_must_start_a_line(run) -> None:
    status, out, err = run(["-c", "SELECT 1 AS a; .tables"])
    assert status == 1
    assert out == "a\n1\n"
    assert err == "Error: .tables is a meta-command: it must start a line of its own\n"


def test_quit_stops_a_script(run) -> None:
    status, out, _ = run([], stdin="SELECT 1 AS a;\n.quit\nSELECT 2 AS b;\n")
    assert status == 0 and out == "a\n1\n"


def test_time_travel_and_audits_in_scripts(run) -> None:
    status, out, err = run(
        [],
        stdin="SELECT count(*) AS n FROM events AT (VERSION => 4);\n"
        "SELECT version, operation FROM table_history('events') WHERE version = 3;\n"
        "SELECT count(*) AS n FROM table_changes('events', 5, 5) WHERE _change_type = 'delete';\n",
    )
    assert status == 0, err
    assert out == "n\n1800\nversion,operation\n3,DELETE\nn\n4\n"


def test_dollar_quoted_strings_are_strings(run) -> None:
    # Was "internal error: ValueError: substring not found": the tokenizer knew only '…' literals.
    status, out, err = run(
        ["-c", "SELECT $$a)b$$ AS s, $t$x;$$ AS OF VERSION 1$t$ AS u; SELECT count(*) AS n FROM events"]
    )
    assert (status, err) == (0, "")
    assert out == "s,u\na)b,x;$$ AS OF VERSION 1\nn\n1896\n"


# A value and a column name that clear the screen, ring the bell and retitle the window.
EVIL_SQL = "SELECT chr(27) || '[2J' || chr(7) AS \"v\x1b]0;t\x07\", 1 AS n"


@pytest.mark.parametrize("mode", ["csv", "markdown", "line", "json", "box"])
def test_control_characters_reach_a_terminal_escaped(shell_warehouse: str, shell_env: dict[str, str], mode) -> None:
    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "castsql.cli", shell_warehouse, "--mode", mode, "-c", EVIL_SQL],
        env={**shell_env, "NO_COLOR": "1"},
        encoding="utf-8",
        timeout=30,
    )
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert [c for c in out if not c.isprintable() and c not in "\r\n"] == [], repr(out)
    assert ("\\u001b[2J" if mode == "json" else "\\x1b[2J") in out and "]0;t" in out


def test_csv_and_markdown_into_a_pipe_or_file_keep_the_bytes(
    shell_warehouse: str, shell_env: dict[str, str], tmp_path
) -> None:
    for mode in ("csv", "markdown"):
        r = castsql([shell_warehouse, "--mode", mode, "-c", EVIL_SQL], shell_env)
        assert r.returncode == 0 and "\x1b[2J\x07" in r.stdout and "v\x1b]0;t\x07" in r.stdout, r.stdout
    r = castsql([shell_warehouse, "--mode", "csv", "-c", EVIL_SQL], shell_env)
    assert r.stdout == '"v\x1b]0;t\x07",n\n"\x1b[2J\x07",1\n'  # quoted, as DuckDB's CLI quotes control characters
    # line keeps them too off a terminal (as DuckDB's CLI); json says \u001b (the same string)
    r = castsql([shell_warehouse, "--mode", "line", "-c", EVIL_SQL], shell_env)
    assert "\x1b[2J\x07" in r.stdout
    r = castsql([shell_warehouse, "--mode", "jsonlines", "-c", EVIL_SQL], shell_env)
    assert "\x1b" not in r.stdout and json.loads(r.stdout) == {"v\x1b]0;t\x07": "\x1b[2J\x07", "n": 1}
    out = tmp_path / "out.csv"
    r = castsql([shell_warehouse], shell_env, stdin=f".mode csv\n.output {out}\n{EVIL_SQL};\n")
    assert r.returncode == 0, r.stderr
    assert out.read_text() == '"v\x1b]0;t\x07",n\n"\x1b[2J\x07",1\n'


def test_the_command_always_exits_cleanly(shell_warehouse: str, shell_env: dict[str, str]) -> None:
    """12 runs, two at a time, on a table with deletes: status 0 and the whole
    answer every time (interpreter finalization with DuckDB's, pyarrow's and
    fsspec's threads alive aborted a few runs in 70: rc 134, "terminate called
    without an active exception")."""
    from pathlib import Path

    exe = Path(sys.executable).with_name("castsql")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "castsql.cli"]
    failures = []
    for _ in range(6):  # each run starts an interpreter (~2 s here): more belongs in a soak, not CI
        procs = [
            subprocess.Popen(
                [*cmd, shell_warehouse, "-c", "SELECT count(*) AS n FROM events"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=shell_env,
            )
            for _ in range(2)
        ]
        for p in procs:
            out, err = p.communicate(timeout=60)
            if (p.returncode, out, err) != (0, "n\n1896\n", ""):
                failures.append((p.returncode, out, err[-300:]))
    assert failures == []


def test_app_modes_match_the_renderer() -> None:
    assert APP_MODES == MODES


@pytest.mark.s3
def test_s3_warehouse_from_aws_environment(s3_server, s3_root: str, shell_env: dict[str, str]) -> None:
    import pyarrow as pa

    from castsql.format import TableLog, write_data_files
    from castsql.storage import open_storage

    cfg = s3_server.config
    st = open_storage(f"{s3_root}/wh/items", s3=cfg)
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    log.append(write_data_files(st, pa.table({"id": [1, 2, 3]})))
    log.append(write_data_files(st, pa.table({"id": [4]})))
    env = dict(
        shell_env,
        AWS_ENDPOINT_URL=cfg.endpoint_url or "",
        AWS_ACCESS_KEY_ID=cfg.key or "",
        AWS_SECRET_ACCESS_KEY=cfg.secret or "",
        AWS_REGION=cfg.region,
    )
    q = "SELECT (SELECT count(*) FROM items) AS now, (SELECT count(*) FROM items AS OF VERSION 1) AS v1"
    r = castsql([f"{s3_root}/wh", "-c", q + ";\n.tables"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:4] == [
        "now,v1",
        "4,3",
        "table,latest_version,location",
        f"items,2,{s3_root}/wh/items",
    ]


def test_no_uri_is_plain_duckdb(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["-c", "SELECT 6 * 7 AS x", "--safe"]) == 0
    assert capsys.readouterr().out == "x\n42\n"
