"""``castsql --help`` lists every command the program has."""

from __future__ import annotations

import pytest

from castsql.cli import WRITER_COMMANDS, main


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for command in ("demo", "ui", *WRITER_COMMANDS):
        assert f" {command} " in out.replace("|", " ")
    assert {"restore", "upgrade", "alter"} <= set(WRITER_COMMANDS)
