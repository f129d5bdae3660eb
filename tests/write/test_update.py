"""Update, delete and append from the Python Table with the embedded engine:
one version each, refusals name the table and the column and commit nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest
from paths import SUPPORT
from tables import build_events

import castsql
from castsql.errors import CastSQLError, SchemaMismatch, WriteError
from castsql.format import TableLog
from castsql.storage import open_storage


@pytest.fixture
def events(storage_root, s3_config):
    st = open_storage(storage_root + "/events", s3=s3_config)
    ev = build_events(st)
    t = castsql.open(st.root, s3=s3_config)
    yield t, ev
    t.close()


def vals(t) -> dict[int, float]:
    got = t.to_arrow(["id", "val"]).to_pylist()
    out = {r["id"]: r["val"] for r in got}
    assert len(out) == len(got)
    return out


def test_update_by_predicate_is_one_version(events):
    t, ev = events
    before = vals(t)
    m = t.update(set={"val": "val * 2", "grp": "'x'"}, where="grp = 'g3' AND id < 500")
    hit = {i for i in ev.live[6] if i % 7 == 3 and i < 500}
    assert m.version == 7 and t.version == 7 and m.operation == "UPDATE"
    assert m.summary["updated_rows"] == len(hit) and m.summary["added_rows"] == len(hit)
    assert m.summary["added_tombstones"] == 1
    after = vals(t)
    assert after == {i: v * 2 if i in hit else v for i, v in before.items()}
    assert {r["id"] for r in t.to_arrow(["id"], filter="grp = 'x'").to_pylist()} == hit
    assert vals(t.at(version=6)) == before
    assert t.update(set={"val": "0"}, where="id < 0") is None and t.at().version == 7


def test_update_without_where_touches_every_row(tmp_path):
    from tables import SCHEMA

    st = open_storage(str(tmp_path / "small"))
    TableLog.create(st, SCHEMA, primary_key="id")
    t = castsql.open(st.root)
    from tables import rows

    t.append(rows(0, 50))
    t.update(set={"val": "-1"})
    assert set(vals(t).values()) == {-1.0} and len(vals(t)) == 50
    t.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"set": {"nope": "1"}}, "table events: update: column 'nope' does not exist"),
        ({"set": {"val": "zz + 1"}}, "table events: update: column 'val' = 'zz \\+ 1': column 'zz' does not exist"),
        ({"set": {"val": "grp"}}, "table events: update: column 'val' is DOUBLE, but 'grp' is VARCHAR"),
        ({"set": {"grp": "id + 1"}}, "table events: update: column 'grp' is VARCHAR, but 'id \\+ 1' is BIGINT"),
        ({"set": {"val": "1"}, "where": "grp = 5"}, "table events: update: column 'grp' has values of another type"),
        (
            {"set": {"val": "1"}, "where": "kind = 'x'"},
            "table events: update: condition .*column 'kind' does not exist",
        ),
        ({"set": {"val": "1"}, "where": "id + 1"}, "must be true or false for each row; 'id \\+ 1' is BIGINT"),
        ({"set": {"val": "1"}, "where": "1=1) OR (1=1"}, "filter must be one SQL condition"),
        ({"set": {}}, "set must name columns"),
        # User text runs on the session's connection: the SQL barriers hold for it too.
        ({"set": {"val": "1"}, "where": "id IN (SELECT * FROM query('SELECT 1'))"}, "query\\(\\) runs SQL text"),
        (
            {"set": {"val": "(SELECT count(*) FROM ducklake_snapshots('castsql_lake'))"}},
            "DuckLake functions are not available",
        ),
    ],
)
def test_bad_updates_are_one_line_and_commit_nothing(events, kwargs, message):
    t, _ = events
    files_before = len(list(TableLog(open_storage(t.uri, s3=t._session.s3)).storage.list("data/")))
    with pytest.raises(CastSQLError, match=message) as e:
        t.update(**kwargs)
    assert "\n" not in str(e.value)
    assert t.at().version == 6 and t.version == 6
    assert len(list(TableLog(open_storage(t.uri, s3=t._session.s3)).storage.list("data/"))) == files_before


def test_delete_by_predicate_and_its_errors(events):
    t, ev = events
    m = t.delete("id >= 1000 AND id < 1400")
    assert m.summary["deleted_rows"] == len({i for i in ev.live[6] if 1000 <= i < 1400})
    assert set(vals(t)) == {i for i in ev.live[6] if not 1000 <= i < 1400}
    assert t.delete("id = 1000") is None  # already gone
    with pytest.raises(WriteError, match="table events: delete: column 'grp' has values of another type"):
        t.delete("grp = 5")
    with pytest.raises(WriteError, match="table events: delete: no condition"):
        t.delete(None)
    assert t.at().version == 7


def test_merge_text_is_checked_like_sql(events):
    t, _ = events
    src = pa.table({"id": pa.array([1], pa.int64()), "val": [9.0]})
    with pytest.raises(CastSQLError, match=r"table events: merge: .*query\(\) runs SQL text"):
        t.merge(src, on="id").when_matched_update(
            set={"val": "source.val"}, condition="EXISTS (SELECT * FROM query('SELECT 1'))"
        ).execute()
    assert t.at().version == 6


def test_append_from_arrow_pandas_polars_and_bad_data(events):
    t, ev = events
    from tables import rows

    assert t.append(rows(5000, 5010)).version == 7
    pd = pytest.importorskip("pandas")
    assert t.append(rows(5010, 5020).to_pandas()).version == 8
    pl = pytest.importorskip("polars")
    assert t.append(pl.from_arrow(rows(5020, 5030))).version == 9
    assert set(vals(t)) == ev.live[6] | set(range(5000, 5030))
    with pytest.raises(SchemaMismatch):
        t.append(pa.table({"id": ["x"], "grp": ["a"], "val": [1.0], "ts": rows(0, 1).column("ts")}))
    with pytest.raises(SchemaMismatch, match="primary key"):  # other missing columns read NULL; the key may not
        t.append(pa.table({"grp": ["a"], "val": [1.0]}))
    assert t.append(rows(0, 0)) is None
    assert t.at().version == 9
    del pd


def test_a_table_opened_at_an_old_version_refuses_writes(events):
    t, _ = events
    old = t.at(version=3)
    for write in (lambda: old.update(set={"val": "1"}), lambda: old.delete("true"), lambda: old.append(pa.table({}))):
        with pytest.raises(CastSQLError, match="table events is pinned at version 3; writes go to the newest version"):
            write()
    assert t.at().version == 6


# ---------------------------------------------------------------------- crash

_STEPS = ["data:before", "data:after", "tombstone:before", "tombstone:after", "manifest:before", "manifest:after"]


@pytest.mark.parametrize(
    ("op", "step"),
    [("update", s) for s in _STEPS] + [("delete", s) for s in _STEPS if not s.startswith("data")],
)
def test_an_update_or_delete_killed_at_any_step_is_all_or_nothing(tmp_path, op, step):
    """SIGKILL at each storage step of the write: before the manifest is
    created nothing is visible (what was written is garbage); once it is, the
    whole change is (FORMAT.md §6: the manifest put is the commit point)."""
    import signal
    import subprocess
    import sys

    st = open_storage(str(tmp_path / "kv"))
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64())])
    TableLog.create(st, schema, primary_key="id")
    t = castsql.open(st.root)
    t.append(pa.table({"id": list(range(20)), "v": ["old"] * 20, "n": list(range(20))}, schema=schema))
    before = {r["id"]: r["n"] for r in t.to_arrow().to_pylist()}
    t.close()
    worker = str(SUPPORT / "merge_worker.py")
    r = subprocess.run([sys.executable, worker, st.root, step, op], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    committed = step == "manifest:after"
    t = castsql.open(st.root)
    got = t.to_arrow().to_pylist()
    after = {r["id"]: r["n"] for r in got}
    assert len(after) == len(got), "a key appears twice: the delete and the insert were split"
    want = dict(before)
    if committed and op == "update":
        want[5] = -1
    elif committed:
        del want[5]
    assert after == want
    assert t.version == (2 if committed else 1)
    # The next write commits normally on top; the crashed one's objects are garbage.
    t.update(set={"n": "100"}, where="id = 6")
    assert {r["id"]: r["n"] for r in t.to_arrow().to_pylist()}[6] == 100
    t.close()
