"""SQL that writes (issue 56): DELETE, UPDATE, INSERT and MERGE INTO on a
session's tables, through the write pipeline, from ``Session.sql`` and from
the shell; what stays refused, and the barrier that still holds."""

from __future__ import annotations

import io
import random
import subprocess
import sys

import pyarrow as pa
import pytest

import castsql
from castsql.engine import Session
from castsql.errors import CastSQLError, DuplicateKey, ForbiddenStatement, SafeModeError
from castsql.format import TableLog
from castsql.shell.core import Settings, Shell
from castsql.storage import open_storage


def _events(n: int = 20) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(1, n + 1), pa.int64()),
            "user_id": pa.array([i % 5 for i in range(1, n + 1)], pa.int64()),
            "kind": [("click", "view")[i % 2] for i in range(1, n + 1)],
            "amount": pa.array([float(i) for i in range(1, n + 1)], pa.float64()),
        }
    )


@pytest.fixture
def wh(tmp_path) -> str:
    """A warehouse: ``events`` (20 rows, key ``id``, version 1) and
    ``updates`` (ids 18-22, key ``id``: 3 of them in events)."""
    root = str(tmp_path / "wh")
    castsql.write_table(f"{root}/events", _events(), primary_key="id")
    upd = pa.table(
        {
            "id": pa.array([18, 19, 20, 21, 22], pa.int64()),
            "user_id": pa.array([9, 9, 9, 9, 9], pa.int64()),
            "kind": ["buy"] * 5,
            "amount": pa.array([100.0, 200.0, 300.0, 400.0, 500.0]),
        }
    )
    castsql.write_table(f"{root}/updates", upd, primary_key="id")
    return root


def rows(s: Session, table: str = "events", version: int | None = None) -> list[dict]:
    at = f" AS OF VERSION {version}" if version is not None else ""
    return s.sql(f"SELECT * FROM {table}{at} ORDER BY id").to_pylist()


def latest(wh: str, table: str = "events") -> int:
    return TableLog(open_storage(f"{wh}/{table}")).latest_version()


def count(result: pa.Table) -> int:
    assert result.column_names == ["count"]
    assert result.num_rows == 1
    return result.column("count")[0].as_py()


# ---------------------------------------------------------------- DELETE / UPDATE / INSERT


def test_delete_update_insert_each_commit_one_version_that_the_session_reads(wh):
    with Session(wh) as s:
        r = s.sql("DELETE FROM events WHERE user_id = 2")
        assert count(r) == 4
        assert r.schema.metadata[b"castsql.version"] == b"2"
        assert s.last_write.version == 2 and latest(wh) == 2
        assert [x["id"] for x in rows(s)] == [i for i in range(1, 21) if i % 5 != 2]

        assert count(s.sql("UPDATE events AS e SET amount = e.amount * 10, kind = 'big' WHERE e.id <= 3")) == 2
        assert latest(wh) == 3
        got = {x["id"]: (x["kind"], x["amount"]) for x in rows(s)}
        assert got[1] == ("big", 10.0) and got[3] == ("big", 30.0) and got[4] == ("click", 4.0)

        assert count(s.sql("INSERT INTO events VALUES (100, 7, 'new', 1.5), (101, 7, 'new', 2)")) == 2
        assert latest(wh) == 4
        assert rows(s)[-1] == {"id": 101, "user_id": 7, "kind": "new", "amount": 2.0}

        # Columns named: the others are NULL; TRUNCATE deletes every row.
        assert count(s.sql("INSERT INTO events (id, kind) VALUES (102, 'x')")) == 1
        assert rows(s)[-1] == {"id": 102, "user_id": None, "kind": "x", "amount": None}
        # Older versions read as they were.
        assert len(rows(s, version=1)) == 20 and len(rows(s, version=2)) == 16
        assert count(s.sql("TRUNCATE events")) == 19
        assert rows(s) == [] and latest(wh) == 6


def test_a_write_that_matches_no_row_commits_nothing(wh):
    with Session(wh) as s:
        assert count(s.sql("DELETE FROM events WHERE id > 1000")) == 0
        assert count(s.sql("UPDATE events SET amount = 0 WHERE kind = 'none'")) == 0
        assert count(s.sql("INSERT INTO events SELECT * FROM events WHERE false")) == 0
        assert latest(wh) == 1
        assert s.last_write.version is None


