"""realize(members_only=True), realize(groups=...) and fm.abort(ranks=...) in one process on torch's
fake backend (rank r of a world of W): which groups are made, named and reused, and the errors.

The real thing (disjoint meshes at once, a killed rank) runs on gloo in
tests/dist/test_members_only_gloo.py and tests/dist/test_elastic_gloo.py; this is the fast tier's
check. Expected groups come from the pure mesh (``group_of``).
"""

from __future__ import annotations

import inspect

import pytest
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm


@pytest.fixture
def start():
    def begin(rank: int, size: int) -> None:
        dist.init_process_group("fake", rank=rank, world_size=size, store=FakeStore())

    yield begin
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()


def test_members_only_makes_this_ranks_groups_only_and_moves_no_counter(start):
    start(5, 8)
    trainer = fm.make_mesh((8,), ("r",)).take(r=slice(2, 8)).unflatten("r", {"dp": 3, "tp": 2})
    counter = dist.distributed_c10d._world.group_count
    rm = fm.realize(trainer, members_only=True)
    for axis in ("dp", "tp"):
        assert dist.get_process_group_ranks(rm.group(axis)) == trainer[axis].group_of(5).reshape(-1).tolist()
    assert fm.cache_info().groups == 2  # its dp row and its tp row; none of the other 3 rows
    assert dist.distributed_c10d._world.group_count == counter
    names = {dist.distributed_c10d._get_process_group_name(rm.group(a)) for a in ("dp", "tp")}
    assert all(n.startswith("functional_mesh_local_") for n in names), names
    again = fm.realize(trainer.rename({"tp": "model"}), members_only=True)  # equal rank sets: shared
    assert again.group("model") is rm.group("tp") and fm.cache_info().groups == 2


def test_members_only_reuses_world_groups_and_world_calls_never_see_members_only_ones(start):
    start(1, 4)
    mesh = fm.make_mesh((2, 2), ("dp", "tp"))
    world_rm = fm.realize(mesh)
    small = fm.realize(mesh.take(dp=[0]), members_only=True)
    assert small.group("tp") is world_rm.group("tp") and fm.cache_info().groups == 4
    fm.clear_cache()
    only = fm.realize(mesh.take(dp=[0]), members_only=True)
    made = fm.cache_info().groups
    world_rm = fm.realize(mesh)  # makes its own tp group: ranks 2 and 3 have no members-only one
    assert world_rm.group("tp") is not only.group("tp") and fm.cache_info().groups == made + 4


def test_a_non_member_is_refused(start):
    start(7, 8)
    trainer = fm.make_mesh((8,), ("r",)).take(r=slice(0, 6))
    with pytest.raises(fm.MeshError, match=r"`realize` requires members_only=True to be called by ranks of the "
                                          r"mesh only, but got rank=7"):
        fm.realize(trainer, members_only=True)


def test_members_only_needs_a_default_group():
    assert not dist.is_initialized()
    with pytest.raises(fm.MeshError, match="initialised default group"):
        fm.realize(fm.make_mesh((2,), ("dp",)), members_only=True)


def test_an_adopted_group_is_used_and_never_cached(start):
    start(5, 8)
    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    mine = None
    for t in range(4):
        pg = dist.new_group([t, t + 4])
        mine = pg if t == 1 else mine
    rm = fm.realize(mesh, groups={"dp": mine})
    assert rm.group("dp") is mine and fm.cache_info().groups == 2  # tp's two rows only
    fm.abort()
    assert mine in dist.distributed_c10d._world.pg_map  # not aborted, not forgotten


@pytest.mark.parametrize(("groups", "message"), [
    ("world", r"an adopted group of axis 'dp''s size, but got groups\['dp'\]='a group of size 8'; valid: 2"),
    ("reversed", r"holds rank 5 at its coordinate along 'dp', .*group rank 0'; valid: 1"),
    ("unknown", r"groups= keys that are realized axes .* but got groups key='pp'; valid: \('dp', 'tp'\)"),
])
def test_an_adopted_group_is_checked(start, groups, message):
    start(5, 8)
    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    if groups == "world":
        given = {"dp": dist.group.WORLD}
    else:
        keeps_order = "sort_ranks" in inspect.signature(dist.new_group).parameters
        if groups == "reversed" and not keeps_order:
            pytest.skip("this torch's new_group always sorts its ranks (2.11): no reversed group to adopt")
        pg = None
        for t in range(4):
            made = dist.new_group([t + 4, t], **({"sort_ranks": False} if keeps_order else {}))
            pg = made if t == 1 else pg
        given = {"dp": pg} if groups == "reversed" else {"pp": pg}
    with pytest.raises(fm.MeshError, match=message):
        fm.realize(mesh, groups=given)
    with pytest.raises(TypeError, match="ProcessGroup"):
        fm.realize(mesh, groups={"dp": "not a group"})


def test_a_partial_abort_keeps_what_the_ranks_did_not_touch(start):
    start(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
    rm = fm.realize(mesh)
    kept = {a: rm.group(a) for a in ("dp_shard", "tp")}  # [5, 7] and [4, 5]: no rank 1 in them
    fm.abort(ranks=[1])
    with pytest.raises(fm.MeshError, match=r"abort\(ranks=\[1\]\)"):
        rm.group("tp")
    made = fm.cache_info().groups
    again = fm.realize(mesh)
    assert all(again.group(a) is pg for a, pg in kept.items())
    assert fm.cache_info().groups == made + 3  # the rows holding rank 1 again: [1, 5], [1, 3], [0, 1]
    with pytest.raises(fm.MeshError, match=r"`abort` requires a non-empty set of ranks of the world \(0..7\), "
                                           r"but got ranks=\[8\]"):
        fm.abort(ranks=[8])
    with pytest.raises(TypeError):
        fm.abort(ranks="1")
