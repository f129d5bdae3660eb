"""``castsql demo``: a warehouse built by Spark, with every tombstone kind, readable by the engine."""

from __future__ import annotations

import time

import pytest

from castsql.cli.demo import build_demo, main
from castsql.engine.session import Session
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog
from castsql.spark import read
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


def test_demo_warehouse_has_every_tombstone_kind(spark, tmp_path):
    start = time.monotonic()
    lines: list[str] = []
    path = build_demo(tmp_path / "wh", log=lines.append)
    assert time.monotonic() - start < 60  # the shared session is warm; a cold start adds ~15 s
    assert lines[-1].startswith(f"demo warehouse ready at {path}")
    log = TableLog(open_storage(path + "/events"))
    assert [m.operation for m in log.history()] == ["CREATE", "APPEND", "APPEND"] + ["DELETE"] * 4 + ["APPEND"]
    kinds = set()
    for t in log.latest().tombstones:
        for r in log.tombstones(t):
            kinds.add("bitmap" if isinstance(r, PositionDelete) and len(r.positions) > 32 else type(r).__name__)
    assert kinds == {"RowGroupDelete", "KeyRangeDelete", "PositionDelete", "bitmap"}
    assert {RowGroupDelete, KeyRangeDelete, PositionDelete} >= {type(r) for t in log.latest().tombstones
                                                                for r in log.tombstones(t)}  # fmt: skip
    with Session(path) as s:
        assert s.tables == ["events", "users"]
        for v in log.versions():
            n = s.sql(f"SELECT count(*) AS n FROM events AS OF VERSION {v}").to_pylist()[0]["n"]
            assert read(spark, path + "/events", v).count() == n
        top = s.sql(
            "SELECT u.country, count(*) AS n FROM events e JOIN users u ON e.user = u.user GROUP BY 1 ORDER BY 2 DESC"
        )
        assert top.num_rows == 6 and sum(top["n"].to_pylist()) == 700_000 - 50_000 - 20_000 - 10_656 - 2
    assert build_demo(path, log=lines.append) == path and lines[-1] == f"demo warehouse already at {path}"


def test_demo_refuses_a_directory_that_is_not_a_demo(tmp_path, capsys):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "x").write_text("mine")
    assert main([str(tmp_path / "stuff")]) == 1
    err = capsys.readouterr().err
    assert "exists and is not a demo warehouse" in err
    assert [p.name for p in (tmp_path / "stuff").iterdir()] == ["x"]
    assert main(["a", "b"]) == 2
