"""What the meta-commands and DuckDB's CLI flags change in a shell.

Example::

    >>> Settings(mode="csv", null="").text
    TextOptions(separator=None, null='', header=True)
"""

from __future__ import annotations

from dataclasses import dataclass

from castsql.shell.errors import ShellError
from castsql.shell.render import MODES
from castsql.shell.text_modes import TextOptions, normal_mode


@dataclass
class Settings:
    """What meta-commands and DuckDB's CLI flags change: output mode, timer,
    row limit, column types, and the text modes' separator, null text and header
    (``.separator``, ``.nullvalue``, ``.headers``); ``echo`` prints each
    command before it runs, ``bail`` stops a script at its first error."""

    mode: str = "box"
    timer: bool = False
    maxrows: int = 40
    types: bool = False
    separator: str | None = None
    null: str = "NULL"
    header: bool = True
    maxwidth: int = 0  # box and table width; 0: the terminal's
    echo: bool = False
    bail: bool = False

    def __post_init__(self) -> None:
        self.mode = normal_mode(self.mode)
        if self.mode not in MODES:
            raise ShellError(f"unknown mode {self.mode!r} (modes: {', '.join(MODES)})")

    @property
    def text(self) -> TextOptions:
        return TextOptions(separator=self.separator, null=self.null, header=self.header)
