"""Printing query results in the shell's output modes.

``box`` and ``table`` are for reading: they fit the terminal width (long cells
end in ``…``, columns that cannot fit are replaced by one ``…`` column), show at
most ``maxrows`` rows (the head and the tail of the result, with a ``·`` row
between) and end with a footer such as ``1,896 rows (40 shown)``. The result is
streamed: only the rows shown are kept, the rest are counted as they pass, so
``SELECT *`` over a billion rows needs memory for 40 of them.

The text modes (``csv``, ``tabs``, ``list``, ``json``, ``jsonlines``,
``markdown``, ``line``) are for copying and piping: every row, no truncation,
in the exact text of DuckDB's CLI, formatted and written by DuckDB itself
(:mod:`castsql.shell.text_modes`, :mod:`castsql.shell.pipe`).

Example::

    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1, 2], "name": ["a", None]})
    >>> print(render_table(t, RenderOptions(mode="table")), end="")
    +----+------+
    | id | name |
    +----+------+
    |  1 | a    |
    |  2 | NULL |
    +----+------+
    2 rows
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import math
import unicodedata
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, TextIO

import pyarrow as pa

from castsql.shell.text_modes import TEXT_MODES, TextOptions

GRID_MODES = frozenset({"box", "table"})  # fitted to the width, row-limited, with a footer
MODES = ("box", "table", *TEXT_MODES)

ELLIPSIS = "…"
MIN_COL_WIDTH = 5  # a column narrower than this shows too little to be worth keeping
HEADER_KEEP = 16  # column names up to this long are never cut: fewer columns, but each one readable

_BOLD, _DIM, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


@dataclass
class RenderOptions:
    """How results are printed.

    ``maxrows`` (0: no limit) and ``width`` (None: do not fit) only apply to
    the grid modes; ``color`` dims NULLs and footers with ANSI codes (only
    wanted on a terminal); ``types`` adds a row of column types under the header.

    ``terminal``: the output is a terminal. Control characters (ESC, BEL, CR,
    other C0 and C1 codes) in values and column names are then escaped in every
    mode (``\x1b``), so no query result can move the cursor, retitle the window
    or answer back. Off a terminal (``.output FILE``, ``-c … > file``, a pipe),
    csv and markdown keep the bytes, as data files must (DuckDB's shell and
    psql do the same); box, table and line always escape (they are for
    reading), json always writes them as ``\u001b`` (the same string to any
    JSON reader).
    """

    mode: str = "box"
    maxrows: int = 40
    width: int | None = None
    types: bool = False
    color: bool = False
    null: str = "NULL"
    terminal: bool = True  # the safe default: escape


class Progress(Protocol):
    """What the renderer tells whoever watches a running query (see :mod:`castsql.shell.runner`)."""

    def check(self) -> None:
        """Raise if the query was cancelled; called between batches."""

    def rows(self, n: int) -> None:
        """``n`` more rows went by."""

    def begin_output(self) -> None:
        """About to write the first character of output (stop any spinner first)."""


class _NoProgress:
    def check(self) -> None:
        pass

    def rows(self, n: int) -> None:
        pass

    def begin_output(self) -> None:
        pass


NO_PROGRESS: Progress = _NoProgress()


# ---------------------------------------------------------------- text width


@lru_cache(maxsize=8192)
def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(s: str) -> int:
    """Columns ``s`` takes on a terminal (CJK characters take two).

    Example::

        >>> display_width("abc"), display_width("한글")
        (3, 4)
    """
    if s.isascii():
        return len(s)
    return sum(_char_width(c) for c in s)


def truncate(s: str, width: int) -> str:
    """``s`` cut to ``width`` terminal columns, ending in ``…`` when cut.

    Example::

        >>> truncate("abcdefgh", 5)
        'abcd…'
    """
    if display_width(s) <= width:
        return s
    if width <= 1:
        return ELLIPSIS[:width]
    out, used = [], 0
    for ch in s:
        w = _char_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS


def _pad(s: str, width: int, align: str) -> str:
    gap = width - display_width(s)
    if gap <= 0:
        return s
    if align == "right":
        return " " * gap + s
    if align == "center":
        left = gap // 2
        return " " * left + s + " " * (gap - left)
    return s + " " * gap


# ---------------------------------------------------------------- values

_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(s: str, keep: str = "") -> str:
    r"""``s`` with every non-printable character (except those in ``keep``)
    escaped the way SQL strings write them: nothing a table or directory name
    holds can move the cursor, recolour or retitle the terminal.

    Example::

        >>> printable("ev\x1b[2Jents\n"), printable("a\nb", keep="\n")
        ('ev\\x1b[2Jents\\n', 'a\nb')
    """
    if s.isprintable():
        return s
    return "".join(
        c
        if c in keep or c.isprintable()
        else _CONTROL.get(c, f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")
        for c in s
    )


def terminal_text(s: str) -> str:
    """A text mode's output on its way to a terminal: control characters escaped,
    the newlines and tabs that lay it out kept."""
    return printable(s, keep="\n\t")


def _escape_controls(s: str) -> str:
    # A newline inside a cell would break the grid: show it the way it is written in SQL strings.
    return printable(s)


def _format_interval(v: Any) -> str:
    months, days, nanos = v.months, v.days, v.nanoseconds
    parts = []
    if months:
        y, m = divmod(months, 12)
        if y:
            parts.append(f"{y} year{'s' if abs(y) != 1 else ''}")
        if m:
            parts.append(f"{m} month{'s' if abs(m) != 1 else ''}")
    if days:
        parts.append(f"{days} day{'s' if abs(days) != 1 else ''}")
    if nanos or not parts:
        sign = "-" if nanos < 0 else ""
        micros = abs(nanos) // 1000
        secs, us = divmod(micros, 1_000_000)
        h, rem = divmod(secs, 3600)
        m, s = divmod(rem, 60)
        parts.append(f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else ""))
    return " ".join(parts)


def format_value(v: Any, null: str = "NULL") -> str:
    """One value as the shell shows it (``None`` as ``null``), in DuckDB's spelling where it differs from Python's.

    Example::

        >>> format_value(True), format_value(None), format_value(1.5), format_value([1, None])
        ('true', 'NULL', '1.5', '[1, NULL]')
    """
    if v is None:
        return null
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _format_float(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, dt.datetime):
        return str(v)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, bytes):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"'{k}': {_nested(x, null)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):  # an Arrow map: [(key, value), …]
            return "{" + ", ".join(f"{_nested(k, null)}={_nested(x, null)}" for k, x in v) + "}"
        return "[" + ", ".join(_nested(x, null) for x in v) + "]"
    if hasattr(v, "months") and hasattr(v, "nanoseconds"):
        return _format_interval(v)
    return str(v)


def _format_float(v: float) -> str:
    """A float as DuckDB spells it: ``nan``, ``inf``, ``-inf``, else Python's shortest repr."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def _nested(v: Any, null: str) -> str:
    return f"'{v}'" if isinstance(v, str) else format_value(v, null)


