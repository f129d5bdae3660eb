"""Old import paths of moved modules (issue 55) keep working for one release,
from one table (``castsql._moved.MOVED``): each old name is the new module
itself, warns with the new path, and CastSQL never uses an old name."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from paths import REPO

from castsql._moved import MOVED

ROOT = REPO / "castsql"


def _import_quietly(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_new_module(old):
    new = MOVED[old]
    module = _import_quietly(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]
    assert module.__name__ == new and module.__spec__.name == new  # the module keeps its own identity


def test_every_new_name_exists_and_no_old_one_does():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} moved to {new}, which does not exist"
        rel = Path(*old.split(".")[1:])
        assert not (ROOT / rel).with_suffix(".py").exists() and not (ROOT / rel / "__init__.py").exists(), (
            f"{old} still exists as a file: it is not moved"
        )


def test_an_old_name_warns_with_its_new_path():
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    from castsql.engine.guard import check_statement\n"
        "    import castsql.engine.native.build\n"
        "print([(x.category.__name__, str(x.message)) for x in w])\n"
        "from castsql.engine.barrier.guard import check_statement as new\n"
        "assert check_statement is new\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "('DeprecationWarning', 'castsql.engine.guard has moved to castsql.engine.barrier.guard" in out.stdout
    assert "castsql.engine.native has moved to castsql.engine.duckdb.native" in out.stdout
    assert "castsql.engine.native.build has moved to castsql.engine.duckdb.native.build" in out.stdout


def test_a_moved_submodule_runs_once_under_its_new_name():
    """``castsql.engine.native.build`` is answered by the alias, not found again
    in the new package's directory and run a second time as another module."""
    old = _import_quietly("castsql.engine.native.build")
    assert old is importlib.import_module("castsql.engine.duckdb.native.build")
    assert old.BUILT == importlib.import_module("castsql.engine.duckdb.native").BUILT


def test_castsql_never_names_an_old_module():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "_moved.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]  # importlib.import_module("…"), castsql.spark's lazy table
            wrong += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {n}" for n in names if n in MOVED]
    assert not wrong, "CastSQL imports these by their old names (castsql._moved.MOVED):\n" + "\n".join(wrong)


def test_the_finder_answers_only_the_table():
    from castsql._moved import MovedFinder

    finder = MovedFinder()
    assert finder.find_spec("castsql.engine.session") is None
    assert finder.find_spec("json") is None
    with pytest.warns(DeprecationWarning, match="castsql.format.datafiles"):
        spec = finder.find_spec("castsql.format.writer")
    assert spec is not None and spec.name == "castsql.format.writer"
