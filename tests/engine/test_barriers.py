"""The SQL barriers of issue 17, each tried as the attack itself.

No statement deletes, overwrites or creates an object under a table's root, in
any mode; no credential is readable; safe mode on S3 reaches no other host
or bucket; internal names cannot collide with table names and never reach
the user. Local and S3 (fixture ``backend``), shell and Python API.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import duckdb
import pyarrow as pa
import pytest

import castsql
from castsql.engine import Session
from castsql.engine.barrier import policy
from castsql.engine.barrier.guard import ForbiddenStatement, check_statement
from castsql.engine.barrier.safety import SafeModeError
from castsql.engine.sql import names
from castsql.errors import CastSQLError
from castsql.format import TableLog, write_data_files

READ_ONLY = "cannot be written by this statement; SQL writes a table with DELETE, UPDATE, INSERT"


def _objects(storage) -> list[tuple[str, int]]:
    return sorted((o.key, o.size) for o in storage.list(""))


def _shell(args, env, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd
    )


def _env(shell_env, worker_env):
    return {**shell_env, **{k: v for k, v in worker_env.items() if k.startswith("AWS_")}}


# ---------------------------------------------------------------- 1. the attack


def _attack(storage) -> str:
    data = storage.child("events").root + "/"
    if not data.startswith("s3://"):
        data = "./" + os.path.basename(storage.root) + "/events/"
    return (
        "SELECT count(*) FROM (SELECT * FROM events);"
        f" ATTACH '/tmp/castsql-x.ducklake' AS x (TYPE ducklake, DATA_PATH '{data}');"
        " CALL x.set_option('delete_older_than','1 second'); CHECKPOINT x;"
    )


def test_the_attach_checkpoint_attack_fails_twice_in_the_shell(storage, events, shell_env, worker_env):
    before = _objects(storage)
    cwd = None if storage.root.startswith("s3://") else os.path.dirname(storage.root)
    for attempt in range(2):
        if attempt:
            time.sleep(3)  # DuckLake's delete_older_than = 1 second would have passed
        r = _shell([storage.root, "-c", _attack(storage)], _env(shell_env, worker_env), cwd=cwd)
        assert r.returncode == 1, r.stderr
        assert r.stdout.splitlines()[-1] == str(len(events.live[6]))  # the first statement ran
        assert "ATTACH is not available in CastSQL" in r.stderr and "connection=con" in r.stderr
        assert "Traceback" not in r.stderr
    assert _objects(storage) == before
    with Session(storage.root, s3=_s3(storage)) as s:
        assert s.sql("SELECT count(id) AS n FROM events")["n"][0].as_py() == len(events.live[6])


def _s3(storage):
    return getattr(storage, "config", None)


def test_the_attack_through_connect_runs_nothing(storage, events):
    before = _objects(storage)
    with castsql.connect(storage.root, s3=_s3(storage)) as s:
        for _ in range(2):
            with pytest.raises(ForbiddenStatement, match="ATTACH is not available"):
                s.sql(_attack(storage))
            # Nothing of it ran: no catalog named x.
            dbs = {r[0] for r in s.con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
            assert "x" not in dbs
            time.sleep(2)
    assert _objects(storage) == before


def _writes(root: str, data_file: str, warehouse: str) -> list[str]:
    return [
        f"COPY (SELECT 1 AS x) TO '{data_file}' (FORMAT parquet)",
        f"COPY (SELECT 1 AS x) TO '{warehouse}' (FORMAT csv, PARTITION_BY (x), OVERWRITE)",
        f"COPY (SELECT 1 AS x) TO '{warehouse}/events' (FORMAT parquet, PARTITION_BY (x), OVERWRITE_OR_IGNORE)",
        f"COPY (SELECT 1 AS x) TO '{root}/_latest_manifest' (FORMAT csv)",
        f"EXPORT DATABASE '{root}'",
        f"EXPORT DATABASE '{root}/data/export'",
        f"SET profiling_output = '{root}/_latest_manifest'",
        f"PRAGMA profiling_output = '{root}/_latest_manifest'",
        f"SET temp_directory = '{root}'",
        f"COPY (SELECT 1 AS x) TO '{root}/new/' (FORMAT parquet, FILENAME_PATTERN '../../x')",
        f"SET log_query_path = '{root}/log'",
        f"CALL enable_logging(storage_path => '{root}/logs', storage => 'file')",
        f"CALL enable_profiling(save_location => '{root}/p.json')",
    ]


def test_copy_export_and_settings_into_a_table_are_refused(storage, events):
    before = _objects(storage)
    root = storage.child("events").root
    data_file = storage.child("events").uri(sorted(k for k, _ in before if k.startswith("events/data/"))[0][7:])
    with Session(storage.root, s3=_s3(storage)) as s:
        for sql in _writes(root, data_file, storage.root):
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            assert "Traceback" not in str(e.value)
        # The same object under another spelling of its store or path.
        if root.startswith("s3://"):
            for alias in ("s3a://", "s3n://", "r2://", "gs://"):
                with pytest.raises(ForbiddenStatement, match="overlaps"):
                    s.sql(f"COPY (SELECT 1) TO '{alias}{data_file[5:]}'")
            with pytest.raises(ForbiddenStatement, match="overlaps"):
                s.sql(f"COPY (SELECT 1) TO '{root}/x/../data/y.csv?s3_region=z'")
        else:
            for spelled in (f"file://{data_file}", f"{root}/data/../_latest_manifest", f"{root}//data"):
                with pytest.raises(ForbiddenStatement, match="overlaps"):
                    s.sql(f"COPY (SELECT 1) TO '{spelled}'")
    assert _objects(storage) == before


def test_paths_around_a_local_table_resolve_before_they_are_compared(storage, events, tmp_path, monkeypatch):
    if storage.root.startswith("s3://"):
        pytest.skip("local paths")
    before = _objects(storage)
    root = storage.child("events").root
    (tmp_path / "link").symlink_to(root)
    (tmp_path / "dangling").symlink_to(os.path.join(root, "data", "new.parquet"))
    monkeypatch.chdir(storage.root)
    with Session(storage.root) as s:
        for target in (
            f"{tmp_path}/link/x.csv",
            f"{tmp_path}/dangling",
            "events/x.csv",
            ".",
            os.path.dirname(storage.root),
        ):
            with pytest.raises(ForbiddenStatement, match="overlaps"):
                s.sql(f"COPY (SELECT 1) TO '{target}' (FORMAT csv, OVERWRITE)")
        with pytest.raises(CastSQLError):  # not a literal: DuckDB's parser refuses it
            s.sql("COPY (SELECT 1) TO $$x$$ || 'y'")
        # Outside every table: the user's own files are written.
        s.sql(f"COPY (SELECT 42 AS x) TO '{tmp_path}/out.csv'")
        assert (tmp_path / "out.csv").read_text().split() == ["x", "42"]
    assert _objects(storage) == before


# Statements that would write a table other than through the write pipeline
# (DELETE, UPDATE, INSERT and MERGE INTO of a table of their own go there:
# tests/engine/test_sql_writes.py).
WRITES_TO_A_TABLE = [
    "DROP VIEW events",
    'DROP VIEW IF EXISTS "EVENTS"',
    "CREATE OR REPLACE TEMP VIEW events AS SELECT 1",
    "ALTER VIEW events RENAME TO e2",
    "COPY events FROM '/dev/null'",
    "WITH s AS (SELECT 1) DELETE FROM events",
    "EXPLAIN ANALYZE DELETE FROM events",
    "PREPARE p AS DELETE FROM events",
    "PREPARE p AS UPDATE events SET id = 0",
]


def test_writes_to_a_table_outside_the_pipeline_say_how_to_write(events, s3_config):
    with Session(events.log.uri, s3=s3_config) as s:
        for sql in WRITES_TO_A_TABLE:
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            assert str(e.value).startswith(f"table events {READ_ONLY}"), (sql, e.value)
        for sql in (
            "INSERT OR REPLACE INTO Events BY NAME SELECT * FROM events",
            "INSERT INTO events AS OF VERSION 1 SELECT * FROM events",
            "DROP TABLE events",
        ):
            with pytest.raises(ForbiddenStatement):
                s.sql(sql)
        assert s.sql("SELECT count(*) AS n FROM events")["n"][0].as_py() == len(events.live[6])


REFUSED_EVERYWHERE = [
    ("ATTACH ':memory:' AS other", "ATTACH is not available"),
    ("ATTACH 'ducklake:/tmp/y.ducklake' AS y", "DuckLake"),
    ("ATTACH '/tmp/z.db' AS z (TYPE sqlite)", "ATTACH is not available"),
    ("DETACH memory", "DETACH is not available"),
    ("LOAD httpfs", "cannot be installed or loaded"),
    ("INSTALL spatial", "cannot be installed or loaded"),
    ("FORCE INSTALL httpfs", "cannot be installed or loaded"),
    ("UPDATE EXTENSIONS", "not available"),
    ("CHECKPOINT system", "only the session's own in-memory database"),
    ("FORCE CHECKPOINT system", "only the session's own in-memory database"),
    ("SELECT * FROM checkpoint('system')", "only the session's own in-memory database"),
    ("CALL x.set_option('delete_older_than', '1 second')", "attached catalogs"),
    ("SELECT * FROM query('SELECT 1')", "cannot check"),
    ("SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))", "cannot check"),
    ("SELECT * FROM arrow_scan(1, 2, 3)", "raw memory"),
    ("COPY FROM DATABASE memory TO other", "COPY FROM DATABASE is not available"),
    ("PRAGMA copy_database('memory', 'other')", "COPY FROM DATABASE is not available"),
    ("SET enable_external_access = false", "cannot be changed"),
    ("SET allow_unredacted_secrets = true", "cannot be changed"),
    ("SET GLOBAL autoload_known_extensions = true", "cannot be changed"),
    ("RESET temp_directory", "cannot be changed"),
    ("SET home_directory = '/tmp'", "cannot be changed"),
    ("SET enabled_log_types = 'HTTP'", "cannot be changed"),
    ('SELECT * FROM "castsql/v/1/events"', "internal to CastSQL"),
    ("CREATE OR REPLACE MACRO read_parquet(x) AS TABLE SELECT 42 AS id", "built-in function"),
    ("CREATE TEMP MACRO now() AS 1", "built-in function"),
]


@pytest.mark.parametrize("safe", [False, True], ids=["normal", "safe"])
def test_refused_in_every_mode_with_one_line_why(events, s3_config, safe):
    with Session(events.log.uri, s3=s3_config, safe=safe) as s:
        for sql, why in REFUSED_EVERYWHERE:
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            msg = str(e.value)
            assert "\n" not in msg
            assert why in msg or (safe and isinstance(e.value, SafeModeError)), (sql, msg)


def test_import_database_is_refused_before_its_files_are_read(events, s3_config, tmp_path):
    # DuckDB reads schema.sql when CastSQL checks and again when it runs: the
    # file could change in between (tests/engine/test_redteam.py), so IMPORT is refused.
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "schema.sql").write_text(f"ATTACH '{tmp_path}/a.ducklake' AS a (TYPE ducklake);\n")
    (tmp_path / "dump" / "load.sql").write_text("")
    with Session(events.log.uri, s3=s3_config) as s, pytest.raises(ForbiddenStatement, match="IMPORT DATABASE is not"):
        s.sql(f"IMPORT DATABASE '{tmp_path}/dump'")


def test_the_users_own_in_memory_work_runs(events, s3_config, tmp_path):
    (tmp_path / "in.csv").write_text("a\n1\n2\n")
    with Session(events.log.uri, s3=s3_config) as s:
        s.sql("SET threads = 2; SET VARIABLE lim = 100; RESET threads")
        s.sql("CREATE TEMP TABLE mine AS SELECT id FROM events WHERE id < getvariable('lim')")
        s.sql(
            "INSERT INTO mine VALUES (-1); UPDATE mine SET id = id + 1000 WHERE id < 0; DELETE FROM mine WHERE id = 0"
        )
        s.sql("CREATE VIEW v AS SELECT count(*) AS n FROM mine; CREATE MACRO twice(x) AS x * 2")
        s.sql("CREATE SEQUENCE seq; CREATE TEMP TABLE c (a INT)")
        s.sql(f"COPY c FROM '{tmp_path}/in.csv'")
        s.sql("BEGIN; INSERT INTO c VALUES (3); COMMIT")
        s.sql("PREPARE q AS SELECT count(*) AS n FROM c WHERE a > ?")
        assert s.sql("EXECUTE q(1)")["n"][0].as_py() == 2
        assert s.sql("SELECT twice(n) AS n FROM v")["n"][0].as_py() == 2 * (
            len([i for i in events.live[6] if i < 100]) + 1
        )
        s.sql("CHECKPOINT; FORCE CHECKPOINT memory; VACUUM c; ANALYZE")
        s.sql("SET profiling_mode = 'standard'; PRAGMA disable_profiling; SET search_path = 'memory.main'")
        assert s.sql("EXPLAIN SELECT * FROM c").num_rows >= 1
        s.sql("DROP VIEW v; DROP TABLE mine; ALTER TABLE c RENAME TO d")


# ---------------------------------------------------------------- 2. no credential readable

SECRET = "TOP-SECRET-do-not-print-9f3e"


def _credential_queries() -> list[str]:
    return [
        "SELECT current_setting('s3_secret_access_key') AS v",
        "SELECT current_setting('s3_access_key_id') AS v",
        "SELECT current_setting('s3_session_token') AS v",
        "SELECT string_agg(value, ',') AS v FROM duckdb_settings()",
        "SELECT string_agg(secret_string, ',') AS v FROM duckdb_secrets()",
        "SELECT * FROM duckdb_secrets(redact => false)",
        "SELECT * FROM which_secret('s3://b/x', 's3')",
    ]


@pytest.mark.parametrize("safe", [False, True], ids=["normal", "safe"])
def test_no_setting_secret_listing_or_error_shows_a_credential(storage, events, monkeypatch, safe):
    cfg = _s3(storage)
    secret = cfg.secret if cfg else SECRET
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", cfg.key if cfg else "AKIDSECRET")
    monkeypatch.setenv("AWS_SESSION_TOKEN", SECRET + "-token")
    with Session(storage.root, s3=cfg, safe=safe) as s:
        if not safe and not cfg:
            # httpfs loads on the first URL: its settings take AWS_* then.
            with pytest.raises(CastSQLError):
                s.sql("SELECT * FROM read_text('s3://castsql-nonexistent-bucket/x')")
        seen = []
        for sql in _credential_queries():
            try:
                seen.append(str(s.sql(sql).to_pylist()))
            except CastSQLError as e:
                seen.append(str(e))
        text = "\n".join(seen)
        assert secret not in text and SECRET not in text
        if cfg:  # the warehouse still reads through the secret manager
            assert s.sql("SELECT count(id) AS n FROM events")["n"][0].as_py() == len(events.live[6])


def test_safe_shell_shows_no_secret(storage, events, shell_env, worker_env):
    env = _env(shell_env, worker_env)
    env["AWS_SECRET_ACCESS_KEY"] = env.get("AWS_SECRET_ACCESS_KEY") or SECRET
    env.setdefault("AWS_ACCESS_KEY_ID", "AKIDSECRET")
    secret = env["AWS_SECRET_ACCESS_KEY"]
    for sql in _credential_queries():
        r = _shell([storage.root, "--safe", "-c", sql], env)
        assert secret not in r.stdout + r.stderr, sql
        assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- 3. safe mode reaches no other host


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    seen: list[tuple] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
            except OSError:
                continue
            seen.append(addr)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], seen
    stop.set()
    t.join()
    srv.close()


@pytest.mark.s3
def test_safe_mode_on_s3_sends_no_request_elsewhere(s3_server, s3_root, listener):
    from tables import build_events

    from castsql.storage import open_storage

    port, seen = listener
    st = open_storage(s3_root, s3=s3_server.config)
    build_events(st.child("events"))
    bucket = s3_root.split("/")[2]
    manifest = f"{s3_root}/events/_latest_manifest"
    attacks = [
        f"{manifest}?s3_endpoint=127.0.0.1:{port}",
        f"{manifest}?s3_endpoint=127.0.0.1:{port}&s3_use_ssl=false",
        f"{manifest}#x",
        f"s3://{bucket}/other/_latest_manifest",
        f"s3://other-bucket/{s3_root[5:]}/events/_latest_manifest",
        f"s3a://{s3_root[5:]}/events/_latest_manifest",
        f"{s3_root}/events/../../x",
        f"http://127.0.0.1:{port}/{s3_root[5:]}/events/_latest_manifest",
        f"https://127.0.0.1:{port}/x",
    ]
    with Session(s3_root, s3=s3_server.config, safe=True) as s:
        assert s.sql(f"SELECT count(*) AS n FROM read_text('{manifest}')")["n"][0].as_py() == 1
        for url in attacks:
            for sql in (f"SELECT * FROM read_text('{url}')", f"SELECT * FROM '{url}'", f"SELECT '{url}' AS u"):
                with pytest.raises(SafeModeError):
                    s.sql(sql)
    assert seen == []


# ---------------------------------------------------------------- 4. internal names


def _table(storage, name: str, rows: int) -> None:
    st = storage.child(name)
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    log.append(write_data_files(st, pa.table({"id": pa.array(range(rows), pa.int64())})))


SIBLINGS = ["events@v1", "events$del0", 'ev"il@v1', "castsql", "events#p0"]


def test_a_sibling_table_named_like_a_version_does_not_answer_for_it(storage, events):
    for i, name in enumerate(SIBLINGS):
        _table(storage, name, 7 + i)
    want = len(events.live[1])
    cfg = _s3(storage)
    modes = [
        ("normal", lambda: Session(storage.root, s3=cfg)),
        ("safe", lambda: Session(storage.root, s3=cfg, safe=True)),
        ("connect", lambda: castsql.connect(storage.root, s3=cfg, connection=duckdb.connect())),
    ]
    for mode, make in modes:
        with make() as s:
            for _ in range(2):  # before and after the version's view exists
                got = s.sql("SELECT count(id) AS n FROM events AS OF VERSION 1")["n"][0].as_py()
                assert got == want, mode
            for i, name in enumerate(SIBLINGS):
                quoted = '"' + name.replace('"', '""') + '"'
                assert s.sql(f"SELECT count(*) AS n FROM {quoted}")["n"][0].as_py() == 7 + i, (mode, name)
                assert s.sql(f"SELECT count(id) AS n FROM {quoted} AS OF VERSION 1")["n"][0].as_py() == 7 + i


def test_no_table_name_can_equal_an_internal_name():
    # Table names are directory names: never a '/'; every internal name holds one.
    for table in SIBLINGS:
        for name in (names.version_view(table, 1), names.pruned_view(table, 0), names.TABLES):
            assert "/" not in table and "/" in name
            assert names.table_of(name) in (table, "tables")


def test_errors_name_what_the_user_wrote(events, s3_config):
    with Session(events.log.uri, s3=s3_config) as s:
        s.sql("SELECT count(id) FROM events AS OF VERSION 1")
        view = names.version_view("events", 1)
        try:
            s.con.sql(f'SELECT * FROM "{view}" JOIN "{view}" USING (nope)').fetchall()
        except duckdb.Error as e:
            raw = str(e)
        else:
            pytest.fail("DuckDB accepted a join on a missing column")
        assert "castsql/" not in names.user_spelling(raw)
        # Through the session: a duplicate alias names the version the user wrote.
        with pytest.raises(CastSQLError) as e:
            s.sql("SELECT * FROM events AS OF VERSION 1 AS a, events AS OF VERSION 2 AS a")
        assert "castsql/" not in str(e.value)
    msg = names.user_spelling('Catalog Error: "castsql/v/3/my ""t""" and castsql/p/0/2/events, castsql/p/1/latest/u!')
    assert msg == 'Catalog Error: my "t" AS OF VERSION 3 and events AS OF VERSION 2, u!'


