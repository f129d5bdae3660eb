"""Meta-commands (``.tables``, ``.history t``, ``.mode csv`` …), in the DuckDB shell's dot style.

Each command is a function registered with :func:`meta_command` in
:mod:`castsql.shell.special.commands`; :func:`run_meta_command` parses a line
and runs it. The registry also drives ``.help`` and completion of command
names and arguments.

Example::

    >>> [c for c in sorted(COMMANDS) if c.startswith(".h")]
    ['.headers', '.help', '.history']
"""

from castsql.shell.special import commands as _commands  # registers the commands
from castsql.shell.special.registry import COMMANDS, MetaCommand, lookup, meta_command, run_meta_command

__all__ = ["COMMANDS", "MetaCommand", "lookup", "meta_command", "run_meta_command"]

_ = _commands
