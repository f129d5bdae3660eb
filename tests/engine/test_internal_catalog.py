"""No reader can reach CastSQL's internal DuckLake catalog, or make it touch a table's files.

The reproduction from the issue: on a version with deletes, DuckLake's
maintenance functions run through user SQL removed the table's data files
(local disk and S3, every mode, ``--safe`` included). Each function is tried
here on both backends and in both modes, through the Python API and the shell,
and the table's objects must be exactly what they were, every version still
readable.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from castsql.engine import Session
from castsql.engine.barrier.guard import ForbiddenStatement
from castsql.engine.duckdb.lake import CATALOG
from castsql.errors import CastSQLError

ATTACKS = [
    f"SELECT * FROM ducklake_rewrite_data_files('{CATALOG}', delete_threshold => 0.0)",
    f"SELECT * FROM ducklake_expire_snapshots('{CATALOG}', older_than => now() + INTERVAL 1 DAY)",
    f"SELECT * FROM ducklake_cleanup_old_files('{CATALOG}', cleanup_all => true)",
    f"SELECT * FROM ducklake_delete_orphaned_files('{CATALOG}', cleanup_all => true)",
    f"SELECT * FROM ducklake_merge_adjacent_files('{CATALOG}')",
    f"SELECT * FROM ducklake_flush_inlined_data('{CATALOG}')",
    f"CALL ducklake_set_option('{CATALOG}', 'delete_older_than', '1 second')",
    f"CHECKPOINT {CATALOG}",
    f"USE {CATALOG}",
    f'DETACH "{CATALOG.upper()}"',
    f"DROP SCHEMA {CATALOG}.main CASCADE",
    f"CREATE TABLE {CATALOG}.main.x AS SELECT 1",
    f"SELECT * FROM __ducklake_metadata_{CATALOG}.ducklake_data_file",
    f"INSERT INTO __ducklake_metadata_{CATALOG}.ducklake_files_scheduled_for_deletion VALUES (1, 'x', false, now())",
    "SELECT * FROM query('SELECT * FROM ducklake_cleanup_old_files(''castsql'' || ''_lake'', cleanup_all => true)')",
    "SELECT * FROM query_table('castsql_lake.main.x')",
    "ATTACH 'ducklake:/tmp/other.ducklake' AS mine",
    "SET search_path = 'castsql_lake.main'",
]


@pytest.fixture(autouse=True)
def ducklake(monkeypatch):
    """The catalog exists only where DuckLake holds versions: where deletes are
    not skipped in DuckDB's reader (castsql_scan not built or, as here, not
    loaded), or their bitmaps would pass its memory bound."""
    monkeypatch.setenv("CASTSQL_NATIVE_SCAN", "0")


def _objects(events):
    return sorted((o.key, o.size) for o in events.log.storage.list(""))


def _counts(s: Session, events) -> dict[int, int]:
    # count(id), not count(*): a bare count(*) is answered from the metadata, and
    # these must read through the DuckLake tables. Each version twice: the first
    # read of a version applies its deletes with an anti-join, the second builds
    # its DuckLake table.
    for _ in range(2):
        counts = {v: s.sql(f"SELECT count(id) AS n FROM events AS OF VERSION {v}")["n"][0].as_py() for v in events.live}
    return counts


@pytest.mark.parametrize("safe", [False, True], ids=["default", "safe"])
def test_no_statement_reaches_the_internal_catalog(events, s3_config, safe):
    before = _objects(events)
    with Session(events.log.uri, s3=s3_config, safe=safe) as s:
        assert _counts(s, events) == {v: len(ids) for v, ids in events.live.items()}  # every DuckLake table built
        for sql in ATTACKS:
            with pytest.raises(CastSQLError) as e:
                s.sql(sql)
            assert isinstance(e.value, ForbiddenStatement), (sql, e.value)
            msg = str(e.value)
            assert any(w in msg for w in ("not reachable", "internal catalog", "DuckLake", "cannot check", "ATTACH")), (
                msg
            )
        assert _counts(s, events) == {v: len(ids) for v, ids in events.live.items()}
    assert _objects(events) == before


@pytest.mark.parametrize("sql", ATTACKS[:7])
def test_even_a_statement_that_reached_it_could_not_remove_a_file(events, s3_config, sql):
    """The second barrier on its own: the catalog is attached read-only while
    anything but CastSQL runs, and nothing in it is ever scheduled for
    deletion, so DuckLake's own maintenance fails or finds nothing to do."""
    before = _objects(events)
    with Session(events.log.uri, s3=s3_config) as s:
        for _ in range(2):  # read again: a DuckLake table over the table's files
            s.sql("SELECT sum(id) FROM events AS OF VERSION 5")
        try:
            s.con.execute(sql).fetchall()  # straight to DuckDB, past the guard
        except Exception as e:
            assert "read-only" in str(e) or "readonly" in str(e), (sql, e)
        assert _counts(s, events) == {v: len(ids) for v, ids in events.live.items()}
    assert _objects(events) == before


def test_the_catalog_is_read_only_whenever_a_query_runs(events, s3_config):
    with Session(events.log.uri, s3=s3_config) as s:
        for _ in range(2):  # the second read builds the DuckLake table
            s.sql("SELECT sum(id) FROM events")
        dbs = dict(s.con.execute("SELECT database_name, readonly FROM duckdb_databases()").fetchall())
        assert dbs[CATALOG] is True


def test_the_issue_reproduction_in_the_shell(events, s3_config, shell_env, worker_env):
    env = {**shell_env, **{k: v for k, v in worker_env.items() if k.startswith("AWS_")}}
    before = _objects(events)
    attack = (
        "select count(*) from events;"
        f" select * from ducklake_rewrite_data_files('{CATALOG}', delete_threshold => 0.0);"
        f" select * from ducklake_expire_snapshots('{CATALOG}', older_than => now() + interval 1 day);"
        f" select * from ducklake_cleanup_old_files('{CATALOG}', cleanup_all => true);"
    )
    for mode in ([], ["--safe"]):
        r = subprocess.run(
            [sys.executable, "-m", "castsql.cli", events.log.uri, *mode, "-c", attack],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 1
        assert r.stdout.splitlines()[-1] == str(len(events.live[6]))  # the first statement ran
        assert "DuckLake functions are not available" in r.stderr and "Traceback" not in r.stderr
    assert _objects(events) == before
