"""Architecture rules of DESIGN.md §7: pure modules stay pure, one module creates groups."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"
GROUP_CREATION = re.compile(r"\b(new_group|split_group|init_process_group|new_subgroups)\b")


def test_only_realize_creates_process_groups():
    offenders = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name != "realize.py" and GROUP_CREATION.search(p.read_text())
    )
    assert offenders == []


def run_python(code: str) -> list[str]:
    """What a fresh interpreter prints for ``code``, split into words."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.parametrize("module", ["functional_mesh", "functional_mesh.layout", "functional_mesh.mesh",
                                    "functional_mesh.sharding", "functional_mesh.order", "functional_mesh.visualize",
                                    "functional_mesh.__main__"])
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
        "import functional_mesh.realize\n"
        "import functional_mesh as fm\n"
        "from functional_mesh.realize import RealizedMesh\n"
        "print(callable(fm.realize), RealizedMesh.__name__)\n"
    )
    assert run_python(code) == ["True", "RealizedMesh"]


def test_the_api_reference_documents_every_public_name():
    import re
    from pathlib import Path

    import functional_mesh as fm
    from functional_mesh.realize import RealizedMesh
    from functional_mesh.sharding import NamedSharding

    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    public = [*fm.__all__, *(f"{cls.__name__}.{m}" for cls in (fm.Mesh, RealizedMesh, NamedSharding)
                             for m in dir(cls) if not m.startswith("_"))]
    missing = [n for n in public if not re.search(r"\b" + re.escape(n.split(".")[-1]) + r"\b", text)]
    assert missing == [], f"docs/api.md does not mention {missing}"