def test_insert_select_reads_other_tables_old_versions_and_files(wh, tmp_path):
    pa_path = tmp_path / "more.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [500, 501], "amount": [5.0, 6.0]}), pa_path)
    with Session(wh) as s:
        s.sql("DELETE FROM updates WHERE id >= 21")  # updates v2: ids 18-20
        n = count(s.sql("INSERT INTO events SELECT id + 1000, user_id, kind, amount FROM updates AS OF VERSION 1"))
        assert n == 5
        n = count(s.sql("INSERT INTO events BY NAME SELECT id + 2000 AS id, amount FROM updates"))
        assert n == 3
        n = count(s.sql(f"INSERT INTO events (id, amount) SELECT * FROM read_parquet('{pa_path}')"))
        assert n == 2
        ids = [x["id"] for x in rows(s)]
        assert ids[-10:] == [500, 501, 1018, 1019, 1020, 1021, 1022, 2018, 2019, 2020]
        # Parameters fill an INSERT's values as any query's.
        assert count(s.sql("INSERT INTO events (id, kind) VALUES (?, ?)", [600, "p"])) == 1
        assert [x["kind"] for x in rows(s) if x["id"] == 600] == ["p"]


def test_a_duplicate_key_is_refused_in_one_line_and_nothing_is_committed(wh):
    with Session(wh) as s:
        for sql in (
            "INSERT INTO events VALUES (5, 1, 'dup', 0)",
            "INSERT INTO events VALUES (50, 1, 'a', 0), (50, 1, 'b', 0)",
            "INSERT INTO events (kind) VALUES ('no key')",
        ):
            with pytest.raises(CastSQLError) as e:
                s.sql(sql)
            assert "\n" not in str(e.value) and "events" in str(e.value), str(e.value)
        with pytest.raises(DuplicateKey, match="already in the table"):
            s.sql("INSERT INTO events VALUES (5, 1, 'dup', 0)")
        assert latest(wh) == 1 and len(rows(s)) == 20


def test_bad_values_and_columns_are_refused_naming_the_table(wh):
    with Session(wh) as s:
        cases = [
            ("INSERT INTO events VALUES (1000, 2)", "2 values per row for 4 columns"),
            ("INSERT INTO events (id, nope) VALUES (1000, 2)", "no column 'nope'"),
            ("INSERT INTO events (id, amount) VALUES (1000, 'abc')", "INSERT"),
            ("UPDATE events SET nope = 1", "nope"),
            ("DELETE FROM events WHERE nope = 1", "nope"),
            ("UPDATE events SET amount = amount +", "events"),
        ]
        for sql, why in cases:
            with pytest.raises(CastSQLError) as e:
                s.sql(sql)
            assert why in str(e.value) and "\n" not in str(e.value), (sql, str(e.value))
        assert latest(wh) == 1


# ---------------------------------------------------------------- MERGE INTO


def test_merge_into_from_a_table_a_subquery_and_values(wh):
    with Session(wh) as s:
        r = s.sql(
            "MERGE INTO events t USING updates s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET amount = s.amount, kind = s.kind "
            "WHEN NOT MATCHED THEN INSERT *"
        )
        assert count(r) == 5 and latest(wh) == 2
        got = {x["id"]: x for x in rows(s)}
        assert got[18]["amount"] == 100.0 and got[18]["user_id"] == 3  # user_id kept
        assert got[22] == {"id": 22, "user_id": 9, "kind": "buy", "amount": 500.0}

        r = s.sql(
            "MERGE INTO events USING (SELECT id, amount FROM updates AS OF VERSION 1 WHERE id > 20) AS u "
            "ON events.id = u.id WHEN MATCHED AND u.amount > 450 THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET amount = events.amount + u.amount"
        )
        assert count(r) == 2
        got = {x["id"]: x for x in rows(s)}
        assert 22 not in got and got[21]["amount"] == 800.0

        r = s.sql(
            "MERGE INTO events AS t USING (VALUES (1, 'keep'), (2, 'gone'), (300, 'new')) AS v(id, note) "
            "ON t.id = v.id "
            "WHEN MATCHED AND v.note = 'keep' THEN DO NOTHING "
            "WHEN MATCHED THEN DELETE "
            "WHEN NOT MATCHED THEN INSERT (id, kind) VALUES (v.id, v.note)"
        )
        assert count(r) == 2
        got = {x["id"]: x for x in rows(s)}
        assert 1 in got and 2 not in got and got[300]["kind"] == "new" and got[300]["amount"] is None
        assert latest(wh) == 4


def test_merge_not_matched_by_source_and_a_predicate_on(wh):
    with Session(wh) as s:
        r = s.sql(
            "MERGE INTO events t USING updates s ON t.id = s.id AND s.amount < 250 "
            "WHEN NOT MATCHED BY SOURCE AND t.id < 5 THEN DELETE "
            "WHEN NOT MATCHED BY SOURCE AND t.id = 5 THEN UPDATE SET kind = 'orphan'"
        )
        assert count(r) == 5
        got = {x["id"]: x for x in rows(s)}
        assert min(got) == 5 and got[5]["kind"] == "orphan"


