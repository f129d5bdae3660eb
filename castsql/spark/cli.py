"""The writer subcommands of ``castsql``: append, delete, update, merge, compact, gc, restore, upgrade.

``castsql.cli`` hands them over with ``argv[0]`` the subcommand::

    castsql append URI --from FILE... [--format parquet|csv|json] [--primary-key COL] [--engine duckdb|spark]
    castsql delete URI --where "COND" [--engine duckdb|spark]
    castsql update URI --set "COL = EXPR" [--set ...] [--where "COND"] [--merge-schema] [--engine duckdb|spark]
    castsql merge URI --from FILE... --on COL[,COL] [--format F] [--no-update] [--no-insert]
                  [--delete-matched-when "COND"] [--delete-not-matched-by-source] [--merge-schema]
                  [--allow-duplicate-keys] [--op-column COL [--delete-values V,V]] [--sequence COL]
                  [--engine duckdb|spark]
    castsql compact URI [--threshold F] [--target-file-size BYTES] [--sort-by COL] [--engine duckdb|spark]
    castsql gc URI [--keep-versions N] [--older-than AGE] [--grace AGE] [--dry-run]
    castsql restore URI (--version N | --timestamp T)
    castsql upgrade URI

AGE is a number with a unit: ``7d``, ``12h``, ``30m``, ``45s``. Spark's console
progress bar shows while a job runs; the command ends with one summary line on
stdout. Errors are one line on stderr: exit code 2 for a malformed command
line, 1 for everything else; either way nothing is committed.

Every writer runs in this process by default (``--engine duckdb``: the
embedded engine, :mod:`castsql.embedded.writer`, what ``castsql.Table``
uses): no JVM, pyspark never imported; ``append`` creates the table when
there is none, like ``castsql.write_table``, and ``compact`` also packs small
files. ``--engine spark`` runs append, delete, update, merge and compact as
Spark jobs, for tables beyond one machine; both commit through the same rules.

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

import pyarrow as pa

from castsql.errors import CastSQLError, UsageError, one_line, require
from castsql.format import Manifest, TableLog
from castsql.spark.errors import job_errors
from castsql.spark.garbage import format_bytes
from castsql.storage import open_storage

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_FORMATS = ("parquet", "csv", "json")
_ENGINES = ("spark", "duckdb")
_SET = re.compile(r"^\s*(`[^`]+`|\"[^\"]+\"|[A-Za-z_][\w$]*)\s*=(?!=)\s*(.*\S)\s*$", re.S)


def parse_assignment(text: str) -> tuple[str, str]:
    """``--set`` text: ``"v = v * 2"`` -> ``("v", "v * 2")``.

    >>> parse_assignment("amount = amount * 2")
    ('amount', 'amount * 2')
    >>> parse_assignment('"odd name" = 1')
    ('odd name', '1')
    """
    m = _SET.match(text)
    if not m:
        raise UsageError(f"update: --set {text!r} is not an assignment (use COLUMN = EXPRESSION, e.g. 'v = v * 2')")
    name = m.group(1)
    return (name[1:-1] if name[0] in '`"' else name), m.group(2)


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
    a.add_argument(
        "--merge-schema", action="store_true", help="add the input's new columns and widen columns (FORMAT.md §3.4)"
    )
    a.add_argument(
        "--allow-duplicate-keys", action="store_true", help="do not refuse rows whose primary key is already taken"
    )
    _engine(a)
    d = sub.add_parser("delete", help="delete the rows matching a SQL condition (one tombstone, one version)")
    d.add_argument("uri")
    d.add_argument("--where", required=True, metavar="COND")
    _engine(d)
    up = sub.add_parser("update", help="set columns of the rows matching a condition (one version)")
    up.add_argument("uri")
    up.add_argument("--set", dest="assignments", action="append", required=True, metavar="'COL = EXPR'")
    up.add_argument("--where", metavar="COND", help="the rows to update (default: every row)")
    up.add_argument(
        "--merge-schema",
        action="store_true",
        help="add a --set column the table lacks (of its expression's type) and widen columns (FORMAT.md §3.4)",
    )
    _engine(up)
    m = sub.add_parser(
        "merge",
        help="merge rows from files on key columns: update matched rows, insert new ones (one version)",
        description="Merge (upsert) the rows of FILEs into the table, Delta Lake's MERGE: by default a source row "
        "whose key matches a table row replaces it (every column) and the other source rows are inserted. "
        "Conditions are SQL over the aliases target and source.",
    )
    m.add_argument("uri")
    m.add_argument("--from", dest="sources", nargs="+", required=True, metavar="FILE")
    m.add_argument("--format", choices=_FORMATS, help="input format (default: from the file name, else parquet)")
    m.add_argument("--on", required=True, metavar="COL[,COL]", help="key column(s) matching source rows to table rows")
    m.add_argument(
        "--delete-matched-when",
        metavar="COND",
        help="delete matched rows for which COND holds (e.g. \"source.op = 'D'\"); source rows for which it "
        "holds are never inserted",
    )
    m.add_argument("--no-update", action="store_true", help="leave matched rows as they are")
    m.add_argument("--update-all", action="store_true", help="replace matched rows by the source's (the default)")
    m.add_argument("--no-insert", action="store_true", help="do not insert source rows that match no table row")
    m.add_argument(
        "--delete-not-matched-by-source", action="store_true", help="delete table rows no source row matches"
    )
    m.add_argument(
        "--merge-schema", action="store_true", help="add the input's new columns and widen columns (FORMAT.md §3.4)"
    )
    m.add_argument(
        "--allow-duplicate-keys",
        action="store_true",
        help="do not refuse inserted rows whose primary key is NULL, repeated or already taken",
    )
    m.add_argument(
        "--op-column",
        metavar="COL",
        help="a CDC feed: rows whose COL is one of --delete-values delete their key, others upsert it "
        "(castsql.write.cdc.apply_cdc); the column is not stored",
    )
    m.add_argument(
        "--sequence",
        metavar="COL",
        help="keep only the last row of each key by COL (a feed that changes a key several times in one file)",
    )
    m.add_argument("--delete-values", default="D,delete", metavar="V[,V]", help="--op-column values that delete")
    _engine(m)
    c = sub.add_parser("compact", help="pack small files, rewrite heavily deleted ones, merge tombstones")
    c.add_argument("uri")
    c.add_argument("--threshold", type=float, default=0.5, metavar="F")
    c.add_argument(
        "--target-file-size",
        type=int,
        metavar="BYTES",
        help="pack small files into files of about this size (default 256 MB; the duckdb engine)",
    )
    c.add_argument("--sort-by", metavar="COL", help="order each new file by this column (the duckdb engine)")
    _engine(c)
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
    al = sub.add_parser("alter", help="add nullable columns or widen column types (one version, no data rewritten)")
    al.add_argument("uri")
    al.add_argument("--add-column", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    al.add_argument("--widen", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    return p


def _engine(p: argparse.ArgumentParser, default: str = "duckdb") -> None:
    other = "duckdb" if default == "spark" else "spark"
    what = {"spark": "spark (distributed, starts a JVM)", "duckdb": "duckdb (in this process, one machine, no JVM)"}
    p.add_argument(
        "--engine",
        choices=_ENGINES,
        default=default,
        help=f"{what[default]}, the default, or {what[other]}",
    )


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
    if s.get("added_files") or "updated_rows" in s or (verb == "append" and "added_files" in s):
        parts.append(
            f"{s['added_files']} file(s), {s.get('added_rows', 0):,} row(s), {format_bytes(s.get('added_bytes', 0))}"
        )
    if "updated_rows" in s:
        parts.append(f"{s['updated_rows']:,} row(s) replaced in {s.get('tombstone_records', 0)} tombstone record(s)")
    elif "deleted_rows" in s:
        parts.append(f"{s['deleted_rows']:,} row(s) deleted in {s.get('tombstone_records', 0)} tombstone record(s)")
    if "removed_files" in s:
        parts.append(f"{s['removed_files']} file(s) removed, {s.get('removed_tombstones', 0)} tombstone file(s) merged")
    live = m.total_rows
    parts += _schema_changes(s)
    parts.append(f"table: {m.file_count} file(s), {live:,} stored row(s)")
    return "; ".join(parts)


def _schema_changes(summary: dict[str, Any]) -> list[str]:
    """What a ``--merge-schema`` write did to the schema, for its summary line."""
    changed = [f"added {c['name']} {c['type']}" for c in summary.get("added_columns", [])]
    changed += [f"widened {c['name']} {c['from']} -> {c['to']}" for c in summary.get("widened_columns", [])]
    return [f"schema: {', '.join(changed)}"] if changed else []


def _run(args: Any) -> str:
    if args.command == "alter":  # no Spark: a manifest commit
        from castsql.format.change import alter

        if not args.add_column and not args.widen:
            raise UsageError("alter: give --add-column NAME TYPE or --widen NAME TYPE")
        log = TableLog(open_storage(args.uri))
        m = alter(log, add=dict(args.add_column), widen=dict(args.widen))
        if m is None:
            return f"alter: {log.uri} already has that schema; nothing committed"
        return f"alter: committed version {m.version}; {_schema_changes(m.summary)[0].removeprefix('schema: ')}"
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
    if args.command in ("append", "merge"):
        missing = [s for s in args.sources if not os.path.exists(s)]
        if missing:
            raise UsageError(f"{args.command}: no such file: {missing[0]}")
    if args.command == "merge" and args.no_update and args.update_all:
        raise UsageError("merge: --update-all and --no-update contradict each other")
    if args.command == "merge" and args.op_column:
        flags = {
            "--delete-matched-when": args.delete_matched_when,
            "--no-update": args.no_update,
            "--no-insert": args.no_insert,
            "--delete-not-matched-by-source": args.delete_not_matched_by_source,
        }
        clash = [f for f, on in flags.items() if on]
        if clash:
            raise UsageError(f"merge: --op-column makes the clauses itself; it does not go with {clash[0]}")
    if args.command == "merge" and args.sequence and not args.op_column and args.engine == "spark":
        raise UsageError("merge: --sequence without --op-column needs --engine duckdb")
    if args.command == "update":
        args.assign = dict(parse_assignment(a) for a in args.assignments)
    if args.command in ("delete", "update") and args.where is not None and not args.where.strip():
        raise UsageError(f"{args.command}: --where is empty (to change every row, say so: --where true)")
    if args.command != "append":
        TableLog(open_storage(args.uri)).latest()  # a path that is no table fails before Spark starts
        if args.command == "compact" and not 0 < args.threshold <= 1:
            raise UsageError(f"compact: --threshold must be in (0, 1], got {args.threshold}")
    if getattr(args, "engine", "spark") == "duckdb":
        return _embedded_command(args)

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

        df = _read_input(spark, args.uri, args.sources, _input_format(args.sources, args.format), "append")
        m = append(
            spark,
            args.uri,
            df,
            primary_key=args.primary_key,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
        )
        return _summary("append", m)
    if args.command == "delete":
        from castsql.spark.merger import delete

        m = delete(spark, args.uri, args.where)
        return "delete: no row matched; nothing committed" if m is None else _summary("delete", m)
    if args.command == "update":
        from castsql.spark.merger import update

        m = update(spark, args.uri, args.assign, args.where, merge_schema=args.merge_schema)
        return "update: no row matched; nothing committed" if m is None else _summary("update", m)
    if args.command == "merge":
        from castsql.spark.merger import merge

        df = _read_input(spark, args.uri, args.sources, _input_format(args.sources, args.format), "merge")
        if args.op_column:
            from castsql.spark.merger import cdc_merge

            metrics = cdc_merge(spark, args.uri, df, **_cdc_options(args))
            return _merge_summary(args.uri, metrics)
        builder = merge(
            spark,
            args.uri,
            df,
            on=args.on,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
        )
        return _merge_summary(args.uri, _clauses(builder, args).execute())
    from castsql.spark.compactor import compact

    if args.target_file_size is not None or args.sort_by is not None:
        raise UsageError("compact: --target-file-size and --sort-by need --engine duckdb")
    m = compact(spark, args.uri, threshold=args.threshold)
    return "compact: nothing to compact; nothing committed" if m is None else _summary("compact", m)


def _cdc_options(args: Any) -> dict[str, Any]:
    """``merge --op-column``'s flags as the keyword arguments of apply_cdc and cdc_merge."""
    return {
        "key": args.on.split(","),
        "op_column": args.op_column,
        "sequence": args.sequence,
        "delete_values": tuple(args.delete_values.split(",")),
    }