def _column_values(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    try:
        return col.to_pylist()
    except (pa.ArrowException, ValueError, OverflowError):
        # e.g. a date outside Python's range: Arrow can still spell it.
        try:
            return col.cast(pa.string()).to_pylist()
        except pa.ArrowException:
            pass
        try:  # a list or struct of such values: its dates and times as text, the nesting kept
            return col.cast(_spelled(col.type)).to_pylist()
        except (pa.ArrowException, ValueError, OverflowError):
            return [_scalar_text(x) for x in col]


def _spelled(t: pa.DataType) -> pa.DataType:
    """``t`` with every date, time, timestamp and duration inside it as string."""
    if pa.types.is_temporal(t):
        return pa.string()
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_spelled(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_spelled(t.value_type)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_spelled(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(_spelled(t.key_type), t.item_field.with_type(_spelled(t.item_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_spelled(t.field(i).type)) for i in range(t.num_fields)])
    return t


def _scalar_text(x: pa.Scalar) -> Any:
    try:
        return x.as_py()
    except (pa.ArrowException, ValueError, OverflowError):
        return f"<{x.type} out of Python's range>"


def _rows(batch: pa.RecordBatch | pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(_column_values(c) for c in batch.columns), strict=True)) if batch.num_columns else []


def is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


_LABELS = {"timestamp with time zone": "timestamptz", "time with time zone": "timetz"}


def field_label(f: pa.Field) -> str:
    """The type shown for a result column: the DuckDB type it had before the
    shell spelled it as text (``castsql.type`` metadata), else its Arrow type's label."""
    meta = f.metadata or {}
    if b"castsql.type" in meta:
        name = meta[b"castsql.type"].decode().lower()
        return _LABELS.get(name, name)
    return type_label(f.type)


def type_label(t: pa.DataType) -> str:
    """DuckDB's name for an Arrow type, lower case (``int64`` -> ``bigint``).

    Example::

        >>> type_label(pa.timestamp("us", tz="UTC")), type_label(pa.list_(pa.string()))
        ('timestamptz', 'varchar[]')
    """
    simple = {
        pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "integer", pa.int64(): "bigint",
        pa.uint8(): "utinyint", pa.uint16(): "usmallint", pa.uint32(): "uinteger", pa.uint64(): "ubigint",
        pa.float16(): "half", pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean",
        pa.string(): "varchar", pa.large_string(): "varchar", pa.string_view(): "varchar",
        pa.binary(): "blob", pa.large_binary(): "blob", pa.date32(): "date", pa.date64(): "date",
        pa.month_day_nano_interval(): "interval", pa.null(): "null",
    }  # fmt: skip
    if t in simple:
        return simple[t]
    if pa.types.is_timestamp(t):
        if t.tz:
            return "timestamptz"
        return {"s": "timestamp_s", "ms": "timestamp_ms", "us": "timestamp", "ns": "timestamp_ns"}[t.unit]
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return type_label(t.value_type) + "[]"
    if pa.types.is_fixed_size_list(t):
        return f"{type_label(t.value_type)}[{t.list_size}]"
    if pa.types.is_map(t):
        return f"map({type_label(t.key_type)}, {type_label(t.item_type)})"
    if pa.types.is_struct(t):
        return "struct(" + ", ".join(f"{f.name} {type_label(f.type)}" for f in t) + ")"
    if pa.types.is_dictionary(t):
        return type_label(t.value_type)
    return str(t)


# ---------------------------------------------------------------- collecting


@dataclass
class Collected:
    """What a grid shows of a result: the first rows, the last rows, and how many there were."""

    schema: pa.Schema
    head: list[tuple[Any, ...]]
    tail: list[tuple[Any, ...]]
    total: int

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)


def collect(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, maxrows: int, progress: Progress = NO_PROGRESS
) -> Collected:
    """Keep the head and tail of ``batches`` (at most ``maxrows`` rows in all; 0: keep all) and count the rest.

    Example::

        >>> t = pa.table({"x": list(range(100))})
        >>> c = collect(t.to_batches(max_chunksize=7), t.schema, 4)
        >>> [r[0] for r in c.head], [r[0] for r in c.tail], c.total
        ([0, 1], [98, 99], 100)
    """
    keep_all = maxrows <= 0
    head_rows: list[pa.RecordBatch] = []
    head_n = 0
    tail: deque[pa.RecordBatch] = deque()
    tail_n = 0
    bottom = maxrows // 2
    total = 0
    for batch in batches:
        progress.check()
        n = batch.num_rows
        total += n
        progress.rows(n)
        if keep_all or head_n < maxrows:
            take = n if keep_all else min(n, maxrows - head_n)
            head_rows.append(batch.slice(0, take))
            head_n += take
            rest = batch.slice(take) if take < n else None
        else:
            rest = batch
        if rest is not None and bottom and rest.num_rows:
            tail.append(rest)
            tail_n += rest.num_rows
            while tail and tail_n - tail[0].num_rows >= bottom:
                tail_n -= tail.popleft().num_rows
    head = [r for b in head_rows for r in _rows(b)]
    if keep_all or total <= maxrows:
        tail_list: list[tuple[Any, ...]] = [r for b in tail for r in _rows(b)]
        return Collected(schema, head + tail_list, [], total)
    top = maxrows - bottom
    # Only the last `bottom` rows of the deque are shown: convert just those to Python.
    tail_rows = _rows(pa.Table.from_batches(list(tail)).slice(max(0, tail_n - bottom))) if tail else []
    # Fewer than `bottom` rows after the head: the rest of the tail is the end of the head.
    overlap = bottom - len(tail_rows)
    last = (head[len(head) - overlap :] if overlap > 0 else []) + tail_rows[max(0, len(tail_rows) - bottom) :]
    return Collected(schema, head[:top], last[-bottom:] if bottom else [], total)


# ---------------------------------------------------------------- grids


@dataclass(frozen=True)
class _Style:
    top: tuple[str, str, str, str]  # left, fill, joint, right
    mid: tuple[str, str, str, str]
    bottom: tuple[str, str, str, str]
    vertical: str


BOX = _Style(("┌", "─", "┬", "┐"), ("├", "─", "┼", "┤"), ("└", "─", "┴", "┘"), "│")
ASCII = _Style(("+", "-", "+", "+"), ("+", "-", "+", "+"), ("+", "-", "+", "+"), "|")


def _fit(natural: list[int], width: int | None, headers: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide, so the grid fits ``width``.

    Returns (indices of the shown columns, with -1 where a ``…`` column stands
    for the dropped ones; their widths). Columns shrink from the widest down;
    when even their floors do not fit, middle columns are dropped. A column's
    floor is ``MIN_COL_WIDTH``, or its name's width up to ``HEADER_KEEP``.
    """
    k = len(natural)
    idx = list(range(k))
    if width is None or sum(natural) + 3 * k + 1 <= width:
        return idx, list(natural)
    heads = headers or [0] * k
    mins = [min(w, max(MIN_COL_WIDTH, min(h, HEADER_KEEP))) for w, h in zip(natural, heads, strict=True)]
    if sum(mins) + 3 * k + 1 > width:
        # Keep columns from both ends (the first are usually keys, the last often the interesting ones).
        left: list[int] = []
        right: list[int] = []
        used = 1 + 4  # outer border + the "…" column
        lo, hi = 0, k - 1
        take_left = True
        while lo <= hi:
            j = lo if take_left else hi
            if used + mins[j] + 3 > width:
                break
            used += mins[j] + 3
            if take_left:
                left.append(lo)
                lo += 1
            else:
                right.insert(0, hi)
                hi -= 1
            take_left = not take_left
        if not left:
            # Not even one column fits at its floor (a very narrow terminal): show the first, cut to fit.
            left = [0]
            mins[0] = max(1, width - (8 if k > 1 else 4))
        idx = [*left, -1, *right] if len(left) + len(right) < k else [*left, *right]
    shown = [natural[i] if i >= 0 else 1 for i in idx]
    floor = [mins[i] if i >= 0 else 1 for i in idx]
    budget = width - 3 * len(idx) - 1
    # Largest cap C with sum(max(floor, min(w, C))) <= budget; leftovers go one column at a time.
    lo_c, hi_c = 1, max(shown)
    while lo_c < hi_c:
        mid = (lo_c + hi_c + 1) // 2
        if sum(max(f, min(w, mid)) for w, f in zip(shown, floor, strict=True)) <= budget:
            lo_c = mid
        else:
            hi_c = mid - 1
    widths = [max(f, min(w, lo_c)) for w, f in zip(shown, floor, strict=True)]
    spare = budget - sum(widths)
    for j, w in enumerate(shown):
        if spare <= 0:
            break
        if widths[j] < w:
            widths[j] += 1
            spare -= 1
    return idx, widths


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def footer(c: Collected, columns_shown: int | None = None) -> str:
    """``2,100 rows (40 shown)``, plus ``12 columns (5 shown)`` when columns were dropped.

    Example::

        >>> footer(Collected(pa.schema([("x", pa.int64())]), [(1,)], [(2,)], 2100))
        '2,100 rows (2 shown)'
    """
    text = _plural(c.total, "row")
    if c.truncated:
        text += f" ({len(c.head) + len(c.tail):,} shown)"
    k = len(c.schema)
    if columns_shown is not None and columns_shown < k:
        text += f"  {_plural(k, 'column')} ({columns_shown} shown)"
    return text


def render_grid(c: Collected, opts: RenderOptions) -> str:
    """A box (or ASCII table) of the collected rows, fitted to ``opts.width``, with its footer line."""
    schema = c.schema
    if len(schema) == 0:
        return ""
    style = BOX if opts.mode == "box" else ASCII
    names = [_escape_controls(f.name) for f in schema]
    types = [_escape_controls(field_label(f)) for f in schema]
    aligns = ["right" if is_numeric(f.type) else "left" for f in schema]

    def cells(rows: list[tuple[Any, ...]]) -> list[list[tuple[str, bool]]]:
        return [[(_escape_controls(format_value(v, opts.null)), v is None) for v in r] for r in rows]

    head, tail = cells(c.head), cells(c.tail)
    natural = []
    for i in range(len(schema)):
        w = display_width(names[i])
        if opts.types:
            w = max(w, display_width(types[i]))
        for row in (*head, *tail):
            w = max(w, display_width(row[i][0]))
        natural.append(max(w, 1))
    idx, widths = _fit(natural, opts.width, [display_width(n) for n in names])

    def paint(s: str, code: str) -> str:
        return f"{code}{s}{_RESET}" if opts.color and s.strip() else s

    def line(parts: tuple[str, str, str, str]) -> str:
        left, fill, joint, right = parts
        return left + joint.join(fill * (w + 2) for w in widths) + right

    def row_line(values: list[str]) -> str:
        v = style.vertical
        return v + v.join(f" {x} " for x in values) + v

    def fmt(j: int, text: str, align: str, code: str | None = None) -> str:
        s = _pad(truncate(text, widths[j]), widths[j], align)
        return paint(s, code) if code else s

    out = [line(style.top)]
    out.append(row_line([fmt(j, names[i] if i >= 0 else ELLIPSIS, "center", _BOLD) for j, i in enumerate(idx)]))
    if opts.types:
        out.append(row_line([fmt(j, types[i] if i >= 0 else "", "center", _DIM) for j, i in enumerate(idx)]))
    out.append(line(style.mid))

    def data_line(row: list[tuple[str, bool]]) -> str:
        parts = []
        for j, i in enumerate(idx):
            if i < 0:
                parts.append(fmt(j, ELLIPSIS, "center"))
                continue
            text, is_null = row[i]
            parts.append(fmt(j, text, aligns[i], _DIM if is_null else None))
        return row_line(parts)

    out.extend(data_line(r) for r in head)
    if c.truncated:
        out.append(row_line([fmt(j, "·", "center") for j in range(len(idx))]))
        out.extend(data_line(r) for r in tail)
    out.append(line(style.bottom))
    shown = sum(1 for i in idx if i >= 0)
    out.append(paint(footer(c, shown), _DIM))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- writing a result


def write_result(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    out: TextIO,
    opts: RenderOptions,
    progress: Progress = NO_PROGRESS,
) -> int:
    """Print a result in a grid mode (``box``, ``table``); returns the number of rows.

    The batches are drained first, keeping only what the grid shows. The text
    modes are written by DuckDB instead (:mod:`castsql.shell.pipe`).
    """
    if len(schema) == 0:  # a statement without a result (SET …): nothing to print in any mode
        for _ in batches:
            progress.check()
        return 0
    if opts.mode not in GRID_MODES:
        raise ValueError(f"{opts.mode!r} is a text mode: castsql.shell.pipe writes it")
    if schema.names == ["explain_key", "explain_value"]:
        # EXPLAIN's plan is a drawing already: print it as it is, like DuckDB's shell does.
        plans = [v for b in batches for v in b.column(1).to_pylist()]
        progress.begin_output()
        out.write("".join(printable(p if p.endswith("\n") else p + "\n", keep="\n") for p in plans if p))
        return len(plans)
    c = collect(batches, schema, opts.maxrows, progress)
    text = render_grid(c, opts)
    progress.begin_output()
    out.write(text)
    return c.total


def render_table(table: pa.Table, opts: RenderOptions, text: TextOptions | None = None) -> str:
    """``table`` printed in ``opts.mode``, as a string (for tests and examples);
    the text modes through a DuckDB connection of their own."""
    buf = io.StringIO()
    if opts.mode in GRID_MODES or table.num_columns == 0:
        write_result(table.to_batches(), table.schema, buf, opts)
        return buf.getvalue()
    import tempfile

    import duckdb

    from castsql.shell.pipe import arrow_relation, write_text

    con = duckdb.connect()
    try:
        with tempfile.TemporaryDirectory(prefix="castsql-render-") as tmp:
            escape = terminal_text if opts.terminal else None
            write_text(con, arrow_relation(con, table), opts.mode, buf, tmp, text, terminal_escape=escape)
    finally:
        con.close()
    return buf.getvalue()