def test_merge_refuses_a_duplicate_key_and_ambiguous_matches(wh):
    with Session(wh) as s:
        with pytest.raises(CastSQLError) as e:
            s.sql(
                "MERGE INTO events t USING (VALUES (30), (30)) AS v(id) ON t.id = v.id "
                "WHEN NOT MATCHED THEN INSERT (id) VALUES (v.id)"
            )
        assert "\n" not in str(e.value)
        with pytest.raises(CastSQLError) as e:
            s.sql(
                "MERGE INTO events t USING (VALUES (3), (3)) AS v(id) ON t.id = v.id "
                "WHEN MATCHED THEN UPDATE SET kind = 'x'"
            )
        assert "\n" not in str(e.value)
        assert latest(wh) == 1


# ---------------------------------------------------------------- refusals


REFUSED = [
    ("DELETE FROM events AS OF VERSION 1 WHERE id = 1", "AS OF reads an older one"),
    ("UPDATE events AT (VERSION => 1) SET kind = 'x'", "AS OF reads an older one"),
    ("INSERT INTO events AS OF VERSION 1 SELECT * FROM events", "AS OF reads an older one"),
    ("MERGE INTO events VERSION AS OF 1 USING updates ON events.id = updates.id WHEN MATCHED THEN DELETE", "AS OF"),
    ("DELETE FROM events WHERE id = 1; DELETE FROM updates WHERE id = 18", "must be a statement of its own"),
    ("BEGIN; DELETE FROM events WHERE id = 1; COMMIT", "must be a statement of its own"),
    ("UPDATE events SET kind = u.kind FROM updates u WHERE events.id = u.id", "use MERGE INTO"),
    ("DELETE FROM events USING updates WHERE events.id = updates.id", "use MERGE INTO"),
    ("INSERT OR REPLACE INTO events SELECT * FROM updates", "use MERGE INTO"),
    ("INSERT INTO events SELECT * FROM updates ON CONFLICT DO NOTHING", "use MERGE INTO"),
    ("DELETE FROM events WHERE id = 1 RETURNING id", "RETURNING is not supported"),
    ("DELETE FROM events WHERE id IN (SELECT id FROM updates)", "use MERGE INTO events USING updates"),
    ("UPDATE events SET amount = (SELECT max(amount) FROM events) WHERE id = 1", "reads table events"),
    ("DROP TABLE events", "SQL never deletes a table"),
    ("WITH x AS (SELECT 1) DELETE FROM events", "cannot be written by this statement"),
    ("EXPLAIN ANALYZE DELETE FROM events", "cannot be written by this statement"),
    ("CREATE OR REPLACE TEMP VIEW events AS SELECT 1", "cannot be written by this statement"),
]


def test_refused_writes_say_why_in_one_line_and_commit_nothing(wh):
    with Session(wh) as s:
        for sql, why in REFUSED:
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            assert why in str(e.value) and "\n" not in str(e.value), (sql, str(e.value))
        assert latest(wh) == 1 and latest(wh, "updates") == 1
        assert len(rows(s)) == 20


def test_a_write_inside_an_open_transaction_is_refused(wh):
    with Session(wh) as s:
        s.sql("BEGIN")
        with pytest.raises(ForbiddenStatement, match=r"inside a transaction: each statement .* is its own version"):
            s.sql("DELETE FROM events WHERE id = 1")
        s.sql("ROLLBACK")
        assert count(s.sql("DELETE FROM events WHERE id = 1")) == 1


@pytest.mark.parametrize("mode", ["safe", "read_only"])
def test_safe_and_read_only_sessions_refuse_every_write(wh, mode):
    writes = [
        "DELETE FROM events WHERE id = 1",
        "UPDATE events SET kind = 'x'",
        "INSERT INTO events VALUES (100, 1, 'a', 1)",
        "MERGE INTO events t USING updates s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "TRUNCATE events",
        "DELETE FROM events AS OF VERSION 1",
    ]
    with Session(wh, **{mode: True}) as s:
        for sql in writes:
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            msg = str(e.value)
            assert "\n" not in msg, msg
            if mode == "safe":
                assert isinstance(e.value, SafeModeError) and msg.startswith("safe mode:"), msg
            else:
                assert msg.startswith("read-only session:"), msg
        assert len(rows(s)) == 20
    assert latest(wh) == 1


def test_connect_read_only_refuses_writes(wh):
    s = castsql.connect(wh, read_only=True)
    with pytest.raises(ForbiddenStatement, match="read-only session"):
        s.sql("DELETE FROM events")
    s.close()
    assert latest(wh) == 1


