"""The Iceberg mirror (issue 37): every version of a table, read through
other engines' own Iceberg readers, holds exactly CastSQL's rows.

Readers: DuckDB's ``iceberg_scan`` (its 1.5.5 pip package, with the avro
one), PyIceberg's ``StaticTable`` (its own planner: manifests, sequence
numbers, position deletes) and polars' ``scan_iceberg`` over it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pyarrow as pa
import pytest
from mirror_history import MirrorReaders, race_exporters, random_history, sorted_rows

import castsql
from castsql.engine.duckdb.duck import configure_s3, load_extension
from castsql.errors import MirrorError
from castsql.format import TableLog
from castsql.mirror.iceberg import HINT_KEY, export_iceberg, metadata_key, mirrored_versions, read_metadata
from castsql.storage import open_storage

# polars plans Iceberg scans with PyIceberg without its optional plugin; say so instead of warning each time.
os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")


class Readers(MirrorReaders):
    READERS = ("duckdb", "pyiceberg", "polars")

    def __init__(self, uri: str, s3=None) -> None:
        self.uri = uri
        self.con = duckdb.connect()
        load_extension(self.con, "avro")
        load_extension(self.con, "iceberg")
        self.props: dict[str, str] = {}
        self.options: dict[str, str] | None = None
        if s3 is not None:
            self.options = {
                "aws_endpoint_url": s3.endpoint_url,
                "aws_access_key_id": s3.key,
                "aws_secret_access_key": s3.secret,
                "aws_region": s3.region,
                "aws_allow_http": "true",
            }
            configure_s3(self.con, s3)
            self.props = {
                "s3.endpoint": s3.endpoint_url,
                "s3.access-key-id": s3.key,
                "s3.secret-access-key": s3.secret,
                "s3.region": s3.region,
            }

    def _meta(self, v: int) -> str:
        return f"{self.uri}/{metadata_key(v)}"

    def duckdb(self, v: int) -> list[dict]:
        return sorted_rows(
            self.con.execute(f"SELECT * FROM iceberg_scan('{self._meta(v)}')").arrow().read_all().to_pylist()
        )

    def pyiceberg(self, v: int) -> list[dict]:
        from pyiceberg.table import StaticTable

        return sorted_rows(
            StaticTable.from_metadata(self._meta(v), properties=self.props).scan().to_arrow().to_pylist()
        )

    def polars(self, v: int) -> list[dict]:
        import polars as pl
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(self._meta(v), properties=self.props)
        return sorted_rows(pl.scan_iceberg(table, storage_options=self.options).collect().to_dicts())


@pytest.mark.parametrize("seed", range(1, 5))
def test_every_version_reads_the_same_in_every_iceberg_reader(tmp_path, seed):
    uri = str(tmp_path / "t")
    t, exported = random_history(uri, seed, 16, export=export_iceberg)
    r = export_iceberg(TableLog(open_storage(uri)))
    latest = t.history().column("version").to_pylist()[-1]
    assert r.latest == latest and mirrored_versions(open_storage(uri)) == list(range(latest + 1))
    assert r.written == list(range((exported[-1] + 1) if exported else 0, latest + 1))
    # Version 0 is the empty CREATE: like a new Iceberg table, no snapshot.
    assert "current-snapshot-id" not in read_metadata(open_storage(uri), 0)
    assert Readers(uri).check(t, range(1, latest + 1)) == 3 * latest


V3 = {"castsql.mirror.iceberg.formatVersion": "3"}


def _vectors_per_file(uri: str, v: int) -> list[int]:
    """For each live data file of version ``v``: how many live deletion
    vectors name it, each checked to be a Puffin blob in place. Read with
    DuckDB's Avro reader (PyIceberg 0.12 reads manifests as version 2)."""
    con = duckdb.connect()
    load_extension(con, "avro")
    snap = read_metadata(open_storage(uri), v)["snapshots"][-1]
    listed = con.execute(f"SELECT manifest_path, content FROM read_avro('{snap['manifest-list']}')").fetchall()
    data, named = [], []
    for path, content in listed:
        if content == 0:  # a data manifest (one a version 2 mirror wrote has no version 3 fields)
            data += [
                r[0]
                for r in con.execute(
                    f"SELECT data_file.file_path FROM read_avro('{path}') WHERE status != 2"
                ).fetchall()
            ]
            continue
        rows = con.execute(
            f"SELECT data_file.file_path, data_file.file_format, data_file.referenced_data_file, "
            f"data_file.content_offset, data_file.content_size_in_bytes FROM read_avro('{path}') WHERE status != 2"
        ).fetchall()
        for file_path, fmt, referenced, offset, size in rows:
            assert fmt == "PUFFIN" and offset is not None and size is not None
            with open(file_path.removeprefix("file://"), "rb") as f:
                f.seek(offset)
                assert f.read(8)[4:] == bytes([0xD1, 0xD3, 0x39, 0x64])  # the vector's magic, after its length
            named.append(referenced)
    assert set(named) <= set(data)
    return [named.count(p) for p in data]


