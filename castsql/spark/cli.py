"""The writer subcommands of ``castsql``: append, delete, compact, gc.

``castsql.cli`` hands them over with ``argv[0]`` the subcommand::

    castsql append URI --from FILE... [--format parquet|csv|json] [--primary-key COL]
    castsql delete URI --where "COND"
    castsql compact URI [--threshold F]
    castsql gc URI [--keep-versions N] [--older-than AGE] [--grace AGE] [--dry-run]
    castsql restore URI (--version N | --timestamp T)
    castsql upgrade URI

AGE is a number with a unit: ``7d``, ``12h``, ``30m``, ``45s``. Spark's console
progress bar shows while a job runs; the command ends with one summary line on
stdout. Errors are one line on stderr and exit code 1.

Example::

    >>> main(["gc", "/data/events", "--keep-versions", "5", "--dry-run"])   # doctest: +SKIP
    would remove 3 version(s) 0-2, ...
    0
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from datetime import timedelta
from typing import Any

from castsql.errors import CastSQLError, require
from castsql.format import Manifest, TableLog
from castsql.spark.errors import job_errors
from castsql.spark.garbage import format_bytes
from castsql.storage import open_storage

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_FORMATS = ("parquet", "csv", "json")


class UsageError(CastSQLError):
    """A command-line argument is malformed."""


def parse_age(text: str) -> timedelta:
    """``7d`` -> 7 days; ``12h``, ``30m``, ``45s`` likewise; ``0`` needs no unit.

    >>> parse_age("36h")
    datetime.timedelta(days=1, seconds=43200)
    >>> parse_age("0")
    datetime.timedelta(0)
    """
    if text.strip() in ("0", "0.0"):
        return timedelta(0)
    m = _AGE.match(text)
    if not m:
        raise UsageError(f"{text!r} is not an age (use a number and a unit: 7d, 12h, 30m, 45s)")
    return timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="castsql", description="Write CastSQL tables with Spark.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("append", help="append rows from files as one new version")
    a.add_argument("uri")
    a.add_argument("--from", dest="sources", nargs="+", required=True, metavar="FILE")
    a.add_argument("--format", choices=_FORMATS, help="input format (default: from the file name, else parquet)")
    a.add_argument("--primary-key", metavar="COL", help="primary key column (when the table is created)")
    d = sub.add_parser("delete", help="delete the rows matching a SQL condition")
    d.add_argument("uri")
    d.add_argument("--where", required=True, metavar="COND")
    c = sub.add_parser("compact", help="rewrite heavily deleted files, merge tombstones")
    c.add_argument("uri")
    c.add_argument("--threshold", type=float, default=0.5, metavar="F")
    g = sub.add_parser("gc", help="remove old versions and unreferenced objects")
    g.add_argument("uri")
    g.add_argument("--keep-versions", type=int, metavar="N")
    g.add_argument("--older-than", type=parse_age, metavar="AGE")
    g.add_argument("--grace", type=parse_age, default=timedelta(days=7), metavar="AGE")
    g.add_argument("--dry-run", action="store_true")
    r = sub.add_parser("restore", help="commit one version whose content equals an older one (no data rewritten)")
    r.add_argument("uri")
    at = r.add_mutually_exclusive_group(required=True)
    at.add_argument("--version", type=int, metavar="N")
    at.add_argument("--timestamp", metavar="T", help="the newest version committed at or before T (UTC unless given)")
    u = sub.add_parser("upgrade", help="make a format version 1 table version 2 (one commit, no data change)")
    u.add_argument("uri")
    return p


def _input_format(sources: list[str], given: str | None) -> str:
    if given:
        return given
    exts = {os.path.splitext(s)[1].lower().lstrip(".") for s in sources}
    exts = {"json" if e in ("jsonl", "ndjson") else e for e in exts}
    if len(exts) == 1 and (ext := exts.pop()) in _FORMATS:
        return ext
    return "parquet"


def _summary(verb: str, m: Manifest) -> str:
    s = m.summary
    parts = [f"{verb}: committed version {m.version}"]
    if "added_files" in s:
        parts.append(
            f"{s['added_files']} file(s), {s.get('added_rows', 0):,} row(s), {format_bytes(s.get('added_bytes', 0))}"
        )
    if "deleted_rows" in s:
        parts.append(f"{s['deleted_rows']:,} row(s) deleted in {s.get('tombstone_records', 0)} tombstone record(s)")
    if "removed_files" in s:
        parts.append(f"{s['removed_files']} file(s) removed, {s.get('removed_tombstones', 0)} tombstone file(s) merged")
    live = m.total_rows
    parts.append(f"table: {m.file_count} file(s), {live:,} stored row(s)")
    return "; ".join(parts)


def _run(args: Any) -> str:
    if args.command == "upgrade":
        log = TableLog(open_storage(args.uri))
        m = log.upgrade()
        if m is None:
            return f"upgrade: {log.uri} is already format version {log.latest().format_version}; nothing committed"
        objects = len(m.file_objects) + len(m.delete_objects)
        return f"upgrade: committed version {m.version} (format version 2; {m.file_count} file(s), {objects} object(s))"
    if args.command == "restore":
        from castsql.format.manifest import parse_time

        log = TableLog(open_storage(args.uri))
        version = args.version
        if args.timestamp is not None:
            try:
                version = log.version_at(parse_time(args.timestamp))
            except ValueError:
                raise UsageError(f"restore: {args.timestamp!r} is not a timestamp") from None
        m = log.restore(version)
        if m is None:
            return f"restore: version {log.latest().version} already equals version {version}; nothing committed"
        return _summary(f"restore to version {version}", m)
    if args.command == "gc":
        from castsql.spark.garbage import gc

        return (
            "gc: "
            + gc(
                args.uri,
                keep_versions=args.keep_versions,
                older_than=args.older_than,
                grace=args.grace,
                dry_run=args.dry_run,
            ).summary()
        )
    if args.command == "append":
        missing = [s for s in args.sources if not os.path.exists(s)]
        if missing:
            raise UsageError(f"append: no such file: {missing[0]}")
    else:
        TableLog(open_storage(args.uri)).latest()  # a path that is no table fails before Spark starts
        if args.command == "compact" and not 0 < args.threshold <= 1:
            raise UsageError(f"compact: --threshold must be in (0, 1], got {args.threshold}")

    require("pyspark", "spark", f"castsql {args.command}")
    from castsql.spark.session import spark_session

    # PySpark logs every analysis error as a JSON record on stderr before
    # raising it; the CLI reports the error itself, in one line.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    spark = spark_session(f"castsql {args.command}", progress=True)
    # The JVM's own ERROR lines for a failed task would repeat, with stack
    # traces, what the one error line below says.
    spark.sparkContext.setLogLevel("OFF")
    try:
        return _spark_command(spark, args)
    finally:
        spark.sparkContext.setLogLevel("WARN")  # as log4j2.properties has it, for whoever shares the session


def _spark_command(spark: Any, args: Any) -> str:
    if args.command == "append":
        from castsql.spark.writer import append

        fmt = _input_format(args.sources, args.format)
        reader = spark.read.format(fmt)
        if fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        with job_errors("append: reading the input"):
            df = _fit_to_table(args.uri, reader.load([os.path.abspath(s) for s in args.sources]))
        return _summary("append", append(spark, args.uri, df, primary_key=args.primary_key))
    if args.command == "delete":
        from castsql.spark.deleter import delete

        m = delete(spark, args.uri, args.where)
        return "delete: no row matched; nothing committed" if m is None else _summary("delete", m)
    from castsql.spark.compactor import compact

    m = compact(spark, args.uri, threshold=args.threshold)
    return "compact: nothing to compact; nothing committed" if m is None else _summary("compact", m)


def _clear_progress_bar() -> None:
    # A failed job leaves Spark's progress bar half drawn on the terminal line.
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def _is_analysis_error(e: BaseException) -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark.errors import AnalysisException

    return isinstance(e, AnalysisException)


def _fit_to_table(uri: str, df: Any) -> Any:
    """Cast the columns of an input file to an existing table's types.

    CSV and JSON carry no schema: Spark infers INT for small numbers and
    STRING for times. Columns are matched by name; missing or extra columns are
    left for append's schema check to report.
    """
    from castsql.errors import TableNotFound
    from castsql.spark.types import spark_type

    try:
        schema = TableLog(open_storage(uri)).latest().schema
    except TableNotFound:
        return df
    if {c.lower() for c in df.columns} != {n.lower() for n in schema.names}:
        return df
    by_lower = {c.lower(): c for c in df.columns}
    return df.select(*[df[by_lower[f.name.lower()]].cast(spark_type(f.type)).alias(f.name) for f in schema.to_arrow()])


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    if _is_analysis_error(e):
        # Spark's messages carry the query plan and SQLSTATE after the first line.
        text = text.splitlines()[0] if text else type(e).__name__
        text = re.sub(r"\s*SQLSTATE: \w+", "", text)
    return " ".join(text.split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one writer subcommand; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "castsql"
    try:
        args = _parser().parse_args(argv)
        line = _run(args)
    except CastSQLError as e:
        _clear_progress_bar()
        print(f"castsql {command}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:
        # Spark's own errors for what the user typed: a condition that does not
        # parse or names unknown columns, input files Spark cannot read.
        # Anything else is a bug and keeps its traceback.
        if not _is_analysis_error(e):
            raise
        what = "bad condition" if command == "delete" else "Spark refused the input"
        _clear_progress_bar()
        print(f"castsql {command}: error: {what}: {_one_line(e)}", file=sys.stderr)
        return 1
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
