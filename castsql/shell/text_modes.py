"""The text output modes as SQL: DuckDB formats every row, Python only moves bytes.

``csv``, ``tabs``, ``list``, ``json``, ``jsonlines``, ``markdown`` and
``line`` write the exact text DuckDB's own CLI writes for the same mode,
options and values (``duckdb -csv -c …``): each value as DuckDB's VARCHAR cast,
NULL as the null text (``NULL`` unless ``-nullvalue`` says otherwise), and each
mode's quoting rules:

* csv: a value is quoted (``"…"``, quotes doubled) when it holds a control
  character, a quote (``"`` or ``'``), a byte outside ASCII, or the separator;
* json/jsonlines: integers (up to BIGINT and UINTEGER), booleans, floats and
  nested values as JSON (``NaN``/``Infinity`` as the CLI spells them),
  everything else, DECIMAL and HUGEINT included, as a JSON string;
* markdown: ``|`` escaped, columns as wide as their widest value (so the
  result is read twice: once for the widths, once for the rows);
* line: ``name = value``, one per line, names right-aligned, rows apart by a
  blank line.

A mode is a :class:`TextPlan`: the text before the rows, the SQL of each
row's cells as the CLI spells them, the ``COPY`` options under which one of
DuckDB's writers joins them (its csv writer with quoting off, or its JSON
writer), and how the text ends. :mod:`castsql.shell.pipe` runs it. Every
reference to a column is positional (``#3``), so duplicate or odd column
names are harmless.

Example::

    >>> p = plan_text("csv", ["id", "name"], ["BIGINT", "VARCHAR"], TextOptions())
    >>> p.head
    'id,name\\n'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from castsql.engine.sql.quoting import ident, sql_str

TEXT_MODES = ("csv", "tabs", "list", "json", "jsonlines", "markdown", "line")
ALIASES = {"tsv": "tabs"}

_INTEGERS = frozenset(
    {"tinyint", "smallint", "integer", "bigint", "utinyint", "usmallint", "uinteger", "ubigint", "hugeint", "uhugeint"}
)
NUMERIC = _INTEGERS | {"float", "double", "decimal"}  # DuckDB's LogicalType::IsNumeric
_JSON_QUOTED_NUMBERS = frozenset({"ubigint", "hugeint", "uhugeint", "decimal"})  # the CLI writes these as strings
_NESTED = frozenset({"list", "struct", "map", "array", "union"})
# Types whose VARCHAR cast is plain ASCII made of these characters only: no control, quote or non-ASCII byte.
_PLAIN_TYPES = NUMERIC | {
    "boolean", "date", "time", "time with time zone", "time_ns", "timestamp", "timestamp with time zone",
    "timestamp_s", "timestamp_ms", "timestamp_ns", "interval", "uuid",
}  # fmt: skip
_PLAIN_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .:+-()")

# East Asian wide and fullwidth ranges: two columns on a terminal (as the CLI's RenderLength counts them).
_WIDE = (
    "[\\x{1100}-\\x{115F}\\x{2E80}-\\x{303E}\\x{3041}-\\x{33FF}\\x{3400}-\\x{4DBF}\\x{4E00}-\\x{9FFF}"
    "\\x{A000}-\\x{A4CF}\\x{AC00}-\\x{D7A3}\\x{F900}-\\x{FAFF}\\x{FE30}-\\x{FE4F}\\x{FF00}-\\x{FF60}"
    "\\x{FFE0}-\\x{FFE6}\\x{1F300}-\\x{1F64F}\\x{1F900}-\\x{1F9FF}\\x{20000}-\\x{2FFFD}\\x{30000}-\\x{3FFFD}]"
)


def _csv_options(sep: str, null: str = "") -> str:
    """DuckDB's csv writer with quoting off: each cell written as it is, ``sep`` between."""
    return f"FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER {sql_str(sep)}, NULLSTR {sql_str(null)}"


# Each row's text is one value: the csv writer with quoting off writes it as it is.
_WHOLE_ROWS = _csv_options("\x01")


def _one_byte(sep: str) -> bool:
    """DuckDB's csv writer writes only the first byte of a longer delimiter (and
    fails on a byte above 0x7f): others are joined in SQL."""
    return (len(sep) == 1 and " " <= sep < "\x7f") or sep == "\t"


