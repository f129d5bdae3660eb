"""``format("castsql")``: Spark's own read and write idioms over CastSQL tables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tables import SCHEMA, build_events, rows
from user_session import run_flaky

import castsql
from castsql.format import TableLog
from castsql.spark import read, register
from castsql.spark.session import PUSHDOWN_CONF
from castsql.storage import open_storage

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def events_table(tmp_path_factory):
    """tests/support/tables.py's events table (every tombstone kind), built once: tests only read it."""
    uri = str(tmp_path_factory.mktemp("ds") / "events")
    return uri, build_events(open_storage(uri))


PYTHON_SOURCE = "castsql_python"
BOTH = [("castsql", None), (PYTHON_SOURCE, True), (PYTHON_SOURCE, False)]
NAMES = ["jvm", "python-pushdown", "python"]


@pytest.fixture
def source(spark, request):
    """The name to read with: ``castsql`` (the JVM data source register()
    installs), or the Python data source (the fallback where the jar is not
    built) registered under a name of its own, with filter pushdown on or off."""
    name, pushdown = request.param
    if name == "castsql":
        yield name
        return
    from castsql.spark.datasource import for_session
    from castsql.spark.units import Splits

    if not spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name):
        spark.dataSource.register(for_session(Splits.of(spark), name))
    before = spark.conf.get(PUSHDOWN_CONF)
    spark.conf.set(PUSHDOWN_CONF, "true" if pushdown else "false")
    yield name
    spark.conf.set(PUSHDOWN_CONF, before)


def _engine(uri: str, **at) -> pa.Table:
    return castsql.open(uri).at(**at).to_arrow()


def _same(got: pa.Table, want: pa.Table, what: str) -> None:
    got, want = got.sort_by("id"), want.sort_by("id")
    assert got.num_rows == want.num_rows, f"{what}: {got.num_rows} rows, the engine has {want.num_rows}"
    assert got.equals(want.cast(got.schema)), f"{what}: rows differ from the engine's"


def _spark_error_text(e: BaseException) -> str:
    return str(e)


# ---------------------------------------------------------------------- read


@pytest.mark.parametrize("source", BOTH, indirect=True, ids=NAMES)
def test_every_version_and_timestamp_equals_the_engine(spark, events_table, source):
    uri, ev = events_table
    log = TableLog(open_storage(uri))
    for m in log.history():
        v = m.version
        df = spark.read.format(source).option("versionAsOf", v).load(uri)
        _same(df.toArrow(), _engine(uri, version=v), f"versionAsOf {v}")
        assert sorted(df.select("id").toArrow()["id"].to_pylist()) == sorted(ev.live[v])
        when = m.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        got = spark.read.format(source).option("timestampAsOf", when).load(uri).toArrow()
        _same(got, _engine(uri, timestamp=m.created_at), f"timestampAsOf {when}")
        assert got.num_rows == len(ev.live[v])
        # The native reader answers the same.
        _same(read(spark, uri, timestamp=m.created_at).toArrow(), got, f"castsql.spark.read at {when}")


@pytest.mark.parametrize("source", BOTH, indirect=True, ids=NAMES)
def test_filters_give_the_engine_answer(spark, events_table, source):
    uri, _ = events_table
    df = spark.read.format(source).load(uri)
    t0 = "2025-01-01T20:00:00Z"  # id 1200 (ts = T0 + id minutes)
    cases = {
        "id >= 1500 AND id < 1700": lambda t: [1500 <= i < 1700 for i in t["id"].to_pylist()],
        "id = 7 OR id = 2050": lambda t: [i in (7, 2050) for i in t["id"].to_pylist()],
        "id IN (5, 6, 250, 1999, 2000)": lambda t: [i in (5, 6, 250, 1999, 2000) for i in t["id"].to_pylist()],
        f"ts > TIMESTAMP '{t0}'": lambda t: [i > 1200 for i in t["id"].to_pylist()],
        "grp = 'g3' AND id < 100": lambda t: [
            g == "g3" and i < 100 for g, i in zip(t["grp"].to_pylist(), t["id"].to_pylist(), strict=True)
        ],
        "val > 900.0": lambda t: [v > 900.0 for v in t["val"].to_pylist()],
        # Spark pushes Not(EqualTo): a filter with no column of its own, which prunes nothing.
        "id != 7 AND id < 20": lambda t: [i != 7 and i < 20 for i in t["id"].to_pylist()],
    }  # fmt: skip
    everything = _engine(uri)
    for cond, keep in cases.items():
        want = everything.filter(pa.array(keep(everything)))
        _same(df.where(cond).toArrow(), want, cond)


@pytest.mark.parametrize("source", BOTH[:2], indirect=True, ids=NAMES[:2])
def test_reusing_a_dataframe_or_view_after_a_filtered_query(spark, events_table, source):
    """PySpark 4.1.1 reuses the partitions planned for one query's pushed
    filters in the next query of the same DataFrame without filters: they
    must hold every live row."""
    uri, ev = events_table
    df = spark.read.format(source).option("versionAsOf", 5).load(uri)
    assert df.where("id = 7").count() == 1
    assert df.count() == len(ev.live[5])
    df.createOrReplaceTempView("reused")
    assert spark.sql("SELECT count(*) FROM reused WHERE id >= 2000").first()[0] == 0
    assert spark.sql("SELECT count(*) FROM reused").first()[0] == len(ev.live[5])


def test_without_the_planner_strategy_a_scan_answers_the_same(spark, events_table):
    """A session whose extra planner strategies were replaced after the load
    plans the relation as Spark plans any V1 source (its buildScan's rows)."""
    uri, ev = events_table
    experimental = spark._jsparkSession.experimental()
    df = spark.read.format("castsql").option("versionAsOf", 5).load(uri)
    assert "ScanStrategy" in experimental.extraStrategies().toString()
    before = experimental.extraStrategies()
    replace = getattr(experimental, "extraStrategies_$eq")  # Scala's setter of a var
    replace(before.take(0))
    try:
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "Scan castsql" in plan and "FileScan parquet" not in plan
        _same(df.toArrow(), _engine(uri, version=5), "buildScan")
        assert df.where("id >= 1500 AND grp = 'g3'").count() == sum(1 for i in ev.live[5] if i >= 1500 and i % 7 == 3)
    finally:
        replace(before)


