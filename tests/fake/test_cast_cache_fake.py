"""The implicit cast of a typed region is made once per tensor (torch's single-process fake backend).

An operand invariant over an axis that meets one varying over it is cast (``pvary``: identity
forward, ``psum`` backward). A region casts a tensor once and reuses the cast while the tensor is
unchanged, so a weight used k times makes one ``psum`` in backward, of its k cotangents summed,
not k of them. What is counted here is what torch's c10d dispatches (a ``TorchDispatchMode`` that
sees every ``c10d::`` op, however it was called); nothing in ``torch.distributed`` is replaced.
Values on real workers, against one process: tests/dist/test_cast_once_gloo.py.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.utils._python_dispatch import TorchDispatchMode

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions


@pytest.fixture
def rm(fake_world):
    """Rank 5 of a fake world of 8, mesh (dp, tp) = (2, 4); nothing is left behind."""
    fake_world(8, 5)
    return fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))


class C10d(TorchDispatchMode):
    """The c10d ops dispatched while active: (name, group ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            from torch._C._distributed_c10d import ProcessGroup

            groups = [ProcessGroup.unbox(a) for a in args
                      if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type())]
            self.calls.append((func.name(), tuple(dist.get_process_group_ranks(groups[0])) if groups else ()))
        return func(*args, **(kwargs or {}))

    def all_reduces(self) -> list[tuple[int, ...]]:
        return [ranks for name, ranks in self.calls if name.startswith("c10d::allreduce")]

    def functional_all_reduces(self) -> int:
        """All-reduces by group name (what compiled code calls; the group is an argument by name)."""
        return sum(name.startswith("_c10d_functional::all_reduce") for name, _ in self.calls)


def backward_all_reduces(y: torch.Tensor) -> list[tuple[int, ...]]:
    with C10d() as seen:
        y.to_local().sum().backward()
    return seen.all_reduces()


TP_GROUP = (4, 5, 6, 7)  # rank 5's tp group


@pytest.mark.parametrize("uses", [1, 2, 5])
def test_an_invariant_weight_used_k_times_makes_one_psum_in_backward(rm, uses):
    def body(h, w):
        for _ in range(uses):
            h = torch.tanh(h * w)  # w: invariant over tp, h varies over it
        return h

    x = torch.randn(16, 8)
    w = torch.randn(4, 8, requires_grad=True)
    y = fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)(x, w)
    assert backward_all_reduces(y) == [TP_GROUP]
    assert w.grad is not None and w.grad.shape == w.shape


def test_every_kind_of_flat_op_and_keyword_operand_shares_the_one_cast(rm):
    """Binary ops, matmul, F.linear with the weight and bias positional or by keyword, a where."""
    def body(h, w, b):
        h = h @ w + b
        h = torch.nn.functional.linear(h, w, b)
        h = torch.nn.functional.linear(h, weight=w, bias=b)
        h = torch.where(h > 0, h, b)
        return h * w.sum() + torch.add(h, other=b)

    x, w, b = torch.randn(16, 8), torch.randn(8, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    y = fm.shard_map(body, in_specs=(P("tp"), P(), P()), out_specs=P("tp"), mesh=rm)(x, w, b)
    # w, b and w.sum() (an invariant value of its own) are cast: one psum each
    assert backward_all_reduces(y) == [TP_GROUP] * 3


def test_a_tensor_written_in_place_is_cast_again(rm):
    seen = {}

    def body(h, v):
        u = v * 1  # invariant, not a leaf
        a = h + u
        u.add_(1)  # its version changes: the next use is cast anew and sees the new value
        seen["b"] = h + u
        return a + seen["b"]

    x, v = torch.randn(16, 8), torch.randn(4, 8, requires_grad=True)
    y = fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)(x, v)
    local = x[4:8]  # rank 5 holds block 1 of 4 along tp
    torch.testing.assert_close(seen["b"], local + v.detach() + 1)
    torch.testing.assert_close(y.to_local(), 2 * local + 2 * v.detach() + 1)
    assert backward_all_reduces(y) == [TP_GROUP] * 2


def test_a_cast_over_other_axes_is_another_cast(rm):
    """The same weight cast over tp and over (dp, tp): one cast each, used any number of times."""
    def body(uses):
        def f(h, hd, w):
            a, b = h, hd
            for _ in range(uses):
                a, b = a * w, b * w
            return fm.psum(a.sum(0), "tp") + fm.psum(b.sum(0), ("dp", "tp"))
        return f

    x, xd = torch.randn(16, 8), torch.randn(16, 8)
    seen = []
    for uses in (1, 4):
        w = torch.randn(8, requires_grad=True)
        y = fm.shard_map(body(uses), in_specs=(P("tp"), P(("dp", "tp")), P()), out_specs=P(), mesh=rm)(x, xd, w)
        with C10d() as calls:
            y.to_local().sum().backward()
        seen.append(calls.all_reduces())
    assert seen[0] == seen[1]
    assert TP_GROUP in seen[0] and len(seen[0]) >= 2  # over tp, and over (dp, tp) (one group or two)


def test_no_cast_outlives_its_region_or_keeps_a_tensor_alive(rm):
    made = []

    def body(h, w):
        for _ in range(3):
            c = w * 2  # an invariant intermediate, cast and then dropped
            made.append(weakref.ref(c))
            h = h * c
        return h * w

    x, w = torch.randn(16, 8), torch.randn(4, 8)
    gc.disable()  # a cast must not need the cyclic collector to let its tensor go
    try:
        fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)(x, w)
        assert [r() for r in made] == [None, None, None]
    finally:
        gc.enable()
    assert vars(w) == {}  # the weight entered as itself (P(): replicated) and carries nothing out

    def fails(h, w):
        h = h * w
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fm.shard_map(fails, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)(x, w)
    assert vars(w) == {}


def test_the_cast_of_one_region_is_not_seen_by_the_next(rm):
    """Two calls of a region: each makes its own cast, so their backward makes one psum each."""
    f = fm.shard_map(lambda h, w: (h * w) * w, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)
    x, w = torch.randn(16, 8), torch.randn(4, 8, requires_grad=True)
    y1, y2 = f(x, w), f(x, w)
    with C10d() as seen:
        (y1.to_local() + y2.to_local()).sum().backward()
    assert seen.all_reduces() == [TP_GROUP] * 2


@needs_compiled_regions()  # not where this torch's dynamo cannot trace a region (2.11, 2.12)
def test_compiled_the_weight_is_cast_once_and_a_write_retires_the_cast(rm):
    """Under torch.compile (one graph, fullgraph): the same counts as eagerly, and the same values."""
    def uses(h, w):
        for _ in range(4):
            h = torch.tanh(h * w)
        return h

    def written(h, v):
        u = v * 1
        a = h + u
        u.add_(1)  # a write the region sees: the next use is cast anew
        return a * 2 + (h + u)  # (cotangents that differ: a compiler would merge two equal all-reduces)

    for body, psums in ((uses, 1), (written, 2)):
        mapped = fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm)
        x, w = torch.randn(16, 8), torch.randn(4, 8, requires_grad=True)
        w_eager = w.detach().clone().requires_grad_()
        torch._dynamo.reset()
        out = torch.compile(lambda a, b: mapped(a, b).to_local(), backend="aot_eager", fullgraph=True)(x, w)
        want = mapped(x, w_eager).to_local()
        torch.testing.assert_close(out, want)
        with C10d() as seen:
            out.sum().backward()
        assert seen.functional_all_reduces() == psums, (body.__name__, seen.calls)
        want.sum().backward()
        torch.testing.assert_close(w.grad, w_eager.grad)
