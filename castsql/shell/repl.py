"""The interactive prompt: prompt_toolkit with SQL highlighting, history, completion.

Keys (Emacs style, prompt_toolkit's defaults plus these):

* Enter runs the input when it is a finished statement (ends with ``;``), a
  meta-command (``.tables``) or empty; otherwise it starts a new line.
* Alt-Enter (Esc Enter) runs the input as it is, ``;`` or not.
* Tab completes (the first candidate at once, Tab again for the next); at the
  start of a line it indents.
* Ctrl-R searches the history backwards; Up/Down walk it.
* Ctrl-C clears the input (and cancels a running query); Ctrl-D on an empty
  line leaves the shell.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.completion import ThreadedCompleter
from prompt_toolkit.enums import DEFAULT_BUFFER
from prompt_toolkit.filters import Condition, has_focus, in_paste_mode
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.lexers import PygmentsLexer
from prompt_toolkit.styles import Style
from pygments.lexers.sql import SqlLexer

from castsql.shell.banner import banner_text
from castsql.shell.completer import SQLCompleter
from castsql.shell.statements import is_complete, is_meta

if TYPE_CHECKING:
    from castsql.shell.core import Shell

PROMPT = "castsql> "
CONTINUATION = "...> "

STYLE = Style.from_dict(
    {
        "prompt": "ansigreen bold",
        "continuation": "ansibrightblack",
        "completion-menu.completion.current": "bg:ansiblue ansiwhite",
        "completion-menu.meta.completion": "bg:#444444 #bbbbbb",
        "completion-menu.meta.completion.current": "bg:ansiblue ansiwhite",
    }
)


def history_path() -> str:
    """Where the history lives: ``$CASTSQL_HISTORY``, else ``~/.castsql_history``."""
    return os.path.expanduser(os.environ.get("CASTSQL_HISTORY") or "~/.castsql_history")


class _TolerantFileHistory(FileHistory):
    """A FileHistory that keeps working (in memory) when the file cannot be read or written."""

    def load_history_strings(self):
        try:
            yield from super().load_history_strings()
        except OSError:
            return

    def store_string(self, string: str) -> None:
        with contextlib.suppress(OSError):  # a read-only home directory must not break the shell
            super().store_string(string)


def make_history() -> History:
    path = history_path()
    if path in ("", os.devnull):
        return InMemoryHistory()
    return _TolerantFileHistory(path)


def should_run(text: str) -> bool:
    """Whether Enter runs ``text`` (rather than starting a new line).

    Example::

        >>> should_run("SELECT 1"), should_run("SELECT 1;"), should_run(".tables"), should_run("")
        (False, True, True, True)
    """
    return not text.strip() or is_meta(text) or is_complete(text)


def key_bindings() -> KeyBindings:
    kb = KeyBindings()
    # Only in the input itself: Ctrl-R's search field keeps its own Enter and Tab.
    editing = has_focus(DEFAULT_BUFFER)

    @Condition
    def completion_selected() -> bool:
        from prompt_toolkit.application import get_app

        state = get_app().current_buffer.complete_state
        return bool(state and state.current_completion)

    @kb.add("enter", filter=editing & completion_selected)
    def _accept_completion(event: KeyPressEvent) -> None:
        # The chosen completion is already in the text: Enter just closes the menu.
        event.current_buffer.complete_state = None

    @kb.add("enter", filter=editing & ~completion_selected)
    def _enter(event: KeyPressEvent) -> None:
        buf = event.current_buffer
        if should_run(buf.text):
            buf.validate_and_handle()
        else:
            buf.newline(copy_margin=not in_paste_mode())

    @kb.add("escape", "enter", filter=editing)
    def _run_anyway(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    @kb.add("tab", filter=editing)
    def _tab(event: KeyPressEvent) -> None:
        buf = event.current_buffer
        line = buf.document.current_line_before_cursor
        if not line.strip() and buf.complete_state is None:
            buf.insert_text("    ")
        elif buf.complete_state:
            buf.complete_next()
        else:
            buf.start_completion(select_first=True)

    return kb


def _continuation(width: int, line_number: int, is_soft_wrap: int) -> FormattedText:
    return FormattedText([("class:continuation", CONTINUATION.rjust(width))])


def run_interactive(shell: Shell, banner: bool = True) -> int:
    """Read, run, print until ``.quit`` or Ctrl-D; returns the exit status (0)."""
    if banner:
        shell.say(banner_text(shell.session))
    # DuckDB's function and keyword names take ~40 ms: fetch them while the user reads the banner.
    threading.Thread(target=shell.catalog.warm, name="castsql-warm", daemon=True).start()
    session: PromptSession[str] = PromptSession(
        message=FormattedText([("class:prompt", PROMPT)]),
        multiline=True,
        prompt_continuation=_continuation,
        lexer=PygmentsLexer(SqlLexer),
        completer=ThreadedCompleter(SQLCompleter(shell.catalog)),
        complete_while_typing=True,
        history=make_history(),
        auto_suggest=AutoSuggestFromHistory(),
        key_bindings=key_bindings(),
        search_ignore_case=True,
        style=STYLE,
        include_default_pygments_style=True,
    )
    while not shell.exit_requested:
        try:
            text = session.prompt()
        except KeyboardInterrupt:
            continue  # Ctrl-C at the prompt: drop the input, new prompt
        except EOFError:
            break  # Ctrl-D on an empty line
        if not text.strip():
            continue
        try:
            shell.run_lines(text.splitlines(keepends=True), "<prompt>")
        except KeyboardInterrupt:
            # Ctrl-C outside a running query (while printing, say): the shell stays.
            shell.stderr.write("Cancelled.\n")
    return 0
