"""Under the change feed a handle that merges again and again takes the rows
it replaces from its row cache (castsql/embedded/rowcache.py), not from the
data files: every change file it writes must hold exactly what reading those
rows from the files gives, and audits must say what the same history audited
from content says, whether the cache is warm, cold, off or too small."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from change_rows import added_rows, by_place
from pyroaring import BitMap

import castsql
from castsql.embedded import rowcache
from castsql.format import TableLog, write_data_files
from castsql.snapshot import resolve
from castsql.storage import open_storage
from castsql.write.pipeline import evolve
from castsql.write.preimages import read_preimages, write_preimages

CDF = {"castsql.changeDataFeed": "true"}
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int32()), ("seq", pa.int64())])
DELETED, INSERTED = ("delete", "update_preimage"), ("insert", "update_postimage")


def src(ids, score: int, seq: int = 1) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {"id": ids, "name": [f"n{i}-{score}" for i in ids], "score": [score + i for i in ids], "seq": [seq] * len(ids)},
        schema=SCHEMA,
    )


def build(root: str, props: dict | None) -> TableLog:
    """Two files of 1,500 rows in row groups of 100: random keys hit many row groups."""
    st = open_storage(root)
    log = TableLog.create(st, SCHEMA, primary_key="id", properties=props)
    log.append(write_data_files(st, src(range(1500), 0, 0), row_group_size=100))
    log.append(write_data_files(st, src(range(1500, 3000), 0, 0), row_group_size=100))
    return log


def stream(root: str, fresh: bool) -> list[str]:
    """Every kind of write a stream does, by one kept handle (``fresh``: a
    handle opened for each write, whose caches never warm)."""
    rng = random.Random(11)
    kept = castsql.open(root)
    done = []

    def handle() -> castsql.Table:
        return castsql.open(root) if fresh else kept

    next_id = 5000
    for step in range(14):
        t = handle()
        ids = [*rng.sample(range(3000), 20), *range(next_id, next_id + 4)]
        next_id += 4
        kind = ("upsert", "upsert", "merge", "update", "delete", "cdc", "compact")[step % 7]
        done.append(kind)
        if kind == "upsert":
            t.merge(src(ids, step), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        elif kind == "merge":  # deletes, updates of one column, inserts
            (
                t.merge(src(ids, step), on="id")
                .when_matched_delete(condition="source.score % 3 = 0")
                .when_matched_update(set={"name": "source.name"})
                .when_not_matched_insert_all()
                .execute()
            )
        elif kind == "update":
            t.update(set={"score": "score + 1"}, where=f"id IN ({', '.join(map(str, ids[:5]))})")
        elif kind == "delete":
            t.delete(f"id IN ({', '.join(map(str, ids[5:9]))})")
        elif kind == "cdc":
            ops = pa.array(["U", "D"] * (len(ids) // 2))
            t.apply_cdc(src(ids, step, seq=step + 10).append_column("op", ops), key="id", op_column="op",
                        sequence="seq")  # fmt: skip
        else:
            t.compact()
        if fresh:
            t.close()
    if not fresh:
        assert kept._session is not None
        done.append(f"row cache files: {len(rowcache.of(kept._session)) > 0}")
    kept.close()
    return done


def _part(log: TableLog, v: int, types: tuple[str, str]) -> pa.Table:
    t = read_preimages(log.storage, log.manifest(v).change.change_file)
    return t.filter(pc.is_in(t.column("_change_type"), pa.array(types))).drop_columns(["_change_type"])


def _from_files(log: TableLog, v: int) -> pa.Table:
    """Version ``v``'s deleted rows as reading them from the data files of ``v - 1`` gives them."""
    gone: dict[str, BitMap] = {}
    for r in _part(log, v, DELETED).select(["_castsql_file", "_castsql_pos"]).to_pylist():
        gone.setdefault(r["_castsql_file"], BitMap()).add(r["_castsql_pos"])
    cd = write_preimages(log.storage, evolve(resolve(log, v - 1), log.manifest(v).schema, "test"), gone)
    assert cd is not None
    return read_preimages(log.storage, cd.file)


def _changes(root: str, a: int, b: int) -> list[str]:
    with castsql.open(root) as t:
        return sorted(map(str, t.changes(a, b).drop_columns(["_commit_timestamp"]).to_pylist()))


@pytest.mark.parametrize("mode", ["warm", "cold", "cache off", "budget too small"])
def test_change_files_hold_what_the_files_hold_and_audits_agree_with_content(tmp_path, monkeypatch, mode):
    if mode == "cache off":
        monkeypatch.setenv("CASTSQL_KEY_CACHE", "0")
    if mode == "budget too small":
        monkeypatch.setattr(rowcache, "BUDGET", 1_000)  # no file fits: every one fetched by position
    fed, plain = str(tmp_path / "fed"), str(tmp_path / "plain")
    log = build(fed, CDF)
    build(plain, None)
    done = stream(fed, fresh=mode == "cold")
    assert done[:14] == stream(plain, fresh=mode == "cold")[:14]
    if mode == "warm":
        assert done[-1] == "row cache files: True"  # the kept handle's merges took rows from it
    elif mode != "cold":
        assert done[-1] == "row cache files: False"
    last = log.latest().version
    recorded = [v for v in range(3, last + 1) if log.manifest(v).change.change_file is not None]
    assert len(recorded) >= 10
    for v in recorded:
        assert by_place(_part(log, v, DELETED)) == by_place(_from_files(log, v)), v
        if log.manifest(v).change.added_files:
            assert by_place(_part(log, v, INSERTED)) == by_place(added_rows(log, v)), v
    for a, b in [(3, last), (3, 3), (4, 4), (5, 9), (last - 4, last)]:
        assert _changes(fed, a, b) == _changes(plain, a, b), (a, b)


def test_a_schema_change_makes_new_rows_not_wrong_ones(tmp_path):
    """A column added and one widened while the handle holds the file's rows:
    the next change file has them in the new schema (NULL, the wider type)."""
    fed = str(tmp_path / "fed")
    log = build(fed, CDF)
    with castsql.open(fed) as t:
        for step in range(3):  # the second and third take rows from the cache
            s = src([7, 1600, 9000 + step], step)
            t.merge(s, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        assert len(rowcache.of(t._session)) > 0
        wide = src([7, 1700], 50).append_column("note", pa.array(["a", "b"]))
        wide = wide.set_column(2, "score", wide.column("score").cast(pa.int64()))
        t.merge(wide, on="id", merge_schema=True).when_matched_update_all().execute()
        t.merge(src([1700, 8], 60), on="id").when_matched_update(set={"name": "source.name"}).execute()
    v = log.latest().version
    got = by_place(_part(log, v, DELETED))
    assert got == by_place(_from_files(log, v))
    assert [(r["id"], r["score"], r["note"]) for r in got] == [(8, 8, None), (1700, 1750, "b")]
    assert _part(log, v, DELETED).schema.field("score").type == pa.int64()
