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
from collections.abc import Callable, Sequence
from typing import Any

# The same as castsql.shell.render.MODES (a test keeps them equal): the shell's
# start-up must not import the renderer, which imports pyarrow.
MODES = ("box", "table", "csv", "tabs", "list", "json", "jsonlines", "markdown", "line")
MODE_ALIASES = ("tsv",)
_MODE_FLAGS = ("box", "table", "csv", "json", "jsonlines", "markdown", "line", "list")  # DuckDB's -csv, -json, …


def build_parser(commands: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The shell's arguments, DuckDB's CLI flags among them; ``commands`` are the
    program's other commands (:mod:`castsql.cli` passes them: the shell does not
    import its caller)."""
    p = argparse.ArgumentParser(
        prog="castsql",
        description="SQL shell over CastSQL tables: time travel (t AS OF VERSION n) and audits (DESCRIBE HISTORY t). "
        "Takes DuckDB's CLI flags: castsql DIR -csv -c 'SELECT …' > out.csv.",
        epilog=f"Other commands: castsql {' | '.join(commands)} (castsql COMMAND --help)." if commands else None,
        allow_abbrev=False,  # -sep must not pass for -separator, nor -c for -csv
    )
    p.add_argument(
        "uri", nargs="?", help="a table or a warehouse of tables: a local directory, s3://, gs:// or az://bucket/prefix"
    )
    p.add_argument("sql", nargs="?", help="SQL to run and exit, as DuckDB's CLI takes it after the database")
    p.add_argument(
        "-c", "--command", "-s", dest="commands", action="append", metavar="SQL",
        help="run SQL (statements and .commands) and exit; may be given more than once; stops at the first error",
    )  # fmt: skip
    p.add_argument(
        "-f", dest="files", action="append", metavar="FILE", help="run a SQL file and exit, stopping at its first error"
    )
    p.add_argument("-cmd", dest="first", action="append", metavar="COMMAND", help="run COMMAND before anything else")
    p.add_argument("-init", dest="init", metavar="FILE", help="run FILE first (CastSQL reads no init file unless told)")
    p.add_argument(
        "-no-init", action="store_true", help=argparse.SUPPRESS
    )  # DuckDB's; CastSQL has no default init file
    p.add_argument(
        "--mode",
        choices=MODES + MODE_ALIASES,
        help="output mode (default: box on a terminal, csv when output is piped or redirected)",
    )
    for m in _MODE_FLAGS:
        p.add_argument(f"-{m}", dest="mode", action="store_const", const=m, help=f"output mode {m}")
    p.add_argument("-header", dest="header", action="store_const", const=True, help="print column names (default)")
    p.add_argument("-noheader", dest="header", action="store_const", const=False, help="no column names")
    p.add_argument("-separator", metavar="SEP", help="column separator of csv and list modes")
    p.add_argument("-nullvalue", metavar="TEXT", help="text for NULL values (default: NULL)")
    p.add_argument("-echo", action="store_true", help="print each command before running it")
    p.add_argument("-bail", action="store_true", help="stop standard input's script at its first error")
    p.add_argument("-batch", action="store_true", help="never interactive, even on a terminal")
    p.add_argument("-no-stdin", dest="no_stdin", action="store_true", help="do not read standard input")
    p.add_argument("-version", action="store_true", help="print CastSQL's and DuckDB's versions and exit")
    p.add_argument(
        "--safe", "-safe",
        action="store_true",
        help="safe mode: queries only read the opened tables (no other file, URL, write, install or setting); "
        ".open, .read, .output FILE and .once are refused",
    )  # fmt: skip
    p.add_argument(
        "-readonly", "--read-only", dest="readonly", action="store_true",
        help="SQL reads the tables and never writes one (DELETE, UPDATE, INSERT, MERGE INTO are refused)",
    )  # fmt: skip
    p.add_argument("--no-banner", action="store_true", help="do not print the start-up banner")
    return p


def main(argv: list[str], commands: Sequence[str] = ()) -> int:
    """Run the shell with command-line arguments ``argv``; returns the exit status.
    ``commands``: the program's other commands, listed by ``--help``."""
    args = build_parser(commands).parse_intermixed_args(argv)
    if args.version:
        from importlib.metadata import version

        import duckdb

        sys.stdout.write(f"castsql {version('castsql')} (DuckDB {duckdb.__version__})\n")
        return 0
    if args.sql is not None:
        args.commands = [*(args.commands or []), args.sql]
    stdin_tty = sys.stdin is not None and sys.stdin.isatty()
    stdout_tty = sys.stdout.isatty()
    scripted = bool(args.commands or args.files or args.no_stdin or args.batch)
    interactive = not scripted and stdin_tty and stdout_tty
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


def _status(shell: Any, ok: bool = False) -> int:
    return 0 if ok else (130 if shell.cancelled else 1)


def _run(args: argparse.Namespace, interactive: bool, stdout_tty: bool) -> int:
    from castsql.errors import CastSQLError
    from castsql.shell.core import Settings, Shell, one_line
    from castsql.shell.render import printable

    try:
        from castsql.engine import Session

        session = (
            Session(args.uri, safe=args.safe, read_only=args.readonly)
            if args.uri
            else Session(safe=args.safe, read_only=args.readonly)
        )
    except Exception as e:  # storage, S3 set-up, DuckDB: whatever it is, one line
        prefix = "" if isinstance(e, CastSQLError | OSError) else f"{type(e).__name__}: "
        sys.stderr.write(f"Error: {printable(prefix + one_line(e))}\n")
        return 1
    # Box is for reading; a pipe or a file gets CSV unless --mode says otherwise.
    settings = Settings(
        mode=args.mode or ("box" if stdout_tty else "csv"),
        separator=args.separator,
        null="NULL" if args.nullvalue is None else args.nullvalue,
        header=True if args.header is None else args.header,
        echo=args.echo,
        bail=args.bail,
    )
    shell = Shell(session, settings=settings, interactive=interactive, safe=args.safe)
    try:
        # As DuckDB's CLI: -init and -cmd first; then -c, -s and -f, each stopping
        # at its first error; else standard input, which goes on after an error
        # (exit status 1 at the end) unless -bail.
        steps: list[tuple[list[str], Callable[[str], bool]]] = (
            [([args.init], shell.run_file)] if args.init is not None else []
        )
        steps.append((args.first or [], lambda c: shell.run_lines(c.splitlines(keepends=True), "-cmd")))
        if not interactive:
            steps.append((args.commands or [], lambda c: shell.run_lines(c.splitlines(keepends=True), "-c")))
            steps.append((args.files or [], shell.run_file))
        for items, run in steps:
            for item in items:
                if not run(item):
                    return _status(shell)
                if shell.exit_requested:
                    return 0
        if interactive:
            from castsql.shell.repl import run_interactive

            return run_interactive(shell, banner=not args.no_banner)
        if args.commands or args.files or args.no_stdin:
            return 0
        return _status(shell, shell.run_lines(sys.stdin or [], "<stdin>", stop_on_error=None))
    finally:
        with contextlib.suppress(Exception):
            shell.close()
