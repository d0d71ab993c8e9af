"""Collectives' arguments and the communication-free queries, under the fake backend.

Values of real collectives are tested on gloo (tests/dist/); fake collectives carry no data.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm

MESH = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))


@pytest.fixture
def rm():
    dist.init_process_group("fake", rank=6, world_size=8, store=FakeStore())
    try:
        yield fm.realize(MESH)
    finally:
        fm.clear_cache()
        dist.destroy_process_group()


def test_axis_index_and_size_follow_mesh_order_first_axis_major(rm):
    # rank 6 has coordinate (1, 1, 0) on (dp, cp, tp)
    assert [fm.axis_index(a, mesh=rm) for a in ("dp", "cp", "tp")] == [1, 1, 0]
    assert fm.axis_index(("dp", "cp"), mesh=rm) == 1 * 2 + 1
    assert fm.axis_index(("cp", "tp", "dp"), mesh=rm) == (1 * 2 + 0) * 2 + 1
    assert fm.axis_size(("dp", "tp"), mesh=rm) == 4
    with rm:
        assert fm.axis_index("dp") == 1 and isinstance(fm.axis_size("tp"), int)


def test_mesh_argument_errors(rm):
    x = torch.ones(4)
    with pytest.raises(TypeError, match=r"`psum` requires a RealizedMesh, but got the pure mesh .*call fm.realize"):
        fm.psum(x, "tp", mesh=MESH)
    with pytest.raises(fm.MeshError, match=r"`all_gather` requires mesh=<RealizedMesh> or an enclosing `with rm:`"):
        fm.all_gather(x, "tp")
    with pytest.raises(KeyError, match=r"did you mean 'tp'"):
        fm.psum(x, "tpp", mesh=rm)
    with pytest.raises(fm.MeshError, match=r"distinct axis names"):
        fm.psum(x, ("tp", "tp"), mesh=rm)
    with pytest.raises(TypeError, match=r"`psum` requires a torch.Tensor, but got x=\[1\]"):
        fm.psum([1], "tp", mesh=rm)


def test_shape_and_permutation_errors(rm):
    with pytest.raises(fm.MeshError, match=r"dim 0 divisible by 4, but got x.shape\[0\]=6"):
        fm.psum_scatter(torch.ones(6), ("dp", "tp"), mesh=rm)
    with pytest.raises(fm.MeshError, match=r"dim 0 of size 2 \(tiled=False\), but got x.shape\[0\]=4"):
        fm.psum_scatter(torch.ones(4), "tp", tiled=False, mesh=rm)
    # a tuple without its product group composes per axis (values: tests/dist/test_collectives_gloo.py)
    assert fm.all_to_all(torch.ones(4, 2), ("dp", "tp"), 0, 1, mesh=rm).shape == (1, 8)
    with pytest.raises(fm.MeshError, match=r"split_dim divisible by 4, but got x.shape\[0\]=6"):
        fm.all_to_all(torch.ones(6), ("dp", "tp"), 0, 0, mesh=rm)
    with pytest.raises(fm.MeshError, match=r"a dim of the 1-d tensor, but got dim=3"):
        fm.all_gather(torch.ones(4), "tp", dim=3, mesh=rm)
    with pytest.raises(fm.MeshError, match=r"axis indices in 0\.\.1, but got pair=\(0, 2\)"):
        fm.ppermute(torch.ones(1), "tp", [(0, 2)], mesh=rm)
    with pytest.raises(fm.MeshError, match=r"each destination at most once"):
        fm.ppermute(torch.ones(1), "tp", [(0, 1), (1, 1)], mesh=rm)
    with pytest.raises(TypeError, match=r"\(source, destination\) pairs, but got pair=3"):
        fm.ppermute(torch.ones(1), "tp", [3], mesh=rm)


def test_ranks_outside_the_mesh_get_a_clear_error():
    dist.init_process_group("fake", rank=1, world_size=8, store=FakeStore())
    try:
        rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp"), devices=range(4, 8)))
        with pytest.raises(fm.MeshError, match=r"a rank that belongs to the mesh, but got rank=1; valid: devices 4\.\.7"):
            fm.psum(torch.ones(1), "tp", mesh=rm)
        assert fm.distribute(torch.ones(4), fm.NamedSharding(rm.mesh, fm.P("tp")), mesh=rm) is None
    finally:
        fm.clear_cache()
        dist.destroy_process_group()


def test_jax_idioms_get_errors_that_translate_them(rm):
    # JAX's psum(1, axis_name) is the size of the axes: here fm.axis_size, eagerly and in a region
    psum_one = (r"`psum` requires a torch.Tensor, but got x=1; for the size of the axes \(JAX's psum\(1, "
                r"axis_name\)\) call fm.axis_size\(axis\), a Python int")
    with pytest.raises(TypeError, match=psum_one):
        fm.psum(1, "tp", mesh=rm)
    with pytest.raises(TypeError, match=psum_one):
        fm.shard_map(lambda v: v * fm.psum(1, "tp"), mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P("tp"))(torch.ones(4))
    assert fm.axis_size("tp", mesh=rm) == 2
    # JAX's all_gather(x, axis_name, axis=0): our axis is JAX's axis_name, JAX's axis= is our dim=
    with pytest.raises(TypeError, match=r"`all_gather` requires the mesh axis as its second argument and the "
                                        r"gathered dim as dim= \(our axis is JAX's axis_name; JAX's axis= is our "
                                        r"dim=\), but got axis=1; write fm.all_gather\(x, 'tp', dim=1\)"):
        fm.all_gather(torch.ones(2, 2), "tp", axis=1, mesh=rm)
    # the translation keeps the signature, and axis by keyword alone is still ours
    assert inspect.signature(fm.all_gather) == inspect.signature(fm.all_gather.__wrapped__)
    assert fm.all_gather(torch.ones(2, 2), axis="tp", dim=1, mesh=rm).shape == (2, 4)


def test_a_varying_gather_returned_as_invariant_gets_the_invariant_gather_as_its_fix(rm):
    # out_specs P() says every member holds the same value; all_gather(to="varying") says otherwise
    def body(x):
        return fm.all_gather(x, "tp", to="varying")

    with pytest.raises(fm.VmaError, match=r"gather with all_gather\(x, 'tp', to='invariant'\) instead"):
        fm.shard_map(body, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())(torch.ones(4))
    # the same value made otherwise gets no such hint
    with pytest.raises(fm.VmaError) as info:
        fm.shard_map(lambda x: x * 2, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())(torch.ones(4))
    assert "to='invariant'" not in str(info.value) and "psum or all_gather over 'tp'" in str(info.value)