def _clauses(builder: Any, args: Any) -> Any:
    """The merge clauses the flags ask for, in the order first-match-wins needs."""
    cond = args.delete_matched_when
    if cond:
        builder = builder.when_matched_delete(condition=cond)
    if not args.no_update:
        builder = builder.when_matched_update_all()
    if not args.no_insert:
        # A CDC feed's delete of a key the table lacks inserts nothing.
        builder = builder.when_not_matched_insert_all(condition=f"NOT ({cond})" if cond else None)
    if args.delete_not_matched_by_source:
        builder = builder.when_not_matched_by_source_delete()
    return builder


def _merge_summary(uri: str, metrics: Any, s3: Any = None) -> str:
    if metrics.version is None:
        return f"merge: no row changed ({metrics.num_source_rows:,} source row(s)); nothing committed"
    m = TableLog(open_storage(uri, s3=s3)).manifest(metrics.version)
    records = metrics.extra.get("tombstone_records", 0)
    return (
        f"merge: committed version {metrics.version}; {metrics.num_target_rows_inserted:,} inserted, "
        f"{metrics.num_target_rows_updated:,} updated, {metrics.num_target_rows_deleted:,} deleted "
        f"({metrics.num_source_rows:,} source row(s)); {metrics.num_target_files_added} file(s), "
        f"{format_bytes(metrics.bytes_written)}, {records} tombstone record(s); "
        + "".join(f"{part}; " for part in _schema_changes(m.summary))
        + f"table: {m.file_count} file(s), {m.total_rows:,} stored row(s)"
    )


