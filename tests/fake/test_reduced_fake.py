"""``reduced`` and pending max/min in typed regions, one process under the fake backend: types, errors, specs.

Values and gradients are checked against one process on real gloo (tests/dist/test_reduced_gloo.py) and
against JAX 0.12 (tests/jax_oracle/); here what a region says: ``fm.typeof``, the ``VmaError`` of each
refused op or collective (its op, axes and fix), DTensor ``Partial`` round trips of every kind through
``fm.sharding_of`` and out_specs, and the placements of the gradients that leave a region.
"""

from __future__ import annotations

import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions

MESH = fm.make_mesh((2, 2), ("dp", "tp"))
NONE, DP, TP = frozenset(), frozenset({"dp"}), frozenset({"tp"})


@pytest.fixture
def rm(fake_world):
    fake_world(4, 1)
    return fm.realize(MESH)


def run(rm, body, *args, in_specs, out_specs=P()):
    return fm.shard_map(body, mesh=rm, in_specs=in_specs, out_specs=out_specs)(*args)


def kept(seen):
    """A body helper: record ``fm.typeof`` of a value under a key, return the value."""
    def note(key, value):
        seen[key] = fm.typeof(value)
        return value
    return note


# -- reduced -------------------------------------------------------------------------------------------------


def test_reduced_types_through_casts_ops_and_products(rm):
    seen = {}
    note = kept(seen)

    def body(x, w):  # x varies over dp and tp, w is invariant
        r = note("r", fm.pcast(w, "tp", to="reduced"))
        note("tanh r", torch.tanh(r) * 2.0 + 1)  # any op of reduced values (and numbers) stays reduced
        note("r * r", r * r)
        u = note("u", fm.pcast(x, "tp", to="unreduced"))
        note("u * r", u * r)  # a pending sum times a reduced factor: a pending sum (JAX's rule)
        note("u / r", u / r)
        note("x * r", x * r)  # a varying operand: the reduced one is cast to varying (no communication)
        note("varying", fm.pcast(r, "tp", to="varying"))
        note("psum over dp", fm.psum(fm.pvary(r, "dp"), "dp"))  # another axis: still reduced over tp
        return fm.psum(u * r, "tp")

    run(rm, body, torch.ones(4, 4), torch.ones(2), in_specs=(P("dp", "tp"), P()), out_specs=P("dp"))
    R = fm.AxisTypes(NONE, reduced=TP)
    assert seen["r"] == seen["tanh r"] == seen["r * r"] == seen["psum over dp"] == R
    assert repr(R) == "AxisTypes(varying=frozenset(), reduced=frozenset({'tp'}))"
    assert seen["u * r"] == seen["u / r"] == fm.AxisTypes(DP, unreduced=TP)
    assert seen["x * r"] == fm.AxisTypes(DP | TP)
    assert seen["varying"] == fm.AxisTypes(TP)


@pytest.mark.parametrize("body, match", [
    (lambda x, w: fm.pcast(w, "tp", to="reduced") + w,  # JAX: "cannot be replicated on the same axes"
     r"`Tensor\.add` combines a value reduced over 'tp' .* with one that is invariant there.*"
     r"fm\.pcast\(y, 'tp', to='reduced'\)"),
    (lambda x, w: fm.psum(fm.pcast(w, "tp", to="reduced"), "tp"),  # JAX: "cannot accept args which are reduced"
     r"`psum` over \('tp',\) requires a value that is not reduced over these axes.*fm\.pcast\(x, 'tp', to='varying'\)"),
    (lambda x, w: fm.all_gather(fm.pcast(w, "tp", to="reduced"), "tp"), r"`all_gather` over \('tp',\) requires a "
     r"value that is not reduced"),
    (lambda x, w: fm.pvary(fm.pcast(w, "tp", to="reduced"), "tp"), r"`pvary` over \('tp',\) requires a value that "
     r"is not reduced"),
    (lambda x, w: fm.pcast(x, "tp", to="reduced"), r"`pcast` requires a value invariant over the axes it casts to "
     r"reduced, but got one that varies over \['tp'\]"),
    (lambda x, w: fm.pcast(fm.pcast(w, "tp", to="reduced"), "tp", to="reduced"), r"is already reduced over \['tp'\]"),
    (lambda x, w: fm.pcast(fm.pcast(w, "tp", to="reduced"), "tp", to="unreduced"), r"`pcast` requires a value "
     r"varying over the axes it casts to unreduced, but got one reduced over \['tp'\]"),
    (lambda x, w: fm.pcast(w, "tp", to="reduced") + fm.pcast(x, "tp", to="unreduced"),
     r"`Tensor\.add` combines a value unreduced over \('tp',\) with one that is not"),
    (lambda x, w: torch.nn.functional.dropout(fm.pcast(w, "tp", to="reduced")), r"`dropout` draws random numbers"),
])
def test_reduced_errors(rm, body, match):
    with pytest.raises(fm.VmaError, match=match):
        run(rm, body, torch.ones(4, 4), torch.ones(2), in_specs=(P("dp", "tp"), P()))


