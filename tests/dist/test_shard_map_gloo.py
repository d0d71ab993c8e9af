"""shard_map regions on real gloo workers (world 4, mesh ("x", "y") = (2, 2)): types, boundary, errors.

Values and gradients against JAX itself are in tests/jax_oracle/; here the region's own contract
(docs/design.md, "Typed regions (shard_map)" and "Type rules"): what ``fm.typeof`` says after each kind of op, which writes and results are
type errors (with their messages), the DTensor boundary, ``fm.reshard``, and the untyped mode.
Expected values come from plain torch on the full tensors, never from the code under test.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate, Shard

import functional_mesh as fm
from functional_mesh import P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4)

X, Y = frozenset({"x"}), frozenset({"y"})
XY, NONE = X | Y, frozenset()


def realize():
    return fm.realize(fm.make_mesh((2, 2), ("x", "y")), timeout=GROUP_TIMEOUT, check=CHECK_S)


def full(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def outcome(fn):
    """``("ok", value)`` or ``(error type name, message)``."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


# -- types through ops -----------------------------------------------------------------------------


def types_through_ops() -> dict:
    rm = realize()
    seen: dict = {}

    def body(x, w):
        t = lambda v: fm.typeof(v).varying  # noqa: E731
        seen["x"], seen["w"] = t(x), t(w)
        seen["factory"] = t(torch.zeros(3))
        seen["scalar op"] = t(x * 2 + 1)
        seen["mixed"] = t(x + w)
        seen["view"] = (t(x.view(-1)), t(x[0]), t(x.T), t(x.unsqueeze(0)))
        seen["like"] = (t(torch.zeros_like(x)), t(torch.ones_like(w)))
        seen["cat"] = t(torch.cat([w, w * 2]))
        seen["cat mixed"] = t(torch.cat([x, w]))
        seen["index"] = t(fm.axis_index("y")), t(fm.axis_index(("x", "y")))
        seen["axis_size"] = fm.axis_size(("x", "y"))
        seen["psum"] = t(fm.psum(x, "x")), t(fm.psum(x + fm.axis_index("y"), ("x", "y")))
        seen["psum invariant"] = t(fm.psum(w, "y"))
        seen["gather"] = t(fm.all_gather(x, "x")), t(fm.all_gather(x, "x", to="invariant"))
        seen["gather invariant spelling"] = t(fm.all_gather(x, "x", to="invarying"))
        seen["scatter"] = t(fm.psum_scatter(w, "y", dim=1))
        seen["ppermute"] = t(fm.ppermute(w, "y", [(0, 1), (1, 0)]))
        seen["all_to_all"] = t(fm.all_to_all(x, "y", 1, 0))
        seen["pvary"] = t(fm.pvary(w, "x")), t(fm.pcast(w, ("x", "y"), to="varying"))
        seen["random"] = t(torch.rand(2)), t(F.dropout(w, 0.5)), t(F.dropout(w, 0.5, training=False))
        seen["item"] = type(w[0, 0].item()).__name__
        y = x.clone()
        y.add_(w)  # legal: y varies over x already, w is cast
        seen["in place"] = t(y)
        z = x.clone()
        z[0] = w[0]
        seen["setitem"] = t(z)
        seen["in place errors"] = [
            outcome(lambda: w.clone().add_(x)),
            outcome(lambda: w.clone().__setitem__(0, x[0])),
            outcome(lambda: torch.add(w, x, out=torch.empty_like(w))),
            outcome(lambda: torch.empty(3).normal_()),
        ]
        seen["pvary twice"] = outcome(lambda: fm.pvary(x, "x"))
        seen["pcast target"] = outcome(lambda: fm.pcast(w, "x", to="invariant"))
        return x

    x, w = full((4, 4)), full((2, 4), 1)
    out = fm.shard_map(body, in_specs=(P("x", None), P()), out_specs=P("x"), mesh=rm)(x, w)
    seen["after"] = outcome(lambda: fm.typeof(out.to_local()))
    return seen


