"""Pending sums (unreduced values) on real gloo workers (world 4, mesh ("dp", "tp") = (2, 2)).

Values and gradients of typed regions with unreduced values against ONE PROCESS (plain torch on
the full tensors, each pending sum written out as the sum of its members' blocks), and the DTensor
``Partial("sum")`` round trip: a DTensor built by hand with ``Partial`` enters a region typed
unreduced, a region returns ``P(..., unreduced=...)`` as a ``Partial`` DTensor whose
``full_tensor()`` is the sum, ``fm.sharding_of`` describes both, and gradients through both
boundaries equal one process. The same programs against JAX 0.10.2 are in
tests/jax_oracle/test_unreduced_vs_jax.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4)

DP, TP = frozenset({"dp"}), frozenset({"tp"})
NONE = frozenset()
TOL = dict(rtol=1e-10, atol=1e-10)  # float64 on both sides


def realize():
    return fm.realize(fm.make_mesh((2, 2), ("dp", "tp")), timeout=GROUP_TIMEOUT, check=CHECK_S)


def full(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def cotangents(outs, seed=1000):
    return [full(o.shape, seed + i) for i, o in enumerate(outs)]


def loss_and_grads(outs, inputs):
    """Outputs as numpy, and the gradients of ``sum_i sum(out_i * cot_i)`` with respect to ``inputs``."""
    sum((o * c).sum() for o, c in zip(outs, cotangents(outs))).backward()
    return ([o.detach().numpy().copy() for o in outs],
            [t.grad.detach().numpy().copy() if t.grad is not None else np.zeros(tuple(t.shape)) for t in inputs])


def pend(x, axis="tp"):
    return fm.pcast(x, axis, to="unreduced")


def tp_sum(x):
    """pcast(x, 'tp', to='unreduced') of x (4, 8) under P('dp', 'tp'), as the full (4, 4) value under P('dp')."""
    return x[:, :4] + x[:, 4:]


def per_dp(t, op):
    """``op`` on each dp member's rows of ``t`` (4, ...), concatenated: an op along dim 0 of a local block."""
    return torch.cat([op(t[:2]), op(t[2:])])


# -- values and gradients against one process -------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    about: str
    shapes: tuple[tuple[int, ...], ...]
    in_specs: tuple[Any, ...]
    out_specs: Any
    body: Callable[..., Any]
    reference: Callable[..., list[torch.Tensor]]  # one process, on the full inputs


def _row_parallel_sp(x, w, r):
    return fm.psum_scatter(pend(x @ w), "tp", dim=0, tiled=True) + r


def _row_parallel_linear(x, w, b):
    y = pend(F.linear(x, w))  # each member's product is one term of x @ w.T
    return fm.psum(-(y * 0.5), "tp") + b


def _invariant_factors(x, w, s):
    u = pend(x)
    return (fm.psum(u @ w, "tp"), fm.psum(torch.einsum("ij,jk->ik", u, w), "tp"),
            fm.psum(F.linear(u, w.T), "tp"), fm.psum(u * s, "tp"), fm.psum((u / s).mean(0), "tp"))


def _linear_ops(x, y):
    u, v = pend(x), pend(torch.sin(y))
    return (fm.psum(-u, "tp"), fm.psum(u - v, "tp"), fm.psum(torch.cat([u, v], 1), "tp"), fm.psum(u.T, "tp"),
            fm.psum(u.sum(1), "tp"), fm.psum_scatter(u + v, "tp", dim=1, tiled=True))


def _deferred_sum(x1, x2, y):
    # two micro-batches' x.T @ y: one psum over dp per step, not one per micro-batch
    return fm.psum(pend(x1.T @ y, "dp") + pend(x2.T @ y, "dp"), "dp")


def _two_axes(x, w):
    u = pend(x, ("dp", "tp")) @ w
    return fm.psum(u, ("dp", "tp")), fm.psum(fm.psum(u, "tp"), "dp")


