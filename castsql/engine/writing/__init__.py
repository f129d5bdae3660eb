"""SQL that writes a table: a statement recognised before it is planned
(``intercept``), row statements (``writes``: DELETE, UPDATE, INSERT, MERGE
INTO, TRUNCATE) and table statements (``ddl``: CREATE/ALTER TABLE, RESTORE,
OPTIMIZE, VACUUM), handed to the runner the embedded engine registers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register", "runner"]

# The function that runs a parsed write on a session: registered by
# ``castsql/__init__.py`` (it loads the embedded engine, which this layer may
# not import, on the first write). Here, not in ``writes``, so registering it
# imports neither DuckDB nor the tokenizer: ``import castsql`` stays light.
_RUNNER: list[Callable[..., Any]] = []


def register(run: Callable[..., Any]) -> None:
    """Let sessions run writes with ``run(session, write, text, params)``."""
    _RUNNER[:] = [run]


def runner() -> Callable[..., Any] | None:
    return _RUNNER[0] if _RUNNER else None
