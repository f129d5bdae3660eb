"""The commands that write rows: ``append``, ``delete``, ``update``, ``merge``,
``compact``, each run by either engine (``--engine duckdb``, the default, in
this process; ``--engine spark``, :mod:`castsql.cli.spark`), each ending with
one summary line whichever engine wrote.

Each command's arguments are added by the function beside it; they share one
handler, :func:`run`: check the arguments before any file is read or Spark
starts, run the engine, say what it committed.

Example::

    >>> from castsql.cli import main
    >>> main(["delete", "/data/events", "--where", "id = 7"])   # doctest: +SKIP
    delete: committed version 4; 1 row(s) deleted in 1 tombstone record(s); table: 3 file(s), 999 stored row(s)
    0
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from castsql.cli.common import UsageError, parse_assignment, schema_changes, set_properties, summary

_FORMATS = ("parquet", "csv", "json")
_MERGE_FORMATS = (*_FORMATS, "debezium")  # Debezium change events, JSON lines (castsql.write.debezium)
_ENGINES = ("spark", "duckdb")


def append_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    p.add_argument("--from", dest="sources", nargs="+", required=True, metavar="FILE")
    p.add_argument("--format", choices=_FORMATS, help="input format (default: from the file name, else parquet)")
    p.add_argument("--primary-key", metavar="COL", help="primary key column (when the table is created)")
    p.add_argument(
        "--merge-schema", action="store_true", help="add the input's new columns and widen columns (FORMAT.md §3.4)"
    )
    p.add_argument(
        "--allow-duplicate-keys", action="store_true", help="do not refuse rows whose primary key is already taken"
    )
    p.add_argument(
        "--set-property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a table property of the table this append creates, in its version 0 (repeatable; as castsql alter's). "
        "On an existing table it must be what the table has",
    )
    _engine(p)


def delete_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    p.add_argument("--where", required=True, metavar="COND")
    _engine(p)


def update_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    p.add_argument("--set", dest="assignments", action="append", required=True, metavar="'COL = EXPR'")
    p.add_argument("--where", metavar="COND", help="the rows to update (default: every row)")
    p.add_argument(
        "--merge-schema",
        action="store_true",
        help="add a --set column the table lacks (of its expression's type) and widen columns (FORMAT.md §3.4)",
    )
    _engine(p)


def merge_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Merge (upsert) the rows of FILEs into the table, Delta Lake's MERGE: by default a source row "
        "whose key matches a table row replaces it (every column) and the other source rows are inserted. "
        "Conditions are SQL over the aliases target and source."
    )
    p.add_argument("uri")
    p.add_argument("--from", dest="sources", nargs="+", required=True, metavar="FILE")
    p.add_argument(
        "--format",
        choices=_MERGE_FORMATS,
        help="input format (default: from the file name, else parquet); debezium: Debezium change events, "
        "applied as a CDC batch (operation and sequence from the envelope)",
    )
    p.add_argument("--on", required=True, metavar="COL[,COL]", help="key column(s) matching source rows to table rows")
    p.add_argument(
        "--delete-matched-when",
        metavar="COND",
        help="delete matched rows for which COND holds (e.g. \"source.op = 'D'\"); source rows for which it "
        "holds are never inserted",
    )
    p.add_argument("--no-update", action="store_true", help="leave matched rows as they are")
    p.add_argument("--update-all", action="store_true", help="replace matched rows by the source's (the default)")
    p.add_argument("--no-insert", action="store_true", help="do not insert source rows that match no table row")
    p.add_argument(
        "--delete-not-matched-by-source", action="store_true", help="delete table rows no source row matches"
    )
    p.add_argument(
        "--merge-schema", action="store_true", help="add the input's new columns and widen columns (FORMAT.md §3.4)"
    )
    p.add_argument(
        "--allow-duplicate-keys",
        action="store_true",
        help="do not refuse inserted rows whose primary key is NULL, repeated or already taken",
    )
    p.add_argument(
        "--op-column",
        metavar="COL",
        help="a CDC batch (Table.apply_cdc): rows whose COL is one of --delete-values delete their key, "
        "--upsert-values upsert it, anything else is refused; the column is not stored",
    )
    p.add_argument(
        "--sequence",
        metavar="COL[,COL]",
        help="with --op-column: the column(s) ordering each key's changes, across batches too (stored: a late or "
        "replayed change never rolls a row back, a deleted key stays deleted); without it: keep only the last "
        "row of each key by COL",
    )
    p.add_argument("--delete-values", default="d,delete", metavar="V[,V]", help="--op-column values that delete")
    p.add_argument(
        "--upsert-values",
        default="i,u,c,r,insert,update,upsert",
        metavar="V[,V]",
        help="--op-column values that upsert",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        default=None,
        help="CDC: table columns the batch lacks keep their stored values (--format debezium: always)",
    )
    p.add_argument(
        "--unavailable", metavar="TEXT", help="CDC: a value meaning 'unchanged' (Debezium's unchanged TOAST columns)"
    )
    p.add_argument("--app-id", metavar="NAME", help="CDC: the writer's name, with --batch-id (Delta's txnAppId)")
    p.add_argument(
        "--batch-id",
        type=int,
        metavar="N",
        help="CDC: the batch's number; a batch at or below the last one committed for --app-id commits nothing",
    )
    _engine(p)


def compact_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    p.add_argument("--threshold", type=float, default=0.5, metavar="F")
    p.add_argument(
        "--target-file-size",
        type=int,
        metavar="BYTES",
        help="pack small files into files of about this size (default 256 MB; the duckdb engine)",
    )
    p.add_argument("--sort-by", metavar="COL", help="order each new file by this column (the duckdb engine)")
    _engine(p)


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


def run(args: argparse.Namespace) -> str:
    """Run one of append, delete, update, merge, compact (``args.command``)
    with the engine ``--engine`` names; its summary line."""
    _check_writer_args(args)
    args.input_format = _input_format(args.sources, args.format) if args.command in ("append", "merge") else None
    cdc = args.command == "merge" and (args.op_column or args.format == "debezium")
    args.cdc = _cdc_options(args) if cdc else None
    if getattr(args, "engine", "spark") == "duckdb":
        result = _embedded_command(args)
    else:
        from castsql.cli.spark import run

        result = run(args, _clauses)
    # One summary line, whichever engine wrote.
    if args.command == "merge":
        return _merge_summary(args.uri, result)
    if result is None:
        what = "nothing to compact" if args.command == "compact" else "no row matched"
        return f"{args.command}: {what}; nothing committed"
    return summary(args.command, result)


def _check_writer_args(args: Any) -> None:
    """Refuse what the writer commands cannot run as given, before any file
    is read or Spark starts; parse ``--set`` and ``--set-property``."""
    from castsql.format import TableLog
    from castsql.format.properties import check
    from castsql.storage import open_storage

    if args.command in ("append", "merge"):
        missing = [s for s in args.sources if not os.path.exists(s)]
        if missing:
            raise UsageError(f"{args.command}: no such file: {missing[0]}")
    if args.command == "append":
        args.properties = set_properties(args.set_property, "append")
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
    from castsql.format import TableLog
    from castsql.storage import open_storage

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
    from castsql.format import TableLog
    from castsql.storage import open_storage
    from castsql.write.cdc import CdcMetrics
    from castsql.write.garbage import format_bytes

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
        + "".join(f"{part}; " for part in schema_changes(m.summary))
        + f"table: {m.file_count} file(s), {m.total_rows:,} stored row(s)"
    )


def _embedded_command(args: Any) -> Any:
    """append / delete / update / merge / compact with the embedded engine:
    DuckDB in this process, no JVM; pyspark is never imported. What it
    committed (a manifest, the merge's metrics), or None when nothing changed."""
    import castsql
    from castsql.cli.inputs import read_arrow

    if args.command == "compact":
        with castsql.open(args.uri) as table:
            return table.compact(threshold=args.threshold, target_file_size=args.target_file_size, sort_by=args.sort_by)
    if args.command == "append":
        data = read_arrow(args.sources, args.input_format, args.uri, "append")
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
        source = read_arrow(args.sources, args.input_format, args.uri)
        if args.cdc is not None:
            return table.apply_cdc(source, **args.cdc)
        if args.sequence:
            from castsql.write.cdc import latest_per_key

            source = latest_per_key(source, args.on.split(","), args.sequence)
        builder = table.merge(
            source, on=args.on, merge_schema=args.merge_schema, allow_duplicate_keys=args.allow_duplicate_keys
        )
        return _clauses(builder, args).execute()