def _read_arrow(sources: list[str], fmt: str, uri: str, what: str = "merge") -> Any:
    """The input files as one Arrow table, for the embedded merge or append (``what``).

    The one type rule (FORMAT.md §3.4): text input (CSV, JSON) is parsed into
    the table's types, and a value that does not parse is refused naming the
    file, the row and the column; typed input (Parquet) is cast only where
    that is a lossless widening, and any other type is left for the merge to
    refuse (or, with ``--merge-schema``, to widen the column to)."""
    import pyarrow as pa

    from castsql.errors import TableNotFound
    from castsql.format.evolution import fits

    try:
        target = {f.name.lower(): f for f in TableLog(open_storage(uri)).latest().schema.to_arrow()}
    except TableNotFound:
        target = {}  # an append that creates the table: the input's own types

    def one(path: str) -> pa.Table:
        try:
            if fmt == "csv":
                import pyarrow.csv as pacsv

                names = pacsv.read_csv(path).column_names
                types = {n: target[n.lower()].type for n in names if n.lower() in target}
                try:
                    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=types))
                except pa.ArrowInvalid:
                    raise _bad_csv_value(path, types, what) from None
            if fmt == "json":
                import pyarrow.json as pajson

                names = pajson.read_json(path).column_names
                schema = pa.schema([target[n.lower()].with_name(n) for n in names if n.lower() in target])
                opts = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
                return pajson.read_json(path, parse_options=opts)
            import pyarrow.parquet as pq

            return pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise CastSQLError(f"{what}: cannot read {path} as {fmt}: {' '.join(str(e).split())}") from None

    tables = [one(p) for p in sources]
    try:
        data = pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as e:
        raise CastSQLError(f"{what}: the input files do not have the same columns: {e}") from None
    cols = []
    for name, col in zip(data.column_names, data.columns, strict=True):
        f = target.get(name.lower())
        if f is not None and col.type != f.type and fits(col.type, f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=data.column_names)