def _weight_used_twice(x, w, z):
    return fm.psum(pend(x) @ w, "tp") + z @ w


def _in_place(x, y):
    u = pend(torch.sin(x))
    u += pend(y)
    u.mul_(2.0)
    return fm.psum(u, "tp")


def _factor_varying_over_dp(x, w):
    return fm.psum(pend(x) @ w, "tp")  # w varies over dp, and is invariant over tp: the pending axis


def _scatter_over_tuple(x):
    return fm.psum_scatter(pend(x, ("dp", "tp")), ("dp", "tp"), dim=0, tiled=True)


CASES: dict[str, Case] = {
    "row_parallel_to_sequence_parallel": Case(
        "x @ w row-parallel, kept pending, psum_scatter along the sequence, + residual",
        ((4, 8), (8, 6), (4, 6)), (P(None, "tp"), P("tp", None), P("tp", None)), P("tp", None),
        _row_parallel_sp, lambda x, w, r: [x @ w + r]),
    "row_parallel_linear_scaled": Case(
        "F.linear(x, w) row-parallel, kept pending, -(y * 0.5), psum, + an invariant bias",
        ((4, 8), (6, 8), (6,)), (P(None, "tp"), P(None, "tp"), P()), P(),
        _row_parallel_linear, lambda x, w, b: [-(x @ w.T * 0.5) + b]),
    "invariant_factors": Case(
        "matmul, einsum, linear, * and / by invariant factors, mean(0) of a pending sum",
        ((4, 8), (4, 3), ()), (P("dp", "tp"), P(), P()), (P("dp"),) * 5,
        _invariant_factors,
        lambda x, w, s: [tp_sum(x) @ w] * 3 + [tp_sum(x) * s, per_dp(tp_sum(x) / s, lambda b: b.mean(0))]),
    "linear_ops": Case(
        "neg, sub, cat, transpose, sum(1) of pending sums, psum'd; psum_scatter of a sum of two",
        ((4, 8), (4, 8)), (P("dp", "tp"), P("dp", "tp")),
        (P("dp"), P("dp"), P("dp"), P(None, "dp"), P("dp"), P("dp", "tp")),
        _linear_ops,
        lambda x, y: [-tp_sum(x), tp_sum(x) - tp_sum(torch.sin(y)), torch.cat([tp_sum(x), tp_sum(torch.sin(y))], 1),
                      tp_sum(x).T, tp_sum(x).sum(1), tp_sum(x) + tp_sum(torch.sin(y))]),
    "deferred_gradient_sum": Case(
        "two micro-batches' x.T @ y pending over dp, one psum",
        ((4, 3), (4, 3), (4, 5)), (P("dp"), P("dp"), P("dp")), P(),
        _deferred_sum, lambda x1, x2, y: [x1.T @ y + x2.T @ y]),
    "two_axes": Case(
        "pending over ('dp','tp') times an invariant weight; psum over the tuple, and over tp then dp",
        ((4, 3), (3, 2)), (P(("dp", "tp")), P()), (P(), P()),
        _two_axes, lambda x, w: [x.sum(0, keepdim=True) @ w] * 2),
    "weight_used_twice": Case(
        "an invariant weight times a pending sum and times a varying value: its gradient has both parts",
        ((4, 8), (4, 3), (4, 4)), (P("dp", "tp"), P(), P("dp")), P("dp"),
        _weight_used_twice, lambda x, w, z: [tp_sum(x) @ w + z @ w]),
    "in_place": Case(
        "u += v and u.mul_(2.0) on pending sums",
        ((4, 8), (4, 8)), (P("dp", "tp"), P("dp", "tp")), P("dp"),
        _in_place, lambda x, y: [2.0 * (tp_sum(torch.sin(x)) + tp_sum(y))]),
    "factor_varying_over_dp": Case(
        "a pending sum over tp times a weight that varies over dp",
        ((4, 8), (8, 3)), (P("dp", "tp"), P("dp")), P("dp"),
        _factor_varying_over_dp, lambda x, w: [torch.cat([tp_sum(x)[:2] @ w[:4], tp_sum(x)[2:] @ w[4:]])]),
    "scatter_over_tuple": Case(
        "pcast and psum_scatter over ('dp','tp')",
        ((8, 8),), (P(None, ("dp", "tp")),), P(("dp", "tp")),
        _scatter_over_tuple, lambda x: [sum(x[:, 2 * k:2 * k + 2] for k in range(4))]),
}


