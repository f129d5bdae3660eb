"""CastSQL: SQL over MVCC Parquet tables on object storage (time travel,
audits, Arrow results).

    >>> import castsql                                              # doctest: +SKIP
    >>> events = castsql.open("s3://bucket/events", version=3)     # doctest: +SKIP
    >>> events.to_arrow(["id", "kind"], filter="id < 100")         # doctest: +SKIP
    >>> castsql.connect("s3://bucket/events").sql("SELECT count(*) FROM events")  # doctest: +SKIP
    >>> castsql.write_table("./events", df, primary_key="id")      # doctest: +SKIP

Every error CastSQL raises is a :class:`castsql.errors.CastSQLError`.
"""

from castsql import _moved
from castsql import commits as _commits  # noqa: F401 - registers the after-commit point (mirrors, autoCompact)
from castsql.embedded import sql as _sql_writes  # noqa: F401 - lets a session's SQL write its tables (DELETE, MERGE …)
from castsql.errors import CastSQLError
from castsql.table import Table, connect, open, write_table

_moved.install()  # old module paths (castsql.engine.guard …) kept for one release

__all__ = ["CastSQLError", "Table", "connect", "open", "write_table"]
