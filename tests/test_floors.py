"""The package's named layers (functional_mesh/README.md): imports go down or sideways, never in a circle.

Which module belongs to which layer is one dict, :data:`LAYERS` (a folder per layer could take its
place); the README's table must say the same. Every import between our own modules is read from
the source with ``ast``, at module level and inside functions alike. The tests fail on an import
cycle (function-level imports included, sideways ones too), on a module-level import of a higher
layer, on a function-level import between our modules that is not listed below with its reason,
on a module that no layer holds, and on an integration (``integrations/``) that imports more than
the facade, torch, the frameworks it adapts and the standard library. Adding a module is one
entry in :data:`LAYERS`: nothing is renumbered. The same file checks that private state stays
home and that global state is named.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"

# The layers, bottom first: a module imports modules of its own layer (sideways) or of lower layers.
LAYERS: dict[str, tuple[str, ...]] = {
    # plain values and their algebra, pure functions of them (no torch)
    "pure values": ("_errors", "_validate", "_layout", "layout", "_devices", "_mesh", "_mesh_shape",
                    "_mesh_transforms", "_mesh_groups", "_sharding", "_order", "_visualize", "_realize_plan",
                    "_reshard_blocks", "_reshard_plan"),
    # the varying-axes types and their rules (no torch)
    "pure types": ("_vma",),
    # what we take from torch: its objects, its private APIs, what compiled code can read
    "torch boundary": ("_torch", "_context"),
    # process groups and communication: the groups' life, the handle, realize, the collectives, DTensors
    "effects": ("_agree", "_debug", "_cache", "_handle", "_steps", "_pending", "_realize", "_call", "_runs",
                "_collectives", "_reshard", "_interop"),
    # typed and untyped shard_map regions
    "regions": ("_op_rules", "_region", "_interpret", "_boundary", "_shard_map"),
    # the public names and the command line
    "facade": ("__init__", "__main__"),
}
LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}
RANK = {layer: i for i, layer in enumerate(LAYERS)}  # bottom first

# Function-level imports between our modules that are truly needed, each with its reason.
LAZY_ALLOWED = {
    ("_sharding", "_torch"): "NamedSharding.placements builds torch objects; _sharding must import without torch",
}


def _layer(module: str) -> str:
    if module in LAYER_OF:
        return LAYER_OF[module]
    raise AssertionError(f"module {module!r} is in no layer: add it to LAYERS in tests/test_floors.py and to the "
                         f"table in functional_mesh/README.md")


def readme_layers(text: str) -> dict[str, str]:
    """``{module: layer}`` from the table of functional_mesh/README.md (``| pure values | `_errors`, ... |``)."""
    layers: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] not in LAYERS:
            continue
        for module in re.findall(r"`([\w.]+)`", cells[1]):
            assert module not in layers, f"functional_mesh/README.md puts {module} in two layers"
            layers[module] = cells[0]
    return layers


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
        # a module-level `if TYPE_CHECKING:` block's imports are the module's own (for type checkers only)
        top |= {id(m) for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
                and n.test.id in ("TYPE_CHECKING", "_TYPE_CHECKING") for m in n.body}
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


def upward(edges: list[tuple[str, str, bool, int]], layer_of: dict[str, str]) -> list[str]:
    """The module-level imports of a higher layer than the importer's."""
    return [f"{a}.py:{line} imports {b} ({layer_of[a]} -> {layer_of[b]})" for a, b, lazy, line in edges
            if not lazy and RANK[layer_of[b]] > RANK[layer_of[a]]]


def test_the_reader_sees_the_imports_it_must():
    edges = {(a, b) for a, b, _, _ in imports()}
    assert ("_mesh", "_layout") in edges  # from . import _layout as L
    assert ("_realize", "_handle") in edges  # from ._handle import RealizedMesh
    assert ("_sharding", "_torch") in edges  # the lazy one


def test_find_cycle_finds_a_cycle_through_a_function_level_import():
    assert find_cycle([("a", "b"), ("b", "c"), ("c", "a")]) == ["a", "b", "c", "a"]
    assert find_cycle([("a", "b"), ("b", "c")]) is None


