"""Pending sums (unreduced) in typed regions, one process under the fake backend: types, errors, specs.

Fake collectives carry no data, so values and gradients are checked on gloo against one process
(tests/dist/test_unreduced_gloo.py) and against JAX (tests/jax_oracle/); here what a region says:
``fm.typeof`` after every kind of op, the ``VmaError`` of each refused program (op, axes, the
fix), ``fm.P(unreduced=)`` and ``NamedSharding``/``sharding_of``, the untyped identity, and
0 graph breaks under torch.compile.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.testing._internal.distributed.fake_pg  # noqa: F401
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions

MESH = fm.make_mesh((2, 2), ("dp", "tp"))
TP, DP, NONE = frozenset({"tp"}), frozenset({"dp"}), frozenset()


@pytest.fixture
def rm():
    dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
    try:
        yield fm.realize(MESH)
    finally:
        fm.clear_cache()
        dist.destroy_process_group()


def types(t):
    ty = fm.typeof(t)
    return ty.varying, ty.unreduced


def run(rm, body, *args, in_specs, out_specs=P(), check_vma=True):
    return fm.shard_map(body, mesh=rm, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)(*args)


# -- the spec ---------------------------------------------------------------------------------------------


def test_spec_unreduced_values_equality_and_round_trips():
    assert P("dp", unreduced={"tp"}) == P("dp", unreduced=["tp"]) == P("dp", unreduced="tp")
    assert P("dp", unreduced={"tp"}) != P("dp") and hash(P("dp", unreduced={"tp"})) != hash(P("dp"))
    assert P(unreduced={"b", "a"}).unreduced == frozenset({"a", "b"}) and P("x").unreduced == frozenset()
    assert repr(P(None, "dp", unreduced={"tp", "cp"})) == "P(None, 'dp', unreduced={'cp', 'tp'})"
    assert len(P("dp", unreduced={"tp"})) == 1 and tuple(P("dp", unreduced={"tp"})) == ("dp",)
    for spec in (P(), P("dp", None), P(("dp", "cp"), unreduced={"tp"}), P(unreduced={"tp", "cp"})):
        assert P.from_key(spec.key) == spec and pickle.loads(pickle.dumps(spec)) == spec


def test_spec_errors_name_the_value_and_the_rule():
    with pytest.raises(fm.MeshError, match=r"`PartitionSpec` requires each axis either splitting a dim or in "
                                           r"unreduced=, not both.*\['tp'\] also split a dim"):
        P(("dp", "tp"), unreduced={"tp"})
    with pytest.raises(TypeError, match=r"str axis names in unreduced="):
        P(unreduced={3})
    with pytest.raises(TypeError, match=r"unreduced= an iterable of axis names"):
        P(unreduced=3)
    with pytest.raises(KeyError, match=r"did you mean 'tp'"):
        fm.NamedSharding(MESH, P(unreduced={"tpp"}))


def test_named_sharding_placements_and_replication():
    sh = fm.NamedSharding(MESH, P("dp", unreduced={"tp"}))
    assert sh.placements == (Shard(0), Partial("sum")) and not sh.is_fully_replicated
    assert fm.NamedSharding(fm.make_mesh((2, 1), ("dp", "tp")), P(unreduced={"tp"})).is_fully_replicated
    assert sh.shard_shape((4, 6)) == (2, 6)  # a pending sum's terms have the full shape


def test_sharding_of_describes_a_partial_dtensor_and_refuses_other_reductions(rm):
    x = DTensor.from_local(torch.ones(2, 3), rm.device_mesh, [Shard(1), Partial("sum")])
    assert fm.sharding_of(x) == fm.NamedSharding(MESH, P(None, "dp", unreduced={"tp"}))
    with pytest.raises(fm.MeshError, match=r"`sharding_of` requires Shard, Replicate or Partial\('sum' \| 'max' \| "
                                           r"'min'\) placements .* but got placement=Partial\(avg\)"):
        fm.sharding_of(DTensor.from_local(torch.ones(2), rm.device_mesh, [Replicate(), Partial("avg")]))
    with pytest.raises(fm.MeshError, match=r"`distribute` requires a sharding without unreduced axes"):
        fm.distribute(torch.ones(4), fm.NamedSharding(MESH, P(unreduced={"tp"})), mesh=rm)


# -- types through ops --------------------------------------------------------------------------------------


def test_pcast_psum_psum_scatter_and_linear_ops_type_as_the_table_says(rm):
    seen = {}

    def body(x, w, c):  # x varies over tp (and dp), w and c are invariant
        u = fm.pcast(x, "tp", to="unreduced")
        seen["pcast"] = types(u)
        seen["psum"] = types(fm.psum(u, "tp"))
        seen["pmean"] = types(fm.pmean(u, "tp"))
        seen["psum_scatter"] = types(fm.psum_scatter(u, "tp", dim=1))
        seen["add"] = types(u + u - (-u))
        seen["views"] = [types(v) for v in (u.reshape(-1), u.T, u[0], u.view(2, 4), u.unsqueeze(0), u.flatten())]
        seen["reductions"] = [types(v) for v in (u.sum(), u.sum(0), u.mean(1), torch.cumsum(u, 0))]
        seen["products"] = [types(v) for v in (u * 2, 3.0 * u, u / 4, u * c, u @ w, torch.einsum("ij,jk->ik", u, w),
                                               F.linear(u, w.T), torch.matmul(u, w), c * u)]
        seen["cat"] = types(torch.cat([u, u], 0))
        seen["casts"] = [types(v) for v in (u.to(torch.float64), u.double(), u.float(), u.half(), u.bfloat16(),
                                            u.type_as(w.double()), u.to(dtype=torch.bfloat16))]
        seen["psum over dp keeps tp pending"] = types(fm.psum(u, "dp"))
        seen["pvary over another axis"] = types(fm.pcast(fm.psum(u, "dp"), "dp", to="varying"))
        with pytest.raises(fm.VmaError, match=r"`psum` over \('dp', 'tp'\) requires a value in one state over all"):
            fm.psum(u.sum(), ("dp", "tp"))  # unreduced over tp, varying over dp: JAX refuses the mix too
        return fm.psum(fm.psum(u.sum(), "tp"), "dp")

    x = torch.ones(4, 8)
    run(rm, body, x, torch.ones(4, 4), torch.ones(4), in_specs=(P("dp", "tp"), P(), P()))
    pending = (DP, TP)
    assert seen["pcast"] == pending
    assert seen["psum"] == seen["pmean"] == (DP, NONE)
    assert seen["psum_scatter"] == (DP | TP, NONE)
    assert seen["add"] == pending and seen["cat"] == pending
    assert seen["views"] == [pending] * 6 and seen["reductions"] == [pending] * 4
    assert seen["products"] == [pending] * 9
    assert seen["casts"] == [pending] * 7  # docs/shard_map.md: a dtype cast keeps the pending sum (of cast terms)
    assert seen["psum over dp keeps tp pending"] == (NONE, TP)
    assert seen["pvary over another axis"] == (DP, TP)


def test_an_invariant_factor_joins_other_axes_as_the_default_rule_says(rm):
    seen = {}

    def body(x, y):  # x varies over tp only, y over dp only
        u = fm.pcast(x, "tp", to="unreduced")
        seen["u*y"] = types(u * y)
        return fm.psum(u, "tp")

    run(rm, body, torch.ones(4), torch.ones(4), in_specs=(P("tp"), P("dp")))
    assert seen["u*y"] == (DP, TP)


def test_ops_without_a_pending_operand_type_alike_in_a_region_with_one(rm):
    # a pending sum in the region does not change how the other ops are typed (they keep the fast paths)
    def body(x, w, b, pending):
        u = fm.pcast(x, "tp", to="unreduced") if pending else x
        h = torch.tanh(x * w) + b  # varying x, invariant w and b: cast up to tp
        seen = {"h": types(h), "h@w": types(h @ w.T), "w+b": types(w + b), "mean": types(h.mean(dim=0)),
                "cat": types(torch.cat([h, x])), "linear": types(F.linear(h, w, b[:1].expand(4)))}
        out = fm.psum(u, "tp") + fm.psum(h, "tp")
        return out, seen

    seen = {}
    for pending in (False, True):
        def traced(x, w, b, p=pending):
            out, seen[p] = body(x, w, b, p)
            return out
        run(rm, traced, torch.ones(4, 8), torch.ones(4, 4), torch.ones(4), in_specs=(P(None, "tp"), P(), P()))
    assert seen[True] == seen[False]
    assert seen[True]["h"] == (TP, NONE) and seen[True]["w+b"] == (NONE, NONE)


REFUSED = {
    "tanh": (lambda u, c: torch.tanh(u), r"`tanh` is not linear, so it cannot take a value unreduced over \('tp',\)"),
    "relu": (lambda u, c: F.relu(u), r"`relu` is not linear"),
    "tanh by keyword": (lambda u, c: torch.tanh(input=u), r"`tanh` is not linear"),
    "plus invariant by keyword": (lambda u, c: torch.add(c, other=u), r"combines a value unreduced over"),
    "plus invariant": (lambda u, c: u + c, r"combines a value unreduced over \('tp',\) with one that is not"),
    "plus number": (lambda u, c: u + 1, r"adds a number to a value unreduced over \('tp',\)"),
    "number minus": (lambda u, c: 1 - u, r"`__rsub__` is not linear"),
    "product of two": (lambda u, c: u * u, r"multiplies two values unreduced over \('tp',\)"),
    "matmul of two": (lambda u, c: u @ u.T, r"multiplies two values unreduced"),
    "divide by one": (lambda u, c: c / u, r"divides by a value unreduced"),
    "times varying": (lambda u, c: u * fm.pcast(c, "tp"), r"by one that varies over \['tp'\]"),
    "linear with bias": (lambda u, c: F.linear(u, torch.ones(3, 4), c[:3]), r"`linear` with a bias cannot take"),
    "all_gather": (lambda u, c: fm.all_gather(u, "tp"), r"`all_gather` over \('tp',\) requires a value that is "
                                                        r"not unreduced"),
    "all_to_all": (lambda u, c: fm.all_to_all(u, "tp", 0, 0), r"`all_to_all` .* not unreduced"),
    "ppermute": (lambda u, c: fm.ppermute(u, "tp", [(0, 1), (1, 0)]), r"`ppermute` .* not unreduced"),
    "ragged": (lambda u, c: fm.ragged_all_to_all(u, "tp", [1, 1]), r"`ragged_all_to_all` .* not unreduced"),
    "pmax": (lambda u, c: fm.pmax(u, "tp"), r"`pmax` .* not unreduced"),
    "pvary over its axis": (lambda u, c: fm.pvary(u, "tp"), r"`pvary` .* not unreduced"),
    "pcast twice": (lambda u, c: fm.pcast(u, "tp", to="unreduced"), r"already unreduced over \['tp'\]"),
    "pcast of invariant": (lambda u, c: fm.pcast(c, "tp", to="unreduced"),
                           r"`pcast` requires a value varying over the axes it casts to unreduced, but got one "
                           r"invariant over \['tp'\]"),
    "write": (lambda u, c: u.add_(1), r"adds a number"),
    "setitem": (lambda u, c: u.__setitem__(0, c), r"`Tensor.__setitem__` is not linear"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_program_is_a_vma_error_naming_op_axes_and_fix(rm, name):
    bad, message = REFUSED[name]

    def body(x, c):
        u = fm.pcast(x, "tp", to="unreduced")
        return fm.psum(bad(u, c), "tp")

    with pytest.raises(fm.VmaError, match=message) as info:
        run(rm, body, torch.ones(4, 8), torch.ones(4), in_specs=(P(None, "tp"), P()))
    if name not in ("pcast twice", "pcast of invariant"):
        assert "psum" in str(info.value)  # the fix


# -- the boundary -----------------------------------------------------------------------------------------


def test_out_specs_with_unreduced_give_a_partial_dtensor_and_it_enters_unreduced(rm):
    out = run(rm, lambda x: fm.pcast(x, "tp", to="unreduced") * 2, torch.ones(4, 8), in_specs=P(None, "tp"),
              out_specs=P(unreduced={"tp"}))
    assert out.placements == (Replicate(), Partial("sum")) and out.shape == (4, 4)
    assert fm.sharding_of(out) == fm.NamedSharding(MESH, P(unreduced={"tp"}))
    seen = {}

    def body(x):
        seen["in"] = types(x)
        return fm.psum(x, "tp")

    back = run(rm, body, out, in_specs=P(unreduced={"tp"}))
    assert seen["in"] == (NONE, TP) and back.placements == (Replicate(), Replicate())


def test_out_specs_and_in_specs_errors(rm):
    with pytest.raises(fm.VmaError, match=r"unreduced over \['tp'\] \(a pending sum\), but its out_spec P\(\) does "
                                          r"not say so; psum .* or name \['tp'\] in P\(..., unreduced=...\)"):
        run(rm, lambda x: fm.pcast(x, "tp", to="unreduced"), torch.ones(4), in_specs=P("tp"))
    with pytest.raises(fm.VmaError, match=r"its out_spec says it is a pending sum over \('tp',\): cast it with "
                                          r"fm.pcast\(x, 'tp', to='unreduced'\)"):
        run(rm, lambda x: x, torch.ones(4), in_specs=P("tp"), out_specs=P(unreduced={"tp"}))
    with pytest.raises(fm.VmaError, match=r"invariant over \['tp'\], but its out_spec P\(unreduced=\{'tp'\}\) says "
                                          r"unreduced"):
        run(rm, lambda x: x, torch.ones(4), in_specs=P(), out_specs=P(unreduced={"tp"}))
    with pytest.raises(fm.MeshError, match=r"requires a DTensor with Partial\('sum'\) placements for an in_spec with "
                                           r"unreduced axes, but in_specs\[0\] is a plain tensor"):
        run(rm, lambda x: x, torch.ones(4), in_specs=P(unreduced={"tp"}))
    wrong = DTensor.from_local(torch.ones(4), rm.device_mesh, [Replicate(), Replicate()])
    with pytest.raises(fm.MeshError, match=r"sharded as its in_spec says"):
        run(rm, lambda x: x, wrong, in_specs=P(unreduced={"tp"}))


def test_untyped_regions_track_nothing_and_pcast_to_unreduced_is_the_identity(rm):
    def body(x):
        u = fm.pcast(x, "tp", to="unreduced")
        assert u is x  # nothing to cast: the tensor itself
        return torch.tanh(u) + 1  # no types, no errors

    out = run(rm, body, torch.ones(4), in_specs=P("tp"), out_specs=P(unreduced={"tp"}), check_vma=False)
    assert out.placements == (Replicate(), Partial("sum"))


@needs_compiled_regions()  # not where this torch's dynamo cannot trace a region (2.11, 2.12)
def test_a_typed_region_with_pending_sums_compiles_in_one_graph(rm):
    def body(x, w):
        u = fm.pcast(x @ w, "tp", to="unreduced")
        v = (u * 0.5 - u.flip(0)).reshape(4, -1)
        return fm.psum_scatter(v, "tp", dim=0)

    mapped = fm.shard_map(body, mesh=rm, in_specs=(P(None, "tp"), P("tp")), out_specs=P("tp"))
    x, w = torch.ones(4, 8), torch.ones(8, 6, requires_grad=True)
    explained = torch._dynamo.explain(mapped)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    out = torch.compile(mapped, fullgraph=True)(x, w)
    assert out.shape == (4, 6) and out.placements == (Replicate(), Shard(0))
    torch._dynamo.reset()
    with pytest.raises(fm.VmaError, match=r"`tanh` is not linear"):
        torch.compile(fm.shard_map(lambda x: torch.tanh(fm.pcast(x, "tp", to="unreduced")), mesh=rm,
                                   in_specs=P("tp"), out_specs=P(unreduced={"tp"})), fullgraph=True)(x)
    torch._dynamo.reset()
