#!/usr/bin/env python
"""realize(): process groups for a torchtitan-style sequence of meshes, vs torch ``DeviceMesh``.

The sequence, from a 1-D world mesh: (1) the world ``(W,)``; (2) unflatten it into
``(pp, dp_replicate, dp_shard, cp, tp)``; flatten (3) ``dp = (dp_replicate, dp_shard)``,
(4) ``dp_shard_cp = (dp_shard, cp)``, (5) ``dp_cp = (dp_replicate, dp_shard, cp)``, (6) ``batch``
(dp's layout under another name); (7) unflatten ``dp_cp`` into ``(2, |dp_cp| / 2)``. Ours:
``fm.realize`` of each value; torch: ``init_device_mesh``, ``_unflatten``, four ``_flatten`` of
slices, ``_unflatten``.

Measured per side, in fresh workers (alternating sides over ``--rounds``): the ``new_group`` /
``split_group`` calls per step and the distinct rank sets they asked for; ``fm.cache_info()``;
the wall time of the whole sequence (``time.perf_counter_ns``: every repetition needs a fresh
world, which ``Timer`` cannot give) and, on fake, its CPU time; realize on a cache hit (fake:
``Timer``, ``check=False``; gloo: ``check=True`` vs ``check=False`` interleaved, barrier first).
Fake: rank 0 of W = 32 and 4,096, ``dp_shard = W/16``, other degrees 2. Gloo: W = 4 and 8 real
processes on 127.0.0.1, with size-1 axes; per repetition the slowest rank.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_realize.py --quick --out benchmarks/results/realize.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_realize"
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FLATTENS = (("dp", ("dp_replicate", "dp_shard")), ("dp_shard_cp", ("dp_shard", "cp")),
            ("dp_cp", ("dp_replicate", "dp_shard", "cp")), ("batch", ("dp_replicate", "dp_shard")))
STEPS = ("world", "unflatten into 5-D", *(f"flatten {name}" for name, _ in FLATTENS), "unflatten dp_cp")
GLOO_SIZES = {4: (1, 1, 2, 1, 2), 8: (1, 2, 2, 1, 2)}


def sizes_of(backend: str, world: int) -> dict[str, int]:
    return dict(zip(NAMES, (2, 2, world // 16, 2, 2) if backend == "fake" else GLOO_SIZES[world]))


def ours_sequence(world: int, sizes: dict[str, int], mark: Callable[[], None]) -> list[Any]:
    import functional_mesh as fm

    world_mesh = fm.make_mesh((world,), ("world",))
    m = world_mesh.unflatten("world", sizes)
    flat = [m.flatten(axes, name=name) for name, axes in FLATTENS]
    n = flat[2].axis_size("dp_cp")
    kept = []
    for mesh in (world_mesh, m, *flat, flat[2].unflatten("dp_cp", {"hsdp_rep": 2, "hsdp_shard": n // 2})):
        kept.append(fm.realize(mesh))
        mark()
    return kept


def torch_sequence(world: int, sizes: dict[str, int], mark: Callable[[], None]) -> list[Any]:
    from torch.distributed.device_mesh import init_device_mesh

    kept = [init_device_mesh("cpu", (world,), mesh_dim_names=("world",))]
    mark()
    m = kept[0]._unflatten(0, tuple(sizes.values()), tuple(sizes))
    kept.append(m)
    mark()
    for name, axes in FLATTENS:
        kept.append(m[axes]._flatten(name))
        mark()
    kept.append(kept[4]._unflatten(0, (2, kept[4].size() // 2), ("hsdp_rep", "hsdp_shard")))
    mark()
    return kept


def sequence_worker(side: str, backend: str, world: int, reps: int, checks: int, min_run_time: float,
                    rank: int = 0, port: int = 0) -> dict[str, Any]:
    """``reps`` timed sequences after one warm-up; then the cost of a cache hit."""
    import torch.distributed as dist

    import functional_mesh as fm

    sizes = sizes_of(backend, world)
    calls = H.GroupCalls()
    out: dict[str, Any] = {"seq": [], "cpu": []}
    if backend == "gloo":
        H.init_gloo(rank, world, port)
    for rep in range(reps + 1):
        if backend == "fake":
            H.init_fake(world)
        calls.reset()
        dist.barrier()
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        kept = (ours_sequence if side == "ours" else torch_sequence)(world, sizes, calls.mark)
        if rep:
            out["seq"].append(time.perf_counter_ns() - t0)
            out["cpu"].append(time.process_time_ns() - c0)
        out.update(steps=calls.per_step(), tuples=list(set(calls.requested)), cache_groups=fm.cache_info().groups)
        m5 = kept[1].mesh if side == "ours" else None
        del kept
        dist.barrier()
        fm.clear_cache()
        if backend == "fake":
            dist.destroy_process_group()
        elif side == "torch":
            for group in calls.groups:
                if type(group).__name__ == "ProcessGroup":
                    dist.destroy_process_group(group)
    if side == "ours" and backend == "fake":
        from torch.utils.benchmark import Timer

        H.init_fake(world)
        fm.realize(m5)
        hit = Timer("realize(m5, check=False)", globals={"realize": fm.realize, "m5": m5})
        out["check=False"] = [t * 1e9 for t in hit.blocked_autorange(min_run_time=min_run_time).times]
    elif side == "ours":
        fm.realize(m5)
        for i in range(checks + 2):  # check=True / False alternate, order swapped every round
            for check in (True, False) if i % 2 else (False, True):
                dist.barrier()
                t0 = time.perf_counter_ns()
                fm.realize(m5, check=check)
                if i >= 2:  # two warm-up rounds
                    out.setdefault(f"check={check}", []).append(time.perf_counter_ns() - t0)
        fm.clear_cache()
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


def results(backend: str, world: int, outs: dict[str, list[list[dict[str, Any]]]]) -> list[R.Result]:
    """Records of one world; ``outs[side][worker][rank]``: each worker's output, per rank."""
    label = f"{backend} W={world:,} {tuple(sizes_of(backend, world).values())}"
    last = {side: workers[-1] for side, workers in outs.items()}  # counts: the same in every worker
    out = [R.Result(BENCH, "steps", step, f"{side} {backend} W={world:,}", max(r["steps"][i] for r in last[side]), "n")
           for i, step in enumerate(STEPS) for side in outs]
    for side, ranks in last.items():
        out.append(R.Result(BENCH, "groups", label, f"{side}: group calls", max(sum(r["steps"]) for r in ranks), "n"))
    for side, ranks in last.items():
        distinct = {str(t) for r in ranks for t in r["tuples"]}
        out.append(R.Result(BENCH, "groups", label, f"{side}: distinct rank sets", len(distinct), "n"))
    out.append(R.Result(BENCH, "groups", label, "ours: cache_info().groups", last["ours"][0]["cache_groups"], "n"))
    for key, name in (("seq", "sequence"), ("cpu", "CPU time"))[:2 if backend == "fake" else 1]:
        for side, workers in outs.items():  # per repetition the slowest rank
            xs = [max(rep) for ranks in workers for rep in zip(*(r[key] for r in ranks))]
            out.append(R.measured(BENCH, "groups", label, f"{side}: {name}", xs))
    for mode in ("check=False", "check=True"):
        if mode in last["ours"][0]:  # the slowest rank's median
            slowest = max((r[mode] for r in last["ours"]), key=statistics.median)
            out.append(R.measured(BENCH, "hit", label, mode, slowest))
    return out


