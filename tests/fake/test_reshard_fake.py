"""``fm.reshard``'s errors across meshes, and a bare ``PartitionSpec`` on the current mesh, in one process on
torch's fake backend (rank r of a world of 8).

Every error here is raised before anything is sent (so before any other rank could be left waiting);
the real exchanges run on gloo in tests/dist/test_reshard_gloo.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Shard

import functional_mesh as fm
from functional_mesh import NamedSharding, P

WORLD = fm.make_mesh((8,), ("r",))
TRAINER = WORLD.take(r=slice(0, 4)).unflatten("r", {"dp_shard": 2, "tp": 2})  # ranks 0-3
GENERATOR = WORLD.take(r=slice(4, 8)).unflatten("r", {"dp": 2, "tp": 2})  # ranks 4-7
SMALL = WORLD.take(r=slice(0, 3)).rename({"r": "a"})  # ranks 0-2


def source(rank: int, shape=(8, 4), spec=P("tp")):
    """This rank's leaf: a DTensor on the trainer's ranks, a ShapeDtypeStruct elsewhere."""
    sharding = NamedSharding(TRAINER, spec)
    if rank < 4:
        rm = fm.realize(TRAINER)
        return fm.distribute(torch.zeros(shape), sharding, mesh=rm)
    return fm.ShapeDtypeStruct(shape, torch.float32, sharding=sharding)


def error(fn) -> str:
    with pytest.raises(fm.MeshError) as info:
        fn()
    return str(info.value)


def test_a_rank_in_neither_mesh(fake_world):
    fake_world(8, 6)
    x = fm.ShapeDtypeStruct((6,), torch.float32, sharding=NamedSharding(SMALL, P("a")))
    message = error(lambda: fm.reshard(x, NamedSharding(WORLD.take(r=slice(3, 6)), P())))
    assert message.startswith("`reshard` requires a rank of the source or the destination mesh") and "rank=6" in message


def test_a_destination_rank_needs_the_destinations_mesh(fake_world):
    fake_world(8, 5)
    x = source(5)
    message = error(lambda: fm.reshard(x, NamedSharding(GENERATOR, P())))
    assert "mesh=<the destination's RealizedMesh>" in message and "members_only=True" in message
    other = fm.realize(WORLD)
    message = error(lambda: fm.reshard(x, NamedSharding(GENERATOR, P()), mesh=other))
    assert "mesh= to be the destination's realized mesh" in message and "Mesh(r=8)" in message
    with pytest.raises(TypeError, match="RealizedMesh"):
        fm.reshard(x, NamedSharding(GENERATOR, P()), mesh=GENERATOR)


def test_the_current_mesh_serves_as_the_destination(fake_world):
    fake_world(8, 5)
    x = source(5)
    with fm.realize(TRAINER):  # not the destination: still missing
        assert "mesh=<the destination's RealizedMesh>" in error(lambda: fm.reshard(x, NamedSharding(GENERATOR, P())))


def test_an_unreduced_source(fake_world):
    fake_world(8, 1)
    rm = fm.realize(TRAINER)
    partial = DTensor.from_local(torch.ones(4, 4), rm.device_mesh, [Partial(), Shard(0)], run_check=False)
    message = error(lambda: fm.reshard(partial, NamedSharding(GENERATOR, P())))
    assert "without unreduced axes" in message and "unreduced={'dp_shard'}" in message
    fake_world(8, 6)
    x = fm.ShapeDtypeStruct((8, 4), torch.float32, sharding=NamedSharding(TRAINER, P("tp", unreduced="dp_shard")))
    assert "without unreduced axes" in error(lambda: fm.reshard(x, NamedSharding(GENERATOR, P()),
                                                                  mesh=fm.realize(GENERATOR)))


def test_the_wrong_kind_of_leaf_for_the_rank(fake_world):
    fake_world(8, 2)
    fm.realize(TRAINER)
    struct = fm.ShapeDtypeStruct((8, 4), torch.float32, sharding=NamedSharding(TRAINER, P("tp")))
    assert "the DTensor itself on a rank holding part of the source" in error(
        lambda: fm.reshard(struct, NamedSharding(GENERATOR, P())))
    with pytest.raises(TypeError, match="a DTensor or an fm.ShapeDtypeStruct"):
        fm.reshard(torch.zeros(8, 4), NamedSharding(GENERATOR, P()))
    bare = fm.ShapeDtypeStruct((8, 4), torch.float32)
    assert "a ShapeDtypeStruct with the source's NamedSharding" in error(
        lambda: fm.reshard(bare, NamedSharding(GENERATOR, P())))


def test_mismatched_trees_and_destinations(fake_world):
    fake_world(8, 1)
    x = {"a": source(1), "b": source(1)}
    message = error(lambda: fm.reshard(x, {"a": NamedSharding(GENERATOR, P()), "c": NamedSharding(GENERATOR, P())}))
    assert "a sharding tree that matches the value's tree" in message
    message = error(lambda: fm.reshard(x, {"a": NamedSharding(GENERATOR, P()), "b": NamedSharding(SMALL, P())}))
    assert "one destination mesh for every leaf" in message
    with pytest.raises(TypeError, match="a NamedSharding or a PartitionSpec"):
        fm.reshard(x, {"a": NamedSharding(GENERATOR, P()), "b": "tp"})
    assert "bucket_bytes=None or a positive int" in error(lambda: fm.reshard(x, NamedSharding(GENERATOR, P()),
                                                                             bucket_bytes=0))


def test_a_bare_spec_without_a_mesh(fake_world):
    fake_world(8, 5)
    assert "mesh=<RealizedMesh> or an enclosing `with rm:` block" in error(lambda: fm.reshard(source(5), P()))


def test_a_bare_spec_on_the_current_mesh(fake_world):
    """As jax.reshard: fm.reshard(x, P(...)) inside `with rm:` means NamedSharding(rm.mesh, P(...))."""
    fake_world(8, 5)
    rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    x = fm.distribute(torch.arange(16.0).reshape(4, 4), NamedSharding(rm.mesh, P("tp")), mesh=rm)
    with rm:
        y = fm.reshard(x, P(None, "dp"))
    assert fm.sharding_of(y) == NamedSharding(rm.mesh, P(None, "dp"))
    assert fm.sharding_of(fm.reshard(x, P("dp"), mesh=rm)) == NamedSharding(rm.mesh, P("dp"))
    assert "mesh=<RealizedMesh> or an enclosing `with rm:` block" in error(lambda: fm.reshard(x, P()))


@pytest.mark.parametrize("rank", [1, 5])
def test_the_whole_path_runs_on_the_fake_backend(fake_world, rank):
    """Every stage's exchange is issued (the fake backend moves no data): a rank with nothing to send or
    receive in a stage sends itself one byte, since the fake backend refuses an empty buffer."""
    fake_world(8, rank)
    rm_gen = fm.realize(GENERATOR)
    x = {"w": source(rank), "b": source(rank, (6,), P())}
    out = fm.reshard(x, {"w": NamedSharding(GENERATOR, P(None, "tp")), "b": NamedSharding(GENERATOR, P())},
                     mesh=rm_gen if rank >= 4 else None)
    if rank < 4:
        assert out is None
        return
    assert out["w"].placements == NamedSharding(GENERATOR, P(None, "tp")).placements and out["w"].shape == (8, 4)
    assert out["w"].to_local().shape == (8, 2) and out["b"].to_local().shape == (6,)
    assert out["w"].device_mesh is rm_gen.device_mesh
