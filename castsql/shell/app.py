"""``castsql [URI] [-c SQL] [--mode MODE]``: the shell's entry point.

Interactive when standard input and output are terminals and no ``-c`` is
given; otherwise a script runner: ``-c`` text or standard input, statement by
statement, stopping with exit status 1 at the first error (one line on
stderr).

Exit status: 0 success, 1 an error in SQL or a meta-command (or the URI could
not be opened), 2 bad command-line arguments, 130 cancelled with Ctrl-C,
141 the reader of our output went away (``| head``).

Start-up stays fast by importing late: the heavy modules (DuckDB, Arrow, the
engine) when a session is opened, prompt_toolkit and Pygments only for the
interactive shell, nothing of Spark at all.

Example::

    >>> main(["--mode", "csv", "-c", "SELECT 1 AS one"])  # doctest: +SKIP
    one
    1
    0
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

MODES = ("box", "table", "csv", "json", "jsonlines", "markdown", "line")  # same as castsql.shell.render.MODES


def build_parser(commands: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The shell's arguments; ``commands`` are the program's other commands
    (:mod:`castsql.cli` passes them: the shell does not import its caller)."""
    p = argparse.ArgumentParser(
        prog="castsql",
        description="SQL shell over CastSQL tables: time travel (t AS OF VERSION n) and audits (DESCRIBE HISTORY t).",
        epilog=f"Other commands: castsql {' | '.join(commands)} (castsql COMMAND --help)." if commands else None,
    )
    p.add_argument("uri", nargs="?", help="a table or a warehouse of tables: a local directory or s3://bucket/prefix")
    p.add_argument("-c", "--command", metavar="SQL", help="run SQL (statements and .commands) and exit")
    p.add_argument(
        "--mode",
        choices=MODES,
        help="output mode (default: box on a terminal, csv when output is piped or redirected)",
    )
    p.add_argument(
        "--safe",
        action="store_true",
        help="safe mode: queries only read the opened tables (no other file, URL, write, install or setting); "
        ".open, .read, .output FILE and .once are refused",
    )
    p.add_argument("--no-banner", action="store_true", help="do not print the start-up banner")
    return p


def main(argv: list[str], commands: Sequence[str] = ()) -> int:
    """Run the shell with command-line arguments ``argv``; returns the exit status.
    ``commands``: the program's other commands, listed by ``--help``."""
    args = build_parser(commands).parse_args(argv)
    stdin_tty = sys.stdin is not None and sys.stdin.isatty()
    stdout_tty = sys.stdout.isatty()
    interactive = args.command is None and stdin_tty and stdout_tty
    try:
        return _run(args, interactive, stdout_tty)
    except BrokenPipeError:
        # Whoever read our output stopped (| head): not an error worth a traceback.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130


def _run(args: argparse.Namespace, interactive: bool, stdout_tty: bool) -> int:
    from castsql.errors import CastSQLError
    from castsql.shell.core import Settings, Shell, one_line
    from castsql.shell.render import printable

    try:
        from castsql.engine import Session

        session = Session(args.uri, safe=args.safe) if args.uri else Session(safe=args.safe)
    except Exception as e:  # storage, S3 set-up, DuckDB: whatever it is, one line
        prefix = "" if isinstance(e, CastSQLError | OSError) else f"{type(e).__name__}: "
        sys.stderr.write(f"Error: {printable(prefix + one_line(e))}\n")
        return 1
    # Box is for reading; a pipe or a file gets CSV unless --mode says otherwise.
    mode = args.mode or ("box" if stdout_tty else "csv")
    shell = Shell(session, settings=Settings(mode=mode), interactive=interactive, safe=args.safe)
    try:
        if interactive:
            from castsql.shell.repl import run_interactive

            return run_interactive(shell, banner=not args.no_banner)
        if args.command is not None:
            ok = shell.run_lines(args.command.splitlines(keepends=True), "-c")
        else:
            ok = shell.run_lines(sys.stdin or [], "<stdin>")
        return 0 if ok else (130 if shell.cancelled else 1)
    finally:
        with contextlib.suppress(Exception):
            shell.close()
