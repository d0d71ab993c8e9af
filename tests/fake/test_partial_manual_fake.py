"""Regions manual over some axes (``shard_map(..., axis_names=...)``): specs, types and errors (torch's fake backend,
rank 5 of 8, mesh (dp, tp) = (2, 4)).

Inside, a value is a DTensor over the other axes (on their submesh) whose local tensor is this rank's block;
types are tracked over the manual axes only; specs name only manual axes; collectives over another axis are
a ``VmaError``; regions nest over disjoint axis sets. Values and gradients on real workers against one
process: tests/dist/test_partial_manual_gloo.py; types and errors against JAX 0.12: tests/jax_oracle.
"""

from __future__ import annotations

import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.distributed.tensor import DTensor, Replicate, Shard

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions


@pytest.fixture
def rm(fake_world):
    fake_world(8, 5)
    return fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))


def dtensor(rm, spec, shape=(8, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    return fm.distribute(torch.randn(shape, generator=g), fm.NamedSharding(rm.mesh, spec), mesh=rm)


def test_inside_a_dtensor_over_the_other_axes_typed_over_the_manual_ones(rm):
    x = dtensor(rm, P("dp", "tp"))
    seen = {}

    def f(v, w):
        seen["v"] = (type(v), v.device_mesh.mesh_dim_names, tuple(v.placements), tuple(v.shape), fm.typeof(v))
        seen["w"] = (tuple(w.placements), tuple(w.shape), fm.typeof(w))
        seen["sum"] = fm.typeof(fm.psum(v * w, "tp"))
        seen["rand"] = fm.typeof(torch.rand(2) + 0 * v.to_local().sum())  # random: varies over the manual axes
        local = v.to_local()  # the type survives leaving the DTensor and coming back (DTensor.from_local)
        seen["local"] = (fm.typeof(local), fm.typeof(DTensor.from_local(local * 2, v.device_mesh, v.placements)))
        return v * 2

    out = fm.shard_map(f, in_specs=(P(None, "tp"), P()), out_specs=P(None, "tp"), mesh=rm, axis_names={"tp"})(
        x, torch.ones(8, 2))
    assert seen["v"] == (DTensor, ("dp",), (Shard(0),), (8, 2), fm.AxisTypes(frozenset({"tp"})))
    assert seen["w"] == ((Replicate(),), (8, 2), fm.AxisTypes(frozenset()))  # a plain tensor: replicated there
    assert seen["sum"] == fm.AxisTypes(frozenset())
    assert seen["rand"] == fm.AxisTypes(frozenset({"tp"}))  # not dp: the region is not manual over it
    assert seen["local"] == (fm.AxisTypes(frozenset({"tp"})),) * 2
    assert tuple(out.placements) == (Shard(0), Shard(1)) and out.shape == (8, 8)
    torch.testing.assert_close(out.to_local(), 2 * x.to_local())


def test_every_axis_named_is_the_full_manual_region(rm):
    x = torch.arange(8.0)
    seen = []
    body = lambda v: seen.append(type(v)) or fm.psum(v, "tp")  # noqa: E731
    a = fm.shard_map(body, in_specs=P("tp"), out_specs=P(), mesh=rm)(x)
    b = fm.shard_map(body, in_specs=P("tp"), out_specs=P(), mesh=rm, axis_names={"dp", "tp"})(x)
    assert seen == [torch.Tensor, torch.Tensor] and tuple(a.placements) == tuple(b.placements)


def test_specs_name_only_manual_axes(rm):
    f = fm.shard_map(lambda v: v, in_specs=P("dp"), out_specs=P(), mesh=rm, axis_names={"tp"})
    with pytest.raises(fm.MeshError, match=r"in_specs\[0\]=P\('dp'\) names 'dp', which is not manual in this region.*"
                                           r"add it to axis_names") as e:
        f(torch.ones(8))
    assert "('tp',)" in str(e.value)
    g = fm.shard_map(lambda v: (v, v), in_specs=P("tp"), out_specs=(P("tp"), P(("dp", "tp"))), mesh=rm,
                     axis_names={"tp"})
    with pytest.raises(fm.MeshError, match=r"out_specs\[1\]=P\(\('dp', 'tp'\)\) names 'dp'"):
        g(torch.ones(8))
    with pytest.raises(fm.MeshError, match=r"axis_names.*'ep'.*\('dp', 'tp'\)"):
        fm.shard_map(lambda v: v, in_specs=P(), out_specs=P(), mesh=rm, axis_names={"ep"})(torch.ones(8))
    with pytest.raises(TypeError, match="axis_names=None or a set of mesh axis names"):
        fm.shard_map(lambda v: v, in_specs=P(), out_specs=P(), mesh=rm, axis_names="tp")


@pytest.mark.parametrize("check_vma", [True, False])
def test_collectives_over_an_axis_that_is_not_manual(rm, check_vma):
    for call in (lambda v: fm.psum(v, "dp"), lambda v: v * fm.axis_index("dp"),
                 lambda v: fm.all_gather(v, ("tp", "dp"), dim=1)):
        f = fm.shard_map(call, in_specs=P("tp"), out_specs=P("tp"), mesh=rm, axis_names={"tp"}, check_vma=check_vma)
        with pytest.raises(fm.VmaError, match=r"axis_names: \('tp',\)\), but 'dp' is not manual in this region.*"
                                              r"add 'dp' to axis_names"):
            f(torch.ones(8, 4))


def test_a_dtensor_that_does_not_fit_the_manual_axes(rm):
    f = fm.shard_map(lambda v: v, in_specs=P(None, "tp"), out_specs=P(None, "tp"), mesh=rm, axis_names={"tp"})
    with pytest.raises(fm.MeshError, match=r"sharded over its manual axes \('tp',\) as its in_spec says"):
        f(dtensor(rm, P("tp")))  # sharded over tp along dim 0, the spec says dim 1
    # replicated over tp: its block is taken (no communication), as a full tensor's is
    x = dtensor(rm, P("dp"))
    out = f(x)
    assert tuple(out.placements) == (Shard(0), Shard(1))
    torch.testing.assert_close(out.to_local(), x.to_local()[:, 2:4])  # rank 5: tp index 1


def test_nested_regions_over_disjoint_axes(rm):
    seen = {}

    def inner(z):
        seen["inner"] = (type(z), fm.typeof(z))
        return fm.psum(z, "dp"), fm.psum(z, "tp")  # the enclosing region's axis is manual here too

    def outer(v):
        s, t = fm.shard_map(inner, in_specs=P("dp"), out_specs=(P(), P("dp")), axis_names={"dp"})(v)
        seen["outer"] = (type(s), tuple(s.placements), fm.typeof(s), tuple(t.placements), fm.typeof(t))
        return s, fm.psum(t, "tp")

    s, t = fm.shard_map(outer, in_specs=P("tp"), out_specs=(P("tp"), P()), mesh=rm, axis_names={"tp"})(
        torch.ones(16, 2))
    assert seen["inner"] == (torch.Tensor, fm.AxisTypes(frozenset({"dp", "tp"})))
    assert seen["outer"] == (DTensor, (Replicate(),), fm.AxisTypes(frozenset({"tp"})), (Shard(0),),
                             fm.AxisTypes(frozenset()))
    assert s.shape == (8, 2) and t.shape == (4, 2)


def test_nested_regions_that_overlap_or_differ(rm):
    def nest(names, check_vma=True, outer_names=frozenset({"tp"})):
        inner = fm.shard_map(lambda z: z, in_specs=P(), out_specs=P(), axis_names=names, check_vma=check_vma)
        return fm.shard_map(lambda v: inner(v), in_specs=P("tp"), out_specs=P("tp"), mesh=rm,
                            axis_names=outer_names or None)(torch.ones(8))

    with pytest.raises(fm.MeshError, match=r"regions nest over disjoint axis sets.*axis_names=\('tp',\) inside a "
                                           r"region manual over \('tp',\) \(the axes left: \('dp',\)\)"):
        nest({"tp"})
    with pytest.raises(fm.MeshError, match=r"disjoint.*axis_names=None inside a region manual over \('dp', 'tp'\)"):
        nest(None, outer_names=frozenset())
    with pytest.raises(fm.MeshError, match="with the same check_vma"):
        nest({"dp"}, check_vma=False)
    nest(None)  # the axes the enclosing region leaves: dp


def test_a_mixed_dim_keeps_the_manual_block_whole(rm):
    # dim 0 split over tp (manual, major) and dp (automatic): inside, the tp block is whole, a DTensor over dp
    x = dtensor(rm, P(("tp", "dp")), shape=(16, 2))
    seen = {}

    def f(v):
        seen["v"] = (tuple(v.placements), tuple(v.shape))
        return v

    out = fm.shard_map(f, in_specs=P("tp"), out_specs=P("tp"), mesh=rm, axis_names={"tp"})(x)
    assert seen["v"] == ((Shard(0),), (4, 2))
    assert tuple(out.placements) == tuple(x.placements)
    torch.testing.assert_close(out.to_local(), x.to_local())
    with pytest.raises(fm.MeshError, match="as its in_spec says"):  # dp major: no tp block is whole on a rank
        fm.shard_map(f, in_specs=P("tp"), out_specs=P("tp"), mesh=rm, axis_names={"tp"})(dtensor(rm, P(("dp", "tp")),
                                                                                            shape=(16, 2)))


@pytest.mark.slow  # two compiles, ~3 s each
@needs_compiled_regions()
@pytest.mark.parametrize("check_vma", [True, False])
def test_compiled_partial_region_is_one_graph(rm, check_vma):
    """fullgraph=True (no graph break, as for the full-manual region): a region manual over tp whose batch is a
    DTensor over dp, and a region nested in one; each equals the eager region."""
    x, w = dtensor(rm, P("dp")), torch.randn(8, 8)

    def body(v, w):
        h = torch.tanh(v * w.sum())
        return fm.psum(h, "tp") + fm.all_gather(h, "tp", dim=1, to="invariant").sum()

    mapped = fm.shard_map(body, in_specs=(P(None, "tp"), P()), out_specs=P(), mesh=rm, axis_names={"tp"},
                          check_vma=check_vma)
    torch._dynamo.reset()
    want = mapped(x, w)
    got = torch.compile(lambda a, b: mapped(a, b).to_local(), backend="aot_eager", fullgraph=True)(x, w)
    torch.testing.assert_close(got, want.to_local())

    def outer(v):  # and nested: the inner region manual over dp
        s, t = fm.shard_map(lambda z: (fm.psum(z, "dp"), fm.psum(z, "tp")), in_specs=P("dp"), out_specs=(P(), P("dp")),
                            axis_names={"dp"}, check_vma=check_vma)(v)
        return s, fm.psum(t, "tp")

    nested = fm.shard_map(outer, in_specs=P("tp"), out_specs=(P("tp"), P()), mesh=rm, axis_names={"tp"},
                          check_vma=check_vma)
    x = torch.randn(16, 2)
    torch._dynamo.reset()
    got = torch.compile(lambda a: [o.to_local() for o in nested(a)], backend="aot_eager", fullgraph=True)(x)
    for g, w in zip(got, nested(x), strict=True):
        torch.testing.assert_close(g, w.to_local())


@pytest.mark.parametrize("spec", [P(reduced={"tp"}), P(unreduced={"tp"}, unreduced_kind="max")])
def test_reduced_and_pending_max_specs_are_refused_in_a_partial_region(rm, spec):
    # not built yet for a region manual over some axes: a MeshError naming the spec and the way out, before
    # anything enters (docs/shard_map.md, "Manual over some axes")
    f = fm.shard_map(lambda v: v, in_specs=spec, out_specs=P(), mesh=rm, axis_names={"tp"})
    with pytest.raises(fm.MeshError, match=r"shard_map.*reduced=.*axis_names=.*manual over every axis") as e:
        f(torch.ones(4))
    assert str(spec) in str(e.value)