def run_case(name: str) -> dict:
    case = CASES[name]
    rm = realize()
    inputs = [full(s, seed).requires_grad_() for seed, s in enumerate(case.shapes)]
    out = fm.shard_map(case.body, in_specs=case.in_specs, out_specs=case.out_specs, mesh=rm)(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    return dict(zip(("outputs", "grads"), loss_and_grads([o.full_tensor() for o in outs], inputs)))


def one_process(name: str) -> dict:
    case = CASES[name]
    inputs = [full(s, seed).requires_grad_() for seed, s in enumerate(case.shapes)]
    return dict(zip(("outputs", "grads"), loss_and_grads(case.reference(*inputs), inputs)))


def assert_same(got: dict, want: dict, what: str) -> None:
    assert len(got["outputs"]) == len(want["outputs"]), what
    for i, (g, w) in enumerate(zip(got["outputs"], want["outputs"])):
        np.testing.assert_allclose(g, w, **TOL, err_msg=f"{what}: result {i}")
    for j, (g, w) in enumerate(zip(got["grads"], want["grads"], strict=True)):
        np.testing.assert_allclose(g, w, **TOL, err_msg=f"{what}: gradient of input {j}")


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_equal_one_process(w4, name):
    want = one_process(name)
    for rank, got in enumerate(w4.run(run_case, name)):
        assert_same(got, want, f"{name} ({CASES[name].about}) on rank {rank}")


def run_chained_regions() -> dict:
    """A region returns a pending sum (a Partial DTensor); a second region takes it unreduced."""
    rm = realize()
    x, w = full((4, 8), 0).requires_grad_(), full((4, 3), 1).requires_grad_()
    first = fm.shard_map(lambda x, w: pend(x) @ w, in_specs=(P("dp", "tp"), P()),
                         out_specs=P("dp", unreduced={"tp"}), mesh=rm)
    pending = first(x, w)
    seen = {}

    def second(u):
        seen["type"] = fm.typeof(u)
        return fm.psum_scatter(u, "tp", dim=0, tiled=True), u * 2.0

    out = fm.shard_map(second, in_specs=P("dp", unreduced={"tp"}),
                       out_specs=(P(("dp", "tp")), P("dp", unreduced={"tp"})), mesh=rm)(pending)
    res = {"between": (tuple(pending.placements), repr(fm.sharding_of(pending))), "type": seen["type"],
           "placements": [tuple(o.placements) for o in out]}
    res["outputs"], res["grads"] = loss_and_grads([o.full_tensor() for o in out], [x, w])
    return res


def test_chained_regions_pass_a_pending_sum_as_a_partial_dtensor(w4):
    x, w = full((4, 8), 0).requires_grad_(), full((4, 3), 1).requires_grad_()
    want = dict(zip(("outputs", "grads"), loss_and_grads([tp_sum(x) @ w, 2.0 * (tp_sum(x) @ w)], [x, w])))
    for rank, got in enumerate(w4.run(run_chained_regions)):
        assert got["between"] == ((Shard(0), Partial("sum")),
                                  "NamedSharding(Mesh(dp=2, tp=2), P('dp', unreduced={'tp'}))"), rank
        assert got["type"] == fm.AxisTypes(varying=DP, unreduced=TP), rank
        assert got["placements"] == [(Shard(0), Shard(0)), (Shard(0), Partial("sum"))], rank
        assert_same(got, want, f"chained regions on rank {rank}")


# -- a DTensor built with Partial("sum"), in and out --------------------------------------------------------


def run_partial_round_trip() -> dict:
    rm = realize()
    dm = rm.device_mesh
    tp = dm.get_local_rank("tp")
    members = full((2, 4, 6), 0).requires_grad_()  # member k is held by the ranks at tp index k
    w = full((6, 3), 1).requires_grad_()
    dt = DTensor.from_local(members[tp], dm, [Replicate(), Partial()], run_check=False)
    res: dict[str, Any] = {"in": (repr(fm.sharding_of(dt)), torch.allclose(dt.full_tensor(), members.sum(0)))}
    seen = {}

    def body(u, w):
        seen["u"], seen["u @ w"] = fm.typeof(u), fm.typeof(u @ w)
        return u @ w, fm.psum(u, "tp"), fm.psum_scatter(u, "tp", dim=0, tiled=True)

    out = fm.shard_map(body, in_specs=(P(unreduced={"tp"}), P()),
                       out_specs=(P(unreduced={"tp"}), P(), P("tp")), mesh=rm)(dt, w)
    res["types"] = seen
    res["out"] = [(tuple(o.placements), repr(fm.sharding_of(o))) for o in out]
    outputs, grads = loss_and_grads([o.full_tensor() for o in out], [members, w])
    # each rank's members.grad holds the row it entered with (through DTensor.from_local): the full
    # gradient is their sum over tp
    res["outputs"] = outputs
    res["grads"] = [fm.psum(torch.from_numpy(grads[0]), "tp", mesh=rm).numpy(), grads[1]]
    res["own row only"] = bool(np.all(grads[0][1 - tp] == 0))
    res["reshard"] = torch.allclose(fm.reshard(dt, fm.NamedSharding(rm.mesh, P())).full_tensor(), members.sum(0))
    return res


def test_a_partial_dtensor_enters_unreduced_and_a_region_returns_one(w4):
    members, w = full((2, 4, 6), 0).requires_grad_(), full((6, 3), 1).requires_grad_()
    value = members.sum(0)
    want = dict(zip(("outputs", "grads"), loss_and_grads([value @ w, value, value], [members, w])))
    for rank, got in enumerate(w4.run(run_partial_round_trip)):
        assert got["in"] == ("NamedSharding(Mesh(dp=2, tp=2), P(unreduced={'tp'}))", True), rank
        assert got["types"] == {"u": fm.AxisTypes(varying=NONE, unreduced=TP),
                                "u @ w": fm.AxisTypes(varying=NONE, unreduced=TP)}, rank
        assert got["out"] == [
            ((Replicate(), Partial("sum")), "NamedSharding(Mesh(dp=2, tp=2), P(unreduced={'tp'}))"),
            ((Replicate(), Replicate()), "NamedSharding(Mesh(dp=2, tp=2), P())"),
            ((Replicate(), Shard(0)), "NamedSharding(Mesh(dp=2, tp=2), P('tp'))"),
        ], rank
        assert got["own row only"], rank
        assert got["reshard"], f"rank {rank}: fm.reshard of a Partial DTensor to P() is not the sum"
        assert_same(got, want, f"Partial round trip on rank {rank}")


def run_partial_over_dp_sharded_over_tp() -> dict:
    """A DTensor Partial over dp and sharded over tp: P('tp', unreduced={'dp'})."""
    rm = realize()
    dp, tp = rm.device_mesh.get_local_rank("dp"), rm.device_mesh.get_local_rank("tp")
    members = full((2, 4, 3), 0).requires_grad_()  # member k over dp; each member sharded along dim 0 over tp
    dt = DTensor.from_local(members[dp, 2 * tp:2 * tp + 2], rm.device_mesh, [Partial(), Shard(0)], run_check=False)
    seen = {}

    def body(u):
        seen["u"] = fm.typeof(u)
        return fm.psum(torch.cos(fm.psum(u, "dp")), "tp"), u.T

    out = fm.shard_map(body, in_specs=P("tp", unreduced={"dp"}),
                       out_specs=(P(), P(None, "tp", unreduced={"dp"})), mesh=rm)(dt)
    res: dict[str, Any] = {"in": repr(fm.sharding_of(dt)), "type": seen["u"],
                           "out": [(tuple(o.placements), repr(fm.sharding_of(o))) for o in out]}
    outputs, grads = loss_and_grads([o.full_tensor() for o in out], [members])
    res["outputs"] = outputs
    res["grads"] = [fm.psum(torch.from_numpy(grads[0]), ("dp", "tp"), mesh=rm).numpy()]
    return res


def test_partial_over_one_axis_sharded_over_the_other(w4):
    members = full((2, 4, 3), 0).requires_grad_()
    value = members.sum(0)
    # cos of the (2, 3) block each tp member holds, psum'd over tp: the two blocks' cosines added
    want = dict(zip(("outputs", "grads"),
                    loss_and_grads([torch.cos(value[:2]) + torch.cos(value[2:]), value.T], [members])))
    for rank, got in enumerate(w4.run(run_partial_over_dp_sharded_over_tp)):
        assert got["in"] == "NamedSharding(Mesh(dp=2, tp=2), P('tp', unreduced={'dp'}))", rank
        assert got["type"] == fm.AxisTypes(varying=TP, unreduced=DP), rank
        assert got["out"] == [
            ((Replicate(), Replicate()), "NamedSharding(Mesh(dp=2, tp=2), P())"),
            ((Partial("sum"), Shard(1)), "NamedSharding(Mesh(dp=2, tp=2), P(None, 'tp', unreduced={'dp'}))"),
        ], rank
        assert_same(got, want, f"Partial over dp on rank {rank}")


# -- the boundary's refusals, and untyped regions ----------------------------------------------------------


def outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def run_boundary_refusals() -> dict:
    rm = realize()
    dm = rm.device_mesh
    x = full((4, 6), 0)
    ident = fm.shard_map(lambda u: fm.psum(u, "tp"), in_specs=P(unreduced={"tp"}), out_specs=P(), mesh=rm)
    partial = DTensor.from_local(x, dm, [Replicate(), Partial()], run_check=False)
    replicated = DTensor.from_local(x, dm, [Replicate(), Replicate()], run_check=False)
    return {
        "plain tensor": outcome(lambda: ident(x)),
        "replicated DTensor": outcome(lambda: ident(replicated)),
        "partial into P()": outcome(lambda: fm.shard_map(lambda v: v, in_specs=P(), out_specs=P(), mesh=rm)(partial)),
        "avg": outcome(lambda: fm.sharding_of(DTensor.from_local(x, dm, [Replicate(), Partial("avg")],
                                                                  run_check=False))),
        "invariant under unreduced out": outcome(lambda: fm.shard_map(
            lambda v: v, in_specs=P(), out_specs=P(unreduced={"tp"}), mesh=rm)(x)),
        "distribute": outcome(lambda: fm.distribute(x, fm.NamedSharding(rm.mesh, P(unreduced={"tp"})), mesh=rm)),
        "psum": ident(partial).full_tensor(),
    }


def test_the_boundary_refuses_what_is_no_pending_sum(w4):
    x = full((4, 6), 0)
    for rank, res in enumerate(w4.run(run_boundary_refusals)):
        kind, message = res["plain tensor"]
        assert kind == "MeshError" and "Partial('sum')" in message and "plain tensor" in message, (rank, message)
        kind, message = res["replicated DTensor"]
        assert kind == "MeshError" and "fm.reshard" in message and "unreduced={'tp'}" in message, (rank, message)
        kind, message = res["partial into P()"]
        assert kind == "MeshError" and "unreduced={'tp'}" in message and "fm.reshard" in message, (rank, message)
        kind, message = res["avg"]
        assert kind == "MeshError" and "avg" in message, (rank, message)
        kind, message = res["invariant under unreduced out"]
        assert kind == "VmaError" and "'tp'" in message, (rank, message)
        kind, message = res["distribute"]
        assert kind == "MeshError" and "unreduced" in message, (rank, message)
        torch.testing.assert_close(res["psum"], 2 * x)  # the two tp members each hold x: the sum is 2x


def run_untyped_pcast() -> dict:
    rm = realize()
    x = full((4, 6), 0).requires_grad_()

    def body(v):
        u = fm.pcast(v, "tp", to="unreduced")
        return u * 3.0, torch.tanh(u)  # untyped: nothing is tracked, so a nonlinear op is allowed

    out = fm.shard_map(body, in_specs=P(None, "tp"), out_specs=(P(None, "tp"), P(None, "tp")), mesh=rm,
                       check_vma=False)(x)
    outputs, grads = loss_and_grads([o.full_tensor() for o in out], [x])
    return {"outputs": outputs, "grads": grads}


def run_more_refusals() -> dict:
    rm = realize()
    x, w, b = full((4, 8), 0), full((3, 4), 1), full((3,), 2)

    def region(body):
        return outcome(lambda: fm.shard_map(body, in_specs=(P("dp", "tp"), P(), P()), out_specs=P("dp"),
                                            mesh=rm)(x, w, b))

    return {
        "linear with a bias": region(lambda x, w, b: fm.psum(F.linear(pend(x), w, b), "tp")),
        "times a value varying over tp": region(lambda x, w, b: fm.psum(pend(x) * x, "tp")),
        "pcast over an axis it is invariant over": region(lambda x, w, b: fm.psum(pend(b, ("dp", "tp")), "tp")),
    }


def test_more_refusals(w4):
    for rank, res in enumerate(w4.run(run_more_refusals)):
        kind, message = res["linear with a bias"]
        assert kind == "VmaError" and "bias" in message and "'tp'" in message, (rank, message)
        kind, message = res["times a value varying over tp"]
        assert kind == "VmaError" and "mul" in message and "'tp'" in message, (rank, message)
        kind, message = res["pcast over an axis it is invariant over"]
        assert kind == "VmaError" and "pcast" in message, (rank, message)


def run_untyped_partial() -> dict:
    rm = realize()
    members = full((2, 4, 6), 0).requires_grad_()
    tp = rm.device_mesh.get_local_rank("tp")
    dt = DTensor.from_local(members[tp], rm.device_mesh, [Replicate(), Partial()], run_check=False)
    out = fm.shard_map(lambda u: u * 2.0, in_specs=P(unreduced={"tp"}), out_specs=P(unreduced={"tp"}), mesh=rm,
                       check_vma=False)(dt)
    outputs, grads = loss_and_grads([out.full_tensor()], [members])
    return {"placements": tuple(out.placements), "outputs": outputs,
            "grads": [fm.psum(torch.from_numpy(grads[0]), "tp", mesh=rm).numpy()]}


def test_an_untyped_region_passes_a_partial_dtensor_through(w4):
    members = full((2, 4, 6), 0).requires_grad_()
    want = dict(zip(("outputs", "grads"), loss_and_grads([2.0 * members.sum(0)], [members])))
    for rank, got in enumerate(w4.run(run_untyped_partial)):
        assert got["placements"] == (Replicate(), Partial("sum")), rank
        assert_same(got, want, f"untyped region with a Partial DTensor on rank {rank}")


def test_untyped_regions_track_nothing_pcast_is_the_identity(w4):
    x = full((4, 6), 0).requires_grad_()
    want = dict(zip(("outputs", "grads"), loss_and_grads([x * 3.0, torch.tanh(x)], [x])))
    for rank, got in enumerate(w4.run(run_untyped_pcast)):
        assert_same(got, want, f"untyped pcast on rank {rank}")