@pytest.mark.parametrize(
    ("seed", "properties", "halfway", "fresh"),
    [(2, V3, None, False), (3, V3, None, True), (1, None, V3, True), (4, None, V3, False)],
)
def test_deletion_vectors_read_the_same_in_every_iceberg_reader(tmp_path, seed, properties, halfway, fresh):
    """Format version 3, from the table's creation or set halfway (a version
    2 mirror upgraded): deletes of every kind become one Puffin deletion
    vector per data file, replaced when the file's deletes change. ``fresh``:
    each export is a new process's, reading the mirror back."""
    from castsql.mirror import iceberg

    def export(log):
        if fresh:
            iceberg._HELD.take(log.storage.root)
        return export_iceberg(log)

    uri = str(tmp_path / "t")
    t, exported = random_history(uri, seed, 16, export=export, properties=properties, halfway=halfway)
    assert exported  # so the last export continues a mirror (read back when fresh)
    export_iceberg(TableLog(open_storage(uri)))
    latest = t.history().column("version").to_pylist()[-1]
    assert Readers(uri).check(t, range(1, latest + 1)) == 3 * latest
    st = open_storage(uri)
    metas = [read_metadata(st, v) for v in range(latest + 1)]
    versions = [m["format-version"] for m in metas]
    assert versions == sorted(versions) and versions[-1] == 3 and (versions[0] == 2) == (halfway is not None)
    vectors = 0
    next_row_id = 0
    for v in range(1, latest + 1):
        if versions[v] == 3:
            per_file = _vectors_per_file(uri, v)
            assert max(per_file, default=0) <= 1  # Iceberg's rule: at most one vector per data file
            vectors += sum(per_file)
            snap = metas[v]["snapshots"][-1]
            assert snap["first-row-id"] == next_row_id and metas[v]["next-row-id"] >= next_row_id
            next_row_id = metas[v]["next-row-id"]
    assert vectors > 0
    # What a new process reads back is what the writing one held.
    held = iceberg._HELD.take(uri)
    back = iceberg._read_state(st, latest, iceberg._Files(st))
    for name in ("data", "members", "vectors", "vector_members", "next_row_id", "format_version"):
        assert getattr(back, name) == getattr(held, name), name


def test_an_iceberg_mirror_never_goes_down_a_format_version(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(9), pa.int64())}), primary_key="id", properties=V3)
    t = castsql.open(uri)
    t.delete("id = 1")
    t.set_properties({"castsql.mirror.iceberg.formatVersion": "2"})
    t.delete("id = 2")
    with pytest.raises(castsql.CastSQLError, match=r"'castsql.mirror.iceberg.formatVersion' takes 2 or 3, not '4'"):
        t.set_properties({"castsql.mirror.iceberg.formatVersion": "4"})
    st = open_storage(uri)
    export_iceberg(TableLog(st))
    assert [read_metadata(st, v)["format-version"] for v in range(4)] == [3, 3, 3, 3]
    assert _vectors_per_file(uri, 3) == [1]
    Readers(uri).check(castsql.open(uri), range(1, 4))