def test_pushed_filters_skip_files_by_their_statistics(spark, tmp_path):
    """The JVM source opens only the files whose manifest statistics may
    match the query's filters: here the file of ids 0-999 is gone from disk,
    so any query that opened it would fail."""
    from castsql.format import write_data_files
    from castsql.snapshot import resolve

    uri = str(tmp_path / "t")
    st = open_storage(uri)
    log = TableLog.create(st, SCHEMA, primary_key="id")
    for lo in range(0, 3000, 1000):
        log.append(write_data_files(st, rows(lo, lo + 1000)))
    df = spark.read.format("castsql").load(uri)
    (tmp_path / "t" / resolve(log, 1).table().column("path")[0].as_py()).unlink()
    assert df.where("id >= 1500").count() == 1500
    assert df.where("id IN (1000, 2999) AND grp = 'g6'").count() == 1  # 2999 % 7 == 3, 1000 % 7 == 6
    assert df.where("ts >= TIMESTAMP '2025-01-01 20:00:00Z'").agg({"id": "min"}).first()[0] == 1200
    assert df.where("ts < DATE '2025-01-02' AND id > 999").count() == 440  # 1000..1439: before midnight
    with pytest.raises(Exception, match=r"(?i)not exist|FileNotFound|No such file"):
        df.where("id < 1500").count()  # needs the gone file: the others were pruned, not tolerated


def test_pruning_machinery_skips_files_and_row_groups(tmp_path):
    """The pruning the data source does once PRUNE_PUSHED_FILTERS is on (run
    here in-process, as Spark's planner and workers would): files the
    manifest rules out and row groups their footer rules out are never
    opened, so a file made unreadable there does not matter."""
    from pyspark.sql.datasource import GreaterThanOrEqual, IsNotNull, LessThan

    from castsql.snapshot import resolve
    from castsql.spark.datasource import CastSQLPushdownReader
    from castsql.spark.reader import table_ref
    from castsql.spark.units import Splits

    uri = str(tmp_path / "events")
    ev = build_events(open_storage(uri))
    st = ev.log.storage
    snap = resolve(ev.log)
    first = next(f for f in snap.files if f.entry.min["id"] == 0)  # ids 0-999, row groups of 100
    path = st.uri(first.key)
    rg1 = pq.ParquetFile(path).metadata.row_group(1).column(0)  # ids 100-199
    with open(path, "rb") as f:
        data = bytearray(f.read())
    start = rg1.dictionary_page_offset or rg1.data_page_offset
    data[start : start + 64] = b"\xff" * 64  # row group 1's first page header: garbage
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(data)

    def rows_read(*filters) -> list[int]:
        reader = CastSQLPushdownReader(table_ref(ev.log, snap), 6, ["id", "grp", "val", "ts"], Splits(slots=2))
        assert list(reader.pushFilters(list(filters))) == list(filters)  # Spark still evaluates them all
        parts = reader.partitions()
        return sorted(i for p in parts for b in reader.read(p) for i in b.column(0).to_pylist())

    got = rows_read(GreaterThanOrEqual(("id",), 1000))  # the damaged file is pruned by the manifest
    assert got == sorted(i for i in ev.live[6] if i >= 1000)
    got = rows_read(IsNotNull(("id",)), GreaterThanOrEqual(("id",), 300), LessThan(("id",), 400))
    assert got == list(range(300, 400))  # row groups 0-2 and 4-9 pruned by their footer statistics
    with pytest.raises(Exception):  # noqa: B017 - whatever pyarrow says about the garbage
        rows_read(GreaterThanOrEqual(("id",), 150))


@pytest.mark.parametrize("source", BOTH[1:2], indirect=True, ids=NAMES[1:2])
def test_partitions_are_files_or_groups_of_row_groups(spark, tmp_path, source):
    from castsql.format import write_data_files
    from castsql.snapshot import resolve
    from castsql.spark.datasource import plan_partitions
    from castsql.spark.reader import row_group_units

    uri = str(tmp_path / "t")
    st = open_storage(uri)
    log = TableLog.create(st, SCHEMA, primary_key="id")
    for lo in range(0, 3000, 1000):
        log.append(write_data_files(st, rows(lo, lo + 1000), row_group_size=100))
    # A small table is one task (a Python task costs ~0.2 s here).
    assert spark.read.format(source).load(uri).rdd.getNumPartitions() == 1
    units = row_group_units(log, resolve(log))
    assert len(units) == 30
    parts = plan_partitions(units, rows_per_partition=1000)  # one file each
    assert [[(u.key, len(u.row_groups)) for u in p] for p in parts] == [[(u.key, 10)] for u in units[::10]]
    parts = plan_partitions(units, rows_per_partition=500)  # halves of files, never a sliver
    assert [[len(u.row_groups) for u in p] for p in parts] == [[5]] * 6
    parts = plan_partitions(units, rows_per_partition=300)  # near-equal runs of consecutive row groups
    assert [[[rg[0] for rg in u.row_groups] for u in p] for p in parts] == [
        [[0, 1, 2, 3]],
        [[4, 5, 6]],
        [[7, 8, 9]],
    ] * 3
    assert len(plan_partitions(units, rows_per_partition=3000)) == 1  # small files share one
    assert sorted(rg[1] for p in parts for u in p for rg in u.row_groups) == sorted(u.row_groups[0][1] for u in units)


