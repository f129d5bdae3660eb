"""The interactive SQL shell and script runner (``castsql [URI]``).

Modules: :mod:`~castsql.shell.app` (command line, entry point ``main``),
:mod:`~castsql.shell.repl` (prompt_toolkit prompt), :mod:`~castsql.shell.core`
(running statements and meta-commands), :mod:`~castsql.shell.special`
(meta-commands), :mod:`~castsql.shell.render` (output modes),
:mod:`~castsql.shell.completer` and :mod:`~castsql.shell.catalog`
(completion), :mod:`~castsql.shell.runner` (cancellation, progress),
:mod:`~castsql.shell.statements` (where statements end).

Importing this package is cheap: nothing heavy is imported until used.
"""