@pytest.mark.parametrize("properties", [None, V3])
def test_the_iceberg_mirror_on_s3_reads_the_same(s3_server, s3_root, properties):
    t, _ = random_history(s3_root, 5, 8, s3=s3_server.config, export=export_iceberg, properties=properties)
    export_iceberg(TableLog(open_storage(s3_root, s3=s3_server.config)))
    latest = t.history().column("version").to_pylist()[-1]
    Readers(s3_root, s3_server.config).check(t, range(1, latest + 1))


@pytest.mark.parametrize("properties", [None, V3])
def test_a_restore_that_brings_rows_back_is_mirrored(tmp_path, properties):
    """Position deletes only accumulate; rows a restore brings back need the
    delete files replaced (one file of every dropped position). A deletion
    vector is replaced by one without them."""
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(20), pa.int64())}), primary_key="id", properties=properties)
    t = castsql.open(uri)
    t.delete("id < 5")
    t.delete("id = 10")
    log = TableLog(open_storage(uri))
    log.restore(2)  # id 10 comes back
    export_iceberg(log)
    t = castsql.open(uri)
    assert t.version == 4 and len(t.to_arrow()) == 15
    Readers(uri).check(t, range(1, 5))


@pytest.mark.parametrize("properties", [None, V3])
def test_restores_after_a_compaction_read_the_same_in_every_reader(tmp_path, properties):
    """A restore brings back a file a compaction removed, and rows of files
    whose vectors share one Puffin file. Earlier delete files must leave the
    list: DuckDB applies a position delete file whatever its sequence
    number, and PyIceberg applies every blob of a listed Puffin file."""
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(10), pa.int64())}), primary_key="id", properties=properties)
    t = castsql.open(uri)
    t.append(pa.table({"id": pa.array(range(10, 20), pa.int64())}))  # v2: a second file
    t.delete("id = 0")  # v3
    t.delete("id = 10")  # v4
    t.compact(threshold=0.01)  # v5: both files rewritten, their deletes folded
    log = TableLog(open_storage(uri))
    log.restore(4)  # v6: both files back, their vectors in one Puffin file
    log.restore(3)  # v7: id 10 back, id 0 still deleted
    log.restore(1)  # v8: the first file back without its deletes
    export_iceberg(log)
    t = castsql.open(uri)
    assert [len(t.at(v).to_arrow()) for v in (6, 7, 8)] == [18, 19, 10]
    assert Readers(uri).check(t, range(1, 9)) == 24
    # A file back, none of whose rows the version before had: only the restore tells.
    uri = str(tmp_path / "u")
    castsql.write_table(uri, pa.table({"id": pa.array(range(20), pa.int64())}), primary_key="id", properties=properties)
    t = castsql.open(uri)
    t.delete("id < 5")
    t.compact(threshold=0.01)
    log = TableLog(open_storage(uri))
    log.restore(1)
    export_iceberg(log)
    assert Readers(uri).check(castsql.open(uri), range(1, 5)) == 12


def test_a_process_reading_the_mirror_back_holds_what_its_writer_held(tmp_path):
    """A version that removes files and adds none (a compaction of a file
    whose rows are all deleted) leaves no trace once its manifest leaves the
    list, in the writer's state as in a state read back."""
    from castsql.mirror import iceberg

    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(10), pa.int64())}), primary_key="id", properties=V3)
    t = castsql.open(uri)
    t.delete("id < 3")
    t.delete("true")
    t.compact(threshold=0.01)
    t.append(pa.table({"id": pa.array([99], pa.int64())}))
    st = open_storage(uri)
    export_iceberg(TableLog(st))
    held = iceberg._HELD.take(uri)
    back = iceberg._read_state(st, held.version, iceberg._Files(st))
    for name in ("data", "members", "vectors", "vector_members", "data_manifests", "delete_manifests"):
        assert getattr(back, name) == getattr(held, name), name
    Readers(uri).check(castsql.open(uri), range(1, 6))


