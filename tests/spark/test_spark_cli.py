"""``castsql append|delete|compact|gc``: a summary line on success, one error line and exit 1 (2 for a
malformed command line) otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import events_rows

from castsql.format import TableLog
from castsql.storage import open_storage
from castsql.write_cli import UsageError, main, parse_age

pytestmark = pytest.mark.spark


def _files(tmp_path: Path) -> dict[str, str]:
    out = {}
    pq.write_table(events_rows(range(0, 1000)), out.setdefault("parquet", str(tmp_path / "a.parquet")))
    pacsv.write_csv(events_rows(range(1000, 1100)), out.setdefault("csv", str(tmp_path / "b.csv")))
    rows = events_rows(range(1100, 1150)).to_pylist()
    with open(out.setdefault("json", str(tmp_path / "c.jsonl")), "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "ts": r["ts"].isoformat()}) + "\n")
    return out


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    """``castsql *argv`` in this process; delete, update and merge on Spark unless ``--engine`` says otherwise."""
    spark = argv[:1] in (("delete",), ("update",), ("merge",)) and "--engine" not in argv
    rc = main([*argv, "--engine", "spark"] if spark else list(argv))
    out, err = capsys.readouterr()
    return rc, out.strip(), err.strip()


def test_every_subcommand_end_to_end(spark, check_version, tmp_path, capsys):
    files = _files(tmp_path)
    uri = str(tmp_path / "events")
    rc, out, _ = _run(capsys, "append", uri, "--from", files["parquet"], "--primary-key", "id")
    assert rc == 0 and out.startswith("append: committed version 1; 1 file(s), 1,000 row(s), ")
    # In this process by default, with Spark when asked: the same table either way.
    rc, out, _ = _run(capsys, "append", uri, "--from", files["csv"], "--engine", "spark")  # types cast to the table's
    assert rc == 0 and "committed version 2; 1 file(s), 100 row(s)" in out
    rc, out, _ = _run(capsys, "append", uri, "--from", files["json"], "--format", "json")
    assert rc == 0 and "committed version 3" in out and "table: 3 file(s), 1,150 stored row(s)" in out
    check_version(uri, 3, range(1150))

    rc, out, _ = _run(capsys, "delete", uri, "--where", "id < 700")
    assert rc == 0 and out.startswith("delete: committed version 4; 700 row(s) deleted in 1 tombstone record(s)")
    rc, out, _ = _run(capsys, "delete", uri, "--where", "id < 0")
    assert (rc, out) == (0, "delete: no row matched; nothing committed")
    rc, out, _ = _run(capsys, "compact", uri, "--threshold", "0.6", "--engine", "spark")
    assert rc == 0 and out.startswith("compact: committed version 5; 1 file(s), 300 row(s)")
    assert "1 file(s) removed, 1 tombstone file(s) merged" in out
    rc, out, _ = _run(capsys, "compact", uri, "--engine", "spark")
    assert (rc, out) == (0, "compact: nothing to compact; nothing committed")
    check_version(uri, 5, range(700, 1150))

    rc, out, _ = _run(capsys, "gc", uri, "--keep-versions", "1", "--grace", "0s", "--dry-run")
    assert rc == 0 and out.startswith("gc: would remove 5 version(s) 0-4, 1 data file(s), 1 tombstone file(s)")
    rc, out, _ = _run(capsys, "gc", uri, "--older-than", "1d")
    assert rc == 0 and out.startswith("gc: removed 0 version(s)")
    rc, out, _ = _run(capsys, "gc", uri, "--keep-versions", "1", "--grace", "0s")
    assert rc == 0 and out.startswith("gc: removed 5 version(s) 0-4")
    assert TableLog(open_storage(uri)).versions() == [5]
    check_version(uri, 5, range(700, 1150))


@pytest.mark.parametrize(
    ("argv", "message", "code"),
    [
        (["delete", "{uri}", "--where", "nope = 1"], "castsql delete: error: bad condition: [UNRESOLVED_COLUMN", 1),
        (["delete", "{uri}", "--where", "id = = 1"], "castsql delete: error: bad condition: [PARSE_SYNTAX_ERROR]", 1),
        (["delete", "{uri}", "--where", "id + 1"], "must be true or false for each row; 'id + 1' is bigint", 1),
        (["delete", "{uri}", "--where", "kind = 5"], "column kind is string, and the condition 'kind = 5'", 1),
        (
            ["delete", "{uri}", "--where", "CAST(kind AS INT) = 5"],
            '[CAST_INVALID_INPUT] The value \'view\' of the type "STRING" cannot be cast to "INT"',
            1,
        ),
        (["delete", "{uri}/../nothing", "--where", "true"], "no table here", 1),
        (["delete", "{uri}"], "the following arguments are required: --where", 2),
        (["compact", "{uri}", "--threshold", "2"], "--threshold must be in (0, 1], got 2.0", 2),
        (["gc", "{uri}", "--older-than", "7x"], "'7x' is not an age (use a number and a unit: 7d, 12h, 30m, 45s)", 2),
        (["gc", "{uri}", "--keep-versions", "0"], "keep_versions must be at least 1", 1),
        (["append", "{uri}", "--from", "/no/such/file.parquet"], "append: no such file: /no/such/file.parquet", 2),
        (["append", "{uri}", "--from", "{bad}"], "the data has no column 'id', the table's primary key", 1),
        (["append", "{uri}", "--from", "{csv}", "--format", "parquet"], "castsql append: error:", 1),
        # A Parquet string is not text to parse (that is CSV's and JSON's): refused naming both types.
        (["append", "{uri}", "--from", "{text_id}"], "column 'id' is string in the data, the table has int64", 1),
        (["frobnicate", "{uri}"], "invalid choice: 'frobnicate'", 2),
    ],
)
def test_errors_are_one_line_and_change_nothing(spark, tmp_path, capsys, argv, message, code):
    uri = str(tmp_path / "events")
    files = _files(tmp_path)
    pq.write_table(events_rows(range(5)).drop(["id"]), bad := str(tmp_path / "bad.parquet"))
    rows = events_rows(range(5))
    rows = rows.set_column(0, "id", rows["id"].cast(pa.string()))
    pq.write_table(rows, text_id := str(tmp_path / "text_id.parquet"))
    assert main(["append", uri, "--from", files["parquet"], "--primary-key", "id"]) == 0
    capsys.readouterr()
    st = open_storage(uri)
    before = sorted((i.key, i.size) for i in st.list(""))
    rc, out, err = _run(capsys, *[a.format(uri=uri, bad=bad, csv=files["csv"], text_id=text_id) for a in argv])
    assert rc == code and out == ""
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err
    after = [(k, n) for k, n in sorted((i.key, i.size) for i in st.list("")) if not k.startswith("data/")]
    assert after == [(k, n) for k, n in before if not k.startswith("data/")]  # no commit (data files: orphans at most)
    assert TableLog(st).latest().version == 1


def test_parse_age():
    assert parse_age("7d").days == 7 and parse_age("12h").total_seconds() == 43200
    assert parse_age("30m").total_seconds() == 1800 and parse_age("1.5s").total_seconds() == 1.5
    with pytest.raises(UsageError):
        parse_age("soon")


def test_the_castsql_command_in_a_real_process(spark, events_df, tmp_path):
    """Through castsql.cli, in a fresh process: its own Spark, a summary on
    stdout, no Spark INFO chatter; errors without Spark start-up or traceback."""
    from castsql.spark import append

    uri = str(tmp_path / "events")
    append(spark, uri, events_df(range(100)), primary_key="id")
    cmd = [sys.executable, "-m", "castsql.cli"]
    out = subprocess.run(
        [*cmd, "delete", uri, "--where", "id >= 90", "--engine", "spark"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("delete: committed version 2; 10 row(s) deleted")
    assert " INFO " not in out.stderr
    out = subprocess.run(
        [*cmd, "delete", uri + "-missing", "--where", "true", "--engine", "spark"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == f"castsql delete: error: {uri}-missing: no table here (no _latest_manifest)"
    out = subprocess.run([*cmd, "gc", uri, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gc: would remove 0 version(s)")
