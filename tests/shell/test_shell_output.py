"""The shell's text modes write what DuckDB's own CLI writes, byte for byte,
and take DuckDB's CLI flags and dot-commands (issue 38).

The reference is the real ``duckdb`` CLI of the same DuckDB release
(``duckdb-cli`` in the dev extra), run on the same rows in Parquet: every
mode, with the separator, null text and header options, over values chosen
to hit each quoting and escaping rule (separators, quotes, control
characters, non-ASCII, NaN and infinities, decimals, huge integers, nested
values, BC dates, NULLs).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import castsql

TRICKY = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5, 6, 7], pa.int64()),
        "s": ["plain", "x,y", "q\"q's", "line\nbreak\ttab\rcr", None, "\x01\x1b[31m\x7f", "wide 漢字テスト é"],
        "d": [1.5, float("nan"), 1e20, 1e-7, None, float("inf"), -0.0],
        "dec": pa.array(
            [decimal.Decimal(x) if x else None for x in ["1.50", "-3.25", "0.01", None, None, "99.99", "1"]],
            pa.decimal128(5, 2),
        ),
        "ts": pa.array(
            [
                dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                None,
                dt.datetime(1999, 12, 31, 23, 59, 59, 123456, tzinfo=dt.UTC),
                None,
                None,
                None,
                None,
            ],
            pa.timestamp("us", "UTC"),
        ),
        "day": pa.array([dt.date(2024, 1, 1), None, dt.date(1, 1, 1), None, None, None, dt.date(9999, 12, 31)]),
        "b": [True, False, None, True, None, None, None],
        "bl": pa.array([b"x", b"\xff", None, None, None, None, b"a,b"], pa.binary()),
        "big": pa.array([1, 2**63, None, None, None, None, 0], pa.uint64()),
        "f": pa.array([2.5, float("-inf"), None, None, None, 0.1, None], pa.float32()),
        "v2": ["a", "é한", None, "a|b|c", "", "  lead", "back\\slash"],
    }
)
# Nested values come from SQL: the table format holds flat columns.
QUERY = (
    "SELECT *, [id, NULL] AS l, {{'a': dec, 'b': s}} AS st, CASE WHEN id > 3 THEN [] END AS e FROM {src} ORDER BY id"
)
DUCKDB_CLI = Path(sys.executable).with_name("duckdb")


@pytest.fixture(scope="module")
def tricky(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(a warehouse holding table ``t`` of TRICKY rows, the same rows as one Parquet file)."""
    root = tmp_path_factory.mktemp("tricky")
    castsql.write_table(str(root / "wh" / "t"), TRICKY, primary_key="id")
    pq.write_table(TRICKY, root / "t.parquet")
    return str(root / "wh"), str(root / "t.parquet")


def _env() -> dict[str, str]:
    return {**os.environ, "TZ": "UTC", "NO_COLOR": "1"}


def _duckdb(flags: list[str], sql: str) -> bytes:
    r = subprocess.run(
        [str(DUCKDB_CLI), *flags, "-c", "SET TimeZone = 'UTC'", "-c", sql], capture_output=True, env=_env()
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _castsql(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args],
        input=(stdin or "").encode(),
        capture_output=True,
        env=_env(),
    )


MODE_FLAGS = [
    ["-csv"],
    ["-json"],
    ["-jsonlines"],
    ["-line"],
    ["-list"],
    ["-csv", "-separator", ";", "-nullvalue", ""],
    ["-csv", "-noheader"],
    ["-list", "-separator", "a"],
    ["-csv", "-separator", "-"],  # a separator that occurs inside numbers and dates: they are quoted too
    ["-csv", "-separator", "."],
    ["-json", "-nullvalue", "nothing"],  # JSON's null stays null, as in DuckDB's CLI
]


