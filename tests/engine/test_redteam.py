"""A red-team pass over the barriers of issue 17: each test is an attack that
got through, now refused (or answered) with one clear line and the table
unchanged. RELIABILITY.md lists every attack tried and which barrier holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tables import build_events

from castsql.engine import Session
from castsql.engine.barrier.guard import ForbiddenStatement
from castsql.engine.barrier.safety import SafeModeError
from castsql.errors import CastSQLError
from castsql.storage import open_storage

NAME = "events"


def _objects(storage) -> list[tuple[str, int, bytes]]:
    return sorted((o.key, o.size, storage.get(o.key)) for o in storage.list(""))


@pytest.fixture
def events(storage, s3_config):
    """tests/support/tables.py's ``events`` in a warehouse (local disk and S3): (its storage, the warehouse root)."""
    st = open_storage(storage.root.rstrip("/") + "/" + NAME, s3=s3_config)
    build_events(st)
    try:
        yield st, storage.root
    finally:
        st.close()


@pytest.fixture
def local_events(tmp_path):
    root = str(tmp_path / "wh")
    st = open_storage(f"{root}/{NAME}")
    build_events(st)
    return st, root


def _data_file(st) -> str:
    return next(o.key for o in st.list("data/") if o.key.endswith(".parquet"))


def _refused(session: Session, sql: str, match: str, kind: type = ForbiddenStatement) -> None:
    with pytest.raises(kind, match=match) as e:
        session.sql(sql)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- string literals as DuckDB reads them


def test_a_copy_target_continued_on_the_next_line_is_checked_whole(local_events, tmp_path):
    # DuckDB joins 'a' <newline> 'b' into one literal (comments between them
    # too): the check used to read only the first part, '/tmp/…/out', and the
    # COPY overwrote a data file of the table.
    st, root = local_events
    out = tmp_path / "out"
    out.mkdir()
    data = _data_file(st)
    before = _objects(st)
    with Session(root) as s:
        for sql in (
            f"COPY (SELECT 1 AS x) TO '{out}'\n'/../wh/{NAME}/{data}' (FORMAT parquet)",
            f"COPY (SELECT 1 AS x) TO '{out}' -- a comment\n'/../wh/{NAME}/new.csv'",
        ):
            _refused(s, sql, f"overlaps {root}")
        s.sql(f"COPY (SELECT 1 AS x) TO '{out}'\n'/fine.csv'")  # the same form, outside: runs
    assert (out / "fine.csv").exists()
    assert _objects(st) == before


def test_escape_string_literals_are_checked_as_duckdb_reads_them(local_events, tmp_path):
    # E'…\x2f…' is '/' to DuckDB: EXPORT took the first literal it could read
    # (the DELIMITER) as its directory, FILENAME_PATTERN's check skipped it.
    st, root = local_events
    before = _objects(st)
    with Session(root) as s:
        s.sql("CREATE TABLE mine AS SELECT 1 AS a")
        _refused(s, f"EXPORT DATABASE E'{root}/{NAME}/exp' (FORMAT csv, DELIMITER '|')", f"overlaps {root}")
        _refused(s, f"EXPORT DATABASE '{tmp_path}/e'\n'/../wh/{NAME}/exp'", f"overlaps {root}")
        _refused(s, f"COPY (SELECT 1 AS x) TO E'{root}\\x2f{NAME}/x.csv'", f"overlaps {root}")
        _refused(
            s,
            f"COPY mine TO '{tmp_path}/p' (FORMAT csv, FILENAME_PATTERN E'..\\x2f..\\x2fwh\\x2f{NAME}\\x2fp{{i}}', "
            "PER_THREAD_OUTPUT)",
            "must be a file name",
        )
        s.sql(f"COPY mine TO E'{tmp_path}\\x2fok.csv'")
        s.sql(f"COPY mine TO '{tmp_path}/q' (FORMAT csv, FILENAME_PATTERN 'part_{{i}}', PER_THREAD_OUTPUT)")
    assert (tmp_path / "ok.csv").exists() and (tmp_path / "q" / "part_0.csv").exists()
    assert _objects(st) == before


def test_copy_to_a_doubled_slash_reaches_no_table_object(events):
    # s3://bucket//prefix/t/… is another key on AWS, but SeaweedFS (and MinIO)
    # collapse the slashes: the COPY overwrote a data file and the pointer.
    st, root = events
    data = _data_file(st)
    before = _objects(st)
    if root.startswith("s3://"):
        bucket, _, prefix = root[len("s3://") :].partition("/")
        targets = [f"s3://{bucket}//{prefix}/{NAME}/{data}", f"s3://{bucket}/{prefix}//{NAME}/_latest_manifest",
                   f"s3://{bucket}/%2F{prefix}/{NAME}/x.csv", f"s3://{bucket}///{prefix}/./{NAME}/x.csv"]  # fmt: skip
    else:
        targets = [f"/{root}/{NAME}/{data}", f"file:///{root}//{NAME}/x.csv"]
    with Session(root, s3=getattr(st, "config", None)) as s:
        for target in targets:
            _refused(s, f"COPY (SELECT 1 AS a) TO '{target}' (FORMAT parquet)", "overlaps")
    assert _objects(st) == before