def test_typeof_follows_every_kind_of_op(w4):
    for s in w4.run(types_through_ops):
        assert (s["x"], s["w"], s["factory"], s["scalar op"], s["mixed"]) == (X, NONE, NONE, X, X)
        assert s["view"] == (X, X, X, X) and s["like"] == (X, NONE)
        assert (s["cat"], s["cat mixed"]) == (NONE, X)
        assert s["index"] == (Y, XY) and s["axis_size"] == 4
        assert s["psum"] == (NONE, NONE) and s["psum invariant"] == NONE
        assert s["gather"] == (X, NONE) and s["gather invariant spelling"] == NONE
        assert (s["scatter"], s["ppermute"], s["all_to_all"]) == (Y, Y, XY)
        assert s["pvary"] == (X, XY)
        assert s["random"] == (XY, XY, NONE), "random ops vary over the whole mesh; eval dropout draws nothing"
        assert s["item"] == "float"
        assert (s["in place"], s["setitem"]) == (X, X)
        for kind, message in s["in place errors"]:
            assert kind == "VmaError", message
            assert re.search(r"writes in place into a tensor that varies over frozenset\(\), but the value it "
                             r"writes varies over frozenset\(\{'x'(, 'y')?\}\).*write `x = x \+ y`", message), message
        assert s["pvary twice"][0] == "VmaError"
        assert "already varies over ['x']" in s["pvary twice"][1]
        assert s["pcast target"][0] == "MeshError" and "valid: 'varying'" in s["pcast target"][1]
        assert s["after"][0] == "MeshError" and "requires an enclosing shard_map region" in s["after"][1]


# -- results: out_specs ---------------------------------------------------------------------------------


def out_specs_errors() -> dict:
    rm = realize()
    x = full((4, 4))
    res = {}

    def several(x):
        v = x * fm.axis_index("y")  # varies over x and y
        return {"ok": fm.psum(v, ("x", "y")), "w": v, "pair": (v, fm.psum(v, ("y", "x")))}

    specs = {"ok": P(), "w": P("x"), "pair": (P(), P())}
    res["several"] = outcome(lambda: fm.shard_map(several, in_specs=P("x"), out_specs=specs, mesh=rm)(x))
    res["random"] = outcome(lambda: fm.shard_map(lambda x: F.dropout(x, 0.5), in_specs=P(), out_specs=P(),
                                                 mesh=rm)(x))
    res["untyped"] = outcome(lambda: fm.shard_map(lambda x: x * fm.axis_index("y"), in_specs=P("x"),
                                                  out_specs=P("x"), mesh=rm, check_vma=False)(x).to_local())
    res["invariant named"] = outcome(lambda: fm.shard_map(lambda w: w * 1, in_specs=P(), out_specs=P("x"),
                                                           mesh=rm)(x).full_tensor())
    return res


def test_out_specs_errors_list_every_failing_result(w4):
    x = full((4, 4))
    for rank, res in enumerate(w4.run(out_specs_errors)):
        kind, message = res["several"]
        assert kind == "VmaError", message
        assert "2 results still vary (mesh axes ('x', 'y'))" in message
        assert ("out_specs['w']: varies over frozenset({'x', 'y'}), but its out_spec P('x') does not name 'y'; "
                "psum or all_gather over 'y', or name 'y' in out_specs") in message
        assert "out_specs['pair'][0]: varies over frozenset({'x', 'y'})" in message
        assert "out_specs['pair'][1]" not in message and "out_specs['ok']" not in message
        assert res["random"][0] == "VmaError" and "random ops" in res["random"][1]
        kind, local = res["untyped"]  # check_vma=False trusts out_specs (JAX): no error
        assert kind == "ok" and torch.equal(local, x[(rank // 2) * 2:(rank // 2) * 2 + 2] * (rank % 2))
        kind, value = res["invariant named"]  # copies of an invariant value, concatenated along dim 0
        assert kind == "ok" and torch.equal(value, torch.cat([x, x]))


# -- the boundary --------------------------------------------------------------------------------------


def boundary() -> dict:
    rm = realize()
    res = {}
    x = full((4, 6))
    sx = fm.NamedSharding(rm.mesh, P("x", "y"))
    dx = fm.distribute(x, sx, mesh=rm)
    f = fm.shard_map(lambda v: v * 2, in_specs=P("x", "y"), out_specs=P("x", "y"), mesh=rm)
    out = f(dx)
    res["dtensor in/out"] = (type(out).__name__, tuple(out.placements), tuple(out.shape),
                             torch.equal(out.full_tensor(), x * 2))
    other = fm.reshard(dx, fm.NamedSharding(rm.mesh, P(None, "y")))
    res["mismatch"] = outcome(lambda: f(other))
    back = fm.reshard(other, sx)
    res["reshard"] = (tuple(other.placements), torch.equal(other.full_tensor(), x), torch.equal(f(back).full_tensor(),
                                                                                               x * 2))
    res["reshard other mesh"] = outcome(lambda: fm.reshard(dx, fm.NamedSharding(fm.make_mesh((4,), ("w",)), P())))
    res["indivisible"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=P("y"), out_specs=P("y"),
                                                      mesh=rm)(full((3, 2))))
    res["rank"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=P(None), out_specs=P(), mesh=rm)(torch.ones(())))
    res["prefix"] = outcome(lambda: fm.shard_map(lambda a, b: a, in_specs=(P(), P(), P()), out_specs=P(),
                                                 mesh=rm)(x, x))
    res["pure mesh"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=P(), out_specs=P(), mesh=rm.mesh))
    res["spec type"] = outcome(lambda: fm.shard_map(lambda v: v, in_specs=("x",), out_specs=P(), mesh=rm))
    res["nested"] = outcome(lambda: fm.shard_map(
        lambda v: fm.shard_map(lambda u: u, in_specs=P(), out_specs=P(), mesh=rm)(v), in_specs=P(), out_specs=P(),
        mesh=rm)(x))

    @fm.shard_map(in_specs=(P("x"), P()), out_specs=P("x"))
    def decorated(v, scale):
        return v * scale

    with rm:
        res["decorator, current mesh, non-tensor argument"] = torch.equal(decorated(x, 3).full_tensor(), x * 3)
    res["no mesh"] = outcome(lambda: decorated(x, 3))
    return res