@pytest.mark.skipif(not DUCKDB_CLI.exists(), reason="duckdb-cli (dev extra) is not installed")
@pytest.mark.parametrize("flags", MODE_FLAGS, ids=lambda f: " ".join(f))
def test_text_modes_write_what_duckdbs_cli_writes(tricky: tuple[str, str], flags: list[str]) -> None:
    wh, parquet = tricky
    want = _duckdb(flags, QUERY.format(src=f"'{parquet}'"))
    r = _castsql([wh, *flags, "-c", QUERY.format(src="t")])
    assert r.returncode == 0, r.stderr
    assert r.stdout == want


@pytest.mark.skipif(not DUCKDB_CLI.exists(), reason="duckdb-cli (dev extra) is not installed")
def test_markdown_and_tabs_write_what_duckdbs_cli_writes(tricky: tuple[str, str]) -> None:
    """Markdown pads every column to its widest value, East Asian wide
    characters counting two. Rows with control characters are left out: the
    CLI's width of ESC sequences and of CR is its terminal's, not a rule
    worth copying (see docs/SHELL.md)."""
    wh, parquet = tricky
    where = "WHERE id NOT IN (4, 6)"
    cases = [
        (["-markdown"], ["-markdown"], f"SELECT * FROM {{src}} {where} ORDER BY id"),
        # whole seconds and dates: widths from the smallest and largest values, without casting every one
        (["-markdown"], ["-markdown"], "SELECT id, ts, day, ts::TIMESTAMP AS t2 FROM {src} WHERE id <> 3 ORDER BY id"),
        (["--mode", "tsv"], ["-cmd", ".mode tabs"], f"SELECT * FROM {{src}} {where} ORDER BY id"),
    ]
    for flags, duck_flags, sql in cases:
        want = _duckdb(duck_flags, sql.format(src=f"'{parquet}'"))
        r = _castsql([wh, *flags, "-c", sql.format(src="t")])
        assert r.returncode == 0, r.stderr
        assert r.stdout == want, (r.stdout.decode(), want.decode())


@pytest.mark.skipif(not DUCKDB_CLI.exists(), reason="duckdb-cli (dev extra) is not installed")
@pytest.mark.parametrize("flag", ["-csv", "-json", "-jsonlines", "-markdown", "-line", "-list"])
def test_an_empty_result_as_duckdbs_cli_writes_it(tricky: tuple[str, str], flag: str) -> None:
    wh, parquet = tricky
    want = _duckdb([flag], f"SELECT id, s FROM '{parquet}' WHERE false")
    r = _castsql([wh, flag, "-c", "SELECT id, s FROM t WHERE false"])
    assert (r.returncode, r.stdout) == (0, want)


def test_json_output_reads_back_as_the_values(tricky: tuple[str, str]) -> None:
    wh, _ = tricky
    sql = "SELECT id, s, dec, [id, NULL] AS l, {'a': id, 'b': s} AS st, big FROM t ORDER BY id"
    r = _castsql([wh, "-jsonlines", "-c", sql])
    rows = [json.loads(line) for line in r.stdout.decode().split("\n")[:-1]]
    assert rows[0] == {"id": 1, "s": "plain", "dec": "1.50", "l": [1, None], "st": {"a": 1, "b": "plain"}, "big": "1"}
    assert rows[1]["big"] == str(2**63)  # beyond BIGINT: a string, as the CLI writes it, so no reader loses digits
    assert [r["s"] for r in rows] == TRICKY.column("s").to_pylist()


def test_duckdb_cli_flags_and_positional_sql(tricky: tuple[str, str], tmp_path) -> None:
    wh, _ = tricky
    # `duckdb -csv -c …` with castsql in front, the flags before or after the table, SQL after it
    for args in (
        [wh, "-csv", "-c", "SELECT 1 AS a"],
        ["-csv", wh, "SELECT 1 AS a"],
        [wh, "-s", "SELECT 1 AS a", "-csv"],
    ):
        r = _castsql(args)
        assert (r.returncode, r.stdout) == (0, b"a\n1\n"), (args, r.stderr)
    r = _castsql([wh, "-csv", "-echo", "-c", "SELECT 1 AS a"])
    assert r.stdout == b"SELECT 1 AS a\na\n1\n"
    r = _castsql([wh, "-csv", "-c", "SELECT 1 AS a", "-c", "SELEC", "-c", "SELECT 2 AS b"])
    assert r.returncode == 1 and r.stdout == b"a\n1\n" and r.stderr.count(b"\n") == 1
    r = _castsql([wh, "-csv", "-cmd", ".mode json", "-c", "SELECT 1 AS a"])
    assert r.stdout == b'[{"a":1}]\n'
    r = _castsql(["-version"])
    assert r.returncode == 0 and b"DuckDB 1.5.5" in r.stdout


