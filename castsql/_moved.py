"""The old import paths of modules that moved (issue 55: ``engine/`` in
wings, the engines named as engines), kept importable for one release from
this one table rather than a stub file per module.

``import castsql.engine.guard`` gives the module now at
``castsql.engine.barrier.guard``: the same module object, so a monkeypatch
through either name patches both, and a class is the same class. Each old
name warns once per process (:class:`DeprecationWarning`) with its new path.
CastSQL itself never imports an old name (``tests/project/test_moved_modules.py``).

The finder goes first on ``sys.meta_path`` (installed by
``castsql/__init__.py``), so that the old names of a moved package's
submodules (``castsql.engine.native.build``) are answered here: after the
path finder, they would be found in the new package's directory and run a
second time as a second module. For any other name it is one dict lookup.

Example::

    >>> import importlib, warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     old = importlib.import_module("castsql.engine.guard")
    >>> old is importlib.import_module("castsql.engine.barrier.guard")
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

# old module name -> new module name
MOVED: dict[str, str] = {
    # engine/ in wings: SQL text
    "castsql.engine.tokens": "castsql.engine.sql.tokens",
    "castsql.engine.plan": "castsql.engine.sql.plan",
    "castsql.engine.rewrite": "castsql.engine.sql.rewrite",
    "castsql.engine.pushdown": "castsql.engine.sql.pushdown",
    "castsql.engine.quoting": "castsql.engine.sql.quoting",
    "castsql.engine.literals": "castsql.engine.sql.literals",
    "castsql.engine.names": "castsql.engine.sql.names",
    # the statement barrier
    "castsql.engine.guard": "castsql.engine.barrier.guard",
    "castsql.engine.policy": "castsql.engine.barrier.policy",
    "castsql.engine.safety": "castsql.engine.barrier.safety",
    # DuckDB wiring
    "castsql.engine.duck": "castsql.engine.duckdb.duck",
    "castsql.engine.native": "castsql.engine.duckdb.native",
    "castsql.engine.native.build": "castsql.engine.duckdb.native.build",
    "castsql.engine.lake": "castsql.engine.duckdb.lake",
    "castsql.engine.threads": "castsql.engine.duckdb.threads",
    "castsql.engine.stores": "castsql.engine.duckdb.stores",
    "castsql.engine.objectfs": "castsql.storage.objectfs",
    # history and audits
    "castsql.engine.audit": "castsql.engine.audits.audit",
    "castsql.engine.changes": "castsql.engine.audits.changes",
    # SQL that writes
    "castsql.engine.intercept": "castsql.engine.writing.intercept",
    "castsql.engine.writes": "castsql.engine.writing.writes",
    "castsql.engine.ddl": "castsql.engine.writing.ddl",
    # the engines named as engines
    "castsql.embedded.writer": "castsql.embedded.engine",
    "castsql.spark.merger": "castsql.spark.engine",
    "castsql.spark.writer": "castsql.spark.appends",
    "castsql.format.writer": "castsql.format.datafiles",
    # one command-line package
    "castsql.spark.cli": "castsql.cli.spark",
    "castsql.demo": "castsql.cli.demo",
    # storage owns its fsspec adapter
    "castsql.engine.duckdb.objectfs": "castsql.storage.objectfs",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module of its new one (imported, or run, once)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system sets the old name's spec on the module whatever
        # it already held; the module keeps its own (reload, pickling by name).
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m <old name>`` (runpy asks the loader for the code)."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec else None
        return loader.get_code(self.new) if isinstance(loader, importlib.abc.InspectLoader) else None


class MovedFinder(importlib.abc.MetaPathFinder):
    """Answers the old names of :data:`MOVED`, and no other."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(
            f"{fullname} has moved to {new}; the old name is kept for one release",
            DeprecationWarning,
            stacklevel=2,
        )
        return ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Puts the finder first on ``sys.meta_path``, once per process."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
