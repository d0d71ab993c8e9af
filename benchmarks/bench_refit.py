#!/usr/bin/env python
"""RL refit on gloo, world 8: ``fm.reshard`` of a state dict vs gather-then-broadcast vs a hand-made ppermute bridge.

The state dict is ``examples/refit.py``'s (a Llama-style model, bf16 matrices and fp32 norms, FSDP2 +
TP specs with ``_StridedShard``) at ``--dim`` (hidden = 2.5 dim, vocab = 2 dim), from a trainer
(dp_shard 2, tp 2) on ranks 0-3 to a generator (dp 2, tp 2) on ranks 4-7. Three ways, each leaving
every generator rank with DTensors in the generator's layout, checked equal to each other first:

- ``fm.reshard``: one call for the whole state dict (trainer ranks pass DTensors, generator ranks
  ``fm.ShapeDtypeStruct``\\ s); one all-to-all per stage over the bridge group.
- gather-then-broadcast: per tensor, ``full_tensor()`` on the trainer, rank 0 broadcasts it to the
  generator ranks (a members-only group of ranks 0, 4-7), each keeps its block.
- hand-made bridge (what ``examples/rl_disjoint.py`` did before ``fm.reshard``): per tensor, the
  trainer reshards to the generator's spec on its own mesh (an all-gather over dp_shard), then one
  ``fm.ppermute`` over a bridge mesh ``[[0, 1, 2, 3], [4, 5, 6, 7]]`` sends trainer rank i's block
  to generator rank 4 + i.

Per repetition the three in a rotating order, a world barrier before each (``_harness.rotated_samples``),
warm-up dropped; per rank the median, then the slowest rank. Bytes: what the generator ranks receive
from other ranks (ours: counted at the all-to-all, equal to the plans' ``bytes_moved``; the others:
their tensors' sizes, by construction). Calls: the torch.distributed communications one rank issues
per refit (ours counted; the others by construction, per tensor: DTensor's gather hops + 1).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_refit.py --out benchmarks/results/refit.jsonl
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_refit"
SERIES = ("fm.reshard", "gather + broadcast", "ppermute bridge")


def worker(rank: int, world: int, port: int, dim: int, reps: int, warmup: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import functional_mesh as fm
    from functional_mesh import NamedSharding, _torch

    sys.path.insert(0, str(R.REPO / "examples"))
    import refit as ex

    H.init_gloo(rank, world, port)
    torch.set_num_threads(1)
    state = ex.transformer_state(3, dim, dim * 5 // 2, dim * 2)
    all8 = fm.make_mesh((8,), ("r",))
    trainer = all8.take(r=slice(0, 4)).unflatten("r", {"dp_shard": 2, "tp": 2})
    generator = all8.take(r=slice(4, 8)).unflatten("r", {"dp": 2, "tp": 2})
    bridge = fm.realize(fm.make_mesh((2, 4), ("side", "i")))  # every rank: [[0..3], [4..7]]
    fan = fm.Mesh.from_ranks([0, 4, 5, 6, 7], ("bc",))
    rm_t = fm.realize(trainer, members_only=True) if rank < 4 else None
    rm_g = fm.realize(generator, members_only=True) if rank >= 4 else None
    rm_b = fm.realize(fan, members_only=True) if rank in (0, 4, 5, 6, 7) else None
    x = ex.trainer_values(state, trainer, rm_t)
    dst = ex.generator_shardings(state, generator)
    blocks = {n: d.local_slices(s[0], rank) for n, (d, s) in zip(dst, zip(dst.values(), state.values()))}

    def ours() -> Any:
        return fm.reshard(x, dst, mesh=rm_g)

    def as_dtensors(local: dict[str, Any]) -> Any:
        if rm_g is None:
            return None
        return {n: DTensor.from_local(t, rm_g.device_mesh, dst[n].placements, run_check=False, shape=state[n][0],
                                      stride=torch.empty(state[n][0], device="meta").stride())
                for n, t in local.items()}

    def gather_broadcast() -> Any:
        local = {}
        for name, (shape, dtype, _, _) in state.items():
            if rank in (1, 2, 3):
                x[name].full_tensor()
                continue
            full = x[name].full_tensor() if rank == 0 else torch.empty(shape, dtype=dtype)
            dist.broadcast(full, src=0, group=rm_b.group("bc"))
            if rank >= 4:
                local[name] = full[blocks[name]].contiguous()
        return as_dtensors(local)

    def ppermute_bridge() -> Any:
        local = {}
        for name, (shape, dtype, _, spec) in state.items():
            if rank < 4:
                block = fm.reshard(x[name], NamedSharding(trainer, spec)).to_local()
            else:
                block = torch.zeros([s.stop - s.start for s in blocks[name]], dtype=dtype)
            got = fm.ppermute(block, "side", [(0, 1)], mesh=bridge)
            if rank >= 4:
                local[name] = got
        return as_dtensors(local)

    sides = {SERIES[0]: ours, SERIES[1]: gather_broadcast, SERIES[2]: ppermute_bridge}
    results = {name: fn() for name, fn in sides.items()}
    if rank >= 4:  # the three agree, bit for bit, before anything is timed
        for name in SERIES[1:]:
            for n in state:
                if not torch.equal(results[name][n].to_local(), results[SERIES[0]][n].to_local()):
                    raise RuntimeError(f"rank {rank}: {name} differs from fm.reshard on {n}")
    sent, calls = [0], [0]
    real = _torch.all_to_all_start

    def counted(buf: Any, out_splits: Any, in_splits: Any, group: Any) -> Any:
        sent[0] += sum(n for j, n in enumerate(in_splits) if j != group.rank())  # not the byte to itself
        calls[0] += 1
        return real(buf, out_splits, in_splits, group)

    _torch.all_to_all_start = counted
    ours()
    _torch.all_to_all_start = real
    samples = H.rotated_samples(sides, reps, warmup)
    nbytes = {n: torch.Size(s).numel() * d.itemsize for n, (s, d, _, _) in state.items()}
    into_generator = {
        SERIES[1]: 4 * sum(nbytes.values()),  # every generator rank receives every full tensor
        SERIES[2]: sum(nbytes[n] * (4 if dst[n].spec == fm.P() else 2) for n in state),  # each generator rank
    }                                                                                     # its block
    calls_by_construction = {  # on a trainer rank, per tensor: DTensor's gather hops, then the send
        SERIES[1]: sum(sum(1 for p in x[n].placements if not p.is_replicate()) + 1 for n in state) if rank < 4 else 0,
        SERIES[2]: 2 * len(state) if rank < 4 else 0,  # one all-gather over dp_shard, one ppermute
    }
    dist.barrier()
    fm.clear_cache()
    dist.destroy_process_group()
    return {"samples": samples, "sent": sent[0], "calls": calls[0], "into_generator": into_generator,
            "tensors": len(state), "total": sum(nbytes.values()), "by_construction": calls_by_construction}


def main() -> int:
    H.serve({"refit": worker})
    p = H.parser(__doc__, "10 repetitions")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--reps", type=int, help="timed repetitions per series (default 30; quick 10)")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    reps = args.reps or (10 if args.quick else 30)
    run, t0 = H.start_run(BENCH), time.perf_counter()
    ranks = H.run_pool(__file__, {"fn": "refit", "dim": args.dim, "reps": reps, "warmup": args.warmup}, 8)
    first = ranks[0]
    row = f"W=8, dim {args.dim}: {first['tensors']} tensors, {R.fmt(first['total'], 'B')}"
    records: list[Any] = [
        R.Table(BENCH, "time", "refit of a state dict, trainer ranks 0-3 -> generator ranks 4-7 (gloo)", "state dict",
                ((SERIES[1], SERIES[0], "gather+broadcast / ours"), (SERIES[2], SERIES[0], "bridge / ours"))),
        R.Table(BENCH, "traffic", "bytes into the generator ranks and communications per refit", "side"),
    ]
    records += R.slowest_and_paired(BENCH, "time", [[{"row": row, "samples": r["samples"]}] for r in ranks], SERIES)
    ours_bytes = sum(r["sent"] for r in ranks)
    calls = {SERIES[0]: max(r["calls"] for r in ranks),
             **{side: max(r["by_construction"][side] for r in ranks) for side in SERIES[1:]}}
    for side in SERIES:
        nbytes = ours_bytes if side == SERIES[0] else first["into_generator"][side]
        records.append(R.Result(BENCH, "traffic", side, "bytes into generator ranks", nbytes, "B"))
        records.append(R.Result(BENCH, "traffic", side, "communications per trainer rank", calls[side], "n"))
    notes = [H.revision(), "bytes and communications: ours counted at the all-to-all (bytes = the plans' "
             "bytes_moved); the others by construction (tensor sizes; DTensor gather hops + 1 send per tensor)"]
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, notes), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