@pytest.mark.parametrize("safe", [False, True], ids=["normal", "safe"])
def test_the_barrier_still_holds_sql_reaches_tables_only_through_the_pipeline(wh, safe, tmp_path):
    with Session(wh, safe=safe) as s:
        for sql in (
            f"COPY (SELECT 1 AS x) TO '{wh}/events/data/x.parquet' (FORMAT parquet)",
            f"COPY events TO '{wh}/events/manifest/v00000002.json'",
            f"ATTACH '{tmp_path}/x.db' AS x",
            f"ATTACH 'ducklake:{tmp_path}/y.ducklake' AS y",
            f"COPY events FROM '{tmp_path}/x.csv'",
        ):
            with pytest.raises(ForbiddenStatement) as e:
                s.sql(sql)
            assert "\n" not in str(e.value)
        if safe:
            with pytest.raises(SafeModeError):
                s.sql(f"COPY (SELECT 1 AS x) TO '{tmp_path}/out.csv'")
            with pytest.raises(SafeModeError):  # an INSERT's query is safe mode's too: refused before it runs
                s.sql(f"INSERT INTO events SELECT * FROM read_csv('{tmp_path}/in.csv')")
    assert latest(wh) == 1


# ---------------------------------------------------------------- history


def test_the_statement_is_recorded_in_the_versions_history(wh):
    long_where = " OR ".join(f"id = {1000 + i}" for i in range(200))
    with Session(wh) as s:
        s.sql("DELETE FROM events -- the GDPR request\nWHERE user_id = 4")
        s.sql(f"DELETE FROM events WHERE id = 1 OR {long_where}")
        log = s.log("events")
        assert log.manifest(2).summary["statement"] == "DELETE FROM events -- the GDPR request\nWHERE user_id = 4"
        long = log.manifest(3).summary["statement"]
        assert len(long) == 500 and long.endswith("…")
        assert "statement" not in log.manifest(1).summary  # written by Table, not SQL
        # The same write through Table records none.
        castsql.open(f"{wh}/events").delete("id = 2")
        assert "statement" not in TableLog(open_storage(f"{wh}/events")).manifest(4).summary
        # DESCRIBE HISTORY says which statement wrote each version, as .history does.
        said = s.sql("DESCRIBE HISTORY events").column("statement").to_pylist()
        assert said[2].startswith("DELETE FROM events -- the GDPR") and said[1] is None and said[4] is None


def test_create_tables_version_0_records_its_statement(tmp_path):
    (tmp_path / "wh").mkdir()
    with Session(str(tmp_path / "wh")) as s:
        s.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR)")
        s.sql("CREATE TABLE copied AS SELECT 1::BIGINT AS id")
        assert s.sql("DESCRIBE HISTORY kv").column("statement").to_pylist() == [
            "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR)"
        ]
        assert (
            s.sql("DESCRIBE HISTORY copied").column("statement").to_pylist()
            == ["CREATE TABLE copied AS SELECT 1::BIGINT AS id"] * 2
        )  # the empty table, then its rows: one statement


def test_sql_errors_speak_sql(wh):
    """A refusal names the statement the person typed, not the Python API's
    operation, and offers no switch SQL does not have."""
    with Session(wh) as s:
        for sql, start in (
            ("INSERT INTO events VALUES (5, 1, 'dup', 0)", "table events: INSERT: "),
            ("UPDATE events SET id = 6 WHERE id = 5", "table events: UPDATE: "),
        ):
            with pytest.raises(DuplicateKey) as e:
                s.sql(sql)
            assert str(e.value).startswith(start) and "allow_duplicate_keys" not in str(e.value), str(e.value)
        assert latest(wh) == 1


def test_merge_on_a_condition_may_set_the_column_it_joins_on(wh):
    """SQL's ON is a condition: as in Delta's MERGE, a clause may set the
    column ``ON t.id = s.id`` compares (``Table.merge(on="id")`` refuses to)."""
    with Session(wh) as s:
        s.sql(
            "MERGE INTO events t USING (VALUES (3, 300)) AS s(id, new_id) ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET id = s.new_id"
        )
        ids = {r["id"] for r in rows(s)}
        assert 300 in ids and 3 not in ids and latest(wh) == 2


# ---------------------------------------------------------------- the shell


def run_script(wh: str, script: str, **opts) -> tuple[bool, str, str]:
    out, err = io.StringIO(), io.StringIO()
    sh = Shell(Session(wh, **opts), stdout=out, stderr=err, settings=Settings(mode="csv"))
    try:
        ok = sh.run_lines(script.splitlines(keepends=True), "script.sql")
    finally:
        sh.close()
    return ok, out.getvalue(), err.getvalue()


