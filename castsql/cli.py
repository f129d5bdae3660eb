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
"""

from __future__ import annotations

import contextlib
import os
import sys

# In the order ``castsql --help`` lists them.
WRITER_COMMANDS = ("append", "delete", "update", "merge", "compact", "gc", "restore", "upgrade", "alter", "export")


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # the castsql command itself, not a caller in Python (tests)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in WRITER_COMMANDS:
        from castsql.write_cli import main as write_main

        return write_main(argv)
    if argv and argv[0] == "demo":
        from castsql.demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "ui":
        from castsql.ui.cli import main as ui_main  # the UI's handler; nothing else imports castsql.ui

        status = ui_main(argv[1:])
    else:
        from castsql.shell.app import main as shell_main

        status = shell_main(argv, commands=("demo", "ui", *WRITER_COMMANDS))
    if program:
        _exit(status)
    return status


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


if __name__ == "__main__":
    sys.exit(main())
