"""The manifest commands: ``gc``, ``restore``, ``upgrade``, ``alter``, ``export``.

They need no engine: each commits (or reads) manifests and returns its
summary line. Each command's arguments are added by the function beside its
handler; :mod:`castsql.cli.registry` pairs them.

Example::

    >>> from castsql.cli import main
    >>> main(["gc", "/data/events", "--keep-versions", "5", "--dry-run"])   # doctest: +SKIP
    gc: would remove 3 version(s) 0-2, ...
    0
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from castsql.cli.common import UsageError, parse_age, schema_changes, set_properties, summary


def gc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    p.add_argument("--keep-versions", type=int, metavar="N")
    p.add_argument("--older-than", type=parse_age, metavar="AGE")
    p.add_argument("--grace", type=parse_age, default=timedelta(days=7), metavar="AGE")
    p.add_argument("--dry-run", action="store_true")


def gc(args: argparse.Namespace) -> str:
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


def restore_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")
    at = p.add_mutually_exclusive_group(required=True)
    at.add_argument("--version", type=int, metavar="N")
    at.add_argument("--timestamp", metavar="T", help="the newest version committed at or before T (UTC unless given)")


def restore(args: argparse.Namespace) -> str:
    from castsql.format import TableLog
    from castsql.format.manifest import parse_time
    from castsql.storage import open_storage

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
    return summary(f"restore to version {version}", m)


def upgrade_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri")


def upgrade(args: argparse.Namespace) -> str:
    from castsql.format import TableLog
    from castsql.storage import open_storage

    log = TableLog(open_storage(args.uri))
    m = log.upgrade()
    if m is None:
        return f"upgrade: {log.uri} is already format version {log.latest().format_version}; nothing committed"
    objects = len(m.file_objects) + len(m.delete_objects)
    return f"upgrade: committed version {m.version} (format version 2; {m.file_count} file(s), {objects} object(s))"


def alter_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Schema changes are one version; property changes another (operation SET PROPERTIES), as "
        "Delta's ALTER TABLE ... SET TBLPROPERTIES: castsql.changeDataFeed, castsql.autoCompact, "
        "castsql.mirror.delta, castsql.mirror.iceberg and the others of docs/PYTHON.md, or any name of your own."
    )
    p.add_argument("uri")
    p.add_argument("--add-column", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    p.add_argument("--widen", nargs=2, action="append", default=[], metavar=("NAME", "TYPE"))
    p.add_argument("--set-property", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--unset-property", action="append", default=[], metavar="NAME")


def alter(args: argparse.Namespace) -> str:
    from castsql.format import TableLog
    from castsql.format.properties import check
    from castsql.storage import open_storage

    props: dict[str, str | None] = dict(set_properties(args.set_property, "alter"))
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
            else f"committed version {m.version}; {schema_changes(m.summary)[0].removeprefix('schema: ')}"
        )  # fmt: skip
    if props:
        m = log.set_properties(props)
        committed |= m is not None
        said = ", ".join(f"{k} = {v}" if v is not None else f"{k} unset" for k, v in props.items())
        out.append(f"{log.uri} already has those properties" if m is None else f"committed version {m.version}; {said}")
    return f"alter: {'; '.join(out)}" + ("" if committed else "; nothing committed")


def export_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Write the table's versions as a Delta log (Delta version N = CastSQL version N) and/or "
        "Iceberg metadata (snapshot id N = CastSQL version N) that other engines read: DuckDB's delta_scan and "
        "iceberg_scan, deltalake, PyIceberg, polars, Spark's and Trino's connectors. Only versions not mirrored "
        "yet are written; no data file is copied. See docs/OTHER_ENGINES.md."
    )
    p.add_argument("uri")
    p.add_argument("--delta", action="store_true", help="a Delta log: _delta_log/, deletion vectors in _delta_dv/")
    p.add_argument(
        "--iceberg",
        action="store_true",
        help="Iceberg metadata: _iceberg/metadata/ (format version 2, position deletes; 3, deletion vectors, "
        "with the table property castsql.mirror.iceberg.formatVersion=3)",
    )
    p.add_argument("--version", type=int, metavar="N", help="mirror up to version N (default: the latest)")


def export(args: argparse.Namespace) -> str:
    if not args.delta and not args.iceberg:
        raise UsageError("give --delta, --iceberg or both")
    from castsql.format import TableLog
    from castsql.storage import open_storage
    from castsql.write.garbage import format_bytes

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
