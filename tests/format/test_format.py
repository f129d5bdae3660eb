"""Parsing and validating the objects of the format: pointer, manifest, tombstones."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest
from pyroaring import BitMap

from castsql.errors import FormatError
from castsql.format.layout import manifest_key, manifest_version, to_table_key
from castsql.format.manifest import parse_manifest
from castsql.format.metadata import parse_pointer
from castsql.format.schema import Schema, type_from_name
from castsql.format.tombstone import (
    KeyRangeDelete,
    PositionDelete,
    RowGroupDelete,
    parse_tombstones,
    serialize_tombstones,
)

# The seed's example manifest, field for field.
SEED_MANIFEST = {
    "version": 123,
    "previous": 122,
    "created_at": "2025-10-04T13:45:12Z",
    "schema": {
        "columns": [
            {"name": "id", "type": "int64"},
            {"name": "event_time", "type": "timestamp[us]"},
            {"name": "payload", "type": "binary"},
        ]
    },
    "data_files": [
        {
            "path": "s3://mytable/data/2025/10/04/13/f81d4fae.parquet",
            "size_bytes": 268435456,
            "row_group_count": 60,
            "total_rows": 12000000,
            "min": {"event_time": "2025-10-04T13:00:00Z", "id": 1000000},
            "max": {"event_time": "2025-10-04T13:30:00Z", "id": 12999999},
        }
    ],
    "tombstones": ["s3://mytable/tombstone/2025/10/04/13/abc123.del"],
}

SEED_TOMBSTONE = b"""{"file": "f81d4fae.parquet", "row_group": 0}
{"file": "f81d4fae.parquet", "row_group": 5}
{"file": "a1b2c3d4.parquet", "pk_min": 15000000, "pk_max": 15999999}
{ "file": "f81d4fae.parquet", "row_group": 3, "deleted_rows": [0, 5, 17, 1042] }
"""


def test_seed_manifest_reads():
    m = parse_manifest(json.dumps(SEED_MANIFEST).encode(), "v123")
    assert m.version == 123 and m.previous == 122
    assert m.schema.names == ["id", "event_time", "payload"]
    assert m.data_files[0].total_rows == 12_000_000
    assert m.data_files[0].row_group_rows is None
    assert m.primary_key is None
    assert m.tombstones == ("s3://mytable/tombstone/2025/10/04/13/abc123.del",)
    assert m.schema.to_arrow().field("event_time").type == pa.timestamp("us")


def test_manifest_round_trips_and_keeps_unknown_fields():
    doc = dict(SEED_MANIFEST, future_field={"x": 1})
    m = parse_manifest(json.dumps(doc).encode(), "v123")
    again = parse_manifest(m.to_bytes(), "again")
    assert again == m
    assert json.loads(m.to_bytes())["future_field"] == {"x": 1}


def test_seed_tombstone_lines_read():
    recs = parse_tombstones(SEED_TOMBSTONE, "abc123.del")
    assert recs[0] == RowGroupDelete("f81d4fae.parquet", 0)
    assert recs[1] == RowGroupDelete("f81d4fae.parquet", 5)
    assert recs[2] == KeyRangeDelete("a1b2c3d4.parquet", 15000000, 15999999)
    assert isinstance(recs[3], PositionDelete)
    assert recs[3].row_group == 3 and list(recs[3].positions) == [0, 5, 17, 1042]


def test_roaring_bitmap_tombstone_round_trip():
    bm = BitMap(range(0, 1_000_000, 7))
    data = serialize_tombstones([PositionDelete("x.parquet", None, bm), PositionDelete("y.parquet", 2, BitMap([1]))])
    lines = [json.loads(line) for line in data.splitlines()]
    assert "deleted_rows_bitmap" in lines[0] and lines[1]["deleted_rows"] == [1]
    recs = parse_tombstones(data, "t.del")
    assert recs[0].positions == bm and recs[0].row_group is None
    assert recs[1].row_group == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"file": "a.parquet", "wat": 1}', "unknown tombstone kind"),
        (b'{"row_group": 1}', "no 'file'"),
        (b'{"file": "a.parquet", "row_group": -1}', "non-negative"),
        (b'{"file": "a.parquet", "deleted_rows": [1, "x"]}', "deleted_rows"),
        (b'{"file": "a.parquet", "deleted_rows_bitmap": "%%%"}', "base64 roaring"),
        (b'{"file": "a.parquet", "pk_min": 1, "pk_max": "z"}', "pk_min"),
        (b"not json", "line 1 is not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_tombstone_lines_are_named(line, message):
    with pytest.raises(FormatError, match=message) as e:
        parse_tombstones(line, "tomb/x.del")
    assert "tomb/x.del" in str(e.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("version"), "no 'version'"),
        (lambda d: d.update(version=-1), "'version' must be"),
        (lambda d: d.update(version=2**63), r"'version' must be an integer from 0 to 2\^63-1"),
        (lambda d: d.update(previous=123), "'previous' must be"),
        (lambda d: d.update(created_at="yesterday"), "created_at"),
        (lambda d: d["data_files"][0].update(total_rows="many"), "total_rows"),
        (lambda d: d["data_files"].append(dict(d["data_files"][0])), "listed twice"),
        (lambda d: d["schema"]["columns"][0].update(type="int128"), "unknown column type"),
        (lambda d: d.update(primary_key="nope"), "primary_key"),
        (lambda d: d.update(tombstones="x"), "tombstones"),
        (lambda d: d.update(format_version=99), "newer than"),
        (lambda d: d["data_files"][0].update(row_group_rows=[1, 2]), "row_group_rows"),
        (lambda d: d["schema"]["columns"].append(dict(d["schema"]["columns"][0])), "names columns .* twice"),
        (
            lambda d: d["schema"]["columns"].append(
                {"name": d["schema"]["columns"][0]["name"].upper(), "type": "int64"}
            ),
            "differ only in case",
        ),
    ],
)
def test_bad_manifests_are_named(mutate, message):
    doc = json.loads(json.dumps(SEED_MANIFEST))
    mutate(doc)
    with pytest.raises(FormatError, match=message) as e:
        parse_manifest(json.dumps(doc).encode(), "manifest/v00000123.json")
    assert "manifest/v00000123.json" in str(e.value)


@pytest.mark.parametrize("data", [b"", b"{", b'{"version": 1', b"\xff\xfe", b"[]"])
def test_truncated_or_corrupt_manifest_is_named(data):
    with pytest.raises(FormatError, match=r"manifest/v00000001\.json"):
        parse_manifest(data, "manifest/v00000001.json")


@pytest.mark.parametrize(
    "data", [b"", b"{}", b'{"version": "3"}', b'{"version": -2}', b"garbage", b'{"version": 9223372036854775808}']
)
def test_bad_pointer_is_named(data):
    with pytest.raises(FormatError, match="_latest_manifest"):
        parse_pointer(data, "_latest_manifest")


def test_pointer_with_only_version_reads():
    assert parse_pointer(b'{"version": 123}', "_latest_manifest") == 123


def test_manifest_keys():
    assert manifest_key(123) == "manifest/v00000123.json"
    assert manifest_version("manifest/v00000123.json") == 123
    assert manifest_version(manifest_key(123_456_789)) == 123_456_789
    assert manifest_version("manifest/v1.json") is None


@pytest.mark.parametrize(
    ("path", "root", "key"),
    [
        ("data/a.parquet", "s3://b/t", "data/a.parquet"),
        ("s3://b/t/data/a.parquet", "s3://b/t", "data/a.parquet"),
        ("s3://b/t/data/a.parquet", "s3a://b/t/", "data/a.parquet"),
        ("/w/t/data/a.parquet", "/w/t", "data/a.parquet"),
    ],
)
def test_paths_inside_the_root(path, root, key):
    assert to_table_key(path, root, what="data file") == key


@pytest.mark.parametrize(
    "path",
    ["s3://other/t/data/a.parquet", "s3://b/t2/data/a.parquet", "../t2/a.parquet", "/etc/passwd", "data/../../x"],
)
def test_paths_outside_the_root_are_refused(path):
    with pytest.raises(FormatError, match="outside the table root"):
        to_table_key(path, "s3://b/t", what="data file")


def test_schema_types_round_trip():
    schema = pa.schema(
        [
            ("a", pa.int64()),
            ("b", pa.large_string()),
            ("c", pa.timestamp("ns", tz="Europe/Paris")),
            ("d", pa.decimal128(10, 2)),
            ("e", pa.date32()),
            ("f", pa.bool_()),
        ]
    )
    s = Schema.from_arrow(schema)
    assert [c.type for c in s.columns] == [
        "int64",
        "string",
        "timestamp[us, tz=UTC]",
        "decimal128(10, 2)",
        "date32[day]",
        "bool",
    ]
    assert Schema.from_json(s.to_json(), "x") == s
    assert type_from_name("timestamp[us]") == pa.timestamp("us")


def test_bitmap_encoding_is_portable():
    # The serialized form is CRoaring's portable format: what Java/Go roaring read.
    bm = BitMap([1, 2, 3])
    raw = base64.b64decode(base64.b64encode(bm.serialize()))
    assert BitMap.deserialize(raw) == bm


def test_a_base_name_shared_by_two_data_files_is_refused_not_guessed(tmp_path):
    import dataclasses

    from castsql.format import PositionDelete, TableLog, write_data_files
    from castsql.snapshot import resolve
    from castsql.storage import open_storage

    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, pa.schema([("id", pa.int64())]))
    [f] = write_data_files(st, pa.table({"id": pa.array([1, 2], pa.int64())}))
    name = f.path.rsplit("/", 1)[1]
    twin = dataclasses.replace(f, path=f"data/elsewhere/{name}")  # e.g. copied by another tool
    st.put(twin.path, st.get(f.path))
    log.append([f, twin])
    with pytest.raises(FormatError, match=f"tombstone names '{name}', which matches several data files"):
        log.delete([PositionDelete(name, None, BitMap([0]))])
    assert log.latest_version() == 1
    # The full path is not ambiguous.
    log.delete([PositionDelete(twin.path, None, BitMap([0]))])
    assert resolve(log).live_rows == 3


# ---------------------------------------------------------------- hostile objects (issue 11)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"version": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
        ('{"version": 1}'.encode("utf-16"), "is not UTF-8 text"),
        (b'{"version": NaN}', "NaN is not a JSON number"),
        (b'{"version": Infinity}', "Infinity is not a JSON number"),
    ],
)
def test_hostile_json_is_one_error_naming_the_object(data, message):
    for parse in (lambda d: parse_pointer(d, "t/_latest_manifest"), lambda d: parse_manifest(d, "t/m.json")):
        with pytest.raises(FormatError, match=message) as e:
            parse(data)
        assert str(e.value).startswith("t/") and "\n" not in str(e.value)
    with pytest.raises(FormatError, match=message):
        parse_tombstones(data.replace(b"\n", b" "), "t/x.del")


def test_a_manifest_holding_another_version_says_so_first():
    doc = dict(SEED_MANIFEST, version=9, previous=8)
    with pytest.raises(FormatError, match="holds version 9, but its key names version 3"):
        parse_manifest(json.dumps(doc).encode(), "t/v3.json", expected_version=3)


@pytest.mark.parametrize(
    "path",
    [
        "data/x.parquet?s3_endpoint=127.0.0.1:39999&s3_use_ssl=false",
        "data/x.parquet#frag",
        "data/**",
        "data/*.parquet",
        "data/[ab].parquet",
        "data/{a,b}.parquet",
        "data/x\x00.parquet",
        "data/x\n.parquet",
        "data\\x.parquet",
    ],
)
def test_object_keys_must_be_plain(path):
    doc = json.loads(json.dumps(SEED_MANIFEST))
    doc["data_files"][0]["path"] = path
    with pytest.raises(FormatError, match="is not a plain object key") as e:
        parse_manifest(json.dumps(doc).encode(), "t/m.json")
    assert str(e.value).startswith("t/m.json: data file")
    doc = json.loads(json.dumps(SEED_MANIFEST))
    doc["tombstones"] = [path]
    with pytest.raises(FormatError, match=r"t/m\.json: tombstone .* is not a plain object key"):
        parse_manifest(json.dumps(doc).encode(), "t/m.json")
    line = json.dumps({"file": path, "row_group": 0}).encode()
    with pytest.raises(FormatError, match=r"t/x.del: line 1: 'file' .* is not a plain object key"):
        parse_tombstones(line, "t/x.del")


def test_a_key_range_of_the_wrong_type_names_the_tombstone(tmp_path):
    import pyarrow as pa

    from castsql.engine import Session
    from castsql.format import TableLog, write_data_files
    from castsql.format.tombstone import serialize_tombstones
    from castsql.storage import open_storage

    st = open_storage(str(tmp_path / "t"))
    log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
    f = log.append(write_data_files(st, pa.table({"id": [1, 2, 3]}))).data_files[0]
    bad = KeyRangeDelete(f.name, "a", "b")
    with pytest.raises(FormatError, match=r"key range \['a', 'b'\] does not fit primary key 'id' \(int64\)"):
        log.delete([bad])
    # Written by another writer, past that check: readers name the tombstone.
    st.put_new("tombstone/x.del", serialize_tombstones([bad]))
    m = json.loads(st.get(manifest_key(1)))
    m.update(version=2, previous=1)
    m["deletes"]["inline"] = ["tombstone/x.del"]
    m["change"] = {"added_tombstones": ["tombstone/x.del"]}
    m["totals"]["tombstones"] = 1
    st.put_if_absent(manifest_key(2), json.dumps(m).encode())
    with Session(st.root) as s, pytest.raises(FormatError, match=r"x\.del \(version 2\): record 0: key range"):
        s.sql("SELECT * FROM t")
    assert log.latest_version() == 2