def test_a_metadata_file_lists_the_newest_snapshots_and_every_version_reads_by_its_own(tmp_path, monkeypatch):
    """The newest metadata file names the last SNAPSHOTS_LISTED versions (so
    its size does not grow with the history); each version reads through
    its own metadata file, and a listed one by id from the newest."""
    from pyiceberg.table import StaticTable

    from castsql.mirror import iceberg

    monkeypatch.setattr(iceberg, "SNAPSHOTS_LISTED", 3)
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(9), pa.int64())}), primary_key="id")
    t = castsql.open(uri)
    for i in range(5):
        t.delete(f"id = {i}")  # versions 2-6
        if i == 2:
            export_iceberg(TableLog(open_storage(uri)))  # held state carried over the cap
    iceberg._HELD.take(uri)  # and a state read back
    t.append(pa.table({"id": pa.array([100], pa.int64())}))
    export_iceberg(TableLog(open_storage(uri)))
    st = open_storage(uri)
    assert [s["snapshot-id"] for s in read_metadata(st, 7)["snapshots"]] == [5, 6, 7]
    newest = StaticTable.from_metadata(f"{uri}/{metadata_key(7)}")
    assert len(newest.scan(snapshot_id=5).to_arrow()) == 5
    assert Readers(uri).check(castsql.open(uri), range(1, 8)) == 21


def test_the_snapshot_ids_are_the_versions_and_a_hint_names_the_newest(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(5), pa.int64())}), primary_key="id")
    castsql.open(uri).delete("id = 1")
    st = open_storage(uri)
    export_iceberg(TableLog(st))
    meta = read_metadata(st, 2)
    assert meta["current-snapshot-id"] == 2 and [s["snapshot-id"] for s in meta["snapshots"]] == [1, 2]
    assert meta["snapshots"][-1]["summary"]["castsql-operation"] == "DELETE"
    assert st.get(HINT_KEY) == b"2"
    assert meta["properties"]["castsql.primary-key"] == "id"


@pytest.mark.parametrize(("key_type", "identifier"), [(pa.int64(), True), (pa.string(), True), (pa.float64(), False)])
def test_the_primary_key_is_the_iceberg_identifier_field(tmp_path, key_type, identifier):
    """Engines that upsert into Iceberg find the row identity in the schema;
    a floating-point key, which Iceberg forbids as one, is left out."""
    from pyiceberg.table import StaticTable

    uri = str(tmp_path / "t")
    data = pa.table({"v": pa.array(["a", "b", "c"]), "id": pa.array([1, 2, 3]).cast(key_type)})
    castsql.write_table(uri, data, primary_key="id")
    castsql.open(uri).delete("v = 'b'")
    st = open_storage(uri)
    export_iceberg(TableLog(st))
    schema = StaticTable.from_metadata(f"{uri}/{metadata_key(2)}").schema()
    want = [schema.find_field("id").field_id] if identifier else []
    assert list(schema.identifier_field_ids) == want and schema.find_field("id").required == identifier
    assert schema.find_field("v").required is False
    Readers(uri).check(castsql.open(uri), range(1, 3))


def test_a_type_the_mirror_lacks_is_refused_and_nothing_is_written(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array([1], pa.int64()), "n": pa.array([1], pa.uint32())}))
    st = open_storage(uri)
    with pytest.raises(MirrorError, match=r"column n: type uint32 has no Iceberg equivalent"):
        export_iceberg(TableLog(st))
    assert list(st.list("_iceberg/")) == []


def test_racing_exporters_never_both_write_a_version(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(100), pa.int64())}), primary_key="id")
    t = castsql.open(uri)
    for i in range(8):
        t.delete(f"id = {i * 7}")
    outcomes = race_exporters(export_iceberg, uri)
    assert len(outcomes) == 3
    assert all(o == "done" or "another exporter wrote Iceberg version" in o for o in outcomes), outcomes
    export_iceberg(TableLog(open_storage(uri)))
    assert mirrored_versions(open_storage(uri)) == list(range(10))
    Readers(uri).check(castsql.open(uri), [9, 4])


