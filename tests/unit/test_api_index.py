"""docs/api.md's index is generated from the docstrings (tools/gen_api.py, `make api`): it may not drift.

The page's head is written by hand; below its marker, every row is what the generator writes from
the package as it is now. A docstring or signature changed without `make api` fails here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "tools" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_index_is_what_the_docstrings_say():
    gen = _generator()
    page = gen.PAGE.read_text()
    assert gen.MARKER in page, "docs/api.md lost the marker above its generated index"
    assert page == gen.page(), "docs/api.md is stale: run `make api` (tools/gen_api.py) and commit it"


def test_the_index_has_a_row_for_every_public_name():
    import functional_mesh as fm

    index = _generator().index()
    missing = [name for name in fm.__all__ if f"`fm.{name}" not in index]
    assert missing == []
