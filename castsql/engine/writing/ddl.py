"""SQL that makes or maintains a table: which statement it is, and what it asks for.

Beside :mod:`castsql.engine.writing.writes` (rows), the statements on a whole table,
parsed on DuckDB's tokens into plain descriptions that the embedded engine
runs (:mod:`castsql.embedded.sql_tables`):

- ``CREATE TABLE [IF NOT EXISTS] t (id BIGINT PRIMARY KEY, …) [TBLPROPERTIES (…)]``
  and ``CREATE TABLE t [PRIMARY KEY (id)] [TBLPROPERTIES (…)] AS SELECT …``
  (``WITH (…)`` is the same as ``TBLPROPERTIES (…)``): :class:`CreateTable`;
- ``ALTER TABLE t ADD [COLUMN] c TYPE``, ``ALTER TABLE t ALTER [COLUMN] c
  [SET DATA] TYPE T``, ``ALTER TABLE t SET|UNSET TBLPROPERTIES (…)``: :class:`AlterTable`;
- ``RESTORE [TABLE] t TO VERSION AS OF n`` / ``TO TIMESTAMP AS OF '…'``: :class:`Restore`;
- ``OPTIMIZE t [ZORDER BY (c) | SORT BY c]``: :class:`Optimize`;
- ``VACUUM t [RETAIN n HOURS] [DRY RUN]``: :class:`Vacuum`.

Example::

    >>> parse("RESTORE TABLE events TO VERSION AS OF 3", {"events"}.__contains__)
    Restore(table='events', version=3, timestamp=None)
    >>> parse("OPTIMIZE events ZORDER BY (ts)", {"events"}.__contains__)
    Optimize(table='events', sort_by='ts')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from castsql.engine.sql.tokens import Token, string_value
from castsql.engine.writing.writes import (
    WriteRefused,
    _close,
    _name,
    _split_top,
    _text,
    _top,
    _unquoted,
    _w,
    statements,
)


@dataclass(frozen=True)
class CreateTable:
    """A new table under the session's warehouse: ``columns`` (name, DuckDB
    type) or the rows of ``query``."""

    table: str
    columns: tuple[tuple[str, str], ...] = ()
    primary_key: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    query: str | None = None
    if_not_exists: bool = False


@dataclass(frozen=True)
class AlterTable:
    """``add``: new columns (name, DuckDB type); ``widen``: columns to a wider
    type; ``properties``: set (a value) or unset (None)."""

    table: str
    add: dict[str, str] = field(default_factory=dict)
    widen: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Restore:
    table: str
    version: int | None
    timestamp: str | None = None


@dataclass(frozen=True)
class Optimize:
    table: str
    sort_by: str | None = None


@dataclass(frozen=True)
class Vacuum:
    table: str
    retain_hours: float | None = None
    dry_run: bool = False


TableStatement = CreateTable | AlterTable | Restore | Optimize | Vacuum
HEADS = ("create", "alter", "restore", "optimize", "vacuum")


def parse(sql: str, is_table: Callable[[str], bool], can_create: bool = False) -> TableStatement | None:
    """What ``sql`` (one statement) asks of a CastSQL table, or None when it
    is not such a statement. ``can_create``: the session has one warehouse,
    where ``CREATE TABLE`` makes a table (without one, ``CREATE TABLE`` is
    DuckDB's, in memory)."""
    parts = statements(sql)
    if len(parts) != 1:
        return None
    toks = parts[0]
    head = _w(toks[0])
    if head == "CREATE" and _w(toks[1] if len(toks) > 1 else None) == "TABLE":
        return _create(sql, toks, is_table) if can_create else None
    if head == "ALTER" and _w(toks[1] if len(toks) > 1 else None) == "TABLE":
        return _alter(sql, toks, is_table)
    if head == "RESTORE":
        return _restore(toks, is_table)
    if head == "OPTIMIZE":
        return _optimize(toks, is_table)
    if head == "VACUUM":
        return _vacuum(toks, is_table)
    return None


def _properties(toks: Sequence[Token], i: int, table: str, values: bool = True) -> tuple[dict[str, str | None], int]:
    """``('k' = 'v', …)`` at ``i`` (``('k', …)`` without ``values``); the pairs and the index after."""
    if i >= len(toks) or toks[i].text != "(":
        raise WriteRefused(f"table {table}: expected ('name' = 'value', …) after TBLPROPERTIES")
    close = _close(toks, i)
    out: dict[str, str | None] = {}
    for a, b in _split_top(toks, i + 1, close, ","):
        part = list(toks[a:b])
        key = _literal(part[0]) if part else None
        if values:
            if len(part) != 3 or part[1].text != "=" or key is None or _literal(part[2]) is None:
                raise WriteRefused(f"table {table}: a table property is 'name' = 'value'")
            out[key] = _literal(part[2])
        else:
            if len(part) != 1 or key is None:
                raise WriteRefused(f"table {table}: UNSET TBLPROPERTIES takes property names ('name', …)")
            out[key] = None
    return out, close + 1


def _literal(t: Token) -> str | None:
    if t.kind == "string_const":
        return string_value(t)
    if t.kind == "numeric_const":
        return t.text
    if t.is_name:
        return _unquoted(t)
    return None


def _create(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> CreateTable:
    i, if_not_exists = 2, False
    if [_w(t) for t in toks[2:5]] == ["IF", "NOT", "EXISTS"]:
        i, if_not_exists = 5, True
    if i >= len(toks) or not toks[i].is_name or (i + 1 < len(toks) and toks[i + 1].text == "."):
        raise WriteRefused("CREATE TABLE: expected a table name (a CastSQL table is a directory of the warehouse)")
    table = _unquoted(toks[i])
    i += 1
    columns: list[tuple[str, str]] = []
    pk: str | None = None
    if i < len(toks) and toks[i].text == "(":
        columns, pk, i = _column_list(sql, toks, i, table)
    elif [_w(t) for t in toks[i : i + 2]] == ["PRIMARY", "KEY"]:
        if i + 2 >= len(toks) or toks[i + 2].text != "(":
            raise WriteRefused(f"CREATE TABLE {table}: expected PRIMARY KEY (column)")
        close = _close(toks, i + 2)
        if close != i + 4:
            raise WriteRefused(f"CREATE TABLE {table}: the primary key is one column")
        pk = _unquoted(toks[i + 3])
        i = close + 1
    props: dict[str, str] = {}
    if i < len(toks) and _w(toks[i]) in ("TBLPROPERTIES", "WITH"):
        got, i = _properties(toks, i + 1, table)
        props = {k: v for k, v in got.items() if v is not None}
    query = None
    if i < len(toks) and _w(toks[i]) == "AS":
        if columns:
            raise WriteRefused(f"CREATE TABLE {table}: give columns or AS SELECT …, not both")
        query = _text(sql, toks, i + 1, len(toks))
        i = len(toks)
    if i != len(toks):
        raise WriteRefused(f"CREATE TABLE {table}: cannot read it from {toks[i].text!r} on")
    if not columns and query is None:
        raise WriteRefused(f"CREATE TABLE {table}: give its columns, (id BIGINT PRIMARY KEY, …), or AS SELECT …")
    if pk is not None and columns and pk.lower() not in (c.lower() for c, _ in columns):
        raise WriteRefused(f"CREATE TABLE {table}: primary key {pk} is not a column")
    return CreateTable(table, tuple(columns), pk, props, query, if_not_exists)


def _column_list(sql: str, toks: Sequence[Token], i: int, table: str) -> tuple[list[tuple[str, str]], str | None, int]:
    """``(column TYPE [PRIMARY KEY], …, [PRIMARY KEY (c)])`` at ``i``: the
    columns, the key and the index after the list."""
    close = _close(toks, i)
    columns: list[tuple[str, str]] = []
    pk: str | None = None
    for a, b in _split_top(toks, i + 1, close, ","):
        col, key = _column(sql, toks, a, b, table)
        if col is not None:
            columns.append(col)
        if key is not None:
            if pk is not None and pk != key:
                raise WriteRefused(f"CREATE TABLE {table}: one primary key column, not {pk} and {key}")
            pk = key
    return columns, pk, close + 1


_CONSTRAINTS = {"PRIMARY", "NOT", "NULL", "DEFAULT", "UNIQUE", "CHECK", "REFERENCES", "COLLATE", "GENERATED"}


def _column(sql: str, toks: Sequence[Token], a: int, b: int, table: str) -> tuple[tuple[str, str] | None, str | None]:
    """One element of a column list: a column (name, type) and whether it is
    the key, or a ``PRIMARY KEY (c)`` constraint."""
    words = [_w(t) for t in toks[a:b]]
    if words[:2] == ["PRIMARY", "KEY"]:
        if b - a != 5 or toks[a + 2].text != "(" or toks[b - 1].text != ")":
            raise WriteRefused(f"CREATE TABLE {table}: the primary key is one column: PRIMARY KEY (id)")
        return None, _unquoted(toks[a + 3])
    if b - a < 2 or not toks[a].is_name:
        raise WriteRefused(f"CREATE TABLE {table}: expected column TYPE, got {_text(sql, toks, a, b)!r}")
    name = _unquoted(toks[a])
    end = _top(toks, a + 1, _CONSTRAINTS, b)
    kind = _text(sql, toks, a + 1, end)
    rest = words[end - a :]
    key = None
    if rest in (["PRIMARY", "KEY"], ["NOT", "NULL", "PRIMARY", "KEY"], ["PRIMARY", "KEY", "NOT", "NULL"]):
        key = name
    elif rest not in ([], ["NOT", "NULL"], ["NULL"]):
        raise WriteRefused(
            f"CREATE TABLE {table}: column {name}: only PRIMARY KEY and NOT NULL are understood, "
            f"not {_text(sql, toks, end, b)!r}"
        )
    return (name, kind), key


def _alter(sql: str, toks: list[Token], is_table: Callable[[str], bool]) -> AlterTable | None:
    table = _name(toks, 2)
    if table is None or not is_table(table):
        return None
    words = [_w(t) for t in toks[3:]]
    where = f"ALTER TABLE {table}"
    if words[:1] == ["ADD"]:
        i = 5 if words[1:2] == ["COLUMN"] else 4
        if [_w(t) for t in toks[i : i + 3]] == ["IF", "NOT", "EXISTS"]:
            raise WriteRefused(f"{where}: ADD COLUMN IF NOT EXISTS is not supported")
        if i + 1 >= len(toks) or not toks[i].is_name:
            raise WriteRefused(f"{where}: expected ADD COLUMN name TYPE")
        end = _top(toks, i + 1, _CONSTRAINTS)
        if end != len(toks):
            raise WriteRefused(f"{where}: a new column is nullable, with no default (older rows read NULL)")
        return AlterTable(table, add={_unquoted(toks[i]): _text(sql, toks, i + 1, len(toks))})
    if words[:1] == ["ALTER"]:
        i = 5 if words[1:2] == ["COLUMN"] else 4
        if i >= len(toks) or not toks[i].is_name:
            raise WriteRefused(f"{where}: expected ALTER COLUMN name TYPE type")
        j = i + 1
        if [_w(t) for t in toks[j : j + 2]] == ["SET", "DATA"]:
            j += 2
        if j >= len(toks) or _w(toks[j]) != "TYPE" or j + 1 >= len(toks):
            raise WriteRefused(f"{where}: only ALTER COLUMN name TYPE wider_type is supported")
        if _top(toks, j + 1, {"USING"}) != len(toks):
            raise WriteRefused(f"{where}: ALTER COLUMN … TYPE … USING is not supported (no file is rewritten)")
        return AlterTable(table, widen={_unquoted(toks[i]): _text(sql, toks, j + 1, len(toks))})
    if words[:2] in (["SET", "TBLPROPERTIES"], ["UNSET", "TBLPROPERTIES"]):
        props, end = _properties(toks, 5, table, values=words[0] == "SET")
        if end != len(toks):
            raise WriteRefused(f"{where}: cannot read it from {toks[end].text!r} on")
        return AlterTable(table, properties=props)
    raise WriteRefused(
        f"{where}: only ADD COLUMN, ALTER COLUMN … TYPE (a widening) and SET/UNSET TBLPROPERTIES are supported "
        "(a drop or a rename would change what older versions mean)"
    )


def _restore(toks: list[Token], is_table: Callable[[str], bool]) -> Restore | None:
    i = 2 if _w(toks[1] if len(toks) > 1 else None) == "TABLE" else 1
    table = _name(toks, i)
    if table is None or not is_table(table):
        return None
    words = [_w(t) for t in toks[i + 1 :]]
    last = toks[-1]
    if words[:-1] in (["TO", "VERSION", "AS", "OF"], ["TO", "VERSION"]) and last.kind == "numeric_const":
        if not last.text.isdigit():
            raise WriteRefused(f"RESTORE {table}: a version is a whole number, not {last.text}")
        return Restore(table, int(last.text))
    if words[:-1] in (["TO", "TIMESTAMP", "AS", "OF"], ["TO", "TIMESTAMP"]) and last.kind == "string_const":
        return Restore(table, None, string_value(last))
    raise WriteRefused(
        f"RESTORE {table}: expected RESTORE TABLE {table} TO VERSION AS OF n (or TO TIMESTAMP AS OF '…')"
    )


def _optimize(toks: list[Token], is_table: Callable[[str], bool]) -> Optimize | None:
    table = _name(toks, 1)
    if table is None or not is_table(table):
        return None
    words = [_w(t) for t in toks[2:]]
    if not words:
        return Optimize(table)
    if words[:2] in (["ZORDER", "BY"], ["SORT", "BY"]):
        cols = [t for t in toks[4:] if t.is_name]
        shape = [t.text for t in toks[4:] if not t.is_name]
        if len(cols) == 1 and shape in ([], ["(", ")"]):
            return Optimize(table, _unquoted(cols[0]))
        raise WriteRefused(f"OPTIMIZE {table}: the compaction sorts by one column: ZORDER BY (col) or SORT BY col")
    raise WriteRefused(f"OPTIMIZE {table}: expected OPTIMIZE {table} [ZORDER BY (col)]")


def _vacuum(toks: list[Token], is_table: Callable[[str], bool]) -> Vacuum | None:
    table = _name(toks, 1)
    if table is None or not is_table(table):
        return None
    words = [_w(t) for t in toks[2:]]
    dry = words[-2:] == ["DRY", "RUN"]
    if dry:
        words = words[:-2]
    if not words:
        return Vacuum(table, None, dry)
    if len(words) == 3 and words[0] == "RETAIN" and words[2] == "HOURS" and toks[3].kind == "numeric_const":
        try:
            hours = float(toks[3].text)
        except ValueError:
            hours = -1
        if hours >= 0:
            return Vacuum(table, hours, dry)
    raise WriteRefused(f"VACUUM {table}: expected VACUUM {table} [RETAIN n HOURS] [DRY RUN]")