def test_reads_are_cut_as_spark_cuts_parquet_files(spark, tmp_path):
    """Few large tasks (a Python task costs ~0.2-0.5 s of its own here), at
    least one per slot when there is enough to share, a multiple of the slots
    after that: the session's rule rides on the registered class."""
    from castsql.format import write_data_files
    from castsql.spark.units import Splits

    two = Splits(slots=2)
    assert two.rows_per_split(rows=3000, size=30_000, files=3) == 3000  # tiny: one task
    assert two.rows_per_split(rows=2_000_000, size=34_000_000, files=2) == 1_000_000  # one per slot
    # 342 MB is 3 splits of 128 MB: rounded up to 4 so that no slot idles in the last wave.
    assert two.rows_per_split(rows=20_000_000, size=342_000_000, files=2) == 5_000_000
    assert Splits(slots=16).rows_per_split(rows=20_000_000, size=342_000_000, files=2) == 1_250_000
    # Spark accepts spark.sql.files.maxPartitionBytes=0: every row group is then a split of its own.
    assert Splits(slots=2, max_bytes=0).rows_per_split(rows=20_000_000, size=342_000_000, files=2) == 1
    assert Splits.of(spark) == Splits(spark.sparkContext.defaultParallelism)
    try:
        spark.conf.set("spark.sql.files.maxPartitionBytes", "1000")
        spark.conf.set("spark.sql.files.openCostInBytes", "10")
        assert Splits.of(spark) == Splits(spark.sparkContext.defaultParallelism, 1000, 10)
        spark.conf.set("spark.sql.files.minPartitionNum", "7")  # Spark's own override of the slots
        assert Splits.of(spark) == Splits(7, 1000, 10)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")
        spark.conf.unset("spark.sql.files.minPartitionNum")

    # The planner runs in a process of its own: the rule travels pickled with the class.
    from pyspark import cloudpickle

    from castsql.spark.datasource import CastSQLDataSource, CastSQLPartition, for_session

    uri = str(tmp_path / "t")
    st = open_storage(uri)
    log = TableLog.create(st, SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        log.append(write_data_files(st, rows(lo, lo + 1000), row_group_size=100))
    cls = cloudpickle.loads(cloudpickle.dumps(for_session(Splits(slots=4, max_bytes=1, open_cost=1))))
    assert cls is not CastSQLDataSource and issubclass(cls, CastSQLDataSource) and cls.name() == "castsql"
    source = cls({"path": uri})
    parts = source.reader(source.schema()).partitions()
    assert len(parts) == 40 and all(isinstance(p, CastSQLPartition) for p in parts)  # one per row group
    plain = CastSQLDataSource({"path": uri})
    assert len(plain.reader(plain.schema()).partitions()) == 1  # this machine's cores: a tiny table is one task


@pytest.mark.parametrize("source", BOTH[:2], indirect=True, ids=NAMES[:2])
def test_a_load_is_fixed_to_its_version(spark, tmp_path, source):
    from castsql.format import write_data_files

    uri = str(tmp_path / "events")
    ev = build_events(open_storage(uri))
    df = spark.read.format(source).load(uri)
    ev.log.append(write_data_files(ev.log.storage, rows(5000, 5010)))
    assert df.count() == len(ev.live[6])
    assert df.where("id >= 5000").count() == 0
    assert spark.read.format(source).load(uri).count() == len(ev.live[6]) + 10


@pytest.mark.parametrize("source", BOTH[:2], indirect=True, ids=NAMES[:2])
def test_bad_options_are_one_line_errors(spark, events_table, source):
    uri, _ = events_table
    log = TableLog(open_storage(uri))
    latest, oldest = log.latest(), log.manifest(0)

    def err(**options) -> str:
        r = spark.read.format(source)
        for k, v in options.items():
            r = r.option(k, v)
        with pytest.raises(Exception) as e:
            r.load(uri).count()
        return _spark_error_text(e.value)

    assert "option versionAsOf must be an integer, got 'two'" in err(versionAsOf="two")
    assert "version 99 does not exist" in err(versionAsOf="99")
    assert "give versionAsOf or timestampAsOf, not both" in err(versionAsOf="1", timestampAsOf="2025-01-01")
    assert "timestampAsOf: 'yesterday' is not a timestamp" in err(timestampAsOf="yesterday")
    assert "unknown option 'versionasoff'" in err(versionAsOff="1").lower()  # Spark lowercases the keys
    late = (latest.created_at + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = err(timestampAsOf=late)
    assert f"is after the latest version {latest.version}" in text and late[:19] in text
    assert latest.created_at.strftime("%Y-%m-%dT%H:%M:%S") in text
    text = err(timestampAsOf="2000-01-01T00:00:00Z")
    assert "timestampAsOf 2000-01-01T00:00:00.000000Z is before the oldest kept version 0" in text
    assert oldest.created_at.strftime("%Y-%m-%dT%H:%M:%S") in text
    with pytest.raises(Exception, match="no table path"):
        spark.read.format(source).load().count()
    if source == "castsql":
        with pytest.raises(Exception, match=r"no table path.*one table"):
            spark.read.format(source).load([uri, uri + "2"])
    from castsql.errors import CastSQLError

    with pytest.raises(CastSQLError, match=r"is after the latest version 6 \(committed at"):
        read(spark, uri, timestamp=latest.created_at + timedelta(seconds=1))
    with pytest.raises(CastSQLError, match="no column 'nope'"):
        read(spark, uri, columns=["id", "nope"])


def test_native_reader_columns(spark, events_table):
    uri, _ = events_table
    df = read(spark, uri, 5, columns=["ts", "id"])
    assert df.columns == ["ts", "id"]
    got = df.toArrow()
    _same(got, _engine(uri, version=5).select(["ts", "id"]), "columns ts, id")


def test_register_is_idempotent_and_sql_views_time_travel(spark, events_table, tmp_path):
    uri, ev = events_table
    assert register(register(spark)) is spark
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW ev3 USING castsql OPTIONS (path '{uri}', versionAsOf '3')")
    assert spark.sql("SELECT count(*) FROM ev3").first()[0] == len(ev.live[3])
    assert spark.sql("SELECT min(id) FROM ev3 WHERE id >= 200").first()[0] == 300  # row group 2 deleted at v3
    # A catalog table keeps its path with the JVM source (the Python one loses it).
    spark.sql(f"CREATE TABLE castsql_ct USING castsql OPTIONS (path '{uri}', versionAsOf '3')")
    try:
        assert spark.sql("SELECT count(*) FROM castsql_ct").first()[0] == len(ev.live[3])
    finally:
        spark.sql("DROP TABLE castsql_ct")

    from castsql.errors import CastSQLError
    from castsql.format import write_data_files
    from castsql.spark import register_views

    wh = tmp_path / "wh"
    build_events(open_storage(str(wh / "events")))
    st = open_storage(str(wh / "users"))
    TableLog.create(st, SCHEMA).append(write_data_files(st, rows(0, 3)))
    (wh / "not_a_table").mkdir()
    assert register_views(spark, str(wh)) == ["events", "users"]
    assert spark.sql("SELECT count(*) FROM events").first()[0] == len(ev.live[6])
    assert spark.sql("SELECT count(*) FROM users").first()[0] == 3
    assert register_views(spark, str(wh), version=1) == ["events", "users"]
    assert spark.sql("SELECT count(*) FROM events").first()[0] == len(ev.live[1])
    # A version one table lacks: nothing changes (events still at version 1).
    with pytest.raises(Exception, match="version 5 does not exist"):
        register_views(spark, str(wh), version=5)
    assert spark.sql("SELECT count(*) FROM events").first()[0] == len(ev.live[1])

    # Directory names that are not identifiers are views quoted in SQL.
    for name in ("my-table", "2024"):
        st = open_storage(str(wh / name))
        TableLog.create(st, SCHEMA).append(write_data_files(st, rows(0, 2)))
    assert register_views(spark, str(wh)) == ["2024", "events", "my-table", "users"]
    assert spark.sql("SELECT count(*) FROM `my-table`").first()[0] == 2
    assert spark.sql("SELECT count(*) FROM `2024`").first()[0] == 2
    # Two tables whose names differ only in case would be one view: refused, no view made.
    st = open_storage(str(wh / "Users"))
    TableLog.create(st, SCHEMA).append(write_data_files(st, rows(0, 5)))
    spark.catalog.dropTempView("users")
    with pytest.raises(CastSQLError, match="tables 'Users' and 'users' differ only in case"):
        register_views(spark, str(wh))
    assert not spark.catalog.tableExists("users")


def test_s3_table_through_options(spark, s3_root, s3_server):
    cfg = s3_server.config
    uri = s3_root + "/events"
    ev = build_events(open_storage(uri, s3=cfg))
    df = (
        spark.read.format("castsql")
        .option("s3.endpoint", cfg.endpoint_url)
        .option("s3.accessKeyId", cfg.key)
        .option("s3.secretAccessKey", cfg.secret)
        .option("versionAsOf", 5)
        .load(uri)
    )
    assert sorted(df.select("id").toArrow()["id"].to_pylist()) == sorted(ev.live[5])


# ---------------------------------------------------------------------- any session


USER_SESSION = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    import castsql.spark as cs

    uri = sys.argv[1]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    print("native", cs.read(spark, uri, version=2).count())
    cs.register(spark)
    print("jvm", spark._jvm.castsql.spark.jvm.CastSQLProvider.installed())
    print("format", spark.read.format("castsql").option("versionAsOf", 3).load(uri).count())
    spark.sql(f"CREATE TEMPORARY VIEW v USING castsql OPTIONS (path '{uri}', versionAsOf '4')")
    print("view", spark.sql("SELECT count(*) FROM v").first()[0])
    spark.stop()
    """
)


def _installed_copy(tmp_path) -> str:
    """The castsql package as a wheel installs it: sources only, no jar built
    next to them (the DuckDB extensions may stay: they are not under test)."""
    site = tmp_path / "site"
    shutil.copytree(
        Path(castsql.__file__).parent, site / "castsql", ignore=shutil.ignore_patterns("castsql-spark.*", "__pycache__")
    )
    return str(site)


def _user_env(tmp_path, site: str, path: str | None = None) -> dict[str, str]:
    """A user's environment: castsql from ``site``, a cache directory of its own, and
    (unless ``path`` says otherwise) a PATH whose ``python3`` is not the venv's."""
    venv_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_", "VIRTUAL_ENV"))}
    env["PATH"] = (
        path if path is not None else os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    )
    env["PYTHONPATH"] = site
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def test_a_users_own_session_with_an_installed_package_gets_the_jvm_source(events_table, tmp_path):
    """The user's ``SparkSession.builder.master("local[2]").getOrCreate()``,
    with a PATH whose ``python3`` is not the venv's (no pyarrow, no castsql),
    and castsql installed without the jar: ``register`` builds it once into
    the user's cache, and ``format("castsql")`` is the JVM data source."""
    uri, ev = events_table
    script = tmp_path / "user.py"
    script.write_text(USER_SESSION)
    site = _installed_copy(tmp_path)
    env = _user_env(tmp_path, site)
    out = subprocess.run(
        [sys.executable, str(script), uri], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.split(" ")[0] in ("native", "jvm", "format", "view")]
    want = [f"native {len(ev.live[2])}", "jvm True", f"format {len(ev.live[3])}", f"view {len(ev.live[4])}"]
    assert lines == want
    assert "building castsql-spark.jar" in out.stderr
    assert len(list((tmp_path / "cache" / "castsql").glob("castsql-spark-*.jar"))) == 1
    assert not list(Path(site).rglob("*.part")) and not list((tmp_path / "cache").rglob("*.part"))


NO_JDK_SESSIONS = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    import castsql.spark as cs

    uri = sys.argv[1]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    cs.register(spark)
    print("first", spark.read.format("castsql").option("versionAsOf", 3).load(uri).count())
    other = spark.newSession()
    cs.register(other)
    print("second", other.read.format("castsql").option("versionAsOf", 4).load(uri).count())
    spark.stop()
    """
)


def test_without_a_jdk_the_python_source_serves_every_session_and_says_why(events_table, tmp_path):
    """No javac on the PATH and no jar: ``register`` warns once, naming the
    reason, and the Python data source reads right, in a second session of the
    same SparkContext too (Spark refused its name there: it checks the active
    session's sources)."""
    uri, ev = events_table
    bin_dir = tmp_path / "bin"  # the machine's commands, but no javac
    bin_dir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        for f in Path(d).iterdir() if Path(d).is_dir() else ():
            if f.name != "javac" and not (bin_dir / f.name).exists():
                (bin_dir / f.name).symlink_to(f)
    script = tmp_path / "nojdk.py"
    script.write_text(NO_JDK_SESSIONS)
    env = _user_env(tmp_path, _installed_copy(tmp_path), path=str(bin_dir))
    out = subprocess.run(
        [sys.executable, str(script), uri], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.split(" ")[0] in ("first", "second")]
    assert lines == [f"first {len(ev.live[3])}", f"second {len(ev.live[4])}"]
    assert out.stderr.count("format('castsql') is the Python data source") == 1
    assert "no JDK (javac 17+) to build castsql-spark.jar with: install one" in out.stderr
    assert not (tmp_path / "cache").exists()


def test_a_damaged_jar_in_the_cache_is_built_again(tmp_path):
    """A cached jar cut short (another tool, a full disk) is not loaded, where
    it kept format('castsql') on the Python data source for good."""
    site = _installed_copy(tmp_path)
    probe = "from castsql.spark.jvm.build import locate; print(locate()[0])"

    def locate() -> Path:
        out = subprocess.run(
            [sys.executable, "-c", probe], env=_user_env(tmp_path, site), cwd=tmp_path, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip())

    jar = locate()
    whole = jar.read_bytes()
    jar.write_bytes(whole[:1000])
    assert locate() == jar and len(jar.read_bytes()) > 1000
    assert zipfile.ZipFile(jar).testzip() is None


# ---------------------------------------------------------------------- write


def test_append_creates_the_table_then_adds_one_version_per_write(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    events_df(range(0, 500), partitions=2).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    log = TableLog(open_storage(uri))
    assert [m.version for m in log.history()] == [0, 1]
    m1 = log.latest()
    assert m1.primary_key == "id" and m1.operation == "APPEND" and m1.summary["added_rows"] == 500
    assert len(m1.data_files) == 2  # one per task
    # Columns in another order are matched by name; the table keeps its order and primary key.
    df = events_df(range(500, 700)).select("amount", "kind", "user", "ts", "id")
    df.write.format("castsql").mode("append").save(uri)
    assert [m.version for m in log.history()] == [0, 1, 2]
    got = spark.read.format("castsql").load(uri).toArrow()
    assert sorted(got["id"].to_pylist()) == list(range(700))
    _same(got, _engine(uri), "after two appends")
    assert got.column_names == ["id", "ts", "user", "kind", "amount"]


def test_overwrite_is_one_version_of_exactly_the_new_rows(spark, events_df, tmp_path):
    from castsql.spark import delete

    uri = str(tmp_path / "events")
    events_df(range(0, 300)).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    delete(spark, uri, "id < 10")
    log = TableLog(open_storage(uri))
    old = log.latest()
    old_files = [f.path for f in old.data_files]
    events_df(range(1000, 1050), partitions=2).write.format("castsql").mode("overwrite").save(uri)
    m = log.latest()
    assert m.version == old.version + 1 and m.operation == "OVERWRITE"
    assert m.summary["removed_files"] == len(old_files) and not m.tombstones
    assert sorted(spark.read.format("castsql").load(uri).toArrow()["id"].to_pylist()) == list(range(1000, 1050))
    # The old files left the version, not the storage: time travel still reads them.
    st = open_storage(uri)
    assert all(st.exists(p) for p in old_files)
    assert not set(old_files) & {f.path for f in m.data_files}
    assert castsql.open(uri).at(version=old.version).to_arrow().num_rows == 290
    # Overwriting a table that does not exist yet creates it.
    new = str(tmp_path / "fresh")
    events_df(range(5)).write.format("castsql").mode("overwrite").option("primaryKey", "id").save(new)
    assert [m.version for m in TableLog(open_storage(new)).history()] == [0, 1]


def test_write_refuses_data_that_does_not_fit_the_table(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    events_df(range(10)).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    log = TableLog(open_storage(uri))
    wrong = events_df(range(10, 20)).selectExpr("id", "ts", "user", "kind", "CAST(amount AS STRING) AS amount")

    def err(df, mode="append", **options) -> str:
        w = df.write.format("castsql").mode(mode)
        for k, v in options.items():
            w = w.option(k, v)
        with pytest.raises(Exception) as e:
            w.save(uri)
        return str(e.value)

    assert "column 'amount' is string in the data, the table has double" in err(wrong)
    assert "the data has no column id (int64), the table's primary key" in err(events_df(range(3)).drop("id"))
    assert "column extra (int32) is not in the table" in err(events_df(range(3)).selectExpr("*", "1 AS extra"))
    assert "the table's primary key is 'id', not 'user'" in err(events_df(range(3)), primaryKey="user")
    assert "option rowGroupSize must be an integer" in err(events_df(range(3)), rowGroupSize="many")
    assert "versionAsOf and timestampAsOf are read options" in err(events_df(range(3)), versionAsOf="1")
    with pytest.raises(Exception, match=r"TableAlreadyExists|already exists|ErrorIfExists|not supported"):
        events_df(range(3)).write.format("castsql").mode("error").save(uri)
    assert [m.version for m in log.history()] == [0, 1]  # nothing committed


def test_a_new_table_refuses_columns_no_reader_could_read(spark, tmp_path):
    """An empty column name (no SQL can name it: the engine failed on every
    version) and nested types are refused before anything is written, naming
    the column."""

    def err(df) -> str:
        with pytest.raises(Exception) as e:
            df.write.format("castsql").mode("append").save(str(tmp_path / "t"))
        return str(e.value).strip()

    text = err(spark.createDataFrame([(1, 2)], ["id", ""]))
    assert "a column's name is empty, which no SQL can name" in text and "\n" not in text
    text = err(spark.createDataFrame([(1, [2])], "id bigint, tags array<int>"))
    assert "column 'tags'" in text and "unsupported column type" in text
    assert not (tmp_path / "t").exists()


def test_save_modes_are_deltas(spark, events_df, tmp_path):
    """Spark's default save mode (errorifexists) creates a table and refuses
    an existing one; ignore creates or leaves it as it is."""
    uri = str(tmp_path / "events")
    events_df(range(10)).write.format("castsql").option("primaryKey", "id").save(uri)
    log = TableLog(open_storage(uri))
    assert [m.version for m in log.history()] == [0, 1]
    with pytest.raises(Exception) as e:
        events_df(range(10, 20)).write.format("castsql").save(uri)
    assert str(e.value).splitlines() == [
        f"{uri}: the table already exists; mode 'errorifexists' (Spark's default) only creates tables: "
        "use .mode('append') or .mode('overwrite')"
    ]
    events_df(range(10, 20)).write.format("castsql").mode("ignore").save(uri)
    assert [m.version for m in log.history()] == [0, 1]
    other = str(tmp_path / "other")
    events_df(range(5)).write.format("castsql").mode("ignore").save(other)
    assert spark.read.format("castsql").load(other).count() == 5
    with pytest.raises(Exception, match=r"tables are not partitioned; drop partitionBy\(kind\)"):
        events_df(range(20, 25)).write.format("castsql").mode("append").partitionBy("kind").save(uri)
    assert [m.version for m in log.history()] == [0, 1]


def test_save_as_table_with_a_path_then_read_by_name(spark, events_df, tmp_path):
    """saveAsTable records the data's schema (NOT NULL where Spark knew it) and
    a qualified ``file:`` path: the table reads back by name. A schema that
    differs in more than nullability is refused naming both."""
    uri = str(tmp_path / "events")
    spark.sql("DROP TABLE IF EXISTS castsql_saved")
    try:
        spark.range(5).selectExpr("id", "CAST(id AS STRING) AS s").write.format("castsql").option(
            "path", uri
        ).saveAsTable("castsql_saved")
        assert castsql.open(uri).to_arrow().num_rows == 5
        assert spark.table("castsql_saved").where("id >= 3").count() == 2
    finally:
        spark.sql("DROP TABLE IF EXISTS castsql_saved")
    with pytest.raises(Exception, match=r"the table's schema is struct<id:bigint,s:string>, not the given"):
        spark.read.format("castsql").schema("id int, s string").load(uri).count()


def test_names_differing_only_in_case_are_the_tables_columns(spark, events_df, tmp_path):
    """Spark resolves names case-insensitively (unless spark.sql.caseSensitive),
    and so does a write: AMOUNT is the table's amount, not a new column, and
    option("primaryKey", "ID") names the key id."""
    uri = str(tmp_path / "events")
    events_df(range(3)).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    events_df(range(3, 5)).withColumnRenamed("amount", "AMOUNT").withColumnRenamed("id", "Id").write.format(
        "castsql"
    ).mode("append").save(uri)
    got = castsql.open(uri).to_arrow()
    assert got.column_names == ["id", "ts", "user", "kind", "amount"]
    assert got.num_rows == 5 and got["amount"].null_count == 0
    # So is the primaryKey option: ID is the key id, of an existing table or a new one.
    events_df(range(5, 6)).write.format("castsql").mode("append").option("primaryKey", "ID").save(uri)
    assert castsql.open(uri).to_arrow().num_rows == 6
    other = str(tmp_path / "other")
    events_df(range(2)).write.format("castsql").mode("append").option("primaryKey", "ID").save(other)
    assert TableLog(open_storage(other)).latest().primary_key == "id"


def test_timestamp_as_of_without_a_zone_is_in_the_sessions_zone(spark, events_table):
    """As Delta: ``timestampAsOf '2025-06-01 12:00:00'`` is that wall-clock time
    in ``spark.sql.session.timeZone``; with a zone it is that instant."""
    from zoneinfo import ZoneInfo

    uri, ev = events_table
    m = TableLog(open_storage(uri)).manifest(3)
    tokyo = m.created_at.astimezone(ZoneInfo("Asia/Tokyo")).replace(tzinfo=None).isoformat()
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        assert spark.read.format("castsql").option("timestampAsOf", tokyo).load(uri).count() == len(ev.live[3])
        instant = m.created_at.isoformat()  # with its zone (+00:00): the same version
        assert spark.read.format("castsql").option("timestampAsOf", instant).load(uri).count() == len(ev.live[3])
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_a_failing_python_udf_is_the_python_exception_spark_gives(spark, tmp_path):
    """What a plain ``df.write.parquet`` raises (PythonException, catchable as
    such), not a wrapped Py4J error; no table, no file is left."""
    from pyspark.errors import PythonException
    from pyspark.sql.functions import udf

    @udf("long")
    def boom(x):
        raise ValueError(f"no row {x} today")

    uri = tmp_path / "t"
    with pytest.raises(PythonException, match=r"ValueError: no row \d today"):
        spark.range(3).select(boom("id").alias("id")).write.format("castsql").mode("append").save(str(uri))
    assert not [p for p in uri.rglob("*") if p.is_file()]  # no table, no data file


def test_concurrent_writes_leave_the_sessions_settings_as_they_were(spark, events_df, tmp_path):
    """Spark's writer runs with CastSQL's timestamp settings; writes from four
    threads of one session restore the user's values after the last one."""
    from concurrent.futures import ThreadPoolExecutor

    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key)

    def write(i: int) -> None:
        events_df(range(i * 10, i * 10 + 10)).write.format("castsql").mode("append").save(str(tmp_path / f"t{i}"))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))
    assert spark.conf.get(key) == before
    assert all(castsql.open(str(tmp_path / f"t{i}")).to_arrow().num_rows == 10 for i in range(4))


def test_writes_keep_the_primary_key_unique(spark, events_df, tmp_path):
    """The keys rule of every writer (castsql.write.keys): keys already live, or
    repeated in the data, are refused in one line with the first keys named,
    nothing committed and the written files removed; allowDuplicateKeys lets them in."""
    uri = str(tmp_path / "events")
    events_df(range(10)).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    log = TableLog(open_storage(uri))
    data_files = set(open_storage(uri).list("data/"))
    with pytest.raises(Exception, match=r"2 key\(s\) are already in the table at version 1 \(id = 8, id = 9\)"):
        events_df(range(8, 12)).write.format("castsql").mode("append").save(uri)
    twice = events_df(range(20, 23)).union(events_df([21]))
    with pytest.raises(Exception, match=r"the data holds key id = 21 more than once"):
        twice.write.format("castsql").mode("overwrite").save(uri)
    assert [m.version for m in log.history()] == [0, 1]
    assert set(open_storage(uri).list("data/")) == data_files  # the refused writes' files are gone
    events_df(range(8, 12)).write.format("castsql").mode("append").option("allowDuplicateKeys", "true").save(uri)
    assert castsql.open(uri).to_arrow().num_rows == 14


@pytest.mark.parametrize("source", BOTH[:2], indirect=True, ids=NAMES[:2])
@pytest.mark.parametrize("mode", ["append", "overwrite", "errorifexists"])
def test_a_first_write_refused_for_its_keys_leaves_no_table(spark, events_df, tmp_path, source, mode):
    """Issue 54 (SPARK.md: a failed first append leaves no table): the first
    write created version 0 before its keys were checked, so a write of
    repeated ids left an empty table and the corrected retry of the same call
    (mode errorifexists) then failed. The keys are checked first."""
    if source == PYTHON_SOURCE and mode == "errorifexists":
        pytest.skip("a Python data source takes only append and overwrite (Spark's rule)")
    uri = tmp_path / "events"
    twice = events_df(range(5)).union(events_df([3]))
    with pytest.raises(Exception, match=r"the data holds key id = 3 more than once"):
        twice.write.format(source).mode(mode).option("primaryKey", "id").save(str(uri))
    assert sorted(p.name for p in uri.rglob("*") if p.is_file()) == []
    events_df(range(5)).write.format(source).mode(mode).option("primaryKey", "id").save(str(uri))
    t = castsql.open(str(uri))
    assert (t.version, t.to_arrow().num_rows) == (1, 5)


# Written through the data source, a file per 1,000 rows: the failed attempt leaves some.
FLAKY_WRITE = """
cs.register(spark)
(df.write.format("castsql").mode("append").option("primaryKey", "id")
   .option("rowGroupSize", "1000").option("targetFileBytes", "1").save(uri))
"""


def test_a_task_attempt_that_fails_once_commits_one_version_without_duplicates(tmp_path):
    from datetime import UTC, datetime

    from castsql.snapshot import resolve
    from castsql.spark import gc

    uri = run_flaky(tmp_path, FLAKY_WRITE, {"spark.sql.execution.arrow.maxRecordsPerBatch": "1000"})
    log = TableLog(open_storage(uri))
    assert [m.version for m in log.history()] == [0, 1]
    ids = castsql.open(uri).to_arrow()["id"].to_pylist()
    assert sorted(ids) == list(range(20000))  # every row once
    # The failed attempt's files are in no version: GC removes them as never committed.
    st = open_storage(uri)
    committed = set(resolve(log).table().column("path").to_pylist())
    stored = {i.key for i in st.list("data/")}
    orphans = stored - committed
    assert orphans, "the failed attempt wrote files before failing"
    report = gc(uri, grace=timedelta(0), now=datetime.now(UTC) + timedelta(seconds=1))
    assert set(report.removed_orphans) == orphans and not report.removed_data_files
    assert sorted(castsql.open(uri).to_arrow()["id"].to_pylist()) == list(range(20000))


# ---------------------------------------------------------------------- streaming


def _file_stream(spark, tmp_path, **options: str):
    """Three Parquet files of 10 ids each, streamed one a micro-batch into the
    table ``t`` by ``run()`` (a query with its checkpoint, ``availableNow``)."""
    src, uri, ck = tmp_path / "src", str(tmp_path / "t"), tmp_path / "ck"
    src.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}), src / f"f{i}.parquet")

    def run() -> None:
        stream = spark.readStream.schema("id bigint").option("maxFilesPerTrigger", 1).parquet(str(src))
        w = stream.writeStream.format("castsql").option("checkpointLocation", str(ck))
        for k, v in options.items():
            w = w.option(k, v)
        w.trigger(availableNow=True).start(uri).awaitTermination()

    return src, uri, ck, run


