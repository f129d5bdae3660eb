"""Turning a failed Spark job into one clear CastSQL error.

A Python exception in a worker reaches the driver as Spark's
``PythonException`` wrapping the worker's whole traceback; a CastSQL error in
there (SchemaMismatch, StorageError…) is what the user needs to read, so it is
re-raised as a :class:`SparkJobFailed` carrying just that line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from castsql.errors import CastSQLError

_CASTSQL_LINE = re.compile(r"^castsql\.[\w.]+\.(\w+): (.*)$", re.M)
_ANY_ERROR_LINE = re.compile(r"^(\w+(?:Error|Exception)): (.*)$", re.M)


class SparkJobFailed(CastSQLError):
    """A Spark job of a CastSQL operation failed; nothing was committed."""


def worker_message(text: str) -> str:
    """The most telling line of a worker's traceback text."""
    found = _CASTSQL_LINE.findall(text)
    if found:
        return found[-1][1].strip()
    found = _ANY_ERROR_LINE.findall(text)
    if found:
        name, msg = found[-1]
        return f"{name}: {msg.strip()}"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "the Spark job failed"


def java_message(e: BaseException) -> str:
    """The innermost cause's message of a JVM exception (py4j's Py4JJavaError):
    the outer ones are wrappers such as "Exception thrown in awaitResult"."""
    cause = getattr(e, "java_exception", None)
    if cause is None:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    message = None
    seen = 0
    while cause is not None and seen < 20:
        message = cause.getMessage() or message
        cause, seen = cause.getCause(), seen + 1
    text = (message or "").strip()
    return re.sub(r"\s*SQLSTATE: \w+", "", text.splitlines()[0]) if text else "the Spark job failed"


@contextlib.contextmanager
def job_errors(what: str) -> Iterator[None]:
    """Re-raise a failed job's worker error as SparkJobFailed naming ``what``."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException, PythonException
    from pyspark.errors.exceptions.captured import CapturedException

    try:
        yield
    except PythonException as e:
        raise SparkJobFailed(f"{what} failed, nothing was committed: {worker_message(str(e))}") from e
    except CapturedException as e:
        if isinstance(e, AnalysisException):
            raise
        raise SparkJobFailed(f"{what} failed, nothing was committed: {worker_message(str(e))}") from e
    except Py4JJavaError as e:
        raise SparkJobFailed(f"{what} failed, nothing was committed: {java_message(e)}") from e
