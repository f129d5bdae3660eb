"""DuckDB's errors in the user's terms: one line, no internal name."""

from __future__ import annotations

import re
from collections.abc import Callable

from castsql.engine import names
from castsql.errors import QueryError as QueryError  # raised by the executor, named here by callers

_MISSING = re.compile(r"Catalog Error: Table with name (.+?) does not exist!")


def one_line(e: Exception) -> str:
    """``e``'s message on one line, internal names spelled as the user wrote them."""
    msg = names.user_spelling(str(e).strip())
    first = msg.splitlines()[0] if msg else type(e).__name__
    # DuckDB adds a "LINE n:" excerpt with a caret: keep it, it points at the error.
    extra = [ln for ln in msg.splitlines()[1:] if ln.strip()]
    return first if not extra else first + " " + " ".join(s.strip() for s in extra[:1])


def message(e: Exception, tables: Callable[[], list[str]]) -> str:
    """DuckDB's error in one line, a missing table answered with the ``tables`` there are."""
    msg = one_line(e)
    m = _MISSING.match(msg)
    if m:
        known = ", ".join(tables()) or "none"
        return f"no table named {m.group(1)} (tables: {known})"
    return msg