def test_shell_script_writes_and_notes_each_version(wh):
    script = """
DELETE FROM events WHERE user_id = 4;
UPDATE events SET kind = 'seen' WHERE id = 1;
INSERT INTO events VALUES (100, 1, 'new', 0.5);
MERGE INTO events t USING updates s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *;
DELETE FROM events WHERE id = 12345;
SELECT count(*) AS n FROM events;
.history events
"""
    ok, out, err = run_script(wh, script)
    assert ok, err
    lines = out.splitlines()
    # id 19 (user 4) went first: the merge inserts 19, 21 and 22.
    assert lines[:9] == ["count", "4", "count", "1", "count", "1", "count", "3", "count"]
    assert lines[9:12] == ["0", "n", "20"]
    assert err.splitlines() == [
        "events: version 2 (DELETE, 4 rows)",
        "events: version 3 (UPDATE, 1 row)",
        "events: version 4 (INSERT, 1 row)",
        "events: version 5 (MERGE, 3 rows)",
        "DELETE: no row changed; events keeps its version",
    ]
    history = "\n".join(lines[12:])
    assert "DELETE FROM events WHERE user_id = 4" in history
    assert "MERGE INTO events t USING updates s ON t.id = s.id WHEN NOT…" in history


def test_shell_refusals_are_one_error_line_and_change_nothing(wh):
    ok, out, err = run_script(wh, "DELETE FROM events AS OF VERSION 1 WHERE id = 1;\n")
    assert not ok and out == ""
    assert err.startswith("Error: script.sql:1: DELETE FROM events … AS OF") and err.count("\n") == 1
    ok, out, err = run_script(wh, "INSERT INTO events VALUES (1, 1, 'dup', 0);\n")
    assert not ok and err.count("\n") == 1 and "already in the table" in err
    assert latest(wh) == 1


def castsql_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "castsql.cli", *args], capture_output=True, text=True, timeout=120, input=""
    )


def test_castsql_command_line_writes_and_refuses_in_safe_and_read_only_mode(wh):
    r = castsql_cli(wh, "-c", "DELETE FROM events WHERE user_id = 2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "count\n4\n" and r.stderr == "events: version 2 (DELETE, 4 rows)\n"
    for flag, start in (("--safe", "Error: safe mode: DELETE of table events"), ("-readonly", "Error: read-only")):
        r = castsql_cli(wh, flag, "-c", "DELETE FROM events")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.startswith(start) and r.stderr.count("\n") == 1, r.stderr
    assert latest(wh) == 2


# ---------------------------------------------------------------- SQL and Table agree


def _random_step(rng: random.Random, next_id: list[int]) -> tuple[str, object]:
    """One write as SQL and as the Table call that does the same."""
    kind = rng.choice(["insert", "delete", "update", "merge"])
    if kind == "insert":
        ids = [next_id[0] + i for i in range(rng.randint(1, 4))]
        next_id[0] += len(ids)
        vals = [(i, rng.randint(0, 4), rng.choice(["a", "b"]), float(rng.randint(0, 99))) for i in ids]
        sql = "INSERT INTO events VALUES " + ", ".join(f"({i}, {u}, '{k}', {a})" for i, u, k, a in vals)
        data = pa.table(
            {
                "id": pa.array([v[0] for v in vals], pa.int64()),
                "user_id": pa.array([v[1] for v in vals], pa.int64()),
                "kind": [v[2] for v in vals],
                "amount": pa.array([v[3] for v in vals], pa.float64()),
            }
        )
        return sql, lambda t: t.append(data)
    if kind == "delete":
        where = rng.choice([f"user_id = {rng.randint(0, 4)}", f"id % 7 = {rng.randint(0, 6)}", "amount > 90"])
        return f"DELETE FROM events WHERE {where}", lambda t: t.delete(where)
    if kind == "update":
        where = f"user_id = {rng.randint(0, 4)}"
        expr = rng.choice(["amount + 1", "amount * 2", "0"])
        return f"UPDATE events SET amount = {expr}, kind = 'u' WHERE {where}", lambda t: t.update(
            {"amount": expr, "kind": "'u'"}, where
        )
    lo = rng.randint(1, max(2, next_id[0] - 3))
    ids = list(range(lo, lo + 4))
    src = pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array([-1.0] * 4)})
    values = ", ".join(f"({i}, -1.0)" for i in ids)
    sql = (
        f"MERGE INTO events t USING (VALUES {values}) AS s(id, amount) ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET amount = s.amount "
        "WHEN NOT MATCHED THEN INSERT (id, amount) VALUES (s.id, s.amount)"
    )

    def merge(t: castsql.Table) -> None:
        (
            t.merge(src, on="id", source_alias="s", target_alias="t")
            .when_matched_update({"amount": "s.amount"})
            .when_not_matched_insert({"id": "s.id", "amount": "s.amount"})
            .execute()
        )

    return sql, merge


