"""What the shell's core and its meta-commands share: their errors and limits.

A module of its own so that the meta-commands (:mod:`castsql.shell.special`)
never import the shell's core back.
"""

from __future__ import annotations

from castsql.errors import CastSQLError

MAX_READ_DEPTH = 16  # .read inside .read: enough for real scripts, stops a file that reads itself


class ShellError(CastSQLError):
    """A mistake in a shell command (unknown meta-command, bad argument); the message is the hint."""


class Reported(Exception):
    """A failure whose message was already printed (an error inside ``.read``)."""
