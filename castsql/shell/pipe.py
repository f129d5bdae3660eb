"""Writing a result in a text mode at the speed of DuckDB's own writers.

The rows' text is made by SQL (:mod:`castsql.shell.text_modes`) and written
by DuckDB's parallel, order-keeping ``COPY … TO`` into a named pipe in the
session's work directory; a thread here moves the bytes from the pipe to the
output (a terminal, a file, a pipe, or a Python stream in tests). Python never
touches a row, and memory stays bounded by the pipe's buffer whatever the
result's size. The work directory is the one place safe mode lets DuckDB
write, so this works there too.

Why not ``COPY … TO '/dev/stdout'``: opening a regular file a second time
truncates it (``castsql -c "…; …" > out`` would lose the first result), and
``.output``, ``.once`` and tests write to streams DuckDB cannot name.

Example::

    >>> import duckdb, io, tempfile
    >>> con = duckdb.connect()
    >>> out = io.StringIO()
    >>> write_text(con, con.sql("SELECT 1 AS a, 'x,y' AS b"), "csv", out, tempfile.mkdtemp())
    1
    >>> out.getvalue()
    'a,b\\n1,"x,y"\\n'
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import os
import re
import select
import threading
from typing import Any, TextIO

import duckdb
import pyarrow as pa

from castsql.engine.sql.quoting import ident, sql_str
from castsql.errors import one_line
from castsql.shell.text_modes import TextOptions, TextPlan, markdown_plan, normal_mode, plan_text

_CHUNK = 1 << 20
# DuckDB's COPY keeps its output in order by holding the batches finished
# early; with no limit that grows with the result (550 MB for 20M rows as csv,
# 1.2 GB as JSON). Under this limit its writers wait instead, at the same speed
# (measured: bench/shell_output_bench.py), and a query that needs more spills
# to the session's work directory (a 20M-row sort: as fast; a large GROUP BY:
# 1.2x).
OUTPUT_MEMORY = 256 * 1024 * 1024
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1000, "MB": 10**6}
_F_SETPIPE_SZ = 1031  # Linux: a 1 MiB pipe buffer instead of 64 KiB, fewer wake-ups
_names = itertools.count()


class _Output:
    """Bytes to a text stream: straight to its binary buffer when it has one,
    decoded otherwise; on a terminal, control characters escaped first."""

    def __init__(self, out: TextIO, escape: Any | None) -> None:
        self.out = out
        self.escape = escape
        self.raw = getattr(out, "buffer", None) if escape is None else None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out.flush()

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.raw is not None:
            self.raw.write(data)
            return
        text = self.decoder.decode(data)
        self.out.write(self.escape(text) if self.escape else text)

    def close(self) -> None:
        rest = self.decoder.decode(b"", final=True)
        if rest:
            self.out.write(self.escape(rest) if self.escape else rest)
        if self.raw is not None:
            self.raw.flush()
        self.out.flush()


# DuckDB's JSON writer spells a control character \u001B; the CLI spells it
# \u001b in a column's own string (its escaping) and \u001B inside nested values
# (DuckDB's JSON cast, as the writer's).
_UPPER_ESCAPE = re.compile(rb"\\u00[01][A-F]")


def _cli_escapes(line: bytes) -> bytes:
    """``line`` (one JSON object) with the escapes of its top-level strings in lower case."""
    out = bytearray(line)
    depth, in_string, i, n = 0, False, 0, len(out)
    while i < n:
        c = out[i]
        if in_string:
            if c == 0x5C:  # backslash: an escape
                if depth == 1 and out[i + 1 : i + 4] == b"u00":
                    out[i + 4 : i + 6] = out[i + 4 : i + 6].lower()
                i += 2
                continue
            if c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
        i += 1
    return bytes(out)


class _Pump(threading.Thread):
    """Moves the pipe's bytes to the output: ``plan.head`` before the first byte,
    the last ``plan.drop_tail`` bytes kept back until the end (they may be
    replaced). For JSON, whole lines at a time: rows joined by ``,`` for an
    array, escapes spelled as the CLI spells them."""

    def __init__(self, fd: int, out: _Output, plan: TextPlan, on_first: Any) -> None:
        super().__init__(name="castsql-output", daemon=True)
        self.fd, self.out, self.on_first = fd, out, on_first
        self.head, self.hold = plan.head.encode(), plan.drop_tail
        self.join_rows, self.fix = plan.join_rows, plan.json
        self.kept = b""
        self.partial = b""  # the start of a line not yet whole
        self.started_output = False
        self.copy_done = threading.Event()
        self.error: BaseException | None = None

    def begin(self) -> None:
        if not self.started_output:
            self.started_output = True
            self.on_first()
            self.out.write(self.head)

    def _lines(self, data: bytes) -> bytes:
        data = self.partial + data
        end = data.rfind(b"\n") + 1
        data, self.partial = data[:end], data[end:]
        if self.fix and _UPPER_ESCAPE.search(data):
            data = b"\n".join(_cli_escapes(x) if _UPPER_ESCAPE.search(x) else x for x in data.split(b"\n"))
        return data.replace(b"\n", b",\n") if self.join_rows else data

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while True:
                if not poller.poll(100):
                    # Nothing to read: once the COPY is over, nothing will come (a
                    # failed COPY may keep its end open until DuckDB drops it).
                    if self.copy_done.is_set():
                        return
                    continue
                data = os.read(self.fd, _CHUNK)
                if not data:
                    return
                self.begin()
                if self.join_rows or self.fix:
                    data = self._lines(data)
                data = self.kept + data
                cut = max(0, len(data) - self.hold)
                self.out.write(data[:cut])
                self.kept = data[cut:]
        except BaseException as e:  # a reader that went away (BrokenPipeError): the COPY then fails too
            self.error = e
            with contextlib.suppress(OSError):
                os.close(self.fd)  # the writer's next write fails instead of blocking forever
            self.fd = -1


def write_text(
    con: duckdb.DuckDBPyConnection,
    rel: duckdb.DuckDBPyRelation,
    mode: str,
    out: TextIO,
    workdir: str,
    opts: TextOptions | None = None,
    *,
    terminal_escape: Any | None = None,
    on_first_output: Any = None,
) -> int:
    """Write ``rel`` to ``out`` in text ``mode``; returns the number of rows.

    ``terminal_escape``: a function applied to the text before it reaches
    ``out`` (the shell escapes control characters on a terminal);
    ``on_first_output``: called just before the first character is written.
    Nothing is written when the query fails before its first row.
    """
    opts = opts or TextOptions()
    mode = normal_mode(mode)
    names, types = list(rel.columns), [str(t) for t in rel.types]
    if not names:
        return 0
    view = f"__castsql_out_{next(_names)}"
    rel.create_view(view, replace=True)
    try:
        plan = plan_text(mode, names, types, opts)
        if plan.widths is not None:  # markdown: the column widths first
            plan = markdown_plan(
                names, types, opts, plan.widths, lambda sql: con.sql(f"{sql} FROM {ident(view)}").fetchone() or ()
            )
        return _copy(con, view, plan, out, workdir, terminal_escape, on_first_output or (lambda: None))
    except duckdb.Error as e:
        # Every statement here is CastSQL's own (the widths, the COPY): a
        # value DuckDB fails on while writing is the news, not an excerpt of
        # a statement (its view, its pipe's path) the user never wrote.
        raise type(e)(one_line(e, excerpt=False)) from None
    finally:
        with contextlib.suppress(duckdb.Error):
            con.execute(f"DROP VIEW IF EXISTS {ident(view)}")


def arrow_relation(con: duckdb.DuckDBPyConnection, table: pa.Table) -> duckdb.DuckDBPyRelation:
    """``table`` as a relation of ``con`` under its own column names: Arrow's scan
    refuses duplicate names (a query result may have them), so it scans unique
    ones and the projection shows the real ones."""
    scanned = con.from_arrow(table.rename_columns([f"c{i}" for i in range(table.num_columns)]))
    return scanned.project(", ".join(f"#{i + 1} AS {ident(n)}" for i, n in enumerate(table.column_names)))


def _limit_bytes(text: str) -> float:
    """DuckDB's spelling of its memory limit (``12.5 GiB``) in bytes."""
    number, _, unit = text.strip().partition(" ")
    try:
        return float(number) * _UNITS.get(unit, 1 << 30)
    except ValueError:
        return float("inf")


