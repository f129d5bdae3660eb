"""Spark reading and writing a CastSQL table against Spark's own Parquet, same files, one run.

    .venv/bin/python bench/spark_bench.py [--rows 2000000] [--rounds 5] [--dir PATH] [--master local[*]]
    .venv/bin/python bench/spark_bench.py --rows 20000000          # issue 20's size
    .venv/bin/python bench/spark_bench.py --rows 20000000 --reads-only   # reads, no writes between them
    .venv/bin/python bench/spark_bench.py --reads-only --delete "id < 100000 AND pmod(hash(id, 1), 100) = 0"

Builds a table of ``--rows`` events rows (``castsql.spark.append``: Spark's
own writer, a file per task, row groups of 122,880 rows), then deletes 1 % of
its rows at random (``pmod(hash(id, 1), 100) = 0``: position bitmaps in every
row group) and pins that version. Each round then reads every row of every
column, through Spark's ``noop`` sink (nothing written, every value
materialized), three ways:

- ``parquet``: ``spark.read.parquet`` of the version's data files, no deletes
  applied (the floor);
- ``format``: ``spark.read.format("castsql").option("versionAsOf", v)`` (the
  JVM data source: ``castsql/spark/bridge.py``, Spark's own Parquet reader);
- ``format_py``: the same through the Python data source (the fallback where
  the jar is not built), registered as ``castsql_python``;
- ``native``: ``castsql.spark.read(spark, uri, version=v)`` (Spark's own
  Parquet reader, deletes applied by a filter on each row's file and
  position: ``castsql/spark/native_read.py``);
- ``workers``: the same version read by CastSQL's Python workers and handed
  to Spark as Arrow (``castsql.spark.reader.read_snapshot``: what
  ``castsql.spark.read`` does on S3, and what it did everywhere before);
- ``native_join``: the same where castsql-spark.jar cannot reach the tasks
  (the bitsets hash-joined with every row instead of tested by its UDF);
- ``meta``: ``parquet`` plus the two metadata columns ``native`` reads
  (``_metadata.row_index``, ``_metadata.file_size``), no deletes applied:
  the floor of any filter by file and position in Spark;

and writes the same rows (``spark.range(...).selectExpr(...)``, generated in
the job) to a fresh directory four ways: ``df.write.parquet`` (Spark's
defaults: snappy; the goal's baseline), the same with zstd (castsql's codec:
what the codec costs apart from the Python transfer),
``df.write.format("castsql")`` (zstd, a new table, one commit, Spark's own
Parquet writer), the same through the Python data source (Python workers)
and ``castsql.spark.append`` (the same through Spark's own
Parquet writer: ``castsql/spark/native_write.py``), and hands the same rows
to Python workers that drop them (``mapInArrow`` into Spark's ``noop`` sink:
the floor of any writer in Python). The order of
the contestants alternates from round to round (forward, then mirrored), a
round 0 warms the workers up and is not counted, and each cell is the median
over the rounds of (time / the Parquet time of the same round): the machine is
shared, so a load change hits both sides of a ratio alike. Correctness first:
the castsql reads must count the rows minus the deletes, the Parquet read all
the rows.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine
from spark_delete_bench import COLUMNS  # the same event rows as the delete bench

from castsql.format import TableLog
from castsql.snapshot import resolve
from castsql.spark import append, delete, native_read, read, spark_session
from castsql.spark.datasource import for_session
from castsql.spark.reader import read_snapshot
from castsql.spark.units import Splits
from castsql.storage import open_storage
from castsql.write.garbage import format_bytes

PYTHON_SOURCE = "castsql_python"
DELETE = "pmod(hash(id, 1), 100) = 0"  # 1 % of the rows, scattered
GOALS = {"format": 1.5, "native": 1.1, "write": 1.15, "append": 1.15}


def _timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    finally:
        gc.enable()


def _drain(batches):
    for _ in batches:
        pass
    yield from ()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=5, help="counted rounds (plus one warm-up round)")
    ap.add_argument("--dir", help="where to build the tables (default: a temporary directory, removed at the end)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--reads-only", action="store_true", help="no writes between the reads (quieter read ratios)")
    ap.add_argument("--delete", default=DELETE, help=f"the rows to delete, as SQL (default: {DELETE!r}, 1%% scattered)")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="castsql-spark-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    uri = str(base / "events")
    spark = spark_session("castsql spark bench", master=args.master)
    cores = spark.sparkContext.defaultParallelism
    try:
        load = os.getloadavg()
        print(f"machine: {machine()}, Spark {spark.version} {args.master} ({cores} task slots)")
        print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")

        def source():
            return spark.range(0, args.rows, numPartitions=max(2, cores)).selectExpr(*COLUMNS)

        t = time.monotonic()
        shutil.rmtree(uri, ignore_errors=True)
        append(spark, uri, source(), primary_key="id")
        m = delete(spark, uri, args.delete)
        v, deleted = m.version, m.summary["deleted_rows"]
        st = open_storage(uri)
        log = TableLog(st)
        snap = resolve(log, v)
        keys = snap.table().column("path").to_pylist()
        files = [str(Path(st.root) / k) for k in keys]
        size = sum(os.path.getsize(f) for f in files)
        print(
            f"table: {args.rows:,} rows, {len(files)} files, {format_bytes(size)}, version {v} deletes "
            f"{deleted:,} rows ({deleted / args.rows:.2%}, {len(m.tombstones)} tombstone file) "
            f"(built in {time.monotonic() - t:.1f}s) at {uri}"
        )
        assert TableLog(st).latest().version == v

        def noop(df) -> None:
            df.write.format("noop").mode("overwrite").save()

        def with_positions():
            # What any filter on a row's file and position pays before it tests
            # anything: the two metadata columns castsql.spark.read reads.
            raw = spark.read.parquet(*files)
            meta = raw.metadataColumn("_metadata")
            return raw.select("*", meta["row_index"].alias("_pos"), meta["file_size"].alias("_fs"))

        def joined_bitsets():
            # castsql.spark.read where no jar reaches the tasks: the bitsets hash-joined.
            native_read.JVM_FILTER = False
            try:
                return read(spark, uri, v)
            finally:
                native_read.JVM_FILTER = True

        spark.dataSource.register(for_session(Splits.of(spark), PYTHON_SOURCE))
        reads = {
            "parquet": lambda: noop(spark.read.parquet(*files)),
            "format": lambda: noop(spark.read.format("castsql").option("versionAsOf", v).load(uri)),
            "format_py": lambda: noop(spark.read.format(PYTHON_SOURCE).option("versionAsOf", v).load(uri)),
            "native": lambda: noop(read(spark, uri, v)),
            "workers": lambda: noop(read_snapshot(spark, log, snap)),
            "meta": lambda: noop(with_positions()),
            "native_join": lambda: noop(joined_bitsets()),
        }
        # Correctness first.
        want = args.rows - deleted
        counts = {
            "parquet": spark.read.parquet(*files).count(),
            "format": spark.read.format("castsql").option("versionAsOf", v).load(uri).count(),
            "format_py": spark.read.format(PYTHON_SOURCE).option("versionAsOf", v).load(uri).count(),
            "native": read(spark, uri, v).count(),
            "workers": read_snapshot(spark, log, snap).count(),
            "meta": with_positions().count(),
            "native_join": joined_bitsets().count(),
        }
        every = ("parquet", "meta")
        assert counts == {**{k: want for k in reads}, **{k: args.rows for k in every}}, counts

        out_parquet, out, out_append = base / "written.parquet", base / "written", base / "appended"
        out_py = base / "written_py"

        def write_parquet() -> None:
            shutil.rmtree(out_parquet, ignore_errors=True)
            source().write.parquet(str(out_parquet))

        def write_parquet_zstd() -> None:
            # castsql writes zstd: Spark's writer with the same codec separates
            # the codec's cost from the Python transfer.
            shutil.rmtree(out_parquet, ignore_errors=True)
            source().write.option("compression", "zstd").parquet(str(out_parquet))

        def write_castsql() -> None:
            shutil.rmtree(out, ignore_errors=True)
            source().write.format("castsql").mode("append").save(str(out))

        def write_castsql_py() -> None:
            shutil.rmtree(out_py, ignore_errors=True)
            source().write.format(PYTHON_SOURCE).mode("append").save(str(out_py))

        def append_castsql() -> None:
            shutil.rmtree(out_append, ignore_errors=True)
            append(spark, str(out_append), source())  # a new table, one commit, Spark's own writer

        def hand_to_python() -> None:
            # The floor of any writer in Python (a data source, mapInArrow):
            # the same rows converted to Arrow, sent to Python workers and dropped.
            source().mapInArrow(_drain, "n long").write.format("noop").mode("overwrite").save()

        writes = {
            "parquet": write_parquet,
            "parquet_zstd": write_parquet_zstd,
            "castsql": write_castsql,
            "castsql_py": write_castsql_py,
            "append": append_castsql,
            "to_python": hand_to_python,
        }
        if args.reads_only:
            writes = {}

        times: dict[str, list[float]] = {k: [] for k in [*reads, *(f"w_{k}" for k in writes)]}
        for r in range(args.rounds + 1):
            order, worder = list(reads), list(writes)
            if r % 2:
                order.reverse()
                worder.reverse()
            got = {k: _timed(reads[k]) for k in order}
            got |= {f"w_{k}": _timed(writes[k]) for k in worder}
            label = "warm-up" if r == 0 else f"round {r}"
            print(f"{label:>8}: " + "  ".join(f"{k} {t:.2f}s" for k, t in got.items()), flush=True)
            if r:
                for k, t in got.items():
                    times[k].append(t)
        if writes:
            for where in (out, out_py, out_append):
                written = TableLog(open_storage(str(where))).latest()
                assert written.summary["added_rows"] == args.rows, written.summary
        load = os.getloadavg()
        print(f"load average at end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

        rows = [
            ("read", "spark.read.parquet (no deletes)", "parquet", None, None),
            ("read", 'spark.read.format("castsql")', "format", "parquet", "format"),
            ("read", "  the same, Python data source", "format_py", "parquet", None),
            ("read", "castsql.spark.read", "native", "parquet", "native"),
            ("read", "  Python workers (S3's path)", "workers", "parquet", None),
            ("read", "  the same, bitsets hash-joined", "native_join", "parquet", None),
            ("read", "  row positions alone, no deletes", "meta", "parquet", None),
            ("write", "df.write.parquet", "w_parquet", None, None),
            ("write", "df.write.parquet, zstd", "w_parquet_zstd", "w_parquet", None),
            ("write", 'df.write.format("castsql")', "w_castsql", "w_parquet", "write"),
            ("write", "  the same / zstd parquet", "w_castsql", "w_parquet_zstd", None),
            ("write", "  the same, Python data source", "w_castsql_py", "w_parquet", None),
            ("write", "castsql.spark.append", "w_append", "w_parquet", "append"),
            ("write", "  the same / zstd parquet", "w_append", "w_parquet_zstd", None),
            ("write", "rows to Python workers, dropped", "w_to_python", "w_parquet", None),
        ]
        print(f"\n{args.rows:,} rows, {args.rounds} rounds, medians:")
        print(f"{'':<6}{'contestant':<34}{'median s':>10}{'ratio':>8}{'goal':>7}")
        for kind, name, key, base_key, goal in rows:
            if not times.get(key):
                continue
            r = ratio(key, base_key) if base_key else 1.0
            g = f"≤{GOALS[goal]:.2f}" if goal else ""
            verdict = "" if not goal else ("  met" if r <= GOALS[goal] else f"  MISSED by {r / GOALS[goal] - 1:.0%}")
            print(f"{kind:<6}{name:<34}{statistics.median(times[key]):>10.2f}{r:>8.2f}{g:>7}{verdict}")
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
