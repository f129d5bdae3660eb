"""What every ``castsql`` command shares: the usage error, the parsers of ages
and ``--set`` assignments, the parser class that raises instead of exiting,
and the pieces of the one summary line a command ends with.

Example::

    >>> parse_age("12h")
    datetime.timedelta(seconds=43200)
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from castsql.errors import CastSQLError

if TYPE_CHECKING:
    from castsql.format import Manifest

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
_SET = re.compile(r"^\s*(`[^`]+`|\"[^\"]+\"|[A-Za-z_][\w$]*)\s*=(?!=)\s*(.*\S)\s*$", re.S)


class UsageError(CastSQLError):
    """A command-line argument is malformed (printed after ``castsql COMMAND: error:``)."""


def parse_assignment(text: str) -> tuple[str, str]:
    """``--set`` text: ``"v = v * 2"`` -> ``("v", "v * 2")``.

    >>> parse_assignment("amount = amount * 2")
    ('amount', 'amount * 2')
    >>> parse_assignment('"odd name" = 1')
    ('odd name', '1')
    """
    m = _SET.match(text)
    if not m:
        raise UsageError(f"update: --set {text!r} is not an assignment (use COLUMN = EXPRESSION, e.g. 'v = v * 2')")
    name = m.group(1)
    return (name[1:-1] if name[0] in '`"' else name), m.group(2)


def parse_age(text: str) -> timedelta:
    """``7d`` -> 7 days; ``12h``, ``30m``, ``45s`` likewise; ``0`` needs no unit.

    >>> parse_age("36h")
    datetime.timedelta(days=1, seconds=43200)
    >>> parse_age("0")
    datetime.timedelta(0)
    """
    if text.strip() in ("0", "0.0"):
        return timedelta(0)
    m = _AGE.match(text)
    if not m:
        raise UsageError(f"{text!r} is not an age (use a number and a unit: 7d, 12h, 30m, 45s)")
    return timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError`, so the
    command reports them in its one error line (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)  # printed after "castsql COMMAND: error:"


def summary(verb: str, m: Manifest) -> str:
    """The summary line of a command that committed ``m``."""
    from castsql.write.garbage import format_bytes

    s = m.summary
    parts = [f"{verb}: committed version {m.version}"]
    if s.get("added_files") or "updated_rows" in s or (verb == "append" and "added_files" in s):
        parts.append(
            f"{s['added_files']} file(s), {s.get('added_rows', 0):,} row(s), {format_bytes(s.get('added_bytes', 0))}"
        )
    if "updated_rows" in s:
        parts.append(f"{s['updated_rows']:,} row(s) replaced in {s.get('tombstone_records', 0)} tombstone record(s)")
    elif "deleted_rows" in s:
        parts.append(f"{s['deleted_rows']:,} row(s) deleted in {s.get('tombstone_records', 0)} tombstone record(s)")
    if "removed_files" in s:
        parts.append(f"{s['removed_files']} file(s) removed, {s.get('removed_tombstones', 0)} tombstone file(s) merged")
    live = m.total_rows
    parts += schema_changes(s)
    parts.append(f"table: {m.file_count} file(s), {live:,} stored row(s)")
    return "; ".join(parts)


def schema_changes(summary: dict[str, Any]) -> list[str]:
    """What a ``--merge-schema`` write did to the schema, for its summary line."""
    changed = [f"added {c['name']} {c['type']}" for c in summary.get("added_columns", [])]
    changed += [f"widened {c['name']} {c['from']} -> {c['to']}" for c in summary.get("widened_columns", [])]
    return [f"schema: {', '.join(changed)}"] if changed else []


def set_properties(items: list[str], command: str) -> dict[str, str]:
    """``--set-property NAME=VALUE`` flags as a dict (the last one of a name wins)."""
    props: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"{command}: --set-property {item!r}: give NAME=VALUE")
        props[name.strip()] = value.strip()
    return props