def _forget_batch(ck, batch: int) -> None:
    """The table committed ``batch`` but the checkpoint lost its record of it (a
    crash between the two): the restarted query replays it."""
    (ck / "commits" / str(batch)).unlink()
    (ck / "commits" / f".{batch}.crc").unlink()


def test_stream_commits_each_micro_batch_once_across_restarts(spark, tmp_path):
    src, uri, ck, run = _file_stream(spark, tmp_path, primaryKey="id")

    def batches() -> list[tuple[int, int | None]]:
        return [(m.version, m.summary.get("stream_batch")) for m in TableLog(open_storage(uri)).history()]

    run()
    assert batches() == [(0, None), (1, 0), (2, 1), (3, 2)]
    _forget_batch(ck, 2)
    run()
    assert batches() == [(0, None), (1, 0), (2, 1), (3, 2)]
    pq.write_table(pa.table({"id": pa.array(range(30, 35), pa.int64())}), src / "f3.parquet")
    run()
    assert batches()[-1] == (4, 3)
    assert sorted(castsql.open(uri).to_arrow()["id"].to_pylist()) == list(range(35))


def test_a_replayed_batch_is_known_after_gc_dropped_the_version_that_committed_it(spark, tmp_path):
    """No primary key to catch a duplicate: only the table's record of the
    batches stands between a replay and its rows twice. Every version carries
    it, so GC keeping only the newest version loses nothing."""
    from castsql.spark import gc

    _, uri, ck, run = _file_stream(spark, tmp_path)
    run()
    castsql.open(uri).append(pa.table({"id": pa.array([100], pa.int64())}))  # another writer
    report = gc(uri, keep_versions=1, grace=timedelta(0))
    assert report.removed_versions, report  # the versions of batches 0-2 are gone
    _forget_batch(ck, 2)
    head = TableLog(open_storage(uri)).latest().version
    run()
    assert TableLog(open_storage(uri)).latest().version == head
    assert sorted(castsql.open(uri).to_arrow()["id"].to_pylist()) == [*range(30), 100]


