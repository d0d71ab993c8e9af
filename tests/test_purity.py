"""Architecture rules of docs/design.md, "Layers": pure modules stay pure, one module creates groups."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"
GROUP_CREATION = re.compile(r"\b(new_group|split_group|init_process_group|new_subgroups|one_rank_group|"
                            r"group_in_order|local_group|_new_process_group_helper)\b")


def _group_creating_calls(path: pathlib.Path) -> list[str]:
    """The calls of torch's group constructors in one module (read with ast: docstrings don't count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if GROUP_CREATION.fullmatch(name):
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_only_the_group_cache_creates_process_groups():
    """One module owns a group's life (functional_mesh/README.md): ``_cache`` makes every group realize
    asks for (and the default group, when realize starts the job), lends, destroys and aborts them."""
    calls = {p.name: _group_creating_calls(p) for p in PACKAGE.glob("*.py")}
    made = {c.split()[1] for c in calls.pop("_cache.py")}
    assert {"new_group", "split_group", "init_process_group", "one_rank_group"} <= made, made  # the reader sees them
    # the torch boundary wraps torch's private constructor once (_torch.one_rank_group, the group
    # lent for size-1 axes, and _torch.group_in_order on torch 2.11); _cache is their only caller
    assert [c.split()[1] for c in calls.pop("_torch.py")] == ["_new_process_group_helper"]
    assert [c for found in calls.values() for c in found] == []


def run_python(code: str) -> list[str]:
    """What a fresh interpreter prints for ``code``, split into words."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


PURE_MODULES = ["functional_mesh", "functional_mesh.layout", "functional_mesh._errors", "functional_mesh._validate",
                "functional_mesh._layout", "functional_mesh._devices", "functional_mesh._mesh_shape",
                "functional_mesh._mesh_transforms", "functional_mesh._mesh_groups", "functional_mesh._mesh",
                "functional_mesh._sharding", "functional_mesh._order", "functional_mesh._visualize",
                "functional_mesh._realize_plan", "functional_mesh._reshard_blocks", "functional_mesh._reshard_plan",
                "functional_mesh._vma",
                "functional_mesh.__main__"]


def readme_torch_column() -> dict[str, str]:
    """``{module: "yes" | "no"}``: the "torch?" column of the layers table in functional_mesh/README.md."""
    out = {}
    for line in (PACKAGE / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3] in ("yes", "no"):
            out.update({m: cells[3] for m in re.findall(r"`([\w.]+)`", cells[1])})
    return out


def test_the_readme_says_which_modules_are_pure():
    pure = {m.removeprefix("functional_mesh").lstrip(".") or "__init__" for m in PURE_MODULES}
    column = readme_torch_column()
    assert set(column.values()) == {"yes", "no"}
    assert {m for m, torch in column.items() if torch == "no"} == pure


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_without_torch(module):
    assert run_python(f"import sys, {module}; print('torch' in sys.modules)") == ["False"]


def test_pure_planning_needs_no_torch():
    code = (
        "import sys, functional_mesh as fm\n"
        "m = fm.make_mesh((2, 2, 2), ('dp', 'cp', 'tp'))\n"
        "m.flatten(('dp', 'cp')).unflatten('dp_cp', {'x': 4})['x', 'tp'].groups()\n"
        "m['tp'].groups(); m.flatten(); m.coordinate(3); m.group_of(5)\n"
        "print('torch' in sys.modules)"
    )
    assert run_python(code) == ["False"]


def test_fm_realize_stays_callable_after_importing_the_module():
    code = (
        "import functional_mesh._realize, functional_mesh._handle\n"
        "import functional_mesh as fm\n"
        "from functional_mesh import RealizedMesh\n"
        "print(callable(fm.realize), RealizedMesh.__name__)\n"
    )
    assert run_python(code) == ["True", "RealizedMesh"]


def test_collective_error_is_public_and_loads_torch_only_when_asked_for():
    code = (
        "import sys, functional_mesh as fm\n"
        "print('torch' in sys.modules)\n"
        "err = fm.CollectiveError\n"
        "from functional_mesh._handle import CollectiveError\n"
        "print('torch' in sys.modules, err is CollectiveError, issubclass(err, fm.MeshError), "
        "issubclass(err, RuntimeError), 'CollectiveError' in fm.__all__)\n"
    )
    assert run_python(code) == ["False"] + ["True"] * 5


def test_dir_of_the_package_lists_its_public_names_and_no_helpers():
    import functional_mesh as fm

    before = dir(fm)
    for name in fm.__all__:  # every listed name resolves (the lazy ones load their module)
        getattr(fm, name)
    after = dir(fm)
    public = [n for n in after if not n.startswith("_")]
    assert before == after and public == sorted({*fm.__all__, "layout"}), set(public) ^ {*fm.__all__, "layout"}
    assert "__version__" in after and "__getattr__" in after
    # what the facade imports for itself, and the private modules that importing binds on the package
    assert not {"Any", "annotations", "importlib", "_importlib", "_mesh", "_handle"} & set(after)


# How docs/api.md (its index: tools/gen_api.py) writes a member of each class: `mesh.flatten(...)`, `rm.group(axis)`, ...
OWNERS = {"Mesh": ("mesh", "fm.Mesh"), "RealizedMesh": ("rm",), "NamedSharding": ("sh",)}


def entries(text: str) -> list[str]:
    """The lines of an API page that introduce names: headings, and the first cell of table rows."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line)
        elif line.startswith("|") and line.count("|") >= 3:
            out.append(line.split("|")[1])
    return out