@contextlib.contextmanager
def _memory_cap(con: duckdb.DuckDBPyConnection, cap: int) -> Any:
    """DuckDB's memory limit at most ``cap`` bytes while the block runs, then as it was."""
    before = con.sql("SELECT current_setting('memory_limit')").fetchone()
    old = str(before[0]) if before else ""
    if not old or _limit_bytes(old) <= cap:
        yield
        return
    con.execute(f"SET memory_limit = '{cap}B'")
    try:
        yield
    finally:
        con.execute(f"SET memory_limit = {sql_str(old)}")


def _copy(
    con: duckdb.DuckDBPyConnection,
    view: str,
    plan: TextPlan,
    out: TextIO,
    workdir: str,
    escape: Any | None,
    on_first: Any,
) -> int:
    path = os.path.join(workdir, f"out-{os.getpid()}-{next(_names)}.fifo")
    os.mkfifo(path, 0o600)
    output = _Output(out, escape)
    try:
        # Open both ends here: DuckDB's open for writing then never blocks, and
        # the pump sees the end of the text only once our write end is closed too.
        rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        wfd = os.open(path, os.O_WRONLY)
        os.set_blocking(rfd, True)
        with contextlib.suppress(OSError):
            import fcntl

            fcntl.fcntl(rfd, _F_SETPIPE_SZ, _CHUNK)
        pump = _Pump(rfd, output, plan, on_first)
        pump.start()
        copied: tuple[Any, ...] | None = None
        try:
            cells = ", ".join(plan.select)
            with _memory_cap(con, OUTPUT_MEMORY):
                sql = f"COPY (SELECT {cells} FROM {ident(view)}) TO {sql_str(path)} ({plan.options})"
                copied = con.execute(sql).fetchone()
        except duckdb.Error:
            if pump.error is None:
                raise
        finally:
            os.close(wfd)
            pump.copy_done.set()
            pump.join()
            if pump.fd >= 0:
                os.close(pump.fd)
        if pump.error is not None:
            raise pump.error  # the reader of our output went away: that, not DuckDB's failed write, is the news
        rows = int(copied[0]) if copied else 0
        pump.begin()
        output.write(plan.tail.encode() if rows else plan.empty.encode())
        return rows
    finally:
        output.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
