"""Write the index of docs/api.md from the docstrings: one row per public name.

The page's head (above MARKER) is written by hand: the two layers, where the examples' ``rm`` comes
from, and the arguments every collective shares. Below MARKER, this script writes one table per
module: each public name of ``functional_mesh`` (and the members of its classes) with its signature
and the first line of its docstring, which ``help()`` shows in full. `make api` runs it;
tests/unit/test_api_index.py fails when the page differs from what it would write.
"""

from __future__ import annotations

import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
MARKER = "<!-- generated below by tools/gen_api.py (make api): edit the docstrings, not this index -->"

# How the index spells a member of each class: `mesh.flatten(...)`, `rm.group(axis)`, ...
OWNERS = {"Mesh": "mesh", "RealizedMesh": "rm", "NamedSharding": "sh", "PartitionSpec": "spec",
          "Layout": "layout", "ReshardPlan": "plan", "Pending": "pending", "MeshShape": "mesh.shape"}
# The modules' order on the page: values first, then effects, then the typed layer.
ORDER = ["_mesh", "_mesh_shape", "_mesh_transforms", "_mesh_groups", "_devices", "_layout", "layout", "_sharding",
         "_reshard_plan", "_errors", "_realize", "_handle", "_cache", "_interop", "_collectives", "_pending",
         "_shard_map", "_vma", "_visualize", "_order"]


def _signature(obj: object) -> str:
    """``(x, axis, *, mesh=None)``: names and defaults, no annotations."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    parts, star = [], False
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
        if p.kind is p.POSITIONAL_ONLY and all(q.kind is not q.POSITIONAL_ONLY for q in list(
                sig.parameters.values())[list(sig.parameters).index(p.name) + 1:]):
            parts.append("/")
    return f"({', '.join(parts)})"


def _summary(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    return first.replace("|", "\\|") or "(no docstring)"


def _module(obj: object) -> str:
    target = obj.fget if isinstance(obj, property) else obj
    module = getattr(target, "__module__", None) or ""
    if module == "functional_mesh":  # a class that names the facade as its module, for its repr
        name = getattr(target, "__name__", "")
        return next(path.stem for path in sorted((ROOT / "functional_mesh").glob("*.py"))
                    if f"\nclass {name}(" in path.read_text() or f"\ndef {name}(" in path.read_text())
    return module.rsplit(".", 1)[-1] if module.startswith("functional_mesh") else ""


def rows() -> dict[str, list[tuple[str, str]]]:
    """``{module: [(entry, summary), ...]}``, every public name and member once."""
    import functional_mesh as fm
    from functional_mesh import layout

    out: dict[str, list[tuple[str, str]]] = {}

    def add(module: str, entry: str, obj: object) -> None:
        out.setdefault(module, []).append((entry, _summary(obj)))

    for name in fm.__all__:
        obj = getattr(fm, name)
        if name == "P":
            add(_module(obj), "`fm.P`", obj)  # the short name of PartitionSpec
            continue
        is_error = inspect.isclass(obj) and issubclass(obj, BaseException)
        add(_module(obj), f"`fm.{name}{'' if is_error else _signature(obj)}`", obj)
        owner = OWNERS.get(name)
        if owner is None or not inspect.isclass(obj):
            continue
        for attr, value in inspect.getmembers(obj):
            static = inspect.getattr_static(obj, attr)
            if attr.startswith("_") and attr != "__getitem__":
                continue
            if attr == "__getitem__" and name != "Mesh":
                continue
            if type(static).__name__ == "member_descriptor":  # a field in __slots__ (attrs): no docstring of its own
                out.setdefault(_module(obj), []).append(
                    (f"`{owner}.{attr}`", f"a field of the value: see ``help(fm.{name})``"))
                continue
            if not _module(static if isinstance(static, property) else value):
                continue  # inherited from outside the package (Mapping's get, a tuple's count, ...)
            if isinstance(static, property) or not callable(value):
                add(_module(static) if isinstance(static, property) else _module(obj), f"`{owner}.{attr}`",
                    static if isinstance(static, property) else value)
            elif attr == "__getitem__":
                add(_module(value), f"`{owner}[names]`", value)
            elif isinstance(static, (classmethod, staticmethod)):
                add(_module(value), f"`fm.{name}.{attr}{_signature(value)}`", value)
            else:
                add(_module(value), f"`{owner}.{attr}{_signature(value)}`", value)
    for name in layout.__all__:
        if name != "Layout":
            add("layout", f"`fm.layout.{name}{_signature(getattr(layout, name))}`", getattr(layout, name))
    return out


def index() -> str:
    """The generated part of the page."""
    import importlib

    table = rows()
    lines = [MARKER, "", "## Index", "",
             "Every public name, with the first line of its docstring; `help(fm.<name>)` gives the rest:",
             "arguments, result, errors and examples (which run as doctests where they are written).", ""]
    for module in sorted(table, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m)):
        mod = importlib.import_module(f"functional_mesh.{module}")
        title = (inspect.getdoc(mod) or module).split("\n", 1)[0].rstrip(".")
        lines += [f"### `{module}`: {title}", "", "| name | what it is |", "| :-- | :-- |"]
        lines += [f"| {entry} | {summary} |" for entry, summary in table[module]]
        lines.append("")
    return "\n".join(lines)


def page() -> str:
    """The whole page: the hand-written head, then the index."""
    head = PAGE.read_text().split(MARKER, 1)[0]
    return head + index()


def main() -> None:
    text = page()
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if PAGE.read_text() == text else f"{PAGE} is stale: run make api")
    PAGE.write_text(text)


if __name__ == "__main__":
    main()
