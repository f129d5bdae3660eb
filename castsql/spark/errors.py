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
from typing import TYPE_CHECKING, Any

from castsql.errors import CastSQLError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SparkJobFailed(CastSQLError):
    """A Spark job of a CastSQL operation failed; nothing was committed."""


class WrongType(CastSQLError):
    """An expression compares or assigns a column with a value of another
    type that Spark would convert row by row (and fail on, mid-job)."""


class BadOption(CastSQLError):
    """An option of ``format("castsql")`` is unknown, missing or malformed."""


class BadCondition(CastSQLError):
    """The delete condition is not a boolean SQL expression over the table's columns."""


_CASTSQL_LINE = re.compile(r"^castsql\.[\w.]+\.(\w+): (.*)$", re.M)
_ANY_ERROR_LINE = re.compile(r"^(\w+(?:Error|Exception)): (.*)$", re.M)


def spark_message(e: BaseException) -> str:
    """The first line of a Spark SQL error (its error class and message),
    without the SQL context (``== SQL ==`` and a ``^^^^`` marker) and the
    SQLSTATE that follow it."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[0].strip() if lines else type(e).__name__
    text = re.sub(r"\s*SQLSTATE: \w+", "", text)
    return re.sub(r"[;.]*\s*line \d+ pos \d+;?$", ".", text).strip()


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
        # A JVM-side error (a cast of a malformed value, a division by zero):
        # its first line says what went wrong; the last is the SQL context's
        # "^^^^" marker.
        raise SparkJobFailed(f"{what} failed, nothing was committed: {spark_message(e)}") from e
    except Py4JJavaError as e:
        raise SparkJobFailed(f"{what} failed, nothing was committed: {java_message(e)}") from e


def implicit_casts(df: DataFrame) -> list[tuple[str, str, str]]:
    """(column, its type, the type Spark converts it to) for each place in
    ``df``'s projection where Spark's type coercion (not the user's ``CAST``)
    converts a string column, or an expression over one, to another type:
    ``kind = 5`` over a string ``kind`` casts every value to BIGINT and fails
    mid-job on the first ``'view'``. Literals converted to the column's type
    (``id = '5'``, ``ts < '2025-01-01'``) are fine and not listed."""
    jvm: Any = df.sparkSession._jvm  # py4j: untyped, and set once the session runs
    user_cast = jvm.org.apache.spark.sql.catalyst.expressions.Cast.USER_SPECIFIED_CAST()
    found: list[tuple[str, str, str]] = []

    def columns(e: Any) -> list[str]:
        if e.getClass().getSimpleName() == "AttributeReference":
            return [e.name()]
        kids = e.children()
        return [c for i in range(kids.size()) for c in columns(kids.apply(i))]

    def walk(e: Any) -> None:
        if e.getClass().getSimpleName() == "Cast" and not e.getTagValue(user_cast).isDefined():
            child = e.child()
            src, dst = child.dataType().simpleString(), e.dataType().simpleString()
            if src == "string" and dst != "string" and child.getClass().getSimpleName() != "Literal":
                found.extend((c, src, dst) for c in dict.fromkeys(columns(child)))
        kids = e.children()
        for i in range(kids.size()):
            walk(kids.apply(i))

    def plan(node: Any) -> None:
        # The nodes of the query CastSQL built; not inside the views it reads
        # (the table, the user's source DataFrame): their plans are not ours.
        if node.getClass().getSimpleName() == "View":
            return
        exprs = node.expressions()
        for i in range(exprs.size()):
            walk(exprs.apply(i))
        kids = node.children()
        for i in range(kids.size()):
            plan(kids.apply(i))

    plan(df._jdf.queryExecution().analyzed())
    return found


def check_types(df: DataFrame, table: str, what: str, text: str) -> None:
    """Raise WrongType, naming the table and the column, if ``text`` (the
    expression ``df`` selects) would make Spark convert a string column to
    another type (see :func:`implicit_casts`); nothing has run yet."""
    for column, src, dst in implicit_casts(df):
        raise WrongType(
            f"table {table}: column {column} is {src}, and the {what} {text!r} compares or combines it with a {dst} "
            f"(quote the value, or CAST the column explicitly)"
        )
