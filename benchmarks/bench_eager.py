#!/usr/bin/env python
"""Eager dispatch: what our collectives, regions and a TP + SP block cost over the torch they run.

One process, rank 0 of a world of 8 under torch's single-process fake backend
(``_harness.init_fake``): collectives carry no data, so the values are meaningless but every
figure is the Python and dispatcher cost a real job pays on top of its communication. Mesh
``(2, 4)`` ``("dp", "tp")``, axis ``tp``; regions and the block run on its ``tp`` selection. float32.

- collectives: each ``fm`` collective against the raw c10d call it makes (bench_collectives.pairs),
  4 KB and 4 MB;
- region: ``h = tanh(h * w)`` 100 times on an 8 x 16 shard (DTensors ``(32, 16)``, ``P("tp")``) in
  ``fm.shard_map`` typed and untyped, against the plain body on the local shards; and an identity
  region's boundary against ``to_local`` + ``DTensor.from_local``;
- mixed types: the same body 50 times (100 ops) with ``w`` an invariant weight (``P()``, an 8 x 16
  DTensor): every ``h * w`` meets a varying and an invariant operand, so the region casts ``w``
  (once: the cast is reused);
- unreduced row parallel: ``y = pcast(h @ w, "tp", to="unreduced")`` (``h`` split by columns,
  ``w`` by rows), a few linear ops on the pending sum, ``psum_scatter`` over ``tp``; against the
  same ops on the local shards with ``fm.psum_scatter`` outside any region (skipped, with a note,
  on a tree without ``to="unreduced"``);
- block: a Megatron tensor + sequence parallel transformer block (attention and MLP, forward and
  backward; ``all_gather`` of S before the column-parallel matmuls, ``psum_scatter`` after the
  row-parallel ones) in ``fm.shard_map`` typed and untyped, against the same block by hand: raw
  c10d calls in ``autograd.Function``s, as a Megatron user writes them, and fm collectives.

Series of one row rotate their order every repetition (``_harness.rotated_samples``, no barrier),
the cyclic GC off; a sample is this process's CPU time per call over a block of calls; figures are
medians of the same run, ratios divide them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_eager.py --quick
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R
import torch
import torch.distributed as dist
import torch.nn.functional as F
from bench_collectives import SIZES, pairs
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

import functional_mesh as fm
from functional_mesh import P

BENCH = "bench_eager"
RAW, RAW2 = "raw", "raw, 2nd series"
BLOCK = ("hand, raw c10d", "hand, fm collectives", "hand, raw c10d, DTensor in and out", "shard_map typed",
         "shard_map untyped")
SHAPES = {"small": (4, 16, 32, 64, 4), "medium": (8, 256, 256, 1024, 8)}  # (B, S, D, F, heads)
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


def region_rows(tp: Any, reps: int, warmup: int) -> list[R.Result]:
    g = torch.Generator().manual_seed(0)
    sharding = fm.NamedSharding(tp.mesh, P("tp"))
    x, w = (fm.distribute(torch.randn(32, 16, generator=g), sharding, mesh=tp) for _ in range(2))
    xl, wl = x.to_local(), w.to_local()

    def body(h: Any, w: Any) -> Any:
        for _ in range(100):
            h = torch.tanh(h * w)
        return h

    typed, untyped = (fm.shard_map(body, in_specs=(P("tp"), P("tp")), out_specs=P("tp"), mesh=tp, check_vma=c)
                      for c in (True, False))
    region = timed({"plain": lambda: body(xl, wl), "typed": lambda: typed(x, w), "untyped": lambda: untyped(x, w)},
                   reps, warmup)
    out = per_op(region, "region", "one type", 200)

    dm, placements = tp.device_mesh, x.placements
    ident = {c: fm.shard_map(lambda a: a, in_specs=P("tp"), out_specs=P("tp"), mesh=tp, check_vma=c)
             for c in (True, False)}
    boundary = timed({
        "to_local + from_local": lambda: DTensor.from_local(x.to_local(), dm, placements, run_check=False),
        "typed": lambda: ident[True](x), "untyped": lambda: ident[False](x)}, reps, warmup, 10)
    out += [R.measured(BENCH, "boundary", "identity region, one (32, 16) DTensor P('tp')", k, v)
            for k, v in boundary.items()]
    return out


def mixed_body(h: Any, w: Any) -> Any:
    """100 torch ops, half of them with a varying and an invariant operand (``w``)."""
    for _ in range(50):
        h = torch.tanh(h * w)
    return h


def mixed_rows(tp: Any, reps: int, warmup: int) -> list[R.Result]:
    g = torch.Generator().manual_seed(1)
    x = fm.distribute(torch.randn(32, 16, generator=g), fm.NamedSharding(tp.mesh, P("tp")), mesh=tp)
    w = fm.distribute(torch.randn(8, 16, generator=g), fm.NamedSharding(tp.mesh, P()), mesh=tp)  # invariant
    xl, wl = x.to_local(), w.to_local()
    typed, untyped = (fm.shard_map(mixed_body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=tp, check_vma=c)
                      for c in (True, False))
    samples = timed({"plain": lambda: mixed_body(xl, wl), "typed": lambda: typed(x, w),
                     "untyped": lambda: untyped(x, w)}, reps, warmup)
    return per_op(samples, "mixed", "invariant w", 100)


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
    g = torch.Generator().manual_seed(2)
    seq, f, d = 64, 64, 32  # h (S, F) split by columns, w (F, D) by rows: local (64, 16) @ (16, 32)
    h = fm.distribute(torch.randn(seq, f, generator=g), fm.NamedSharding(tp.mesh, P(None, "tp")), mesh=tp)
    w = fm.distribute(torch.randn(f, d, generator=g), fm.NamedSharding(tp.mesh, P("tp")), mesh=tp)
    hl, wl = h.to_local(), w.to_local()

    def body(h: Any, w: Any) -> Any:
        return row_parallel(h, w, lambda t: fm.pcast(t, "tp", to="unreduced"), lambda t: fm.psum_scatter(t, "tp"))

    def by_hand() -> Any:
        return row_parallel(hl, wl, lambda t: t, lambda t: fm.psum_scatter(t, "tp", mesh=tp))

    typed, untyped = (fm.shard_map(body, in_specs=(P(None, "tp"), P("tp")), out_specs=P("tp"), mesh=tp, check_vma=c)
                      for c in (True, False))
    with _Count() as count:
        by_hand()
    ops = count.calls + 1  # what a typed region dispatches on: these and the pcast
    samples = timed({"plain": by_hand, "typed": lambda: typed(h, w), "untyped": lambda: untyped(h, w)}, reps, warmup)
    return per_op(samples, "unreduced", "row parallel", ops)


def _seq(x: Any, group: Any, n: int, gather: bool) -> Any:
    """All-gather (``gather``) or reduce-scatter of dim 0 over ``group`` of ``n``, into a new tensor."""
    out = x.new_empty((n * x.shape[0] if gather else x.shape[0] // n, *x.shape[1:]))
    (dist.all_gather_into_tensor if gather else dist.reduce_scatter_tensor)(out, x.contiguous(), group=group)
    return out


class GatherSeq(torch.autograd.Function):
    """Megatron's gather from the sequence-parallel region: all-gather of dim 0, reduce-scatter back."""

    @staticmethod
    def forward(ctx: Any, x: Any, group: Any, n: int) -> Any:
        ctx.group, ctx.n = group, n
        return _seq(x, group, n, True)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return _seq(grad, ctx.group, ctx.n, False), None, None


