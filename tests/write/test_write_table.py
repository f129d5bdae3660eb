"""The front door for writing without Spark: ``castsql.write_table`` creates a
table from Arrow, pandas or polars, or appends to, overwrites or leaves one
that exists; ``castsql append`` does the same in-process by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

import castsql
from castsql.errors import CastSQLError, DuplicateKey, TableExists
from castsql.format import TableLog
from castsql.storage import open_storage


def rows(ids, tag: str = "a") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids]})


def live(uri: str, s3=None, version: int | None = None) -> list[tuple]:
    with castsql.open(uri, s3=s3, version=version) as t:
        return sorted((r["id"], r["v"]) for r in t.to_arrow().to_pylist())


def test_every_mode_on_a_new_and_an_existing_table(storage_root, s3_config):
    uri = storage_root + "/events"
    m = castsql.write_table(uri, rows(range(3)), primary_key="id", s3=s3_config)
    assert (m.version, m.operation, m.primary_key) == (1, "APPEND", "id")
    with pytest.raises(TableExists, match=r"a table exists there \(version 1\); mode=.append. adds rows"):
        castsql.write_table(uri, rows([7]), s3=s3_config)
    assert castsql.write_table(uri, rows([7]), mode="ignore", s3=s3_config) is None
    assert castsql.write_table(uri, rows([3, 4]), mode="append", s3=s3_config).version == 2
    m = castsql.write_table(uri, rows([10], "z"), mode="overwrite", s3=s3_config)
    assert (m.version, m.operation) == (3, "OVERWRITE")
    assert live(uri, s3_config) == [(10, "z10")]
    assert live(uri, s3_config, version=2) == [(i, f"a{i}") for i in range(5)]  # time travel keeps the old rows
    assert TableLog(open_storage(uri, s3=s3_config)).latest().version == 3


def test_keys_and_schemas_are_checked_and_nothing_is_committed(tmp_path):
    uri = str(tmp_path / "events")
    castsql.write_table(uri, rows(range(3)), primary_key="id")
    with pytest.raises(DuplicateKey, match="already in the table"):
        castsql.write_table(uri, rows([2]), mode="append")
    with pytest.raises(DuplicateKey, match="overwrite: the data holds key id = 9 more than once"):
        castsql.write_table(uri, rows([9, 9]), mode="overwrite")
    with pytest.raises(CastSQLError, match="the table's primary key is 'id', not 'v'"):
        castsql.write_table(uri, rows([5]), mode="append", primary_key="v")
    with pytest.raises(CastSQLError, match="mode must be one of error, append, overwrite, ignore, not 'upsert'"):
        castsql.write_table(uri, rows([5]), mode="upsert")
    with pytest.raises(CastSQLError, match="extra"):
        castsql.write_table(uri, rows([5]).append_column("extra", pa.array([1])), mode="append")
    assert TableLog(open_storage(uri)).latest().version == 1 and live(uri) == [(i, f"a{i}") for i in range(3)]
    m = castsql.write_table(uri, rows([5]).append_column("extra", pa.array([1])), mode="append", merge_schema=True)
    assert m.schema.names == ["id", "v", "extra"]


def test_pandas_and_polars_create_tables_too(tmp_path):
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    castsql.write_table(str(tmp_path / "a"), pd.DataFrame({"id": [1, 2], "v": ["x", "y"]}), primary_key="id")
    castsql.write_table(str(tmp_path / "b"), pl.DataFrame({"id": [1, 2], "v": ["x", "y"]}))
    assert live(str(tmp_path / "a")) == live(str(tmp_path / "b")) == [(1, "x"), (2, "y")]
    with castsql.connect(str(tmp_path)) as s:
        assert sorted(s.tables) == ["a", "b"]


def test_half_floats_are_stored_as_single_floats(tmp_path):
    # Arrow has no min_max for float16: writing one used to fail with Arrow's own error.
    uri = str(tmp_path / "h")
    castsql.write_table(uri, pa.table({"x": pa.array([1.5, None], pa.float16())}))
    with castsql.open(uri) as t:
        t.append(pa.table({"x": pa.array([2.5], pa.float16())}))
        assert t.schema.field("x").type == pa.float32()
        assert t.to_arrow(filter="x > 2").column("x").to_pylist() == [2.5]


def test_the_cli_appends_without_spark(tmp_path):
    """``castsql append`` creates and appends in this process: with a pyspark
    that cannot be imported on the path, it still works."""
    fake = tmp_path / "fake"
    (fake / "pyspark").mkdir(parents=True)
    (fake / "pyspark" / "__init__.py").write_text("raise ImportError('append must not import pyspark')\n")
    pq.write_table(rows(range(3)), tmp_path / "in.parquet")
    (tmp_path / "more.csv").write_text("id,v\n3,c3\n4,c4\n")
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{Path(castsql.__file__).parents[1]}"}
    uri = str(tmp_path / "t")

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "castsql.cli", "append", uri, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    r = cli("--from", str(tmp_path / "in.parquet"), "--primary-key", "id")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("append: committed version 1; 1 file(s), 3 row(s)")
    r = cli("--from", str(tmp_path / "more.csv"))
    assert r.returncode == 0 and r.stdout.startswith("append: committed version 2"), r.stderr
    r = cli("--from", str(tmp_path / "more.csv"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "already in the table" in r.stderr
    assert live(uri) == [(0, "a0"), (1, "a1"), (2, "a2"), (3, "c3"), (4, "c4")]


def test_a_table_deleted_and_made_again_in_one_process_is_the_new_table(tmp_path):
    """A process that read a table, whose directory was then removed and a new
    table made there (a notebook starting over), reads and writes the new
    table: the versions it cached belong to the old one. The old table read
    versions 0-5 with deletes; the new one reaches the same numbers with others."""
    import shutil

    uri = str(tmp_path / "t")
    castsql.write_table(uri, rows(range(10)), primary_key="id")
    with castsql.open(uri) as t:
        t.append(rows(range(10, 20)))
        t.delete("id < 3")
        t.append(rows(range(20, 25)))
        t.delete("id = 22")
        assert len(live(uri)) == 21
    shutil.rmtree(uri)
    castsql.write_table(uri, rows(range(100, 103), "b"), primary_key="id")
    with castsql.open(uri) as t:
        t.append(rows(range(103, 105), "b"))
        t.delete("id = 100")
        t.append(rows(range(105, 106), "b"))
        t.delete("id = 104")
        t.append(rows(range(106, 107), "b"))
    assert live(uri) == [(i, f"b{i}") for i in (101, 102, 103, 105, 106)]
    assert live(uri, version=3) == [(i, f"b{i}") for i in (101, 102, 103, 104)]
    assert TableLog(open_storage(uri)).latest().version == 6


@pytest.mark.parametrize(
    ("data", "options", "message"),
    [
        (pa.table({"id": [0.0, -0.0]}), {"primary_key": "id"}, "the data holds key id = 0.0 more than once"),
        (pa.table({"id": [1, None]}), {"primary_key": "id"}, "NULL primary key"),
        (
            pa.table({"id": [1], "t": pa.array([1], pa.timestamp("ns"))}),
            {},
            r"column 't' cannot be stored as timestamp\[us\]",
        ),
        (pa.table({"id": [1]}), {"properties": {"castsql.nope": "1"}}, "unknown property"),
        (pa.table({"id": [[1]]}), {"primary_key": "id"}, "unsupported column type"),
    ],
    ids=["-0.0 and 0.0", "NULL key", "lossy nanoseconds", "unknown property", "list key"],
)
def test_a_refused_first_write_leaves_no_table_and_its_retry_creates_it(tmp_path, data, options, message):
    """Issue 54: write_table created version 0, then its first write was
    refused (DuplicateKey for 0.0 and -0.0, which SQL finds equal), leaving an
    empty table, and the corrected call failed with TableExists. The first
    write is checked whole before the table is created."""
    uri = tmp_path / "t"
    with pytest.raises(CastSQLError, match=message) as e:
        castsql.write_table(str(uri), data, **options)
    assert "\n" not in str(e.value)
    assert not uri.exists() or sorted(p for p in uri.rglob("*") if p.is_file()) == []
    m = castsql.write_table(str(uri), pa.table({"id": [0.0, 1.0]}), primary_key="id")
    assert (m.version, m.primary_key, m.summary["added_rows"]) == (1, "id", 2)


def test_the_cli_leaves_no_table_when_its_first_append_is_refused(tmp_path):
    pq.write_table(pa.table({"id": [0.0, -0.0]}), tmp_path / "bad.parquet")
    pq.write_table(pa.table({"id": [0.0, 1.0]}), tmp_path / "good.parquet")
    uri = str(tmp_path / "t")

    def cli(src: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "castsql.cli", "append", uri, "--from", src, "--primary-key", "id"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    r = cli(str(tmp_path / "bad.parquet"))
    assert r.returncode == 1 and "more than once" in r.stderr and not os.path.exists(uri + "/_latest_manifest")
    r = cli(str(tmp_path / "good.parquet"))
    assert r.returncode == 0 and r.stdout.startswith("append: committed version 1"), r.stderr


def test_the_cli_creates_a_table_with_its_properties_in_version_0(tmp_path, capsys):
    """Issue 54: `castsql append NEW` could not create a configured table (no
    --set-property), so the properties took a second version and the first
    write ran without them (no mirror of it, no compaction). They are now
    version 0's; a repeat of the command with the same properties runs, other
    values (or a malformed property) are refused and change nothing."""
    from castsql.cli import main

    pq.write_table(rows(range(3)), tmp_path / "in.parquet")
    pq.write_table(rows([3]), tmp_path / "more.parquet")
    uri = str(tmp_path / "t")
    props = ["--set-property", "castsql.mirror.delta=true", "--set-property", "owner = ops"]
    assert main(["append", uri, "--from", str(tmp_path / "in.parquet"), "--primary-key", "id", *props]) == 0
    log = TableLog(open_storage(uri))
    assert [m.operation for m in log.history()] == ["CREATE", "APPEND"]
    assert log.manifest(0).properties == {"castsql.mirror.delta": "true", "owner": "ops"}
    assert sorted(p.name for p in (tmp_path / "t" / "_delta_log").glob("*.json")) == [
        "00000000000000000000.json",
        "00000000000000000001.json",
    ]  # the first write was mirrored: the table had the property when it committed
    assert main(["append", uri, "--from", str(tmp_path / "more.parquet"), *props]) == 0  # the same: runs
    capsys.readouterr()
    for bad, message in [
        (["--set-property", "owner=data"], "its property 'owner' is 'ops', not 'data'"),
        (["--set-property", "castsql.autoCompact=maybe"], "property 'castsql.autoCompact' takes true or false"),
        (["--set-property", "owner"], "--set-property 'owner': give NAME=VALUE"),
    ]:
        assert main(["append", uri, "--from", str(tmp_path / "more.parquet"), *bad]) in (1, 2)
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert log.latest().version == 2
    new = str(tmp_path / "new")
    assert main(["append", new, "--from", str(tmp_path / "in.parquet"), "--set-property", "castsql.nope=1"]) == 1
    assert "unknown property 'castsql.nope'" in capsys.readouterr().err and not os.path.exists(new)
    with pytest.raises(CastSQLError, match="its property 'owner' is 'ops', not None"):
        castsql.write_table(uri, rows([9]), mode="append", properties={"owner": None})


def test_an_empty_directory_opens_as_an_empty_warehouse(tmp_path, shell_env):
    """Issue 54: an empty directory was "neither a table nor a warehouse of
    tables"; the shell and castsql.connect now open it with no tables (a
    warehouse about to be written), while a path that does not exist, or a
    directory of other things, is still refused, and castsql.open says there
    is no table."""
    empty = tmp_path / "wh"
    empty.mkdir()
    s = castsql.connect(str(empty))
    assert s.tables == [] and s.sql("SELECT 42 AS x").to_pylist() == [{"x": 42}]
    s.close()
    r = subprocess.run(
        [sys.executable, "-m", "castsql.cli", str(empty), "-c", "SELECT 42 AS x"],
        capture_output=True, text=True, env=shell_env, timeout=120,
    )  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (0, "x\n42\n", "")
    with pytest.raises(CastSQLError, match="no table here"):
        castsql.open(str(empty))
    for where in (tmp_path / "missing", tmp_path / "other"):
        if where.name == "other":
            (where / "notes").mkdir(parents=True)
        with pytest.raises(CastSQLError, match="neither a table nor a warehouse of tables"):
            castsql.connect(str(where))
    from castsql.engine import Session
    from castsql.shell.banner import banner_text

    with Session(str(empty)) as session:
        assert "Tables: none yet (an empty warehouse" in banner_text(session)
