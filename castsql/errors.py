"""Errors every layer raises. Each message names the object and what is wrong,
in one line, so the shell can print it as it is."""

from __future__ import annotations


def one_line(e: BaseException, *, excerpt: bool = True) -> str:
    """An exception's message on one line: its first line, with the line after
    it — DuckDB's ``Candidate bindings: …`` hint or its ``LINE n:`` excerpt of
    the SQL near the error — unless ``excerpt`` is false (SQL the user did not
    write would only confuse), or the exception's type when it has no message.
    Every layer's error lines are made by this (the engine first spells its
    internal names as the user wrote them: :func:`castsql.engine.messages.one_line`).

    Example::

        >>> one_line(ValueError("Parser Error: syntax error\\n\\nLINE 1: SELEC 1\\n        ^"))
        'Parser Error: syntax error LINE 1: SELEC 1'
        >>> one_line(KeyError())
        'KeyError'
        >>> one_line(IOError("StorageError: gs://b/x: cannot read\\n\\nAt:\\n  /castsql/storage/gcs.py(180): get"))
        'StorageError: gs://b/x: cannot read'
    """
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if "At:" in lines:
        # DuckDB's report of a Python exception raised inside it (a registered
        # filesystem's): the lines after "At:" are its traceback.
        lines = lines[: lines.index("At:")]
    if not lines:
        return type(e).__name__
    return f"{lines[0]} {lines[1]}" if excerpt and len(lines) > 1 else lines[0]


class CastSQLError(Exception):
    """Base of every error CastSQL raises on purpose."""


class FormatError(CastSQLError):
    """A table object (pointer, manifest, tombstone) is malformed or inconsistent."""


class MirrorError(FormatError):
    """A table (or one of its versions) that a Delta or Iceberg mirror cannot express."""


class TableNotFound(CastSQLError):
    """No table at that URI (or no table of that name)."""


class TableExists(CastSQLError):
    """A table already exists where one was to be created."""


class VersionNotFound(CastSQLError):
    """The version (or timestamp) asked for is not among the table's committed versions."""


class SchemaMismatch(CastSQLError):
    """Data does not fit the table's schema."""


class KeyViolation(CastSQLError):
    """A write would leave the table's primary key NULL, NaN or repeated
    (FORMAT.md §3.1); nothing was committed."""


class DuplicateKey(KeyViolation):
    """Rows whose primary key is repeated, or already held by a live row of
    the table; nothing was committed."""


class NullKey(DuplicateKey):
    """Rows whose primary key is NULL (or NaN); nothing was committed. A
    DuplicateKey too, so code that caught every key refusal as DuplicateKey
    before NullKey existed still does."""


class WriteError(CastSQLError):
    """A write that cannot run as asked (bad condition, unknown column, wrong
    type); nothing was written."""


class MergeError(WriteError):
    """A merge that cannot run as asked: bad clauses, unknown columns, or several
    source rows matching one target row. Nothing was written."""


class CommitConflict(CastSQLError):
    """A commit could not be applied: a concurrent change made it invalid, or
    every retry lost the race."""


class MissingExtra(CastSQLError):
    """A feature needs an optional dependency that is not installed; the
    message names the ``pip install 'castsql[extra]'`` that adds it."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(f"{feature} needs {module}, which is not installed: pip install 'castsql[{extra}]'")
        self.extra = extra


def require(module: str, extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` can be imported.

    >>> require("json", "spark", "castsql append")
    """
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtra(feature, extra, module)


class StorageError(CastSQLError):
    """A storage operation failed for a reason other than a lost race."""


class StorageUnreachable(StorageError):
    """The storage endpoint did not answer (timeouts, refused connections) after
    every attempt: nothing is known about the object, and asking for the next
    one would wait as long again."""

    attempts: int | None = None  # how many tries were made, where the store says


class ObjectNotFound(StorageError, FileNotFoundError):
    """The key does not exist."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"{uri}: object not found")
        self.uri = uri


class PreconditionFailed(StorageError):
    """A conditional write lost: the object exists (create-only) or changed (CAS).

    S3 answers 412 for both, 409 for concurrent conditional writes, and 404 for
    an ``If-Match`` on a missing key; callers treat all of them as "lost the
    race, re-read and retry".
    """

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri = uri


# ---------------------------------------------------------------------- by the layer that raises them


class RestoreRaced(CommitConflict):
    """A restore's plan is stale: another version landed first (it plans again)."""


class DmlConflict(CommitConflict):
    """An update or merge's plan is stale: a concurrent commit touched a file it
    deletes rows of, or may hold a key it inserts (it plans again)."""


class QueryError(CastSQLError):
    """DuckDB refused or failed a query; the message is DuckDB's."""


class ForbiddenStatement(CastSQLError):
    """A statement that CastSQL refuses to run, in every mode."""


class SafeModeError(ForbiddenStatement):
    """A statement or action that safe mode forbids."""


class SQLRewriteError(CastSQLError):
    """A time-travel clause is malformed."""


# The errors of the layers above (the shell's, Spark's, the command line's)
# live in those layers, each derived from CastSQLError (docs/DESIGN.md §6).
# Their names stay importable from here for code written before they moved:
# looked up on first use, so this leaf imports no layer above it, and no
# CastSQL module uses these names (tests/project/test_imports.py checks).
MOVED = {
    "ShellError": "castsql.shell.errors",
    "UsageError": "castsql.cli.common",
    "BadOption": "castsql.spark.errors",
    "SparkJobFailed": "castsql.spark.errors",
    "WrongType": "castsql.spark.errors",
    "BadCondition": "castsql.spark.errors",
}


def __getattr__(name: str) -> type[CastSQLError]:
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    error: type[CastSQLError] = getattr(importlib.import_module(module), name)
    return error