def test_metadata_it_cannot_continue_from_is_refused_naming_the_file(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(5), pa.int64())}), primary_key="id")
    st = open_storage(uri)
    st.put_if_absent(metadata_key(0), b"{}")  # not written by the mirror
    with pytest.raises(MirrorError, match=r"v0.metadata.json: not Iceberg metadata this mirror can continue from"):
        export_iceberg(TableLog(st))
    assert mirrored_versions(st) == [0]


def test_the_property_keeps_both_mirrors_in_step(tmp_path):
    uri = str(tmp_path / "t")
    props = {"castsql.mirror.iceberg": "true", "castsql.mirror.delta": "true"}
    castsql.write_table(uri, pa.table({"id": pa.array(range(10), pa.int64())}), primary_key="id", properties=props)
    t = castsql.open(uri)
    t.delete("id > 6")
    t.append(pa.table({"id": pa.array([50], pa.int64())}))
    st = open_storage(uri)
    assert mirrored_versions(st) == [0, 1, 2, 3]
    from castsql.mirror.delta import mirrored_versions as delta_versions

    assert delta_versions(st) == [0, 1, 2, 3]
    Readers(uri).check(t, range(1, 4))


def test_a_process_continues_from_what_it_holds_only_while_that_is_what_is_stored(tmp_path):
    """A process that wrote the mirror's last version continues from its own
    state (no listing, no reading back); a version another exporter wrote
    since, or a mirror deleted and written again, makes it read the mirror
    as stored instead."""
    import shutil

    from castsql.mirror import iceberg

    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(20), pa.int64())}), primary_key="id")
    t = castsql.open(uri)
    log = TableLog(open_storage(uri))
    export_iceberg(log)  # versions 0-1; this process holds version 1
    t.delete("id < 3")
    mine = iceberg._HELD.take(uri)  # another process exports version 2 ...
    export_iceberg(TableLog(open_storage(uri)))
    iceberg._HELD.put(uri, mine)  # ... while this one still holds version 1
    t.delete("id = 10")
    assert export_iceberg(log).written == [3]
    shutil.rmtree(tmp_path / "t" / "_iceberg")  # deleted, and written again by someone else
    iceberg._HELD.take(uri)
    export_iceberg(TableLog(open_storage(uri)))
    iceberg._HELD.put(uri, mine)  # a stale state whose version 1 differs from what is stored now
    t.append(pa.table({"id": pa.array([99], pa.int64())}))
    assert export_iceberg(log).written == [4]
    assert mirrored_versions(open_storage(uri)) == [0, 1, 2, 3, 4]
    Readers(uri).check(t, range(1, 5))


