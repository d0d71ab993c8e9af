#!/usr/bin/env python
"""Eager dispatch: what our collectives, regions and a TP + SP block cost over the torch they run.

Rank 0 of a world of 8 under torch's single-process fake backend (``_harness.init_fake``):
collectives carry no data, so the values mean nothing, but every figure is the Python and
dispatcher cost a real job pays on top of its communication. Mesh ``(2, 4)`` ``("dp", "tp")``;
regions and the block run on its ``tp`` selection; float32. The parts (``--only``):

- collectives: each ``fm`` collective against the raw c10d call it makes (bench_collectives.pairs), 4 KB, 4 MB;
- regions: ``h = tanh(h * w)`` 100 times on an 8 x 16 shard (DTensors ``(32, 16)``, ``P("tp")``) in a
  typed and an untyped ``fm.shard_map`` against the plain body on the local shards; an identity
  region's boundary against ``to_local`` + ``DTensor.from_local``;
- mixed: the body 50 times with ``w`` an invariant weight (``P()``): each ``h * w`` meets two types,
  so the region casts ``w`` (once: the cast is reused);
- unreduced: ``y = pcast(h @ w, "tp", to="unreduced")``, a few linear ops on the pending sum, then
  ``psum_scatter``; against the same ops by hand with ``fm.psum_scatter`` (skipped, with a note,
  where ``to="unreduced"`` is refused);
- block: a Megatron tensor + sequence parallel transformer block, forward and backward, in
  ``fm.shard_map`` typed and untyped, against the block by hand: raw c10d calls in
  ``autograd.Function``s, as a Megatron user writes them, and fm collectives.

Series of one row rotate their order every repetition (``_harness.rotated_samples``, no barrier,
the cyclic GC off); a sample is this process's CPU time per call over a block of calls; figures
are medians of one run, ratios divide them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_eager.py --quick
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R
import torch
from _tp_block import BLOCK, SHAPES, block_calls, torch_calls
from bench_collectives import SIZES, pairs
from torch.distributed.tensor import DTensor

import functional_mesh as fm
from functional_mesh import P

BENCH = "bench_eager"
RAW, RAW2 = "raw", "raw, 2nd series"
PARTS = ("collectives", "regions", "mixed", "unreduced", "block")  # --only


def timed(calls: dict[str, Any], reps: int, warmup: int, number: int = 1) -> dict[str, list[float]]:
    """Interleaved samples in CPU time (one process, nothing to wait for; less moved by other jobs)."""
    return H.rotated_samples(calls, reps, warmup, number=number, barrier=False, clock=time.process_time_ns)


def collective_rows(rm: Any, reps: int, warmup: int) -> list[R.Result]:
    out = []
    for nbytes in SIZES:
        for name, (ours, raw) in pairs(rm, "tp", nbytes).items():
            samples = timed({"fm": ours, RAW: raw, RAW2: raw}, reps, warmup, 10 if nbytes < 1 << 20 else 1)
            out += [R.measured(BENCH, "collectives", f"{name}, {R.fmt(nbytes, 'B')}", k, v) for k, v in samples.items()]
    return out


def per_op(bench_rows: dict[str, list[float]], table: str, what: str, ops: int) -> list[R.Result]:
    """A call's samples, and the same divided by its number of torch ops (µs per op)."""
    out = []
    for k, v in bench_rows.items():
        out.append(R.measured(BENCH, table, f"region call ({what}, {ops} torch ops)", k, v))
        out.append(R.measured(BENCH, table, f"per torch op (call / {ops})", k, [s / ops for s in v]))
    return out


