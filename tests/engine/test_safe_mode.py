"""Safe mode: queries read the opened tables and nothing else; and in every
mode, a table cannot point a reader at objects outside its root."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from castsql.engine import Session
from castsql.engine.barrier.safety import SafeModeError
from castsql.errors import CastSQLError, FormatError
from castsql.format.layout import manifest_key


@pytest.fixture
def safe(events, s3_config):
    with Session(events.log.uri, s3=s3_config, safe=True) as s:
        yield s


def test_safe_session_reads_its_tables(safe, events):
    assert safe.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(events.live[6])
    assert safe.sql("SELECT count(*) AS n FROM events AS OF VERSION 4")["n"][0].as_py() == len(events.live[4])
    assert safe.sql("SELECT count(*) AS n FROM table_changes('events', 3, 5)")["n"][0].as_py() == 204
    assert "EXPLAIN" not in safe.sql("EXPLAIN SELECT * FROM events").column_names


@pytest.fixture
def outside(tmp_path):
    """A Parquet file and a text file outside every table."""
    pq.write_table(pa.table({"secret": [42]}), tmp_path / "other.parquet")
    (tmp_path / "notes.txt").write_text("private\n")
    return tmp_path


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('{outside}/notes.txt')",
        "SELECT * FROM read_parquet('{outside}/other.parquet')",
        "SELECT * FROM '{outside}/other.parquet'",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_csv('https://example.com/data.csv')",
    ],
)
def test_other_files_and_urls_are_refused(safe, outside, sql):
    with pytest.raises(CastSQLError, match=r"(?i)permission|not allowed|disabled|not an object of the opened"):
        safe.sql(sql.format(outside=outside))


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO '{root}/data/evil.csv'",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{root}/x.csv'",
        "INSTALL spatial",
        "LOAD httpfs",
        "ATTACH '{outside}/x.duckdb'",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "CREATE TABLE t AS SELECT 1",
        "SELECT 1; COPY (SELECT 1) TO '{root}/y.csv'",
    ],
)
def test_writes_installs_and_settings_are_refused(safe, events, outside, sql):
    before = sorted(o.key for o in events.log.storage.list(""))
    with pytest.raises(SafeModeError, match=r"safe mode: .* not allowed"):
        safe.sql(sql.format(root=events.log.uri, outside=outside))
    assert sorted(o.key for o in events.log.storage.list("")) == before


def test_no_more_tables_once_safe(safe, outside):
    with pytest.raises(SafeModeError, match="tables are fixed"):
        safe.open(str(outside))


def test_a_manifest_naming_files_outside_the_root_is_refused_in_every_mode(storage, events, outside, s3_config):
    st = events.log.storage
    m = json.loads(st.get(manifest_key(6)))
    m["version"], m["previous"] = 7, 6
    m["files"]["inline"][0]["path"] = str(outside / "other.parquet")
    st.put_if_absent(manifest_key(7), json.dumps(m).encode())
    with Session(events.log.uri, s3=s3_config) as s, pytest.raises(FormatError, match="outside the table root"):
        s.sql("SELECT * FROM events")


@pytest.mark.s3
def test_credentials_never_appear_in_errors(s3_server, s3_root):
    from castsql.format import TableLog, write_data_files
    from castsql.storage import open_storage

    st = open_storage(s3_root + "/events", s3=s3_server.config)
    log = TableLog.create(st, pa.schema([("x", pa.int64())]))
    f = log.append(write_data_files(st, pa.table({"x": [1]}))).data_files[0]
    st.delete(f.path)
    with Session(st.root, s3=s3_server.config) as s, pytest.raises(CastSQLError) as e:
        s.sql("SELECT * FROM events")
    assert s3_server.config.secret not in str(e.value)
    assert s3_server.config.secret not in repr(s3_server.config)


# ---------------------------------------------------------------- escapes found by hand (issue 11)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_text('{root}/' || '_latest_manifest')",  # a path not written out
        "SELECT * FROM read_text((SELECT '/etc/passwd'))",
        "SELECT * FROM read_text(getvariable('p'))",
    ],
)
def test_table_function_arguments_must_be_literals(safe, events, sql):
    with pytest.raises(SafeModeError, match="must be literals"):
        safe.sql(sql.format(root=events.log.uri))


def test_duckdb_temp_directory_is_not_readable(safe, tmp_path, monkeypatch):
    # DuckDB allows its temporary directory (.tmp/ under the current one) in every mode.
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text("secret\n42\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CastSQLError, match=r"(?i)permission|not allowed"):
        safe.sql("SELECT * FROM read_csv('.tmp/secret.csv')")
    with pytest.raises(CastSQLError, match=r"(?i)permission|not allowed"):
        safe.sql(f"SELECT * FROM read_csv('{tmp_path}/.tmp/secret.csv')")


@pytest.mark.parametrize("path", ["s3://b/t/../other/_latest_manifest", "s3://b/t/./x", "s3://b/t/%2e%2e/x"])
def test_dot_segments_in_urls_are_refused(safe, path):
    with pytest.raises(SafeModeError, match="path segment"):
        safe.sql(f"SELECT * FROM read_text('{path}')")
    with pytest.raises(SafeModeError, match="path segment"):
        safe.sql(f"SELECT * FROM '{path}'")


# ---------------------------------------------------------------- the shell's meta-commands in --safe

SHELL_ESCAPES = [
    (".open {outside}", ".open is not allowed"),
    (".open --add {outside}", ".open is not allowed"),
    (".once {root}/_latest_manifest", ".once is not allowed"),
    (".output {outside}/out.csv", ".output FILE is not allowed"),
    (".read /etc/passwd", ".read is not allowed"),
]


def _shell(args, env, stdin=""):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize(("line", "message"), SHELL_ESCAPES)
def test_safe_shell_refuses_meta_commands_that_touch_files(tmp_path, shell_env, line, message):
    from tables import build_events

    from castsql.storage import open_storage

    root = tmp_path / "events"
    build_events(open_storage(str(root)))
    (tmp_path / "outside").mkdir()
    pq.write_table(pa.table({"secret": [42]}), tmp_path / "outside" / "other.parquet")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    line = line.format(root=root, outside=tmp_path / "outside")
    script = f"{line}\nSELECT count(*) AS n FROM events;\nSELECT * FROM read_text('/etc/passwd');\n"
    r = _shell([str(root), "--safe", "-c", script], shell_env)
    assert r.returncode == 1
    assert r.stdout == ""  # stopped at the first line: nothing ran after it
    assert message in r.stderr and "Traceback" not in r.stderr and "root:" not in r.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "outside" / "out.csv").exists()


def test_safe_shell_refuses_them_interactively_too(tmp_path, shell_env):
    import pexpect
    from pty_shell import Shell
    from tables import build_events

    from castsql.storage import open_storage

    root = tmp_path / "events"
    build_events(open_storage(str(root)))
    before = (root / "_latest_manifest").read_bytes()
    sh = Shell([str(root), "--safe"], shell_env)
    try:
        for line, message in SHELL_ESCAPES:
            out = sh.run(line.format(root=root, outside=tmp_path))
            assert message in out, (line, out)
        out = sh.run("SELECT count(*) AS n FROM events;")
        assert "1896" in out
        out = sh.run("SELECT * FROM read_text('/etc/passwd');")
        assert "root:" not in out and "Error" in out
        sh.child.sendeof()
        sh.child.expect(pexpect.EOF)
    finally:
        sh.close()
    assert (root / "_latest_manifest").read_bytes() == before


def test_read_refuses_devices_in_every_mode(shell_warehouse, shell_env):
    r = _shell([shell_warehouse, "-c", ".read /dev/zero"], shell_env)
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: cannot read /dev/zero: not a regular file"
