"""docs/moe.md and the example it excerpts, examples/moe_ep.py, checked on 8 gloo workers (one pool).

- Every fenced block whose first line is ``# torchrun --nproc_per_node=8`` runs on every rank
  and checks its own results with ``assert``: the sparse view realized after the dense one makes
  no group, dispatch and combine by ``fm.ragged_all_to_all`` with their gradients, and the
  exchange's types inside ``shard_map`` (tensor sizes, the ``VmaError`` for an invariant
  ``out_specs``).
- The page's excerpt of examples/moe_ep.py is the example's code, and the example itself runs
  whole in the same pool (tests/test_examples_dist.py's runner): typed, untyped, and compiled
  with the sizes as Python ints; it checks output, loss and gradients against one process.
- Its links lead to headings that exist.
- The page's ``>>>`` blocks are doctests of ``make test`` (docs/conftest.py), not run here.
"""

from __future__ import annotations

import re

import pytest

from tests._torch_features import skip_unless_compiled_regions
from tests.dist._pool import pool_fixture
from tests.test_docs_migration_jax import ROOT, torchrun_blocks
from tests.test_examples_dist import RUN_TIMEOUT_S, check_output, run_example

w8 = pool_fixture(8)

PAGE = ROOT / "docs" / "moe.md"
BLOCKS = torchrun_blocks(PAGE)
EXCERPT_MARK = "# examples/moe_ep.py\n"


def run_block(code: str) -> bool:
    """Run one docs block on this rank, as a script would."""
    exec(compile(code, "<docs/moe.md block>", "exec"), {"__name__": "__docs_block__"})  # noqa: S102
    return True


def test_the_page_holds_the_blocks_this_module_runs():
    assert len(BLOCKS) == 3
    assert any("fm.ragged_all_to_all" in block and "backward()" in block for block in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_docs_block_runs_on_8_gloo_workers(w8, index):
    assert w8.run(run_block, BLOCKS[index], timeout=90) == [True] * 8


# typed, untyped, and compiled with the sizes as Python ints (one step: 8 workers compiling take 85 s at load 30)
EXAMPLE_CASES = [
    (["--steps", "2"], ["check_vma=True", "every gradient match a single process to 1e-05"]),
    (["--steps", "2", "--untyped"], ["check_vma=False", "every gradient match a single process to 1e-05"]),
    (["--steps", "1", "--compile"], ["compiled=True", "graphs compiled: 1 in 1 steps",
                                     "every gradient match a single process to 1e-05"]),
]


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(("args", "expected"), EXAMPLE_CASES, ids=[" ".join(c[0]) for c in EXAMPLE_CASES])
def test_the_example_runs_on_8_gloo_workers(w8, args, expected):
    if "--compile" in args:  # a compiled region: not where this torch's dynamo cannot trace one (2.11, 2.12)
        skip_unless_compiled_regions()
    check_output("moe_ep.py", w8.run(run_example, "moe_ep.py", args, timeout=RUN_TIMEOUT_S), expected)


def test_the_excerpt_is_the_examples_code():
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    excerpts = [b.removeprefix(EXCERPT_MARK) for b in blocks if b.startswith(EXCERPT_MARK)]
    assert len(excerpts) == 1
    assert excerpts[0] in (ROOT / "examples" / "moe_ep.py").read_text()


def anchor(heading: str) -> str:
    """The id mkdocs' toc extension gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def test_links_to_other_pages_lead_to_headings_that_exist():
    links = re.findall(r"\]\(([a-z_]+\.md)#([\w-]+)\)", PAGE.read_text())
    assert ("torchtitan.md", "moe-and-expert-parallelism") in links
    for page, target in links:
        headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / page).read_text(), flags=re.M)
        assert target in {anchor(h) for h in headings}, f"{page}#{target}: no such heading"
