"""What a meta-command may use of the shell that runs it.

The shell (:class:`castsql.shell.core.Shell`) imports the meta-commands to
dispatch them; they see it only through this interface, so neither module
imports the other's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from castsql.engine import Session
    from castsql.shell.catalog import Catalog
    from castsql.shell.runner import Runner
    from castsql.shell.settings import Settings


class Shell(Protocol):
    """The parts of a shell the meta-commands read and change."""

    session: Session
    settings: Settings
    catalog: Catalog
    runner: Runner
    exit_requested: bool

    def say(self, text: str) -> None: ...
    def emit(self, table: pa.Table) -> None: ...
    def set_output(self, path: str | None, *, once: bool = False) -> None: ...
    def run_file(self, path: str) -> bool: ...
    def replace_session(self, session: Session) -> None: ...
    def refuse_in_safe_mode(self, what: str) -> None: ...
