"""Where SQL statements end: a small scanner that knows quotes and comments.

The shell needs three answers from raw text, none of which a SQL parser gives
for *incomplete* input: is the statement in the buffer finished (Enter runs it
or inserts a newline), where does each statement of a script end (``.read``,
``-c``, standard input), and is the cursor inside a string or a comment
(completion). A ``;`` ends a statement unless it is inside ``'…'``, ``"…"``,
``$tag$…$tag$``, ``-- …`` or ``/* … */``.

Lines that start with ``.`` between statements are meta-commands, one line
each, like in the DuckDB and SQLite shells.

Example::

    >>> is_complete("SELECT ';' AS semi")
    False
    >>> is_complete("SELECT 1; -- done")
    True
    >>> [(c.kind, c.text, c.line) for c in iter_commands(["SELECT 1;\\n", ".tables\\n", "SELECT\\n", "2;\\n"])]
    [('sql', 'SELECT 1', 1), ('meta', '.tables', 2), ('sql', 'SELECT\\n2', 3)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_DOLLAR_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")

# Scanner states
CODE, SQUOTE, DQUOTE, LINE_COMMENT, BLOCK_COMMENT, DOLLAR = range(6)

# Bare words accepted as "leave the shell" (psql and pgcli users type them).
QUIT_WORDS = {"quit", "exit", "\\q"}


@dataclass(frozen=True)
class Scan:
    """Result of scanning text: the top-level ``;`` offsets and the state at the end."""

    semicolons: list[int]
    state: int  # CODE, SQUOTE, … at the end of the text
    last_code: int  # offset just past the last character outside comments and whitespace (-1: none)


def scan(text: str) -> Scan:
    """Find the statement-ending semicolons of ``text``.

    Example::

        >>> scan("SELECT 'a;b'; SELECT 2;").semicolons
        [12, 22]
    """
    semis: list[int] = []
    state = CODE
    tag = ""
    last_code = -1
    i, n = 0, len(text)
    while i < n:
        if state == CODE:
            state, tag, i, last_code = _code_step(text, i, tag, semis, last_code)
        else:
            state, i, last_code = _quoted_step(text, i, state, tag, last_code)
    return Scan(semis, state, last_code)


def _code_step(text: str, i: int, tag: str, semis: list[int], last_code: int) -> tuple[int, str, int, int]:
    """One step of :func:`scan` in code at ``i``: the next state, dollar tag,
    position and end of the last code character; a ``;`` goes to ``semis``."""
    ch = text[i]
    if ch == "-" and text.startswith("--", i):
        return LINE_COMMENT, tag, i + 2, last_code
    if ch == "/" and text.startswith("/*", i):
        return BLOCK_COMMENT, tag, i + 2, last_code
    if ch == "$" and (m := _DOLLAR_RE.match(text, i)) and not _ident_char_before(text, i):
        return DOLLAR, m.group(0), m.end(), m.end()
    if ch == ";":
        semis.append(i)
    state = SQUOTE if ch == "'" else DQUOTE if ch == '"' else CODE
    return state, tag, i + 1, last_code if ch.isspace() else i + 1


def _quoted_step(text: str, i: int, state: int, tag: str, last_code: int) -> tuple[int, int, int]:
    """One step of :func:`scan` inside a string, quoted name, comment or dollar
    quote (``tag``): the next state, position and end of the last code character."""
    ch = text[i]
    if state in (SQUOTE, DQUOTE):
        quote = "'" if state == SQUOTE else '"'
        if ch != quote:
            return state, i + 1, i + 1
        if text.startswith(quote * 2, i):  # doubled quote: an escaped quote, stay inside
            return state, i + 2, last_code
        return CODE, i + 1, i + 1
    if state == LINE_COMMENT:
        return (CODE if ch == "\n" else state), i + 1, last_code
    if state == BLOCK_COMMENT:
        if ch == "*" and text.startswith("*/", i):
            return CODE, i + 2, last_code
        return state, i + 1, last_code
    if ch == "$" and text.startswith(tag, i):  # DOLLAR: the closing tag
        return CODE, i + len(tag), i + len(tag)
    return state, i + 1, i + 1


def _ident_char_before(text: str, i: int) -> bool:
    # "$1" parameters and identifiers containing "$" are not dollar quotes.
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_$")


def is_complete(text: str) -> bool:
    """True when ``text`` ends with a finished statement: its last code
    character is a top-level ``;`` (trailing whitespace and comments allowed).

    Example::

        >>> is_complete("SELECT 1"), is_complete("SELECT 1;"), is_complete("SELECT '1;")
        (False, True, False)
    """
    s = scan(text)
    if s.state not in (CODE, LINE_COMMENT):
        return False
    return bool(s.semicolons) and s.semicolons[-1] + 1 == s.last_code


def is_meta(text: str) -> bool:
    """A meta-command (``.tables``) or a bare quit word: run on Enter, never continued."""
    stripped = text.strip()
    return stripped.startswith(".") or stripped.lower() in QUIT_WORDS


def in_string_or_comment(text: str) -> bool:
    """Whether the end of ``text`` is inside a string literal, quoted identifier or comment."""
    return scan(text).state != CODE


def current_statement_start(text: str) -> int:
    """Offset where the statement containing the end of ``text`` begins."""
    semis = scan(text).semicolons
    return semis[-1] + 1 if semis else 0


def only_comments(text: str) -> bool:
    """True when ``text`` holds no SQL: whitespace and comments only."""
    return scan(text).last_code < 0


def is_blank(text: str) -> bool:
    """No SQL and no comment still open: a new statement may start after ``text``."""
    s = scan(text)
    return s.last_code < 0 and s.state in (CODE, LINE_COMMENT)


@dataclass(frozen=True)
class Command:
    """One unit of work for the shell: a SQL statement (without its ``;``) or a meta-command line."""

    kind: str  # "sql" | "meta"
    text: str
    line: int  # 1-based line where it starts in its source


def split_statements(text: str) -> tuple[list[tuple[str, int]], str]:
    """Complete statements of ``text`` (stripped, without ``;``, with their start
    offsets) and the unfinished rest.

    Example::

        >>> split_statements("SELECT 1; SELECT 2; SELECT")
        ([('SELECT 1', 0), ('SELECT 2', 10)], ' SELECT')
    """
    out: list[tuple[str, int]] = []
    start = 0
    for semi in scan(text).semicolons:
        piece = text[start:semi]
        if not only_comments(piece):
            lead = len(piece) - len(piece.lstrip())
            out.append((piece.strip(), start + lead))
        start = semi + 1
    return out, text[start:]


def iter_commands(lines: Iterable[str]) -> Iterator[Command]:
    """Statements and meta-commands of a script, in order, as lines arrive.

    A line starting with ``.`` is a meta-command when no statement is pending;
    so is a line that is only ``quit``, ``exit`` or ``\\q`` (as ``.quit``).
    A last statement without ``;`` still runs (as in ``castsql -c "SELECT 1"``).
    Statements are yielded as soon as their ``;`` is read, so a script piped
    from a slow producer runs as it comes.
    """
    pending = ""
    pending_line = 1
    lineno = 0
    for raw in lines:
        lineno += 1
        line = raw if raw.endswith("\n") else raw + "\n"
        if is_blank(pending) and (line.lstrip().startswith(".") or line.strip().lower() in QUIT_WORDS):
            pending = ""
            text = line.strip()
            yield Command("meta", ".quit" if text.lower() in QUIT_WORDS else text, lineno)
            continue
        if is_blank(pending):
            pending, pending_line = "", lineno
        pending += line
        stmts, rest = split_statements(pending)
        for sql, offset in stmts:
            yield Command("sql", sql, pending_line + pending.count("\n", 0, offset))
        if stmts:
            consumed = len(pending) - len(rest)
            pending_line += pending.count("\n", 0, consumed)
            pending = rest
    if not only_comments(pending):
        lead = len(pending) - len(pending.lstrip())
        yield Command("sql", pending.strip(), pending_line + pending.count("\n", 0, lead))