def main() -> int:
    H.serve({"sequence": sequence_worker})
    p = H.parser(__doc__, "fake W=32 and gloo W=4, one worker per side")
    p.add_argument("--fake-worlds", default=None, help="comma-separated multiples of 32 (default 32,4096)")
    p.add_argument("--gloo-worlds", default=None, help="comma-separated, 4 and/or 8 (default 4,8); '' for none")
    p.add_argument("--reps", type=int, default=3, help="timed sequences per worker, after one warm-up")
    p.add_argument("--rounds", type=int, help="workers per side, alternating sides (default 2; quick 1)")
    p.add_argument("--check-calls", type=int, default=30, help="gloo: cache-hit calls per mode per rank")
    args = p.parse_args()
    fake = args.fake_worlds if args.fake_worlds is not None else ("32" if args.quick else "32,4096")
    gloo = args.gloo_worlds if args.gloo_worlds is not None else ("4" if args.quick else "4,8")
    configs = [("fake", int(w)) for w in fake.split(",") if w] + [("gloo", int(w)) for w in gloo.split(",") if w]
    rounds = args.rounds or (1 if args.quick else 2)
    run, t0 = H.start_run(BENCH), time.perf_counter()
    records: list[Any] = [
        R.Table(BENCH, "groups", "Process-group calls per rank (gloo: the most over ranks) and sequence time",
                "world, (pp, dp_replicate, dp_shard, cp, tp)",
                (("torch: sequence", "ours: sequence", "torch / ours: sequence"),
                 ("torch: CPU time", "ours: CPU time", "torch / ours: CPU time"))),
        R.Table(BENCH, "steps", "Group calls per step, per rank", "step"),
        R.Table(BENCH, "hit", "realize(m) of the cached 5-D mesh (gloo: the slowest rank's median)", "world",
                (("check=True", "check=False", "check=True / check=False"),)),
    ]
    for backend, world in configs:
        outs: dict[str, list[list[dict[str, Any]]]] = {"ours": [], "torch": []}
        for side in H.alternate(["ours", "torch"], rounds):
            print(f"{backend} W={world:,}: {side} ...", file=sys.stderr, flush=True)
            spec = {"fn": "sequence", "side": side, "backend": backend, "reps": args.reps,
                    "checks": args.check_calls, "min_run_time": 0.2}
            outs[side].append([H.run(__file__, {**spec, "world": world})] if backend == "fake"
                              else H.run_pool(__file__, spec, world))
        records += results(backend, world, outs)
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
