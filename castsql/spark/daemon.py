"""PySpark's Python worker daemon, without the tracebacks of cancelled tasks.

When one task of a job fails, Spark cancels the job's other running tasks
and closes their sockets; the Python workers serving them are still writing,
get ``BrokenPipeError`` (or ``ConnectionResetError``; a worker whose task was
cancelled before the JVM sent it the connection's secret gets ``EOFError``
reading it), and pyspark's daemon
prints that traceback on the JVM's stderr, which is the user's terminal:
``castsql delete … --where "kind = 5"`` printed two of them before its own
one-line error. A closed socket of a cancelled task is expected, and the
task's real error reaches the driver anyway, so this daemon (Spark's
``spark.python.daemon.module``, set by :func:`castsql.spark.spark_session`)
runs pyspark's unchanged except that it does not print those errors.
Every other error is printed as before.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from pyspark import daemon

_EXPECTED = (BrokenPipeError, ConnectionResetError, EOFError)


class _QuietTraceback:
    """Stands in for the ``traceback`` module inside pyspark.daemon."""

    format_exc = staticmethod(traceback.format_exc)

    @staticmethod
    def print_exc(*args: Any, **kwargs: Any) -> None:
        if isinstance(sys.exc_info()[1], _EXPECTED):
            return
        traceback.print_exc(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)


daemon.traceback = _QuietTraceback()  # type: ignore[assignment]

if __name__ == "__main__":
    daemon.manager()
