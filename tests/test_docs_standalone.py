"""The repository stands alone (docs/design.md, "The repository stands alone").

No tracked file may cite a document the repository does not hold: the developers' brief and its
style guide, or the folder of notes next to the checkout. The project's own design document is
docs/design.md, and every comment or doc that needs the contract points there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not match its own patterns.
_OUTSIDE = [
    r"\bDESIGN" + r"(\.md|\s*§)",      # the brief, by file name or by section
    r"\bSTYLE" + r"\.md",              # its style guide
    r"\.\./" + r"shared\b",            # the folder beside the checkout
    r"/work/" + r"shared\b",
    r"\bshared/" + r"notes\b",
    r"\b(jax|torch|style)_" + r"anchor\.md",
    r"\bdesign" + r"[_ ]review\b",
]
OUTSIDE = re.compile("|".join(_OUTSIDE))


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as e:  # an sdist or an unpacked copy: nothing to list
        pytest.skip(f"not a git checkout ({e})")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def _outside_citations(text: str) -> list[str]:
    return [m.group(0) for m in OUTSIDE.finditer(text)]


def test_patterns_catch_each_spelling():
    # the test can fail: every spelling that appeared in this repository once is caught
    cited = ["see DESIGN" + ".md §3", "(DESIGN" + " §9)", "(STYLE" + ".md)", "../" + "shared/DESIGN",
             "shared/" + "notes/jax_" + "anchor.md §3.3", "(design" + "_review 19)", "(design" + " review item 1)"]
    for text in cited:
        assert _outside_citations(text), text
    assert not _outside_citations('docs/design.md, "Edge cases"; a shared cache; STYLE_NAMES')


def test_no_tracked_file_cites_a_document_outside_the_repository():
    files = _tracked_text_files()
    assert any(f.name == "design.md" for f in files), "docs/design.md must be tracked"
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files, and files deleted in the working tree
        for lineno, line in enumerate(text.splitlines(), 1):
            for hit in _outside_citations(line):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {hit!r}")
    assert not found, "cite docs/design.md instead of documents outside the repository:\n" + "\n".join(found)


def test_design_doc_is_in_the_site_and_the_readme():
    assert "design.md" in (ROOT / "mkdocs.yml").read_text()
    assert "docs/design.md" in (ROOT / "README.md").read_text()
