"""The query engine: DuckDB views of table versions, time travel, audits, Arrow out."""

from castsql.engine.session import QueryError, Session

__all__ = ["QueryError", "Session"]
