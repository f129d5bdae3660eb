"""The registry of ``castsql`` commands: each one's name, one-line help, the
function that adds its arguments to a parser, and the function that runs it,
in the order ``castsql --help`` lists them. ``castsql`` with no command name
(or a URI) is the shell (:mod:`castsql.shell.app`).

A command with an arguments function is parsed here and its handler returns
its summary line (:func:`castsql.cli.run_command` prints it, or the one-line
error); one without (``demo``, ``ui``) parses its own command line and
returns its exit code.

Example::

    >>> [c.name for c in COMMANDS.values()][:4]
    ['demo', 'ui', 'append', 'delete']
    >>> parser().parse_args(["gc", "/data/events", "--dry-run"]).keep_versions is None
    True
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from castsql.cli import tables, writes
from castsql.cli.common import Parser


@dataclass(frozen=True)
class Command:
    """One ``castsql`` command.

    ``arguments`` adds the command's arguments to its parser; then ``run``
    takes the parsed arguments and returns the summary line. Without it,
    ``run`` takes the command line after the name and returns the exit code.
    ``hard_exit``: the ``castsql`` process ends by ``castsql.cli._exit`` after
    it (native threads still running at interpreter finalization)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[Any], Any]
    hard_exit: bool = False


def _demo(argv: list[str]) -> int:
    from castsql.cli.demo import main

    return main(argv)


def _ui(argv: list[str]) -> int:
    from castsql.ui.cli import main  # the UI's handler; nothing but the cli imports castsql.ui

    return main(argv)


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("demo", "build the demo warehouse, open the shell on it", None, _demo),
        Command("ui", "a local, read-only web page of history, diffs, SQL", None, _ui, hard_exit=True),
        Command("append", "append rows from files as one new version", writes.append_arguments, writes.run),
        Command(
            "delete",
            "delete the rows matching a SQL condition (one tombstone, one version)",
            writes.delete_arguments,
            writes.run,
        ),
        Command(
            "update", "set columns of the rows matching a condition (one version)", writes.update_arguments, writes.run
        ),
        Command(
            "merge",
            "merge rows from files on key columns: update matched rows, insert new ones (one version)",
            writes.merge_arguments,
            writes.run,
        ),
        Command(
            "compact",
            "pack small files, rewrite heavily deleted ones, merge tombstones",
            writes.compact_arguments,
            writes.run,
        ),
        Command("gc", "remove old versions and unreferenced objects", tables.gc_arguments, tables.gc),
        Command(
            "restore",
            "commit one version whose content equals an older one (no data rewritten)",
            tables.restore_arguments,
            tables.restore,
        ),
        Command(
            "upgrade",
            "make a format version 1 table version 2 (one commit, no data change)",
            tables.upgrade_arguments,
            tables.upgrade,
        ),
        Command(
            "alter",
            "add nullable columns, widen column types, or set table properties (no data rewritten)",
            tables.alter_arguments,
            tables.alter,
        ),
        Command(
            "export",
            "mirror versions as a Delta log and/or Iceberg metadata next to the table, over its own data files",
            tables.export_arguments,
            tables.export,
        ),
    )
}


def parser() -> argparse.ArgumentParser:
    """The parser of every command with an arguments function, one subparser
    each (``args.command`` names the one given)."""
    p = Parser(prog="castsql", description="Write CastSQL tables: in this process, or as Spark jobs (--engine spark).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS.values():
        if command.arguments is not None:
            command.arguments(sub.add_parser(command.name, help=command.help))
    return p
