"""The ``castsql`` command: the shell by default, plus writer subcommands.

castsql [URI] [-c SQL] [--mode MODE]      the SQL shell (castsql.shell)
castsql demo [DIR]                        build the demo warehouse, open the shell on it
castsql append URI --from FILE... [--primary-key COL] [--format parquet|csv|json] [--merge-schema]
              [--allow-duplicate-keys] [--set-property NAME=VALUE]...
castsql delete URI --where CONDITION [--engine spark|duckdb]
castsql update URI --set "COL = EXPR" [--set ...] [--where CONDITION] [--merge-schema] [--engine spark|duckdb]
castsql merge URI --from FILE... --on COL[,COL] [--delete-matched-when COND] [--no-update] [--no-insert]
              [--delete-not-matched-by-source] [--merge-schema] [--allow-duplicate-keys] [--engine spark|duckdb]
castsql compact URI [--threshold 0.5]
castsql gc URI [--keep-versions N] [--older-than AGE] [--grace AGE] [--dry-run]
castsql restore URI (--version N | --timestamp T)   commit an older version's content as the newest
castsql upgrade URI                       make a format version 1 table version 2
castsql alter URI [--add-column NAME TYPE]... [--widen NAME TYPE]... [--set-property NAME=VALUE]...
              [--unset-property NAME]...  schema evolution and table properties, no Spark
castsql export URI [--delta] [--iceberg] [--version N]   mirror versions for other engines (Delta, Iceberg)
castsql ui URI [--port N] [--host 127.0.0.1] [--no-browser]   a local, read-only web page of history, diffs, SQL

The commands are the registry's (:mod:`castsql.cli.registry`), one small
module per group beside it: :mod:`castsql.cli.writes` (the ones with
``--engine``), :mod:`castsql.cli.tables` (the manifest commands),
:mod:`castsql.cli.common` (what they share); ``demo`` and ``ui`` are
:mod:`castsql.cli.demo`'s and :mod:`castsql.ui.cli`'s.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

from castsql.cli.common import UsageError
from castsql.cli.registry import COMMANDS, parser
from castsql.errors import CastSQLError, one_line

# The commands parsed by castsql.cli.registry.parser, in the order ``castsql --help`` lists them.
WRITER_COMMANDS = tuple(c.name for c in COMMANDS.values() if c.arguments is not None)


def main(argv: list[str] | None = None) -> int:
    """Run ``castsql`` with ``argv`` (default: the process's); the exit code.

    Example::

        >>> main(["gc", "/data/events", "--keep-versions", "5", "--dry-run"])   # doctest: +SKIP
        gc: would remove 3 version(s) 0-2, ...
        0
    """
    program = argv is None  # the castsql command itself, not a caller in Python (tests)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(argv[0]) if argv else None
    if command is not None and command.arguments is not None:
        return run_command(argv)
    if command is not None:
        status: int = command.run(argv[1:])
        if not command.hard_exit:
            return status
    else:
        from castsql.shell.app import main as shell_main

        status = shell_main(argv, commands=tuple(COMMANDS))
    if program:
        _exit(status)
    return status


def run_command(argv: list[str] | None = None) -> int:
    """Run one command of the registry that has arguments (``argv[0]`` its
    name): its summary line on stdout and 0, or one error line on stderr and
    2 for a malformed command line, 1 for anything else (130 when interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else "castsql"
    try:
        args = parser().parse_args(argv)
        line: str = COMMANDS[args.command].run(args)
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


def _exit(status: int) -> None:
    """End the shell process now that its session is closed and its output
    flushed, without interpreter finalization: that tears down objects while
    native threads still run (DuckDB's schedulers, pyarrow's pools and jemalloc
    thread, fsspec's event-loop thread), and a thread forced to exit inside C++
    aborts the process ("terminate called without an active exception", rc 134,
    now and then). Nothing is left for finalization to do: files are closed and
    the session's work directory removed by ``Shell.close``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away, or a closed stream
            stream.flush()
    os._exit(status)