def test_f_runs_a_file_and_names_the_line_of_its_error(tricky: tuple[str, str], tmp_path) -> None:
    wh, _ = tricky
    script = tmp_path / "report.sql"
    script.write_text("-- a report\nSELECT count(*) AS n\n  FROM t;\n.mode json\nSELECT nope FROM t;\nSELECT 2 AS b;\n")
    r = _castsql([wh, "-csv", "-f", str(script)])
    assert r.returncode == 1
    assert r.stdout == b"n\n7\n"  # -f stops at its first error, as DuckDB's does
    err = r.stderr.decode()
    assert err.startswith(f"Error: {script}:5: ") and "nope" in err and err.count("\n") == 1
    r = _castsql([wh, "-csv", "-f", str(tmp_path / "missing.sql")])
    assert r.returncode == 1 and "cannot read" in r.stderr.decode() and "missing.sql" in r.stderr.decode()
    # -f is the user's own file: safe mode runs it (what safe mode refuses is SQL reading files)
    script.write_text("SELECT count(*) AS n FROM t;\n")
    r = _castsql([wh, "--safe", "-csv", "-f", str(script)])
    assert (r.returncode, r.stdout) == (0, b"n\n7\n"), r.stderr


def test_dot_commands_for_text_output(tricky: tuple[str, str], tmp_path) -> None:
    wh, _ = tricky
    out = tmp_path / "out.csv"
    script = (
        '.mode csv\n.headers off\n.separator "\\t"\n.nullvalue -\n'
        "SELECT id, s FROM t WHERE id IN (1, 5) ORDER BY id;\n"
        f".headers on\n.once {out}\nSELECT 42 AS answer;\n.mode list\n.separator |\nSELECT 'a' AS x, NULL AS y;\n"
    )
    r = _castsql([wh], stdin=script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"1\tplain\n5\t-\nx|y\na|-\n"
    assert out.read_text() == "answer\n42\n"


def test_safe_mode_writes_text_modes(tricky: tuple[str, str]) -> None:
    wh, _ = tricky
    for flag in ("-csv", "-json", "-markdown"):
        r = _castsql([wh, "--safe", flag, "-c", "SELECT id FROM t WHERE id = 1"])
        assert r.returncode == 0 and b"1" in r.stdout, r.stderr


def test_a_query_that_fails_midway_writes_no_header_and_one_error(tricky: tuple[str, str]) -> None:
    wh, _ = tricky
    r = _castsql([wh, "-csv", "-c", "SELECT CAST(s AS INTEGER) AS n FROM t"])
    assert r.returncode == 1
    assert r.stdout == b"" and r.stderr.startswith(b"Error: Conversion Error") and r.stderr.count(b"\n") == 1
    # DuckDB failed in the statement that writes the result: its excerpt of
    # that internal statement (a view, a pipe's path) is not shown.
    for flag in ("-csv", "-markdown"):  # markdown runs a query of its own first: the column widths
        r = _castsql([wh, flag, "-c", "SELECT count(*) FROM t WHERE ts > '2025-13-45 99:99:99Z'"])
        assert r.returncode == 1 and r.stdout == b""
        assert r.stderr.startswith(b"Error: Conversion Error: timestamp field value out of range")
        assert r.stderr.count(b"\n") == 1
        assert b"COPY" not in r.stderr and b"castsql_out" not in r.stderr
