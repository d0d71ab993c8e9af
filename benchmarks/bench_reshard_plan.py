#!/usr/bin/env python
"""The pure plan of a reshard across two meshes (``fm.plan_reshard``): one rank's answers at W = 65,536, a whole plan at 1,152 ranks.

W = 65,536: source ``make_mesh((64, 8), ("dp_shard", "tp"), devices=range(512))`` (FSDP x TP), destination
``make_mesh((8128, 8), ("dp", "tp"), devices=range(512, 65536))`` with ``P(None, "tp")`` (8,128 DP
replicas of each TP block), a (8192, 4096) bfloat16 tensor. One rank's ``receives`` (64 pieces) and
``sends`` (a source rank; a relay: its forwards), and ``bytes_moved`` and ``max_send_bytes`` of a fresh plan
(made and asked, since a plan keeps its figures). Whole plan: source (16, 8) on ranks 0..127, destination (128, 8)
on 128..1151, 16,384 moves: ``plan.moves`` and ``max_send_bytes`` of a fresh plan.

Times are this process's CPU time (``time.process_time``: single-threaded work, which other jobs on a
shared machine move far less than wall time), the median over ``--reps`` repetitions (each the mean of
a block of calls sized to take ~20 ms). Only the public API is used.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_reshard_plan.py [--reps 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import functional_mesh as fm

SHAPE, DTYPE = (8192, 4096), "bfloat16"


def per_call(fn, reps: int) -> tuple[float, int]:
    """Median seconds per call of ``fn`` over ``reps`` blocks, and the block size."""
    t0, n = time.process_time(), 0
    while time.process_time() - t0 < 0.02 or n == 0:
        fn()
        n += 1
    samples = []
    for _ in range(reps):
        t = time.process_time()
        for _ in range(n):
            fn()
        samples.append((time.process_time() - t) / n)
    return statistics.median(samples), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args()
    src_mesh = fm.make_mesh((64, 8), ("dp_shard", "tp"), devices=range(512))
    dst = fm.NamedSharding(fm.make_mesh((8128, 8), ("dp", "tp"), devices=range(512, 65536)), fm.P(None, "tp"))
    rows = []
    for spec in (fm.P("dp_shard", "tp"), fm.P(None, "tp")):
        src = fm.NamedSharding(src_mesh, spec)
        for relays in (True, False):
            plan = fm.plan_reshard(src, dst, SHAPE, DTYPE, relays=relays)
            label = f"W=65,536 {spec} -> P(None, 'tp'), relays={relays}"
            for what, fn in [
                (f"receives(40003): {len(plan.receives(40003))} moves", lambda: plan.receives(40003)),
                (f"sends(43) (source): {len(plan.sends(43))} moves", lambda: plan.sends(43)),
                (f"sends(523) (relay): {len(plan.sends(523))} moves", lambda: plan.sends(523)),
                ("plan_reshard + bytes_moved",
                 lambda: fm.plan_reshard(src, dst, SHAPE, DTYPE, relays=relays).bytes_moved),
                ("plan_reshard + max_send_bytes",
                 lambda: fm.plan_reshard(src, dst, SHAPE, DTYPE, relays=relays).max_send_bytes),
            ]:
                rows.append((label, what, *per_call(fn, args.reps)))
    small_src = fm.NamedSharding(fm.make_mesh((16, 8), ("dp_shard", "tp"), devices=range(128)), fm.P("dp_shard", "tp"))
    small_dst = fm.NamedSharding(fm.make_mesh((128, 8), ("dp", "tp"), devices=range(128, 1152)), fm.P(None, "tp"))
    for relays in (True, False):
        plan = fm.plan_reshard(small_src, small_dst, SHAPE, DTYPE, relays=relays)
        label = f"1,152 ranks, relays={relays}"
        rows.append((label, f"plan_reshard + moves: {len(plan.moves)} moves",
                     *per_call(lambda: fm.plan_reshard(small_src, small_dst, SHAPE, DTYPE, relays=relays).moves, args.reps)))
        rows.append((label, "plan_reshard + max_send_bytes (arithmetic: no move listed)",
                     *per_call(lambda: fm.plan_reshard(small_src, small_dst, SHAPE, DTYPE,
                                                       relays=relays).max_send_bytes, args.reps)))
    load = os.getloadavg()[0]
    print(f"median CPU time per call over {args.reps} blocks (load average {load:.1f})")
    width = max(len(r[0]) + len(r[1]) for r in rows) + 3
    for label, what, seconds, n in rows:
        print(f"{(label + ' | ' + what).ljust(width)} {seconds * 1e3:10.3f} ms  (block of {n})")


if __name__ == "__main__":
    main()