def test_sql_and_table_methods_give_the_same_rows_at_every_version(tmp_path):
    a, b = str(tmp_path / "a" / "events"), str(tmp_path / "b" / "events")
    castsql.write_table(a, _events(), primary_key="id")
    castsql.write_table(b, _events(), primary_key="id")
    rng = random.Random(56)
    next_id = [21]
    with Session(a) as s, castsql.open(b) as t:
        for _ in range(24):
            sql, call = _random_step(rng, next_id)
            s.sql(sql)
            call(t)
        va, vb = latest(str(tmp_path / "a")), latest(str(tmp_path / "b"))
        assert va == vb > 10
        other = Session(b)
        try:
            for v in range(va + 1):
                assert rows(s, version=v) == rows(other, version=v), v
        finally:
            other.close()


# ---------------------------------------------------------------- tables: CREATE, ALTER, RESTORE, OPTIMIZE, VACUUM


def test_create_table_in_an_empty_warehouse_with_a_key_and_properties(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    with Session(str(wh)) as s:
        assert s.tables == []
        r = s.sql(
            "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR, d DECIMAL(10, 2), ts TIMESTAMP) "
            "TBLPROPERTIES ('castsql.autoCompact' = 'false', 'owner' = 'audit team')"
        )
        assert count(r) == 0 and s.last_write.version == 0 and s.tables == ["kv"]
        head = TableLog(open_storage(str(wh / "kv"))).latest()
        assert head.primary_key == "id"
        assert head.properties == {"castsql.autoCompact": "false", "owner": "audit team"}
        assert [(c.name, c.type) for c in head.schema.columns] == [
            ("id", "int64"), ("v", "string"), ("d", "decimal128(10, 2)"), ("ts", "timestamp[us]"),
        ]  # fmt: skip
        s.sql("INSERT INTO kv VALUES (1, 'a', 1.5, '2026-01-02 03:04:05')")
        with pytest.raises(DuplicateKey):
            s.sql("INSERT INTO kv VALUES (1, 'b', 0, NULL)")
        # PRIMARY KEY as a constraint, and WITH (…) for the properties; IF NOT EXISTS.
        s.sql("CREATE TABLE other (a INTEGER, b VARCHAR, PRIMARY KEY (a)) WITH ('owner' = 'me')")
        assert TableLog(open_storage(str(wh / "other"))).latest().primary_key == "a"
        assert count(s.sql("CREATE TABLE IF NOT EXISTS other (x INTEGER)")) == 0
        assert TableLog(open_storage(str(wh / "other"))).latest_version() == 0
    # A new session sees both.
    with Session(str(wh)) as s:
        assert s.tables == ["kv", "other"] and rows(s, "kv")[0]["v"] == "a"


def test_create_table_as_select_checks_the_rows_before_the_table_exists(wh):
    with Session(wh) as s:
        r = s.sql(
            "CREATE TABLE big PRIMARY KEY (id) TBLPROPERTIES ('k' = 'v') AS SELECT * FROM events WHERE amount > 10"
        )
        assert count(r) == 10 and s.last_write.version == 1
        log = TableLog(open_storage(f"{wh}/big"))
        assert log.latest().primary_key == "id" and log.latest().properties == {"k": "v"}
        assert [x["id"] for x in rows(s, "big")] == list(range(11, 21))
        assert log.manifest(1).summary["statement"].startswith("CREATE TABLE big")
        # Duplicate keys in the query: refused, and no table is left behind.
        with pytest.raises(DuplicateKey):
            s.sql("CREATE TABLE twice PRIMARY KEY (user_id) AS SELECT * FROM events")
        assert not (open_storage(f"{wh}").list_dirs().__contains__("twice"))
        assert "twice" not in s.tables


CREATE_REFUSED = [
    ("CREATE TABLE events (id BIGINT)", "table events exists (version 1)"),
    ("CREATE TABLE t (id BIGINT PRIMARY KEY, v INT PRIMARY KEY)", "one primary key column"),
    ("CREATE TABLE t (id BIGINT, PRIMARY KEY (nope))", "primary key nope is not a column"),
    ("CREATE TABLE t (id BIGINT DEFAULT 3)", "only PRIMARY KEY and NOT NULL"),
    ("CREATE TABLE t (id NOSUCHTYPE)", "CREATE TABLE t"),
    ("CREATE TABLE t (id BIGINT) AS SELECT 1", "not both"),
    ('CREATE TABLE "a/b" (id BIGINT)', "a table name is a directory name"),
]


def test_create_table_refusals_are_one_line_and_make_nothing(wh):
    before = sorted(open_storage(wh).list_dirs())
    with Session(wh) as s:
        for sql, why in CREATE_REFUSED:
            with pytest.raises(CastSQLError) as e:
                s.sql(sql)
            assert why in str(e.value) and "\n" not in str(e.value), (sql, str(e.value))
    assert sorted(open_storage(wh).list_dirs()) == before


def test_create_table_without_a_warehouse_stays_duckdbs_own(wh):
    # A session over one table (no warehouse): CREATE TABLE is DuckDB's, in memory, as before.
    with Session(f"{wh}/events") as s:
        s.sql("CREATE TABLE scratch AS SELECT 1 AS x")
        assert s.sql("SELECT x FROM scratch").to_pylist() == [{"x": 1}]
        assert "scratch" not in s.tables
    assert sorted(open_storage(wh).list_dirs()) == ["events", "updates"]


def test_alter_table_adds_widens_and_sets_properties(wh):
    with Session(wh) as s:
        s.sql("ALTER TABLE events ADD COLUMN country VARCHAR")
        s.sql("ALTER TABLE events ADD note INTEGER")
        s.sql("ALTER TABLE events ALTER COLUMN note TYPE BIGINT")
        s.sql("ALTER TABLE events ALTER note SET DATA TYPE BIGINT")  # already: nothing committed
        s.sql("ALTER TABLE events SET TBLPROPERTIES ('owner' = 'x', 'team' = 'y')")
        s.sql("ALTER TABLE events UNSET TBLPROPERTIES ('team')")
        log = s.log("events")
        head = log.latest()
        assert head.version == 6
        assert [(c.name, c.type) for c in head.schema.columns][-2:] == [("country", "string"), ("note", "int64")]
        assert head.properties == {"owner": "x"}
        assert rows(s)[0]["country"] is None
        s.sql("UPDATE events SET country = 'de' WHERE id = 1")
        assert rows(s)[0]["country"] == "de"
        for sql, why in (
            ("ALTER TABLE events DROP COLUMN kind", "a drop or a rename"),
            ("ALTER TABLE events RENAME COLUMN kind TO k", "a drop or a rename"),
            ("ALTER TABLE events ALTER COLUMN amount TYPE INTEGER", "amount"),
            ("ALTER TABLE events ADD COLUMN z INTEGER DEFAULT 1", "nullable, with no default"),
        ):
            with pytest.raises(CastSQLError) as e:
                s.sql(sql)
            assert why in str(e.value) and "\n" not in str(e.value), (sql, str(e.value))
        assert log.latest_version() == 7


def test_restore_optimize_and_vacuum(wh):
    with Session(wh) as s:
        s.sql("DELETE FROM events WHERE id <= 5")
        s.sql("UPDATE events SET amount = 0")
        r = s.sql("RESTORE TABLE events TO VERSION AS OF 1")
        assert s.last_write.operation == "RESTORE" and s.last_write.version == 4 and count(r) == 0
        assert rows(s) == rows(s, version=1)
        ts = s.log("events").manifest(2).created_at.isoformat()
        s.sql(f"RESTORE events TO TIMESTAMP AS OF '{ts}'")
        assert rows(s) == rows(s, version=2)
        with pytest.raises(CastSQLError, match="version 99"):
            s.sql("RESTORE TABLE events TO VERSION AS OF 99")
        # OPTIMIZE: one COMPACT version that changes no row.
        for i in range(4):
            s.sql(f"INSERT INTO events VALUES ({100 + i}, 1, 'x', {i})")
        live = rows(s)
        s.sql("OPTIMIZE events ZORDER BY (amount)")
        assert s.last_write.operation == "OPTIMIZE" and s.log("events").latest().operation == "COMPACT"
        assert rows(s) == live
        with pytest.raises(CastSQLError, match="one column"):
            s.sql("OPTIMIZE events ZORDER BY (amount, id)")
        # VACUUM: the grace period keeps everything this young, whatever RETAIN says.
        v = s.log("events").latest_version()
        s.sql("VACUUM events RETAIN 0 HOURS")
        assert s.last_write.operation == "VACUUM" and "removed 0 version(s)" in s.last_write.detail
        assert rows(s, version=1) and s.log("events").latest_version() == v


def test_table_statements_are_refused_in_safe_and_read_only_sessions(wh):
    for opts in ({"safe": True}, {"read_only": True}):
        with Session(wh, **opts) as s:
            for sql in (
                "CREATE TABLE t (id BIGINT)",
                "ALTER TABLE events ADD COLUMN c INTEGER",
                "RESTORE TABLE events TO VERSION AS OF 0",
                "OPTIMIZE events",
                "VACUUM events",
                "DROP TABLE events",
            ):
                with pytest.raises(ForbiddenStatement) as e:
                    s.sql(sql)
                assert "\n" not in str(e.value), str(e.value)
    assert latest(wh) == 1 and sorted(open_storage(wh).list_dirs()) == ["events", "updates"]


def test_drop_table_is_refused_and_says_why(wh):
    with Session(wh) as s:
        for sql in ("DROP TABLE events", "DROP TABLE IF EXISTS events"):
            with pytest.raises(ForbiddenStatement, match="SQL never deletes a table") as e:
                s.sql(sql)
            assert "no time travel or audit can undo" in str(e.value)
    assert latest(wh) == 1


# ---------------------------------------------------------------- on an object store


def test_a_warehouse_written_in_sql_on_each_store(backend, storage_root, s3_config):
    """The newcomer's session on local disk and on the S3 test server: an
    empty warehouse, a table made, written, merged, deleted from, restored,
    read back by a new session."""
    import os

    if backend == "local":
        os.makedirs(storage_root)
    with Session(storage_root, s3=s3_config) as s:
        assert s.tables == []
        s.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR) TBLPROPERTIES ('owner' = 'me')")
        assert count(s.sql("INSERT INTO kv SELECT range AS id, 'v' || range FROM range(100)")) == 100
        r = s.sql(
            "MERGE INTO kv t USING (VALUES (5, 'five'), (200, 'new')) AS s(id, v) ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
        )
        assert count(r) == 2
        assert count(s.sql("DELETE FROM kv WHERE id < 10")) == 10
        s.sql("RESTORE TABLE kv TO VERSION AS OF 2")  # 0 CREATE, 1 INSERT, 2 MERGE, 3 DELETE
        assert s.last_write.version == 4
        s.sql("CREATE TABLE copy PRIMARY KEY (id) AS SELECT * FROM kv AS OF VERSION 1 WHERE id < 3")
    with Session(storage_root, s3=s3_config) as s:
        assert s.tables == ["copy", "kv"]
        got = {x["id"]: x["v"] for x in rows(s, "kv")}
        assert len(got) == 101 and got[5] == "five" and got[200] == "new"
        assert [x["id"] for x in rows(s, "copy")] == [0, 1, 2]
        assert s.log("kv").manifest(3).summary["statement"] == "DELETE FROM kv WHERE id < 10"