def test_stream_complete_mode_replaces_the_rows_and_partitioning_is_refused(spark, tmp_path):
    """Complete output mode (a running aggregate) makes each batch an
    overwrite, as Delta's; partitionBy and update mode are refused in one line."""
    src, uri, ck = tmp_path / "src", str(tmp_path / "t"), tmp_path / "ck"
    src.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}), src / f"f{i}.parquet")
    stream = spark.readStream.schema("id bigint").option("maxFilesPerTrigger", 1).parquet(str(src))
    counts = stream.selectExpr("id % 2 AS parity").groupBy("parity").count()
    w = counts.writeStream.format("castsql").outputMode("complete").option("checkpointLocation", str(ck))
    w.trigger(availableNow=True).start(uri).awaitTermination()
    log = TableLog(open_storage(uri))
    assert [m.summary.get("stream_batch") for m in log.history()] == [None, 0, 1]
    assert log.latest().operation == "OVERWRITE"
    got = castsql.open(uri).to_arrow().sort_by("parity").to_pylist()
    assert got == [{"parity": 0, "count": 10}, {"parity": 1, "count": 10}]
    for bad, text in [
        (stream.writeStream.partitionBy("id"), "tables are not partitioned; drop partitionBy(id)"),
        (counts.writeStream.outputMode("update"), "output mode Update is not supported; use append or complete"),
    ]:
        with pytest.raises(Exception) as e:
            bad.format("castsql").option("checkpointLocation", str(tmp_path / "ck2")).start(str(tmp_path / "u"))
        assert text in str(e.value)
        assert not (tmp_path / "u").exists()


