"""Strict JSON for table objects (pointer, manifests, tombstones).

Every object a table holds may come from another writer, or from someone
hostile: it is decoded as UTF-8 (never guessed: ``json.loads`` on bytes would
try UTF-16 and report a codec error), ``NaN`` and ``Infinity`` are refused
(they are not JSON and cannot bound a key range), and whatever the decoder
trips over — bad syntax, nesting too deep for the parser, an integer of
thousands of digits — becomes one :class:`FormatError` naming the object.

Example::

    >>> load_json(b'{"version": 3}', "t/_latest_manifest", "pointer")
    {'version': 3}
    >>> load_json(b'{"x": NaN}', "m.json", "manifest")
    Traceback (most recent call last):
    castsql.errors.FormatError: m.json: manifest is not valid JSON (NaN is not a JSON number)
"""

from __future__ import annotations

import json
from typing import Any

from castsql.errors import FormatError


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_text(text: str, where: str, what: str) -> Any:
    """``text`` parsed as strict JSON, or FormatError ``where: what is not valid JSON (...)``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise FormatError(f"{where}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise FormatError(f"{where}: {what} is not valid JSON (nested too deeply)") from None
    except ValueError as e:  # NaN/Infinity, integers past Python's digit limit
        raise FormatError(f"{where}: {what} is not valid JSON ({e})") from None


def load_json(data: bytes, where: str, what: str) -> Any:
    """``data`` (UTF-8) parsed as strict JSON, or FormatError naming ``where``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{where}: {what} is not UTF-8 text") from None
    return loads_text(text, where, what)


def pk_value(v: Any) -> bool:
    """A number or a string: what a key range's bound, and a key in
    ``change.keys`` or a key index, may be (JSON statistics of a key)."""
    return isinstance(v, int | float | str) and not isinstance(v, bool)