@dataclass(frozen=True)
class TextOptions:
    """What DuckDB's CLI flags change: ``-separator``, ``-nullvalue``, ``-header``/``-noheader``.

    ``separator`` None is each mode's own (``,`` for csv, tab for tabs, ``|`` for list).
    """

    separator: str | None = None
    null: str = "NULL"
    header: bool = True


@dataclass(frozen=True)
class TextPlan:
    """How one result is written: ``COPY (SELECT select…) TO pipe (options)``.

    ``head``: text before the first row (a header). ``select``: the SQL
    expressions of the rows' columns; ``options``: the ``COPY`` options that
    join them (DuckDB's csv writer with quoting off, or its JSON writer). When
    the columns need joining DuckDB's writers cannot do (separators of more than
    one byte, markdown's padding), ``select`` is one expression that makes the
    whole row's text. ``drop_tail`` bytes of the text are replaced by ``tail``
    at the end; ``empty``: the text after ``head`` when there are no rows.
    ``join_rows``: rows are apart by ``,`` as well as a newline (a JSON
    array). ``widths``: SQL whose one row is what :func:`markdown_plan` needs.
    """

    head: str
    select: tuple[str, ...]
    options: str = _WHOLE_ROWS
    drop_tail: int = 0
    tail: str = ""
    empty: str = ""
    join_rows: bool = False
    json: bool = False
    widths: str | None = None


def normal_mode(mode: str) -> str:
    """``mode`` under the name the shell keeps (``tsv`` is DuckDB's ``tabs``)."""
    m = mode.lower()
    return ALIASES.get(m, m)


def _kind(duck_type: str) -> str:
    """DuckDB's type id for a type's text (``DECIMAL(10,2)`` -> ``decimal``, ``INTEGER[]`` -> ``list``)."""
    t = duck_type.strip()
    upper = t.upper()
    if upper.endswith("]"):
        return "array" if not upper.endswith("[]") else "list"
    for prefix in ("STRUCT", "MAP", "UNION", "DECIMAL", "ENUM"):
        if upper.startswith(prefix + "(") or upper == prefix:
            return prefix.lower()
    return t.lower()


def _text(i: int, kind: str) -> str:
    return f"#{i}" if kind == "varchar" else f"CAST(#{i} AS VARCHAR)"


# ---------------------------------------------------------------- csv, tabs, list


def csv_quote(s: str, sep: str) -> str:
    """``s`` as the CLI's csv mode writes it (header names, the null text).

    Example::

        >>> csv_quote("a,b", ","), csv_quote("é", ","), csv_quote("plain", ",")
        ('"a,b"', '"é"', 'plain')
    """
    needs = (sep and sep in s) or any(c <= "\x1f" or c in "\"'" or c >= "\x7f" for c in s)
    return '"' + s.replace('"', '""') + '"' if needs else s


def _csv_cell(i: int, kind: str, sep: str, null: str | None) -> str:
    """A csv cell quoted as the CLI quotes it; NULL stays NULL when ``null`` is None
    (the writer's NULLSTR then writes it)."""
    v = _text(i, kind)
    sep_can_occur = bool(set(sep) & _PLAIN_CHARS)
    if kind in _PLAIN_TYPES and not sep_can_occur:
        return f"#{i}" if null is None else f"coalesce({v}, {sql_str(null)})"
    needs = f"regexp_matches({v}, '[\\x00-\\x1f\"''\\x7f-\\x{{10FFFF}}]')"
    if sep:
        needs = f"({needs} OR contains({v}, {sql_str(sep)}))"
    quoted = f"'\"' || replace({v}, '\"', '\"\"') || '\"'"
    cell = f"CASE WHEN {needs} THEN {quoted} ELSE {v} END"
    return cell if null is None else f"CASE WHEN #{i} IS NULL THEN {sql_str(null)} ELSE {cell} END"