def test_the_boundary_dtensors_reshard_and_errors(w4):
    for res in w4.run(boundary):
        assert res["dtensor in/out"] == ("DTensor", (Shard(0), Shard(1)), (4, 6), True)
        kind, message = res["mismatch"]
        assert kind == "MeshError", message
        assert ("in_specs[0] is NamedSharding(Mesh(x=2, y=2), P(None, 'y')) and its spec asks for "
                "NamedSharding(Mesh(x=2, y=2), P('x', 'y')); call fm.reshard(x, ") in message, message
        assert res["reshard"] == ((Replicate(), Shard(1)), True, True)
        # another mesh is a cross-mesh reshard now (docs/across_meshes.md): a destination rank must pass mesh=
        assert res["reshard other mesh"][0] == "MeshError" and "mesh=<the destination's RealizedMesh>" in res[
            "reshard other mesh"][1]
        kind, message = res["indivisible"]
        assert kind == "MeshError" and "maps dim 0 of size 3 (shape (3, 2)) to axes ('y',) of total size 2" in message
        assert res["rank"][0] == "MeshError" and "a value of rank at least 1" in res["rank"][1]
        assert res["prefix"][0] == "MeshError" and "in_specs that is a pytree prefix of the arguments" in res[
            "prefix"][1]
        assert res["pure mesh"][0] == "TypeError" and "call fm.realize(mesh)" in res["pure mesh"][1]
        assert res["spec type"][0] == "TypeError" and "PartitionSpec leaves in in_specs" in res["spec type"][1]
        assert res["nested"][0] == "MeshError" and "regions nest over disjoint axis sets" in res["nested"][1]
        assert res["decorator, current mesh, non-tensor argument"] is True
        assert res["no mesh"][0] == "MeshError" and "`shard_map` requires mesh=<RealizedMesh>" in res["no mesh"][1]


# -- gradients: DTensor arguments, typed and untyped ------------------------------------------------------


def gradients() -> dict:
    rm = realize()
    x, w = full((4, 6)), full((6, 3), 1)
    cot = full((4, 3), 2)
    want_x, want_w = cot @ w.T, x.T @ cot  # d sum((x @ w) * cot)
    res = {}
    for check_vma in (True, False):
        xs = fm.distribute(x, fm.NamedSharding(rm.mesh, P(None, "y")), mesh=rm).requires_grad_()
        ws = w.clone().requires_grad_()
        f = fm.shard_map(lambda a, b: fm.psum(a @ b, "y"), in_specs=(P(None, "y"), P("y", None)), out_specs=P(),
                         mesh=rm, check_vma=check_vma)
        (f(xs, ws).full_tensor() * cot).sum().backward()
        res[check_vma] = (type(xs.grad).__name__, tuple(xs.grad.placements),
                          torch.allclose(xs.grad.full_tensor(), want_x), torch.allclose(ws.grad, want_w))
    # a replicated weight with batch-sharded activations, no explicit pvary: its gradient is summed
    xb, wb = x.clone().requires_grad_(), full((6, 6), 3).requires_grad_()
    out = fm.shard_map(lambda a, b: torch.tanh(a @ b), in_specs=(P("x"), P()), out_specs=P("x"), mesh=rm)(xb, wb)
    (out.full_tensor() ** 2).sum().backward()
    xr, wr = x.clone().requires_grad_(), wb.detach().clone().requires_grad_()
    (torch.tanh(xr @ wr) ** 2).sum().backward()
    res["implicit pvary"] = (torch.allclose(xb.grad, xr.grad), torch.allclose(wb.grad, wr.grad))
    return res


def test_gradients_dtensor_and_plain_typed_and_untyped(w4):
    for res in w4.run(gradients):
        assert res[True] == ("DTensor", (Replicate(), Shard(1)), True, True)
        assert res[False] == ("DTensor", (Replicate(), Shard(1)), True, True)
        assert res["implicit pvary"] == (True, True)


# -- ops the table cannot type --------------------------------------------------------------------------