def test_no_import_cycle_even_through_function_level_imports_and_sideways():
    cycle = find_cycle([(a, b) for a, b, _, _ in imports()])
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("module", sorted(p.stem for p in PACKAGE.glob("*.py")))
def test_every_module_is_in_a_layer(module):
    _layer(module)


def test_module_level_imports_go_down_or_sideways():
    up = upward(imports(), LAYER_OF)
    assert up == [], "imports of a higher layer: " + "; ".join(up)


def test_an_import_of_a_higher_layer_is_seen_and_sideways_is_not():
    layer_of = {"_mesh": "pure values", "_sharding": "pure values", "_torch": "torch boundary"}
    edges = [("_mesh", "_sharding", False, 1), ("_sharding", "_torch", False, 2), ("_sharding", "_torch", True, 3),
             ("_torch", "_mesh", False, 4)]
    assert upward(edges, layer_of) == ["_sharding.py:2 imports _torch (pure values -> torch boundary)"]


def test_function_level_imports_between_our_modules_are_only_the_listed_ones():
    lazy = sorted({(a, b) for a, b, is_lazy, _ in imports() if is_lazy})
    assert lazy == sorted(LAZY_ALLOWED), f"function-level imports: {lazy}; allowed: {sorted(LAZY_ALLOWED)}"


def test_layers_hold_exactly_the_modules_of_the_package_once_each():
    listed = [m for modules in LAYERS.values() for m in modules]
    assert sorted(listed) == sorted(set(listed)) == sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert list(LAYERS)[0] == "pure values" and list(LAYERS)[-1] == "facade"


def test_the_readme_table_says_what_layers_says():
    assert readme_layers((PACKAGE / "README.md").read_text()) == LAYER_OF


def test_readme_layers_reads_the_table_as_written():
    table = """| layer | modules | job | torch? |
|---|---|---|---|
| facade | `__init__` | the facade | no |
| pure values | `_mesh`, `_sharding` | values | no |
| floor 3 | `_x` | not a layer | no |
"""
    assert readme_layers(table) == {"__init__": "facade", "_mesh": "pure values", "_sharding": "pure values"}


# -- integrations: clients of the facade, above every layer ----------------------------------------

INTEGRATIONS = PACKAGE / "integrations"
INTEGRATION_MAY_IMPORT = {"functional_mesh", "torch", "torchtitan", "accelerate"}  # and the standard library
# Private modules of ours that an integration may import besides the facade, each with its reason.
INTEGRATION_PRIVATE_ALLOWED = {
    "_torch": "the one home of torch's private APIs: an integration that must reach into a torch object (accelerate "
              "renames flattened DeviceMesh dims) asks _torch (rename_flattened) instead of reading torch's privates",
}


def integration_imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``path``, relative ones resolved in the package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from .. import _mesh: inside functional_mesh
                base = ".".join(["functional_mesh", "integrations"][:max(0, 2 - node.level + 1)])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names]
            out += [(n, node.lineno) for n in names] if module in {"functional_mesh", "functional_mesh.integrations"} \
                else [(module, node.lineno)]
    return out


