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
    out = []
    for k, v in region.items():
        out.append(R.measured(BENCH, "region", "region call (200 torch ops)", k, v))
        out.append(R.measured(BENCH, "region", "per torch op (call / 200)", k, [s / 200 for s in v]))

    dm, placements = tp.device_mesh, x.placements
    ident = {c: fm.shard_map(lambda a: a, in_specs=P("tp"), out_specs=P("tp"), mesh=tp, check_vma=c)
             for c in (True, False)}
    boundary = timed({
        "to_local + from_local": lambda: DTensor.from_local(x.to_local(), dm, placements, run_check=False),
        "typed": lambda: ident[True](x), "untyped": lambda: ident[False](x)}, reps, warmup, 10)
    out += [R.measured(BENCH, "boundary", "identity region, one (32, 16) DTensor P('tp')", k, v)
            for k, v in boundary.items()]
    return out


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
    args = p.parse_args()
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
    for what, rows in (("collectives", lambda: collective_rows(rm, reps, warmup)),
                       ("regions", lambda: region_rows(tp, reps, warmup)),
                       ("block, small", lambda: block_rows(tp, "small", reps, warmup)),
                       ("block, medium", lambda: block_rows(tp, "medium", max(5, reps // 10), 3))):
        print(f"{what} ...", file=sys.stderr, flush=True)
        records += rows()
    notes = [tree, "fake backend: collectives carry no data (values meaningless), their dispatch is real"]
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, notes), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