def test_the_command_line_writes_both_mirrors(tmp_path):
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(5), pa.int64())}), primary_key="id")
    castsql.open(uri).delete("id = 4")
    cmd = [sys.executable, "-m", "castsql.cli", "export", uri]
    out = subprocess.run([*cmd, "--iceberg", "--delta"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"export: Delta log of {uri} now at version 2")
    assert lines[1].startswith(f"export: Iceberg metadata of {uri} now at version 2 (wrote version(s) 0-2")
    assert "1 delete file(s)" in lines[1]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "give --delta, --iceberg or both" in out.stderr


def test_after_gc_the_iceberg_mirror_continues_without_the_collected_snapshots(tmp_path):
    """The next metadata file after a gc lists no snapshot of a version gc
    collected (their data files may be gone), in the process that wrote the
    mirror as in a fresh one; so a long-lived table's mirror versions cost
    what the table keeps, not its history."""
    from datetime import timedelta

    from castsql.write.garbage import gc

    uri = str(tmp_path / "t")
    data = pa.table({"id": pa.array(range(10), pa.int64())})
    castsql.write_table(uri, data, primary_key="id", properties={"castsql.mirror.iceberg": "true"})
    castsql.open(uri).delete("id = 1")
    castsql.open(uri).delete("id = 2")
    st = open_storage(uri)
    assert [s["snapshot-id"] for s in read_metadata(st, 3)["snapshots"]] == [1, 2, 3]
    gc(uri, keep_versions=1, grace=timedelta(0))
    earliest = TableLog(st).earliest_version()
    assert earliest > 1
    t = castsql.open(uri)
    t.delete("id = 5")
    assert mirrored_versions(st) == [0, 1, 2, 3, 4]
    meta = read_metadata(st, 4)
    assert [s["snapshot-id"] for s in meta["snapshots"]] == list(range(earliest, 5))
    assert meta["current-snapshot-id"] == 4
    Readers(uri).check(t, [4])
    for snap in meta["snapshots"]:  # every listed snapshot reads, by id, in PyIceberg
        from pyiceberg.table import StaticTable

        rows = StaticTable.from_metadata(f"{uri}/{metadata_key(4)}").scan(snapshot_id=snap["snapshot-id"]).to_arrow()
        assert rows.num_rows == t.at(snap["snapshot-id"]).to_arrow().num_rows


def test_the_mirrors_avro_files_read_back_through_pyiceberg_as_written(tmp_path):
    """The manifests and manifest lists CastSQL encodes itself: PyIceberg's
    Avro readers give back every field, with Iceberg's sequence number
    inheritance (an ADDED entry takes its manifest's, which the first list
    holding it assigns), large and negative numbers, and non-ASCII paths."""
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus, read_manifest_list

    from castsql.mirror import iceberg_avro as avro

    io = PyArrowFileIO()
    schema = b'{"type":"struct","fields":[{"id":1,"name":"id","type":"long","required":true}],"schema-id":0}'
    entries = [
        avro.Entry(avro.ADDED, 7, None, None, avro.DATA, f"{tmp_path}/données/a.parquet", 2**40 + 1, 123),
        avro.Entry(avro.EXISTING, 3, 3, 2, avro.DATA, f"{tmp_path}/b.parquet", 0, 2**62),
        avro.Entry(avro.DELETED, 7, 5, 5, avro.DATA, f"{tmp_path}/c.parquet", 9, 1),
    ]
    body = avro.manifest(schema, "data", entries)
    (tmp_path / "m.avro").write_bytes(body)
    deletes = [avro.Entry(avro.ADDED, 7, None, None, avro.POSITION_DELETES, f"{tmp_path}/d.parquet", 4, 99)]
    dbody = avro.manifest(schema, "deletes", deletes)
    (tmp_path / "d.avro").write_bytes(dbody)
    files = [
        avro.manifest_file_of(f"{tmp_path}/m.avro", len(body), avro.CONTENT_DATA, 7, entries),
        avro.manifest_file_of(f"{tmp_path}/d.avro", len(dbody), avro.CONTENT_DELETES, 7, deletes),
    ]
    (tmp_path / "l.avro").write_bytes(avro.manifest_list(7, 6, 7, files))
    got = list(read_manifest_list(io.new_input(f"{tmp_path}/l.avro")))
    assert [(m.manifest_path, m.manifest_length, m.content) for m in got] == [
        (f"{tmp_path}/m.avro", len(body), ManifestContent.DATA),
        (f"{tmp_path}/d.avro", len(dbody), ManifestContent.DELETES),
    ]
    m = got[0]
    assert (m.sequence_number, m.min_sequence_number, m.added_snapshot_id) == (7, 3, 7)
    assert (m.added_files_count, m.existing_files_count, m.deleted_files_count) == (1, 1, 1)
    assert (m.added_rows_count, m.existing_rows_count, m.deleted_rows_count) == (2**40 + 1, 0, 9)
    rows = [
        (e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number, e.data_file.file_path,
         e.data_file.record_count, e.data_file.file_size_in_bytes)
        for e in m.fetch_manifest_entry(io, discard_deleted=False)
    ]  # fmt: skip
    assert rows == [
        (ManifestEntryStatus.ADDED, 7, 7, 7, f"{tmp_path}/données/a.parquet", 2**40 + 1, 123),
        (ManifestEntryStatus.EXISTING, 3, 3, 2, f"{tmp_path}/b.parquet", 0, 2**62),
        (ManifestEntryStatus.DELETED, 7, 5, 5, f"{tmp_path}/c.parquet", 9, 1),
    ]
    (d,) = got[1].fetch_manifest_entry(io)
    assert (d.data_file.content, d.data_file.record_count, d.sequence_number) == (1, 4, 7)
    assert avro._long(-1) == b"\x01" and avro._long(-(2**63)) == b"\xff" * 9 + b"\x01"


def _manifest_paths(st, v: int) -> list[str]:
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import ManifestContent, read_manifest_list

    snap = next(s for s in read_metadata(st, v)["snapshots"] if s["snapshot-id"] == v)
    return [
        m.manifest_path
        for m in read_manifest_list(PyArrowFileIO().new_input(snap["manifest-list"]))
        if m.content == ManifestContent.DATA
    ]


def test_removing_files_rewrites_only_the_manifests_that_list_them(tmp_path):
    """A compaction of a few files of a large table costs those files: the
    manifests of the other files are carried over as they are."""
    from castsql.format.change import Change

    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array(range(10), pa.int64())}), primary_key="id")
    t = castsql.open(uri)
    for i in range(1, 4):
        t.append(pa.table({"id": pa.array(range(10 * i, 10 * i + 10), pa.int64())}))  # v2-v4: a manifest each
    st = open_storage(uri)
    log = TableLog(st)
    export_iceberg(log)
    before = _manifest_paths(st, 4)
    assert len(before) == 4
    m = log.latest()
    victim = m.change.added_files[0]  # version 4's file: in the last manifest only
    log.commit(
        Change("COMPACT", remove_files=(victim.path,), add_files=(), schema=m.schema, read_version=m.version)
    )  # v5 drops its rows (a removal, as gc of a compaction's inputs would leave)
    export_iceberg(log)
    after = _manifest_paths(st, 5)
    assert after[:3] == before[:3]  # untouched
    assert before[3] not in after and len(after) == 4  # its manifest left; the version's removal is the new one
    t = castsql.open(uri)
    Readers(uri).check(t, [4, 5])


