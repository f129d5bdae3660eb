"""DuckDB's errors in the user's terms: one line, no internal name."""

from __future__ import annotations

import re
from collections.abc import Callable

from castsql.engine.sql import names
from castsql.errors import QueryError as QueryError  # raised by the executor, named here by callers
from castsql.errors import one_line as base_one_line

_MISSING = re.compile(r"Catalog Error: Table with name (.+?) does not exist!")


def one_line(e: BaseException) -> str:
    """``e``'s message on one line (:func:`castsql.errors.one_line`), internal
    names spelled as the user wrote them."""
    msg = names.user_spelling(str(e).strip())
    return base_one_line(Exception(msg)) if msg else type(e).__name__


def message(e: Exception, tables: Callable[[], list[str]]) -> str:
    """DuckDB's error in one line, a missing table answered with the ``tables`` there are."""
    msg = one_line(e)
    m = _MISSING.match(msg)
    if m:
        known = ", ".join(tables()) or "none"
        return f"no table named {m.group(1)} (tables: {known})"
    return msg
