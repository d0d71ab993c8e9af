"""Architecture rules of docs/design.md, "Floors": pure modules stay pure, one module creates groups."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"
GROUP_CREATION = re.compile(r"\b(new_group|split_group|init_process_group|new_subgroups|one_rank_group|"
                            r"_new_process_group_helper)\b")


def _group_creating_calls(path: pathlib.Path) -> list[str]:
    """The calls of torch's group constructors in one module (read with ast: docstrings don't count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if GROUP_CREATION.fullmatch(name):
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_only_realize_creates_process_groups():
    calls = {p.name: _group_creating_calls(p) for p in PACKAGE.glob("*.py")}
    assert calls.pop("_realize.py"), "the reader sees no group creation in _realize.py"
    # the torch boundary wraps torch's private constructor once (_torch.one_rank_group, the group
    # lent for size-1 axes); _realize is its only caller
    assert [c.split()[1] for c in calls.pop("_torch.py")] == ["_new_process_group_helper"]
    assert [c for found in calls.values() for c in found] == []


def run_python(code: str) -> list[str]:
    """What a fresh interpreter prints for ``code``, split into words."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


PURE_MODULES = ["functional_mesh", "functional_mesh.layout", "functional_mesh._errors", "functional_mesh._validate",
                "functional_mesh._layout", "functional_mesh._devices", "functional_mesh._mesh",
                "functional_mesh._sharding", "functional_mesh._order", "functional_mesh._visualize",
                "functional_mesh._realize_plan", "functional_mesh._vma", "functional_mesh.__main__"]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_without_torch(module):
    assert run_python(f"import sys, {module}; print('torch' in sys.modules)") == ["False"]


def test_pure_planning_needs_no_torch():
    code = (
        "import sys, functional_mesh as fm\n"
        "m = fm.make_mesh((2, 2, 2), ('dp', 'cp', 'tp'))\n"
        "m.flatten(('dp', 'cp')).unflatten('dp_cp', {'x': 4})['x', 'tp'].groups()\n"
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


def test_the_api_reference_documents_every_public_name():
    import re
    from pathlib import Path

    import functional_mesh as fm
    from functional_mesh import NamedSharding, RealizedMesh

    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    public = [*fm.__all__, *(f"{cls.__name__}.{m}" for cls in (fm.Mesh, RealizedMesh, NamedSharding)
                             for m in dir(cls) if not m.startswith("_"))]
    missing = [n for n in public if not re.search(r"\b" + re.escape(n.split(".")[-1]) + r"\b", text)]
    assert missing == [], f"docs/api.md does not mention {missing}"
