"""The multi-process examples of the docs, run as written on 8 real gloo workers (one pool).

- Every fenced block of docs/recipes.md, docs/migration_jax.md and docs/collectives.md whose first line is
  ``# torchrun --nproc_per_node=8`` runs on every rank; the blocks check their own results with
  ``assert`` (the recipes: a block you already hold entering a region through
  ``DTensor.from_local``; a fixed-capacity mixture of experts over ``fm.all_to_all`` against one
  process, outputs and gradients; a GPipe pipeline over partial ``fm.ppermute`` shifts, typed and
  eager, against one process).
- Our column of docs/migration_jax.md's "Same program, same numbers" runs inside a typed region on
  the (4, 2) mesh and must give the types and per-rank values the page states (the JAX column of
  the same table runs in JAX: tests/test_docs_migration_jax.py).
"""

from __future__ import annotations

import pytest
import torch

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.test_docs_migration_jax import ROOT, numbers_rows, plain, torchrun_blocks

w8 = pool_fixture(8)

PAGES = ["recipes.md", "migration_jax.md", "collectives.md"]
BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(torchrun_blocks(ROOT / "docs" / page))]


def run_block(code: str) -> bool:
    """Run one docs block on this rank, as a script would."""
    exec(compile(code, "<docs block>", "exec"), {"__name__": "__docs_block__"})  # noqa: S102
    return True


def numbers_on_this_rank(exprs: list[str]) -> dict:
    """Each expression's (varying axes, value) inside a typed region over (x, y) = (4, 2), v = [rank]."""
    rm = fm.realize(fm.make_mesh((4, 2), ("x", "y")))
    got = {}

    def body(v):
        for expr in exprs:
            result = eval(expr, {"fm": fm, "torch": torch, "v": v})  # noqa: S307
            got[expr] = (sorted(fm.typeof(result).varying), plain(result.tolist()))
        return v

    fm.shard_map(body, in_specs=P(("x", "y")), out_specs=P(("x", "y")), mesh=rm)(torch.arange(8.0))
    return got


def test_the_pages_hold_the_blocks_this_module_runs():
    assert [page for page, _, _ in BLOCKS].count("recipes.md") == 4  # a held shard, MoE, two pipelines
    assert [page for page, _, _ in BLOCKS].count("migration_jax.md") >= 1
    assert [page for page, _, _ in BLOCKS].count("collectives.md") >= 1


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS, ids=[f"{p}[{i}]" for p, i, _ in BLOCKS])
def test_docs_block_runs_on_8_gloo_workers(w8, page, index, block):
    assert w8.run(run_block, block, timeout=90) == [True] * 8


def test_our_column_of_the_numbers_table(w8):
    rows = numbers_rows()
    per_rank = w8.run(numbers_on_this_rank, [ours for _, ours, _, _ in rows], timeout=60)
    wrong = []
    for _, ours, vary, values in rows:
        got_vary = {tuple(per_rank[r][ours][0]) for r in range(8)}
        got_values = [per_rank[r][ours][1] for r in range(8)]
        if got_vary != {tuple(vary)} or got_values != values:
            wrong.append(f"{ours}: we give {sorted(got_vary)} {got_values}, the page says {vary} {values}")
    assert not wrong, "\n".join(wrong)