def test_reduced_at_the_boundary_and_its_gradient_leaves_as_a_pending_sum(rm):
    w = DTensor.from_local(torch.ones(3), rm.device_mesh, [Replicate(), Replicate()]).requires_grad_()
    seen = {}
    note = kept(seen)
    out = run(rm, lambda w: note("w", w) * 2, w, in_specs=P(reduced={"tp"}), out_specs=P(reduced={"tp"}))
    assert seen["w"] == fm.AxisTypes(NONE, reduced=TP)
    assert out.placements == (Replicate(), Replicate())  # a reduced value is the same on every member
    out.to_local().sum().backward()  # the cotangent (a local tensor: Partial("sum") over tp, its term here)
    assert w.grad.placements == (Replicate(), Partial("sum"))  # not summed: a pending sum over tp
    assert fm.sharding_of(w.grad) == fm.NamedSharding(MESH, P(unreduced={"tp"}))
    # a full tensor enters reduced as it is; its gradient is this member's term (no psum in backward): the
    # replicated cotangent (ones) enters as its share, 1/2 on each of the two tp members, whose terms add to 3
    full = torch.ones(3, requires_grad=True)
    run(rm, lambda w: w * 3, full, in_specs=P(reduced={"tp"}), out_specs=P(reduced={"tp"})).to_local().sum().backward()
    assert torch.equal(full.grad, torch.full((3,), 1.5))
    with pytest.raises(fm.VmaError, match=r"reduced over \[\], but its out_spec P\(reduced=\{'tp'\}\) says reduced over "
                                          r"\['tp'\].*fm\.pcast\(x, \['tp'\], to='reduced'\)"):
        run(rm, lambda w: w, torch.ones(3), in_specs=P(), out_specs=P(reduced={"tp"}))
    with pytest.raises(fm.VmaError, match=r"reduced over \['tp'\], but its out_spec P\(\) says reduced over \[\]"):
        run(rm, lambda w: fm.pcast(w, "tp", to="reduced"), torch.ones(3), in_specs=P(), out_specs=P())


# -- pending max and min ---------------------------------------------------------------------------------------


def partial(rm, kind, shape=(2, 3)):
    return DTensor.from_local(torch.ones(shape), rm.device_mesh, [Replicate(), Partial(kind)])


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_partial_round_trips_through_sharding_of_and_out_specs(rm, kind):
    x = DTensor.from_local(torch.ones(2, 3), rm.device_mesh, [Partial(kind), Shard(1)])
    spec = P(None, "tp", unreduced={"dp"}, unreduced_kind=kind)
    assert fm.sharding_of(x) == fm.NamedSharding(MESH, spec)
    assert fm.NamedSharding(MESH, spec).placements == (Partial(kind), Shard(1))
    seen = {}
    note = kept(seen)
    out = run(rm, lambda v: note("v", v), x, in_specs=spec, out_specs=spec)
    assert seen["v"] == fm.AxisTypes(TP, unreduced=DP, unreduced_kind=kind)
    assert out.placements == (Partial(kind), Shard(1)) and fm.sharding_of(out) == fm.NamedSharding(MESH, spec)


def test_pending_max_min_ops_and_the_collectives_that_end_them(rm):
    seen = {}
    note = kept(seen)

    def body(m, n):
        note("amax", torch.amax(m, dim=1))
        note("view", m.reshape(-1))
        note("cat", torch.cat([m, m]))
        note("maximum", torch.maximum(m, m))
        note("pmax", fm.pmax(m, "tp"))
        note("amin", n.amin(0))
        return fm.pmax(m.amax(1), "tp"), fm.pmin(n.min(), "tp")

    run(rm, body, partial(rm, "max"), partial(rm, "min"), in_specs=(P(unreduced={"tp"}, unreduced_kind="max"),
                                                                     P(unreduced={"tp"}, unreduced_kind="min")),
        out_specs=(P(), P()))
    MAX = fm.AxisTypes(NONE, unreduced=TP, unreduced_kind="max")
    assert seen["amax"] == seen["view"] == seen["cat"] == seen["maximum"] == MAX
    assert repr(MAX) == "AxisTypes(varying=frozenset(), unreduced=frozenset({'tp'}), unreduced_kind='max')"
    assert seen["pmax"] == fm.AxisTypes(NONE)
    assert seen["amin"] == fm.AxisTypes(NONE, unreduced=TP, unreduced_kind="min")


MAX_SPEC = P(unreduced={"tp"}, unreduced_kind="max")