def _bad_csv_value(path: str, types: dict[str, Any], what: str) -> CastSQLError:
    """The first value of a CSV file that does not parse as its column's type,
    as an error naming the file, the row and the column (pyarrow's own names
    neither the row nor the value's column by name)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    strings = pacsv.ConvertOptions(column_types=dict.fromkeys(types, pa.string()), strings_can_be_null=True)
    text = pacsv.read_csv(path, convert_options=strings)
    for name, t in types.items():
        for row, value in enumerate(text.column(name).to_pylist(), start=1):
            if value is None:
                continue
            try:
                pa.array([value], pa.string()).cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return CastSQLError(
                    f"{what}: {path}: data row {row}: column {name!r}: {value!r} is not a {t} value; "
                    "nothing was written"
                )
    return CastSQLError(f"{what}: {path}: a value does not parse as its column's type; nothing was written")


def _embedded_command(args: Any) -> str:
    """append / delete / update / merge with the embedded engine: DuckDB in
    this process, no JVM; pyspark is never imported."""
    import castsql

    if args.command == "compact":
        with castsql.open(args.uri) as table:
            m = table.compact(threshold=args.threshold, target_file_size=args.target_file_size, sort_by=args.sort_by)
        return "compact: nothing to compact; nothing committed" if m is None else _summary("compact", m)
    if args.command == "append":
        data = _read_arrow(args.sources, _input_format(args.sources, args.format), args.uri, "append")
        m = castsql.write_table(
            args.uri,
            data,
            mode="append",
            primary_key=args.primary_key,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
        )
        return _summary("append", m)
    with castsql.open(args.uri) as table:
        if args.command == "delete":
            m = table.delete(args.where)
            return "delete: no row matched; nothing committed" if m is None else _summary("delete", m)
        if args.command == "update":
            m = table.update(args.assign, args.where, merge_schema=args.merge_schema)
            return "update: no row matched; nothing committed" if m is None else _summary("update", m)
        source = _read_arrow(args.sources, _input_format(args.sources, args.format), args.uri)
        if args.op_column:
            from castsql.write.cdc import apply_cdc

            metrics = apply_cdc(table, source, **_cdc_options(args))
            return _merge_summary(args.uri, metrics)
        if args.sequence:
            from castsql.write.cdc import latest_per_key

            source = latest_per_key(source, args.on.split(","), args.sequence)
        builder = table.merge(
            source, on=args.on, merge_schema=args.merge_schema, allow_duplicate_keys=args.allow_duplicate_keys
        )
        return _merge_summary(args.uri, _clauses(builder, args).execute())


def _clear_progress_bar() -> None:
    # A failed job leaves Spark's progress bar half drawn on the terminal line.
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def _is_analysis_error(e: BaseException) -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark.errors import AnalysisException

    return isinstance(e, AnalysisException)


def _read_input(spark: Any, uri: str, sources: list[str], fmt: str, what: str) -> Any:
    """The ``--from`` files as a DataFrame whose table columns have the table's types (:func:`_fit_to_table`).

    CSV carries no types: Spark infers one per column over the files, and an
    inferred type need not be the table's (``1.25`` is a double for a
    ``decimal(5, 2)`` column, ``0007`` an int for a string one, ``2.5`` a
    double for a BIGINT one). So when the table exists, its columns are read
    again as the text in the file and parsed into the table's types, which
    refuses a value that does not parse, or would not be stored exactly,
    naming the file and its line; the input's other columns (new ones, for
    ``--merge-schema``) keep the inferred type."""
    paths = [os.path.abspath(s) for s in sources]
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    with job_errors(f"{what}: reading the input"):
        df = reader.load(paths)
    if fmt == "csv":
        df = _table_columns_as_text(spark, uri, df, paths)
    return _fit_to_table(uri, df, fmt)


def _table_columns_as_text(spark: Any, uri: str, df: Any, paths: list[str]) -> Any:
    """``df`` (CSV read with inferred types) read again with the table's columns as strings."""
    from pyspark.sql.types import StringType, StructField, StructType

    from castsql.errors import TableNotFound

    try:
        names = {n.lower() for n in TableLog(open_storage(uri)).latest().schema.names}
    except TableNotFound:
        return df
    fields = df.schema.fields
    if all(f.name.lower() not in names or isinstance(f.dataType, StringType) for f in fields):
        return df  # already the text
    text = StructType([StructField(f.name, StringType(), True) if f.name.lower() in names else f for f in fields])
    # The same files, header and columns in the same order: the schema applies by position, as inference did.
    return spark.read.format("csv").option("header", "true").schema(text).load(paths)