def randn(tp: Any, seed: int, *shaped: tuple[tuple[int, ...], Any]) -> list[Any]:
    """DTensors on ``tp`` of the global shapes and specs ``shaped``, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [fm.distribute(torch.randn(*shape, generator=g), fm.NamedSharding(tp.mesh, spec), mesh=tp)
            for shape, spec in shaped]


def three_sides(tp: Any, body: Any, args: list[Any], specs: tuple[Any, ...], plain: Any, reps: int,
                warmup: int) -> dict[str, list[float]]:
    """``plain()`` against ``body`` in a typed and an untyped region over ``args``."""
    typed, untyped = (fm.shard_map(body, in_specs=specs, out_specs=P("tp"), mesh=tp, check_vma=c) for c in (True, False))
    return timed({"plain": plain, "typed": lambda: typed(*args), "untyped": lambda: untyped(*args)}, reps, warmup)


def tanh_loop(k: int) -> Any:
    """``h = tanh(h * w)`` ``k`` times: ``2 k`` torch ops."""
    def body(h: Any, w: Any) -> Any:
        for _ in range(k):
            h = torch.tanh(h * w)
        return h
    return body


def region_rows(tp: Any, reps: int, warmup: int) -> list[R.Result]:
    x, w = randn(tp, 0, ((32, 16), P("tp")), ((32, 16), P("tp")))
    xl, wl, body = x.to_local(), w.to_local(), tanh_loop(100)
    out = per_op(three_sides(tp, body, [x, w], (P("tp"), P("tp")), lambda: body(xl, wl), reps, warmup),
                 "region", "one type", 200)
    dm, placements = tp.device_mesh, x.placements
    ident = {c: fm.shard_map(lambda a: a, in_specs=P("tp"), out_specs=P("tp"), mesh=tp, check_vma=c)
             for c in (True, False)}
    boundary = timed({
        "to_local + from_local": lambda: DTensor.from_local(x.to_local(), dm, placements, run_check=False),
        "typed": lambda: ident[True](x), "untyped": lambda: ident[False](x)}, reps, warmup, 10)
    return out + [R.measured(BENCH, "boundary", "identity region, one (32, 16) DTensor P('tp')", k, v)
                  for k, v in boundary.items()]


def mixed_rows(tp: Any, reps: int, warmup: int) -> list[R.Result]:
    x, w = randn(tp, 1, ((32, 16), P("tp")), ((8, 16), P()))  # w invariant: half the ops meet two types
    xl, wl, body = x.to_local(), w.to_local(), tanh_loop(50)
    return per_op(three_sides(tp, body, [x, w], (P("tp"), P()), lambda: body(xl, wl), reps, warmup),
                  "mixed", "invariant w", 100)


def row_parallel(h: Any, w: Any, pcast: Any, scatter: Any) -> Any:
    """A row-parallel matmul kept a pending sum through a few linear ops, then reduce-scattered."""
    y = pcast(h @ w)  # this member's term of the sum
    y = (y * 0.5 + y).T.contiguous().T * 2.0
    return scatter(y)


def unreduced_missing(tp: Any) -> str | None:
    """Why ``fm.pcast(x, axis, to="unreduced")`` cannot run here (``None``: it can)."""
    try:
        fm.shard_map(lambda h: fm.psum(fm.pcast(h, "tp", to="unreduced"), "tp"), in_specs=P("tp"), out_specs=P(),
                     mesh=tp)(torch.ones(8))
    except (fm.MeshError, TypeError) as error:
        return str(error).split(";")[0]
    return None


def unreduced_rows(tp: Any, reps: int, warmup: int) -> list[R.Result]:
    """The row-parallel body typed (unreduced), untyped (pcast is the identity) and by hand on the local shards."""
    # h (S, F) = (64, 64) split by columns, w (F, D) = (64, 32) by rows: local (64, 16) @ (16, 32)
    h, w = randn(tp, 2, ((64, 64), P(None, "tp")), ((64, 32), P("tp")))
    hl, wl = h.to_local(), w.to_local()

    def body(h: Any, w: Any) -> Any:
        return row_parallel(h, w, lambda t: fm.pcast(t, "tp", to="unreduced"), lambda t: fm.psum_scatter(t, "tp"))

    def by_hand() -> Any:
        return row_parallel(hl, wl, lambda t: t, lambda t: fm.psum_scatter(t, "tp", mesh=tp))

    ops = torch_calls(by_hand) + 1  # what a typed region dispatches on: these and the pcast
    return per_op(three_sides(tp, body, [h, w], (P(None, "tp"), P("tp")), by_hand, reps, warmup),
                  "unreduced", "row parallel", ops)


def block_rows(tp: Any, shape: str, reps: int, warmup: int) -> list[R.Result]:
    calls, hand_fm = block_calls(tp, shape)
    row = f"{shape}: (B, S, D, F, heads) = {SHAPES[shape]}"
    samples = timed(calls, reps, warmup)
    return [*(R.measured(BENCH, "block", row, k, v) for k, v in samples.items()),
            R.Result(BENCH, "block", row, "torch functions in the forward", torch_calls(hand_fm), "n")]


def main() -> int:
    p = H.parser(__doc__, "fewer repetitions (about 30 s)")
    p.add_argument("--reps", type=int, help="repetitions per row (default 300; quick 50); the medium block: 1/10")
    p.add_argument("--only", help=f"comma-separated parts to run (default all): {', '.join(PARTS)}")
    args = p.parse_args()
    only = PARTS if args.only is None else tuple(args.only.split(","))
    if set(only) - set(PARTS):
        p.error(f"--only takes parts among {', '.join(PARTS)}, but got {args.only}")
    reps = args.reps or (50 if args.quick else 300)
    warmup = 5 if args.quick else 20
    run, t0, tree = H.start_run(BENCH), time.perf_counter(), H.revision()
    H.init_fake(8, 0)
    torch.set_num_threads(1)
    rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    tp = rm["tp"]
    by_fm = ("fm", RAW, "fm / raw"), (RAW2, RAW, "noise floor: 2nd series / raw")
    vs_plain = (("typed", "plain", "typed / plain"), ("untyped", "plain", "untyped / plain")), (
        ("typed", "plain", "typed − plain"), ("untyped", "plain", "untyped − plain"))
    dtensor = "to_local + from_local"
    records: list[Any] = [
        R.Table(BENCH, "collectives", "Each collective vs the raw c10d call it makes (fake backend, axis tp of 4)",
                "collective, tensor", by_fm, (("fm", RAW, "fm − raw"),)),
        R.Table(BENCH, "region", "100 × tanh(h * w) on an 8 × 16 shard, in a region vs plain torch", "figure", *vs_plain),
        R.Table(BENCH, "mixed", "50 × tanh(h * w), w invariant (P()): operands of two types, in a region vs plain "
                "torch", "figure", *vs_plain),
        R.Table(BENCH, "unreduced", "Row-parallel matmul kept a pending sum (pcast to='unreduced'), linear ops, "
                "psum_scatter; in a region vs the same ops by hand", "figure", *vs_plain),
        R.Table(BENCH, "boundary", "An identity region's boundary vs to_local + from_local", "region",
                (("typed", dtensor, "typed / DTensor"), ("untyped", dtensor, "untyped / DTensor")),
                (("typed", dtensor, "typed − DTensor"),)),
        R.Table(BENCH, "block", "TP + SP transformer block, forward + backward, vs the same block by hand", "shape",
                ((BLOCK[3], BLOCK[0], "typed / hand"), (BLOCK[4], BLOCK[0], "untyped / hand"),
                 (BLOCK[3], BLOCK[2], "typed / hand with DTensors"), (BLOCK[4], BLOCK[2], "untyped / hand with DTensors"),
                 (BLOCK[1], BLOCK[0], "hand fm / hand raw")), ((BLOCK[3], BLOCK[0], "typed − hand"),))]
    notes = [tree, "fake backend: collectives carry no data (values meaningless), their dispatch is real"]
    missing = unreduced_missing(tp) if "unreduced" in only else None
    if missing is not None:
        notes.append(f"unreduced row parallel: skipped, fm.pcast(x, axis, to='unreduced') is refused here ({missing})")
    for part, what, rows in (("collectives", "collectives", lambda: collective_rows(rm, reps, warmup)),
                             ("regions", "regions", lambda: region_rows(tp, reps, warmup)),
                             ("mixed", "mixed types", lambda: mixed_rows(tp, reps, warmup)),
                             ("unreduced", "unreduced", lambda: [] if missing else unreduced_rows(tp, reps, warmup)),
                             ("block", "block, small", lambda: block_rows(tp, "small", reps, warmup)),
                             ("block", "block, medium", lambda: block_rows(tp, "medium", max(5, reps // 10), 3))):
        if part in only:
            print(f"{what} ...", file=sys.stderr, flush=True)
            records += rows()
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, notes), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
