#!/usr/bin/env python
"""Overlap: a 4 MB all-reduce issued now and waited for later (``async_op=True``), on gloo.

On a 1-axis mesh ``(W,)`` every rank all-reduces a 4 MB float32 ``x`` over ``w`` and computes,
for about as long as the all-reduce alone takes (measured first; the same on every rank), one
of two kinds of work:

- ``sleep``: ``time.sleep``, the CPU left free: a stand-in for work on an accelerator, which is
  what communication overlaps in practice;
- ``matmul``: ``tanh(a @ y)`` on a 256 x 256 float32 block, repeated: CPU work, which competes
  with gloo's own threads for the cores (here 2 cores for 4 ranks).

Per repetition, in a rotating order with ``dist.barrier()`` before each
(``_harness.rotated_samples``):

- ``comm``: ``fm.psum(x, "w", mesh=rm)`` alone; ``compute``: the work alone;
- ``compute; wait``: the work, then the blocking ``fm.psum`` (nothing overlaps);
- ``issue; compute; wait``: ``p = fm.psum(x, "w", mesh=rm, async_op=True)``, the work,
  ``p.wait()``;
- ``raw c10d: issue; compute; wait``: the same by hand, ``y = x.clone(); w = dist.all_reduce(y,
  group=g, async_op=True)``, the work, ``w.wait()``.

Overlap ratio of an overlapped series ``t``: ``(t_seq - t) / min(comm, compute)``, with ``t_seq``
the ``compute; wait`` series: the time overlapping saved, as a share of the most it could save
(the shorter of the two hidden entirely): 1 = all of it, 0 = nothing. (``t_seq`` is measured
rather than taken as ``comm + compute``: each repetition of it, as of ``t``, ends when the
slowest rank's work is done, which the two alone do not wait for.) Per rank the median of each
series, then the slowest rank; the ratios from those.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_overlap.py --out benchmarks/results/overlap.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_overlap"
SERIES = ("comm", "compute", "compute; wait", "issue; compute; wait", "raw c10d: issue; compute; wait")
OVERLAPPED = {"issue; compute; wait": "overlap ratio, fm", "raw c10d: issue; compute; wait": "overlap ratio, raw c10d"}
WORK = ("sleep", "matmul")
NBYTES = 4 << 20
BLOCK = 256


def overlap_ratio(comm: float, compute: float, sequential: float, overlapped: float) -> float:
    """``(sequential - overlapped) / min(comm, compute)``: the share of the most overlapping could save that it saved."""
    return (sequential - overlapped) / min(comm, compute)


def worker(rank: int, world: int, port: int, reps: int, warmup: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    rm = fm.realize(fm.make_mesh((world,), ("w",)))
    g = rm.group("w")
    x = torch.randn(NBYTES // 4, generator=torch.Generator().manual_seed(rank))
    a = torch.randn(BLOCK, BLOCK, generator=torch.Generator().manual_seed(1000 + rank)) / BLOCK

    def comm() -> Any:
        return fm.psum(x, "w", mesh=rm)

    def agreed(value: float) -> float:  # the largest over the ranks: every rank does the same work
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    comm_s = agreed(statistics.median(H.rotated_samples({"comm": comm}, 9, 2)["comm"]) / 1e9)
    t0 = time.perf_counter_ns()
    for _ in range(20):
        torch.tanh(a @ a)
    matmuls = int(agreed(max(1, round(comm_s * 1e9 / ((time.perf_counter_ns() - t0) / 20)))))
    work = {"sleep": (lambda: time.sleep(comm_s), f"sleep {comm_s * 1e3:.0f} ms"),
            "matmul": (lambda: _matmuls(torch, a, matmuls), f"{matmuls} x tanh({BLOCK}² @ {BLOCK}²)")}
    out = []
    for kind in WORK:
        compute, what = work[kind]

        def blocking(compute: Any = compute) -> Any:
            compute()
            return comm()

        def issued(compute: Any = compute) -> Any:
            p = fm.psum(x, "w", mesh=rm, async_op=True)
            compute()
            return p.wait()

        def raw(compute: Any = compute) -> Any:
            y = x.clone()
            handle = dist.all_reduce(y, group=g, async_op=True)
            compute()
            handle.wait()
            return y

        calls = dict(zip(SERIES, (comm, compute, blocking, issued, raw), strict=True))
        out.append({"row": f"psum, W={world}, {R.fmt(NBYTES, 'B')} float32; {kind}: {what}",
                    "samples": H.rotated_samples(calls, reps, warmup)})
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return out


def _matmuls(torch: Any, a: Any, count: int) -> Any:
    y = a
    for _ in range(count):
        y = torch.tanh(a @ y)
    return y


def main() -> int:
    H.serve({"overlap": worker})
    p = H.parser(__doc__, "30 repetitions")
    p.add_argument("--worlds", default="4", help="comma-separated world sizes (default 4)")
    p.add_argument("--reps", type=int, help="timed repetitions per series (default 60; quick 30)")
    p.add_argument("--warmup", type=int, default=3, help="repetitions dropped first (default 3)")
    args = p.parse_args()
    reps = args.reps or (30 if args.quick else 60)
    run, t0, tree = H.start_run(BENCH), time.perf_counter(), H.revision()
    records: list[Any] = [R.Table(BENCH, "overlap", "A 4 MB all-reduce overlapped with computation (gloo)",
                                  "collective, world, tensor; computation",
                                  ((SERIES[3], SERIES[4], "fm / raw c10d, overlapped"),))]
    for world in (int(w) for w in args.worlds.split(",")):
        print(f"gloo W={world}: {reps} repetitions ...", file=sys.stderr, flush=True)
        ranks = H.run_pool(__file__, {"fn": "overlap", "reps": reps, "warmup": args.warmup}, world, timeout_s=1800)
        for rows in zip(*ranks):
            row = rows[0]["row"]
            slowest = {name: max((r["samples"][name] for r in rows), key=statistics.median) for name in SERIES}
            records += [R.measured(BENCH, "overlap", row, name, slowest[name]) for name in SERIES]
            m = {name: statistics.median(samples) for name, samples in slowest.items()}
            records += [R.Result(BENCH, "overlap", row, header,
                                 overlap_ratio(m["comm"], m["compute"], m["compute; wait"], m[name]), "x")
                        for name, header in OVERLAPPED.items()]
    notes = [tree, "overlap ratio = (t(compute; wait) - t) / min(comm, compute), from the slowest rank's medians: "
                   "1 = the shorter of the two hidden entirely, 0 = nothing saved"]
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, notes), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
