"""Errors every layer raises. Each message names the object and what is wrong,
in one line, so the shell can print it as it is."""

from __future__ import annotations


class CastSQLError(Exception):
    """Base of every error CastSQL raises on purpose."""


class FormatError(CastSQLError):
    """A table object (pointer, manifest, tombstone) is malformed or inconsistent."""


class TableNotFound(CastSQLError):
    """No table at that URI (or no table of that name)."""


class TableExists(CastSQLError):
    """A table already exists where one was to be created."""


class VersionNotFound(CastSQLError):
    """The version (or timestamp) asked for is not among the table's committed versions."""


class SchemaMismatch(CastSQLError):
    """Data does not fit the table's schema."""


class CommitConflict(CastSQLError):
    """A commit could not be applied: a concurrent change made it invalid, or
    every retry lost the race."""