def test_shell_script_makes_and_maintains_a_table(wh):
    script = """
CREATE TABLE clicks PRIMARY KEY (id) AS SELECT id, kind FROM events WHERE kind = 'click';
ALTER TABLE clicks ADD COLUMN note VARCHAR;
ALTER TABLE clicks SET TBLPROPERTIES ('castsql.compact.sortBy' = 'id');
INSERT INTO clicks VALUES (100, 'click', 'late');
OPTIMIZE clicks;
VACUUM clicks DRY RUN;
SELECT count(*) AS n, count(note) AS notes FROM clicks;
"""
    ok, out, err = run_script(wh, script)
    assert ok, err
    assert out.splitlines()[-2:] == ["n,notes", "11,1"]
    notes = err.splitlines()
    assert notes[:4] == [
        "clicks: version 1 (CREATE, 10 rows)",
        "clicks: version 2 (ALTER, 0 rows)",
        "clicks: version 3 (SET PROPERTIES, 0 rows)",
        "clicks: version 4 (INSERT, 1 row)",
    ]
    assert notes[4].startswith("clicks: version 5 (OPTIMIZE, 2 files compacted)"), notes
    assert notes[5].startswith("clicks: VACUUM: would remove 0 version(s)"), notes
    assert TableLog(open_storage(f"{wh}/clicks")).latest().properties == {"castsql.compact.sortBy": "id"}


def test_insert_select_keeps_the_instants_of_a_utc_timestamp(tmp_path):
    """DuckDB reads a UTC column back as ``Etc/UTC``; the rows are stored as the
    table's ``UTC`` without a second pass, and every instant is kept."""
    import datetime as dt

    import pyarrow.parquet as pq

    ts = pa.array([0, 1_700_000_000_123_456, None], pa.timestamp("us", tz="UTC"))
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "ts": ts})
    pq.write_table(data, tmp_path / "in.parquet")
    castsql.write_table(str(tmp_path / "wh" / "t"), data.slice(0, 0), primary_key="id")  # ts in "UTC"
    with Session(str(tmp_path / "wh")) as s:
        s.sql(f"INSERT INTO t SELECT * FROM read_parquet('{tmp_path / 'in.parquet'}')")
        with castsql.open(str(tmp_path / "wh" / "t")) as t:
            got = t.to_arrow().sort_by("id")
    head = TableLog(open_storage(str(tmp_path / "wh" / "t"))).latest()
    assert head.version == 1 and head.schema.column("ts").type == "timestamp[us, tz=UTC]"  # the table's, unchanged
    assert got.column("ts").to_pylist() == [
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC), None,
    ]  # fmt: skip
