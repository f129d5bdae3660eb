"""File pruning for SQL: which comparisons in a query bound a table's rows.

The snapshot resolver can drop every data file whose manifest min/max cannot
match a predicate, before DuckDB opens a single footer (that is what a
selective query on a table of thousands of files, or on S3, spends its time
on). This module finds those predicates in DuckDB's own parse tree
(``json_serialize_sql``), so the SQL is parsed exactly as DuckDB will run it.

Only what is certainly safe is used:

- the top-level ``AND`` conjuncts of the ``WHERE`` of the ``SELECT`` whose
  ``FROM`` names the table directly or through ``INNER``/``CROSS`` joins
  (never an outer join, a subquery's outer scope, ``HAVING`` or ``ON``);
- ``column op constant`` with op ``= < <= > >=``, ``BETWEEN`` and ``IN (…)``
  (as its smallest and largest value); the column unqualified only when the
  ``FROM`` holds that one table, else qualified by its alias or name;
- constants whose type matches the column's exactly: integer literals for
  integer columns, strings for string columns, strings or same-typed literals
  for dates and timestamps, converted by DuckDB itself on the session's
  connection (so time zones and formats mean what they mean in the query).
  Floating-point columns are never pruned: DuckDB sorts NaN above every
  number, and statistics leave NaN out.

A name that a CTE anywhere in the statement defines is not the table.

Example::

    >>> import duckdb
    >>> refs = table_refs(duckdb.connect(), "SELECT * FROM t WHERE id BETWEEN 5 AND 9 AND 'x' = s")
    >>> [(r.name, r.conditions) for r in refs]
    [('t', [('id', '>=', 5, 'INTEGER'), ('id', '<=', 9, 'INTEGER'), ('s', '=', 'x', 'VARCHAR')])]
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import duckdb

from castsql.engine.sql.quoting import sql_str

_OPS = {
    "COMPARE_EQUAL": "=",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
_FLIP = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_INTEGER_LITERALS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER"}
_INNER = {"INNER", "CROSS"}


@dataclass
class TableRef:
    """One table named in a FROM clause, and the comparisons that bound its rows."""

    name: str  # as DuckDB parsed it (unquoted), lower-cased
    location: int  # byte offset of the name in the SQL text
    has_alias: bool
    # (column lower-cased, op, constant, constant's DuckDB type or "VARCHAR"/"CAST:<type>")
    conditions: list[tuple[str, str, Any, str]] = field(default_factory=list)


@dataclass
class Analysis:
    """What DuckDB's parse tree says about the tables of a statement.

    ``tables`` counts the plain (unqualified) table references of each name,
    lower-cased, CTE names left out; ``bases`` are those references, in the
    order of the tree, with where each lies; ``refs`` are those that some
    comparison bounds (what file pruning can use).
    """

    tables: Counter[str]
    refs: list[TableRef]
    # ``SELECT count(*) [AS name] FROM t`` and nothing else: (table, output column name)
    count_star: tuple[str, str] | None = None
    bases: list[TableRef] = field(default_factory=list)
    statements: int = 1  # how many (SELECT) statements the text holds


def serialize(con: duckdb.DuckDBPyConnection, sql: str) -> dict | None:
    """DuckDB's parse tree of ``sql`` (``json_serialize_sql``); None if DuckDB
    cannot serialize it (not only SELECT statements, or not valid SQL)."""
    try:
        raw = con.execute(f"SELECT json_serialize_sql({sql_str(sql)})").fetchone()  # not a parameter: quoting.py
    except duckdb.Error:
        return None
    tree = json.loads(raw[0]) if raw else {}
    return None if tree.get("error", True) else tree


def analyze(con: duckdb.DuckDBPyConnection, sql: str) -> Analysis | None:
    """The tables ``sql`` reads, from DuckDB's parse tree; None if DuckDB cannot
    serialize the statement (not a SELECT, or not valid SQL)."""
    tree = serialize(con, sql)
    return None if tree is None else analyze_tree(tree)


def analyze_tree(tree: dict) -> Analysis:
    """What :func:`analyze` says, from a tree :func:`serialize` gave."""
    ctes: set[str] = set()
    _collect_ctes(tree, ctes)
    refs: list[TableRef] = []
    tables: Counter[str] = Counter()
    bases: dict[int, TableRef] = {}
    for st in tree.get("statements", []):
        _walk(st, refs, tables, bases)
    for cte in ctes:
        tables.pop(cte, None)
    return Analysis(
        tables,
        [r for r in refs if r.conditions and r.name not in ctes],
        _count_star(tree),
        [r for r in bases.values() if r.name not in ctes],
        len(tree.get("statements", [])),
    )


def _count_star(tree: dict) -> tuple[str, str] | None:
    """``SELECT count(*) FROM t``: a count a version's metadata answers."""
    sts = tree.get("statements", [])
    if len(sts) != 1:
        return None
    node = sts[0].get("node", {})
    if node.get("type") != "SELECT_NODE" or node.get("modifiers") or (node.get("cte_map") or {}).get("map"):
        return None
    if node.get("where_clause") or node.get("group_expressions") or node.get("having") or node.get("qualify"):
        return None
    if node.get("sample") or node.get("group_sets"):
        return None
    sel = node.get("select_list", [])
    t = node.get("from_table") or {}
    if len(sel) != 1 or t.get("type") != "BASE_TABLE" or t.get("schema_name") or t.get("catalog_name"):
        return None
    f = sel[0]
    if f.get("class") != "FUNCTION" or f.get("function_name") != "count_star" or f.get("filter") or f.get("distinct"):
        return None
    if t.get("sample") or t.get("at_clause") or f.get("schema") or f.get("catalog"):
        return None
    return t["table_name"].lower(), f.get("alias") or "count_star()"


