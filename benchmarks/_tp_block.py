"""A Megatron tensor + sequence parallel transformer block, written the ways bench_eager times it.

One pre-norm block (attention and MLP) on a rank's sequence shard: ``all_gather`` of S before the
column-parallel matmuls, ``psum_scatter`` after the row-parallel ones. :func:`block_calls` gives one
training step (forward and backward) per way, in :data:`BLOCK` order: by hand with raw c10d calls in
``autograd.Function``s (as a Megatron user writes them), by hand with fm collectives, by hand with
DTensors in and out, and in ``fm.shard_map`` typed and untyped. ``tests/fake/test_bench_verdicts.py``
checks that every way makes the same ``torch.distributed`` calls.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

import functional_mesh as fm
from functional_mesh import P

BLOCK = ("hand, raw c10d", "hand, fm collectives", "hand, raw c10d, DTensor in and out", "shard_map typed",
         "shard_map untyped")
SHAPES = {"small": (4, 16, 32, 64, 4), "medium": (8, 256, 256, 1024, 8)}  # (B, S, D, F, heads)


def _seq(x: Any, group: Any, n: int, gather: bool) -> Any:
    """All-gather (``gather``) or reduce-scatter of dim 0 over ``group`` of ``n``, into a new tensor."""
    out = x.new_empty((n * x.shape[0] if gather else x.shape[0] // n, *x.shape[1:]))
    (dist.all_gather_into_tensor if gather else dist.reduce_scatter_tensor)(out, x.contiguous(), group=group)
    return out


class SeqComm(torch.autograd.Function):
    """Megatron's sequence-parallel pair: all-gather of dim 0 (``gather``), reduce-scatter back; or the reverse."""

    @staticmethod
    def forward(ctx: Any, x: Any, group: Any, n: int, gather: bool) -> Any:
        ctx.group, ctx.n, ctx.gather = group, n, gather
        return _seq(x, group, n, gather)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return _seq(grad, ctx.group, ctx.n, not ctx.gather), None, None, None


class _Count(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


def torch_calls(fn: Any) -> int:
    """How many torch functions ``fn()`` calls (what a typed region dispatches on)."""
    with _Count() as count:
        count.calls = 0
        fn()
    return count.calls


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
        return block(*args, lambda t: SeqComm.apply(t, group, n, True), lambda t: SeqComm.apply(t, group, n, False), hl)

    def raw_dtensor() -> Any:  # what DTensor parameters cost by hand: to_local in, from_local out
        y = raw_block(*(t.to_local() for t in dts))
        return DTensor.from_local(y, tp.device_mesh, dts[0].placements, run_check=False)

    mapped = {c: fm.shard_map(fm_block, in_specs=specs, out_specs=P("tp"), mesh=tp, check_vma=c) for c in (True, False)}
    calls = {BLOCK[0]: step(local, lambda: raw_block(*local)), BLOCK[1]: step(local, hand_fm),
             BLOCK[2]: step(dts, raw_dtensor), BLOCK[3]: step(dts, lambda: mapped[True](*dts)),
             BLOCK[4]: step(dts, lambda: mapped[False](*dts))}
    return calls, hand_fm
