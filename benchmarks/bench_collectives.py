#!/usr/bin/env python
"""psum: the overhead of ``fm.psum`` over a raw ``dist.all_reduce`` on the same gloo group.

Ours: ``fm.psum(x, "w", mesh=rm)``. Baseline, what psum does underneath written by hand:
``y = x.clone(); dist.all_reduce(y, group=rm.group("w"))`` (psum returns a new tensor too), so
the difference is psum's Python dispatch. Axis ``w`` of a 1-axis mesh ``(W,)`` (the world) and
of a 2-axis mesh ``(W/2, 2)`` (pairs); float32 tensors of 4 KB and 4 MB; gloo on 127.0.0.1, one
process per rank, W = 2 and 8.

Per repetition three calls in a rotating order (psum, baseline, and the baseline again as its
own series: the noise floor), ``dist.barrier()`` before each, ``time.perf_counter_ns`` around
the call alone (``Timer`` cannot put a barrier before every call), the cyclic GC off; warm-up
repetitions dropped. Per rank the median of each series, then the slowest rank.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_collectives.py --quick --out benchmarks/results/c.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_collectives"
SERIES = ("psum", "baseline", "baseline, 2nd series")
SIZES = (4 << 10, 4 << 20)  # bytes of float32


def psum_worker(rank: int, world: int, port: int, reps: int, warmup: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    out = []
    for mesh_name, mesh in (("1-axis", fm.make_mesh((world,), ("w",))),
                            ("2-axis", fm.make_mesh((world // 2, 2), ("a", "w")))):
        rm = fm.realize(mesh)
        for nbytes in SIZES:
            x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))

            group = rm.group("w")

            def base(x: Any = x, group: Any = group) -> Any:
                y = x.clone()
                dist.all_reduce(y, group=group)
                return y

            calls = {"psum": lambda x=x, rm=rm: fm.psum(x, "w", mesh=rm), SERIES[1]: base, SERIES[2]: base}
            samples = H.rotated_samples(calls, reps, warmup)
            out.append({"row": f"W={world}, {mesh_name} (group of {rm.axis_size('w')}), {R.fmt(nbytes, 'B')}",
                        "samples": samples})
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return out


def results(ranks: list[list[dict[str, Any]]]) -> list[R.Result]:
    """Per configuration and series the slowest rank's median; the paired ratio per rank is the
    median over repetitions of psum / baseline, then the largest over ranks."""
    out = []
    for configs in zip(*ranks):
        row = configs[0]["row"]
        for name in SERIES:
            out.append(R.measured(BENCH, "psum", row, name, max((c["samples"][name] for c in configs),
                                                                key=statistics.median)))
        paired = max(statistics.median(o / b for o, b in zip(c["samples"]["psum"], c["samples"]["baseline"]))
                     for c in configs)
        out.append(R.Result(BENCH, "psum", row, "paired psum / baseline", paired, "x"))
    return out


def main() -> int:
    H.serve({"psum": psum_worker})
    p = R.parser(__doc__, "W=2 only, 40 repetitions")
    p.add_argument("--worlds", default=None, help="comma-separated even world sizes (default 2,8)")
    p.add_argument("--reps", type=int, help="timed repetitions per series (default 200, W > 4: 100; quick 40)")
    p.add_argument("--warmup", type=int, help="repetitions dropped first (default 10; quick 3)")
    args = p.parse_args()
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    run, t0 = R.start_run(BENCH), time.perf_counter()
    records: list[Any] = [R.Table(BENCH, "psum", "fm.psum vs clone + all_reduce (gloo)", "world, mesh, tensor", (
        ("psum", "baseline", "psum / baseline"),
        ("baseline, 2nd series", "baseline", "noise floor: 2nd series / baseline")))]
    for world in (int(w) for w in (args.worlds or ("2" if args.quick else "2,8")).split(",")):
        reps = args.reps or (40 if args.quick else 200 if world <= 4 else 100)
        print(f"gloo W={world}: {reps} repetitions ...", file=sys.stderr, flush=True)
        records += results(H.run_pool(__file__, {"fn": "psum", "reps": reps, "warmup": warmup}, world))
    R.write(args.out, [R.finish_run(run, time.perf_counter() - t0), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
