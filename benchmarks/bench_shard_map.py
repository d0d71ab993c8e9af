#!/usr/bin/env python
"""shard_map: the cost of a typed region over the same step written by hand, eager.

The step: a tensor-parallel MLP, forward and backward, on a 1-axis mesh ``("tp",)`` of W gloo
ranks: ``y = psum(relu(x @ w1) @ w2, "tp")``, ``loss = (y * y).sum()``, with ``x (B, D)``
replicated, ``w1 (D, H)`` split by columns and ``w2 (H, D)`` by rows over tp (D = H = hidden).

- hand: local shards as plain tensors, ``fm.pvary(x, "tp")`` written out (Megatron's f and g);
- hand, DTensor in and out: the same, its weights DTensors (``to_local()``) and its result a
  DTensor (``from_local``): what the region's boundary does besides typing;
- shard_map: ``fm.shard_map(mlp, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P())``
  on the full ``x`` and DTensor weights, ``check_vma=True`` (the implicit pvary) and ``False``.

Per repetition one step of each series in a rotating order, ``dist.barrier()`` before each,
``time.perf_counter_ns`` around the step; warm-up dropped; per rank the median of each series,
then the slowest rank. Ratios divide medians of the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_shard_map.py --quick --out benchmarks/results/s.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_shard_map"
SERIES = ("hand", "shard_map check_vma=True", "shard_map check_vma=False", "hand, DTensor in and out")


def step_worker(rank: int, world: int, port: int, reps: int, warmup: int, hidden: int, batch: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    import functional_mesh as fm
    from functional_mesh import P

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    rm = fm.realize(fm.make_mesh((world,), ("tp",)))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, hidden, generator=g)
    w1_full, w2_full = torch.randn(hidden, hidden, generator=g), torch.randn(hidden, hidden, generator=g)
    s1 = fm.NamedSharding(rm.mesh, P(None, "tp"))
    s2 = fm.NamedSharding(rm.mesh, P("tp", None))
    w1 = fm.distribute(w1_full, s1, mesh=rm).requires_grad_()
    w2 = fm.distribute(w2_full, s2, mesh=rm).requires_grad_()
    l1, l2 = (w.to_local().detach().clone().requires_grad_() for w in (w1, w2))

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return fm.psum(torch.relu(x @ w1) @ w2, "tp")

    def hand() -> None:
        with rm:
            y = fm.psum(torch.relu(fm.pvary(x, "tp") @ l1) @ l2, "tp")
        (y * y).sum().backward()

    def hand_dtensor() -> None:
        with rm:
            y = fm.psum(torch.relu(fm.pvary(x, "tp") @ w1.to_local()) @ w2.to_local(), "tp")
        y = DTensor.from_local(y, rm.device_mesh, (Replicate(),), run_check=False).to_local()
        (y * y).sum().backward()

    def mapped(check_vma: bool) -> Any:
        f = fm.shard_map(mlp, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), mesh=rm,
                         check_vma=check_vma)

        def run() -> None:
            y = f(x, w1, w2).to_local()
            (y * y).sum().backward()
        return run

    calls = {SERIES[0]: hand, SERIES[1]: mapped(True), SERIES[2]: mapped(False), SERIES[3]: hand_dtensor}
    samples = H.rotated_samples(calls, reps, warmup)
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return samples


def main() -> int:
    H.serve({"step": step_worker})
    args = H.mlp_parser(__doc__, 100).parse_args()
    reps, warmup = args.reps or (30 if args.quick else args.default_reps), 5
    run, t0 = H.start_run(BENCH), time.perf_counter()
    row = H.mlp_row(args)
    ranks = H.run_pool(__file__, {"fn": "step", "reps": reps, "warmup": warmup, "hidden": args.hidden,
                                  "batch": args.batch}, args.world)
    records: list[Any] = [R.Table(BENCH, "eager", "MLP step (forward + backward), eager, gloo", "configuration", (
        (SERIES[1], SERIES[0], "typed / hand"), (SERIES[2], SERIES[0], "untyped / hand"),
        (SERIES[1], SERIES[3], "typed / hand with DTensors")))]
    for name in SERIES:
        records.append(R.measured(BENCH, "eager", row, name, max((r[name] for r in ranks), key=statistics.median)))
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