def test_small_manifests_are_merged_past_a_count(tmp_path, monkeypatch):
    """As Iceberg's writers merge manifests: a stream of one-file appends
    does not make every reader open one manifest per append."""
    from castsql.mirror import iceberg

    monkeypatch.setattr(iceberg, "MANIFESTS_MERGED_AT", 3)
    uri = str(tmp_path / "t")
    castsql.write_table(uri, pa.table({"id": pa.array([0], pa.int64())}), primary_key="id",
                        properties={"castsql.mirror.iceberg": "true"})  # fmt: skip
    t = castsql.open(uri)
    for i in range(1, 8):
        t.append(pa.table({"id": pa.array([i], pa.int64())}))
        if i % 3 == 0:
            t.delete(f"id = {i - 1}")
    st = open_storage(uri)
    latest = t.at().version
    assert all(len(_manifest_paths(st, v)) <= 3 for v in range(1, latest + 1))
    Readers(uri).check(t.at(), range(1, latest + 1))


def test_the_deletion_vectors_of_several_files_in_one_version_read_exactly_in_every_reader(tmp_path):
    """One version drops rows of three data files, one of them 200,000 rows
    (two row groups): each vector is a Puffin file of its own, and every
    reader drops each file's rows, not another's (DuckDB 1.5.5 applied the
    big file's vector to the other two when one Puffin file held all three)."""
    uri = str(tmp_path / "t")
    props = {"castsql.mirror.iceberg": "true", **V3}
    castsql.write_table(uri, pa.table({"id": pa.array(range(200_000), pa.int64())}), primary_key="id", properties=props)
    t = castsql.open(uri)
    for lo in (300_000, 400_000):
        src = pa.table({"id": pa.array(range(lo, lo + 5000), pa.int64())})
        t.merge(src, on="id").when_not_matched_insert_all().execute()
    t.delete("id % 7 = 0")
    v = t.history().to_pylist()[-1]["version"]
    assert sorted(_vectors_per_file(uri, v)) == [1, 1, 1]
    assert len(list((tmp_path / "t" / "_iceberg" / "metadata").glob("*-deletes.puffin"))) == 3
    assert Readers(uri).check(t, [v]) == 3
