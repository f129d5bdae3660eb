"""The change data feed (``castsql.changeDataFeed``, FORMAT.md §3.5): deletes,
updates and merges also commit the rows they delete, and audits read a
recorded version's change from its own files, never the row groups its
tombstones hit. Proven against the same history without it (audited from
the versions' content), on every store."""

from __future__ import annotations

import random
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from change_rows import added_rows, by_place
from pyroaring import BitMap
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

import castsql
from castsql.errors import CastSQLError, QueryError, VersionNotFound
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.snapshot import resolve
from castsql.storage import open_storage
from castsql.write.commit import commit_dml
from castsql.write.pipeline import evolve
from castsql.write.preimages import read_preimages, write_preimages

CDF = {"castsql.changeDataFeed": "true"}
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def rows(ids, score: float = 0.0) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"p{i}" for i in ids], "score": [score + i for i in ids]}, schema=SCHEMA)


def start(root: str, s3, props: dict | None) -> tuple[castsql.Table, TableLog]:
    """A keyed table: version 1 holds ids 0-299 in one file, sorted, row groups of 20."""
    st = open_storage(root, s3=s3)
    log = TableLog.create(st, SCHEMA, primary_key="id", properties=props)
    log.append(write_data_files(st, rows(range(300)), row_group_size=20))
    return castsql.open(st.root, s3=s3), log


def history(t: castsql.Table, rng: random.Random) -> list[str]:
    """A random history touching every tombstone kind, updates (one moving a
    key), merges with every clause, a column added, a compaction and an
    overwrite-free tail; returns what it did."""
    done = []
    next_id = 1000
    note = False  # the column added on the way
    for step in range(16):
        op = ("range", "group", "positions", "update", "merge", "move")[step] if step < 6 else rng.choice(
            ("positions", "update", "merge", "merge", "compact", "column")
        )  # fmt: skip
        done.append(op)
        if op == "range":  # a run of consecutive sorted keys: a key-range tombstone
            t.delete("id BETWEEN 40 AND 47")
        elif op == "group":  # every live row of a row group
            t.delete("id >= 100 AND id < 120")
        elif op == "positions":
            t.delete(f"id % {rng.randrange(7, 23)} = {rng.randrange(7)}")
        elif op == "update":
            lo = rng.randrange(0, 300)
            t.update(set={"score": "score * 2 + 1", "name": "name || '!'"}, where=f"id BETWEEN {lo} AND {lo + 30}")
        elif op == "move":
            t.update(set={"id": "id + 5000"}, where="id IN (1, 2)")
        elif op == "merge":
            ids = rng.sample(range(0, 300), 12) + list(range(next_id, next_id + 5))
            next_id += 5
            src = rows(ids, score=float(rng.randrange(100)))
            if note:
                src = src.append_column("note", pa.array(["m"] * len(ids)))
            (
                t.merge(src, on="id")
                .when_matched_delete(condition="source.score < 30")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(condition=f"target.id % 97 = {rng.randrange(97)}")
                .execute()
            )
        elif op == "compact":
            t.compact()
        elif not note:
            src = rows([next_id]).append_column("note", pa.array(["new"]))
            next_id += 1
            t.merge(src, on="id", merge_schema=True).when_not_matched_insert_all().execute()
            note = True
    return done


def changes(t: castsql.Table, a: int, b: int) -> list[tuple]:
    got = t.changes(a, b).drop_columns(["_commit_timestamp"]).to_pylist()
    return sorted(tuple(sorted(r.items(), key=lambda kv: kv[0])) for r in got)


def test_audits_with_change_data_say_what_audits_of_the_content_say(storage_root, s3_config):
    plain, _ = start(storage_root + "/plain", s3_config, None)
    fed, log = start(storage_root + "/fed", s3_config, CDF)
    with plain, fed:
        assert history(plain, random.Random(7)) == history(fed, random.Random(7))
        last = fed.version
        assert plain.version == last
        recorded = [v for v in range(2, last + 1) if log.manifest(v).change.change_file is not None]
        assert len(recorded) >= 8  # the feed was written, so the fast audit ran
        for a, b in [(0, last), (2, 2), (3, 5), (6, 9), (last - 2, last), (8, 8)]:
            assert changes(fed, a, b) == changes(plain, a, b), (a, b)
        for key in (5, 41, 110, 1000, 5001):
            want = sorted(map(str, plain.row_history(key).drop_columns(["_commit_timestamp"]).to_pylist()))
            got = sorted(map(str, fed.row_history(key).drop_columns(["_commit_timestamp"]).to_pylist()))
            assert got == want, key


