"""realize() under torch's single-process fake backend: any rank of a large world, in one process.

Fake collectives carry no data, so values are tested on gloo (tests/dist/); here we test what
realize decides: which groups exist, their members in mesh order, what the cache shares, what
is created, and the torch DeviceMesh it hands out. Expected groups come from the pure Mesh
(itself checked against torch's DeviceMesh by tests/oracle/).
"""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm

TITAN = {"pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2}


@pytest.fixture
def world(monkeypatch):
    """Start a fake world as ``rank``; count every new_group / split_group call realize makes."""
    calls: Counter = Counter()
    real_new, real_split = dist.new_group, dist.split_group

    def new_group(ranks=None, *args, **kwargs):
        calls["new_group"] += 1
        calls["local" if kwargs.get("use_local_synchronization") else "world"] += 1
        return real_new(ranks, *args, **kwargs)

    def split_group(*args, **kwargs):
        calls["split_group"] += 1
        return real_split(*args, **kwargs)

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "split_group", split_group)

    def start(rank: int, size: int) -> Counter:
        if dist.is_initialized():
            fm.clear_cache()
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=rank, world_size=size, store=FakeStore())
        calls.clear()
        return calls

    yield start
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()


def rows(mesh: fm.Mesh, axis: str) -> set[tuple[int, ...]]:
    fam = mesh[axis]
    return {tuple(r) for r in fam.groups().reshape(fam.num_groups, -1).tolist()}


@pytest.mark.parametrize("rank", [0, 13, 31])
def test_every_axis_group_is_the_pure_row_in_mesh_order(world, rank):
    world(rank, 32)
    mesh = fm.make_mesh((32,), ("world",)).unflatten("world", TITAN)
    rm = fm.realize(mesh)
    assert rm.coordinate == mesh.coordinate(rank)
    for i, axis in enumerate(mesh.axis_names):
        group = rm.group(axis)
        assert dist.get_process_group_ranks(group) == mesh[axis].group_of(rank).tolist()
        assert dist.get_rank(group) == rm.local_rank(axis) == rm.coordinate[i]


@pytest.mark.parametrize("rank", [0, 6])
def test_permuted_device_list_keeps_mesh_order_in_groups(world, rank):
    world(rank, 8)
    mesh = fm.Mesh.from_ranks([[7, 6, 5, 4], [3, 2, 1, 0]], ("dp", "tp"))
    rm = fm.realize(mesh)
    for axis in ("dp", "tp"):
        members = dist.get_process_group_ranks(rm.group(axis))
        assert members == mesh[axis].group_of(rank).tolist()
        assert dist.get_rank(rm.group(axis)) == rm.local_rank(axis)
    assert tuple(rm.device_mesh.get_coordinate()) == mesh.coordinate(rank)


def test_one_group_per_distinct_rank_set_for_the_torchtitan_sequence(world):
    calls = world(5, 32)
    mesh = fm.make_mesh((32,), ("world",)).unflatten("world", TITAN)
    steps = [
        mesh,
        mesh.flatten(("dp_replicate", "dp_shard"), name="dp"),
        mesh.flatten(("dp_shard", "cp"), name="dp_shard_cp"),
        mesh.flatten(("dp_replicate", "dp_shard", "cp"), name="dp_cp"),
        mesh.flatten(("dp_replicate", "dp_shard"), name="batch"),  # dp's layout under another name
        mesh.flatten(("dp_replicate", "dp_shard", "cp"), name="dp_cp").unflatten("dp_cp", {"r": 2, "s": 4}),
    ]
    distinct: set[tuple[int, ...]] = set()
    for m in steps:
        fm.realize(m)
        for axis in m.axis_names:
            distinct |= rows(m, axis)
    assert calls["new_group"] == calls["world"] == len(distinct)  # one call per distinct rank set
    assert calls["split_group"] == 0
    assert fm.cache_info().groups == len(distinct)


def test_equal_layouts_reached_by_different_paths_share_one_group(world):
    world(2, 8)
    a = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    b = fm.realize(fm.make_mesh((8,), ("w",)).unflatten("w", {"x": 2, "tp": 4}))
    c = fm.realize(fm.Mesh.from_ranks([[0, 1, 2, 3], [4, 5, 6, 7]], ("y", "tp")))
    d = fm.realize(fm.make_mesh((2, 2, 2), ("p", "q", "r")).flatten(("q", "r"), name="other_name"))
    assert a.group("tp") is b.group("tp") is c.group("tp") is d.group("other_name")
    assert a.group("dp") is b.group("x") is c.group("y") is d.group("p")


