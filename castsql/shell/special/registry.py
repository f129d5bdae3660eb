"""The registry of meta-commands: names, usage, help, argument kinds, and dispatch.

Example::

    >>> parse_line('.output "my file.csv"')
    ('.output', ['my file.csv'])
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from castsql.shell.errors import ShellError

if TYPE_CHECKING:
    from castsql.shell.special.host import Shell

Handler = Callable[["Shell", list[str]], "pa.Table | None"]

# Argument kinds, for completion: an open table, a version of the table named
# by the first argument, an output mode, on/off, a local path, a URI, free text.
ARG_KINDS = {"table", "version", "mode", "onoff", "path", "uri", "command", "text"}


@dataclass(frozen=True)
class MetaCommand:
    """One meta-command.

    ``threaded`` commands run like queries (in the worker, Ctrl-C cancels, a
    spinner shows when slow); the others are instant or run statements
    themselves (``.read``) and stay on the main thread.
    """

    name: str
    usage: str
    help: str
    handler: Handler
    args: tuple[str, ...] = ()
    min_args: int = 0
    max_args: int = 0
    aliases: tuple[str, ...] = ()
    threaded: bool = False


COMMANDS: dict[str, MetaCommand] = {}
_ALIASES: dict[str, str] = {}


def meta_command(
    name: str,
    usage: str,
    help: str,
    *,
    args: tuple[str, ...] = (),
    min_args: int = 0,
    max_args: int | None = None,
    aliases: tuple[str, ...] = (),
    threaded: bool = False,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as meta-command ``name``.

    Example::

        @meta_command(".tables", ".tables", "list the open tables", threaded=True)
        def tables(shell, args): ...
    """

    def register(fn: Handler) -> Handler:
        assert all(a in ARG_KINDS for a in args), args
        cmd = MetaCommand(
            name, usage, help, fn, args, min_args, len(args) if max_args is None else max_args, aliases, threaded
        )
        COMMANDS[name] = cmd
        for a in aliases:
            _ALIASES[a] = name
        return fn

    return register


def lookup(name: str) -> MetaCommand | None:
    """The command called ``name`` (or one of its aliases), case-insensitively."""
    key = name.lower()
    return COMMANDS.get(_ALIASES.get(key, key))


def all_names() -> list[str]:
    return sorted([*COMMANDS, *_ALIASES])


def parse_line(line: str) -> tuple[str, list[str]]:
    """Split a meta-command line into its name and arguments (shell-style quoting)."""
    line = line.strip().removesuffix(";")  # ".mode csv;": SQL habits, accepted
    try:
        parts = shlex.split(line, posix=True)
    except ValueError as e:
        raise ShellError(f"{line.split()[0]}: {e} (quote arguments with ' or \")") from None
    return parts[0], parts[1:]


def run_meta_command(shell: Shell, line: str) -> None:
    """Run one meta-command line; unknown commands and bad arguments raise ShellError with a hint."""
    name, args = parse_line(line)
    cmd = lookup(name)
    if cmd is None:
        close = difflib.get_close_matches(name.lower(), all_names(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ShellError(f"unknown command {name}{hint} (.help lists the commands)")
    if not cmd.min_args <= len(args) <= cmd.max_args:
        raise ShellError(f"usage: {cmd.usage}")
    result = shell.runner.run(lambda progress: cmd.handler(shell, args)) if cmd.threaded else cmd.handler(shell, args)
    if result is not None:
        shell.emit(result)