def test_two_streams_into_one_table_under_a_session_checkpoint_root(spark, tmp_path):
    """Each query is known by Spark's query id (kept in its checkpoint), not
    by a checkpoint path two queries can share: both streams' batches land."""
    uri = str(tmp_path / "t")
    for name, lo in (("a", 0), ("b", 100)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": pa.array(range(lo, lo + 10), pa.int64())}), tmp_path / name / "f.parquet")
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "root"))
    try:
        for name in ("a", "b"):
            stream = spark.readStream.schema("id bigint").parquet(str(tmp_path / name))
            w = stream.writeStream.format("castsql").queryName(f"q{name}").trigger(availableNow=True)
            w.start(uri).awaitTermination()
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert sorted(castsql.open(uri).to_arrow()["id"].to_pylist()) == [*range(10), *range(100, 110)]
    queries = [m.summary.get("stream_query") for m in TableLog(open_storage(uri)).history()[1:]]
    assert len(set(queries)) == 2 and all(queries)


FEED = "id bigint, name string, v bigint, op string, lsn bigint"
FEED_BATCHES = [
    # (id, op, lsn): a key changed twice in a batch takes its highest lsn; rows out of order on purpose.
    [(1, "U", 3), (2, "D", 2), (20, "I", 4), (1, "U", 1)],
    [(20, "D", 7), (21, "I", 5), (3, "U", 6), (99, "D", 8)],
    [(2, "I", 11), (21, "U", 9), (0, "D", 10), (21, "D", 12), (22, "I", 13)],
    [(22, "U", 14), (4, "D", 15)],
]


