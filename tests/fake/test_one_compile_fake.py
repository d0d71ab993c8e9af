"""One compile for the whole job: under torch's ``compile_on_one_rank`` every rank's graph is rank 0's.

The ranks of a 4-rank fake world compile each program one after another, each in a fresh
interpreter, into one FX graph cache directory (inductor, forward and backward), as a job whose
ranks share a cache would. Each rank records, per graph inductor is handed, the graph's code and
whether the FX graph cache hit; every rank's graphs must be rank 0's, op for op, and on every rank
after the first each graph without a torch ``DeviceMesh`` input must hit. (A graph with a
DTensor has the ``DeviceMesh`` as an input that torch pickles into the cache key with this rank's
``_rank``: it misses on torch 2.13 and 2.15 alike, docs/compile.md.) Without the flag the graphs
differ between ranks: the test's own control. Split sizes that are data (``ragged_all_to_all``)
stay constants of each rank's graph and are not among the programs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests._torch_features import needs_one_graph

pytestmark = [pytest.mark.slow, needs_one_graph()]
WORLD = 4
REPO = Path(__file__).resolve().parents[2]


def _compile(rank: int, shared: bool, only: str | None = None) -> list[dict]:
    """On rank ``rank`` of a fake world: each program compiled; per graph its code and whether the cache hit."""
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import functional_mesh as fm
    from functional_mesh import P

    dist.init_process_group("fake", rank=rank, world_size=WORLD, store=FakeStore())
    torch._inductor.config.fx_graph_cache = True
    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")))
    line = fm.realize(fm.make_mesh((WORLD,), ("pp",)))

    def coordinates(x: torch.Tensor) -> torch.Tensor:  # groups that differ by rank, coordinates, partial shifts
        y = fm.ppermute(x * (1 + fm.axis_index("b", mesh=rm)), "b", [(0, 1), (1, 0)], mesh=rm)
        z = fm.ppermute(torch.tanh(y), "b", [(0, 1)], mesh=rm)
        g = fm.all_gather(z * (2 + fm.axis_index(("a", "b"), mesh=rm)), "a", to="invariant", mesh=rm)
        return fm.psum((g * g).sum(), ("a", "b"), mesh=rm)

    def body(w: torch.Tensor) -> torch.Tensor:  # a region: a full argument sliced, shifts down the pipeline
        shift = [(s, s + 1) for s in range(WORLD - 1)]
        a = fm.ppermute(torch.tanh(w), "pp", shift)
        return fm.psum(fm.ppermute(torch.tanh(a * w), "pp", shift).sum(), "pp")

    region = fm.shard_map(body, mesh=line, in_specs=P("pp"), out_specs=P())
    programs = {"coordinates": (coordinates, torch.arange(4.0)),
                "pipeline region": (lambda w: region(w).to_local(), torch.arange(4.0 * WORLD))}
    config = torch.compiler.config if hasattr(torch.compiler.config, "compile_on_one_rank") else dist.config
    out = []
    for name, (fn, x) in programs.items():
        if only is not None and name != only:
            continue
        graphs: list[dict] = []

        def inner(gm: torch.fx.GraphModule, inputs: list, graphs: list = graphs, **kwargs: object) -> object:
            hits, code = counters["inductor"]["fxgraph_cache_hit"], gm.code  # (inductor's passes then change gm)
            compiled = compile_fx_inner(gm, inputs, **kwargs)
            mesh = any(type(getattr(v, "real_obj", None)).__name__ == "DeviceMesh" for v in inputs)
            graphs.append({"code": code, "hit": counters["inductor"]["fxgraph_cache_hit"] > hits, "mesh": mesh})
            return compiled

        torch._dynamo.reset()
        with config.patch(compile_on_one_rank=shared):
            compiled = torch.compile(fn, backend=lambda gm, inputs: compile_fx(gm, inputs, inner_compile=inner))
            compiled(x.clone().requires_grad_()).backward()
        out.append({"program": name, "graphs": graphs})
    return out


def _ranks(shared: bool, world: int = WORLD, only: str = "") -> list[list[dict]]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_COMPILE_THREADS": "1",
               "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        results = []
        for rank in range(world):  # one after another, as ranks that compile at different times
            proc = subprocess.run([sys.executable, __file__, str(rank), str(int(shared)), only], env=env, cwd=REPO,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


@pytest.mark.timeout(1200)
def test_every_rank_compiles_rank_0s_graphs_and_hits_the_cache():
    ranks = _ranks(shared=True)
    first = ranks[0]
    assert [len(p["graphs"]) for p in first] == [2, 2], first  # forward and backward of each program
    for rank, programs in enumerate(ranks[1:], start=1):
        for mine, theirs in zip(programs, first, strict=True):
            assert [g["code"] for g in mine["graphs"]] == [g["code"] for g in theirs["graphs"]], (rank, mine["program"])
            missed = [i for i, g in enumerate(mine["graphs"]) if not g["hit"] and not g["mesh"]]
            assert not missed, f"rank {rank}, {mine['program']}: graphs {missed} missed the cache"
    assert not any(g["mesh"] for g in first[0]["graphs"])  # plain tensors: every graph hits
    assert all(g["hit"] for programs in ranks[1:] for g in programs[0]["graphs"])
    assert any(g["hit"] for programs in ranks[1:] for g in programs[1]["graphs"])  # the region's backward


@pytest.mark.timeout(1200)
def test_without_the_flag_each_rank_bakes_its_own_constants():
    ranks = _ranks(shared=False, world=2, only="coordinates")  # ranks 0 and 1 (of 4)
    codes = [[g["code"] for g in rank[0]["graphs"]] for rank in ranks]
    assert codes[1] != codes[0]  # the coordinate program: coordinates and split sizes differ
    assert not any(g["hit"] for g in ranks[1][0]["graphs"])


if __name__ == "__main__":
    print(json.dumps(_compile(int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] or None)))
