"""No import circles in castsql/, in any layer, and layers import only downwards:
the layers of docs/DESIGN.md §2, read from its table, every module in one; and
inside the engine's layer, its rooms in the order of §2.1's table.

The graph is built from the source (``ast``), not by importing it: every
``import`` counts, at module level or inside a function (an import moved into
a function to dodge a circle is still a circle: it only fails later, at a
call). Imports under ``if TYPE_CHECKING:`` never run, but they count too: a
type-only circle is still two modules that cannot be read one without the
other (issue 33), so a module that needs another's type without importing it
takes a ``Protocol`` of its own (``format.state.MetadataSource``,
``shell.special.host.Shell``).

Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so
those packages are edges too (except the importer's own packages, which are
already running).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from paths import REPO

ROOT = REPO / "castsql"

DESIGN = REPO / "docs" / "DESIGN.md"
LAYERS_SECTION = "## 2. Layers"  # docs/DESIGN.md §2: the table of layers this test enforces


def design_layers() -> tuple[dict[str, str], dict[str, set[str]], set[str]]:
    """docs/DESIGN.md §2 read: module prefix -> layer, layer -> the layers it
    may import, and the leaves anyone may import. The document is the one
    statement of the layers; this test holds the code to it."""
    text = DESIGN.read_text()
    assert LAYERS_SECTION in text, f"{DESIGN}: no section {LAYERS_SECTION!r}"
    section = text.split(LAYERS_SECTION, 1)[1].split("\n## ", 1)[0]
    owner: dict[str, str] = {}
    allowed: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`castsql"):
            continue
        layer, modules, _, may = cells
        for m in re.findall(r"`([a-z_.]+)`", modules):
            assert m not in owner, f"DESIGN.md §2 names {m} in two layers"
            owner[m] = layer
        allowed[layer] = set() if may in ("—", "-", "") else {w.strip() for w in may.split(",")}
    leaves = set(re.findall(r"^Leaf: `([a-z_.]+)`", section, re.M))
    unknown = {w for may in allowed.values() for w in may} - set(allowed)
    assert not unknown, f"DESIGN.md §2 names layers it does not define: {sorted(unknown)}"
    return owner, allowed, leaves


OWNER, LAYERS, LEAVES = design_layers()


def layer_of(module: str) -> str | None:
    """The layer of ``module``: the longest module prefix DESIGN.md §2 names."""
    best = max((p for p in OWNER if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else OWNER[best]


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    where: str  # "module", "function" or "type-checking"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with where it runs."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, where))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "type-checking")
                for stmt in child.orelse:
                    visit_stmt(stmt, where)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function" if where == "module" else where)
            else:
                visit(child, where)

    def visit_stmt(stmt: ast.stmt, where: str) -> None:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            found.append((stmt, where))
        else:
            visit(stmt, where)

    visit(tree, "module")
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> list[Edge]:
    modules = _modules()
    edges: list[Edge] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        own = {*_ancestors(name), name}
        for node, where in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if not target.startswith("castsql"):
                    continue
                for t in [*_ancestors(target), target]:
                    if t in modules and t not in own:
                        edges.append(Edge(name, t, node.lineno, where))
    return edges


def cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One circle through each strongly connected component of the graph."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        start = min(comp)
        # Shortest path back to start within the component (breadth first).
        prev: dict[str, Edge] = {}
        frontier = [start]
        seen = {start}
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w, e in sorted(graph.get(v, {}).items()):
                    if w not in comp:
                        continue
                    if w == start:
                        found = e
                        break
                    if w not in seen:
                        seen.add(w)
                        prev[w] = e
                        nxt.append(w)
                if found:
                    break
            frontier = nxt
        path = [found]
        while path[0].source != start:
            path.insert(0, prev[path[0].source])
        out.append(path)
    return out


_WHERE = {"function": ", in a function", "type-checking": ", for types only"}


def _describe(cycle: list[Edge]) -> str:
    return " → ".join(f"{e.source} (line {e.line}{_WHERE.get(e.where, '')})" for e in cycle) + f" → {cycle[0].source}"


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import circles in castsql/:\n" + "\n".join(_describe(c) for c in found)


def test_layers_import_only_downwards():
    wrong = []
    for e in import_graph():
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is None or dst is None or src == dst or e.target in LEAVES:
            continue
        if dst not in LAYERS[src]:
            wrong.append(f"{e.source} (line {e.line}, {src}) imports {e.target} ({dst})")
    assert not wrong, "imports against the layers of docs/DESIGN.md §2:\n" + "\n".join(wrong)


def test_every_module_is_in_a_layer_of_the_design():
    """A new package or top-level module gets its row in DESIGN.md §2 first."""
    homeless = sorted(m for m in _modules() if m not in LEAVES and layer_of(m) is None)
    assert not homeless, "modules no layer of docs/DESIGN.md §2 holds: " + ", ".join(homeless)


def test_the_design_names_the_layers_of_the_floor_plan():
    assert set(LAYERS) == {
        "storage", "format", "snapshot", "write", "engine", "mirror",
        "embedded", "spark", "shell", "ui", "wiring", "api", "cli",
    }  # fmt: skip
    assert LAYERS["storage"] == set()
    assert LAYERS["format"] == {"storage"}
    assert "castsql.errors" in LEAVES
    assert [layer_of(m) for m in ("castsql", "castsql.table", "castsql.engine.duckdb.native", "castsql.write_cli")] == [
        "api", "api", "engine", "cli",
    ]  # fmt: skip


def test_no_castsql_module_takes_a_moved_error_from_castsql_errors():
    """``castsql.errors`` names the upper layers' errors only for code written
    before they moved (looked up lazily); CastSQL imports them from their layer."""
    from castsql.errors import MOVED

    wrong = []
    for name, path in _modules().items():
        for node, _ in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "castsql.errors":
                wrong += [f"{name} (line {node.lineno}): {a.name}" for a in node.names if a.name in MOVED]
    assert not wrong, "import these from their own layer (see castsql.errors.MOVED):\n" + "\n".join(wrong)


def test_nothing_but_the_command_imports_the_ui():
    wrong = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in import_graph()
        if (e.target == "castsql.ui" or e.target.startswith("castsql.ui."))
        and not (e.source == "castsql.ui" or e.source.startswith("castsql.ui."))
        and not (e.source == "castsql.cli" or e.source.startswith("castsql.cli."))
    ]
    assert not wrong, "the UI is the top layer; only the castsql.cli package may import it:\n" + "\n".join(wrong)


def test_the_graph_sees_function_level_and_type_checking_imports(tmp_path):
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\ndef f():\n    import c\n"
    )
    got = {(n.names[0].name, where) for n, where in _imports(tree) if isinstance(n, ast.Import)}
    assert got == {("a", "module"), ("b", "type-checking"), ("c", "function")}


def test_a_cycle_is_named():
    edges = [Edge("x.a", "x.b", 1, "module"), Edge("x.b", "x.a", 7, "function"), Edge("x.b", "x.c", 2, "module")]
    (cycle,) = cycles(edges)
    assert _describe(cycle) == "x.a (line 1) → x.b (line 7, in a function) → x.a"


def test_a_type_only_cycle_is_a_cycle():
    """How ``format.change`` and ``format.log`` once stood: the log imported the
    change, the change named the log's type under ``TYPE_CHECKING``."""
    edges = [Edge("x.log", "x.change", 3, "module"), Edge("x.change", "x.log", 9, "type-checking")]
    (cycle,) = cycles(edges)
    assert _describe(cycle) == "x.change (line 9, for types only) → x.log (line 3) → x.change"


