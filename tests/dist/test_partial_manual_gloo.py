"""Regions manual over some axes (``shard_map(..., axis_names=...)``) on real gloo workers (world 4, mesh
("dp", "tp") = (2, 2)), against ONE PROCESS (plain torch on the full tensors).

One run checks, typed and untyped: a Megatron MLP manual over tp whose batch stays a DTensor dim over dp
inside (values, gradients of DTensor and plain arguments); the DTensor a region sees inside (its mesh,
placements and local block); a region nested in it manual over dp; a dim split over both a manual and an
automatic axis, each way round; and the errors every rank raises alike. The same programs' types and
errors against JAX 0.12 are in tests/jax_oracle (programs.py, ``partial_*`` and ``nested_*``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4)

TOL = dict(rtol=1e-10, atol=1e-10)  # float64 on both sides


def full(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def one_process_mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def mlp(x, w1, w2):
    return fm.psum(torch.relu(x @ w1) @ w2, "tp")


def outcome(fn) -> tuple[str, str]:
    try:
        fn()
    except fm.MeshError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def run_partial_manual(rank: int | None = None) -> dict[str, Any]:
    rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    res: dict[str, Any] = {}
    x, w1, w2, cot = full((8, 6), 1), full((6, 8), 2), full((8, 6), 3), full((8, 6), 4)
    ref = [t.clone().requires_grad_() for t in (x, w1, w2)]
    want = one_process_mlp(*ref)
    (want * cot).sum().backward()
    res["want"] = [want.detach().numpy()] + [t.grad.numpy() for t in ref]
    for check_vma in (True, False):
        # x: a DTensor batch-sharded over dp (an automatic axis); w1 a DTensor column-sharded over tp; w2 plain
        dx = fm.distribute(x, fm.NamedSharding(rm.mesh, P("dp")), mesh=rm).requires_grad_()
        dw1 = fm.distribute(w1, fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm).requires_grad_()
        pw2 = w2.clone().requires_grad_()
        seen = {}

        def body(x, w1, w2, seen=seen):
            seen["x"] = (type(x).__name__, tuple(x.device_mesh.mesh_dim_names), tuple(x.placements),
                         tuple(x.shape), tuple(x.to_local().shape))
            return mlp(x, w1, w2)

        y = fm.shard_map(body, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), mesh=rm,
                         axis_names={"tp"}, check_vma=check_vma)(dx, dw1, pw2)
        (y.full_tensor() * cot).sum().backward()
        res[f"mlp {check_vma}"] = dict(
            seen=seen["x"], placements=tuple(y.placements),
            values=[y.full_tensor().detach().numpy(), dx.grad.full_tensor().numpy(),
                    dw1.grad.full_tensor().numpy(), pw2.grad.numpy()],
            grad_placements=(tuple(dx.grad.placements), tuple(dw1.grad.placements)))

    # the brief's example: (Shard(0), Shard(1)) on (dp, tp) manual over tp: Shard(0) on dp, the tp block inside
    a = full((8, 8), 5)
    da = fm.distribute(a, fm.NamedSharding(rm.mesh, P("dp", "tp")), mesh=rm)
    inside = {}

    def look(v):
        inside["v"] = (tuple(v.device_mesh.mesh_dim_names), tuple(v.placements), tuple(v.shape),
                       v.to_local().numpy().copy(), v.full_tensor().numpy().copy())
        return v * 2

    out = fm.shard_map(look, in_specs=P(None, "tp"), out_specs=P(None, "tp"), mesh=rm, axis_names={"tp"})(da)
    res["inside"] = inside["v"] + (tuple(out.placements), out.full_tensor().numpy())

    # nested: outer manual over tp, inner over dp; the inner region sums over both axes
    b, cot_b = full((8, 4), 6), full((8, 4), 7)
    for check_vma in (True, False):
        pb = b.clone().requires_grad_()

        def outer(v):
            inner = fm.shard_map(lambda z: (fm.psum(z, "dp"), fm.psum(z * z, "tp")), in_specs=P("dp"),
                                 out_specs=(P(), P("dp")), axis_names={"dp"}, check_vma=check_vma)
            s, q = inner(v)
            return torch.sin(s), q

        s, q = fm.shard_map(outer, in_specs=P("tp"), out_specs=(P("tp"), P("tp")), mesh=rm, axis_names={"tp"},
                            check_vma=check_vma)(pb)
        ((s.full_tensor()[:4] * cot_b[:4]).sum() + (q.full_tensor() * cot_b).sum()).backward()
        res[f"nested {check_vma}"] = (s.full_tensor().detach().numpy(), q.full_tensor().detach().numpy(),
                                      pb.grad.numpy(), tuple(q.placements))
    # a dim split over a manual axis (tp) and an automatic one (dp): the manual block whole
    c = full((8, 3), 8)
    mixed = fm.shard_map(lambda v: fm.psum(torch.cos(v), "tp"), in_specs=P("tp"), out_specs=P(), mesh=rm,
                         axis_names={"tp"})
    dc = fm.distribute(c, fm.NamedSharding(rm.mesh, P(("tp", "dp"))), mesh=rm)  # tp major: _StridedShard on dp
    res["mixed"] = mixed(dc).full_tensor().numpy()
    res["mixed refused"] = outcome(lambda: mixed(fm.distribute(c, fm.NamedSharding(rm.mesh, P(("dp", "tp"))),
                                                               mesh=rm)))
    res["psum over dp"] = outcome(lambda: fm.shard_map(lambda v: fm.psum(v, "dp"), in_specs=P("tp"),
                                                       out_specs=P("tp"), mesh=rm, axis_names={"tp"})(c))
    res["spec names dp"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=P("dp"), out_specs=P("dp"), mesh=rm,
                                                        axis_names={"tp"})(c))
    res["nested same axis"] = outcome(lambda: fm.shard_map(
        lambda v: fm.shard_map(lambda z: z, in_specs=P(), out_specs=P(), axis_names={"tp"})(v), in_specs=P("tp"),
        out_specs=P("tp"), mesh=rm, axis_names={"tp"})(c))
    res["unknown axis"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=P(), out_specs=P(), mesh=rm,
                                                       axis_names={"ep"})(c))
    return res


def test_partial_manual_regions_equal_one_process(w4):
    for rank, res in enumerate(w4.run(run_partial_manual)):
        want = res["want"]
        for check_vma in (True, False):
            got = res[f"mlp {check_vma}"]
            # inside: a DTensor over dp, batch-sharded there, its global shape the whole batch
            assert got["seen"] == ("DTensor", ("dp",), (Shard(0),), (8, 6), (4, 6)), (rank, got["seen"])
            assert got["placements"] == (Shard(0), Replicate()), (rank, got["placements"])
            assert got["grad_placements"] == ((Shard(0), Replicate()), (Replicate(), Shard(1))), rank
            for g, w in zip(got["values"], want, strict=True):
                np.testing.assert_allclose(g, w, **TOL)
        mesh_names, placements, shape, local, value = res["inside"][:5]
        a = full((8, 8), 5).numpy()
        tp = rank % 2
        assert (mesh_names, placements, shape) == (("dp",), (Shard(0),), (8, 4)), rank
        np.testing.assert_array_equal(value, a[:, 4 * tp:4 * tp + 4])  # this rank's tp block
        np.testing.assert_array_equal(local, a[4 * (rank // 2):4 * (rank // 2) + 4, 4 * tp:4 * tp + 4])
        assert res["inside"][5] == (Shard(0), Shard(1)), rank
        np.testing.assert_array_equal(res["inside"][6], 2 * a)
        b, cot_b = full((8, 4), 6), full((8, 4), 7)
        ref = b.clone().requires_grad_()
        blocks = ref.reshape(2, 2, 2, 4)  # (tp, dp, rows, cols): tp-major rows, then dp within a tp block
        s_ref = torch.sin(blocks.sum(1))  # psum over dp inside each tp block: (tp, rows, cols)
        q_ref = (blocks * blocks).sum(0, keepdim=True).expand(2, 2, 2, 4).reshape(8, 4)  # psum over tp
        s_full = s_ref.reshape(4, 4)
        ((s_full * cot_b[:4]).sum() + (q_ref * cot_b).sum()).backward()
        for check_vma in (True, False):
            s, q, grad, q_placements = res[f"nested {check_vma}"]
            np.testing.assert_allclose(s, s_full.detach().numpy(), **TOL)
            np.testing.assert_allclose(q, q_ref.detach().numpy(), **TOL)
            np.testing.assert_allclose(grad, ref.grad.numpy(), **TOL)
            assert q_placements[1] == Shard(0) and type(q_placements[0]).__name__ == "_StridedShard", q_placements
        c = full((8, 3), 8)
        np.testing.assert_allclose(res["mixed"], torch.cos(c).reshape(2, 4, 3).sum(0).numpy(), **TOL)
        name, message = res["mixed refused"]
        assert name == "MeshError" and "in_specs" in message, message
        name, message = res["psum over dp"]
        assert name == "VmaError" and "'dp' is not manual in this region" in message and "('tp',)" in message
        name, message = res["spec names dp"]
        assert name == "MeshError" and "in_specs[0]=P('dp') names 'dp'" in message and "('tp',)" in message, message
        name, message = res["nested same axis"]
        assert name == "MeshError" and "disjoint" in message, message
        name, message = res["unknown axis"]
        assert name == "MeshError" and "'ep'" in message and "axis_names" in message, message