def _csv(names: Sequence[str], kinds: Sequence[str], opts: TextOptions) -> TextPlan:
    sep = opts.separator if opts.separator is not None else ","
    head = sep.join(csv_quote(n, sep) for n in names) + "\n" if opts.header else ""
    null = csv_quote(opts.null, sep)
    if _one_byte(sep):
        cells = tuple(_csv_cell(i, k, sep, None) for i, k in enumerate(kinds, 1))
        return TextPlan(head, cells, _csv_options(sep, null))
    cells = tuple(_csv_cell(i, k, sep, null) for i, k in enumerate(kinds, 1))
    return TextPlan(head, (f" || {sql_str(sep)} || ".join(cells),))


def _list(names: Sequence[str], kinds: Sequence[str], opts: TextOptions, default_sep: str) -> TextPlan:
    sep = opts.separator if opts.separator is not None else default_sep
    head = sep.join(names) + "\n" if opts.header else ""
    if _one_byte(sep):
        cells = tuple(f"#{i}" if k in _PLAIN_TYPES else _text(i, k) for i, k in enumerate(kinds, 1))
        return TextPlan(head, cells, _csv_options(sep, opts.null))
    texts = [f"coalesce({_text(i, k)}, {sql_str(opts.null)})" for i, k in enumerate(kinds, 1)]
    return TextPlan(head, (f" || {sql_str(sep)} || ".join(texts),))


# ---------------------------------------------------------------- json


_JSON_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def json_string(s: str) -> str:
    r"""``s`` as a JSON string the way the CLI escapes it: ``\`` and ``"``, and
    control characters below 0x20; everything else as it is.

    Example::

        >>> json_string('a"b\n\x01é')
        '"a\\"b\\n\\u0001é"'
    """
    out = ['"']
    for c in s:
        if c in '\\"':
            out.append("\\" + c)
        elif c <= "\x1f":
            out.append(_JSON_ESCAPES.get(c, f"\\u{ord(c):04x}"))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _json_escaped_sql(v: str) -> str:
    """SQL for ``v`` escaped as :func:`json_string` does, without the quotes; the
    long chain of replaces runs only for values that need one."""
    e = f"replace(replace({v}, '\\', '\\\\'), '\"', '\\\"')"
    for code in range(0x20):
        esc = _JSON_ESCAPES.get(chr(code), f"\\u{code:04x}")
        e = f"replace({e}, chr({code}), {sql_str(esc)})"
    return f"CASE WHEN regexp_matches({v}, '[\\x00-\\x1f\"\\\\]') THEN {e} ELSE {v} END"


def _json_spelling(kind: str, duck_type: str) -> str:
    """How the CLI writes a column's values in JSON: ``json`` (nested values and
    floats, through DuckDB's JSON cast), ``raw`` (the VARCHAR cast as it is:
    booleans, JSON, numbers but those it quotes) or ``string``."""
    if kind in _NESTED or kind in ("float", "double"):
        return "json"
    if duck_type.upper() == "JSON" or kind == "boolean" or (kind in NUMERIC and kind not in _JSON_QUOTED_NUMBERS):
        return "raw"
    return "string"


def _json_value(i: int, kind: str, duck_type: str) -> str:
    spelling = _json_spelling(kind, duck_type)
    if spelling == "json":
        value = f"CAST(CAST(#{i} AS JSON) AS VARCHAR)"
    elif spelling == "raw":
        value = f"CAST(#{i} AS VARCHAR)"
    else:
        value = "'\"' || " + _json_escaped_sql(_text(i, kind)) + " || '\"'"
    return f"coalesce({value}, 'null')"


def _json(names: Sequence[str], kinds: Sequence[str], types: Sequence[str], array: bool) -> TextPlan:
    ends = {"drop_tail": 2, "tail": "]\n", "empty": "]\n"} if array else {"empty": "\n"}
    head = "[" if array else ""
    if len({n.lower() for n in names}) == len(names) and all(names):
        # DuckDB's JSON writer, each column cast to what the CLI writes: numbers
        # it quotes become text, the rest as the writer spells them.
        cols = [
            f"#{i} AS {ident(n)}" if _json_spelling(k, t) != "string" else f"CAST(#{i} AS VARCHAR) AS {ident(n)}"
            for i, (n, k, t) in enumerate(zip(names, kinds, types, strict=True), 1)
        ]
        return TextPlan(head, tuple(cols), "FORMAT json", join_rows=array, json=True, **ends)
    # Names the writer cannot carry (duplicates, empty): the objects made in SQL.
    parts = [
        f"{sql_str(('{' if i == 1 else ',') + json_string(n) + ':')} || {_json_value(i, k, t)}"
        for i, (n, k, t) in enumerate(zip(names, kinds, types, strict=True), 1)
    ]
    row = " || ".join(parts) + " || '}'"
    return TextPlan(head, (row,), join_rows=array, **ends)


