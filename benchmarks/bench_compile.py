#!/usr/bin/env python
"""torch.compile: a shard_map MLP training step, eager and inductor, against torch's DTensor tensor parallel.

The step, on a 1-axis mesh ``("tp",)`` of W gloo ranks (D = H = hidden): forward
``y = psum(relu(x @ w1) @ w2, "tp")`` and ``loss = (y * y).mean()``, then ``loss.backward()`` and SGD on
both weights (``w -= lr * w.grad`` under ``no_grad``, gradients cleared); ``x (B, D)`` replicated,
``w1 (D, H)`` split by columns and ``w2 (H, D)`` by rows over tp, both DTensors. Two models of it:

- fm: ``fm.shard_map(mlp, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=True)``
  on the full ``x`` and the DTensor weights, ``mlp`` the one-shard function with its ``fm.psum``;
- DTensor TP: two bias-free ``nn.Linear`` put on ``rm.device_mesh`` by ``parallelize_module``
  (``ColwiseParallel`` then ``RowwiseParallel``), the same weights (transposed).

Each runs eagerly and with its forward and loss compiled, ``torch.compile(loss_fn, backend="inductor")``
(what compiling a model covers: the backward runs as the backward graph AOTAutograd compiled with
it; backward and SGD are called the same way in every series). Not the whole step: dynamo breaks
the graph at ``loss.backward()`` anyway, and on torch 2.13 inductor fails on the DTensor TP step
after that break (an internal error in ``DTensor.__tensor_unflatten__``).

The first compiled call is timed apart: a compile from scratch (inductor's caches off, its one-time
setup done before on a toy function); dynamo's graph-break events and graphs are counted during it
(``torch._dynamo.utils.counters``). That both models compute the same loss and gradients, eager
and compiled, is asserted by ``tests/dist/test_compile_dtensor_gloo.py``, not here. Per
repetition one step of each series in a rotating order, ``dist.barrier()`` before each,
``time.perf_counter_ns`` around the step; warm-up dropped; per rank the median of each series, then
the slowest rank. Ratios divide medians of the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_compile.py --quick --out benchmarks/results/c.jsonl

``--cache W``: the compile of the whole job instead (docs/compile.md, "Compile caches across ranks").
Each program of ``_cache_programs`` is compiled (inductor, forward and backward, torch's fake
backend) by rank 0 into an empty FX graph cache directory, then by every other rank into the
same one, one after the other, each in a fresh interpreter, without and with torch's
``compile_on_one_rank``; per rank the FX graph cache hits and misses and the CPU seconds of its
compile (the process and the compilers it starts).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_compile.py --cache 4 --out benchmarks/results/cc.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_compile"
SERIES = ("fm eager", "fm inductor", "DTensor TP eager", "DTensor TP inductor")
COMPILED = (SERIES[1], SERIES[3])
LR = 1e-3


def models(rm: Any, hidden: int, batch: int) -> dict[str, tuple[Any, list[Any]]]:
    """The two models of the step on ``rm`` (a 1-axis mesh ``("tp",)``), with the same weights:
    ``{"fm": (loss_fn, weights), "DTensor TP": (loss_fn, weights)}``, the weights DTensors.
    ``tests/dist/test_compile_dtensor_gloo.py`` checks that they compute the same loss and gradients."""
    import torch
    from torch import nn
    from torch.distributed.tensor import parallel as tensor_parallel

    import functional_mesh as fm
    from functional_mesh import P

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, hidden, generator=g)
    w1_full = torch.randn(hidden, hidden, generator=g) / hidden ** 0.5
    w2_full = torch.randn(hidden, hidden, generator=g) / hidden ** 0.5

    w1 = fm.distribute(w1_full, fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm).requires_grad_()
    w2 = fm.distribute(w2_full, fm.NamedSharding(rm.mesh, P("tp", None)), mesh=rm).requires_grad_()

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return fm.psum(torch.relu(x @ w1) @ w2, "tp")

    mapped = fm.shard_map(mlp, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), mesh=rm)

    def fm_loss() -> Any:
        y = mapped(x, w1, w2).to_local()
        return (y * y).mean()

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(hidden, hidden, bias=False)
            self.w2 = nn.Linear(hidden, hidden, bias=False)

        def forward(self, x: Any) -> Any:
            return self.w2(torch.relu(self.w1(x)))

    model = MLP()
    with torch.no_grad():
        model.w1.weight.copy_(w1_full.T)
        model.w2.weight.copy_(w2_full.T)
    tensor_parallel.parallelize_module(model, rm.device_mesh, {"w1": tensor_parallel.ColwiseParallel(),
                                                               "w2": tensor_parallel.RowwiseParallel()})

    def tp_loss() -> Any:
        y = model(x)
        return (y * y).mean()

    return {"fm": (fm_loss, [w1, w2]), "DTensor TP": (tp_loss, [model.w1.weight, model.w2.weight])}


def step_worker(rank: int, world: int, port: int, reps: int, warmup: int, hidden: int, batch: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    import functional_mesh as fm

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    torch._inductor.config.force_disable_caches = True  # every first call compiles from scratch
    rm = fm.realize(fm.make_mesh((world,), ("tp",)))
    built = models(rm, hidden, batch)
    (fm_loss, fm_weights), (tp_loss, tp_weights) = built["fm"], built["DTensor TP"]

    def step(loss_fn: Any, weights: list[Any]) -> Any:
        def run() -> Any:
            loss = loss_fn()
            loss.backward()
            with torch.no_grad():
                for w in weights:
                    w.sub_(w.grad, alpha=LR)
            for w in weights:
                w.grad = None
            return loss.detach()
        return run

    torch.compile(lambda t: torch.relu(t @ t).sum(), backend="inductor")(torch.ones(8, 8))  # inductor's one-time setup
    graphs, compiled = {}, {}
    for name, loss_fn in ((SERIES[1], fm_loss), (SERIES[3], tp_loss)):
        torch._dynamo.reset()
        counters.clear()
        compiled[name] = torch.compile(loss_fn, backend="inductor")
        dist.barrier()
        t0 = time.perf_counter_ns()
        compiled[name]().backward()
        graphs[name] = {"compile_ns": time.perf_counter_ns() - t0,
                        "breaks": sum(counters["graph_break"].values()),
                        "graphs": counters["stats"]["unique_graphs"],
                        "reasons": sorted({r.split("\n")[0] for r in counters["graph_break"]})}
    for w in (*fm_weights, *tp_weights):
        w.grad = None
    calls = {SERIES[0]: step(fm_loss, fm_weights), SERIES[1]: step(compiled[SERIES[1]], fm_weights),
             SERIES[2]: step(tp_loss, tp_weights), SERIES[3]: step(compiled[SERIES[3]], tp_weights)}
    samples = H.rotated_samples(calls, reps, warmup)
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return {"samples": samples, "graphs": graphs}


def cache_worker(rank: int, world: int, program: str, shared: bool) -> dict:
    import resource

    import torch
    from torch._dynamo.utils import counters

    import _cache_programs

    H.init_fake(world, rank)
    torch._inductor.config.fx_graph_cache = True
    fn, args = _cache_programs.PROGRAMS[program](world)
    flags = getattr(torch.compiler.config, "compile_on_one_rank", None) is not None
    config = torch.compiler.config if flags else torch.distributed.config
    counters.clear()

    def cpu() -> float:
        return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))

    t0 = cpu()
    with config.patch(compile_on_one_rank=shared):
        torch.compile(fn, backend="inductor")(*args).backward()
    return {"cpu_s": cpu() - t0, **{k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss", "bypass")}}


def cache_main(args: Any) -> int:
    import tempfile

    import _cache_programs

    run, t0, world = H.start_run(BENCH), time.perf_counter(), args.cache
    records: list[Any] = [R.Table(BENCH, "cache", f"One cache directory, ranks compiled one after another, world "
                                  f"{world}: FX graph cache hits of ranks 1..{world - 1}, of their graphs; the CPU "
                                  "time of rank 0's compile and of the slowest later rank's", "program")]
    for name in [n for n in _cache_programs.PROGRAMS if not args.programs or any(n.startswith(p) for p in args.programs)]:
        for shared in (False, True):
            with tempfile.TemporaryDirectory() as cache:
                env = {"TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
                ranks = [H.run(__file__, {"fn": "cache", "rank": r, "world": world, "program": name,
                                          "shared": shared}, env=env) for r in range(world)]
            later = ranks[1:]
            column = "compile_on_one_rank" if shared else "without the flag"
            hit, graphs = sum(r["hit"] for r in later), sum(r["hit"] + r["miss"] for r in later)
            records += [R.Result(BENCH, "cache", name, f"{column}: hits", hit, "n"),
                        R.Result(BENCH, "cache", name, f"{column}: of graphs", graphs, "n"),
                        R.Result(BENCH, "cache", name, f"{column}: CPU rank 0", ranks[0]["cpu_s"] * 1e9, "ns"),
                        R.Result(BENCH, "cache", name, f"{column}: CPU later, max", max(r["cpu_s"] for r in later) * 1e9,
                                 "ns")]
            print(name, column, [(r["hit"], r["miss"], r["bypass"], round(r["cpu_s"], 1)) for r in ranks], flush=True)
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0), *records])
    return 0


def main() -> int:
    H.serve({"step": step_worker, "cache": cache_worker})
    p = H.mlp_parser(__doc__, 300)
    p.add_argument("--cache", type=int, metavar="W", help="the compile of a W-rank job into one cache instead")
    p.add_argument("--programs", nargs="+", help="with --cache: only these programs (by the start of their name)")
    args = p.parse_args()
    if args.cache:
        return cache_main(args)
    reps, warmup = args.reps or (30 if args.quick else args.default_reps), 5
    run, t0 = H.start_run(BENCH), time.perf_counter()
    row = H.mlp_row(args)
    ranks = H.run_pool(__file__, {"fn": "step", "reps": reps, "warmup": warmup, "hidden": args.hidden,
                                  "batch": args.batch}, args.world, timeout_s=1800)
    records: list[Any] = [R.Table(BENCH, "step", "MLP training step (forward + backward + SGD), gloo",
                                  "configuration", ((SERIES[1], SERIES[3], "fm inductor / DTensor inductor"),
                                                    (SERIES[1], SERIES[0], "fm inductor / fm eager"),
                                                    (SERIES[3], SERIES[2], "DTensor inductor / DTensor eager"),
                                                    (SERIES[0], SERIES[2], "fm eager / DTensor eager")))]
    for name in SERIES:
        records.append(R.measured(BENCH, "step", row, name, max((r["samples"][name] for r in ranks),
                                                                key=statistics.median)))
    records.append(R.Table(BENCH, "compile", "First compiled call (inductor compile) and dynamo's graphs",
                           "series"))
    notes = []
    for name in COMPILED:
        per_rank = [r["graphs"][name] for r in ranks]
        records += [R.Result(BENCH, "compile", name, "first call", max(g["compile_ns"] for g in per_rank), "ns"),
                    R.Result(BENCH, "compile", name, "graph breaks", max(g["breaks"] for g in per_rank), "n"),
                    R.Result(BENCH, "compile", name, "graphs", max(g["graphs"] for g in per_rank), "n")]
        reasons = sorted({reason for g in per_rank for reason in g["reasons"]})
        notes.append(f"{name}: graph breaks at " + ("; ".join(reasons) if reasons else "none"))
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, notes), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
