"""The writer subcommands of ``castsql``: append, delete, update, merge, compact, gc, restore, upgrade, alter.

``castsql.cli`` hands them over with ``argv[0]`` the subcommand::

    castsql append URI --from FILE... [--format parquet|csv|json] [--primary-key COL] [--set-property NAME=VALUE]...
                  [--engine duckdb|spark]
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
Spark jobs (:mod:`castsql.spark.cli`), for tables beyond one machine; both
commit through the same rules.

Example::

    >>> main(["gc", "/data/events", "--keep-versions", "5", "--dry-run"])   # doctest: +SKIP
    would remove 3 version(s) 0-2, ...
    0
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from castsql.errors import CastSQLError, one_line
from castsql.format import Manifest, TableLog
from castsql.format.properties import check
from castsql.storage import open_storage
from castsql.write.cdc import CdcMetrics
from castsql.write.garbage import format_bytes

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_FORMATS = ("parquet", "csv", "json")
_MERGE_FORMATS = (*_FORMATS, "debezium")  # Debezium change events, JSON lines (castsql.write.debezium)
_ENGINES = ("spark", "duckdb")
_SET = re.compile(r"^\s*(`[^`]+`|\"[^\"]+\"|[A-Za-z_][\w$]*)\s*=(?!=)\s*(.*\S)\s*$", re.S)


class UsageError(CastSQLError):
    """A command-line argument is malformed (printed after ``castsql COMMAND: error:``)."""


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
        raise UsageError(message)  # printed after "castsql COMMAND: error:"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="castsql", description="Write CastSQL tables: in this process, or as Spark jobs (--engine spark).")
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
    a.add_argument(
        "--set-property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a table property of the table this append creates, in its version 0 (repeatable; as castsql alter's). "
        "On an existing table it must be what the table has",
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
    m.add_argument(
        "--format",
        choices=_MERGE_FORMATS,
        help="input format (default: from the file name, else parquet); debezium: Debezium change events, "
        "applied as a CDC batch (operation and sequence from the envelope)",
    )
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
        help="a CDC batch (Table.apply_cdc): rows whose COL is one of --delete-values delete their key, "
        "--upsert-values upsert it, anything else is refused; the column is not stored",
    )
    m.add_argument(
        "--sequence",
        metavar="COL[,COL]",
        help="with --op-column: the column(s) ordering each key's changes, across batches too (stored: a late or "
        "replayed change never rolls a row back, a deleted key stays deleted); without it: keep only the last "
        "row of each key by COL",
    )
    m.add_argument("--delete-values", default="d,delete", metavar="V[,V]", help="--op-column values that delete")
    m.add_argument(
        "--upsert-values",
        default="i,u,c,r,insert,update,upsert",
        metavar="V[,V]",
        help="--op-column values that upsert",
    )
    m.add_argument(
        "--partial",
        action="store_true",
        default=None,
        help="CDC: table columns the batch lacks keep their stored values (--format debezium: always)",
    )
    m.add_argument(
        "--unavailable", metavar="TEXT", help="CDC: a value meaning 'unchanged' (Debezium's unchanged TOAST columns)"
    )
    m.add_argument("--app-id", metavar="NAME", help="CDC: the writer's name, with --batch-id (Delta's txnAppId)")
    m.add_argument(
        "--batch-id",
        type=int,
        metavar="N",
        help="CDC: the batch's number; a batch at or below the last one committed for --app-id commits nothing",
    )
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
    al = sub.add_parser(
        "alter",
        help="add nullable columns, widen column types, or set table properties (no data rewritten)",
        description="Schema changes are one version; property changes another (operation SET PROPERTIES), as "
        "Delta's ALTER TABLE ... SET TBLPROPERTIES: castsql.changeDataFeed, castsql.autoCompact, "
        "castsql.mirror.delta, castsql.mirror.iceberg and the others of docs/PYTHON.md, or any name of your own.",
    )
    al.add_argument("uri")
    al.add_argument("--add-column", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    al.add_argument("--widen", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    al.add_argument("--set-property", action="append", default=[], metavar="NAME=VALUE")
    al.add_argument("--unset-property", action="append", default=[], metavar="NAME")
    ex = sub.add_parser(
        "export",
        help="mirror versions as a Delta log and/or Iceberg metadata next to the table, over its own data files",
        description="Write the table's versions as a Delta log (Delta version N = CastSQL version N) and/or "
        "Iceberg metadata (snapshot id N = CastSQL version N) that other engines read: DuckDB's delta_scan and "
        "iceberg_scan, deltalake, PyIceberg, polars, Spark's and Trino's connectors. Only versions not mirrored "
        "yet are written; no data file is copied. See docs/OTHER_ENGINES.md.",
    )
    ex.add_argument("uri")
    ex.add_argument("--delta", action="store_true", help="a Delta log: _delta_log/, deletion vectors in _delta_dv/")
    ex.add_argument(
        "--iceberg",
        action="store_true",
        help="Iceberg metadata: _iceberg/metadata/ (format version 2, position deletes; 3, deletion vectors, "
        "with the table property castsql.mirror.iceberg.formatVersion=3)",
    )
    ex.add_argument("--version", type=int, metavar="N", help="mirror up to version N (default: the latest)")
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


def _set_properties(items: list[str], command: str) -> dict[str, str]:
    """``--set-property NAME=VALUE`` flags as a dict (the last one of a name wins)."""
    props: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"{command}: --set-property {item!r}: give NAME=VALUE")
        props[name.strip()] = value.strip()
    return props


def _alter(args: Any) -> str:
    props: dict[str, str | None] = dict(_set_properties(args.set_property, "alter"))
    props.update(dict.fromkeys(args.unset_property))
    schema = bool(args.add_column or args.widen)
    if not schema and not props:
        raise UsageError(
            "alter: give --add-column NAME TYPE, --widen NAME TYPE, --set-property NAME=VALUE or --unset-property NAME"
        )
    log = TableLog(open_storage(args.uri))
    if props:
        check(props, f"table {log.uri}: alter")  # refused before the schema change commits
    out, committed = [], False
    if schema:
        m = log.alter(add=dict(args.add_column), widen=dict(args.widen))
        committed |= m is not None
        out.append(
            f"{log.uri} already has that schema" if m is None
            else f"committed version {m.version}; {_schema_changes(m.summary)[0].removeprefix('schema: ')}"
        )  # fmt: skip
    if props:
        m = log.set_properties(props)
        committed |= m is not None
        said = ", ".join(f"{k} = {v}" if v is not None else f"{k} unset" for k, v in props.items())
        out.append(f"{log.uri} already has those properties" if m is None else f"committed version {m.version}; {said}")
    return f"alter: {'; '.join(out)}" + ("" if committed else "; nothing committed")


def _run(args: Any) -> str:
    manifest_only = _MANIFEST_COMMANDS.get(args.command)
    if manifest_only is not None:  # no Spark: manifest commits (or reads)
        return manifest_only(args)
    _check_writer_args(args)
    args.input_format = _input_format(args.sources, args.format) if args.command in ("append", "merge") else None
    cdc = args.command == "merge" and (args.op_column or args.format == "debezium")
    args.cdc = _cdc_options(args) if cdc else None
    if getattr(args, "engine", "spark") == "duckdb":
        result = _embedded_command(args)
    else:
        from castsql.spark.cli import run

        result = run(args, _clauses)
    # One summary line, whichever engine wrote.
    if args.command == "merge":
        return _merge_summary(args.uri, result)
    if result is None:
        what = "nothing to compact" if args.command == "compact" else "no row matched"
        return f"{args.command}: {what}; nothing committed"
    return _summary(args.command, result)


def _upgrade(args: Any) -> str:
    log = TableLog(open_storage(args.uri))
    m = log.upgrade()
    if m is None:
        return f"upgrade: {log.uri} is already format version {log.latest().format_version}; nothing committed"
    objects = len(m.file_objects) + len(m.delete_objects)
    return f"upgrade: committed version {m.version} (format version 2; {m.file_count} file(s), {objects} object(s))"


def _restore(args: Any) -> str:
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


def _export(args: Any) -> str:
    if not args.delta and not args.iceberg:
        raise UsageError("give --delta, --iceberg or both")
    log = TableLog(open_storage(args.uri))
    lines = []
    from castsql.mirror import MIRRORS, exporter

    for flag, (_, name, _, _) in MIRRORS.items():
        if not getattr(args, flag):
            continue
        r = exporter(flag)(log, args.version)
        if not r.written:
            lines.append(f"export: the {name} of {log.uri} already holds version {r.latest}; nothing written")
            continue
        span = f"{r.written[0]}-{r.written[-1]}" if len(r.written) > 1 else str(r.written[0])
        deletes = f"{r.vectors} deletion vector(s)" if flag == "delta" else f"{r.delete_files} delete file(s)"
        lines.append(
            f"export: {name} of {log.uri} now at version {r.latest} (wrote version(s) {span}: "
            f"{len(r.written)} version(s), {deletes}, {format_bytes(r.bytes_written)})"
        )
    return "\n".join(lines)


def _gc(args: Any) -> str:
    from castsql.write.garbage import gc

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


def _check_writer_args(args: Any) -> None:
    """Refuse what the writer commands cannot run as given, before any file
    is read or Spark starts; parse ``--set`` and ``--set-property``."""
    if args.command in ("append", "merge"):
        missing = [s for s in args.sources if not os.path.exists(s)]
        if missing:
            raise UsageError(f"{args.command}: no such file: {missing[0]}")
    if args.command == "append":
        args.properties = _set_properties(args.set_property, "append")
        check(args.properties, f"table {args.uri}: append")  # refused before any file is read
    if args.command == "merge":
        _check_merge_args(args)
    if args.command == "update":
        args.assign = dict(parse_assignment(a) for a in args.assignments)
    if args.command in ("delete", "update") and args.where is not None and not args.where.strip():
        raise UsageError(f"{args.command}: --where is empty (to change every row, say so: --where true)")
    if args.command != "append":
        TableLog(open_storage(args.uri)).latest()  # a path that is no table fails before Spark starts
        if args.command == "compact" and not 0 < args.threshold <= 1:
            raise UsageError(f"compact: --threshold must be in (0, 1], got {args.threshold}")
    spark_compact = args.command == "compact" and args.engine == "spark"
    if spark_compact and (args.target_file_size is not None or args.sort_by is not None):
        raise UsageError("compact: --target-file-size and --sort-by need --engine duckdb")


def _check_merge_args(args: Any) -> None:
    """The flags of one merge go together: a CDC batch (--op-column, Debezium)
    makes its own clauses; CDC's flags need one; --sequence on a CDC-ordered
    table is a CDC batch."""
    cdc = bool(args.op_column or args.format == "debezium")
    if args.no_update and args.update_all:
        raise UsageError("merge: --update-all and --no-update contradict each other")
    if cdc:
        flags = {
            "--delete-matched-when": args.delete_matched_when,
            "--no-update": args.no_update,
            "--no-insert": args.no_insert,
            "--delete-not-matched-by-source": args.delete_not_matched_by_source,
        }
        clash = [f for f, on in flags.items() if on]
        if clash:
            what = "--op-column" if args.op_column else "--format debezium"
            raise UsageError(f"merge: {what} makes the clauses itself; it does not go with {clash[0]}")
    else:
        cdc_only = {"--partial": args.partial, "--unavailable": args.unavailable, "--app-id": args.app_id,
                    "--batch-id": args.batch_id is not None}  # fmt: skip
        wrong = [f for f, on in cdc_only.items() if on]
        if wrong:
            raise UsageError(f"merge: {wrong[0]} goes with a CDC batch (--op-column or --format debezium)")
    if args.sequence and not cdc:
        head = TableLog(open_storage(args.uri)).latest()
        if head.cdc is not None:
            raise UsageError(
                f"merge: table {args.uri} orders CDC changes by ({', '.join(head.cdc.sequence)}); a merge with "
                "--sequence on it is a CDC batch: give --op-column (a plain merge would ignore its delete markers)"
            )
    if args.sequence and not args.op_column and args.engine == "spark":
        raise UsageError("merge: --sequence without --op-column needs --engine duckdb")


# The commands that need no engine: their handlers, by name.
_MANIFEST_COMMANDS: dict[str, Callable[[Any], str]] = {
    "alter": _alter,
    "upgrade": _upgrade,
    "restore": _restore,
    "export": _export,
    "gc": _gc,
}


def _cdc_options(args: Any) -> dict[str, Any]:
    """``merge --op-column``'s flags as the keyword arguments of apply_cdc and cdc_merge."""
    return {
        "key": args.on.split(","),
        "op_column": args.op_column,
        "sequence": args.sequence.split(",") if args.sequence else None,
        "delete_values": tuple(args.delete_values.split(",")),
        "upsert_values": tuple(args.upsert_values.split(",")),
        "partial": args.partial,
        "unavailable": args.unavailable,
        "app_id": args.app_id,
        "batch_id": args.batch_id,
        "merge_schema": args.merge_schema,
        "format": "debezium" if args.format == "debezium" else "rows",
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
    cdc = ""
    if isinstance(metrics, CdcMetrics):
        if metrics.batch_replayed:
            return "merge: this batch id was already committed for its --app-id; nothing committed"
        cdc = (
            f"; changes: {metrics.num_changes_applied:,} applied, {metrics.num_changes_stale:,} stale, "
            f"{metrics.num_changes_superseded:,} superseded in the batch"
        )
    if metrics.version is None:
        return f"merge: no row changed ({metrics.num_source_rows:,} source row(s){cdc}); nothing committed"
    m = TableLog(open_storage(uri, s3=s3)).manifest(metrics.version)
    records = metrics.extra.get("tombstone_records", 0)
    return (
        f"merge: committed version {metrics.version}; {metrics.num_target_rows_inserted:,} inserted, "
        f"{metrics.num_target_rows_updated:,} updated, {metrics.num_target_rows_deleted:,} deleted "
        f"({metrics.num_source_rows:,} source row(s){cdc}); {metrics.num_target_files_added} file(s), "
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


def _embedded_command(args: Any) -> Any:
    """append / delete / update / merge / compact with the embedded engine:
    DuckDB in this process, no JVM; pyspark is never imported. What it
    committed (a manifest, the merge's metrics), or None when nothing changed."""
    import castsql

    if args.command == "compact":
        with castsql.open(args.uri) as table:
            return table.compact(threshold=args.threshold, target_file_size=args.target_file_size, sort_by=args.sort_by)
    if args.command == "append":
        data = _read_arrow(args.sources, args.input_format, args.uri, "append")
        return castsql.write_table(
            args.uri,
            data,
            mode="append",
            primary_key=args.primary_key,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
            properties=args.properties or None,
        )
    with castsql.open(args.uri) as table:
        if args.command == "delete":
            return table.delete(args.where)
        if args.command == "update":
            return table.update(args.assign, args.where, merge_schema=args.merge_schema)
        if args.cdc is not None and args.input_format == "debezium":
            from castsql.write.debezium import read_events

            return table.apply_cdc(read_events(args.sources, "merge"), **args.cdc)
        source = _read_arrow(args.sources, args.input_format, args.uri)
        if args.cdc is not None:
            return table.apply_cdc(source, **args.cdc)
        if args.sequence:
            from castsql.write.cdc import latest_per_key

            source = latest_per_key(source, args.on.split(","), args.sequence)
        builder = table.merge(
            source, on=args.on, merge_schema=args.merge_schema, allow_duplicate_keys=args.allow_duplicate_keys
        )
        return _clauses(builder, args).execute()


def _clear_progress_bar() -> None:
    # A failed job leaves Spark's progress bar half drawn on the terminal line.
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def _is_analysis_error(e: BaseException) -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark.errors import AnalysisException

    return isinstance(e, AnalysisException)


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
    except KeyboardInterrupt:
        # A version is committed once its manifest is written (FORMAT.md §6);
        # whether this one got that far is the table's to say.
        _clear_progress_bar()
        print(
            f"castsql {command}: interrupted; a version it committed before that stays "
            "(DESCRIBE HISTORY shows the latest)",
            file=sys.stderr,
        )
        return 130
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
