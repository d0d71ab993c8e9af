#!/usr/bin/env python
"""MoE token exchange: ``fm.ragged_all_to_all`` against ``dist.all_to_all_single`` with split sizes, on gloo.

Every rank sends rows of 64 float32 (256 B) in uneven, rank-dependent counts, zeros included
(as a router's top-k would), over axis ``ep`` of a 1-axis mesh ``(W,)``; ``x`` is 4 KB or 4 MB.
Two ways of giving the sizes, each against what it does written by hand on the same group:

- sizes given: ``fm.ragged_all_to_all(x, "ep", send, recv)`` (Python ints) against
  ``dist.all_to_all_single(out, x, recv, send)`` into a new ``out``;
- counts exchanged: ``fm.ragged_all_to_all(x, "ep", send)`` against the counts sent by hand
  first (``all_to_all_single`` of an int64 tensor, ``tolist()``), then the same exchange.

Per repetition three calls in a rotating order (ours, raw, and raw again as its own series: the
noise floor), ``dist.barrier()`` before each (``_harness.rotated_samples``), warm-up repetitions
dropped. Per rank the median of each series, then the slowest rank.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_moe.py --out benchmarks/results/moe.jsonl
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_moe"
SERIES = ("fm", "raw", "raw, 2nd series")
SIZES = (4 << 10, 4 << 20)  # bytes of float32 sent by each rank
WIDTH = 64  # float32 per row


def send_sizes(rank: int, world: int, rows: int) -> list[int]:
    """Rank ``rank``'s rows per destination: uneven weights ``(3 rank + 2 j + 1) % 4`` (some 0), scaled to ``rows``."""
    weights = [(3 * rank + 2 * j + 1) % 4 for j in range(world)]
    sizes = [rows * w // sum(weights) for w in weights]
    sizes[weights.index(max(weights))] += rows - sum(sizes)
    return sizes


def worker(rank: int, world: int, port: int, reps: int, warmup: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    rm = fm.realize(fm.make_mesh((world,), ("ep",)))
    g = rm.group("ep")
    out = []
    for nbytes in SIZES:
        rows = nbytes // (4 * WIDTH)
        x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rank))
        send = send_sizes(rank, world, rows)
        recv = [send_sizes(src, world, rows)[rank] for src in range(world)]

        def raw_given(x: Any = x, send: list[int] = send, recv: list[int] = recv) -> Any:
            y = x.new_empty(sum(recv), WIDTH)
            dist.all_to_all_single(y, x, recv, send, group=g)
            return y

        def raw_exchanged(x: Any = x, send: list[int] = send) -> Any:
            counts = torch.tensor(send, dtype=torch.int64)
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=g)
            sizes = got.tolist()
            y = x.new_empty(sum(sizes), WIDTH)
            dist.all_to_all_single(y, x, sizes, send, group=g)
            return y

        forms = {"sizes given": (lambda x=x, send=send, recv=recv: fm.ragged_all_to_all(x, "ep", send, recv, mesh=rm),
                                 raw_given),
                 "counts exchanged": (lambda x=x, send=send: fm.ragged_all_to_all(x, "ep", send, mesh=rm),
                                      raw_exchanged)}
        for form, (ours, raw) in forms.items():
            if not torch.equal(ours(), raw()):  # a check that survives python -O
                raise RuntimeError(f"rank {rank}: fm.ragged_all_to_all ({form}) differs from all_to_all_single; "
                                   "the figures would compare different work")
            samples = H.rotated_samples({SERIES[0]: ours, SERIES[1]: raw, SERIES[2]: raw}, reps, warmup)
            out.append({"row": f"{form}, W={world}, {R.fmt(nbytes, 'B')} ({rows} rows)", "samples": samples})
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return out


def main() -> int:
    H.serve({"ragged": worker})
    p = H.parser(__doc__, "40 repetitions")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--reps", type=int, help="timed repetitions per series (default 100; quick 40)")
    p.add_argument("--warmup", type=int, help="repetitions dropped first (default 10; quick 3)")
    args = p.parse_args()
    reps = args.reps or (40 if args.quick else 100)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    run, t0 = H.start_run(BENCH), time.perf_counter()
    records: list[Any] = [R.Table(
        BENCH, "ragged", "fm.ragged_all_to_all vs all_to_all_single with split sizes (gloo)", "sizes, world, x", (
            (SERIES[0], SERIES[1], "fm / raw"), (SERIES[2], SERIES[1], "noise floor: 2nd series / raw")))]
    print(f"gloo W={args.world}: {reps} repetitions ...", file=sys.stderr, flush=True)
    ranks = H.run_pool(__file__, {"fn": "ragged", "reps": reps, "warmup": warmup}, args.world)
    records += R.slowest_and_paired(BENCH, "ragged", ranks, SERIES)
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