class ScatterSeq(torch.autograd.Function):
    """Megatron's reduce-scatter to the sequence-parallel region, all-gather back."""

    @staticmethod
    def forward(ctx: Any, x: Any, group: Any, n: int) -> Any:
        ctx.group, ctx.n = group, n
        return _seq(x, group, n, False)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return _seq(grad, ctx.group, ctx.n, True), None, None


class _Count(TorchFunctionMode):
    """Counts the torch functions a region would see (what a typed region dispatches on)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def block(x: Any, wqkv: Any, wo: Any, w1: Any, w2: Any, gather: Any, scatter: Any, heads: int) -> Any:
    """One pre-norm transformer block on this rank's shard; ``x (S/n, B, D)``, ``heads`` local heads."""
    d = x.shape[-1]
    h = gather(F.layer_norm(x, (d,)))  # (S, B, D)
    s, b = h.shape[0], h.shape[1]
    q, k, v = (t.reshape(s, b * heads, -1).transpose(0, 1) for t in (h @ wqkv).chunk(3, dim=-1))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(s, b, -1)
    x = x + scatter(a @ wo)
    h = gather(F.layer_norm(x, (d,)))
    return x + scatter(F.gelu(h @ w1) @ w2)


def block_calls(tp: Any, shape: str) -> tuple[dict[str, Any], Any]:
    """The block's series, one training step each (``BLOCK`` order), and its forward with fm collectives."""
    bsz, seq, d, f, heads = SHAPES[shape]
    n, group = tp.axis_size("tp"), tp.group("tp")
    hl = heads // n
    g = torch.Generator().manual_seed(0)
    specs = (P("tp"), P(None, "tp"), P("tp", None), P(None, "tp"), P("tp", None))
    full = [torch.randn(*s, generator=g) / s[-1] ** 0.5 for s in ((seq, bsz, d), (d, 3 * d), (d, d), (d, f), (f, d))]
    dts = [fm.distribute(t, fm.NamedSharding(tp.mesh, p), mesh=tp).requires_grad_() for t, p in zip(full, specs)]
    local = [t.to_local().detach().clone().requires_grad_() for t in dts]

    def fm_block(x: Any, *ws: Any) -> Any:
        return block(x, *ws, lambda t: fm.all_gather(t, "tp"), lambda t: fm.psum_scatter(t, "tp"), hl)

    def step(params: list[Any], forward: Any) -> Any:
        def run() -> None:
            for p in params:
                p.grad = None  # zero_grad(set_to_none=True): no accumulation into old gradients
            y = forward()
            y = y.to_local() if hasattr(y, "to_local") else y
            (y * y).sum().backward()
        return run

    def hand_fm() -> Any:
        with tp:
            return fm_block(*local)

    def raw_block(*args: Any) -> Any:
        return block(*args, lambda t: GatherSeq.apply(t, group, n), lambda t: ScatterSeq.apply(t, group, n), hl)

    def raw_dtensor() -> Any:  # what DTensor parameters cost by hand: to_local in, from_local out
        y = raw_block(*(t.to_local() for t in dts))
        return DTensor.from_local(y, tp.device_mesh, dts[0].placements, run_check=False)

    mapped = {c: fm.shard_map(fm_block, in_specs=specs, out_specs=P("tp"), mesh=tp, check_vma=c) for c in (True, False)}
    calls = {BLOCK[0]: step(local, lambda: raw_block(*local)), BLOCK[1]: step(local, hand_fm),
             BLOCK[2]: step(dts, raw_dtensor), BLOCK[3]: step(dts, lambda: mapped[True](*dts)),
             BLOCK[4]: step(dts, lambda: mapped[False](*dts))}
    return calls, hand_fm


