"""NamedSharding.placements, read back by DTensor, give exactly our local slices on every rank.

DTensor's ``compute_local_shape_and_global_offset`` is torch's own shard arithmetic (what
``distribute_tensor`` and FSDP2 use), evaluated here for every rank of a fake world of 8.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm
from functional_mesh import P

MESHES = {
    "3d": fm.make_mesh((2, 2, 2), ("dp", "cp", "tp")),
    "permuted": fm.Mesh.from_ranks([[[7, 6], [5, 4]], [[3, 2], [1, 0]]], ("dp", "cp", "tp")),
}
SPECS = [
    P("dp"), P(None, "tp"), P("dp", "tp"), P(("dp", "tp")), P(("dp", "cp", "tp")),
    P(("tp", "dp")),  # against mesh order: _StridedShard, as FSDP2 + TP produce
    P(("tp", "cp"), "dp"), P(("cp", "dp", "tp")),
    P("dp", None), P(None, None),  # trailing Nones: other specs (P("dp") != P("dp", None)), same shards
]
SHAPES = [(8, 6), (5, 3), (6, 7), (7, 1), (0, 4)]


@pytest.mark.parametrize("name", sorted(MESHES))
def test_placements_reproduce_local_slices_on_every_rank(name):
    mesh = MESHES[name]
    checked = 0
    try:
        for rank in range(8):
            dist.init_process_group("fake", rank=rank, world_size=8, store=FakeStore())
            dm = fm.realize(mesh).device_mesh
            for spec in SPECS:
                sh = fm.NamedSharding(mesh, spec)
                for shape in SHAPES:
                    local, offset = compute_local_shape_and_global_offset(shape, dm, sh.placements)
                    ours = sh.local_slices(shape, rank)
                    assert tuple(local) == tuple(s.stop - s.start for s in ours), (spec, shape, rank)
                    # DTensor reports an empty shard's offset as the dim size; compare non-empty ones
                    assert [o for o, s in zip(offset, ours) if s.stop > s.start] == \
                        [s.start for s in ours if s.stop > s.start], (spec, shape, rank)
                    checked += 1
            fm.clear_cache()
            dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            fm.clear_cache()
            dist.destroy_process_group()
    assert checked == 8 * len(SPECS) * len(SHAPES)


def test_specs_that_differ_in_trailing_nones_have_the_same_placements_and_distinct_values():
    # DTensor placements do not record a spec's trailing Nones: sharding_of gives the shortest spec
    mesh = MESHES["3d"]
    for short, long in [(P(), P(None)), (P("dp"), P("dp", None)), (P(None, "tp"), P(None, "tp", None, None))]:
        a, b = fm.NamedSharding(mesh, short), fm.NamedSharding(mesh, long)
        assert a != b and a.placements == b.placements, (short, long)


def test_against_mesh_order_is_a_strided_shard():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    assert fm.NamedSharding(mesh, P(("tp", "dp"))).placements == (_StridedShard(0, split_factor=4), Shard(0))
    assert fm.NamedSharding(mesh, P(("dp", "tp"))).placements == (Shard(0), Shard(0))
