"""Context-aware completion for the prompt.

What is offered depends on where the cursor is in the current statement:

===========================================  =====================================================
after ``FROM``, ``JOIN``, ``DESCRIBE`` …     table names (then table functions)
after ``t AS OF VERSION`` / ``VERSION AS OF`` versions of ``t``, newest first, with operation and time
  / ``AT (VERSION =>``
after ``t AS OF TIMESTAMP`` …                commit times of ``t`` as timestamp literals
after ``alias.``                             columns of the table behind ``alias``
inside an audit function's ``('`` (``table_changes('`` …)  table names
anywhere else                                columns of the tables the statement names, DuckDB
                                             functions, keywords, table names
a line starting with ``.``                   meta-commands, then their arguments
===========================================  =====================================================

Names match by prefix, case-insensitively; table and column names also match
by substring after the prefix matches. Keywords are inserted in the case the
user is typing in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from castsql.shell.catalog import Catalog, quote_ident
from castsql.shell.statements import BLOCK_COMMENT, DQUOTE, LINE_COMMENT, SQUOTE, current_statement_start, scan
from castsql.storage.uris import S3

_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))|(?P<str>'(?:[^']|'')*'?)|(?P<qid>"(?:[^"]|"")*"?)"""
    r"""|(?P<arrow>=>)|(?P<word>[A-Za-z_][\w$]*)|(?P<num>\d+)|(?P<sym>.)""",
    re.S,
)

_TABLE_KEYWORDS = {"FROM", "JOIN", "INTO", "UPDATE", "TABLE", "DESCRIBE", "SUMMARIZE"}
# Keywords that end a FROM clause (so a later "," is not between tables).
_CLAUSE_END = {
    "WHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "QUALIFY", "WINDOW", "UNION", "EXCEPT", "INTERSECT", "ON",
    "USING", "SELECT", "OFFSET", "RETURNING", "SET", "VALUES",
}  # fmt: skip
_NOT_ALIAS = _CLAUSE_END | {
    "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "POSITIONAL", "ASOF", "ANTI", "SEMI", "OUTER",
    "SAMPLE", "TABLESAMPLE", "LATERAL", "AS", "AT", "VERSION", "TIMESTAMP", "FOR", "FROM",
}  # fmt: skip
_TIME_TRAVEL_PHRASES = ["AS OF VERSION", "VERSION AS OF", "AS OF TIMESTAMP", "TIMESTAMP AS OF"]
_AUDIT_FUNCTIONS = {"TABLE_HISTORY", "TABLE_CHANGES", "TABLE_DIFF", "TABLE_ROW_HISTORY"}


@dataclass(frozen=True)
class Tok:
    kind: str  # word, qid, str, num, sym, arrow
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else self.text

    @property
    def name(self) -> str:
        """The identifier it spells (quotes removed)."""
        if self.kind == "qid":
            return self.text[1:].removesuffix('"').replace('""', '"')
        return self.text


def tokens(sql: str) -> list[Tok]:
    """Words, quoted names, strings, numbers and symbols of ``sql``; whitespace and comments dropped.

    Example::

        >>> [t.text for t in tokens("SELECT a.b -- x\\nFROM t AT (VERSION => 3)")]
        ['SELECT', 'a', '.', 'b', 'FROM', 't', 'AT', '(', 'VERSION', '=>', '3', ')']
    """
    out = []
    for m in _TOKEN_RE.finditer(sql):
        kind = m.lastgroup
        if kind in ("ws", "comment") or kind is None:
            continue
        out.append(Tok(kind, m.group()))
    return out


def _dotted_name(toks: list[Tok], end: int) -> tuple[str | None, int]:
    """The last part of a (possibly qualified) name ending at ``toks[end]``, and where the name starts."""
    if end < 0 or toks[end].kind not in ("word", "qid"):
        return None, end
    start = end
    while start >= 2 and toks[start - 1].text == "." and toks[start - 2].kind in ("word", "qid"):
        start -= 2
    return toks[end].name, start