def undocumented(text: str, public: list[tuple[str, str]]) -> list[str]:
    """The ``(owner, name)`` pairs with no entry of their own in ``text``: ``fm.name`` for a top-level name,
    ``<owner's variable>.name`` for a member, written as code in a heading or in a table row's first cell
    (a bare word in the prose does not count: "mesh" appears on almost every line)."""
    intro = entries(text)
    missing = []
    for owner, name in public:
        spellings = OWNERS.get(owner, (owner,))
        pattern = re.compile(r"`(?:%s)\.%s(?![\w])" % ("|".join(map(re.escape, spellings)), re.escape(name)))
        if not any(pattern.search(line) for line in intro):
            missing.append(f"{owner}.{name}")
    return missing


def public_names() -> list[tuple[str, str]]:
    import functional_mesh as fm
    from functional_mesh import NamedSharding, RealizedMesh

    return [("fm", n) for n in fm.__all__] + [
        (cls.__name__, m) for cls in (fm.Mesh, RealizedMesh, NamedSharding) for m in dir(cls) if not m.startswith("_")]


def test_the_api_reference_has_an_entry_for_every_public_name():
    text = (PACKAGE.parent / "docs" / "api.md").read_text()
    assert undocumented(text, public_names()) == [], "docs/api.md has no entry for these public names"


def test_the_api_reference_entries_of_the_collectives_list_every_parameter():
    """An entry ``fm.psum_scatter(x, axis, *, dim=0, ...)`` is the call's signature: none of its
    parameters is left out (``async_op=`` and ``op_dtype=`` once were)."""
    import inspect

    import functional_mesh as fm

    text = (PACKAGE.parent / "docs" / "api.md").read_text()
    names = ["psum", "pmean", "pmax", "pmin", "pvary", "pcast", "all_gather", "psum_scatter", "all_to_all",
             "ragged_all_to_all", "ppermute", "axis_index", "axis_size"]
    for name in names:
        written = [m[1] for line in entries(text) for m in re.finditer(r"`fm\.%s\(([^)]*)\)" % name, line)]
        assert len(written) == 1, (name, written)
        given = [p.split("=")[0].strip() for p in written[0].split(",") if p.strip() not in ("*", "")]
        assert given == list(inspect.signature(getattr(fm, name)).parameters), name


def test_a_name_mentioned_only_in_prose_or_under_another_owner_has_no_entry():
    page = """# API
### `fm.make_mesh(axis_sizes, axis_names)`
Every mesh has a flatten method; `rm.flatten` is not a mesh's.
| member | value |
| :-- | :-- |
| `mesh.axis_names` | the names; see also `mesh.shape` |
| `mesh.size` | ... |
"""
    public = [("fm", "make_mesh"), ("fm", "Mesh"), ("Mesh", "flatten"), ("Mesh", "axis_names"),
              ("Mesh", "shape"), ("Mesh", "size"), ("Mesh", "axis_size"), ("fm", "make")]
    assert undocumented(page, public) == ["fm.Mesh", "Mesh.flatten", "Mesh.shape", "Mesh.axis_size", "fm.make"]
