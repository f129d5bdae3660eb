"""CastSQL: SQL over MVCC Parquet tables on object storage (time travel,
audits, Arrow results).

    >>> import castsql                                              # doctest: +SKIP
    >>> events = castsql.open("s3://bucket/events", version=3)     # doctest: +SKIP
    >>> events.to_arrow(["id", "kind"], filter="id < 100")         # doctest: +SKIP
    >>> castsql.connect("s3://bucket/events").sql("SELECT count(*) FROM events")  # doctest: +SKIP
    >>> castsql.write_table("./events", df, primary_key="id")      # doctest: +SKIP

Every error CastSQL raises is a :class:`castsql.errors.CastSQLError`.
"""

from typing import Any

from castsql import _moved
from castsql import commits as _commits  # noqa: F401 - registers the after-commit point (mirrors, autoCompact)
from castsql.engine import writing as _writing
from castsql.errors import CastSQLError
from castsql.table import Table, connect, open, write_table

_moved.install()  # old module paths (castsql.engine.guard …) kept for one release


def _run_sql_write(*args: Any, **kwargs: Any) -> Any:
    """A session's SQL write (DELETE, MERGE …) run by the embedded engine,
    loaded on the first one: ``import castsql`` alone imports no DuckDB."""
    from castsql.embedded.sql import run

    return run(*args, **kwargs)


_writing.register(_run_sql_write)

__all__ = ["CastSQLError", "Table", "connect", "open", "write_table"]