def test_cdc_feed_through_foreach_batch_is_applied_once_per_batch(spark, tmp_path):
    from castsql.errors import CastSQLError
    from castsql.spark import cdc_merge

    src, uri, ck = tmp_path / "feed", str(tmp_path / "users"), tmp_path / "ck"
    src.mkdir()
    initial = [(i, f"n{i}", i) for i in range(10)]
    spark.createDataFrame(initial, "id bigint, name string, v bigint").coalesce(1).write.format("castsql").mode(
        "append"
    ).option("primaryKey", "id").save(uri)
    models: list[dict[int, tuple[str, int]]] = []
    model = {i: (n, v) for i, n, v in initial}
    for b, changes in enumerate(FEED_BATCHES):
        for i, op, lsn in sorted(changes, key=lambda c: c[2]):
            if op == "D":
                model.pop(i, None)
            else:
                model[i] = (f"n{i}-{lsn}", lsn)
        models.append(dict(model))
        rows = [{"id": i, "name": f"n{i}-{lsn}", "v": lsn, "op": op, "lsn": lsn} for i, op, lsn in changes]
        path = src / f"batch{b}.json"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source takes them in this order

    def apply(batch, batch_id: int) -> None:
        cdc_merge(batch.sparkSession, uri, batch, key="id", op_column="op", sequence="lsn",
                  query=str(ck), batch_id=batch_id, merge_schema=True)  # fmt: skip

    def run(files: int) -> None:
        for path in sorted(src.iterdir())[files:]:
            path.rename(tmp_path / path.name)  # hide the batches not yet arrived
        try:
            feed = spark.readStream.schema(FEED).option("maxFilesPerTrigger", 1).json(str(src))
            q = feed.writeStream.foreachBatch(apply).option("checkpointLocation", str(ck))
            q.trigger(availableNow=True).start().awaitTermination()
        finally:
            for path in tmp_path.glob("batch*.json"):
                path.rename(src / path.name)

    def table(version: int) -> dict[int, tuple[str, int]]:
        t = castsql.open(uri).at(version=version).to_arrow()
        return {r["id"]: (r["name"], r["v"]) for r in t.to_pylist()}

    def batches() -> list[tuple[int, int | None]]:
        return [(m.version, m.summary.get("stream_batch")) for m in TableLog(open_storage(uri)).history()]

    run(3)
    assert batches() == [(0, None), (1, None), (2, 0), (3, 1), (4, 2)]
    for version, b in batches()[2:]:
        assert table(version) == models[b], f"batch {b}"
    # The table has batch 2, the checkpoint lost its record of it: the restart replays it, nothing is committed.
    (ck / "commits" / "2").unlink()
    (ck / "commits" / ".2.crc").unlink()
    run(3)
    assert batches() == [(0, None), (1, None), (2, 0), (3, 1), (4, 2)]
    run(4)
    assert batches()[-1] == (5, 3) and table(5) == models[3]
    with pytest.raises(CastSQLError, match="give app_id and batch_id together"):
        cdc_merge(spark, uri, spark.createDataFrame([], FEED), key="id", op_column="op", batch_id=7)