def test_a_recorded_version_is_audited_without_the_files_its_tombstones_hit(tmp_path):
    """The base file the update, delete and merge hit is removed from storage:
    their changes still read, from their own new files and change-data files."""
    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.update(set={"score": "-1"}, where="id IN (3, 250)")  # v2
        t.delete("id = 7")  # v3
        t.merge(rows([8, 400], score=0.5), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        want = [
            (2, 3, "update_preimage", 3.0), (2, 3, "update_postimage", -1.0),
            (2, 250, "update_preimage", 250.0), (2, 250, "update_postimage", -1.0),
            (3, 7, "delete", 7.0),
            (4, 8, "update_preimage", 8.0), (4, 8, "update_postimage", 8.5), (4, 400, "insert", 400.5),
        ]  # fmt: skip
        (tmp_path / "t" / log.manifest(1).data_files[0].path).unlink()
        got = [(r["_commit_version"], r["id"], r["_change_type"], r["score"]) for r in t.changes(2, 4).to_pylist()]
        assert got == want


def test_without_the_feed_an_audit_reads_the_files_the_tombstones_hit(tmp_path):
    """The same removal without ``castsql.changeDataFeed``: the audit must read
    the base file, and says which one is missing (the fast path above is real)."""
    t, log = start(str(tmp_path / "t"), None, None)
    with t:
        t.delete("id = 7")
        assert log.manifest(2).change.change_file is None and log.manifest(2).change.preimages is None
        (tmp_path / "t" / log.manifest(1).data_files[0].path).unlink()
        with pytest.raises(QueryError, match=r"table t: version 2: .*\.parquet \(the rows it deleted\) cannot be read"):
            t.changes(2, 2)


def test_a_missing_change_data_file_is_named_with_its_version(tmp_path):
    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.delete("id = 7")  # v2
        path = log.manifest(2).change.change_file.path
        (tmp_path / "t" / path).unlink()
        with pytest.raises(QueryError) as e:
            t.changes(2, 2)
        assert str(e.value).startswith(f"table t: version 2: {tmp_path / 't' / path} (its change file) cannot")
        assert "\n" not in str(e.value)


def test_sql_names_a_missing_change_data_file_with_its_version(tmp_path):
    """table_changes in SQL stands in the query as its SELECT (no view made):
    a file it cannot read is still named with the version, whether planning
    finds it gone (a fresh session) or DuckDB does, running the query (a
    session that read it before, its footer known)."""
    from castsql.engine import Session

    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.delete("id = 7")  # v2
    path = log.manifest(2).change.change_file.path
    want = f"table t: version 2: {tmp_path / 't' / path} (its change file) cannot"
    queries = (
        "SELECT * FROM table_changes('t', 2, 2)",
        "SELECT c.id FROM table_changes('t', 2, 2) AS c WHERE c.id > 0",
        "DESCRIBE table_changes('t', 2, 2)",  # not a FROM item: a view, as before
    )
    with Session(str(tmp_path / "t")) as warm:
        for q in queries:
            warm.sql(q)
        (tmp_path / "t" / path).unlink()
        for q in queries:
            with pytest.raises(QueryError) as e:
                warm.sql(q)
            assert str(e.value).startswith(want), (q, str(e.value))
    for q in queries:
        with Session(str(tmp_path / "t")) as s, pytest.raises(QueryError) as e:
            s.sql(q)
        assert str(e.value).startswith(want), q


def test_table_changes_inline_reads_as_its_view(tmp_path):
    """Where table_changes is a FROM item its SELECT replaces the call (with
    the view's name as alias when it has none); elsewhere the view is made.
    Every form reads the same rows, and a name the user gave still binds."""
    from castsql.engine import Session

    t, _ = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.update({"score": "-1"}, where="id IN (3, 250)")  # v2: two updates
        t.delete("id = 7")  # v3
    with Session(str(tmp_path / "t")) as s:
        want = s.changes("t", 2, 3).to_pylist()
        assert len(want) == 5
        for q in (
            "SELECT * FROM table_changes('t', 2, 3)",
            "SELECT * FROM table_changes('t', 2, 3) ORDER BY _commit_version, id, _change_type DESC",
            "SELECT c.* FROM table_changes('t', 2, 3) c",
            "SELECT x.* FROM table_changes('t', 2, 3) AS x(id, name, score) ORDER BY _commit_version, id",
            "SELECT * FROM (SELECT * FROM table_changes('t', 2, 3)) ORDER BY _commit_version, id",
            "FROM table_changes('t', 2, 3) ORDER BY _commit_version, id, _change_type DESC",
        ):
            got = s.sql(q)
            assert "read_parquet" in s.prepare(q), q  # the SELECT stands inline, no view
            assert sorted(map(str, got.to_pylist())) == sorted(map(str, want)), q
        assert [r["id"] for r in s.sql("SELECT c.id FROM t JOIN table_changes('t', 2, 3) c USING (id)").to_pylist()]
        shown = s.sql("DESCRIBE table_changes('t', 2, 3)").column("column_name").to_pylist()
        assert shown == ["id", "name", "score", "_change_type", "_commit_version", "_commit_timestamp"]
        with pytest.raises(QueryError, match=r"nope"):
            s.sql("SELECT nope FROM table_changes('t', 2, 3)")


def test_a_delete_rebased_over_other_deletes_keeps_exact_change_data(tmp_path):
    """A delete planned on version 2 lands after deletes of the same rows
    (refused: planned again) or of another file (rebased: its change-data
    file still lists exactly its rows). A change without those conflict
    rules drops its change-data file when it rebases over any tombstone."""
    from castsql.format.change import Change, DmlConflict

    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.append(rows(range(300, 310)))  # v2: a second file
        snap = resolve(log, 2)
        base, other = sorted(snap.files, key=lambda f: f.total_rows, reverse=True)

        def plan(f, positions):
            pre = write_preimages(log.storage, snap, {f.key: BitMap(positions)})
            return [PositionDelete(f.key, None, BitMap(positions))], pre

        t.delete("id = 5")  # v3: row 5 of the base file
        recs, pre = plan(base, [5, 6])
        with pytest.raises(DmlConflict):
            commit_dml(log, operation="DELETE", read_version=2, records=recs, files=[], change_data=pre)
        recs, pre = plan(other, [0])
        m = commit_dml(log, operation="DELETE", read_version=2, records=recs, files=[], change_data=pre)
        assert m.version == 4 and m.change.preimages is not None
        t.delete("id = 9")  # v5
        key = log.write_tombstone([PositionDelete(other.key, None, BitMap([1]))])
        pre = write_preimages(log.storage, snap, {other.key: BitMap([1])})
        m = log.commit(Change("DELETE", add_tombstones=(key,), read_version=4, change_data=pre))
        assert m.version == 6 and m.change.preimages is None
        got = [(r["_commit_version"], r["id"]) for r in t.changes(3, 6).to_pylist()]
        assert got == [(3, 5), (4, 300), (5, 9), (6, 301)]


def test_gc_keeps_a_change_data_file_while_its_version_is_kept(tmp_path):
    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.delete("id = 1")  # v2
        key = log.manifest(2).change.change_file.path
        t.delete("id = 2")  # v3
        t.delete("id = 3")  # v4
        report = t.gc(keep_versions=3, grace=timedelta(0))
        assert report.removed_versions == [0, 1] and (tmp_path / "t" / key).exists()
        assert [r["id"] for r in t.changes(3, 4).to_pylist()] == [2, 3]
        with pytest.raises(VersionNotFound, match="version 1 was garbage-collected"):
            t.changes(2, 4)
        report = t.gc(keep_versions=1, grace=timedelta(0))
        assert key in report.removed_data_files and not (tmp_path / "t" / key).exists()


def test_the_setting_is_checked_and_can_be_turned_on_later(tmp_path):
    t, log = start(str(tmp_path / "t"), None, None)
    with t:
        with pytest.raises(CastSQLError, match=r"castsql.changeDataFeed.*true or false"):
            t.set_properties({"castsql.changeDataFeed": "yes"})
        assert log.latest().version == 1
        t.delete("id = 1")  # v2: off
        t.set_properties(CDF)  # v3
        t.delete("id = 2")  # v4: on
        assert log.manifest(2).change.change_file is None
        pre = log.manifest(4).change.change_file
        assert pre is not None and pre.total_rows == 1
        assert [(r["_commit_version"], r["id"]) for r in t.changes(2, 4).to_pylist()] == [(2, 1), (4, 2)]


def test_a_row_history_skips_the_versions_whose_recorded_keys_miss_it(tmp_path):
    """A version records the keys it changed: the history of another key never
    opens its files (removed here from storage, it still answers), though
    their statistics ([2, 400]) may hold it."""
    t, log = start(str(tmp_path / "t"), None, CDF)
    with t:
        t.update(set={"score": "-1"}, where="id = 3")  # v2
        t.merge(rows([2, 400], score=0.5), on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        t.delete("id = 3")  # v4
        assert [log.manifest(v).change.keys for v in (2, 3, 4)] == [(3,), (2, 400), (3,)]
        c = log.manifest(3).change
        for f in (*c.added_files, c.change_file):
            (tmp_path / "t" / f.path).unlink()
        got = [(r["_commit_version"], r["_change_type"], r["score"]) for r in t.row_history(3).to_pylist()]
        assert got == [
            (1, "insert", 3.0),
            (2, "update_preimage", 3.0),
            (2, "update_postimage", -1.0),
            (4, "delete", -1.0),
        ]


@pytest.mark.parametrize("key_type", [pa.float64(), pa.string(), pa.date32(), pa.timestamp("us", tz="UTC")])
def test_every_key_type_writes_change_data_a_fresh_process_reads(tmp_path, key_type):
    """A float key's changes are not listed in change.keys (its JSON form need
    not round-trip); the others are. Either way a fresh handle reads the table
    and its audit. (A float key's list once made the manifest unreadable.)"""
    uri = str(tmp_path / "t")
    raw = {"string": ["a", "b", "c"], "date32[day]": [0, 1, 2]}.get(str(key_type), [0, 1, 2])
    ids = pa.array(raw, pa.int32() if pa.types.is_date(key_type) else None).cast(key_type)
    castsql.write_table(uri, pa.table({"id": ids, "v": ["x", "y", "z"]}), primary_key="id", properties=CDF)
    with castsql.open(uri) as t:
        t.delete("v = 'y'")  # v2
    log = TableLog(open_storage(uri))
    keys = log.manifest(2).change.keys
    assert (keys is None) == pa.types.is_floating(key_type)
    with castsql.open(uri) as t:  # a fresh handle, a fresh parse of the manifest
        got = t.changes(2, 2).to_pylist()
        assert [(r["v"], r["_change_type"]) for r in got] == [("y", "delete")]
        assert [r["_change_type"] for r in t.row_history(ids[1].as_py()).to_pylist()] == ["insert", "delete"]


def _file_preimages(log: TableLog, v: int) -> pa.Table:
    """Version ``v``'s change-data rows as reading them from the data files of
    ``v - 1`` gives them (the path every engine without held rows takes), in
    the schema the writer read them in (``v``'s, for a merge adding a column)."""
    st = log.storage
    gone: dict[str, BitMap] = {}
    for r in _change_part(log, v, DELETED).select(["_castsql_file", "_castsql_pos"]).to_pylist():
        gone.setdefault(r["_castsql_file"], BitMap()).add(r["_castsql_pos"])
    cd = write_preimages(st, evolve(resolve(log, v - 1), log.manifest(v).schema, "test"), gone)
    assert cd is not None
    return read_preimages(st, cd.file)


DELETED, INSERTED = ("delete", "update_preimage"), ("insert", "update_postimage")


def _change_part(log: TableLog, v: int, types: tuple[str, str]) -> pa.Table:
    """The rows of version ``v``'s change file of those change types, without the type."""
    t = read_preimages(log.storage, log.manifest(v).change.change_file)
    return t.filter(pc.is_in(t.column("_change_type"), pa.array(types))).drop_columns(["_change_type"])


def test_a_merge_writes_the_rows_it_matched_as_the_files_hold_them(tmp_path):
    """A keyed merge writes its change-data file from the target rows it read
    to match (no second read of their row groups): every version's file holds
    exactly what reading the deleted rows from the data files gives, across
    updates of some columns, deletes, inserts, rows in several files, a CDC
    batch ordered by a sequence, a column added and a column widened, a
    compaction and a restore; and the audit says what the same history
    audited from content says."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.int32()), ("seq", pa.int64())])

    def src(ids, score: int, seq: int) -> pa.Table:
        ids = list(ids)
        return pa.table(
            {"id": ids, "name": [f"n{i}-{score}" for i in ids], "score": [score + i for i in ids],
             "seq": [seq] * len(ids)},
            schema=schema,
        )  # fmt: skip

    def run(root: str, props: dict | None) -> tuple[castsql.Table, TableLog]:
        st = open_storage(root)
        log = TableLog.create(st, schema, primary_key="id", properties=props)
        log.append(write_data_files(st, src(range(200), 0, 0), row_group_size=16))
        log.append(write_data_files(st, src(range(200, 400), 0, 0), row_group_size=16))
        t = castsql.open(st.root)
        rng = random.Random(3)
        for step in range(5):  # v3..v7: updates of one column, deletes, inserts, over both files
            s = src([*rng.sample(range(400), 15), 1000 + step], step + 1, 1)
            (
                t.merge(s, on="id")
                .when_matched_delete(condition="source.score % 3 = 0")
                .when_matched_update(set={"score": "source.score"})
                .when_not_matched_insert_all()
                .execute()
            )
        cdc = src([5, 6, 7, 300], 50, 9).append_column("op", pa.array(["U", "D", "U", "U"]))
        t.apply_cdc(cdc, key="id", op_column="op", sequence="seq")  # v8
        t.apply_cdc(cdc, key="id", op_column="op", sequence="seq")  # a replay: stale, no version
        wide = src([8, 9, 2000], 70, 10).append_column("note", pa.array(["a", "b", "c"]))
        wide = wide.set_column(2, "score", wide.column("score").cast(pa.int64()))  # widens int -> bigint
        t.merge(wide, on="id", merge_schema=True).when_matched_update_all().when_not_matched_insert_all().execute()
        t.compact()
        t.merge(src([10, 11, 399], 80, 11), on="id").when_matched_update(set={"name": "source.name"}).execute()
        log.restore(6)
        t.merge(src([12, 13], 90, 12), on="id").when_matched_update(set={"score": "source.score"}).execute()
        return t, log

    fed, log = run(str(tmp_path / "fed"), CDF)
    plain, _ = run(str(tmp_path / "plain"), None)
    with fed, plain:
        last = fed.version
        recorded = [v for v in range(3, last + 1) if log.manifest(v).change.change_file is not None]
        assert len(recorded) >= 8
        for v in recorded:
            assert by_place(_change_part(log, v, DELETED)) == by_place(_file_preimages(log, v)), v
            if log.manifest(v).change.added_files:
                assert by_place(_change_part(log, v, INSERTED)) == by_place(added_rows(log, v)), v
        assert any("note" in log.manifest(v).schema.names for v in recorded)
        for a, b in [(3, 3), (3, last), (8, 8), (9, 9), (last - 3, last)]:
            assert changes(fed, a, b) == changes(plain, a, b), (a, b)


def test_versions_with_pre_images_and_with_change_files_read_together(tmp_path):
    """A table whose history mixes the two records of §3.5 (pre-images, as
    writers wrote them before change files, and change files) reads every
    range as the same history audited from content does."""
    fed, log = start(str(tmp_path / "fed"), None, CDF)
    plain, _ = start(str(tmp_path / "plain"), None, None)
    with fed, plain:
        for t in (fed, plain):
            t.update(set={"score": "-1"}, where="id IN (3, 250)")  # v2: a change file
        snap = resolve(log, 2)
        f = max(snap.files, key=lambda f: f.total_rows)
        pre = write_preimages(log.storage, snap, {f.key: BitMap([10, 11])})  # the rows of ids 10 and 11
        m = commit_dml(
            log, operation="DELETE", read_version=2, records=[PositionDelete(f.key, None, BitMap([10, 11]))],
            files=[], change_data=pre,
        )  # fmt: skip
        assert m.version == 3 and m.change.preimages is not None and m.change.change_file is None
        plain.delete("id IN (10, 11)")  # v3
        for t in (fed, plain):
            t.merge(
                rows([12, 500], score=0.5), on="id"
            ).when_matched_update_all().when_not_matched_insert_all().execute()
        assert log.manifest(4).change.change_file is not None
        for a, b in [(2, 4), (3, 3), (3, 4), (2, 2), (4, 4)]:
            assert changes(fed, a, b) == changes(plain, a, b), (a, b)
        assert fed.row_history(12).num_rows == plain.row_history(12).num_rows == 3


def test_a_manifest_with_both_records_is_refused(tmp_path):
    from castsql.errors import FormatError
    from castsql.format.manifest import ChangeLog

    entry = {"path": "data/x.parquet", "size_bytes": 1, "row_group_count": 1, "total_rows": 1}
    with pytest.raises(FormatError, match="both 'preimages' and 'change_file'"):
        ChangeLog.from_json({"preimages": entry, "change_file": entry}, "v3")


def _blocks_of(root) -> set[tuple[int, int]]:
    from castsql.format.changeblocks import BLOCKS_DIR, block_version

    st = open_storage(str(root))
    return {block_version(i.key) for i in st.list(BLOCKS_DIR + "/")}


def test_change_blocks_say_what_each_version_says(tmp_path):
    """Every 8th and 64th version's writer puts the change files of the
    versions ending there into one block (FORMAT.md §3.8) when each of them
    is known from its manifest; an audit over any range reads what the same
    history audited from content reads, blocks or not, and a block removed
    from storage changes nothing but the speed."""
    fed, _ = start(str(tmp_path / "fed"), None, CDF)
    plain, _ = start(str(tmp_path / "plain"), None, None)
    rng = random.Random(5)
    with fed, plain:
        for v in range(2, 75):
            ids = [*rng.sample(range(300), 6), 1000 + v]
            for t in (fed, plain):
                if v == 20:  # an append: no change file, so no block of 17..24 (audited version by version)
                    t.append(rows([2000 + v]))
                elif v == 30:
                    t.compact()  # changes no row: blocks hold it
                elif v == 41:
                    wide = rows(ids).append_column("note", pa.array(["n"] * len(ids)))
                    t.merge(wide, on="id", merge_schema=True).when_matched_update_all().execute()
                elif v == 50:
                    t.delete(f"id = {ids[0]}")
                else:
                    s = rows(ids, score=float(v))
                    m = t.merge(s, on="id").when_matched_update(set={"score": "source.score"})
                    m.when_not_matched_insert(values={c: f"source.{c}" for c in SCHEMA.names}).execute()
        last = fed.version
        assert last == plain.version == 74
        have = _blocks_of(tmp_path / "fed")
        assert (64, 64) not in have  # version 20 is in it
        assert {(8, 16), (8, 32), (8, 40), (8, 48), (8, 56), (8, 64), (8, 72)} <= have  # 1..8: an append
        assert (8, 8) not in have and (8, 24) not in have and not _blocks_of(tmp_path / "plain")
        for a, b in [(1, last), (2, 2), (9, 16), (10, 30), (33, 72), (35, 74), (60, 70), (17, 24), (0, 9)]:
            assert changes(fed, a, b) == changes(plain, a, b), (a, b)
        (tmp_path / "fed" / "audit" / "changes" / "8" / "v00000040.parquet").unlink()
        with castsql.open(str(tmp_path / "fed")) as again:  # a session that has not seen it
            assert changes(again, 33, 48) == changes(plain, 33, 48)


def test_a_64_version_block_and_gc(tmp_path):
    fed, _ = start(str(tmp_path / "fed"), None, CDF)
    plain, _ = start(str(tmp_path / "plain"), None, None)
    with fed, plain:
        for v in range(2, 131):
            for t in (fed, plain):
                t.update(set={"score": f"{v}"}, where=f"id = {v % 300}")
        have = _blocks_of(tmp_path / "fed")
        assert (64, 128) in have and (64, 64) not in have  # 1..64: version 1 is an append
        for a, b in [(2, 130), (64, 128), (65, 130), (1, 64)]:
            assert changes(fed, a, b) == changes(plain, a, b), (a, b)
        log = TableLog(open_storage(str(tmp_path / "fed")))
        for r in fed.changes(65, 128).select(["_commit_version", "_commit_timestamp"]).to_pylist():
            assert r["_commit_timestamp"] == log.manifest(r["_commit_version"]).created_at
        fed.gc(keep_versions=60, grace=timedelta(0))
        assert {(n, e) for n, e in _blocks_of(tmp_path / "fed") if e < 71} == set()
        assert changes(fed, 72, 130) == changes(plain, 72, 130)