def block_rows(tp: Any, shape: str, reps: int, warmup: int) -> list[R.Result]:
    calls, hand_fm = block_calls(tp, shape)
    row = f"{shape}: (B, S, D, F, heads) = {SHAPES[shape]}"
    samples = timed(calls, reps, warmup)
    out = [R.measured(BENCH, "block", row, k, v) for k, v in samples.items()]

    with _Count() as count:
        hand_fm()
    out.append(R.Result(BENCH, "block", row, "torch functions in the forward", count.calls, "n"))
    return out


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
    records: list[Any] = [
        R.Table(BENCH, "collectives", "Each collective vs the raw c10d call it makes (fake backend, axis tp of 4)",
                "collective, tensor", by_fm, (("fm", RAW, "fm − raw"),)),
        R.Table(BENCH, "region", "100 × tanh(h * w) on an 8 × 16 shard, in a region vs plain torch",
                "figure", (("typed", "plain", "typed / plain"), ("untyped", "plain", "untyped / plain")),
                (("typed", "plain", "typed − plain"), ("untyped", "plain", "untyped − plain"))),
        R.Table(BENCH, "mixed", "50 × tanh(h * w), w invariant (P()): operands of two types, in a region vs plain "
                "torch", "figure", (("typed", "plain", "typed / plain"), ("untyped", "plain", "untyped / plain")),
                (("typed", "plain", "typed − plain"), ("untyped", "plain", "untyped − plain"))),
        R.Table(BENCH, "unreduced", "Row-parallel matmul kept a pending sum (pcast to='unreduced'), linear ops, "
                "psum_scatter; in a region vs the same ops by hand", "figure",
                (("typed", "plain", "typed / plain"), ("untyped", "plain", "untyped / plain")),
                (("typed", "plain", "typed − plain"), ("untyped", "plain", "untyped − plain"))),
        R.Table(BENCH, "boundary", "An identity region's boundary vs to_local + from_local", "region",
                (("typed", "to_local + from_local", "typed / DTensor"),
                 ("untyped", "to_local + from_local", "untyped / DTensor")),
                (("typed", "to_local + from_local", "typed − DTensor"),)),
        R.Table(BENCH, "block", "TP + SP transformer block, forward + backward, vs the same block by hand",
                "shape", ((BLOCK[3], BLOCK[0], "typed / hand"), (BLOCK[4], BLOCK[0], "untyped / hand"),
                          (BLOCK[3], BLOCK[2], "typed / hand with DTensors"),
                          (BLOCK[4], BLOCK[2], "untyped / hand with DTensors"),
                          (BLOCK[1], BLOCK[0], "hand fm / hand raw")),
                ((BLOCK[3], BLOCK[0], "typed − hand"),))]
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