@torch.library.custom_op("fmtest::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


def custom_op() -> dict:
    rm = realize()
    x = full((4, 2))
    typed = outcome(lambda: fm.shard_map(lambda v: torch.ops.fmtest.twice(v), in_specs=P("x"), out_specs=P("x"),
                                         mesh=rm)(x))
    untyped = fm.shard_map(lambda v: torch.ops.fmtest.twice(v), in_specs=P("x"), out_specs=P("x"), mesh=rm,
                           check_vma=False)(x)
    return {"typed": typed, "untyped": torch.equal(untyped.full_tensor(), x * 2)}


def test_an_op_the_table_cannot_type_is_an_error_that_suggests_check_vma_false(w4):
    for res in w4.run(custom_op):
        kind, message = res["typed"]
        assert kind == "VmaError", message
        assert re.search(r"`fmtest::twice.*` cannot be typed inside shard_map: .*check_vma=False; operands: \[2, 2\]"
                         r"\{V:x\}", message), message
        assert res["untyped"] is True


def leak(check_vma: bool) -> tuple:
    rm = realize()
    f = fm.shard_map(lambda v: v + 1, in_specs=P("x"), out_specs=P("x"), mesh=rm, check_vma=check_vma)
    out = f(full((4, 2)))
    return (fm.current_mesh(), torch._C._is_torch_function_mode_enabled(), sorted(vars(out.to_local())))


@pytest.mark.parametrize("check_vma", [True, False])
def test_nothing_leaks_out_of_a_region(w4, check_vma):
    for res in w4.run(leak, check_vma):
        assert res == (None, False, [])


# -- what a review found: hints that named the wrong fix or the wrong mesh, raw torch.distributed --------


def review_findings() -> dict:
    import torch.distributed as dist

    rm = realize()
    x = full((4, 4))
    res = {}
    # a region over a selection: an axis of the bigger mesh is not one of the region's
    res["axis outside the region"] = outcome(lambda: fm.shard_map(lambda v: fm.psum(v, "x"), in_specs=P(),
                                                                  out_specs=P(), mesh=rm["y"])(x))
    # an all_gather's result under out_specs=P(): the fix is its invariant form, not another all_gather
    res["gather hint"] = outcome(lambda: fm.shard_map(lambda v: fm.all_gather(v, "x"), in_specs=P("x"),
                                                      out_specs=P(), mesh=rm)(x))
    res["gather hint, invariant"] = outcome(lambda: fm.shard_map(lambda v: fm.all_gather(v, "x", to="invariant"),
                                                                 in_specs=P("x"), out_specs=P(),
                                                                 mesh=rm)(x).full_tensor())
    group = rm.group("x")

    def raw_all_reduce(v):
        t = v * 1
        dist.all_reduce(t, group=group)
        return t

    def raw_all_to_all(v):
        out = torch.empty_like(v)
        dist.all_to_all_single(out, v, group=group)
        return out

    for name, body in (("raw all_reduce", raw_all_reduce), ("raw all_to_all_single", raw_all_to_all)):
        res[name] = outcome(lambda body=body: fm.shard_map(body, in_specs=P("x"), out_specs=P(), mesh=rm)(x))
        # untyped: trusted, as in JAX (the values are what torch computes)
        res[name + ", untyped"] = outcome(lambda body=body: fm.shard_map(
            body, in_specs=P("x"), out_specs=P("x"), mesh=rm, check_vma=False)(x).full_tensor())
    return res


def test_review_findings_region_hints_and_raw_torch_distributed(w4):
    x = full((4, 4))
    for res in w4.run(review_findings):
        kind, message = res["axis outside the region"]
        assert kind == "UnknownAxisError", message
        assert "inside shard_map over Mesh(" in message and "a selection of (x, y)" in message, message
        assert "did you mean" not in message, message
        kind, message = res["gather hint"]
        assert kind == "VmaError", message
        assert "all_gather(x, 'x', to='invariant')" in message, message
        assert "psum or all_gather over 'x'" not in message, message
        kind, value = res["gather hint, invariant"]
        assert kind == "ok" and torch.equal(value, x), value
        for name, advice in (("raw all_reduce", "fm.psum"), ("raw all_to_all_single", "fm.ragged_all_to_all")):
            kind, message = res[name]
            assert kind == "VmaError" and advice in message and "check_vma=False" in message, (name, message)
        kind, value = res["raw all_reduce, untyped"]  # each x-row block summed over x: both blocks the sum
        assert kind == "ok" and torch.allclose(value, torch.cat([x[:2] + x[2:]] * 2)), value
        kind, value = res["raw all_to_all_single, untyped"]  # rows of the two blocks swapped pairwise
        assert kind == "ok" and torch.equal(value, x[[0, 2, 1, 3]]), value
