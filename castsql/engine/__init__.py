"""The query engine: DuckDB views of table versions, time travel, audits, Arrow out.

``Session`` and ``QueryError`` load on first use, so importing one of the
engine's light modules (``castsql.engine.writing``, where ``import castsql``
registers the SQL-write runner) does not import DuckDB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from castsql.engine.session import QueryError, Session

__all__ = ["QueryError", "Session"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from castsql.engine import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