def _fit_to_table(uri: str, df: Any, fmt: str | None = None) -> Any:
    """Cast the columns of an input file that the table has to the table's types.

    CSV and JSON carry no schema: Spark infers INT for small numbers and
    STRING for times. Columns are matched by name (any case) and the others
    kept as they are (a merge's change-type column); missing or extra columns
    are left for append's schema check to report. Text parsed into a column's
    type is checked first (one Spark job over those columns): a value that
    does not parse is refused naming the file, its line, the column and both
    types (:func:`_refuse_bad_text`), before anything is written.
    """
    from castsql.errors import TableNotFound
    from castsql.spark.types import spark_type

    try:
        schema = TableLog(open_storage(uri)).latest().schema
    except TableNotFound:
        return df

    from castsql.format.evolution import fits

    types = {f.name.lower(): f for f in schema.to_arrow()}
    cols, parsed = [], []
    for field in df.schema.fields:
        c = field.name
        f = types.get(c.lower())
        # Text (what CSV and JSON hold) is parsed into the column's type; any
        # other input type only where the one type rule (FORMAT.md §3.4,
        # castsql.format.evolution.fits) takes it losslessly. The rest is left
        # as it is, for append's check to refuse naming both types.
        src = _arrow_of(field.dataType)
        # Only CSV and JSON hold text for every type; a Parquet string column is a string.
        text = src is not None and pa.types.is_string(src) and fmt in ("csv", "json")
        if f is None or (src is not None and not text and not fits(src, f.type)):
            cols.append(df[c])
        elif text and not pa.types.is_string(f.type):
            want = spark_type(f.type)
            cols.append(df[c].try_cast(want).alias(f.name))
            parsed.append((c, f, want))
        else:
            cols.append(df[c].cast(spark_type(f.type)).alias(f.name))
    if parsed:
        _refuse_bad_text(df, parsed, fmt)
    return df.select(*cols)


