"""SQL forms that must work wherever SQL works, through ``Session.sql`` and the
shell: time travel with a parameter, dollar-quoted strings, comments, nested
subqueries, CTEs and UNION."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from castsql.engine import Session
from castsql.errors import CastSQLError
from castsql.format import TableLog, write_data_files
from castsql.shell.core import Settings, Shell
from castsql.storage import open_storage


@pytest.fixture
def root(tmp_path) -> str:
    root = str(tmp_path / "events")
    log = TableLog.create(open_storage(root), pa.schema([("id", pa.int64()), ("note", pa.string())]))
    log.append(write_data_files(log.storage, pa.table({"id": [1, 2, 3], "note": ["a)b", "x", "AS OF VERSION 9"]})))
    log.append(write_data_files(log.storage, pa.table({"id": [4], "note": ["z"]})))
    return root


FORMS = [
    ("SELECT count(*) AS n FROM events WHERE note = $$a)b$$", 1),
    ("SELECT count(*) AS n FROM events AS OF VERSION 1 WHERE note <> $tag$AS OF VERSION 2$tag$", 3),
    ("SELECT count(*) AS n FROM events VERSION AS OF 1 /* AS OF VERSION 2 */ -- AS OF VERSION 0\n", 3),
    ("SELECT count(*) AS n FROM events AT (VERSION => 1) WHERE note = 'AS OF VERSION 9'", 1),
    (
        "WITH old AS (SELECT * FROM events AS OF VERSION 1) "
        "SELECT count(*) AS n FROM (SELECT id FROM old UNION ALL SELECT id FROM events) u",
        7,
    ),
    ("SELECT count(*) AS n FROM events WHERE id NOT IN (SELECT id FROM events AS OF VERSION 1 e WHERE e.id > 1)", 2),
]


@pytest.mark.parametrize(("query", "n"), FORMS)
def test_forms_through_session_sql(root, query, n):
    assert Session(root).sql(query).to_pylist() == [{"n": n}]


@pytest.mark.parametrize(("query", "n"), FORMS)
def test_forms_through_the_shell(root, query, n):
    out = io.StringIO()
    sh = Shell(Session(root), stdout=out, stderr=out, settings=Settings(mode="csv"))
    assert sh.run_lines([query.replace("\n", " ") + ";\n"], "<test>"), out.getvalue()
    assert out.getvalue().split() == ["n", str(n)]


def test_as_of_version_takes_a_parameter(root):
    s = Session(root)
    assert s.sql("SELECT count(*) AS n FROM events AS OF VERSION ?", [1]).to_pylist() == [{"n": 3}]
    q = "SELECT count(*) AS n FROM events AS OF VERSION ? WHERE id > ? AND note <> ?"
    assert s.sql(q, [1, 1, "x"]).to_pylist() == [{"n": 1}]
    q = "SELECT ? AS a, (SELECT count(*) FROM events VERSION AS OF ?) AS n, ? AS b"
    assert s.sql(q, ["x", 2, "y"]).to_pylist() == [{"a": "x", "n": 4, "b": "y"}]
    with pytest.raises(CastSQLError, match="needs a value"):
        s.sql("SELECT * FROM events AS OF VERSION ?")
    with pytest.raises(CastSQLError, match="needs a version number"):
        s.sql("SELECT * FROM events AS OF VERSION ?", ["1"])
