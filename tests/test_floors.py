"""The package is one line of floors (functional_mesh/README.md): imports only go down, no cycles.

Every import between our own modules is read from the source with ``ast``, at module level and
inside functions alike. The test fails on an import cycle (function-level imports included), on
a module-level import that goes up the floors, and on a function-level import between our modules
that is not listed below with its reason.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"

# Bottom first. A module may import only modules on lower floors.
FLOORS: list[set[str]] = [
    {"_errors"},
    {"_validate"},
    {"_layout"},
    {"layout", "_devices"},
    {"_mesh"},
    {"_sharding", "_order", "_realize_plan"},
    {"_visualize"},
    {"_torch"},
    {"_agree", "_cache"},
    {"_handle"},
    {"_realize"},
    {"_collectives"},
    {"_interop"},
    {"_vma"},
    {"_op_rules"},
    {"_shard_map"},
    {"__init__", "__main__"},
]

# Function-level imports between our modules that are truly needed, each with its reason.
LAZY_ALLOWED = {
    ("_sharding", "_torch"): "NamedSharding.placements builds torch objects; _sharding must import without torch",
}


def _floor(module: str) -> int:
    for i, floor in enumerate(FLOORS):
        if module in floor:
            return i
    raise AssertionError(f"module {module!r} is on no floor: add it to FLOORS and to functional_mesh/README.md")


def _target(node: ast.ImportFrom | ast.Import, module: str) -> list[str]:
    """The package modules that an import statement in ``module`` loads."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == "functional_mesh" and len(parts) > 1:
                out.append(parts[1])
        return out
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != "functional_mesh":
            return []
        base = parts[1:]
    elif node.level == 1:
        base = (node.module or "").split(".") if node.module else []
    else:  # pragma: no cover - the package is flat
        raise AssertionError(f"{module}: relative import of level {node.level}")
    if base:
        return [base[0]]
    return [alias.name for alias in node.names]  # from . import _torch


def imports() -> list[tuple[str, str, bool, int]]:
    """``(importer, imported, lazy, line)`` for every import between our modules."""
    edges = []
    for path in sorted(PACKAGE.glob("*.py")):
        module = path.stem
        tree = ast.parse(path.read_text(), filename=str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _target(node, module):
                    if target != module:
                        edges.append((module, target, id(node) not in top, node.lineno))
    return edges


def find_cycle(edges: list[tuple[str, str]]) -> list[str] | None:
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_reader_sees_the_imports_it_must():
    edges = {(a, b) for a, b, _, _ in imports()}
    assert ("_mesh", "_layout") in edges  # from . import _layout as L
    assert ("_realize", "_handle") in edges  # from ._handle import RealizedMesh
    assert ("_sharding", "_torch") in edges  # the lazy one


def test_find_cycle_finds_a_cycle_through_a_function_level_import():
    assert find_cycle([("a", "b"), ("b", "c"), ("c", "a")]) == ["a", "b", "c", "a"]
    assert find_cycle([("a", "b"), ("b", "c")]) is None


def test_no_import_cycle_even_through_function_level_imports():
    cycle = find_cycle([(a, b) for a, b, _, _ in imports()])
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("module", sorted(p.stem for p in PACKAGE.glob("*.py")))
def test_every_module_is_on_a_floor(module):
    _floor(module)


def test_module_level_imports_go_down_the_floors():
    up = [f"{a}.py:{line} imports {b}" for a, b, lazy, line in imports() if not lazy and _floor(b) >= _floor(a)]
    assert up == [], "imports that do not go down the floors: " + "; ".join(up)


def test_function_level_imports_between_our_modules_are_only_the_listed_ones():
    lazy = sorted({(a, b) for a, b, is_lazy, _ in imports() if is_lazy})
    assert lazy == sorted(LAZY_ALLOWED), f"function-level imports: {lazy}; allowed: {sorted(LAZY_ALLOWED)}"


def test_the_package_readme_states_the_floors():
    text = (PACKAGE / "README.md").read_text()
    for floor in FLOORS:
        for module in floor:
            assert f"{module}" in text, f"functional_mesh/README.md does not mention {module}"