def bad_integration_imports(imported: list[tuple[str, int]], name: str) -> list[str]:
    bad = []
    for module, line in imported:
        top = module.split(".")[0]
        if top == "functional_mesh":
            parts = module.split(".")
            ok = len(parts) == 1 or parts[1] == "integrations" or not parts[1].startswith("_") \
                or parts[1] in INTEGRATION_PRIVATE_ALLOWED
        else:
            ok = top in INTEGRATION_MAY_IMPORT or top in sys.stdlib_module_names or top == "__future__"
        if not ok:
            bad.append(f"{name}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("path", sorted(INTEGRATIONS.glob("*.py")), ids=lambda p: p.name)
def test_integrations_import_only_the_facade_torch_and_torchtitan(path):
    assert bad_integration_imports(integration_imports(path), path.name) == []


def test_the_integration_import_check_can_fail(tmp_path):
    imported = [("functional_mesh", 1), ("functional_mesh.Mesh", 2), ("torch.distributed", 3), ("itertools", 4),
                ("functional_mesh._mesh", 5), ("functional_mesh._mesh.Mesh", 6), ("numpy", 7), ("attrs", 8)]
    assert bad_integration_imports(imported, "x.py") == [
        "x.py:5 imports functional_mesh._mesh", "x.py:6 imports functional_mesh._mesh.Mesh", "x.py:7 imports numpy",
        "x.py:8 imports attrs"]
    source = ("from .. import _mesh\nfrom functional_mesh._sharding import P\nfrom functional_mesh import P\n"
              "from functional_mesh import _torch\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert bad_integration_imports(integration_imports(path), "p.py") == [
        "p.py:1 imports functional_mesh._mesh", "p.py:2 imports functional_mesh._sharding"]


def test_nothing_in_the_package_imports_its_integrations():
    assert [(a, line) for a, b, _, line in imports() if b == "integrations"] == []


# -- one piece for one meaning ---------------------------------------------------------------------

# A product of axis sizes written by hand (a loop multiplying sizes, or math.prod over axis_size calls)
# instead of _mesh_shape.axes_size. Modules still to switch, each listed until it does (the test fails when
# one is listed but clean, so the list cannot go stale).
HAND_PRODUCT = re.compile(r"\*=\s*[\w.]*(axis_size\(|sizes\[)|prod\(\[?[^)\n]*axis_size\(")
PRODUCT_PENDING: set[str] = set()


def test_products_of_axis_sizes_use_the_one_helper():
    found = {p.stem: len(HAND_PRODUCT.findall(p.read_text())) for p in PACKAGE.glob("*.py")}
    assert found.pop("_mesh_shape") == 1  # the helper's own loop
    found = {m for m, n in found.items() if n}
    assert found == PRODUCT_PENDING, f"hand-written products of axis sizes: {sorted(found)}; use _mesh.axes_size"
    assert HAND_PRODUCT.search("        size *= rm.axis_size(a)") and HAND_PRODUCT.search("size *= sizes[a]")
    assert HAND_PRODUCT.search("math.prod([mesh.axis_size(a) for a in later_outer])")


def test_no_two_modules_define_a_class_of_the_same_name():
    """Two unrelated classes of one name (two ``_Plan``s) read as one; name each for what it is."""
    defined: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(path.stem)
    assert {n: m for n, m in defined.items() if len(m) > 1} == {}


# -- global mutable state: each piece named, with its reason, in the package README ------------------

_CONTAINERS = ("dict", "list", "set", "ContextVar", "ContextStack", "WeakKeyDictionary", "WeakTensorKeyDictionary",
               "GroupCache", "defaultdict", "Counter", "OrderedDict")


def _module_state() -> list[tuple[str, str]]:
    """(module, name) of every module-level name bound to a mutable container, a context variable or a cache."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            called = getattr(value, "func", None)
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                called is not None and getattr(called, "attr", getattr(called, "id", "")) in _CONTAINERS)
            found += [(path.stem, t.id) for t in targets
                      if mutable and isinstance(t, ast.Name) and t.id != "__all__"]
    return found


def test_every_piece_of_global_state_is_named_in_the_readme():
    readme = (PACKAGE / "README.md").read_text()
    section = readme[readme.index("- Global mutable state"):]
    state = _module_state()
    assert ("_cache", "CACHE") in state and ("_boundary", "_PLANS") in state  # the finder finds
    missing = [f"{m}.{n}" for m, n in state if f"`{n}`" not in section and f"{m}.{n}`" not in section]
    assert missing == [], f"global state not listed in functional_mesh/README.md: {missing}"


# -- private state stays home ------------------------------------------------------------------------
#
# A module reads another's state through named accessors, never through its private names: an
# attribute starting with ``_`` that a class of another module creates (its ``__slots__``, an attrs
# field, a ``self._x = ...`` or ``object.__setattr__(self, "_x", ...)``, a method or a class attribute
# with a value), named directly, through ``self`` or as a string to ``getattr``/``hasattr``; a module's
# private name (``C._REGION``, ``from ._agree import _next_call``); and no module writes to an object
# another module owns (``CACHE.hits += 1``, ``CACHE.groups[k] = g``, ``CACHE.created.append(g)``).
# Read with ``ast`` from the source: a private name that the reading module's own classes create too
# counts as its own, but a bare annotation creates nothing (a mixin that declares its host's slots
# still reads them across modules).

# What may be read anyway, each with its reason.
PRIVATE_ALLOWED: dict[str, str] = {}
# Reads still to replace, each listed until it goes (the test fails when a listed one is gone, so the
# list cannot go stale).
PRIVATE_PENDING: set[tuple[str, str]] = set()
_MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
             "remove"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_FIELD_DECORATORS = {"define", "frozen", "mutable", "s", "attrs", "dataclass"}  # attrs and dataclasses


def _makes_fields(cls: ast.ClassDef) -> bool:
    """Whether ``cls``'s bare annotations make fields (an attrs class or a dataclass) rather than only name them."""
    for deco in cls.decorator_list:
        func = deco.func if isinstance(deco, ast.Call) else deco
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in _FIELD_DECORATORS:
            return True
    return False


def _class_attributes(tree: ast.Module) -> dict[str, str]:
    """``{private attribute: class}`` for the attributes the module's classes create.

    A class creates an attribute with its ``__slots__``, a field of an attrs class or a dataclass, a
    method, a class attribute with a value, or a store on ``self`` (``self._x = v``,
    ``object.__setattr__(self, "_x", v)``). A bare annotation in any other class (``_x: int``, as a
    mixin declares what its host sets) creates nothing: the attribute stays its creator's.
    """
    out: dict[str, str] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        fields = _makes_fields(cls)
        for node in cls.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and (node.value is not None or fields) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id == "__slots__":
                    out.update({c.value: cls.name for c in ast.walk(node.value)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str) and _private(c.value)})
                elif isinstance(t, ast.Name) and _private(t.id):
                    out[t.id] = cls.name
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                out[node.name] = cls.name
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self" and _private(node.attr)):
                out[node.attr] = cls.name
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "__setattr__" and len(node.args) >= 2
                  and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                out[node.args[1].value] = cls.name
    return out


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_state_uses(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """``(module, line, what)`` for every use of another module's private state in ``{module: source}``:
    ``what`` is ``Class._name`` or ``module._name`` for a read, ``writes <module>'s <target>`` for a write."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    attributes = {m: _class_attributes(t) for m, t in trees.items()}
    found = []
    for module, tree in trees.items():
        modules: dict[str, str] = {}  # local name -> one of our modules
        objects: dict[str, str] = {}  # local name -> the module of ours it was imported from
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                for alias in node.names:
                    if node.module is None and alias.name in trees:
                        modules[alias.asname or alias.name] = alias.name
                    elif node.module in trees:
                        objects[alias.asname or alias.name] = node.module
                        if _private(alias.name):
                            found.append((module, node.lineno, f"{node.module}.{alias.name}"))

        def owner(name: str, module: str = module) -> str | None:
            if name in attributes[module]:
                return None
            return min((f"{attributes[m][name]}.{name}" for m in attributes if m != module and name in attributes[m]),
                       default=None)

        def write(node: ast.AST, target: ast.expr) -> None:
            root = _root_name(target)
            if root in objects or root in modules:
                found.append((module, node.lineno, f"writes {objects.get(root) or modules[root]}'s {ast.unparse(target)}"))

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in modules:
                    found.append((module, node.lineno, f"{modules[value.id]}.{node.attr}"))
                elif o := owner(node.attr):  # through self too: a class's own are those it creates
                    found.append((module, node.lineno, o))
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in ("getattr", "hasattr", "setattr", "delattr", "__setattr__") and len(node.args) >= 2:
                    arg = node.args[1]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _private(arg.value) \
                            and (o := owner(arg.value)):
                        found.append((module, node.lineno, o))
                if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and \
                        isinstance(func.value, (ast.Attribute, ast.Subscript)):
                    write(node, func.value)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, (ast.Attribute, ast.Subscript)) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                            write(node, sub)
    return sorted(set(found))


def test_no_module_reads_or_writes_another_modules_private_state():
    uses = private_state_uses({p.stem: p.read_text() for p in PACKAGE.glob("*.py")})
    found = {(m, what) for m, _, what in uses if what not in PRIVATE_ALLOWED}
    assert found - PRIVATE_PENDING == set(), "private state read across modules: " + "; ".join(
        f"{m}.py:{line} {what}" for m, line, what in uses if (m, what) in found - PRIVATE_PENDING)
    assert PRIVATE_PENDING - found == set(), f"listed as pending but gone (strike them): {PRIVATE_PENDING - found}"


def test_the_private_state_check_sees_reads_and_writes_across_modules():
    owner = """
class Handle:
    __slots__ = ("_memo", "_epoch")
    def _check(self):
        return self._memo, self._epoch
CACHE = Handle()
_COUNTER = {}
def _helper():
    pass
"""
    reader = """
from . import owner as O
from .owner import CACHE, Handle, _helper
def use(rm):
    rm._check()
    hasattr(rm, "_epoch")
    O._COUNTER["x"] = 1
    CACHE.hits += 1
    CACHE.groups[1] = 2
    CACHE.created.append(3)
    return rm._memo, rm.public, rm._not_ours
"""
    home = "class Other:\n    def __init__(self):\n        self._memo = 1\n    def f(self):\n        return self._memo\n"
    assert private_state_uses({"owner": owner, "reader": reader, "home": home}) == [
        ("reader", 3, "owner._helper"), ("reader", 5, "Handle._check"), ("reader", 6, "Handle._epoch"),
        ("reader", 7, "owner._COUNTER"), ("reader", 7, "writes owner's O._COUNTER['x']"),
        ("reader", 8, "writes owner's CACHE.hits"), ("reader", 9, "writes owner's CACHE.groups[1]"),
        ("reader", 10, "writes owner's CACHE.created"), ("reader", 11, "Handle._memo")]


def test_an_annotation_does_not_make_another_modules_slot_its_own():
    """A mixin that declares its host's slots (``_names: tuple``) and reads them through ``self`` reads
    another module's private state: the slots belong to the module whose class creates them."""
    host = """
import attrs
from .mixin import Part
@attrs.frozen
class Host(Part):
    _names: tuple
    _cache: dict = attrs.field(init=False)
    def __init__(self, names):
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_seen", 0)
"""
    mixin = """
class Part:
    __slots__ = ()
    _names: tuple  # set by Host
    _seen: int  # set by Host
    def first(self):
        return self._names[0], self._seen, self._cache
"""
    plain = "class Values:\n    _n: int\n    _m: int = 0\n    def size(self):\n        return self._n + self._m\n"
    assert private_state_uses({"host": host, "mixin": mixin, "plain": plain}) == [
        ("mixin", 7, "Host._cache"), ("mixin", 7, "Host._names"), ("mixin", 7, "Host._seen")]


# -- torch's private APIs: read in _torch only ---------------------------------------------------------
#
# _torch lists every private torch API the package reads, with the releases it was checked on, and
# detects where they differ; every other module, and every integration, asks _torch. Read with ``ast``:
# an import of a private torch module or name, and a read of a private attribute that none of our
# modules creates (a class's, as above, or a module-level name) -- a DeviceMesh's ``_layout``, a pytree
# helper, a tensor's counter -- directly or as a string to ``getattr``/``hasattr``; a write counts too.

TORCH_HOME = "_torch"
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}  # public, underscored against clashes
# Private attributes of other libraries read anyway, wherever they are read, each with its reason.
_TITAN_FIELDS = ("_mesh_exist", "_world_mesh", "_global_meshes", "_single_axis_meshes", "_multi_axis_meshes",
                 "_spmd_meshes", "_validate_meshes")