# ---------------------------------------------------------------- 5. a missing table


def test_a_missing_table_lists_the_tables(storage, events):
    _table(storage, "users", 3)
    with Session(storage.root, s3=_s3(storage)) as s, pytest.raises(CastSQLError) as e:
        s.sql("SELECT * FROM evnts")
    assert str(e.value) == "no table named evnts (tables: events, users)"


# ---------------------------------------------------------------- the lists stay reviewed


def test_dollar_quoted_strings_pass_the_guard(events, s3_config):
    check_statement("SELECT $$a)b$$, $tag$ducklake_x query( $tag$ AS s")
    with Session(events.log.uri, s3=s3_config) as s:
        assert s.sql("SELECT $$a)b$$ AS s").to_pylist() == [{"s": "a)b"}]


# Settings of DuckDB 1.5.5 (httpfs and ducklake loaded) that mention files,
# directories, extensions, logs, secrets or access, reviewed as harmless to change.
HARMLESS_SETTINGS = {
    "enable_external_file_cache", "validate_external_file_cache", "file_search_path", "max_temp_directory_size",
    "ca_cert_file", "default_secret_storage", "allow_persistent_secrets", "enable_http_metadata_cache",
    "partitioned_write_max_open_files", "prefetch_all_parquet_files", "disable_parquet_prefetching",
    "s3_allow_recursive_globbing", "catalog_error_max_schemas", "s3_uploader_max_filesize",
    "s3_uploader_max_parts_per_file", "storage_compatibility_version", "temp_file_encryption",
    "parquet_metadata_cache", "enable_object_cache", "debug_checkpoint_abort", "enable_geoparquet_conversion",
    "wal_autocheckpoint", "checkpoint_threshold", "custom_user_agent", "duckdb_api", "pandas_analyze_sample",
    "python_enable_replacements", "python_scan_all_frames", "disable_database_invalidation", "ducklake_max_retry_count",
    "ducklake_retry_wait_ms", "ducklake_retry_backoff", "ducklake_default_data_inlining_row_limit",
    "enable_profiling", "profiling_mode", "profiling_coverage", "custom_profiling_settings", "default_block_size",
    "auto_checkpoint_skip_wal_threshold", "wal_autocheckpoint_entries", "debug_skip_checkpoint_on_commit",
    "debug_checkpoint_sleep_ms", "debug_verify_blocks", "experimental_metadata_reuse", "force_column_metadata_reuse",
    "s3_kms_key_id", "s3_access_key_id", "s3_secret_access_key", "s3_session_token", "http_proxy_password",
    "http_proxy_username", "password", "errors_as_json", "extension_versions", "httpfs_enable_credential_refresh",
    "s3_requester_pays", "s3_version_id_pinning", "unsafe_disable_etag_checks", "enable_fsst_vectors",
    "allow_asterisks_in_http_paths", "arrow_lossless_conversion", "auto_fallback_to_full_download",
    "binary_as_string", "deprecated_using_key_syntax", "ducklake_target_file_size", "ducklake_write_deletion_vectors",
    "force_download", "force_download_threshold", "force_variant_shredding", "max_vacuum_tasks",
    "merge_http_secret_into_s3_request", "schema", "search_path",
}  # fmt: skip
_WORDS = ("file", "director", "path", "extension", "log", "secret", "access", "checkpoint", "password", "key")


def test_every_setting_that_names_a_file_or_loosens_a_limit_is_reviewed():
    con = Session().con
    try:
        from castsql.engine.duckdb.duck import load_extension, load_httpfs

        load_httpfs(con)
        load_extension(con, "ducklake")
        rows = con.execute("SELECT name, description FROM duckdb_settings()").fetchall()
    finally:
        con.close()
    reviewed = policy.DENIED_SETTINGS.keys() | HARMLESS_SETTINGS
    unreviewed = [n for n, d in rows if any(w in (n + " " + d).lower() for w in _WORDS) and n not in reviewed]
    assert unreviewed == []
