"""An invariant weight used k times in a typed region is cast once (world 4, mesh ("x", "y") = (2, 2)).

The implicit cast (``pvary``: identity forward, ``psum`` backward) is made once per tensor and
axes in a region, so backward sums the weight's k cotangents locally and makes ONE all-reduce for
it, not k. Counted here: the c10d all-reduces that real gloo workers dispatch during backward (a
``TorchDispatchMode`` that sees every ``c10d::`` op; nothing in ``torch.distributed`` is
replaced). Values and gradients against plain torch on the full tensors in one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4)


def full(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


class AllReduces(TorchDispatchMode):
    """The ranks of the group of every c10d all-reduce dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func.name().startswith("c10d::allreduce"):
            from torch._C._distributed_c10d import ProcessGroup

            pg = next(ProcessGroup.unbox(a) for a in args
                      if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()))
            self.groups.append(tuple(dist.get_process_group_ranks(pg)))
        return func(*args, **(kwargs or {}))


def body(uses):
    def f(h, w, b):
        for _ in range(uses):
            h = torch.tanh(h @ w + b)  # w, b invariant; h varies over y
        return h
    return f


def cast_once(uses: int, dtensors: bool) -> dict:
    rm = fm.realize(fm.make_mesh((2, 2), ("x", "y")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    x, w, b = full((8, 4), 0), full((4, 4), 1) / 2, full((4,), 2)
    if dtensors:
        rep = fm.NamedSharding(rm.mesh, P())
        wi, bi = (fm.distribute(t, rep, mesh=rm).requires_grad_() for t in (w, b))
    else:
        wi, bi = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = fm.shard_map(body(uses), in_specs=(P("y"), P(), P()), out_specs=P("y"), mesh=rm)(x, wi, bi)
    with AllReduces() as seen:
        (y.to_local() ** 2).sum().backward()  # this rank's rows; the y members' terms add up to the full loss
    # one process: the full computation (rows are independent, so the y shards together are the whole)
    wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
    want = body(uses)(x, wr, br)
    (want ** 2).sum().backward()
    grads = [g.full_tensor() if dtensors else g for g in (wi.grad, bi.grad)]
    return {"values": torch.allclose(y.full_tensor(), want.detach()),
            "grads": [torch.allclose(g, r.grad) for g, r in zip(grads, (wr, br), strict=True)],
            "all-reduces": seen.groups,
            "grad types": [type(g).__name__ for g in (wi.grad, bi.grad)]}


@pytest.mark.parametrize("dtensors", [False, True], ids=["full tensors", "DTensors"])
def test_an_invariant_weight_used_k_times_is_summed_once_in_backward(w4, dtensors):
    for uses in (1, 3):
        results = w4.run(cast_once, uses, dtensors)
        for rank, res in enumerate(results):
            assert res["values"] and res["grads"] == [True, True], (rank, uses, res)
            assert res["grad types"] == ["DTensor" if dtensors else "Tensor"] * 2
            # w and b: one all-reduce each, over this rank's y group (mesh (2, 2) row-major: rank r is
            # (x, y) = (r // 2, r % 2), its y group {2 (r // 2), 2 (r // 2) + 1})
            y_group = (2 * (rank // 2), 2 * (rank // 2) + 1)
            assert res["all-reduces"] == [y_group, y_group], (rank, uses, res["all-reduces"])
