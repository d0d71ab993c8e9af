#!/usr/bin/env python
"""torchtitan 0.3's meshes: its ``ParallelDims.build_mesh`` vs ours, under torch's fake backend.

torchtitan: ``ParallelDims(...).build_mesh()``, which unflattens its world ``DeviceMesh`` once per
view ("dataloading", "dense", under "spmd_types" also the (pp, dp, cp, tp) view, "sparse") and
flattens "loss". Ours: ``functional_mesh.integrations.torchtitan.parallel_dims(...).build_mesh()``,
one mesh family realized through the group cache. Then, on both sides, what ``fully_shard`` does
with the mesh under "full_dtensor" and "spmd_types" (torchtitan's ``resolve_fsdp_mesh``, torch's
``_get_mesh_info``: it flattens dp_shard x cp), which our family realized up front.

Each world and ``spmd_backend`` in fresh workers per side (alternating sides over ``--rounds``),
as rank ``--rank`` of a fake world, ep = 1: per repetition a fresh world; ``new_group`` /
``split_group`` calls (with the ``backend`` torchtitan asked for) and the process groups this
rank joins; wall and CPU time (``time.perf_counter_ns`` / ``process_time_ns``: every repetition
needs a fresh world, which ``Timer`` cannot give), one warm-up dropped; the worker's peak RSS.
Skips, saying why, where torchtitan 0.3.0 is not importable.

    OMP_NUM_THREADS=1 .venv-titan/bin/python benchmarks/bench_torchtitan.py --out benchmarks/results/torchtitan.jsonl
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_torchtitan"
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
LAYOUTS = {32: (2, 2, 2, 2, 2), 65536: (8, 8, 16, 8, 8)}
SIDES = ("torchtitan", "ours")
SPMD_BACKENDS = ("partial_dtensor", "full_dtensor", "spmd_types")  # torchtitan 0.3's; the last is its default
RUN_HINT = ("it runs in a venv with torchtitan 0.3.0 (docs/torchtitan.md, 'Running the tests'): "
            "OMP_NUM_THREADS=1 .venv-titan/bin/python benchmarks/bench_torchtitan.py --out "
            "benchmarks/results/torchtitan.jsonl")


class BackendCalls(H.GroupCalls):
    """:class:`~_harness.GroupCalls` that also keeps each call's ``backend`` argument
    ("fake": torchtitan's override for the axes it never talks over)."""

    def _wrap(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        counted = super()._wrap(real, name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.backends.append(kwargs.get("backend"))
            return counted(*args, **kwargs)
        return noted

    def reset(self) -> None:
        super().reset()
        self.backends: list[Any] = []


def build_worker(side: str, world: int, backend: str, reps: int, rank: int) -> dict[str, Any]:
    """``reps`` timed builds after one warm-up, each in a fresh fake world."""
    import gc
    import resource

    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as titan_parallel_dims
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info
    from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

    import functional_mesh as fm
    from functional_mesh.integrations import torchtitan as fm_titan

    # CPU WORKAROUND (as in tests/torchtitan): torchtitan's device_type is "cuda" without an accelerator
    titan_parallel_dims.device_type = "cpu"
    make = fm_titan.parallel_dims if side == "ours" else titan_parallel_dims.ParallelDims
    args = dict(zip(NAMES, LAYOUTS[world]), ep=1, world_size=world, spmd_backend=backend)
    calls = BackendCalls()
    out: dict[str, Any] = {"build": [], "cpu": [], "total": [],
                           "rss_imports": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    for rep in range(reps + 1):
        H.init_fake(world, rank)
        gc.collect()
        calls.reset()
        joined = len(c10d._world.pg_map)
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        pd = make(**args)
        pd.build_mesh()
        t1, c1 = time.perf_counter_ns(), time.process_time_ns()
        calls.mark()
        if backend != "partial_dtensor":  # what fully_shard does with torchtitan's mesh
            mesh, dims = resolve_fsdp_mesh(pd)
            if dims is not None:
                _get_mesh_info(mesh, dims)
            del mesh
        t2 = time.perf_counter_ns()
        calls.mark()
        if rep:
            out["build"].append(t1 - t0)
            out["cpu"].append(c1 - c0)
            out["total"].append(t2 - t0)
        n_build = calls.steps[0]
        out.update(build_calls=n_build, fsdp_calls=calls.steps[1] - n_build,
                   fake_calls=sum(b == "fake" for b in calls.backends[:n_build]),
                   real_sets=len({t for t, b in zip(calls.requested[:n_build], calls.backends) if b != "fake"}),
                   joined=len(c10d._world.pg_map) - joined)
        del pd
        fm.clear_cache()
        dist.destroy_process_group()
    out["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def results(world: int, backend: str, outs: dict[str, list[dict[str, Any]]]) -> list[R.Result]:
    """Records of one world and backend; ``outs[side]``: each worker's output."""
    row = f"W={world:,} {LAYOUTS[world]}, {backend}"
    last = {side: workers[-1] for side, workers in outs.items()}  # counts: the same in every worker
    out = []
    for key, column in (("build_calls", "group calls"), ("fake_calls", "of which fake backend"),
                        ("real_sets", "distinct real rank sets"), ("joined", "groups this rank joins"),
                        ("fsdp_calls", "FSDP2 flatten: group calls")):
        out += [R.Result(BENCH, "groups", row, f"{side}: {column}", last[side][key], "n") for side in SIDES
                if key != "fake_calls" or side == "torchtitan"]  # ours asks for no fake-backend group
    for key, column in (("build", "build_mesh"), ("cpu", "build_mesh, CPU"), ("total", "+ FSDP2 flatten")):
        out += [R.measured(BENCH, "time", row, f"{side}: {column}", [x for w in outs[side] for x in w[key]])
                for side in SIDES]
    for key, column in (("rss_peak", "peak RSS"), ("rss_imports", "RSS after imports")):
        out += [R.Result(BENCH, "memory", row, f"{side}: {column}", max(w[key] for w in outs[side]), "B")
                for side in SIDES]
    return out


def torchtitan_version() -> str | None:
    """torchtitan's version; ``None`` (and why, on stderr) where it is not importable or not 0.3.0."""
    try:
        import torchtitan.distributed.parallel_dims  # noqa: F401

        from functional_mesh.integrations.torchtitan import check_version
        return check_version()
    except Exception as exc:  # noqa: BLE001 - ImportError, MeshError, or whatever a missing dependency raises
        print(f"SKIPPED bench_torchtitan: torchtitan is not usable in {sys.executable} "
              f"({type(exc).__name__}: {exc}); {RUN_HINT}", file=sys.stderr, flush=True)
        return None


def main() -> int:
    H.serve({"build": build_worker})
    p = H.parser(__doc__, "W=32 only, one worker per side")
    p.add_argument("--worlds", default=None, help="comma-separated, of 32 and 65536 (default both; quick 32)")
    p.add_argument("--backends", default=",".join(SPMD_BACKENDS), help="comma-separated spmd_backend values")
    p.add_argument("--reps", type=int, help="timed builds per worker, after one warm-up (default 20 at W=32, "
                   "3 at W=65,536)")
    p.add_argument("--rounds", type=int, help="workers per side, alternating sides (default 2; quick 1)")
    p.add_argument("--rank", type=int, default=0, help="the rank each worker plays in the fake world")
    args = p.parse_args()
    version = torchtitan_version()
    if version is None:
        return 0  # skipped, said so; the recorded results stay as they were
    worlds = [int(w) for w in (args.worlds or ("32" if args.quick else "32,65536")).split(",")]
    if set(worlds) - set(LAYOUTS):
        p.error(f"--worlds requires worlds with a layout, but got {args.worlds!r}; valid: {list(LAYOUTS)}")
    rounds = args.rounds or (1 if args.quick else 2)
    reps = {world: args.reps or (20 if world <= 4096 else 3) for world in worlds}
    run, t0 = H.start_run(BENCH), time.perf_counter()
    ratio = "ours / torchtitan"
    records: list[Any] = [
        R.Table(BENCH, "groups", "Process groups per rank: build_mesh, then FSDP2's flatten of dp_shard × cp",
                "world (pp, dp_replicate, dp_shard, cp, tp), spmd_backend",
                (("ours: group calls", "torchtitan: group calls", f"{ratio}: group calls"),)),
        R.Table(BENCH, "time", "Time to build the meshes, per rank", "world (pp, dp_replicate, dp_shard, cp, tp), "
                "spmd_backend", tuple((f"ours: {c}", f"torchtitan: {c}", f"{ratio}: {c}")
                                      for c in ("build_mesh", "build_mesh, CPU", "+ FSDP2 flatten"))),
        R.Table(BENCH, "memory", "Worker memory (one worker builds the meshes reps + 1 times)",
                "world (pp, dp_replicate, dp_shard, cp, tp), spmd_backend",
                (("ours: peak RSS", "torchtitan: peak RSS", f"{ratio}: peak RSS"),)),
    ]
    for world in worlds:
        for backend in args.backends.split(","):
            outs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
            for side in H.alternate(list(SIDES), rounds):
                print(f"W={world:,} {backend}: {side} ...", file=sys.stderr, flush=True)
                outs[side].append(H.run(__file__, {"fn": "build", "side": side, "world": world, "backend": backend,
                                                   "reps": reps[world], "rank": args.rank}))
            records += results(world, backend, outs)
    per_world = ", ".join(f"{n} at W={w:,}" for w, n in reps.items())
    note = (f"torchtitan {version}; rank {args.rank} of a fake world; ep = 1; timed builds per worker after one "
            f"warm-up: {per_world}; {rounds} worker(s) per side")
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, [note]), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
