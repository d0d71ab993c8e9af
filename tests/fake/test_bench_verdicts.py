"""The claims behind the benchmark figures, asserted under torch's single-process fake backend.

``benchmarks/bench_realize.py`` counts the process groups that a torchtitan-style sequence of
meshes costs each side, and ``benchmarks/bench_transforms.py`` times pure operations against
torch's ``DeviceMesh``; they only measure. What must hold for those figures to mean anything is
checked here:

- realizing the sequence makes exactly one group per distinct rank set the pure meshes name (no
  repeats, none missing, ``cache_info().groups`` agrees), and torch's ``DeviceMesh`` doing the
  same steps asks for the same rank sets, at least as many times;
- every operation the transforms benchmark times on both sides gives the same groups,
  coordinates and process-group members as torch's ``DeviceMesh``;
- ``benchmarks/bench_collectives.py`` and ``bench_eager.py`` time each collective against "the raw
  c10d call it makes", and a transformer block in ``shard_map`` against the same block by hand:
  each pair makes the same ``torch.distributed`` calls (function, group, bytes sent to and
  received from each member), so what they time apart is dispatch.

Expected rank sets come from ``mesh[axis].groups()`` of the pure meshes or from torch itself.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # registers the "fake" backend
from torch.distributed import device_mesh
from torch.distributed import distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

import functional_mesh as fm

TITAN = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FLATTENS = (("dp", ("dp_replicate", "dp_shard")), ("dp_shard_cp", ("dp_shard", "cp")),
            ("dp_cp", ("dp_replicate", "dp_shard", "cp")), ("batch", ("dp_replicate", "dp_shard")))


@pytest.fixture
def requested(monkeypatch):
    """The rank list of every ``new_group`` / ``split_group`` call, under any name it is looked up by."""
    calls: list[tuple[int, ...]] = []
    for name in ("new_group", "split_group"):
        real = getattr(c10d, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            if _name == "new_group":
                calls.append(tuple(kwargs.get("ranks", args[0] if args else None) or ()))
            else:  # split_group(parent_pg, split_ranks, ...): one call, several groups
                calls.append(tuple(map(tuple, kwargs.get("split_ranks", args[1] if len(args) > 1 else None))))
            return _real(*args, **kwargs)

        for module in (c10d, dist, device_mesh):
            if getattr(module, name, None) is real:
                monkeypatch.setattr(module, name, counted)
    return calls


def titan_sizes(world: int) -> dict[str, int]:
    return dict(zip(TITAN, (2, 2, world // 16, 2, 2)))


def ours_sequence(world: int) -> list[fm.Mesh]:
    """The meshes bench_realize realizes, in order."""
    world_mesh = fm.make_mesh((world,), ("world",))
    mesh = world_mesh.unflatten("world", titan_sizes(world))
    flat = [mesh.flatten(axes, name=name) for name, axes in FLATTENS]
    n = flat[2].axis_size("dp_cp")
    return [world_mesh, mesh, *flat, flat[2].unflatten("dp_cp", {"hsdp_rep": 2, "hsdp_shard": n // 2})]


def torch_sequence(world: int) -> list[DeviceMesh]:
    """The same steps with torch's DeviceMesh, as bench_realize times them."""
    sizes = titan_sizes(world)
    root = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    mesh = root._unflatten(0, tuple(sizes.values()), tuple(sizes))
    flat = [mesh[axes]._flatten(name) for name, axes in FLATTENS]
    return [root, mesh, *flat, flat[2]._unflatten(0, (2, flat[2].size() // 2), ("hsdp_rep", "hsdp_shard"))]


def needed_rank_sets(meshes: list[fm.Mesh], world: int) -> set[tuple[int, ...]]:
    """Every group of every axis of the pure meshes, but the whole world (the default group serves it)."""
    sets = {tuple(row) for mesh in meshes for axis in mesh.axis_names
            for row in mesh[axis].groups().reshape(mesh[axis].num_groups, -1).tolist()}
    sets.discard(tuple(range(world)))
    return sets


@pytest.mark.parametrize(("world", "rank"), [(32, 0), (256, 131)])
def test_realize_sequence_makes_one_group_per_distinct_rank_set(fake_world, requested, world, rank):
    meshes = ours_sequence(world)
    needed = needed_rank_sets(meshes, world)
    assert min(map(len, needed)) > 1  # no size-1 axis, so no rank-local singleton groups to count apart
    fake_world(world, rank)
    for mesh in meshes:
        fm.realize(mesh)
    assert len(requested) == len(needed) == fm.cache_info().groups
    assert set(requested) == needed


@pytest.mark.parametrize("world", [32, 256])
def test_torch_device_mesh_sequence_asks_for_the_same_rank_sets_at_least_as_often(fake_world, requested, world):
    needed = needed_rank_sets(ours_sequence(world), world)
    fake_world(world)
    torch_sequence(world)
    assert len(requested) >= len(needed)
    assert {tuple(sorted(ranks)) for ranks in requested} == {tuple(sorted(ranks)) for ranks in needed}


def transform_pairs(world: int) -> list[tuple[str, fm.Mesh, DeviceMesh]]:
    """(operation, ours, torch's) for what bench_transforms times, on a (W/64, 8, 8) mesh; torch has
    no transpose or rename, so those are compared with a DeviceMesh built from the permuted tensor."""
    shape, names = (world // 64, 8, 8), ("dp", "cp", "tp")
    mesh, dm = fm.make_mesh(shape, names), init_device_mesh("cpu", shape, mesh_dim_names=names)
    ranks = torch.arange(world).reshape(shape)
    return [
        ("make_mesh", mesh, dm),
        ("select 1 axis", mesh["tp"], dm["tp"]),
        ("select 2 axes", mesh["dp", "tp"], dm["dp", "tp"]),
        ("flatten (cp, tp)", mesh["cp", "tp"].flatten(name="cp_tp"), dm["cp", "tp"]._flatten("cp_tp")),
        ("flatten (dp, tp)", mesh["dp", "tp"].flatten(name="dp_tp"), dm["dp", "tp"]._flatten("dp_tp")),
        ("unflatten dp", mesh.unflatten("dp", {"d0": 2, "d1": shape[0] // 2}),
         dm._unflatten(0, (2, shape[0] // 2), ("d0", "d1"))),
        ("transpose", mesh.transpose("tp", "dp", "cp"),
         DeviceMesh("cpu", ranks.permute(2, 0, 1), mesh_dim_names=("tp", "dp", "cp"))),
        ("rename", mesh.rename({"dp": "data"}), DeviceMesh("cpu", ranks, mesh_dim_names=("data", "cp", "tp"))),
    ]


@pytest.mark.parametrize("rank", [0, 77, 255])
def test_timed_operations_give_torch_device_mesh_groups_and_coordinates(fake_world, rank):
    fake_world(256, rank)
    for op, ours, theirs in transform_pairs(256):
        assert ours.axis_names == theirs.mesh_dim_names, op
        assert ours.group_of(rank).tolist() == theirs.mesh.tolist(), op
        assert ours.coordinate(rank) == tuple(theirs.get_coordinate()), op
        for axis in ours.axis_names:
            members = dist.get_process_group_ranks(theirs.get_group(axis))
            assert sorted(ours[axis].group_of(rank).ravel().tolist()) == sorted(members), (op, axis)
        assert pickle.loads(pickle.dumps(ours)) == ours, op


def test_equality_and_hash_of_timed_slices_agree_with_torch(fake_world):
    fake_world(256)
    mesh, dm = transform_pairs(256)[0][1:]
    for a, b in ((("dp", "tp"), ("dp", "tp")), (("dp", "tp"), ("cp", "tp")), ("tp", ("tp",))):
        assert (mesh[a] == mesh[b]) is (dm[a] == dm[b]), (a, b)
        if dm[a] == dm[b]:
            assert hash(mesh[a]) == hash(mesh[b]), (a, b)


# -- bench_collectives / bench_eager: ours and the raw call communicate alike ---------------------------

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class C10dCalls(TorchDispatchMode):
    """Every c10d operation dispatched (however it was called: ``dist.*`` or the group's own
    method), as (op, group ranks, elements per member each way for an all-to-all, else the
    elements of each tensor argument)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            groups = [ProcessGroup.unbox(a) for a in args
                      if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type())]
            ranks = tuple(dist.get_process_group_ranks(groups[0]))
            tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
            if func.name().startswith("c10d::alltoall_base"):
                out, x, _, out_splits, in_splits = args[:5]
                shape = tuple(self._per_member(t, splits, len(ranks)) for t, splits in ((x, in_splits), (out, out_splits)))
            else:
                shape = tuple(t.numel() for t in tensors)
            self.calls.append((func.name(), ranks, shape))
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _per_member(t: torch.Tensor, splits: list[int], n: int) -> tuple[int, ...]:
        """Split sizes in rows of dim 0 (empty: equal blocks) as elements per member."""
        if not splits:
            return (t.numel() // n,) * n
        return tuple(k * (t.numel() // max(t.shape[0], 1)) for k in splits)

    def during(self, call) -> list[tuple]:
        self.calls = []
        with self:
            call()
        return self.calls


@pytest.fixture
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_collectives
    import bench_eager
    return bench_collectives, bench_eager


@pytest.mark.parametrize("nbytes", [4 << 10])
def test_each_collective_and_its_raw_call_make_the_same_c10d_call(fake_world, bench_modules, nbytes):
    fake_world(8, 5)
    rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    pairs = bench_modules[0].pairs(rm, "tp", nbytes)
    assert set(pairs) >= {"psum", "all_gather", "psum_scatter", "all_to_all", "ragged_all_to_all", "ppermute",
                          "pvary"}
    for name, (ours, raw) in pairs.items():
        seen = [C10dCalls().during(call) for call in (ours, raw)]
        assert seen[0] == seen[1], name
        assert len(seen[0]) == (name != "pvary"), name
        if seen[0]:
            assert seen[0][0][1] == (4, 5, 6, 7), name  # rank 5's tp group


def test_block_by_hand_and_in_shard_map_communicate_alike(fake_world, bench_modules):
    fake_world(8, 0)
    rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    bench_eager = bench_modules[1]
    calls, _ = bench_eager.block_calls(rm["tp"], "small")
    assert list(calls) == list(bench_eager.BLOCK)
    seen = {name: C10dCalls().during(step) for name, step in calls.items()}
    hand = seen[bench_eager.BLOCK[0]]
    # forward: gather, scatter, gather, scatter; backward the transposes (4 more)
    assert [c[0] for c in hand[:4]] == ["c10d::_allgather_base_", "c10d::_reduce_scatter_base_"] * 2
    assert len(hand) == 8
    for name, calls_made in seen.items():
        assert calls_made == hand, name
