"""Every docstring example in castsql still runs (examples that need Spark or
a table elsewhere are marked ``+SKIP`` where they are written)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import castsql

MODULES = sorted(m.name for m in pkgutil.walk_packages(castsql.__path__, "castsql.") if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