FOREIGN_PRIVATE_ALLOWED: dict[str, str] = {
    "_version": "Tensor._version, the counter of in-place writes, read by the region's cast cache on every eager "
                "cast, where a call through _torch would cost each one",
    "_data": "os.environ._data (CPython's own mapping): the debug setting, read at every collective call, without "
             "os.environ.get's encoding of the key (~1 us)",
    **dict.fromkeys(_TITAN_FIELDS, "torchtitan's own ParallelDims fields, no torch private: integrations/torchtitan "
                                   "fills them as torchtitan 0.3.0's build_mesh does, for the release it pins"),
}


def our_private_names(sources: dict[str, str]) -> set[str]:
    """Every private name our modules create: their classes' attributes and their module-level names."""
    names: set[str] = set()
    for source in sources.values():
        tree = ast.parse(source)
        names |= set(_class_attributes(tree))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if _private(n)}


def foreign_private_reads(sources: dict[str, str], ours: set[str]) -> list[tuple[str, int, str]]:
    """``(module, line, what)`` for every private name of another library that a module uses or imports."""
    found = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found += [(module, node.lineno, f"import {a.name}") for a in node.names
                          if a.name.split(".")[0] == "torch" and any(map(_private, a.name.split(".")))]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
                private = [a.name for a in node.names if _private(a.name)]
                if private or any(map(_private, node.module.split("."))):
                    found.append((module, node.lineno, f"from {node.module} import {', '.join(private) or '...'}"))
            elif isinstance(node, ast.Attribute) and _private(node.attr):  # a read, a write or a delete
                if node.attr not in ours and node.attr not in NAMEDTUPLE_API:
                    found.append((module, node.lineno, node.attr))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                    and node.args[1].value not in ours:
                found.append((module, node.lineno, node.args[1].value))
    return sorted(set(found))


