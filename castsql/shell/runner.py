"""Running one query so that Ctrl-C cancels it and a slow one shows progress.

The query runs in a worker thread; the main thread waits for it in short
slices. While it waits, SIGINT (Ctrl-C) is handled by a handler of ours that
calls ``con.interrupt()``: DuckDB stops the query at its next check and the
worker's call fails. Python's default handler must not run then: its
KeyboardInterrupt, raised while DuckDB executes in another thread, kills that
thread from inside DuckDB and the process aborts at exit ("terminate called
without an active exception"). The main thread keeps interrupting until the
worker is done, because one command may run several DuckDB queries in a row
(an audit, a snapshot that needs counting). The shell is never killed, and the
connection is free again when :meth:`Runner.run` returns.

After ``delay`` seconds a spinner line on the terminal shows the elapsed time,
DuckDB's own progress estimate when it has one, and the rows streamed so far.
It is erased before the first character of the result is written.

Example::

    >>> r = Runner(interrupt=lambda: None)
    >>> r.run(lambda progress: 6 * 7)
    42
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import TextIO, TypeVar

T = TypeVar("T")

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Cancelled(Exception):
    """The user pressed Ctrl-C while a command ran."""

    def __init__(self, message: str = "cancelled") -> None:
        super().__init__(message)


class QueryProgress:
    """Shared between the worker (which reports rows and output) and the waiting main thread."""

    def __init__(self, spinner: TextIO | None) -> None:
        self.cancelled = threading.Event()
        self.nrows = 0
        self._spinner = spinner
        self._lock = threading.Lock()
        self._drawn = False
        self._output_started = False

    # -- called by the worker (see castsql.shell.render.Progress)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()

    def rows(self, n: int) -> None:
        self.nrows += n

    def begin_output(self) -> None:
        with self._lock:
            self._erase()
            self._output_started = True

    # -- called by the main thread

    def draw(self, text: str) -> None:
        if self._spinner is None:
            return
        with self._lock:
            if self._output_started:
                return
            self._spinner.write("\r" + text + "\x1b[K")
            self._spinner.flush()
            self._drawn = True

    def erase(self) -> None:
        with self._lock:
            self._erase()

    def _erase(self) -> None:
        if self._drawn and self._spinner is not None:
            self._spinner.write("\r\x1b[K")
            self._spinner.flush()
            self._drawn = False


class Runner:
    """Runs commands in a worker thread, cancellable with Ctrl-C.

    ``interrupt`` cancels whatever DuckDB runs (``session.con.interrupt``);
    ``query_progress`` returns DuckDB's estimate in percent (negative when it
    has none); ``spinner`` is the terminal to draw on, None for no spinner.
    """

    def __init__(
        self,
        interrupt: Callable[[], None],
        query_progress: Callable[[], float] | None = None,
        spinner: TextIO | None = None,
        delay: float = 0.5,
    ) -> None:
        self.interrupt = interrupt
        self.query_progress = query_progress
        self.spinner = spinner
        self.delay = delay

    def run(self, fn: Callable[[QueryProgress], T]) -> T:
        """``fn(progress)`` in a worker thread; its result, its exception, or Cancelled after Ctrl-C."""
        progress = QueryProgress(self.spinner)
        box: dict[str, object] = {}

        def target() -> None:
            try:
                box["value"] = fn(progress)
            except BaseException as e:  # handed to the main thread, which reports it
                box["error"] = e

        def on_sigint(signum: int, frame: object) -> None:
            progress.cancelled.set()
            self._interrupt()

        worker = threading.Thread(target=target, name="castsql-query", daemon=True)
        # Signal handlers can only be set from the main thread; elsewhere (tests) Ctrl-C is not ours to handle.
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
        start = time.monotonic()
        try:
            worker.start()
            frame, told = 0, False
            while worker.is_alive():
                worker.join(0.1)
                if not worker.is_alive():
                    break
                if progress.cancelled.is_set():
                    # The worker may have moved on to its next DuckDB query: stop that one too.
                    self._interrupt()
                    if not told:
                        progress.draw("cancelling…")
                        told = True
                    continue
                elapsed = time.monotonic() - start
                if elapsed >= self.delay and self.spinner is not None:
                    progress.draw(self._status(_FRAMES[frame % len(_FRAMES)], elapsed, progress.nrows))
                    frame += 1
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        progress.erase()
        if progress.cancelled.is_set():
            raise Cancelled()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        if "value" not in box:  # the thread died without a word: never seen, but not a KeyError either
            raise RuntimeError("the query thread ended without a result")
        return box["value"]  # type: ignore[return-value]

    def _interrupt(self) -> None:
        with contextlib.suppress(Exception):  # a closed connection has nothing left to interrupt
            self.interrupt()

    def _status(self, frame: str, elapsed: float, nrows: int) -> str:
        parts = [f"{frame} {elapsed:.1f} s"]
        if self.query_progress is not None:
            try:
                pct = self.query_progress()
            except Exception:
                pct = -1.0
            if 0 < pct < 100:
                parts.append(f"{pct:.0f}%")
        if nrows:
            parts.append(f"{nrows:,} rows")
        return "  ".join(parts) + "   Ctrl-C cancels"