def table_refs(toks: list[Tok]) -> dict[str, str]:
    """Tables named after FROM/JOIN (and commas in a FROM clause), keyed by alias and by name (lower case).

    Example::

        >>> sorted(table_refs(tokens("SELECT * FROM events AS OF VERSION 3 e JOIN users u ON e.id = u.id")).items())
        [('e', 'events'), ('events', 'events'), ('u', 'users'), ('users', 'users')]
    """
    refs: dict[str, str] = {}
    in_from = False
    i = 0
    n = len(toks)
    while i < n:
        t = toks[i]
        up = t.upper
        if up in ("FROM", "JOIN", "UPDATE", "INTO") or (up == "," and in_from):
            in_from = up in ("FROM", "JOIN") or (up == "," and in_from)
            j = i + 1
            if j < n and toks[j].kind in ("word", "qid") and toks[j].upper not in _NOT_ALIAS | {"("}:
                # qualified names: take the last part
                k = j
                while k + 2 < n and toks[k + 1].text == "." and toks[k + 2].kind in ("word", "qid"):
                    k += 2
                if k + 1 < n and toks[k + 1].text == "(":  # a table function
                    i = k + 1
                    continue
                name = toks[k].name
                refs[name.lower()] = name
                k = _skip_time_travel(toks, k + 1)
                if k < n and toks[k].upper == "AS":
                    k += 1
                if k < n and toks[k].kind in ("word", "qid") and toks[k].upper not in _NOT_ALIAS:
                    refs[toks[k].name.lower()] = name
                    k += 1
                i = k
                continue
        elif up in _CLAUSE_END:
            in_from = False
        i += 1
    return refs


def _skip_time_travel(toks: list[Tok], k: int) -> int:
    words = [t.upper for t in toks[k : k + 4]]
    if words[:3] in (["AS", "OF", "VERSION"], ["AS", "OF", "TIMESTAMP"]):
        k += 3
        if k < len(toks) and toks[k].upper in ("TIMESTAMP", "TIMESTAMPTZ") and words[2] == "TIMESTAMP":
            k += 1
        return k + 1
    if words[:3] in (["VERSION", "AS", "OF"], ["TIMESTAMP", "AS", "OF"]):
        k += 3
        if k < len(toks) and toks[k].upper in ("TIMESTAMP", "TIMESTAMPTZ") and words[0] == "TIMESTAMP":
            k += 1
        return k + 1
    if words[:4] == ["FOR", "SYSTEM_TIME", "AS", "OF"]:
        return k + 5
    if words[:2] == ["AT", "("]:
        depth = 0
        while k < len(toks):
            if toks[k].text == "(":
                depth += 1
            elif toks[k].text == ")":
                depth -= 1
                if depth == 0:
                    return k + 1
            k += 1
    return k