def test_merge_schema_adds_a_column_in_one_version(spark, events_df, tmp_path):
    uri = str(tmp_path / "events")
    events_df(range(10)).write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    log = TableLog(open_storage(uri))
    wider = events_df(range(10, 20)).selectExpr("*", "id * 10 AS extra")

    def refused(df, needle: str, **options) -> str:
        """The error's line holding ``needle`` (Spark wraps it in its own lines and a traceback)."""
        w = df.write.format("castsql").mode("append")
        for k, v in options.items():
            w = w.option(k, v)
        with pytest.raises(Exception) as e:
            w.save(uri)
        return next(x for x in str(e.value).splitlines() if needle in x)

    line = refused(wider, "column extra (int64) is not in the table")
    assert "(option mergeSchema=true adds it)" in line
    assert refused(wider, "mergeSchema must be true or false, got 'yes'", mergeSchema="yes")
    assert log.latest().version == 1  # nothing committed

    wider.write.format("castsql").mode("append").option("mergeSchema", "true").save(uri)
    m = log.latest()
    assert m.version == 2 and m.operation == "APPEND" and m.summary["added_rows"] == 10
    assert m.summary["added_columns"] == [{"name": "extra", "type": "int64"}]
    assert m.schema.column("extra").added_in == 2
    got = spark.read.format("castsql").load(uri).toArrow().sort_by("id")
    assert got.column_names == ["id", "ts", "user", "kind", "amount", "extra"]
    assert got["extra"].to_pylist() == [None] * 10 + [i * 10 for i in range(10, 20)]  # older rows read NULL
    _same(got, _engine(uri), "after mergeSchema")
    assert spark.read.format("castsql").option("versionAsOf", 1).load(uri).columns == got.column_names[:5]
    # Data that already fits, and an allowed widening, with the option: the same one-version rule.
    fits = events_df(range(20, 25)).selectExpr("*", "CAST(id AS INT) AS extra")  # int into the bigint column
    fits.write.format("castsql").mode("append").option("mergeSchema", "true").save(uri)
    assert log.latest().version == 3 and log.latest().schema == m.schema
    narrow = str(tmp_path / "narrow")
    spark.createDataFrame([(1, 2)], "id bigint, n int").write.format("castsql").mode("append").save(narrow)
    big = spark.createDataFrame([(2, 2**40)], "id bigint, n bigint")
    with pytest.raises(Exception, match=r"column 'n' is int64 in the data, the table has int32.*mergeSchema=true"):
        big.write.format("castsql").mode("append").save(narrow)
    big.write.format("castsql").mode("overwrite").option("mergeSchema", "true").save(narrow)
    head = TableLog(open_storage(narrow)).latest()
    assert head.version == 2 and head.schema.column("n").type == "int64"
    assert castsql.open(narrow).to_arrow().to_pylist() == [{"id": 2, "n": 2**40}]
