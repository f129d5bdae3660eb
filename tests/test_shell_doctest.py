"""The examples in the shell's docstrings still run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "castsql.shell.statements",
    "castsql.shell.render",
    "castsql.shell.runner",
    "castsql.shell.catalog",
    "castsql.shell.core",
    "castsql.shell.banner",
    "castsql.shell.completer",
    "castsql.shell.repl",
    "castsql.shell.special",
    "castsql.shell.special.registry",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
