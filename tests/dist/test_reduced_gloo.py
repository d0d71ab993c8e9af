"""``reduced`` and pending max/min on real gloo workers (world 4, mesh ("dp", "tp") = (2, 2)), against one process.

One check runs every program on every rank (one pool round trip keeps CI's share small):

- a weight entering ``P(reduced={"dp"})`` (a Replicate DTensor): its gradient leaves as a
  ``Partial("sum")`` DTensor over dp, not summed, whose ``full_tensor()`` is the one-process gradient
  (the deferred gradient sum of micro-batches, as a type);
- ``pcast(to="reduced")`` of a full tensor, multiplied into a pending sum: values and gradients;
- ``Partial("max")`` / ``Partial("min")`` DTensors made from their members: ``amax`` / reshape inside,
  ``pmax`` / ``pmin`` end them; values and gradients equal the one-process max/min of the members (each
  rank's gradient is its member's masked term, labelled like the value; their sum over tp is compared),
  and a pending max returned under its out_spec is a ``Partial("max")`` DTensor with the same value.

The same rules against JAX 0.12 (values and errors) are in tests/jax_oracle/test_unreduced_vs_jax.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

pytestmark = pytest.mark.slow

w4 = pool_fixture(4)
TOL = dict(rtol=1e-10, atol=1e-10)  # float64 on both sides
MAX = P(None, unreduced={"tp"}, unreduced_kind="max")
MIN = P(None, unreduced={"tp"}, unreduced_kind="min")


def full(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def cot(shape, seed):
    return full(shape, 1000 + seed)


def np_(t):
    return t.detach().numpy().copy()


def programs(rm: Any | None) -> dict[str, Any]:
    """Every program's outputs and gradients: in the region on ``rm``, or in one process (``rm=None``)."""
    res: dict[str, Any] = {}
    x, w = full((4, 6), 0).requires_grad_(), full((6, 3), 1).requires_grad_()
    if rm is None:
        y = torch.tanh(x @ w)
    else:
        wd = DTensor.from_local(w.detach(), rm.device_mesh, [Replicate(), Replicate()]).requires_grad_()  # a leaf
        y = fm.shard_map(lambda x, w: torch.tanh(x @ w), mesh=rm, in_specs=(P("dp"), P(reduced={"dp"})),
                         out_specs=P("dp"))(x, wd).full_tensor()
    (y * cot(y.shape, 0)).sum().backward()
    res["reduced weight"] = [np_(y), np_(x.grad), np_(w.grad if rm is None else wd.grad.full_tensor())]
    if rm is not None:
        res["weight gradient"] = (tuple(wd.grad.placements), repr(fm.sharding_of(wd.grad)))

    z, v = full((4, 4), 2).requires_grad_(), full((2,), 3).requires_grad_()
    if rm is None:
        y = (z[:, :2] + z[:, 2:]) * v
    else:
        y = fm.shard_map(lambda z, v: fm.psum(fm.pcast(z, "tp", to="unreduced") * fm.pcast(v, "tp", to="reduced"),
                                              "tp"), mesh=rm, in_specs=(P(None, "tp"), P()), out_specs=P())(z, v)
        y = y.full_tensor()
    (y * cot(y.shape, 1)).sum().backward()
    res["pcast to reduced"] = [np_(y), np_(z.grad), np_(v.grad)]

    a, b = full((2, 3, 5), 4).requires_grad_(), full((2, 3, 5), 5).requires_grad_()  # members at tp index 0, 1
    if rm is None:
        outs = [a.amax(0).amax(1), b.amin(0).reshape(-1)]
    else:
        k = rm.device_mesh.get_local_rank("tp")
        am = DTensor.from_local(a[k], rm.device_mesh, [Replicate(), Partial("max")], run_check=False)
        bm = DTensor.from_local(b[k], rm.device_mesh, [Replicate(), Partial("min")], run_check=False)
        res["max in"] = repr(fm.sharding_of(am))
        outs = fm.shard_map(lambda m, n: (fm.pmax(torch.amax(m, 1), "tp"), fm.pmin(n.reshape(-1), "tp")), mesh=rm,
                            in_specs=(MAX, MIN), out_specs=(P(), P()))(am, bm)
        outs = [o.full_tensor() for o in outs]
        with torch.no_grad():
            back = fm.shard_map(lambda m: m.t(), mesh=rm, in_specs=MAX, out_specs=MAX)(am)
        res["max out"] = (tuple(back.placements), np_(back.full_tensor()))
    sum((o * cot(o.shape, 2 + i)).sum() for i, o in enumerate(outs)).backward()
    grads = [a.grad, b.grad]
    if rm is not None:  # each rank holds the gradient of its own member (zeros for the other): add them up
        grads = [fm.psum(g, "tp", mesh=rm) for g in grads]
    res["pmax pmin"] = [np_(o) for o in outs] + [np_(g) for g in grads]
    return res


def run_programs() -> dict[str, Any]:
    return programs(fm.realize(fm.make_mesh((2, 2), ("dp", "tp")), timeout=GROUP_TIMEOUT, check=CHECK_S))


def test_reduced_and_pending_max_min_equal_one_process(w4):
    want = programs(None)
    a = full((2, 3, 5), 4)
    for rank, got in enumerate(w4.run(run_programs)):
        for name in ("reduced weight", "pcast to reduced", "pmax pmin"):
            for i, (g, e) in enumerate(zip(got[name], want[name], strict=True)):
                np.testing.assert_allclose(g, e, **TOL, err_msg=f"{name}, value {i}, rank {rank}")
        assert got["weight gradient"] == ((Partial("sum"), Replicate()),
                                          "NamedSharding(Mesh(dp=2, tp=2), P(unreduced={'dp'}))"), rank
        assert got["max in"] == "NamedSharding(Mesh(dp=2, tp=2), P(unreduced={'tp'}, unreduced_kind='max'))", rank
        assert got["max out"][0] == (Replicate(), Partial("max")), rank
        np.testing.assert_allclose(got["max out"][1], np_(a.amax(0).t()), **TOL)