def _refuse_bad_text(df: Any, parsed: list[tuple[str, Any, Any]], fmt: str | None) -> None:
    """SchemaMismatch naming file, line, column and both types for the first
    input text that does not parse as its table column's type."""
    from pyspark.sql import functions as F

    from castsql.errors import SchemaMismatch

    conds = [df[c].isNotNull() & df[c].try_cast(want).isNull() for c, _, want in parsed]
    lossy = [_changed(df[c], f.type, want) for c, f, want in parsed]
    bad = conds[0]
    for cond in conds[1:] + lossy:
        bad = bad | cond
    with job_errors("reading the input"):
        flags = [cond.alias(f"_bad{i}") for i, cond in enumerate(conds)]
        flags += [cond.alias(f"_lossy{i}") for i, cond in enumerate(lossy)]
        rows = df.where(bad).select(F.input_file_name().alias("_file"), *flags, *[df[c] for c, _, _ in parsed])
        rows = rows.limit(1).collect()
    if not rows:
        return
    row = rows[0]
    for i, (c, f, _) in enumerate(parsed):
        if not (row[f"_bad{i}"] or row[f"_lossy{i}"]):
            continue
        value = row[c]
        path = _local_path(row["_file"])
        line = _line_of(path, c, value, fmt)
        at = f"{path}" + (f" line {line}" if line is not None else "")
        why = "" if row[f"_bad{i}"] else f" ({_LOSS[_kind(f.type)]})"
        raise SchemaMismatch(
            f"{at}: column {f.name!r}: {value!r} (string in the file) is not a {f.type} value{why}, the table's type; "
            "nothing was written"
        )