# ---------------------------------------------------------------- markdown


def width_sql(s: str) -> str:
    """SQL for the terminal columns text ``s`` takes: its byte length when ASCII,
    else its grapheme clusters plus one for each wide (CJK, fullwidth) character."""
    return (
        f"CASE WHEN strlen({s}) = length({s}) THEN strlen({s}) "
        f"ELSE length_grapheme({s}) + length(regexp_replace({s}, '[^' || {sql_str(_WIDE[1:-1])} || ']', '', 'g')) END"
    )


# The longest text is the smallest value's or the largest's (more digits, a
# minus sign, a " (BC)"): no need to cast every value.
_EXTREMES = _INTEGERS | {"decimal", "date"}
_WHOLE_SECONDS = frozenset({"timestamp", "timestamp with time zone"})  # the same, when no value has a fraction
_UTC = "('UTC', 'Etc/UTC', 'GMT', 'Etc/GMT', 'Etc/UCT', 'UCT', 'Universal', 'Zulu')"


def _nulls(i: int, null_w: str) -> str:
    """SQL: the NULL text's width ``null_w`` where column ``i`` holds a NULL, else 0."""
    return f"CASE WHEN count(*) > count(#{i}) THEN {null_w} ELSE 0 END"


def _md_text(i: int, kind: str, pipes: int) -> str:
    """Column ``i``'s text in a markdown cell: ``|`` escaped where one occurs."""
    return f"replace({_text(i, kind)}, '|', '\\|')" if pipes else _text(i, kind)


def _inexact(measured: Sequence[int], i: int) -> bool:
    """The first pass could not measure column ``i`` cheaply: text beyond plain
    ASCII or holding ``|``, or a timestamp with fractions (its width -1)."""
    widest, ascii_only, pipes = measured[4 * i - 3 : 4 * i]
    return not ascii_only or bool(pipes) or widest < 0


def _markdown_widths(names: Sequence[str], kinds: Sequence[str], opts: TextOptions) -> TextPlan:
    """The first pass: per column, its name's width, its widest value's (the null
    text's where a NULL is), whether every value is ASCII, whether any holds a
    ``|``. For text the widest value is its byte length, exact only when the
    column is ASCII without ``|``: :func:`markdown_plan` measures the others."""
    null_w = width_sql(sql_str(opts.null))
    cols = []
    for i, (n, k) in enumerate(zip(names, kinds, strict=True), 1):
        nulls = _nulls(i, null_w)
        extremes = f"coalesce(greatest(strlen(CAST(min(#{i}) AS VARCHAR)), strlen(CAST(max(#{i}) AS VARCHAR))), 0)"
        if k in _EXTREMES:  # no cast of every value
            widest, flags = f"greatest({extremes}, {nulls})", "1, 0"
        elif k in _WHOLE_SECONDS:
            # Fractions (".5", ".123456") and time zone offsets ("+05:30") vary in
            # width: -1 asks for every value to be cast.
            varies = f"bool_or(epoch_us(#{i}) % 1000000 <> 0)"
            if k == "timestamp with time zone":
                varies += f" OR current_setting('TimeZone') NOT IN {_UTC}"
            widest, flags = f"CASE WHEN {varies} THEN -1 ELSE greatest({extremes}, {nulls}) END", "1, 0"
        elif k in _PLAIN_TYPES:  # plain ASCII
            widest, flags = f"greatest(coalesce(max(strlen(CAST(#{i} AS VARCHAR))), 0), {nulls})", "1, 0"
        else:
            t = _text(i, k)
            widest = f"greatest(coalesce(max(strlen({t})), 0), {nulls})"
            ascii_only = f"coalesce(bool_and(strlen({t}) = length({t})), true)::INT"
            flags = f"{ascii_only}, coalesce(bool_or(contains({t}, '|')), false)::INT"
        name = sql_str(n.replace("|", "\\|"))
        cols.append(f"{width_sql(name)}, {widest}, {flags}")
    return TextPlan("", (), widths="SELECT " + ", ".join(cols))