class SQLCompleter(Completer):
    """prompt_toolkit completer for CastSQL statements and meta-commands (see the module doc)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._paths = PathCompleter(expanduser=True)

    # ------------------------------------------------------------ entry

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if document.text.lstrip().startswith("."):
            yield from self._meta(text.lstrip())
            return
        start = current_statement_start(text)
        before = text[start:]
        after = document.text_after_cursor
        semis = scan(after).semicolons
        whole = before + (after[: semis[0]] if semis else after)
        state = scan(before).state
        if state in (LINE_COMMENT, BLOCK_COMMENT, DQUOTE):
            return
        if state == SQUOTE:
            yield from self._in_string(before)
            return
        yield from self._sql(before, whole)

    # ------------------------------------------------------------ SQL

    def _sql(self, before: str, whole: str) -> Iterator[Completion]:
        m = re.search(r"((?:[A-Za-z_][\w$]*|\"(?:[^\"]|\"\")*\")\.)?([A-Za-z_][\w$]*|\d*)$", before)
        qualifier = m.group(1) if m else None
        partial = m.group(2) if m else ""
        head = before[: len(before) - len(partial) - (len(qualifier) if qualifier else 0)]
        prev = tokens(head)
        ups = [t.upper for t in prev]
        refs = table_refs(tokens(whole))

        if qualifier:
            q = qualifier[:-1]
            q = q[1:-1].replace('""', '"') if q.startswith('"') else q
            table = refs.get(q.lower()) or self.catalog.table_name(q)
            if table:
                yield from self._columns([table], partial)
            return

        table = _time_travel_table(prev, ups, "VERSION")
        if table is not None:
            if partial.isdigit() or not partial:
                yield from self._versions(table, partial)
            return
        table = _time_travel_table(prev, ups, "TIMESTAMP")
        if table is not None and not partial:
            yield from self._timestamps(table, "")
            return
        if partial[:1].isdigit():
            return

        last = ups[-1] if ups else ""
        if last in _TABLE_KEYWORDS or ups[-2:] == ["DESCRIBE", "HISTORY"] or (last == "," and _in_from(ups)):
            yield from self._tables(partial)
            yield from self._functions(partial, kinds={"table", "table_macro"})
            return

        # Right after a table in FROM/JOIN: the time-travel clauses are what one types next.
        name, name_start = _dotted_name(prev, len(prev) - 1)
        if (
            name is not None
            and name_start > 0
            and (ups[name_start - 1] in ("FROM", "JOIN") or (ups[name_start - 1] == "," and _in_from(ups)))
            and self.catalog.table_name(name)
        ):
            for phrase in _TIME_TRAVEL_PHRASES:
                if phrase.startswith(partial.upper()) and partial:
                    yield Completion(_case(phrase, partial), -len(partial), display_meta="time travel")

        tables = [t for t in dict.fromkeys(refs.values()) if self.catalog.table_name(t)]
        yield from self._columns(tables, partial)
        if partial:
            yield from self._functions(partial)
            yield from self._keywords(partial)
            yield from self._tables(partial)

    def _in_string(self, before: str) -> Iterator[Completion]:
        quote = before.rfind("'")
        partial = before[quote + 1 :]
        prev = tokens(before[:quote])
        ups = [t.upper for t in prev]
        if len(ups) >= 2 and ups[-1] == "(" and ups[-2] in _AUDIT_FUNCTIONS:
            for t in self._match(self.catalog.tables(), partial):
                yield Completion(t + "'", -len(partial), display=t, display_meta="table")
            return
        table = _time_travel_table(prev, ups, "TIMESTAMP")
        if table is not None:
            yield from self._timestamps(table, partial, quoted=True)

    # ------------------------------------------------------------ sources

    @staticmethod
    def _match(names: Iterable[str], partial: str, substring: bool = True) -> list[str]:
        p = partial.lower()
        names = list(names)
        first = [n for n in names if n.lower().startswith(p)]
        if not substring or not p:
            return first
        return first + [n for n in names if p in n.lower() and not n.lower().startswith(p)]

    def _tables(self, partial: str) -> Iterator[Completion]:
        reserved = self.catalog.reserved()
        for t in self._match(self.catalog.tables(), partial):
            yield Completion(quote_ident(t, reserved), -len(partial), display=t, display_meta="table")

    def _columns(self, tables: list[str], partial: str) -> Iterator[Completion]:
        reserved = self.catalog.reserved()
        seen: set[str] = set()
        for table in tables:
            cols = dict(self.catalog.columns(table))
            for c in self._match(cols, partial):
                if c in seen:
                    continue
                seen.add(c)
                meta = f"{cols[c]} · {table}" if len(tables) > 1 else cols[c]
                yield Completion(quote_ident(c, reserved), -len(partial), display=c, display_meta=meta)

    def _functions(self, partial: str, kinds: set[str] | None = None) -> Iterator[Completion]:
        if not partial:
            return
        for f in self.catalog.functions():
            if (kinds is None or f.kinds & kinds) and f.name.lower().startswith(partial.lower()):
                yield Completion(f.name, -len(partial), display=f.name + "()", display_meta=f.kind)

    def _keywords(self, partial: str) -> Iterator[Completion]:
        p = partial.upper()
        for k in self.catalog.keywords():
            if k.startswith(p):
                yield Completion(_case(k, partial), -len(partial), display_meta="keyword")

    def _versions(self, table: str, partial: str) -> Iterator[Completion]:
        for v in self.catalog.versions(table):
            s = str(v.version)
            if s.startswith(partial):
                meta = " ".join(
                    x for x in (v.operation, v.created_at.strftime("%Y-%m-%d %H:%M:%S") if v.created_at else None) if x
                )
                yield Completion(s, -len(partial), display_meta=meta or "version")

    def _timestamps(self, table: str, partial: str, quoted: bool = False) -> Iterator[Completion]:
        for v in self.catalog.versions(table):
            if v.created_at is None:
                continue
            ts = v.created_at.strftime("%Y-%m-%d %H:%M:%S.%f%z")
            text = ts + "'" if quoted else f"'{ts}'"
            if ts.startswith(partial):
                yield Completion(text, -len(partial), display=ts, display_meta=f"v{v.version} {v.operation or ''}")

    # ------------------------------------------------------------ meta-commands

    def _meta(self, text: str) -> Iterator[Completion]:
        from castsql.shell.special import lookup
        from castsql.shell.special.registry import all_names

        if " " not in text:
            for name in all_names():
                if name.startswith(text.lower()):
                    cmd = lookup(name)
                    yield Completion(name, -len(text), display_meta=cmd.help if cmd else "")
            return
        name, rest = text.split(" ", 1)
        cmd = lookup(name)
        if cmd is None:
            return
        words = rest.split(" ")
        partial = words[-1]
        done = [w for w in words[:-1] if w]
        if cmd.name == ".open" and done[:1] == ["--add"]:
            done = done[1:]
        pos = len(done)
        if pos >= len(cmd.args):
            return
        yield from self._meta_argument(cmd.args[pos], partial, done)

    def _meta_argument(self, kind: str, partial: str, done: list[str]) -> Iterator[Completion]:
        """Completions of a meta-command's argument of ``kind`` (its registry's
        argument kinds), ``done`` the arguments before it."""
        from castsql.shell.render import MODES
        from castsql.shell.special import COMMANDS

        if kind == "table":
            for t in self._match(self.catalog.tables(), partial):
                yield Completion(t, -len(partial), display_meta="table")
        elif kind == "version" and done:
            table = self.catalog.table_name(done[0])
            if table:
                yield from self._versions(table, partial)
        elif kind == "mode":
            for m in MODES:
                if m.startswith(partial.lower()):
                    yield Completion(m, -len(partial))
        elif kind == "onoff":
            for w in ("on", "off"):
                if w.startswith(partial.lower()):
                    yield Completion(w, -len(partial))
        elif kind == "command":
            for c in sorted(COMMANDS):
                if c.startswith(partial if partial.startswith(".") else "." + partial):
                    yield Completion(c, -len(partial))
        elif kind in ("path", "uri") and not partial.startswith(S3.prefix):
            yield from self._paths.get_completions(Document(partial), CompleteEvent())


def _case(keyword: str, typed: str) -> str:
    """A keyword in the case the user types in (lower case stays lower)."""
    return keyword.lower() if typed and typed == typed.lower() else keyword


def _in_from(ups: list[str]) -> bool:
    for u in reversed(ups):
        if u in ("FROM", "JOIN"):
            return True
        if u in _CLAUSE_END or u == "(":
            return False
    return False


def _time_travel_table(prev: list[Tok], ups: list[str], kind: str) -> str | None:
    """The table before a time-travel clause that ends right here, for ``kind`` VERSION or TIMESTAMP."""
    if ups[-3:] == ["AS", "OF", kind] or ups[-3:] == [kind, "AS", "OF"]:
        end = len(prev) - 4
    elif (
        (ups[-2:] == [kind, "=>"] and ups[-4:-2] == ["AT", "("])
        or (kind == "TIMESTAMP" and ups[-4:] == ["FOR", "SYSTEM_TIME", "AS", "OF"])
        or (
            kind == "TIMESTAMP"
            and ups[-4:] in (["AS", "OF", "TIMESTAMP", "TIMESTAMP"], ["TIMESTAMP", "AS", "OF", "TIMESTAMP"])
        )
    ):
        end = len(prev) - 5
    else:
        return None
    name, _ = _dotted_name(prev, end)
    return name
