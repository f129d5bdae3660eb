"""The real ``castsql`` shell in a pseudo-terminal (pexpect), for the tests
that type into it (tests/shell/test_shell_pty.py, safe mode, timeouts)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect

PROMPT = "castsql> "
BRACKETED_PASTE_ON, BRACKETED_PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
CASTSQL = str(Path(sys.executable).with_name("castsql"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|[\x07\x08]")


def plain(text: str) -> str:
    """Terminal output without escape sequences."""
    return ANSI.sub("", text)


class Shell:
    """A running ``castsql`` in a pty, with helpers that wait for the prompt."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        cmd = [CASTSQL] if os.path.exists(CASTSQL) else [sys.executable, "-m", "castsql.cli"]
        self.child = pexpect.spawn(
            cmd[0], [*cmd[1:], *args], env=env, dimensions=(40, 120), encoding="utf-8", timeout=15
        )
        self.child.expect_exact(PROMPT)
        self.banner = plain(self.child.before)

    def type(self, text: str) -> None:
        self.child.send(text)

    def run(self, sql: str) -> str:
        """Type ``sql`` + Enter; the (plain) output up to the next prompt."""
        self.child.send(sql + "\r")
        return self.wait_prompt()

    def wait_prompt(self, input_accepted: bool = False) -> str:
        """The output until the next prompt. prompt_toolkit redraws the prompt
        line on every key, so the prompt text alone does not mark a new prompt:
        bracketed-paste mode does, switched off when input is accepted and on
        again when the next prompt starts."""
        if not input_accepted:
            self.child.expect_exact(BRACKETED_PASTE_OFF)
        self.child.expect_exact(BRACKETED_PASTE_ON)
        out = plain(self.child.before)
        self.child.expect_exact(PROMPT)
        return out

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.child.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