def markdown_plan(
    names: Sequence[str],
    types: Sequence[str],
    opts: TextOptions,
    widths: str,
    measure: Callable[[str], Sequence[Any]],
) -> TextPlan:
    """The markdown plan: ``measure`` runs the first pass's ``widths`` SELECT (and,
    for columns it could not measure cheaply, one pass of exact widths) over
    the result and returns its one row; then each cell is padded in SQL and
    the cells joined by DuckDB's csv writer with ``|``."""
    kinds = [_kind(t) for t in types]
    measured = [int(x) for x in measure(widths)]
    inexact = [i for i in range(1, len(kinds) + 1) if _inexact(measured, i)]
    if inexact:
        null_w = width_sql(sql_str(opts.null))
        texts = {i: _md_text(i, kinds[i - 1], measured[4 * i - 1]) for i in inexact}
        exact = [f"greatest(coalesce(max({width_sql(texts[i])}), 0), {_nulls(i, null_w)})" for i in inexact]
        for i, w in zip(inexact, measure("SELECT " + ", ".join(exact)), strict=True):
            measured[4 * i - 3] = int(w)
    header, rule, cells = [], [], []
    for i, (n, k) in enumerate(zip(names, kinds, strict=True), 1):
        name_w, value_w, ascii_only, pipes = measured[4 * i - 4 : 4 * i]
        w = max(name_w, value_w)
        gap = w - name_w
        header.append(" " * (gap // 2) + n.replace("|", "\\|") + " " * ((gap + 1) // 2))
        rule.append("-" * (w + 1) + ":" if k in NUMERIC else "-" * (w + 2))
        x = f"coalesce({_md_text(i, k, pipes)}, {sql_str(opts.null)})"
        # strlen where every byte is a column (rpad is several times slower than repeat)
        width = f"strlen({x})" if ascii_only and opts.null.isascii() else f"({width_sql(x)})"
        left = "'| '" if i == 1 else "' '"
        right = "' |'" if i == len(names) else "' '"
        cells.append(f"concat({left}, {x}, repeat(' ', {w} - {width}), {right})")
    head = "| " + " | ".join(header) + " |\n" + "|" + "|".join(rule) + "|\n"
    return TextPlan(head, tuple(cells), _csv_options("|"))


# ---------------------------------------------------------------- line


def _line(names: Sequence[str], kinds: Sequence[str], opts: TextOptions) -> TextPlan:
    # The CLI pads names by their length in bytes (at least 5), not their width.
    w = max([5, *(len(n.encode()) for n in names)])
    null = sql_str(opts.null)
    parts = [
        f"{sql_str(' ' * (w - len(n.encode())) + n + ' = ')} || coalesce({_text(i, k)}, {null}) || chr(10)"
        for i, (n, k) in enumerate(zip(names, kinds, strict=True), 1)
    ]
    # Rows are apart by one blank line: each row's text ends in "\n", the writer adds one more, the last is dropped.
    return TextPlan("", (" || ".join(parts),), drop_tail=1)


def plan_text(mode: str, names: Sequence[str], types: Sequence[str], opts: TextOptions) -> TextPlan:
    """The plan for writing a result of columns ``names`` of DuckDB ``types`` in ``mode``.

    For markdown this is a first plan whose ``widths`` query must be run and
    handed to :func:`markdown_plan`.
    """
    kinds = [_kind(t) for t in types]
    mode = normal_mode(mode)
    if mode == "csv":
        return _csv(names, kinds, opts)
    if mode == "tabs":
        return _list(names, kinds, opts, "\t")
    if mode == "list":
        return _list(names, kinds, opts, "|")
    if mode in ("json", "jsonlines"):
        return _json(names, kinds, types, mode == "json")
    if mode == "markdown":
        return _markdown_widths(names, kinds, opts)
    if mode == "line":
        return _line(names, kinds, opts)
    raise ValueError(f"unknown text mode {mode!r} (modes: {', '.join(TEXT_MODES)})")
