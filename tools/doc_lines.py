"""How much of the package is docstring: lines per module, read with ast.

`python tools/doc_lines.py` prints the largest modules and the package's share; the fast tier's
tests/unit/test_docstrings.py holds the targets (docstrings under 25 % of the package's lines, no
module over 800 lines) with the same functions.
"""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "functional_mesh"


def docstring_lines(source: str) -> int:
    """The number of lines taken by the module's, classes' and functions' docstrings."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                count += body[0].end_lineno - body[0].lineno + 1
    return count


def measure(package: pathlib.Path = PACKAGE) -> dict[str, tuple[int, int]]:
    """(lines, docstring lines) of each module of the package, by its path under the package."""
    return {str(path.relative_to(package)): (len(text.splitlines()), docstring_lines(text))
            for path in sorted(package.rglob("*.py")) for text in [path.read_text()]}


def main() -> None:
    sizes = measure()
    lines = sum(n for n, _ in sizes.values())
    docs = sum(d for _, d in sizes.values())
    for name, (n, d) in sorted(sizes.items(), key=lambda kv: -kv[1][0])[:int(sys.argv[1]) if sys.argv[1:] else 10]:
        print(f"{name:32} {n:5} lines, {d:4} docstring ({d / n:.0%})")
    print(f"package: {lines} lines, {docs} docstring ({docs / lines:.1%}), {len(sizes)} modules")


if __name__ == "__main__":
    main()