# ---------------------------------------------------------------- statements


def test_a_qualified_macro_cannot_shadow_a_built_in(local_events):
    # CREATE MACRO read_parquet was refused, main.read_parquet was not: it
    # broke every table read, and main.current_setting changed what CastSQL
    # takes for '~' in COPY targets.
    _st, root = local_events
    with Session(root) as s:
        n = s.sql(f"SELECT count(id) AS n FROM {NAME}")["n"][0].as_py()
        for sql in (
            "CREATE MACRO main.read_parquet(x) AS TABLE SELECT 42 AS id",
            "CREATE OR REPLACE MACRO memory.main.current_setting(x) AS '/nowhere'",
            'CREATE FUNCTION "main"."COUNT_STAR"() AS 1',
        ):
            _refused(s, sql, "is a built-in function")
        s.sql("CREATE MACRO main.mine(x) AS x + 1")  # the user's own names still work
        assert s.sql("SELECT mine(1) AS y")["y"][0].as_py() == 2
    with Session(root) as s:
        assert s.sql(f"SELECT count(id) AS n FROM {NAME}")["n"][0].as_py() == n


@pytest.mark.parametrize("safe", [False, True])
def test_import_database_is_refused_before_its_files_are_read(local_events, tmp_path, safe):
    # The check expanded IMPORT DATABASE by reading schema.sql, DuckDB read it
    # again to run it: a file rewritten in between (by another session's COPY)
    # ran unchecked; a missing load.sql made the check pass unexpanded.
    _st, root = local_events
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "schema.sql").write_text("CREATE TABLE harmless (a INTEGER);\n")
    (dump / "load.sql").write_text("")
    with Session(root, safe=safe) as s:
        missing = f"IMPORT DATABASE '{tmp_path}/no'"
        for sql in (f"IMPORT DATABASE '{dump}'", f"PRAGMA import_database('{dump}')", missing):
            _refused(s, sql, "IMPORT DATABASE is not available", SafeModeError if safe else ForbiddenStatement)
        assert s.sql("SELECT 'import database' AS import")["import"][0].as_py() == "import database"


def test_safe_mode_refuses_every_spelling_of_the_work_directory(local_events):
    _st, root = local_events
    with Session(f"{root}/{NAME}", safe=True) as s:
        work = s._workdir
        parent, base = os.path.split(work)
        up = os.path.relpath(parent, f"{root}/{NAME}")
        for path in (f"{parent}//{base}/lake/catalog.ducklake", f"{parent}/./{base}/**",
                     f"{root}/{NAME}/{up}/{base}/**", f"{work.upper()}/**"):  # fmt: skip
            _refused(s, f"SELECT * FROM glob('{path}')", "private work directory")


# ---------------------------------------------------------------- metadata


def _key_range_tombstone(st) -> str:
    return next(o.key for o in st.list("tombstone/") if b"pk_min" in st.get(o.key))


LIES = [
    (-(10**40), 10**40, "does not fit primary key"),
    (2**63, 2**63 + 5, "does not fit primary key"),
    (1599, 1500, "pk_min above pk_max"),
]


@pytest.mark.parametrize(("lo", "hi", "why"), LIES)
def test_a_key_range_past_the_key_type_or_inverted_is_refused(local_events, lo, hi, why):
    # ±10^40 on an int64 key reached DuckDB as a bound ("Python integer too
    # large", a raw DuckDB exception); an inverted range deleted nothing.
    st, root = local_events
    key = _key_range_tombstone(st)
    rec = json.loads(st.get(key))
    rec.update(pk_min=lo, pk_max=hi)
    st.delete(key)
    st.put_if_absent(key, (json.dumps(rec) + "\n").encode())
    before = _objects(st)
    importlib_cache_clear()
    with Session(root) as s:
        for sql in (f"SELECT count(*) AS n FROM {NAME}", f"SELECT count(id) AS n FROM {NAME} WHERE id > 10"):
            with pytest.raises(CastSQLError, match=why) as e:
                s.sql(sql)
            assert st.uri(key) in str(e.value) and "version 6" in str(e.value)
        assert s.sql(f"SELECT count(*) AS n FROM {NAME} AS OF VERSION 3")["n"][0].as_py() == 1900
    assert _objects(st) == before


def importlib_cache_clear() -> None:
    """A new process's state: resolved snapshots are cached per process."""
    import importlib

    importlib.import_module("castsql.snapshot.resolve")._cache.clear()