def _package_and_integrations() -> dict[str, str]:
    sources = {p.stem: p.read_text() for p in PACKAGE.glob("*.py")}
    return sources | {f"integrations/{p.stem}": p.read_text() for p in INTEGRATIONS.glob("*.py")}


def test_torch_privates_are_read_in_torch_only():
    sources = _package_and_integrations()
    ours = our_private_names({m: s for m, s in sources.items() if not m.startswith("integrations/")})
    reads = foreign_private_reads({m: s for m, s in sources.items() if m != TORCH_HOME}, ours)
    bad = [f"{m}.py:{line} {what}" for m, line, what in reads if what not in FOREIGN_PRIVATE_ALLOWED]
    assert bad == [], "private APIs of torch (or another library) read outside _torch: " + "; ".join(bad)
    unused = set(FOREIGN_PRIVATE_ALLOWED) - {what for _, _, what in reads}
    assert unused == set(), f"allowed but no longer read (strike them): {sorted(unused)}"


def test_the_torch_private_check_sees_imports_reads_and_strings():
    ours = our_private_names({"home": "class Ours:\n    __slots__ = ('_mine',)\n_TABLE = {}\n"})
    source = """
import torch.utils._pytree as pytree
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.tensor import _dispatch
from torch.distributed import new_group
def f(dm, x, call, home):
    pytree._broadcast_to_and_flatten(x, x)
    hasattr(dm, "_layout")
    return dm._rank_map, x._mine, call._replace(a=1), home._TABLE
"""
    assert foreign_private_reads({"m": source}, ours) == [
        ("m", 2, "import torch.utils._pytree"), ("m", 3, "from torch.distributed._mesh_layout import _MeshLayout"),
        ("m", 4, "from torch.distributed.tensor import _dispatch"), ("m", 7, "_broadcast_to_and_flatten"),
        ("m", 8, "_layout"), ("m", 9, "_rank_map")]


# -- sizes: the house's budgets ---------------------------------------------------------------------

MODULE_LINES = 800  # no module of the package over this (split it by job first)
BENCH_SCRIPT_LINES = 250  # each benchmarks/bench_*.py
BENCH_HELPER_LINES = 400  # benchmarks/_harness.py and _report.py together (issue 34: ~400; 400 today)


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_its_budget():
    sizes = {str(p.relative_to(PACKAGE.parent)): _lines(p) for p in sorted(PACKAGE.rglob("*.py"))}
    over = {name: n for name, n in sizes.items() if n > MODULE_LINES}
    assert not over, f"modules over {MODULE_LINES} lines (split them by job): {over}"


def test_benchmarks_are_within_their_budgets():
    bench = PACKAGE.parent / "benchmarks"
    over = {p.name: _lines(p) for p in sorted(bench.glob("bench_*.py")) if _lines(p) > BENCH_SCRIPT_LINES}
    assert not over, f"benchmark scripts over {BENCH_SCRIPT_LINES} lines: {over}"
    helpers = sum(_lines(bench / name) for name in ("_harness.py", "_report.py"))
    assert helpers <= BENCH_HELPER_LINES, f"the shared benchmark helpers have {helpers} lines"