def table_refs(con: duckdb.DuckDBPyConnection, sql: str) -> list[TableRef]:
    """Every plain table reference of the SELECT statements in ``sql`` that
    some comparison bounds; [] if DuckDB cannot serialize the statement."""
    a = analyze(con, sql)
    return a.refs if a is not None else []


def _collect_ctes(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map", []):
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    out.add(entry["key"].lower())
        for v in node.values():
            _collect_ctes(v, out)
    elif isinstance(node, list):
        for v in node:
            _collect_ctes(v, out)


def _base(node: dict, bases: dict[int, TableRef]) -> TableRef | None:
    """The reference a plain BASE_TABLE node is (one object per node); None if it has no usable location."""
    ref = bases.get(id(node))
    if ref is None:
        loc = node.get("query_location")
        if not isinstance(loc, int) or loc >= 1 << 62:
            return None
        ref = bases[id(node)] = TableRef(node["table_name"].lower(), loc, bool(node.get("alias")))
    return ref


def _walk(node: Any, out: list[TableRef], tables: Counter[str], bases: dict[int, TableRef]) -> None:
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "SELECT_NODE":
            _select(node, out, bases)
        elif kind == "BASE_TABLE" and not node.get("schema_name") and not node.get("catalog_name"):
            name = node.get("table_name")
            if isinstance(name, str):
                tables[name.lower()] += 1
                _base(node, bases)
        for v in node.values():
            _walk(v, out, tables, bases)
    elif isinstance(node, list):
        for v in node:
            _walk(v, out, tables, bases)


def _from_tables(node: Any) -> list[dict] | None:
    """Base tables reachable through inner/cross joins; None if the FROM holds
    anything else at that level (outer joins make WHERE reasoning per side)."""
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind == "BASE_TABLE":
        return [node]
    if kind == "JOIN" and node.get("join_type") in _INNER and node.get("ref_type") in ("REGULAR", "CROSS"):
        left, right = _from_tables(node.get("left")), _from_tables(node.get("right"))
        if left is None or right is None:
            return None
        return left + right
    return None


def _select(node: dict, out: list[TableRef], bases: dict[int, TableRef]) -> None:
    tables = _from_tables(node.get("from_table"))
    where = node.get("where_clause")
    if not tables or not where:
        return
    refs: list[TableRef | None] = []
    for t in tables:
        if t.get("schema_name") or t.get("catalog_name") or t.get("at_clause") or t.get("sample"):
            refs.append(None)
            continue
        ref = _base(t, bases)
        refs.append(ref)
        if ref is None:
            continue
        out.append(ref)
    by_qualifier: dict[str, list[TableRef]] = {}
    for t, ref in zip(tables, refs, strict=True):
        if ref is not None:
            by_qualifier.setdefault((t.get("alias") or t["table_name"]).lower(), []).append(ref)
    for cond in _conjuncts(where):
        for column, op, value, vtype in _comparisons(cond):
            if len(column) == 1 and len(tables) == 1 and refs[0] is not None:
                refs[0].conditions.append((column[0].lower(), op, value, vtype))
            elif len(column) == 2 and len(by_qualifier.get(column[0].lower(), [])) == 1:
                by_qualifier[column[0].lower()][0].conditions.append((column[1].lower(), op, value, vtype))


def _conjuncts(expr: dict) -> list[dict]:
    if expr.get("type") == "CONJUNCTION_AND":
        return [c for child in expr.get("children", []) for c in _conjuncts(child)]
    return [expr]


def _constant(expr: Any) -> tuple[Any, str] | None:
    """A literal's value and kind: its DuckDB type id, or ``CAST:<type>`` for
    ``DATE '…'``-style typed strings."""
    if not isinstance(expr, dict):
        return None
    if expr.get("class") == "CONSTANT":
        v = expr.get("value", {})
        if v.get("is_null") or "value" not in v:
            return None
        return v["value"], v.get("type", {}).get("id", "")
    if expr.get("class") == "CAST" and not expr.get("try_cast"):
        inner = _constant(expr.get("child"))
        target = expr.get("cast_type", {}).get("id", "")
        if inner is not None and inner[1] == "VARCHAR" and target:
            return inner[0], f"CAST:{target}"
    return None


def _column(expr: Any) -> list[str] | None:
    if isinstance(expr, dict) and expr.get("class") == "COLUMN_REF":
        names = expr.get("column_names")
        if isinstance(names, list) and 1 <= len(names) <= 2:
            return names
    return None


def _comparisons(expr: dict) -> list[tuple[list[str], str, Any, str]]:
    kind = expr.get("type")
    if kind in _OPS:
        op = _OPS[kind]
        col, const = _column(expr.get("left")), _constant(expr.get("right"))
        if col is None:
            col, const, op = _column(expr.get("right")), _constant(expr.get("left")), _FLIP[op]
        if col is None or const is None:
            return []
        return [(col, op, const[0], const[1])]
    if kind == "COMPARE_BETWEEN":
        col, lo, hi = _column(expr.get("input")), _constant(expr.get("lower")), _constant(expr.get("upper"))
        if col is None:
            return []
        return [(col, op, c[0], c[1]) for op, c in ((">=", lo), ("<=", hi)) if c is not None]
    if kind == "COMPARE_IN":
        children = expr.get("children", [])
        col = _column(children[0]) if children else None
        consts = [_constant(c) for c in children[1:]]
        if col is None or not consts or any(c is None for c in consts):
            return []
        kinds = {c[1] for c in consts if c is not None}
        if len(kinds) != 1 or kinds & {"DECIMAL", "DOUBLE", "FLOAT"}:
            return []
        values = [c[0] for c in consts if c is not None]
        try:
            lo, hi = min(values), max(values)
        except TypeError:
            return []
        k = kinds.pop()
        return [(col, ">=", lo, k), (col, "<=", hi, k)]
    return []


def duck_value(con: duckdb.DuckDBPyConnection, value: Any, vtype: str, column_type: str) -> Any | None:
    """``value`` (of literal kind ``vtype``) as the Python value DuckDB compares
    with a column of manifest type ``column_type``, or None when a comparison
    of the two is not an exact comparison in the column's own type."""
    if column_type.startswith(("int", "uint")):
        if vtype not in _INTEGER_LITERALS or not isinstance(value, int) or isinstance(value, bool):
            return None
        return value
    if column_type == "string":
        return value if vtype == "VARCHAR" and isinstance(value, str) else None
    if column_type.startswith("timestamp"):
        target = "TIMESTAMP WITH TIME ZONE" if "tz=" in column_type else "TIMESTAMP"
    elif column_type.startswith("date"):
        target = "DATE"
    else:
        return None  # floats (NaN), booleans, decimals, binary: not pruned
    # A typed literal's cast_type id in DuckDB's tree is this same type name.
    if vtype not in ("VARCHAR", f"CAST:{target}") or not isinstance(value, str):
        return None
    local = _iso_value(value, target)
    if local is not None:
        return local
    try:
        return con.execute(f"SELECT CAST({sql_str(value)} AS {target})").fetchall()[0][0]
    except duckdb.Error:
        return None  # DuckDB will say what is wrong with the literal when the query runs


# The literal forms whose value is read here, as DuckDB reads them, without a
# query: asking DuckDB costs ~0.5 ms a literal, a fifth of a warm range query
# on a small table. A time with a zone must state its offset (without one it
# means the session's TimeZone, which only DuckDB knows); a naive one, none.
_ISO_DATE = r"\d{4}-\d{2}-\d{2}"
_ISO_TIME = r"[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?"
_ISO_FORMS = {
    "DATE": re.compile(_ISO_DATE, re.ASCII),
    "TIMESTAMP": re.compile(rf"{_ISO_DATE}(?:{_ISO_TIME})?", re.ASCII),
    "TIMESTAMP WITH TIME ZONE": re.compile(rf"{_ISO_DATE}{_ISO_TIME}(?:Z|[+-]\d{{2}}(?::?\d{{2}})?)", re.ASCII),
}


def _iso_value(text: str, target: str) -> Any | None:
    """``text`` as a value of ``target`` when it is in one of the ISO forms
    above and a valid date or time; None for DuckDB to read it."""
    if not _ISO_FORMS[target].fullmatch(text):
        return None
    try:
        if target == "DATE":
            return date.fromisoformat(text)
        value = datetime.fromisoformat(text)
        return value.astimezone(UTC) if value.tzinfo is not None else value
    except (ValueError, OverflowError):  # 2025-02-30, 24:00:00, past year 9999 in UTC: DuckDB's to read
        return None
