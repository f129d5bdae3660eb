"""Safe mode: queries read the opened tables and nothing else; and in every
mode, a table cannot point a reader at objects outside its root."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from castsql.engine import Session
from castsql.engine.safety import SafeModeError
from castsql.errors import CastSQLError, FormatError
from castsql.format.layout import manifest_key


@pytest.fixture
def safe(events, s3_config):
    with Session(events.log.uri, s3=s3_config, safe=True) as s:
        yield s


def test_safe_session_reads_its_tables(safe, events):
    assert safe.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(events.live[6])
    assert safe.sql("SELECT count(*) AS n FROM events AS OF VERSION 4")["n"][0].as_py() == len(events.live[4])
    assert safe.sql("SELECT count(*) AS n FROM table_changes('events', 2, 5)")["n"][0].as_py() == 204
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
    with pytest.raises(CastSQLError, match=r"(?i)permission|not allowed|disabled"):
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
    m["data_files"][0]["path"] = str(outside / "other.parquet")
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