@pytest.mark.parametrize("body, match", [
    (lambda m: fm.psum(m, "tp"), r"`psum` requires a value whose pending reduction is of kind 'sum', but got one "
     r"unreduced over \('tp',\) of kind 'max' \(a pending max\); end it with fm\.pmax\(x, 'tp'\) first"),
    (lambda m: fm.pmin(m, "tp"), r"`pmin` requires a value whose pending reduction is of kind 'min', but got one "
     r"unreduced over \('tp',\) of kind 'max'"),
    (lambda m: fm.psum_scatter(m, "tp"), r"`psum_scatter` requires .* kind 'sum'.* kind 'max'"),
    (lambda m: fm.psum(m, "dp"), r"`psum` requires .* kind 'sum'.* kind 'max'"),
    (lambda m: fm.pmax(m, "dp"), r"`pmax` over \('dp',\) requires a value pending a max over these axes or not "
     r"pending at all"),
    (lambda m: fm.all_gather(m, "dp"), r"`all_gather` over \('dp',\) requires a value that is not unreduced"),
    (lambda m: m + m, r"`Tensor\.add` requires a pending sum \(unreduced_kind 'sum'\) or no pending value, but got one "
     r"unreduced over \('tp',\) of kind 'max'.*end it with fm\.pmax\(x, 'tp'\) first"),
    (lambda m: m * 2.0, r"`Tensor\.mul` requires a pending sum"),
    (lambda m: -m, r"`Tensor\.neg` requires a pending sum"),
    (lambda m: m.sum(), r"`Tensor\.sum` requires a pending sum"),
    (lambda m: m @ torch.ones(3, 2), r"`Tensor\.matmul` requires a pending sum"),
    (lambda m: torch.tanh(m), r"`tanh` requires a pending sum"),
    (lambda m: m.amin(), r"`Tensor\.amin` is a min reduction, but got a value unreduced over \('tp',\) of kind 'max'"),
    (lambda m: torch.max(m, 0), r"`max` requires a pending sum"),  # with a dim it returns indices too: use amax
    (lambda m: torch.maximum(m, torch.ones(3)), r"`maximum` combines a value pending a max over \('tp',\) with one "
     r"that is not"),
    (lambda m: m, r"a pending max over \('tp',\), but its out_spec P\(unreduced=\{'tp'\}\) says unreduced_kind='sum'"),
])
def test_pending_max_errors(rm, body, match):
    out_specs = P(unreduced={"tp"}) if "out_spec" in match else P()
    with pytest.raises(fm.VmaError, match=match):
        run(rm, body, partial(rm, "max"), in_specs=MAX_SPEC, out_specs=out_specs)


def test_pmax_of_a_pending_sum_names_it_and_a_partial_avg_is_refused(rm):
    with pytest.raises(fm.VmaError, match=r"`pmax` over \('tp',\) requires a value that is not unreduced.*a pending "
                                          r"sum"):
        run(rm, lambda x: fm.pmax(fm.pcast(x, "tp", to="unreduced"), "tp"), torch.ones(4), in_specs=P("tp"))
    with pytest.raises(fm.MeshError, match=r"Partial\('sum' \| 'max' \| 'min'\) placements"):
        fm.sharding_of(partial(rm, "avg"))
    with pytest.raises(fm.MeshError, match=r"requires a DTensor with Partial\('max'\) placements for an in_spec"):
        run(rm, lambda m: m, torch.ones(3), in_specs=MAX_SPEC, out_specs=MAX_SPEC)


@pytest.mark.slow  # two compiles
@needs_compiled_regions()  # not where this torch's dynamo cannot trace a region (2.11, 2.12)
def test_reduced_and_pending_max_regions_compile_in_one_graph(rm):
    def body(x, w, m):
        r = fm.pcast(w, "tp", to="reduced")
        return fm.psum(fm.pcast(x, "tp", to="unreduced") * torch.sin(r), "tp"), fm.pmax(torch.amax(m, 1), "tp")

    mapped = fm.shard_map(body, mesh=rm, in_specs=(P(None, "tp"), P(), MAX_SPEC), out_specs=(P(), P()))
    args = torch.ones(4, 8), torch.ones(4, requires_grad=True), partial(rm, "max")
    explained = torch._dynamo.explain(mapped)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    out = torch.compile(mapped, fullgraph=True)(*args)
    assert [o.shape for o in out] == [(4, 4), (2,)]
    torch._dynamo.reset()
    with pytest.raises(fm.VmaError, match=r"`Tensor\.add` requires a pending sum"):
        torch.compile(fm.shard_map(lambda m: fm.pmax(m + m, "tp"), mesh=rm, in_specs=MAX_SPEC, out_specs=P()),
                      fullgraph=True)(partial(rm, "max"))
    torch._dynamo.reset()


def test_a_pending_sum_that_is_also_reduced_over_another_axis(rm):
    seen = {}
    note = kept(seen)

    def body(x, w):  # x varies over tp and is reduced over dp; w is invariant
        r = fm.pcast(w, "dp", to="reduced")
        u = note("u", fm.pcast(x * r, "tp", to="unreduced"))
        note("u * 2", u * 2.0)
        with pytest.raises(fm.VmaError, match=r"`Tensor\.mul` combines a value reduced over 'dp'"):
            u * w  # w is merely invariant over dp
        return fm.psum(u, "tp")

    run(rm, body, torch.ones(4, 4), torch.ones(2), in_specs=(P(None, "tp", reduced={"dp"}), P()),
        out_specs=P(reduced={"dp"}))
    assert seen["u"] == seen["u * 2"] == fm.AxisTypes(NONE, unreduced=TP, reduced=DP)