def test_a_second_realize_creates_nothing_and_counts_hits(world):
    calls = world(3, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    fm.realize(mesh)
    made, before = fm.cache_info().groups, sum(calls.values())
    assert fm.cache_info().misses == 3
    again = fm.realize(fm.make_mesh((2, 2, 2), ("dp", "cp", "tp")))
    assert sum(calls.values()) == before and fm.cache_info() == fm.CacheInfo(hits=3, misses=3, groups=made)
    assert again.group("tp") is fm.realize(mesh).group("tp")


def test_size1_axes_make_no_group_and_torch_is_lent_one_uncounted_one_rank_group(world):
    # Was: each rank made one local singleton group per (backend, options). On NCCL that is a real
    # one-rank communicator (hundreds of MiB of GPU memory, docs/design.md "Size-1 axes"), so a size-1 axis now
    # costs no group at all; torch is lent a one-rank fake-backend group when it asks for one.
    calls = world(4, 8)
    c10d = dist.distributed_c10d._world
    count, live = c10d.group_count, len(c10d.pg_map)
    mesh = fm.make_mesh((2, 1, 1, 4), ("dp", "ep", "pp", "tp"))
    rm = fm.realize(mesh, products=[("ep", "pp"), ("dp", "ep")])
    assert calls["local"] == calls["split_group"] == 0
    assert calls["new_group"] == calls["world"] == len(rows(mesh, "dp")) + len(rows(mesh, "tp"))
    assert fm.cache_info().groups == calls["world"]  # no tuple for the size-1 axes
    made = calls["new_group"]
    # realize made the lent group: this rank's one-rank group on the fake backend, outside torch's
    # group counter (count moved by dp's and tp's groups only) and not through new_group / split_group
    assert c10d.group_count == count + made and len(c10d.pg_map) == live + 3  # dp, tp, the lent group
    fm.realize(fm.make_mesh((1, 8), ("one", "w")))  # a size-1 axis and the default group: nothing new
    assert calls["new_group"] == made and len(c10d.pg_map) == live + 3
    lent = rm.group("ep")  # asked for: read, not made
    assert dist.get_process_group_ranks(lent) == [4] and dist.get_rank(lent) == 0 and lent.size() == 1
    assert dist.get_backend(lent) == "fake" and lent.group_desc == "mesh_size1"
    assert calls["new_group"] == made and calls["split_group"] == 0
    # one lent group for every size-1 axis and product, of every mesh
    again = fm.realize(fm.make_mesh((1, 8), ("one", "w")))
    assert rm.group("pp") is rm.group(("ep", "pp")) is rm.group(("ep",)) is again.group("one") is lent
    assert rm.group(("dp", "ep")) is rm.group("dp")  # a product with a size-1 axis: the dp rows, shared
    assert len(c10d.pg_map) == live + 3
    fm.clear_cache()  # destroys it with the groups realize made
    assert lent not in c10d.pg_map


def test_the_whole_world_ascending_reuses_the_default_group(world):
    calls = world(1, 8)
    rm = fm.realize(fm.make_mesh((8,), ("w",)))
    assert rm.group("w") is dist.group.WORLD and sum(calls.values()) == 0
    rev = fm.realize(fm.make_mesh((8,), ("w",), devices=range(7, -1, -1)))
    assert rev.group("w") is not dist.group.WORLD  # same ranks, other order: another group
    assert dist.get_process_group_ranks(rev.group("w")) == list(range(7, -1, -1))


def test_ranks_outside_the_mesh_take_part_and_get_none(world):
    calls = world(1, 8)
    rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp"), devices=range(4, 8)))
    assert rm.coordinate is None and rm.device_mesh is None
    assert rm.group("dp") is None and rm.group("tp") is None
    assert calls["world"] == 4  # it still made every (non-member) group, in the common order
    with pytest.raises(fm.MeshError, match=r"a rank that belongs to the mesh, but got rank=1; valid: devices 4\.\.7"):
        rm.local_rank("tp")


def test_devices_beyond_the_world_are_refused(world):
    world(0, 8)
    with pytest.raises(fm.MeshError, match=r"devices that are ranks of the world \(0\.\.7\), but got largest device=9"):
        fm.realize(fm.make_mesh((2,), ("a",), devices=[3, 9]))


def test_products_give_tuple_groups(world):
    world(6, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    rm = fm.realize(mesh, products=[("dp", "cp"), ("tp", "dp")])
    for axes in (("dp", "cp"), ("tp", "dp")):
        expected = mesh[axes].flatten().group_of(6).tolist()
        assert dist.get_process_group_ranks(rm.group(axes)) == expected
    assert rm.group(("tp",)) is rm.group("tp")
    with pytest.raises(fm.MeshError, match=r"a product of axes that was realized, but got axis=\('cp', 'tp'\).*"
                                           r"pass products=\[\('cp', 'tp'\)\]"):
        rm.group(("cp", "tp"))
    with pytest.raises(KeyError, match=r"did you mean 'tp'"):
        fm.realize(mesh, products=[("dp", "tpp")])


def test_device_mesh_selections_in_order_share_the_root(world):
    world(5, 8)
    rm = fm.realize(fm.make_mesh((2, 2, 2), ("dp_replicate", "dp_shard", "tp")))
    root = rm.device_mesh
    hsdp, tp = rm["dp_replicate", "dp_shard"].device_mesh, rm["tp"].device_mesh
    assert hsdp._get_root_mesh() is root and tp._get_root_mesh() is root
    assert tp.mesh.tolist() == rm.mesh["tp"].group_of(5).tolist()
    assert tuple(hsdp.get_coordinate()) == rm.mesh["dp_replicate", "dp_shard"].coordinate(5)
    transposed = rm["tp", "dp_replicate"].device_mesh  # torch cannot slice this order: its own root
    assert transposed._get_root_mesh() is transposed
    assert transposed.mesh.tolist() == rm.mesh["tp", "dp_replicate"].group_of(5).tolist()
    assert rm.device_mesh is root  # built once


def test_clear_cache_invalidates_realized_meshes(world):
    world(0, 8)
    rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    pg_map = dist.distributed_c10d._world.pg_map
    live = len(pg_map)  # c10d registers only the groups this rank belongs to: default, dp, tp
    fm.clear_cache()
    assert len(pg_map) == live - 2 and dist.group.WORLD in pg_map
    assert fm.cache_info() == fm.CacheInfo(0, 0, 0)
    for use in (lambda: rm.group("tp"), lambda: rm.device_mesh, lambda: rm["tp"]):
        with pytest.raises(fm.MeshError, match=r"whose groups clear_cache\(\) destroyed; call realize\(mesh\) again"):
            use()


def test_realized_mesh_refuses_to_pickle_but_its_mesh_round_trips(world):
    world(0, 4)
    rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp")))
    with pytest.raises(TypeError, match=r"cannot be pickled; pickle rm.mesh"):
        pickle.dumps(rm)
    assert pickle.loads(pickle.dumps(rm.mesh)) == rm.mesh


def test_with_sets_the_current_mesh(world):
    world(0, 4)
    a = fm.realize(fm.make_mesh((2, 2), ("dp", "tp")))
    b = a["tp"]
    assert fm.current_mesh() is None
    with a:
        assert fm.current_mesh() is a
        with b:
            assert fm.current_mesh() is b
        assert fm.current_mesh() is a
    assert fm.current_mesh() is None


def test_device_is_cpu_or_the_current_cuda_device(world, monkeypatch):
    world(3, 8)
    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    assert fm.realize(mesh).device == torch.device("cpu")
    # the CUDA branch (no GPU here): the device realize made current from LOCAL_RANK
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert fm.realize(mesh, device_type="cuda").device == torch.device("cuda", 3)


def test_bad_arguments(world):
    world(0, 4)
    with pytest.raises(TypeError, match=r"`realize` requires a functional_mesh.Mesh, but got mesh=\(2, 2\)"):
        fm.realize((2, 2))
    with pytest.raises(fm.MeshError, match=r"timeout=None, a positive timedelta or a positive, finite number of seconds, but got timeout=-1"):
        fm.realize(fm.make_mesh((4,), ("w",)), timeout=-1)
    with pytest.raises(fm.MeshError, match=r"a supported device type, but got device_type='tpu'"):
        fm.realize(fm.make_mesh((4,), ("w",)), device_type="tpu")


def test_from_device_mesh_recovers_every_group(world):
    world(3, 16)
    dm = init_device_mesh("cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp"))
    ours = fm.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    assert fm.from_device_mesh(dm) == ours
    assert fm.from_device_mesh(dm["cp", "tp"]) == ours["cp", "tp"]
    flat = dm["dp", "tp"]._flatten("dp_tp")
    assert np.array_equal(fm.from_device_mesh(flat).groups(), ours["dp", "tp"].flatten().groups())
    with pytest.raises(TypeError, match=r"a torch DeviceMesh"):
        fm.from_device_mesh(ours)


def test_a_large_world_is_one_pass_of_distinct_groups(world):
    calls = world(4095, 4096)
    mesh = fm.make_mesh((64, 8, 8), ("dp", "cp", "tp"))
    rm = fm.realize(mesh)
    expected = sum(len(rows(mesh, a)) for a in mesh.axis_names)
    assert calls["world"] == expected == fm.cache_info().groups
    assert dist.get_process_group_ranks(rm.group("tp")) == list(range(4088, 4096))


# -- the handle is read-only -------------------------------------------------------------------


@pytest.mark.parametrize("attribute", ["mesh", "rank", "coordinate", "device_type", "backend", "device_mesh",
                                       "axis_names", "new_attribute"])
def test_realized_mesh_refuses_assignment(world, attribute):
    world(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    rm = fm.realize(mesh)
    before = (rm.mesh, rm.rank, rm.coordinate, rm.group("tp"))
    with pytest.raises(AttributeError):
        setattr(rm, attribute, fm.make_mesh((8,), ("w",)))
    with pytest.raises(AttributeError):
        delattr(rm, attribute)
    assert (rm.mesh, rm.rank, rm.coordinate, rm.group("tp")) == before
    assert rm.coordinate == mesh.coordinate(5) == (1, 0, 1)


def test_realized_mesh_has_no_instance_dict(world):
    world(0, 4)
    rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp")))
    assert not hasattr(rm, "__dict__")
    assert rm["tp"].mesh == rm.mesh["tp"]  # selections are built without assignment, too


# -- group descriptions --------------------------------------------------------------------------


def test_groups_are_named_after_the_axes_they_serve(world):
    world(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    rm = fm.realize(mesh, products=[("dp", "cp")])
    assert rm.group("tp").group_desc == "mesh_tp"
    assert rm.group("dp").group_desc == "mesh_dp"
    assert rm.group(("dp", "cp")).group_desc == "mesh_dp_cp"
    # the same rank sets reached under other names: one group each, now named after both axes
    again = fm.realize(mesh.rename({"tp": "model"}).flatten(("dp", "cp"), name="batch"))
    assert again.group("model") is rm.group("tp")
    assert rm.group("tp").group_desc == "mesh_tp+model"
    assert again.group("batch") is rm.group(("dp", "cp"))
    assert rm.group(("dp", "cp")).group_desc == "mesh_dp_cp+batch"
    fm.realize(mesh.rename({"tp": "model"}))  # a name already listed is not repeated
    assert rm.group("tp").group_desc == "mesh_tp+model"


def test_the_default_group_keeps_its_own_description(world):
    world(0, 4)
    rm = fm.realize(fm.make_mesh((4,), ("world",)))
    assert rm.group("world") is dist.distributed_c10d._get_default_group()
    fm.realize(fm.make_mesh((4,), ("w2",)))
    assert not rm.group("world").group_desc.startswith("mesh_")


# -- realizing only some axes ------------------------------------------------------------------


def test_axes_realizes_only_the_named_axes(world):
    calls = world(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    rm = fm.realize(mesh, axes=("tp",))
    assert calls["new_group"] == len(rows(mesh, "tp")) == 4  # tp's groups only
    assert rm.group("tp") is not None and rm.coordinate == (1, 0, 1) and rm.local_rank("dp") == 1
    for use in (lambda: rm.group("dp"), lambda: fm.psum(torch.ones(1), "cp", mesh=rm)):
        with pytest.raises(fm.MeshError, match=r"requires an axis whose groups were realized, but got axis='(dp|cp)'"
                                               r"; valid: \('tp',\); realize\(mesh, axes=\.\.\.\) left it out"):
            use()
    # torch's mesh has every dim (sizes, coordinates, slices), but the left-out ones have no group
    dm = rm.device_mesh
    assert dm.mesh_dim_names == ("dp", "cp", "tp") and tuple(dm.get_coordinate()) == (1, 0, 1)
    assert dm.get_group("tp") is rm.group("tp")
    with pytest.raises(RuntimeError, match="functional_mesh:unrealized:dp"):
        dm.get_group("dp")
    assert rm["tp"].device_mesh.mesh_dim_names == ("tp",)  # a selection of realized axes is usable
    fm.realize(mesh)  # the rest, later: tp is a cache hit
    assert calls["new_group"] == 4 + len(rows(mesh, "dp")) + len(rows(mesh, "cp"))


def test_axes_must_name_axes_of_the_mesh(world):
    world(0, 8)
    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(fm.UnknownAxisError, match="`realize` requires an axis name of the mesh.*did you mean 'tp'"):
        fm.realize(mesh, axes=("tpp",))
    with pytest.raises(TypeError, match="axes=None or an iterable of axis names"):
        fm.realize(mesh, axes=3)
    assert fm.realize(mesh, axes=()).coordinate == (0, 0)  # nothing realized, still a handle


def test_no_rank_makes_a_group_for_size1_axes_so_group_counters_stay_equal(world):
    # Was: every rank made one singleton group, even outside the mesh, because torch >= 2.14 names
    # groups with a counter that counts local groups too. Now no rank makes any for a size-1 axis,
    # and the group lent to torch is made outside that counter: a member that asks for it and a
    # non-member that does not end with equal counters, so every later group name agrees.
    moved = {}
    for rank in (2, 6):
        calls = world(rank, 8)
        c10d = dist.distributed_c10d._world
        start = c10d.group_count
        mesh = fm.make_mesh((2, 2, 1), ("a", "b", "one"))  # devices 0..3: rank 6 is outside
        rm = fm.realize(mesh)
        fm.realize(mesh.rename({"one": "also_one"}))
        other = fm.realize(fm.make_mesh((4, 1), ("c", "unit"), devices=[4, 5, 6, 7]))
        assert calls["local"] == 0, (rank, calls)
        if rank == 2:
            assert dist.get_process_group_ranks(rm.group("one")) == [2] and other.group("unit") is None
        else:
            assert rm.coordinate is None and rm.group("one") is None
        rm.device_mesh  # noqa: B018  (a torch mesh with a size-1 dim, on the member)
        moved[rank] = (c10d.group_count - start, calls["new_group"])
    assert moved[2] == moved[6]


@pytest.mark.parametrize("rank", [0, 5])
def test_device_mesh_size1_dims_hold_the_lent_group(world, torch_groups, rank):
    world(rank, 8)
    mesh = fm.make_mesh((2, 1, 4, 1), ("dp", "one", "tp", "unit"))
    rm = fm.realize(mesh, products=[("one", "unit"), ("dp", "one")])
    dm = rm.device_mesh
    assert dm.mesh_dim_names == mesh.axis_names and tuple(dm.get_coordinate()) == mesh.coordinate(rank)
    assert dm.mesh.tolist() == mesh.group_of(rank).tolist() and dm.size(1) == dm.size(3) == 1
    lent = rm.group("one")
    # what FSDP2 reads of a size-1 dim (get_group, rank, size) and what distribute_tensor talks over
    assert dm.get_group("one") is lent is dm.get_group("unit") and dm.get_local_rank("one") == 0
    assert dm.get_group("tp") is rm.group("tp") and dm.get_group("dp") is rm.group("dp")
    # selections in mesh order are torch slices of the root
    assert rm["one", "tp"].device_mesh._get_root_mesh() is dm and rm["one"].device_mesh.get_group() is lent
    # torch flattening size-1 dims (FSDP2 flattens dp_shard x cp itself) finds the realized products
    assert dm["one", "unit"]._flatten("one_unit").get_group() is lent
    assert dm["dp", "one"]._flatten("dp_one").get_group() is rm.group("dp")
    assert sum(torch_groups.values()) == 0, f"torch made groups of its own: {torch_groups}"
    # a size-1 axis left out by realize(axes=) stays left out (explicit), a dim without a group
    part = fm.realize(mesh, axes=("dp", "tp"))
    with pytest.raises(fm.MeshError, match=r"an axis whose groups were realized, but got axis='one'"):
        part.group("one")
    with pytest.raises(RuntimeError, match="functional_mesh:unrealized:one"):
        part.device_mesh.get_group("one")


def _why_torch_cannot_split(world) -> str | None:
    """Why this torch cannot ``split_group`` a fake default group bound to a device, or None."""
    world(0, 2)
    default = dist.distributed_c10d._get_default_group()
    default.bound_device_id = torch.device("cuda", 0)
    if not default._get_backend(torch.device("cpu")).supports_splitting:  # torch 2.13
        return f"torch {torch.__version__}'s fake backend cannot split (FakeProcessGroup.supports_splitting is False)"
    try:
        dist.split_group(split_ranks=[[0, 1]])
    except RuntimeError as exc:  # torch 2.14.1: split_group wants an accelerator (or torchcomms)
        return (f"torch {torch.__version__} cannot split a fake default group bound to a device without an "
                f"accelerator: {exc}")
    return None


def test_the_split_group_path_makes_one_split_per_axis_and_none_for_size1_axes(world):
    # The NCCL path (default group bound to a device, docs/design.md "Creation"), simulated on the fake backend,
    # which can split on torch 2.15 without a GPU. One split_group call per axis of size > 1, made
    # by every rank (a rank in no split gets GroupMember.NON_GROUP_MEMBER, -100, on torch >= 2.14,
    # kept as None); nothing for the size-1 axis; counters equal inside and outside the mesh.
    reason = _why_torch_cannot_split(world)
    if reason is not None:
        pytest.skip(reason)
    mesh = fm.make_mesh((2, 1, 2), ("dp", "one", "tp"), devices=range(4))  # ranks 4..7 outside
    moved = {}
    for rank in (1, 6):
        calls = world(rank, 8)
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)  # as device_id= does
        c10d = dist.distributed_c10d._world
        start = c10d.group_count
        # (A product against mesh order would be a new_group, which torch 2.15 cannot make on a rank
        # outside it under a bound fake default group: FakeProcessGroup has no perform_nocolor_split.)
        rm = fm.realize(mesh, products=[("dp", "tp")])
        assert calls["split_group"] == 3 and calls["new_group"] == 0, (rank, calls)
        if rank == 1:
            for axis in ("dp", "tp"):
                assert dist.get_process_group_ranks(rm.group(axis)) == mesh[axis].group_of(1).tolist()
                assert dist.get_backend(rm.group(axis)) == "fake"
            assert dist.get_process_group_ranks(rm.group(("dp", "tp"))) == [0, 1, 2, 3]
            assert dist.get_process_group_ranks(rm.group("one")) == [1]  # lent, not split
            assert tuple(rm.device_mesh.get_coordinate()) == mesh.coordinate(1)
        else:
            assert [rm.group(a) for a in ("dp", "one", "tp", ("dp", "tp"))] == [None] * 4
        moved[rank] = c10d.group_count - start
    assert moved[1] == moved[6]


@pytest.fixture
def torch_groups(monkeypatch):
    """Count the groups torch's DeviceMesh makes itself (it imports new_group/split_group by name)."""
    import torch.distributed.device_mesh as device_mesh

    made: Counter = Counter()
    for name in ("new_group", "split_group"):
        real = getattr(device_mesh, name)

        def counted(*args, real=real, name=name, **kwargs):
            made[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(device_mesh, name, counted)
    return made


def test_torch_flattening_our_mesh_finds_the_product_group_instead_of_making_one(world, torch_groups):
    # what FSDP2 does to shard over dp_shard x cp: mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    world(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp_shard", "cp", "tp"))
    rm = fm.realize(mesh, products=[("dp_shard", "cp")])
    flat = rm.device_mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    assert sum(torch_groups.values()) == 0, f"torch made groups realize had made already: {torch_groups}"
    assert flat.get_group() is rm.group(("dp_shard", "cp"))
    assert flat.mesh.tolist() == mesh["dp_shard", "cp"].flatten().group_of(5).reshape(-1).tolist()
    assert tuple(flat.get_coordinate()) == mesh["dp_shard", "cp"].flatten().coordinate(5)
    # without the product, torch makes its own groups: the count proves the test can fail
    world(5, 8)
    rm2 = fm.realize(mesh)
    rm2.device_mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    assert sum(torch_groups.values()) == 2  # one new_group per (dp_shard, cp) group


# -- selections keep their products; errors name the call; the handle has no effects ---------------


def test_a_selection_keeps_the_realized_products_whose_axes_all_remain(world):
    world(6, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    rm = fm.realize(mesh, products=[("dp", "cp"), ("cp", "tp")])
    product = rm.group(("dp", "cp"))
    for names in (("dp", "cp"), ("cp", "dp"), ("dp", "cp", "tp")):
        sel = rm[names]
        assert sel.group(("dp", "cp")) is product and sel.has_group(("dp", "cp"))
        assert fm.psum(torch.ones(1), ("dp", "cp"), mesh=sel) is not None  # the product serves the collective
    assert rm["dp", "cp"].has_group(("dp", "cp")) and not rm["dp", "cp"].has_group(("cp", "tp"))
    assert rm["cp", "tp"]["tp", "cp"].group(("cp", "tp")) is rm.group(("cp", "tp"))  # a selection of a selection
    # a product goes once one of its axes is gone
    with pytest.raises(fm.UnknownAxisError, match=r"`RealizedMesh.group` requires an axis name of the mesh, but "
                                                  r"got axis='tp'; valid: \('dp', 'cp'\)"):
        rm["dp", "cp"].group(("cp", "tp"))
    # the torch mesh of a selection in mesh order finds the product too (FSDP2 flattens it itself)
    assert rm["dp", "cp"].device_mesh["dp", "cp"]._flatten("dp_cp").get_group() is product


ENTRY_POINTS = {
    "realize axes=": ("realize", lambda m, rm: fm.realize(m, axes=("c",))),
    "realize axes= duplicate": ("realize", lambda m, rm: fm.realize(m, axes=("a", "a"))),
    "realize products=": ("realize", lambda m, rm: fm.realize(m, products=[("a", "c")])),
    "realize products= duplicate": ("realize", lambda m, rm: fm.realize(m, products=[("a", "a")])),
    "rm.group tuple": ("RealizedMesh.group", lambda m, rm: rm.group(("a", "c"))),
    "rm.group name": ("RealizedMesh.group", lambda m, rm: rm.group("c")),
    "rm[...] name": ("RealizedMesh[...]", lambda m, rm: rm["c"]),
    "rm[...] tuple": ("RealizedMesh[...]", lambda m, rm: rm["a", "c"]),
    "rm[...] duplicate": ("RealizedMesh[...]", lambda m, rm: rm["a", "a"]),
    "rm.axis_size": ("RealizedMesh.axis_size", lambda m, rm: rm.axis_size("c")),
    "rm.local_rank": ("RealizedMesh.local_rank", lambda m, rm: rm.local_rank("c")),
    "psum over a tuple": ("psum", lambda m, rm: fm.psum(torch.ones(1), ("a", "c"), mesh=rm)),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_of_realize_and_the_handle_names_itself(world, entry):
    # Was: realize(axes=/products=), rm.group((...)), rm[...] and rm.axis_size reported `Mesh[...]` or
    # `Mesh.axis_size`, an API the user did not call.
    world(0, 4)
    mesh = fm.make_mesh((2, 2), ("a", "b"))
    rm = fm.realize(mesh, products=[("a", "b")])
    api, call = ENTRY_POINTS[entry]
    with pytest.raises((fm.MeshError, TypeError)) as info:
        call(mesh, rm)
    assert str(info.value).startswith(f"`{api}` requires"), str(info.value)


def test_the_handle_and_interop_create_no_group_after_realize(world):
    # Was: rm.group(<size-1 axis>), rm.device_mesh and fm.distribute made the one-rank group lent to
    # torch lazily, on first use: code documented as free of effects created a process group.
    world(3, 8)
    c10d = dist.distributed_c10d._world
    mesh = fm.make_mesh((2, 1, 4), ("dp", "one", "tp"))
    rm = fm.realize(mesh)
    registered = (len(c10d.pg_map), len(c10d.pg_names), c10d.group_count)
    lent = rm.group("one")
    rm.device_mesh  # noqa: B018
    rm["one", "tp"].device_mesh  # noqa: B018
    fm.distribute(torch.arange(8.0), fm.NamedSharding(mesh, fm.P("tp")), mesh=rm)
    fm.distribute(torch.arange(8.0), fm.NamedSharding(mesh["one"], fm.P("one")), mesh=rm["one"])
    assert (len(c10d.pg_map), len(c10d.pg_names), c10d.group_count) == registered
    assert dist.get_process_group_ranks(lent) == [3] and lent.group_desc == "mesh_size1"
    # realize made it, once per process, local to the rank and outside torch's group counter
    again = fm.realize(fm.make_mesh((8, 1), ("w", "unit")))
    assert again.group("unit") is lent and (len(c10d.pg_map), c10d.group_count) == registered[::2]


def test_realize_and_the_collective_check_number_their_calls_with_one_counter():
    # Was: realize kept its own counter (GroupCache.calls) beside the agreement's (_agree._CALLS).
    from functional_mesh import _agree, _cache, _realize

    assert not hasattr(_cache.CACHE, "calls")
    assert _realize.next_call is _agree.next_call


# -- per-axis settings and abort -----------------------------------------------------------------


def test_per_axis_settings_are_part_of_the_cache_key(world):
    calls = world(5, 8)
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    plain = fm.realize(mesh, products=[("dp", "tp")])
    made = calls["new_group"]
    tuned = fm.realize(mesh, timeout={"tp": 3}, products=[("dp", "tp")])
    assert tuned.group("dp") is plain.group("dp")  # left out of the mapping: the default, shared
    assert tuned.group(("dp", "tp")) is plain.group(("dp", "tp"))  # a product is a key of its own
    assert tuned.group("tp") is not plain.group("tp")  # same ranks, another timeout: another group
    assert dist.get_process_group_ranks(tuned.group("tp")) == dist.get_process_group_ranks(plain.group("tp"))
    assert calls["new_group"] == made + len(rows(mesh, "tp"))  # tp's rows again, nothing else
    assert fm.realize(mesh, timeout={"tp": 3.0}).group("tp") is tuned.group("tp")  # equal settings: a hit
    both = fm.realize(mesh, timeout={("dp", "tp"): 3}, products=[("dp", "tp")])
    assert both.group(("dp", "tp")) is not plain.group(("dp", "tp")) and both.group("tp") is plain.group("tp")
    every = fm.realize(mesh, timeout=3)  # one value: every axis's
    assert every.group("tp") is tuned.group("tp") and every.group("dp") is not plain.group("dp")
    # an options object is compared by its type and public fields, not by identity
    from torch._C._distributed_c10d import FakeProcessGroup

    a, b = FakeProcessGroup.Options(), FakeProcessGroup.Options()
    assert fm.realize(mesh, pg_options={"dp": a}).group("dp") is fm.realize(mesh, pg_options={"dp": b}).group("dp")
    assert fm.realize(mesh, pg_options={"dp": a}).group("dp") is not plain.group("dp")
    b.fake_option = 1  # another field value: another group
    assert fm.realize(mesh, pg_options={"dp": b}).group("dp") is not fm.realize(mesh, pg_options={"dp": a}).group("dp")


def test_a_whole_world_axis_borrows_the_default_group_only_with_its_settings(world):
    world(1, 8)
    whole = fm.make_mesh((8,), ("w",))
    assert fm.realize(whole).group("w") is dist.group.WORLD  # (equal timeouts borrow too: on gloo, tests/dist)
    own = fm.realize(whole, timeout={"w": 5}).group("w")
    assert own is not dist.group.WORLD and dist.get_process_group_ranks(own) == list(range(8))
    from torch._C._distributed_c10d import FakeProcessGroup

    assert fm.realize(whole, pg_options=FakeProcessGroup.Options()).group("w") is not dist.group.WORLD


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    ({"timeout": {"tq": 3}}, fm.UnknownAxisError, r"`realize` requires an axis name of the mesh, but got axis='tq'"),
    ({"timeout": {("dp", "tp"): 3}}, fm.MeshError,
     r"`realize` requires timeout keys that are axis names or products passed in products=, but got "
     r"timeout=\('dp', 'tp'\); valid: \('dp', 'tp'\)"),
    ({"backend": {"tp": "gloo", ("tp",): "gloo"}}, fm.MeshError, r"`realize` requires one backend per axis"),
    ({"timeout": {"tp": -1}}, fm.MeshError, r"`realize` requires timeout=None, a positive timedelta .* got timeout=-1"),
    ({"backend": {"tp": 3}}, TypeError, r"`realize` requires backend=None or a backend name \(a str\), but got backend=3"),
])
def test_per_axis_settings_name_bad_keys_and_values(world, kwargs, error, pattern):
    world(0, 8)
    with pytest.raises(error, match=pattern):
        fm.realize(fm.make_mesh((2, 4), ("dp", "tp")), **kwargs)


def test_abort_empties_the_cache_and_stale_handles_raise_until_realize_runs_again(world):
    calls = world(6, 8)
    c10d = dist.distributed_c10d._world
    live = (len(c10d.pg_map), len(c10d.pg_names))
    mesh = fm.make_mesh((2, 1, 4), ("dp", "one", "tp"))
    rm = fm.realize(mesh, products=[("dp", "tp")])
    sel = rm["tp"]
    old_tp = rm.group("tp")
    rm["tp"].abort()  # any handle: abort is per cache
    assert fm.cache_info() == fm.CacheInfo(0, 0, 0)
    assert (len(c10d.pg_map), len(c10d.pg_names)) == live  # torch forgot every group realize made
    assert old_tp not in c10d.pg_map
    for use in (lambda: rm.group("tp"), lambda: sel.group("tp"), lambda: rm.device_mesh, lambda: rm["dp"],
                lambda: fm.psum(torch.ones(1), "tp", mesh=sel)):
        with pytest.raises(fm.MeshError, match=r"whose groups abort\(\) aborted; call realize\(mesh\) again \(after "
                                               r"re-forming the default group if a peer died\)"):
            use()
    made = calls["new_group"]
    again = fm.realize(mesh, products=[("dp", "tp")])  # fresh groups
    assert calls["new_group"] == 2 * made and again.group("tp") is not old_tp
    assert dist.get_process_group_ranks(again.group("tp")) == mesh["tp"].group_of(6).tolist()
    fm.abort()
    fm.abort()  # nothing left: nothing to do
    with pytest.raises(TypeError, match=r"`abort` requires rm=None or a RealizedMesh, but got rm=Mesh"):
        fm.abort(mesh)
    assert fm.abort is fm.RealizedMesh.abort.__globals__["abort"] and "abort" in fm.__all__


def test_abort_restarts_the_numbering_of_checked_calls():
    # a re-formed job may mix survivors (at call #n) and fresh processes (at #1): numbering restarts
    from functional_mesh import _agree

    _agree.next_call("realize")
    fm.abort()
    assert _agree.next_call("realize") == 1


def test_clear_cache_after_torch_destroyed_every_group_only_forgets_them():
    """``dist.destroy_process_group()`` (no group) destroys realize's groups too; clear_cache then
    forgets them instead of failing on groups torch no longer knows (was: ValueError 'Invalid
    process group specified')."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")))
    assert fm.cache_info().groups > 0
    dist.destroy_process_group()
    dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
    try:
        fm.clear_cache()
        assert fm.cache_info().groups == 0
        with pytest.raises(fm.MeshError, match="clear_cache"):
            rm.group("a")
    finally:
        fm.clear_cache()
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mesh=fm.make_mesh((8,), ("dp",))), r"devices that are ranks of the world \(0\.\.3\)"),
        (dict(timeout={"tp": 1}), r"'tp'"),
        (dict(backend="nosuch"), r"a backend available in this torch build, but got backend='nosuch'"),
        (dict(groups={"dp": object()}), r"a torch.distributed ProcessGroup"),
    ],
)
def test_a_bad_argument_raises_before_the_default_group_starts(monkeypatch, kwargs, match):
    """realize plans the whole call before its first effect: with no default group yet and a torchrun
    environment whose store nobody serves, the bad argument is the error, and no group (not even the
    default one) was started."""
    if dist.is_initialized():
        pytest.skip("a default group exists already")
    env = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "FUNCTIONAL_MESH_INIT_TIMEOUT": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mesh = kwargs.pop("mesh", fm.make_mesh((4,), ("dp",)))
    with pytest.raises((fm.MeshError, TypeError), match=match):
        fm.realize(mesh, "cpu", **kwargs)
    assert not dist.is_initialized()
