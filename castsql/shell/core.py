"""The shell without its terminal UI: runs statements and meta-commands, prints results and errors.

The interactive prompt (:mod:`castsql.shell.repl`), ``-c``, standard input and
``.read`` all go through :meth:`Shell.execute`, so they behave the same: one
error line on stderr, never a traceback, and the session stays usable.

Example::

    >>> import io
    >>> from castsql.engine import Session
    >>> out = io.StringIO()
    >>> sh = Shell(Session(), stdout=out, stderr=out, settings=Settings(mode="csv"))
    >>> sh.run_lines(["SELECT 42 AS answer;"], "<doc>")
    True
    >>> out.getvalue()
    'answer\\n42\\n'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import time
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

import duckdb
import pyarrow as pa

from castsql.engine.barrier.policy import check_write_target
from castsql.engine.messages import one_line
from castsql.errors import CastSQLError, ForbiddenStatement, QueryError
from castsql.shell.catalog import Catalog
from castsql.shell.errors import MAX_READ_DEPTH, Reported, ShellError
from castsql.shell.pipe import arrow_relation, write_text
from castsql.shell.render import GRID_MODES, RenderOptions, printable, terminal_text, write_result
from castsql.shell.runner import Cancelled, Runner
from castsql.shell.settings import Settings
from castsql.shell.special import run_meta_command
from castsql.shell.statements import QUIT_WORDS, Command, iter_commands
from castsql.storage.base import allow_waits, cancel_waits

if TYPE_CHECKING:
    from castsql.engine import Session

__all__ = ["MAX_READ_DEPTH", "Reported", "Settings", "Shell", "ShellError", "one_line"]


def _isatty(f: TextIO) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):  # a closed file, or no file at all
        return False


def _no_color() -> bool:
    return "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb"


class Shell:
    """A session plus the settings and output targets the meta-commands change."""

    def __init__(
        self,
        session: Session,
        *,
        settings: Settings | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        interactive: bool = False,
        safe: bool = False,
    ) -> None:
        self.session = session
        self.settings = settings or Settings()
        self._stdout = stdout
        self._stderr = stderr
        self.interactive = interactive
        self._safe = safe
        self.exit_requested = False
        self.cancelled = False  # a command was cancelled with Ctrl-C (scripts then exit with 130)
        self.output_path: str | None = None
        self._output: TextIO | None = None
        self._once: TextIO | None = None
        self.read_depth = 0
        self.catalog = Catalog(lambda: self.session)
        self.runner = Runner(
            interrupt=self._interrupt,
            query_progress=lambda: self.session.con.query_progress(),
            spinner=self.stderr if interactive and self.stderr.isatty() else None,
        )
        self._configure(session)

    @property
    def safe(self) -> bool:
        """Safe mode (``--safe``): the session reads its tables and nothing else,
        and no meta-command reads or writes a file or opens other tables."""
        return self._safe or self.session.safe

    def refuse_in_safe_mode(self, what: str) -> None:
        """Raise ShellError for ``what`` (a meta-command) when in safe mode."""
        if self.safe:
            raise ShellError(f"safe mode: {what} is not allowed (safe mode reads the opened tables and nothing else)")

    def _interrupt(self) -> None:
        # Ctrl-C: stop DuckDB, and any wait on the network in the storage layer.
        cancel_waits()
        self.session.con.interrupt()

    # ------------------------------------------------------------ streams

    @property
    def stdout(self) -> TextIO:
        return self._stdout or sys.stdout  # looked up late: tests and .output swap sys.stdout

    @property
    def stderr(self) -> TextIO:
        return self._stderr or sys.stderr

    def say(self, text: str) -> None:
        """A message for the user (help, status): on the console, never into an
        ``.output`` file; control characters (from table or directory names) escaped."""
        text = printable(text, keep="\n")
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def error(self, message: str) -> None:
        """One error line on stderr (red on a terminal), control characters escaped."""
        err = self.stderr
        line = f"Error: {printable(message)}"
        if err.isatty() and not _no_color():
            line = f"\x1b[31m{line}\x1b[0m"
        err.write(line + "\n")
        err.flush()

    def result_target(self) -> tuple[TextIO, bool]:
        """Where the next result goes (``.once`` file, ``.output`` file, or stdout) and whether that is the console."""
        if self._once is not None:
            return self._once, False
        if self._output is not None:
            if self.output_path is not None:
                # A table opened since (.open) may hold the file: checked again, as COPY … TO would be.
                try:
                    self._check_target(self.output_path, ".output")
                except ShellError:
                    self._output.close()
                    self._output = self.output_path = None
                    raise
            return self._output, False
        return self.stdout, True

    def _check_target(self, path: str, what: str) -> None:
        """ShellError unless ``path`` lies outside every opened table and
        warehouse and the session's work directory: the barrier ``COPY … TO``
        passes (:func:`castsql.engine.barrier.policy.check_write_target`), so a result
        never overwrites a table's object."""
        try:
            check_write_target(os.path.expanduser(path), self.session.scope, what)
        except ForbiddenStatement as e:
            raise ShellError(str(e)) from None

    def set_output(self, path: str | None, *, once: bool = False) -> None:
        """Send results to ``path`` (None: back to the console); ``once``: only the next result."""
        f = None
        if path is not None:
            self._check_target(path, ".once" if once else ".output")
            try:
                f = open(os.path.expanduser(path), "w", encoding="utf-8")  # noqa: SIM115 - lives until the next .output
            except OSError as e:
                raise ShellError(f"cannot write {path}: {e.strerror or e}") from None
        if once:
            self._close_once()
            self._once = f
            return
        if self._output is not None:
            self._output.close()
        self._output, self.output_path = f, path

    def _close_once(self) -> None:
        if self._once is not None:
            self._once.close()
            self._once = None

    def render_options(self, console: bool) -> RenderOptions:
        s = self.settings
        tty = console and self.stdout.isatty()
        width = (s.maxwidth or shutil.get_terminal_size((100, 24)).columns) if tty else (s.maxwidth or None)
        # Control characters are escaped for a terminal, also one named by .output /dev/tty.
        terminal = tty or (not console and _isatty(self.result_target()[0]))
        return RenderOptions(
            mode=s.mode,
            maxrows=s.maxrows,
            width=width,
            types=s.types,
            color=tty and not _no_color(),
            null=s.null,
            terminal=terminal,
        )

    # ------------------------------------------------------------ session

    def _configure(self, session: Session) -> None:
        if self.interactive:
            # query_progress() only reports with the progress bar on; printing stays ours.
            with contextlib.suppress(duckdb.Error):
                session.con.execute("SET enable_progress_bar = true; SET enable_progress_bar_print = false")

    def replace_session(self, session: Session) -> None:
        """Use ``session`` from now on (``.open``); the old one is closed."""
        old, self.session = self.session, session
        self._configure(session)
        self.catalog.invalidate()
        with contextlib.suppress(Exception):
            old.close()

    # ------------------------------------------------------------ running

    def run_sql(self, sql: str) -> None:
        """Run one statement and print its result in the current mode."""
        out, console = self.result_target()
        opts = self.render_options(console)
        started = time.monotonic()

        def work(progress):
            if opts.mode not in GRID_MODES:
                rel = self.session.relation(sql)
                return 0 if rel is None else self._write_text(rel, out, opts, progress)
            reader = self.session.reader(sql, display=True)
            return write_result(reader, reader.schema, out, opts, progress)

        before = self.session.last_write
        try:
            self.runner.run(work)
        finally:
            out.flush()
            self._close_once()
        written = self.session.last_write
        if written is not None and written is not before:
            # The version a write committed: on stderr, so that a script's
            # output stays the statement's result alone.
            self.stderr.write(printable(written.note()) + "\n")
            self.stderr.flush()
        if self.settings.timer:
            self.say(f"Run Time (s): real {time.monotonic() - started:.3f}")

    def emit(self, table: pa.Table) -> None:
        """Print a meta-command's result like a query result."""
        out, console = self.result_target()
        opts = self.render_options(console)
        try:
            if opts.mode in GRID_MODES or table.num_columns == 0:
                write_result(table.to_batches(), table.schema, out, opts)
            else:
                self._write_text(arrow_relation(self.session.con, table), out, opts)
        finally:
            out.flush()
            self._close_once()

    def _write_text(self, rel: duckdb.DuckDBPyRelation, out: TextIO, opts: RenderOptions, progress=None) -> int:
        """A result in a text mode, formatted and written by DuckDB (:mod:`castsql.shell.pipe`)."""
        try:
            return write_text(
                self.session.con,
                rel,
                opts.mode,
                out,
                self.session.workdir,
                self.settings.text,
                # A terminal never gets a raw control character; a file or pipe gets the bytes, as data files must.
                terminal_escape=terminal_text if opts.terminal else None,
                on_first_output=progress.begin_output if progress is not None else None,
            )
        except duckdb.Error as e:
            raise QueryError(self.session.error_message(e)) from None

    def run_meta(self, line: str) -> None:
        started = time.monotonic()
        run_meta_command(self, line)
        if self.settings.timer and not self.exit_requested:
            self.say(f"Run Time (s): real {time.monotonic() - started:.3f}")

    def execute(self, command: Command, where: str | None = None) -> bool:
        """Run a statement or meta-command; False (after printing one error line) when it failed.

        ``where`` (``file:line``) prefixes the error, for scripts.
        """
        prefix = f"{where}: " if where else ""
        allow_waits()  # a Ctrl-C before this command is spent
        if self.settings.echo:
            self.say(command.text)
        try:
            if command.kind == "meta":
                self.run_meta(command.text)
            elif command.text.strip().lower() in QUIT_WORDS:
                self.exit_requested = True
            elif command.text.startswith("."):
                first = command.text.split(None, 1)[0]
                raise ShellError(f"{first} is a meta-command: it must start a line of its own")
            else:
                self.run_sql(command.text)
            return True
        except Reported:
            return False
        except Cancelled:
            self.cancelled = True
            if self.interactive:
                self.stderr.write("Query cancelled.\n")
                self.stderr.flush()
            else:
                self.error(prefix + "cancelled")
            return False
        except BrokenPipeError:
            raise  # the reader of our output went away: the caller ends the shell quietly
        except (CastSQLError, duckdb.Error, pa.ArrowException, OSError) as e:
            self.error(prefix + one_line(e))
            return False
        except Exception as e:  # a bug of ours: still one line, the session survives
            if os.environ.get("CASTSQL_DEBUG"):
                traceback.print_exc(file=self.stderr)
            self.error(prefix + f"internal error: {type(e).__name__}: {one_line(e)}")
            return False

    def run_lines(self, lines: Iterable[str], source: str, *, stop_on_error: bool | None = True) -> bool:
        """Run a script (statements and meta-commands) until its end, ``.quit``, or
        the first error; False when a command failed.

        ``source`` names the script in error messages (``file:line: …``);
        ``-c`` and the prompt leave the line number out. ``stop_on_error`` None:
        as ``.bail`` says when the error happens (standard input, as in DuckDB's CLI).
        """
        ok = True
        located = source not in ("-c", "-cmd", "<prompt>")
        for cmd in iter_commands(lines):
            if not self.execute(cmd, f"{source}:{cmd.line}" if located else None):
                ok = False
                if self.settings.bail if stop_on_error is None else stop_on_error:
                    break
            if self.exit_requested:
                break
        return ok

    def run_file(self, path: str) -> bool:
        """Run a SQL file (``-f``, ``-init``, ``.read``) until its end, ``.quit`` or
        its first error, which is reported as ``FILE:LINE: message``."""
        if self.read_depth >= MAX_READ_DEPTH:
            self.error(f".read nested more than {MAX_READ_DEPTH} deep (does {path} read itself?)")
            return False
        try:
            f = open(os.path.expanduser(path), encoding="utf-8")  # noqa: SIM115 - closed below, after a long run
        except OSError as e:
            self.error(f"cannot read {path}: {e.strerror or e}")
            return False
        # A device or a pipe (/dev/zero, /dev/stdin) never ends, or holds no lines:
        # reading it would grow memory without bound.
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            f.close()
            self.error(f"cannot read {path}: not a regular file")
            return False
        self.read_depth += 1
        try:
            with f:
                return self.run_lines(f, path)
        finally:
            self.read_depth -= 1

    def close(self) -> None:
        self._close_once()
        if self._output is not None:
            self._output.close()
            self._output = None
        self.session.close()
