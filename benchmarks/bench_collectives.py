#!/usr/bin/env python
"""Collectives: the overhead of each ``fm`` collective over the raw c10d call it makes, on gloo.

Ours: ``fm.<collective>(x, "w", mesh=rm)``. Raw: the torch.distributed call it makes underneath,
written by hand on the same group (:func:`pairs`), a new output buffer included (ours returns a
new tensor too), so the difference is our Python dispatch. Axis ``w`` of a 1-axis mesh ``(W,)``
(the world: every collective) and, for psum, of a 2-axis mesh ``(W/2, 2)`` (pairs); float32
tensors of 4 KB and 4 MB; gloo on 127.0.0.1, one process per rank, W = 2 and 4.

Per repetition three calls in a rotating order (ours, raw, and raw again as its own series: the
noise floor), ``dist.barrier()`` before each, ``time.perf_counter_ns`` around the call alone
(``Timer`` cannot put a barrier before every call), the cyclic GC off; warm-up repetitions
dropped. Per rank the median of each series, then the slowest rank.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_collectives.py --quick --out benchmarks/results/c.jsonl
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_collectives"
SERIES = ("fm", "raw", "raw, 2nd series")
SIZES = (4 << 10, 4 << 20)  # bytes of float32


def pairs(rm: Any, axis: str, nbytes: int, seed: int = 0) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per collective, ``(ours, raw)``: zero-argument calls on a float32 ``x`` of ``nbytes``, over
    ``axis`` of ``rm``; raw is the c10d call ours makes, into a new buffer, on ``rm.group(axis)``.

    ``psum, x.requires_grad`` times psum with autograd recording against the same raw call as
    ``psum`` (what the call costs a user, gradient or not). Shared with bench_eager.
    """
    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    g, n, me = rm.group(axis), rm.axis_size(axis), fm.axis_index(axis, mesh=rm)
    m = nbytes // 4
    x = torch.randn(m, generator=torch.Generator().manual_seed(seed))
    xg = x.clone().requires_grad_()
    send = [m // n + (m // (4 * n)) * (1 if j % 2 == 0 else -1) for j in range(n)]  # uneven rows, same on every rank
    recv = [send[me]] * n
    perm = [(i, (i + 1) % n) for i in range(n)]  # a ring: rank me sends to me+1, receives from me-1
    to = [m if j == (me + 1) % n else 0 for j in range(n)]
    frm = [m if j == (me - 1) % n else 0 for j in range(n)]

    def raw_psum() -> Any:
        y = x.clone()
        dist.all_reduce(y, group=g)
        return y

    def raw_gather() -> Any:
        out = x.new_empty(n * m)
        dist.all_gather_into_tensor(out, x, group=g)
        return out

    def raw_scatter() -> Any:
        out = x.new_empty(m // n)
        dist.reduce_scatter_tensor(out, x, group=g)
        return out

    def raw_exchange(out_splits: Any = None, in_splits: Any = None) -> Callable[[], Any]:
        def call() -> Any:
            out = x.new_empty(sum(out_splits) if out_splits else m)
            dist.all_to_all_single(out, x, out_splits, in_splits, group=g)
            return out
        return call

    return {
        "psum": (lambda: fm.psum(x, axis, mesh=rm), raw_psum),
        "psum, x.requires_grad": (lambda: fm.psum(xg, axis, mesh=rm), raw_psum),
        "all_gather": (lambda: fm.all_gather(x, axis, mesh=rm), raw_gather),
        "psum_scatter": (lambda: fm.psum_scatter(x, axis, mesh=rm), raw_scatter),
        "all_to_all": (lambda: fm.all_to_all(x, axis, 0, 0, mesh=rm), raw_exchange()),
        "ragged_all_to_all": (lambda: fm.ragged_all_to_all(x, axis, send, recv, mesh=rm), raw_exchange(recv, send)),
        "ppermute": (lambda: fm.ppermute(x, axis, perm, mesh=rm), raw_exchange(frm, to)),
        "pvary": (lambda: fm.pvary(x, axis, mesh=rm), lambda: x.view_as(x)),
    }


def worker(rank: int, world: int, port: int, reps: int, warmup: int) -> list[dict[str, Any]]:
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
            for name, (ours, raw) in pairs(rm, "w", nbytes, seed=rank).items():
                if mesh_name == "2-axis" and name != "psum":
                    continue
                samples = H.rotated_samples({SERIES[0]: ours, SERIES[1]: raw, SERIES[2]: raw}, reps, warmup)
                out.append({"row": f"{name}, W={world}, {mesh_name} (group of {rm.axis_size('w')}), "
                                   f"{R.fmt(nbytes, 'B')}", "samples": samples})
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return out


def main() -> int:
    H.serve({"collectives": worker})
    p = H.parser(__doc__, "W=2 only, 40 repetitions")
    p.add_argument("--worlds", default=None, help="comma-separated even world sizes (default 2,4)")
    p.add_argument("--reps", type=int, help="timed repetitions per series (default 200, W > 2: 100; quick 40)")
    p.add_argument("--warmup", type=int, help="repetitions dropped first (default 10; quick 3)")
    args = p.parse_args()
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    run, t0, tree = H.start_run(BENCH), time.perf_counter(), H.revision()
    records: list[Any] = [R.Table(
        BENCH, "collectives", "Each collective vs the raw c10d call it makes (gloo)", "collective, world, mesh, tensor",
        ((SERIES[0], SERIES[1], "fm / raw"), (SERIES[2], SERIES[1], "noise floor: 2nd series / raw")),
        ((SERIES[0], SERIES[1], "fm − raw"),))]
    for world in (int(w) for w in (args.worlds or ("2" if args.quick else "2,4")).split(",")):
        reps = args.reps or (40 if args.quick else 200 if world <= 2 else 100)
        print(f"gloo W={world}: {reps} repetitions ...", file=sys.stderr, flush=True)
        ranks = H.run_pool(__file__, {"fn": "collectives", "reps": reps, "warmup": warmup}, world, timeout_s=1800)
        records += R.slowest_and_paired(BENCH, "collectives", ranks, SERIES)
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, [tree]), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
