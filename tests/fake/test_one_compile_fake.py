"""One compile for the whole job: under torch's ``compile_on_one_rank`` every rank's graph is rank 0's.

The ranks of a 4-rank fake world compile each program one after another, each in a fresh
interpreter, into one FX graph cache directory (inductor, forward and backward), as a job whose
ranks share a cache would. Each rank records, per graph inductor is handed, the graph's code and
whether the FX graph cache hit; every rank's graphs must be rank 0's, op for op, and on every rank
after the first every graph must hit, also those with a torch ``DeviceMesh`` input (a region's
results, DTensor weights), which torch alone would key by this rank's ``_rank`` (docs/compile.md).
Without the flag the graphs differ between ranks: the test's own control. Split sizes that are data
(``ragged_all_to_all``) stay constants of each rank's graph and are not among the programs.
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

    def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:  # DTensor weights
        return fm.psum(torch.relu(x @ w1) @ w2, "b")

    region = fm.shard_map(body, mesh=line, in_specs=P("pp"), out_specs=P())
    tp = fm.shard_map(mlp, in_specs=(P(), P(None, "b"), P("b", None)), out_specs=P(), mesh=rm)
    w1 = fm.distribute(torch.ones(4, 8) / 8, fm.NamedSharding(rm.mesh, P(None, "b")), mesh=rm)
    w2 = fm.distribute(torch.ones(8, 4) / 4, fm.NamedSharding(rm.mesh, P("b", None)), mesh=rm)
    programs = {"coordinates": (coordinates, torch.arange(4.0)),
                "pipeline region": (lambda w: region(w).to_local(), torch.arange(4.0 * WORLD)),
                "TP MLP, DTensor weights": (lambda x: (tp(x, w1, w2).to_local() ** 2).sum(), torch.ones(2, 4))}
    config = torch.compiler.config if hasattr(torch.compiler.config, "compile_on_one_rank") else dist.config
    out = []
    for name, (fn, x) in programs.items():
        if only is not None and name not in only.split("|"):
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
    assert [len(p["graphs"]) for p in first] == [2, 2, 2], first  # forward and backward of each program
    assert [any(g["mesh"] for g in p["graphs"]) for p in first] == [False, True, True]  # a DeviceMesh input
    assert not any(g["hit"] for p in first for g in p["graphs"])  # rank 0 into an empty cache
    for rank, programs in enumerate(ranks[1:], start=1):
        for mine, theirs in zip(programs, first, strict=True):
            assert [g["code"] for g in mine["graphs"]] == [g["code"] for g in theirs["graphs"]], (rank, mine["program"])
            missed = [i for i, g in enumerate(mine["graphs"]) if not g["hit"]]
            assert not missed, f"rank {rank}, {mine['program']}: graphs {missed} missed the cache"


@pytest.mark.timeout(1200)
def test_without_the_flag_each_rank_bakes_its_own_constants_and_keys_by_its_mesh():
    first, second = _ranks(shared=False, world=2, only="coordinates|TP MLP, DTensor weights")  # ranks 0, 1 of 4
    assert [p["program"] for p in second] == ["coordinates", "TP MLP, DTensor weights"]
    codes = [[g["code"] for g in rank[0]["graphs"]] for rank in (first, second)]
    assert codes[1] != codes[0]  # the coordinate program: coordinates and split sizes differ
    assert not any(g["hit"] for g in second[0]["graphs"])
    # the TP MLP: the same graphs on ranks 0 and 1 (no coordinate of ours), but torch's key holds each rank's mesh
    assert [g["code"] for g in second[1]["graphs"]] == [g["code"] for g in first[1]["graphs"]]
    with_mesh = [g for g in second[1]["graphs"] if g["mesh"]]
    assert with_mesh and not any(g["hit"] for g in with_mesh)


@pytest.mark.timeout(900)
def test_the_benchmark_counts_each_later_ranks_hits(tmp_path):
    # benchmarks/bench_compile.py --cache (docs/compile.md's figures) still runs: world 2, the psum MLP
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/bench_compile.py", "--cache", "2", "--programs", "psum MLP",
                           "--out", str(tmp_path / "cache.jsonl")], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" [", 1) for line in proc.stdout.splitlines() if line.startswith("psum MLP "))
    for column in ("psum MLP without the flag", "psum MLP compile_on_one_rank"):
        ranks = eval("[" + lines[column])  # (hits, misses, bypasses, CPU s) of ranks 0 and 1
        assert [r[:3] for r in ranks] == [(0, 2, 0), (2, 0, 0)], (column, ranks)
    assert (tmp_path / "cache.jsonl").stat().st_size > 0


_HOOK = """
import sys
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg
from torch.testing._internal.distributed.fake_pg import FakeStore
import functional_mesh as fm
from functional_mesh import _torch

def marked():
    cc = sys.modules["torch._inductor.codecache"]
    return getattr(cc.FxGraphCachePickler._reduce_fake_script_object, "_functional_mesh", False)

assert "torch._inductor.codecache" not in sys.modules
import_only = [isinstance(f, _torch._AfterCodecache) for f in sys.meta_path]
dist.init_process_group("fake", rank=int(sys.argv[1]), world_size=4, store=FakeStore())
rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")))
alone = fm.realize(fm.make_mesh((2, 2), ("a", "b"))["b"])  # a second realize installs nothing more
hooks = sum(isinstance(f, _torch._AfterCodecache) for f in sys.meta_path)
loaded_at_realize = "torch._inductor.codecache" in sys.modules
import torch._inductor.codecache as cc
keys = {}
for flag in (False, True):
    with torch.compiler.config.patch(compile_on_one_rank=flag) if hasattr(torch.compiler.config, "compile_on_one_rank") \
            else dist.config.patch(compile_on_one_rank=flag):
        for name, mesh in (("a", rm["a"]), ("b", rm["b"]), ("b alone", alone), ("b of b alone", alone["b"])):
            fake = torch._library.fake_class_registry.FakeScriptObject(None, "DeviceMesh", mesh.device_mesh)
            keys[f"{name} {flag}"] = cc.FxGraphCachePickler(torch.fx.GraphModule({}, torch.fx.Graph())).dumps(fake).hex()
print(repr({"import_only": any(import_only), "hooks": hooks, "loaded_at_realize": loaded_at_realize,
            "marked": marked(), "hooks_after": sum(isinstance(f, _torch._AfterCodecache) for f in sys.meta_path),
            "keys": keys}))
"""


def _hook(rank: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _HOOK, str(rank)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)
def test_realize_keys_a_mesh_by_the_job_once_inductor_loads():
    # importing the package changes nothing; realize imports nothing (inductor's cache module costs seconds)
    # and patches it when it loads, once; the key of a mesh is the same on every rank under the flag only
    ranks = [_hook(0), _hook(3)]
    for got in ranks:
        assert (got["import_only"], got["hooks"], got["loaded_at_realize"]) == (False, 1, False), got
        assert got["marked"] and got["hooks_after"] == 0, got
        assert got["keys"]["a True"] != got["keys"]["b True"]  # two meshes of the job: two keys
    first, last = (r["keys"] for r in ranks)  # rank 0 and 3: in no group together
    for name in ("a", "b", "b alone", "b of b alone"):  # a mesh built over this rank's group alone, too
        assert first[f"{name} True"] == last[f"{name} True"], name
        assert first[f"{name} False"] != last[f"{name} False"], name  # torch's key: this rank's mesh


if __name__ == "__main__":
    print(json.dumps(_compile(int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] or None)))