# What a value that parses into a column's type would lose (see _changed).
_LOSS = {
    "decimal": "it would be rounded",
    "date": "it has a time of day",
    "float": "it is out of range",
    "naive": "its time zone would be dropped",
}


def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t) and t.tz is None:
        return "naive"
    return None


def _changed(text: Any, t: pa.DataType, want: Any) -> Any:
    """True for text that parses as ``want`` (``t``'s Spark type) only by
    changing its value, which Spark's casts do without a word: a decimal with
    more digits after the point than the column keeps (rounded), a date with a
    time of day (truncated), a number beyond FLOAT's range (infinity), a time
    with a zone other than UTC into a naive timestamp (the zone dropped; naive
    times are UTC wall clock, FORMAT.md §3). Integers need no check (a
    fraction does not parse); floating-point text is rounded by nature."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, DoubleType, TimestampNTZType, TimestampType

    parsed = text.try_cast(want)
    kind = _kind(t)
    if kind == "decimal":
        wide = DecimalType(38, max(18, t.scale))
        exact = text.try_cast(wide)
        return F.coalesce(exact.isNotNull() & parsed.isNotNull() & (parsed.cast(wide) != exact), F.lit(False))
    if kind == "date":
        exact = text.try_cast(TimestampNTZType())
        return F.coalesce(parsed.isNotNull() & (parsed.cast(TimestampNTZType()) != exact), F.lit(False))
    if kind == "float" and pa.types.is_float32(t):
        inf = F.lit(float("inf"))
        return F.coalesce((F.abs(parsed) == inf) & (F.abs(text.try_cast(DoubleType())) != inf), F.lit(False))
    if kind == "naive":
        instant = text.try_cast(TimestampType()).cast(TimestampNTZType())
        return F.coalesce(parsed.isNotNull() & (parsed != instant), F.lit(False))
    return F.lit(False)


def _local_path(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    u = urlparse(uri)
    return unquote(u.path) if u.scheme in ("file", "") else uri


def _line_of(path: str, column: str, value: str, fmt: str | None) -> int | None:
    """The 1-based line of ``path`` where the first record whose ``column`` is
    ``value`` starts (CSV with a header, or JSON lines); None if not found."""
    import csv
    import json

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            if fmt == "json":
                for n, text in enumerate(fh, 1):
                    try:
                        rec = json.loads(text)
                    except ValueError:
                        continue
                    got = {k.lower(): v for k, v in rec.items()}.get(column.lower()) if isinstance(rec, dict) else None
                    if got is not None and str(got) == value:
                        return n
                return None
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                return None
            names = [h.strip().lower() for h in header]
            if column.lower() not in names:
                return None
            i = names.index(column.lower())
            start = reader.line_num + 1
            for rec in reader:
                if i < len(rec) and rec[i] == value:
                    return start
                start = reader.line_num + 1
    except (OSError, UnicodeDecodeError):  # the line is a courtesy: the error names the file anyway
        return None
    return None


def _arrow_of(spark_type_: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(spark_type_, timestamp_utc=True)
    except Exception:
        return None


def _one_line(e: BaseException) -> str:
    if _is_analysis_error(e):
        # Spark's messages carry the query plan and SQLSTATE after the first line.
        return re.sub(r"\s*SQLSTATE: \w+", "", one_line(e))
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one writer subcommand; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "castsql"
    try:
        args = _parser().parse_args(argv)
        line = _run(args)
    except UsageError as e:
        print(f"castsql {command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
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
        what = "bad condition" if command in ("delete", "update") else "Spark refused the input"
        _clear_progress_bar()
        print(f"castsql {command}: error: {what}: {_one_line(e)}", file=sys.stderr)
        return 1
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