def test_castsql_spark_names_are_the_functions_whatever_was_imported_first():
    """``castsql.spark`` loads its names on first use; a submodule of the same
    name, imported first through another name, must not hide the function
    (``from castsql.spark import update`` then ``import merge`` once gave the
    module ``castsql.spark.merge``)."""
    import subprocess
    import sys

    code = (
        "import importlib, types, castsql.spark as cs\n"
        "for m in sorted(set(cs._EXPORTS.values())): importlib.import_module(m)\n"
        "print([n for n in cs.__all__ if isinstance(getattr(cs, n), types.ModuleType)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


ROOMS_SECTION = "### 2.1 The engine's wings"  # docs/DESIGN.md §2.1: the engine's rooms this test enforces
ENGINE = "castsql.engine"


@dataclass(frozen=True)
class Room:
    name: str
    wing: str | None  # a sub-package holding the whole room (``castsql.engine.sql``)
    modules: frozenset[str]  # modules named one by one (the query path's, the session's)
    may: tuple[str, ...]  # the rooms it may import, as its row names them


def design_rooms() -> list[Room]:
    """docs/DESIGN.md §2.1 read, in the table's order. A row's modules are a
    wing (``engine/sql/``: the sub-package, and the modules after it lie in
    it) or modules of ``castsql/engine/`` by their last name (``session``), or
    a full name (``castsql.engine``, the package itself)."""
    text = DESIGN.read_text()
    assert ROOMS_SECTION in text, f"{DESIGN}: no section {ROOMS_SECTION!r}"
    section = text.split(ROOMS_SECTION, 1)[1].split("\n### ", 1)[0]
    known = _modules()
    rooms: list[Room] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        name, modules, _, may = cells
        named = re.findall(r"`([a-z_./]+)`", modules)
        wing = None
        if named[0].startswith("engine/"):
            wing = ENGINE + "." + named[0].removeprefix("engine/").rstrip("/").replace("/", ".")
            listed = {f"{wing}.{m.rstrip('/')}" for m in named[1:]}
        else:
            listed = {m if m.startswith("castsql") else f"{ENGINE}.{m}" for m in named}
        missing = sorted(m for m in listed | ({wing} if wing else set()) if m not in known)
        assert not missing, f"DESIGN.md §2.1 ({name}) names modules that do not exist: {missing}"
        rooms.append(
            Room(
                name,
                wing,
                frozenset(() if wing else listed),
                () if may in ("—", "-", "") else tuple(w.strip() for w in may.split(",")),
            )
        )
    return rooms


def room_of(module: str, rooms: list[Room]) -> str | None:
    """The room of an engine module: named one by one, or inside a wing."""
    for room in rooms:
        if module in room.modules or (room.wing and _within(module, room.wing)):
            return room.name
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_engines_rooms_are_ordered():
    """Each room of DESIGN.md §2.1 may import only rooms in rows before its
    own: the rooms are in an order, and no two can import each other."""
    rooms = design_rooms()
    names = [r.name for r in rooms]
    assert len(set(names)) == len(names), f"DESIGN.md §2.1 names a room twice: {names}"
    wrong = []
    for i, room in enumerate(rooms):
        for other in room.may:
            if other not in names:
                wrong.append(f"{room.name} may import {other!r}, which is no room")
            elif names.index(other) >= i:
                wrong.append(f"{room.name} may import {other}, which comes after it")
    assert not wrong, "DESIGN.md §2.1:\n" + "\n".join(wrong)


def test_every_engine_module_is_in_a_room():
    rooms = design_rooms()
    homeless = sorted(m for m in _modules() if _within(m, ENGINE) and room_of(m, rooms) is None)
    assert not homeless, "modules of castsql/engine/ no room of docs/DESIGN.md §2.1 holds: " + ", ".join(homeless)
    doubled = [m for m in _modules() if sum(room_of(m, [r]) is not None for r in rooms) > 1]
    assert not doubled, f"modules in two rooms of docs/DESIGN.md §2.1: {doubled}"


def test_the_engines_rooms_import_only_the_rooms_before_them():
    """docs/DESIGN.md §2.1, import by import. Importing any engine module runs
    the package ``castsql.engine`` first; that edge does not count: the
    package loads nothing until its ``Session`` is asked for."""
    rooms = design_rooms()
    may = {r.name: set(r.may) for r in rooms}
    wrong = []
    for e in import_graph():
        if e.target == ENGINE:
            continue
        src, dst = room_of(e.source, rooms), room_of(e.target, rooms)
        if src is None or dst is None or src == dst:
            continue
        if dst not in may[src]:
            wrong.append(f"{e.source} (line {e.line}, {src}) imports {e.target} ({dst})")
    assert not wrong, "against the engine's rooms (docs/DESIGN.md §2.1):\n" + "\n".join(wrong)


def test_the_design_orders_the_engines_rooms():
    """What §2.1 says of the rooms, pinned: SQL text imports no other room and
    SQL that writes only SQL text (both are read without a DuckDB session);
    the barrier and DuckDB wiring do not import each other."""
    rooms = {r.name: r for r in design_rooms()}
    assert rooms["SQL text"].may == ()
    assert rooms["SQL that writes"].may == ("SQL text",)
    assert "DuckDB wiring" not in rooms["the statement barrier"].may
    assert "the statement barrier" not in rooms["DuckDB wiring"].may
    assert rooms["SQL text"].wing == "castsql.engine.sql"
    assert room_of("castsql.engine.duckdb.native.build", list(rooms.values())) == "DuckDB wiring"
    assert room_of(ENGINE, list(rooms.values())) == "the session"


def test_import_castsql_loads_no_duckdb_until_a_session_needs_it():
    """A Spark job or a script that only reads a manifest pays for pyarrow, not
    DuckDB; a session's SQL write still reaches the embedded engine."""
    import subprocess
    import sys

    code = (
        "import sys, castsql\n"
        "assert 'duckdb' not in sys.modules, 'import castsql imported duckdb'\n"
        "from castsql.engine import Session\n"
        "assert 'duckdb' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
