"""Collectives under torch.compile(fullgraph=True), on real gloo workers: no graph break, eager's values.

Every collective, over one axis and over tuples (product group and per-axis composition), with
``mesh=rm`` and under an enclosing ``with rm:``: ``torch._dynamo.explain`` must count 0 graph
breaks, and ``torch.compile(fn, fullgraph=True)`` must give the outputs and input gradients of
the same function run eagerly. Backends ``eager`` and ``aot_eager`` for every case (world 4);
``inductor`` for a few (world 2: its compile time on two cores counts against the test budget).
"""

from __future__ import annotations

import os

import pytest
import torch

import functional_mesh as fm
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w2 = pool_fixture(2)
w4 = pool_fixture(4)

CASES = {
    "psum": lambda x, m: fm.psum(x, "a", mesh=m),
    "psum tuple": lambda x, m: fm.psum(x, ("a", "b"), mesh=m),
    "pmean": lambda x, m: fm.pmean(x, "b", mesh=m),
    "pvary": lambda x, m: fm.pvary(x, "a", mesh=m) * 3,
    "pcast tuple": lambda x, m: fm.pcast(x, ("a", "b"), to="varying", mesh=m),
    "all_gather dim 1": lambda x, m: fm.all_gather(x, "a", dim=1, mesh=m),
    "all_gather invariant tuple": lambda x, m: fm.all_gather(x, ("a", "b"), to="invariant", mesh=m),
    "all_gather untiled": lambda x, m: fm.all_gather(x, "a", tiled=False, mesh=m),
    "psum_scatter tuple": lambda x, m: fm.psum_scatter(x, ("a", "b"), dim=0, mesh=m),
    "all_to_all": lambda x, m: fm.all_to_all(x, "a", 0, 1, mesh=m),
    "all_to_all tuple": lambda x, m: fm.all_to_all(x, ("a", "b"), 0, 1, mesh=m),
    "ppermute ring": lambda x, m: fm.ppermute(x, "b", [(0, 1), (1, 0)], mesh=m),
    "ppermute partial": lambda x, m: fm.ppermute(x, "a", [(0, 1)], mesh=m),
    "axis_index and axis_size": lambda x, m: x * fm.axis_index(("a", "b"), mesh=m) + fm.axis_size("b", mesh=m),
    "current mesh": lambda x, m: fm.psum(x, "a") + fm.axis_index("b") + fm.all_gather(x, "b", dim=1).sum(1, True),
}
INDUCTOR = ["psum", "all_gather dim 1", "ppermute partial"]


def _run(fn, x0: torch.Tensor, m) -> tuple[torch.Tensor, torch.Tensor]:
    x = x0.clone().requires_grad_()
    y = fn(x, m)
    (y * (1 + torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape))).sum().backward()  # rank-varying cotangent
    return y.detach(), x.grad


def compiled_vs_eager(names: list[str], backends: list[str], sizes: tuple[int, int]) -> dict:
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    meshes = {"per axis": fm.realize(fm.make_mesh(sizes, ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S),
              "products": fm.realize(fm.make_mesh(sizes, ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S,
                                     products=[("a", "b")])}
    x0 = torch.arange(16.0, dtype=torch.float64).reshape(4, 4) + 100 * torch.distributed.get_rank()
    out = {}
    for name in names:
        fn = CASES[name]
        for label, m in meshes.items():
            with m:  # "current mesh" finds it; the others pass mesh=m
                dynamo.reset()
                breaks = dynamo.explain(fn)(x0, m).graph_break_count
                want = _run(fn, x0, m)
                for backend in backends:
                    dynamo.reset()
                    got = _run(torch.compile(fn, fullgraph=True, backend=backend), x0, m)
                    out[(name, label, backend)] = (breaks, torch.equal(got[0], want[0]),
                                                   torch.allclose(got[1], want[1], atol=1e-12, rtol=0))
    return out


@pytest.mark.timeout(600)
def test_every_collective_compiles_whole_on_eager_and_aot_eager(w4):
    for rank, res in enumerate(w4.run(compiled_vs_eager, list(CASES), ["eager", "aot_eager"], (2, 2), timeout=600)):
        bad = {k: v for k, v in res.items() if v != (0, True, True)}
        assert bad == {}, f"rank {rank}: (graph breaks, output equal, gradient equal) per case: {bad}"
        assert len(res) == len(CASES) * 2 * 2


@pytest.mark.timeout(600)
def test_inductor_on_world_2(w2):
    for rank, res in enumerate(w2.run(compiled_vs_eager, INDUCTOR, ["inductor"], (2, 1), timeout=600)):
        bad = {k: v for k, v in res.items() if v != (0, True, True)}
        assert bad == {}, f"rank {rank}: {bad}"


def debug_check_under_compile() -> tuple[str, str]:
    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    os.environ["FUNCTIONAL_MESH_CHECK_COLLECTIVES"] = "1"
    try:
        eager = fm.psum(torch.ones(2), "a", mesh=rm).tolist()  # the check runs (and agrees) in eager mode
        torch._dynamo.reset()
        try:
            torch.compile(lambda x: fm.psum(x, "a", mesh=rm), fullgraph=True, backend="eager")(torch.ones(2))
        except Exception as e:  # noqa: BLE001
            return str(eager), str(e)
        return str(eager), "no error"
    finally:
        del os.environ["FUNCTIONAL_MESH_CHECK_COLLECTIVES"]


@pytest.mark.timeout(300)
def test_the_debug_check_is_eager_only_and_says_so_under_compile(w4):
    for eager, message in w4.run(debug_check_under_compile):
        assert eager == "[2.0, 2.0]"
        assert "FUNCTIONAL_MESH_CHECK_COLLECTIVES off under torch.compile (the collective check runs in eager " \
               "mode only)" in message, message