# ---------------------------------------------------------------- the shell


def test_the_shell_prints_nested_values_out_of_pythons_range(local_events, shell_env):
    _st, root = local_events
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", root, "--safe", "-c",
         "SELECT ['5877642-06-25'::DATE] AS d, {'t': '294247-01-10 04:00:54'::TIMESTAMP} AS s; "
         "SELECT * FROM test_all_types(); SELECT 3 AS n"],
        capture_output=True, text=True, env=shell_env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.splitlines()[-1] == "3"


# ---------------------------------------------------------------- version numbers past any store's key (issue 54)


@pytest.mark.parametrize("version", [10**400, 2**63], ids=["400 digits", "2^63"])
def test_a_pointer_naming_a_huge_version_is_one_error_naming_it(local_events, shell_env, version):
    """A pointer whose version has 400 digits named a manifest key no file
    system takes: ``OSError: [Errno 36] File name too long`` on open, query and
    append. Versions are bounded when the pointer is parsed (FORMAT.md §6), so
    every reader and writer gets one FormatError naming the pointer, and
    nothing is written."""
    import pyarrow as pa

    import castsql

    st, root = local_events
    st.put("_latest_manifest", json.dumps({"version": version, "commit_id": "x"}).encode())
    before = _objects(st)
    attempts = {
        "open": lambda: castsql.open(st.root),
        "query": lambda: castsql.connect(root).sql(f"SELECT count(*) FROM {NAME}"),
        "append": lambda: castsql.write_table(st.root, pa.table({"id": [5_000]}), mode="append"),
        "time travel": lambda: castsql.open(st.root, version=version),
    }
    for what, attempt in attempts.items():
        with pytest.raises(CastSQLError) as e:
            attempt()
        message = str(e.value)
        assert "\n" not in message and len(message) < 400, what
        assert ("_latest_manifest" in message and "2^63-1" in message) or "is not a version number" in message, what
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", root, "-c", f"SELECT count(*) FROM {NAME}"],
        capture_output=True, text=True, env=shell_env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and "_latest_manifest: pointer must be" in r.stderr, r.stderr
    assert "Errno" not in r.stderr and "internal error" not in r.stderr
    assert _objects(st) == before


# ---------------------------------------------------------------- symbolic links inside a table root (issue 54)


def test_a_data_file_replaced_by_a_link_leading_out_of_the_root_is_refused(local_events, tmp_path, shell_env):
    """RELIABILITY.md promises a table cannot make a reader open anything
    outside its root, and listed as a known limit that a symbolic link inside
    a local table directory was followed: a data file replaced by a link to a
    Parquet file elsewhere returned that file's rows on every read. The
    reader now refuses a data file that resolves outside the root, naming
    it, in every mode and through every reader; a link that stays inside the
    root is followed as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import castsql

    st, root = local_events
    with castsql.open(st.root) as t:
        first = t._session.snapshot(NAME).files[0]
    path = os.path.join(st.root, first.key)
    # Someone else's file, shaped like the table's (same columns, rows and row groups): the footer check passes.
    data = pq.read_table(path)
    secret = tmp_path / "secret.parquet"
    ids = pa.array([424242 + i for i in range(data.num_rows)], pa.int64())
    pq.write_table(data.set_column(0, "id", ids), secret, row_group_size=100)
    original = Path(path).read_bytes()
    os.replace(path, path + ".moved")
    os.symlink(secret, path)
    from castsql.snapshot import resolve

    resolve.__globals__["_cache"].clear()  # a fresh process would not have it
    reads = {
        "castsql.open": lambda: castsql.open(st.root).to_arrow(),
        "connect": lambda: castsql.connect(root).sql(f"SELECT * FROM {NAME}"),
        "time travel": lambda: castsql.connect(root).sql(f"SELECT count(id) FROM {NAME} AS OF VERSION 2"),
        "safe mode": lambda: Session(root, safe=True).sql(f"SELECT sum(id) FROM {NAME}"),
    }
    for what, read in reads.items():
        resolve.__globals__["_cache"].clear()
        with pytest.raises(CastSQLError, match="outside the table root") as e:
            read()
        assert first.key in str(e.value) and "\n" not in str(e.value), what
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", root, "--safe", "-c", f"SELECT count(*) FROM {NAME} WHERE id = 424242"],
        capture_output=True, text=True, env=shell_env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and "outside the table root" in r.stderr and "424242" not in r.stdout, r.stderr
    # A link to a file inside the root is the table's own business: followed.
    os.unlink(path)
    os.symlink(path + ".moved", path)
    resolve.__globals__["_cache"].clear()
    assert castsql.open(st.root).to_arrow().num_rows == 1896
    os.unlink(path)
    os.replace(path + ".moved", path)
    assert Path(path).read_bytes() == original
