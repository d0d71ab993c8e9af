"""realize() on real gloo workers (world 8 and world 4): values, mesh order, cache, lifecycle, divergence.

The spec for every group is the PURE mesh: ``mesh[axis].group_of(rank)`` (members, in mesh
order), ``mesh.coordinate(rank)`` (the group rank) and ``mesh[axis].groups()`` (what must
exist). The parent computes the expected values from it; the workers only report what the
process groups that realize created actually do. Nothing expected is taken from realize.

Counting groups: c10d names a world group by a counter that every rank bumps on every
``new_group`` call (``_world.group_count``); ``_world.pg_map`` holds the groups this rank is a
member of. :func:`plan` turns docs/design.md ("Creation") into those counts from the pure groups alone. A
size-1 axis creates no group of torch's counter (docs/design.md "Size-1 axes"); the one-rank group
torch is lent for it (``rm.group``) is made by the first realize that needs it on a member rank,
local to that rank: it joins that rank's ``pg_map`` once per cache lifetime, never the counter.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import Mesh, make_mesh
from tests.dist._pool import GROUP_TIMEOUT_S as DEFAULT_GROUP_TIMEOUT_S
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w8 = pool_fixture(8)
w4 = pool_fixture(4)



def realize(mesh: Mesh, **kwargs):
    # the default group's timeout: a whole-world axis with equal settings borrows the default group
    kwargs.setdefault("timeout", DEFAULT_GROUP_TIMEOUT_S)
    kwargs.setdefault("check", CHECK_S)
    return fm.realize(mesh, **kwargs)


# -- the pure spec -------------------------------------------------------------------------------


def family(mesh: Mesh, axis) -> Mesh:
    """The 1-axis family of ``axis`` (a name, or a tuple of names = their product)."""
    return mesh[axis] if isinstance(axis, str) else mesh[axis].flatten(name="product")


def rows(mesh: Mesh, axis) -> list[tuple[int, ...]]:
    fam = family(mesh, axis)
    return [tuple(r) for r in fam.groups().reshape(fam.num_groups, -1).tolist()]


def expected_view(mesh: Mesh, axis, rank: int) -> dict | None:
    """What ``rank`` must observe in its group of ``axis``: members in mesh order, its group rank
    (= its coordinate along the axis), the all-reduce of 10**member and the all-gather of members."""
    fam = family(mesh, axis)
    row = fam.group_of(rank)
    if row is None:
        return None
    members = row.reshape(-1).tolist()
    (coord,) = fam.coordinate(rank)
    view = {"members": members, "group_rank": coord, "size": len(members),
            "sum": sum(10**m for m in members), "gathered": members}
    if isinstance(axis, str):
        view["local_rank"] = mesh.coordinate(rank)[mesh.axis_names.index(axis)]
    return view


def plan(meshes: list[Mesh], world: int, products: dict[int, list] | None = None) -> list[list[dict]]:
    """docs/design.md "Creation" as counts, from pure groups only, starting from an empty cache.

    For each realize call in order and each rank: how many world groups are created
    (``new_group`` calls: one per member tuple nobody created yet, the ascending whole world
    excepted), how many groups this rank joins (``pg_map``), and ``cache_info().groups``
    (distinct tuples created so far, members or not). A size-1 axis makes no world group (was:
    one local singleton per rank, counted once by torch >= 2.14); a member rank gets the lent
    one-rank group once, at the first mesh that has one.
    """
    made: set[tuple[int, ...]] = set()
    lent: set[int] = set()
    out = []
    for i, mesh in enumerate(meshes):
        axes = list(mesh.axis_names) + list((products or {}).get(i, []))
        world_new = 0
        joined = [0] * world
        if any(mesh[a].size == 1 for a in axes):
            for r in range(world):
                if r not in lent and mesh.coordinate(r) is not None:
                    lent.add(r)
                    joined[r] += 1
        for axis in axes:
            missing = [r for r in rows(mesh, axis) if r not in made]
            if not missing or len(missing[0]) == 1:
                continue  # nothing missing, or a size-1 axis: no group
            if missing == [tuple(range(world))]:
                continue  # the default group is reused: nothing created, nothing counted
            made.update(missing)
            world_new += len(missing)
            for r in missing:
                for member in r:
                    joined[member] += 1
        out.append([{"group_count": world_new, "pg_map": joined[r], "groups": len(made)} for r in range(world)])
    return out


def c10d_counts() -> tuple[int, int]:
    world = dist.distributed_c10d._world
    return world.group_count, len(world.pg_map)


# -- checks (run on every rank) --------------------------------------------------------------------


def view_of(rm, axis) -> dict | None:
    group = rm.group(axis)
    if group is None:
        return None
    rank = dist.get_rank()
    members = dist.get_process_group_ranks(group)
    total = torch.tensor([10**rank], dtype=torch.int64)
    dist.all_reduce(total, group=group)
    gathered = torch.zeros(len(members), dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, torch.tensor([rank], dtype=torch.int64), group=group)
    view = {"members": members, "group_rank": dist.get_rank(group), "size": dist.get_world_size(group),
            "sum": int(total.item()), "gathered": gathered.tolist()}
    if isinstance(axis, str):
        view["local_rank"] = rm.local_rank(axis)
    return view


def observe(mesh: Mesh, axes: list, products: list = ()) -> dict:
    rm = realize(mesh, products=products)
    return {"coordinate": rm.coordinate, "views": {axis: view_of(rm, axis) for axis in axes},
            "cache_groups": fm.cache_info().groups}


def realize_steps(meshes: list[Mesh], products: dict[int, list] | None = None, clear: bool = True) -> list[dict]:
    """Realize ``meshes`` in order from an empty cache; each call's c10d and cache deltas."""
    if clear:
        fm.clear_cache()
    out = []
    for i, mesh in enumerate(meshes):
        before = c10d_counts()
        info0 = fm.cache_info()
        rm = realize(mesh, products=(products or {}).get(i, ()))
        after = c10d_counts()
        info = fm.cache_info()
        out.append({"group_count": after[0] - before[0], "pg_map": after[1] - before[1], "groups": info.groups,
                    "hits": info.hits - info0.hits, "misses": info.misses - info0.misses,
                    "views": {axis: view_of(rm, axis) for axis in mesh.axis_names}})
    return out


def check_outcomes(outs, *, raised: dict[int, tuple[str, str]] | None = None, ok: set[int] = frozenset()):
    """Every rank in ``raised`` raised that exception type (by name) with a message matching the
    regex; every rank in ``ok`` returned normally."""
    for o in outs:
        if o.rank in (raised or {}):
            name, pattern = raised[o.rank]
            assert not o.ok, f"rank {o.rank} returned {o.value!r} instead of raising {name}"
            assert o.error_name == name, o.describe()
            assert re.search(pattern, o.message), f"rank {o.rank}: {o.message!r} does not match {pattern!r}"
        if o.rank in ok:
            assert o.ok, o.describe()


def test_fm_realize_stays_the_function_whatever_is_touched_first():
    code = ("import functional_mesh as fm\n"
            "fm.cache_info()\n"
            "print(type(fm.realize).__name__, type(fm.clear_cache).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["function", "function"]


# -- 1 + 2: values and mesh order, every axis, from the pure groups -------------------------------

M3 = make_mesh((2, 2, 2), ("dp", "cp", "tp"))
M24 = make_mesh((2, 4), ("dp", "tp"))
PERMUTED = Mesh.from_ranks([[7, 6, 5, 4], [3, 2, 1, 0]], ("dp", "tp"))
M22 = make_mesh((2, 2), ("dp", "tp"))

CASES_8 = {
    "3d": (M3, ["dp", "cp", "tp"], [("dp", "cp"), ("cp", "tp"), ("tp", "dp")]),
    "flatten-contiguous": (M3.flatten(("cp", "tp"), name="cp_tp"), ["dp", "cp_tp"], []),
    "flatten-noncontiguous": (M3.flatten(("dp", "tp")), ["dp_tp", "cp"], []),
    "flatten-transposed": (M3.flatten(("tp", "dp")), ["tp_dp", "cp"], []),
    "unflatten-noncontiguous": (M3.flatten(("dp", "tp")).unflatten("dp_tp", {"x": 2, "y": 2}), ["x", "y", "cp"], []),
    "unflatten-world": (make_mesh((8,), ("w",)).unflatten("w", {"a": 2, "b": 4}), ["a", "b"], [("b", "a")]),
    "permuted": (PERMUTED, ["dp", "tp"], [("dp", "tp"), ("tp", "dp")]),
    "permuted-transposed-flat": (PERMUTED["tp", "dp"].flatten(), ["tp_dp"], []),
    "transposed-selection": (M24["tp", "dp"], ["tp", "dp"], []),
    "transposed-selection-flat": (M24["tp", "dp"].flatten(), ["tp_dp"], []),
    "subworld-permuted": (make_mesh((2, 2), ("a", "b"), devices=[6, 4, 2, 0]), ["a", "b"], [("b", "a")]),
}
CASES_4 = {
    "2d": (M22, ["dp", "tp"], [("tp", "dp")]),
    "flat-whole-world": (M22.flatten(), ["dp_tp"], []),
    "transposed-flat": (M22["tp", "dp"].flatten(), ["tp_dp"], []),
    "permuted": (Mesh.from_ranks([[3, 2], [1, 0]], ("dp", "tp")), ["dp", "tp"], [("tp", "dp")]),
    "unflatten-strided": (make_mesh((4,), ("w",)).flatten(name="w").unflatten("w", {"x": 2, "y": 2})["y", "x"],
                          ["y", "x"], []),
}


def assert_views(mesh, axes, results):
    for rank, res in enumerate(results):
        assert res["coordinate"] == mesh.coordinate(rank), rank
        for axis in axes:
            assert res["views"][axis] == expected_view(mesh, axis, rank), (rank, axis)
    assert len({res["cache_groups"] for res in results}) == 1  # cache_info().groups equal on every rank


@pytest.mark.parametrize("case", list(CASES_8))
def test_groups_reduce_and_gather_in_mesh_order_world8(w8, case):
    mesh, names, products = CASES_8[case]
    axes = names + products
    assert_views(mesh, axes, w8.run(observe, mesh, axes, products))


@pytest.mark.parametrize("case", list(CASES_4))
def test_groups_reduce_and_gather_in_mesh_order_world4(w4, case):
    mesh, names, products = CASES_4[case]
    axes = names + products
    assert_views(mesh, axes, w4.run(observe, mesh, axes, products))


def test_the_pure_spec_of_the_permuted_mesh_is_what_we_think():
    # A hand-written anchor for the spec the tests above compare against.
    assert PERMUTED["tp"].groups().tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert PERMUTED["dp"].groups().tolist() == [[7, 3], [6, 2], [5, 1], [4, 0]]
    assert PERMUTED["tp", "dp"].flatten()["tp_dp"].groups().tolist() == [[7, 3, 6, 2, 5, 1, 4, 0]]
    assert PERMUTED.coordinate(5) == (0, 2) and PERMUTED.coordinate(0) == (1, 3)
    view = expected_view(PERMUTED, "tp", 5)
    assert view["members"] == [7, 6, 5, 4] and view["group_rank"] == 2 and view["sum"] == 11110000


# -- 3: the cache shares equal groups, however they were reached ----------------------------------


def shared_groups() -> dict:
    fm.clear_cache()
    rm1 = realize(make_mesh((2, 4), ("dp", "tp")))
    base = c10d_counts()
    info1 = fm.cache_info()
    rm2 = realize(make_mesh((8,), ("w",)).unflatten("w", {"a": 2, "tp": 4}))  # same layouts, another path
    rm3 = realize(make_mesh((2, 2, 2), ("dp", "x", "y")).flatten(("x", "y"), name="tp"))  # flatten, renamed
    rm4 = realize(Mesh.from_ranks([[0, 1, 2, 3], [4, 5, 6, 7]], ("rows", "cols")))  # explicit ranks
    rm5 = realize(make_mesh((4,), ("tp",), devices=range(4, 8)))  # another device list, one shared row
    rm6 = realize(make_mesh((2, 4), ("dp", "tp")))  # an equal mesh again
    # the tp family alone over a reordered device list: another axis key, the same two rows
    rm7 = realize(Mesh.from_ranks([[4, 5, 6, 7], [0, 1, 2, 3]], ("dp", "tp"))["tp"])
    after = c10d_counts()
    info = fm.cache_info()
    rank = dist.get_rank()
    tp = rm1.group("tp")
    return {
        "tp": [rm2.group("tp") is tp, rm3.group("tp") is tp, rm4.group("cols") is tp, rm6.group("tp") is tp,
               rm7.group("tp") is tp],
        "dp": [rm2.group("a") is rm1.group("dp"), rm3.group("dp") is rm1.group("dp"),
               rm4.group("rows") is rm1.group("dp"), rm6.group("dp") is rm1.group("dp")],
        "subworld": (rm5.group("tp") is tp) if rank >= 4 else rm5.group("tp"),
        "created": (after[0] - base[0], after[1] - base[1]),
        "info1": tuple(info1), "info": tuple(info),
    }


def test_equal_layouts_from_different_paths_share_one_group_and_create_nothing(w8):
    results = w8.run(shared_groups)
    for rank, res in enumerate(results):
        assert res["tp"] == [True] * 5 and res["dp"] == [True] * 4, rank
        assert res["subworld"] is (True if rank >= 4 else None), rank
        assert res["created"] == (0, 0), rank  # no group_count bump, no new pg_map entry
        # 2 + 2 + 2 + 2 + 1 + 2 + 1 axis lookups; only rm1's two, rm5's and rm7's are misses
        # (their keys have other device lists, but their rows exist already).
        assert res["info1"] == (0, 2, 4 + 2), rank
        assert res["info"] == (8, 4, 6), rank
    assert len({res["info"] for res in results}) == 1


def order_is_part_of_the_key() -> dict:
    fm.clear_cache()
    rm1 = realize(make_mesh((2, 4), ("dp", "tp")))
    before = c10d_counts()
    rm2 = realize(Mesh.from_ranks([[3, 2, 1, 0], [7, 6, 5, 4]], ("dp", "tp")))  # same tp sets, reversed
    after = c10d_counts()
    g1, g2 = rm1.group("tp"), rm2.group("tp")
    return {"same": g1 is g2, "members": (dist.get_process_group_ranks(g1), dist.get_process_group_ranks(g2)),
            "group_count": after[0] - before[0]}


def test_the_same_rank_set_in_another_order_is_another_group(w8):
    results = w8.run(order_is_part_of_the_key)
    mesh = Mesh.from_ranks([[3, 2, 1, 0], [7, 6, 5, 4]], ("dp", "tp"))
    for rank, res in enumerate(results):
        assert res["same"] is False
        assert res["members"] == (M24["tp"].group_of(rank).tolist(), mesh["tp"].group_of(rank).tolist())
        # only the 2 reversed tp rows are new; the dp rows (3, 7), (2, 6), ... are M24's tuples
        assert res["group_count"] == plan([M24, mesh], 8)[1][rank]["group_count"] == 2


def products_and_selections() -> dict:
    fm.clear_cache()
    rm = realize(M3, products=[("dp", "cp"), ("tp", "dp")])
    before, info0 = c10d_counts(), fm.cache_info()
    flat = realize(M3.flatten(("dp", "cp")))  # the product ("dp", "cp") under a name: a hit
    flat_t = realize(M3.flatten(("tp", "dp")))  # the transposed product: a hit too
    mid = c10d_counts()
    sel = rm["cp", "tp"]  # a realized selection: served from the root, no lookup, no group
    after, info = c10d_counts(), fm.cache_info()
    return {"product": rm.group(("dp", "cp")) is flat.group("dp_cp"),
            "product_t": rm.group(("tp", "dp")) is flat_t.group("tp_dp"),
            "selection": [sel.group("cp") is rm.group("cp"), sel.group("tp") is rm.group("tp")],
            "created": (mid[0] - before[0], after[0] - mid[0], after[1] - before[1]),
            "lookups": (info.hits - info0.hits, info.misses - info0.misses)}


def test_product_groups_are_the_flattened_axes_groups_and_selections_reuse_the_root(w8):
    for res in w8.run(products_and_selections):
        assert res == {"product": True, "product_t": True, "selection": [True, True], "created": (0, 0, 0),
                       "lookups": (4, 0)}


# Sequences of realize calls: every call's c10d and cache deltas equal the pure plan.
SEQUENCES = {
    "sharing": [M24, make_mesh((8,), ("w",)).unflatten("w", {"a": 2, "tp": 4}),
                Mesh.from_ranks([[4, 5, 6, 7], [0, 1, 2, 3]], ("dp", "tp")),
                make_mesh((4,), ("tp",), devices=range(4, 8)), M3, M3.flatten(("dp", "cp"), name="dc"), M24],
    # a family half made already: only its missing row is created
    "partial": [make_mesh((4,), ("tp",), devices=range(4, 8)), M24, PERMUTED["tp"]],
    # 5: size-1 axes make no group (was: one local singleton per rank); rm.group lends a one-rank fake group
    "size-1": [make_mesh((2, 1, 4), ("dp", "sp", "tp")), make_mesh((1, 8), ("one", "w")),
               make_mesh((2, 1), ("a", "b"), devices=[1, 3]), make_mesh((8, 1), ("w", "one"))],
    # 6: the whole world in ascending order is the default group
    "default": [make_mesh((8,), ("w",)), M24.flatten(), M24["dp", "tp"].flatten(name="x"),
                Mesh.from_ranks([7, 6, 5, 4, 3, 2, 1, 0], ("w",)), M24["tp", "dp"].flatten()],
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_each_realize_creates_exactly_the_missing_groups(w8, name):
    meshes = SEQUENCES[name]
    results = w8.run(realize_steps, meshes)
    expected = plan(meshes, 8)
    for rank, steps in enumerate(results):
        for i, (mesh, step) in enumerate(zip(meshes, steps)):
            want = expected[i][rank]
            got = {k: step[k] for k in want}
            assert got == want, (name, rank, i, mesh)
            # every axis is one lookup, but a size-1 axis needs none (no group to find)
            assert step["hits"] + step["misses"] == sum(size > 1 for size in mesh.axis_sizes)
            for axis in mesh.axis_names:
                assert step["views"][axis] == expected_view(mesh, axis, rank), (rank, i, axis)
    if name == "sharing":  # the last mesh equals the first: all hits, nothing created
        assert all(steps[-1]["hits"] == 2 and steps[-1]["misses"] == 0 for steps in results)


def default_group_reuse() -> dict:
    fm.clear_cache()
    before = c10d_counts()
    rm = realize(make_mesh((8,), ("w",)))
    rm2 = realize(make_mesh((2, 4), ("dp", "tp")).flatten(), timeout=None)
    after = c10d_counts()
    default = dist.distributed_c10d._get_default_group()
    groups = fm.cache_info().groups
    # other settings: a group of its own, with its own timeout (was: the default group, whatever the timeout)
    own = realize(make_mesh((8,), ("w",)), timeout={"w": 5}).group("w")
    return {"world": rm.group("w") is dist.group.WORLD, "default": rm.group("w") is default,
            "flat": rm2.group("dp_tp") is default, "created": (after[0] - before[0], after[1] - before[1]),
            "groups": groups,
            "own": (own is not default, dist.get_process_group_ranks(own), own._get_backend(torch.device("cpu"))
                    .options._timeout.total_seconds())}


def test_a_whole_world_ascending_axis_reuses_the_default_group(w8):
    for res in w8.run(default_group_reuse):
        assert res == {"world": True, "default": True, "flat": True, "created": (0, 0), "groups": 0,
                       "own": (True, list(range(8)), 5.0)}


# -- 4: non-members and sub-worlds -------------------------------------------------------------------


def subworld(mesh: Mesh) -> dict:
    rm = realize(mesh)
    out = {"coordinate": rm.coordinate, "groups": [rm.group(a) for a in mesh.axis_names],
           "device_mesh": rm.device_mesh, "views": None, "local_rank_error": None}
    if rm.coordinate is None:
        out["groups"] = [g is None for g in out["groups"]]
        try:
            rm.local_rank(mesh.axis_names[0])
        except fm.MeshError as e:
            out["local_rank_error"] = str(e)
    else:
        out["groups"] = "member"
        out["device_mesh"] = (rm.device_mesh.mesh.tolist(), tuple(rm.device_mesh.get_coordinate()))
        out["views"] = {a: view_of(rm, a) for a in mesh.axis_names}
    return out


def test_ranks_outside_the_mesh_get_none_and_members_reduce_in_their_groups(w8):
    mesh = make_mesh((2, 2), ("dp", "tp"), devices=range(4, 8))
    for rank, res in enumerate(w8.run(subworld, mesh)):
        assert res["coordinate"] == mesh.coordinate(rank)
        if rank < 4:
            assert res["coordinate"] is None and res["groups"] == [True, True] and res["device_mesh"] is None
            assert re.search(r"`RealizedMesh.local_rank` requires a rank that belongs to the mesh, but got "
                             rf"rank={rank}; valid: devices", res["local_rank_error"])
        else:
            assert res["device_mesh"] == (mesh.ranks.tolist(), mesh.coordinate(rank))
            for axis in mesh.axis_names:
                assert res["views"][axis] == expected_view(mesh, axis, rank)


def realize_raises(mesh: Mesh) -> None:
    realize(mesh)


def test_devices_beyond_the_world_raise_on_every_rank(w8):
    outs = w8.outcomes(realize_raises, make_mesh((2, 2), ("dp", "tp"), devices=range(6, 10)))
    pattern = (r"`realize` requires devices that are ranks of the world \(0\.\.7\), "
               r"but got largest device=9")
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in range(8)})
    # and the world is still in step: a normal realize works everywhere
    assert_views(M24, ["tp"], w8.run(observe, M24, ["tp"]))


def size_one_axis() -> list:
    rm = realize(make_mesh((2, 1, 4), ("dp", "sp", "tp")))
    group = rm.group("sp")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value, group=group)
    return [dist.get_process_group_ranks(group), dist.get_rank(group), value.item()]


def test_a_size_one_axis_group_reduces_to_the_rank_own_value(w8):
    for rank, res in enumerate(w8.run(size_one_axis)):
        assert res == [[rank], 0, rank + 1.0]


# -- 9: clear_cache -----------------------------------------------------------------------------------


def clear_cycles(meshes: list[Mesh], cycles: int) -> dict:
    fm.clear_cache()
    user_group = dist.new_group([0, 1])  # not realize's: clear_cache must leave it alone
    base = c10d_counts()
    out: dict = {"cycles": []}
    rm = None
    for _ in range(cycles):
        rms = [realize(m) for m in meshes]
        live = c10d_counts()
        views = [{a: view_of(r, a) for a in r.mesh.axis_names} for r in rms]
        fm.clear_cache()
        cleared = c10d_counts()
        out["cycles"].append({"live": live[1] - base[1], "cleared": cleared[1] - base[1],
                              "info": tuple(fm.cache_info()), "views": views})
        rm = rms[0]
    total = torch.tensor([1])
    dist.all_reduce(total)  # the default group survives
    out["world_sum"] = int(total.item())
    if user_group is not dist.GroupMember.NON_GROUP_MEMBER:
        t = torch.tensor([1])
        dist.all_reduce(t, group=user_group)
        out["user_group"] = int(t.item())
        dist.destroy_process_group(user_group)
    errors = {}
    uses = {"group": lambda: rm.group(rm.mesh.axis_names[0]), "device_mesh": lambda: rm.device_mesh,
            "select": lambda: rm[rm.mesh.axis_names[0]], "with": lambda: rm.__enter__()}
    for use, call in uses.items():
        try:
            call()
            errors[use] = None
        except fm.MeshError as e:
            errors[use] = str(e)
    out["errors"] = errors
    return out


def test_clear_cache_destroys_exactly_realize_groups_and_stale_meshes_raise(w8):
    meshes = [M3, make_mesh((2, 1, 4), ("dp", "sp", "tp")), PERMUTED["tp", "dp"].flatten(), make_mesh((8,), ("w",))]
    results = w8.run(clear_cycles, meshes, 3)
    expected = plan(meshes, 8)
    for rank, res in enumerate(results):
        assert len(res["cycles"]) == 3
        for cycle in res["cycles"]:
            assert cycle["live"] == sum(step[rank]["pg_map"] for step in expected) > 0
            assert cycle["cleared"] == 0  # exactly the created groups are gone, nothing leaks
            assert cycle["info"] == (0, 0, 0)
            for mesh, views in zip(meshes, cycle["views"]):
                for axis in mesh.axis_names:
                    assert views[axis] == expected_view(mesh, axis, rank)
        assert res["world_sum"] == 8
        if rank in (0, 1):
            assert res["user_group"] == 2
        for use, api in [("group", r"RealizedMesh\.group"), ("device_mesh", r"RealizedMesh\.device_mesh"),
                         ("select", r"RealizedMesh\[\.\.\.\]"), ("with", r"with RealizedMesh")]:
            assert re.fullmatch(rf"`{api}` requires a realized mesh whose groups still exist, but got "
                                r"RealizedMesh\(Mesh\(dp=2, cp=2, tp=2\), gloo, rank \d: coordinate \(\d, \d, \d\)\), "
                                r"whose groups clear_cache\(\) destroyed; call realize\(mesh\) again",
                                res["errors"][use] or ""), (use, res["errors"][use])


# -- 7: divergence (world 4) --------------------------------------------------------------------------
#
# The check keys the store by a per-process call number (``_agree._next_call("realize")``), bumped
# by every realize call that passes argument validation. A rank that skips a call therefore
# lags one number behind the others from then on, and would compare its next request with
# the others' *previous* one. Each test below leaves every rank with the same number of calls:
# the late rank makes its (late) call for the number it missed, which finds the verdict the
# others already reached and must raise too; the world is then in step, which the final
# realize on every rank proves.

DIVERGE = make_mesh((2, 2), ("dp", "tp"))


def realize_variant(variants: dict[int, Mesh], default: Mesh, check: float, opts: dict | None = None) -> str:
    mesh = variants.get(dist.get_rank(), default)
    kwargs = {"timeout": GROUP_TIMEOUT, "check": check, **(opts or {}).get(dist.get_rank(), {})}
    rm = fm.realize(mesh, **kwargs)
    return repr(rm.mesh)


def late_realize(late_rank: int, mesh: Mesh, check: float, delay: float) -> str:
    if dist.get_rank() == late_rank:
        time.sleep(delay)
    rm = fm.realize(mesh, timeout=GROUP_TIMEOUT, check=check)
    return repr(rm.mesh)


def skip_realize(absent_rank: int, mesh: Mesh, check: float) -> str | None:
    if dist.get_rank() == absent_rank:
        return None
    return repr(fm.realize(mesh, timeout=GROUP_TIMEOUT, check=check).mesh)


def only_rank_realizes(rank: int, mesh: Mesh, check: float) -> str | None:
    if dist.get_rank() != rank:
        return None
    return repr(fm.realize(mesh, timeout=GROUP_TIMEOUT, check=check).mesh)


def assert_in_step(pool, mesh=DIVERGE):
    names = list(mesh.axis_names)
    assert_views(mesh, names, pool.run(observe, mesh, names))


def test_a_rank_asking_for_another_mesh_makes_every_rank_raise_naming_it(w4):
    other = make_mesh((4,), ("dp",))
    outs = w4.outcomes(realize_variant, {2: other}, DIVERGE, 3)
    pattern = (r"`realize` requires every rank to call it with an equal mesh, but realize call #\d+ differs "
               r"across ranks: ranks \[0, 1, 3\] asked for Mesh\(dp=2, tp=2\) .*; "
               r"ranks \[2\] asked for Mesh\(dp=4\) ")
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in range(4)})
    assert_in_step(w4)


def test_equal_meshes_reached_by_different_paths_pass_the_check(w4):
    variants = {1: make_mesh((4,), ("w",)).unflatten("w", {"dp": 2, "tp": 2}),
                3: Mesh.from_ranks([[0, 1], [2, 3]], ("dp", "tp"))}
    assert w4.run(realize_variant, variants, DIVERGE, 3) == [repr(DIVERGE)] * 4


def test_the_check_compares_options_too(w4):
    outs = w4.outcomes(realize_variant, {}, DIVERGE, 3, {1: {"timeout": 7}})
    pattern = (r"differs across ranks: ranks \[0, 2, 3\] asked for .*settings=\(gloo, timeout 20 s, pg_options "
               r"None\).*; ranks \[1\] asked for .*settings=\(gloo, timeout 7 s, pg_options None\)")
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in range(4)})
    assert_in_step(w4)


def test_the_check_compares_per_axis_settings(w4):
    outs = w4.outcomes(realize_variant, {}, DIVERGE, 3, {2: {"timeout": {"dp": 20, "tp": 7}}})
    pattern = (r"differs across ranks: ranks \[0, 1, 3\] asked for .*settings=\(gloo, timeout 20 s, pg_options "
               r"None\).*; ranks \[2\] asked for .*settings=\(dp: gloo, timeout 20 s, pg_options None; "
               r"tp: gloo, timeout 7 s, pg_options None\)")
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in range(4)})
    assert_in_step(w4)


def test_a_late_rank_is_named_within_the_check_timeout_and_raises_when_it_arrives(w4):
    t0 = time.monotonic()
    outs = w4.outcomes(late_realize, 3, DIVERGE, 2, 3.0)
    elapsed = time.monotonic() - t0
    pattern = (r"`realize` requires every rank to call it with an equal mesh, but ranks \[3\] did not reach "
               r"realize call #\d+ within 2 s \(the others asked for Mesh\(dp=2, tp=2\) ")
    # rank 3 arrives after the verdict: its call (the same number) finds it and raises as well
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in range(4)})
    assert elapsed < 15
    assert_in_step(w4)


def test_an_absent_rank_is_named_and_its_catch_up_call_raises(w4):
    outs = w4.outcomes(skip_realize, 2, DIVERGE, 2)
    pattern = r"but ranks \[2\] did not reach realize call #(\d+) within 2 s"
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in (0, 1, 3)}, ok={2})
    # rank 2 is one call behind; its catch-up call meets the stale verdict and raises
    outs = w4.outcomes(only_rank_realizes, 2, DIVERGE, 2)
    check_outcomes(outs, raised={2: ("MeshError", pattern)}, ok={0, 1, 3})
    assert_in_step(w4)


def test_an_absent_rank_zero_is_named_by_the_others(w4):
    # Rank 0 judges; without it the others wait check + 5 s for a verdict, then name it.
    assert_in_step(w4)  # the mesh is cached on every rank: a late call would create nothing
    t0 = time.monotonic()
    outs = w4.outcomes(skip_realize, 0, DIVERGE, 1)
    assert time.monotonic() - t0 < 15
    pattern = (r"`realize` requires every rank to call it with an equal mesh, but realize call #\d+ got no "
               r"verdict from rank 0 within 1 s; ranks not arrived: \[0\]")
    check_outcomes(outs, raised={r: ("MeshError", pattern) for r in (1, 2, 3)}, ok={0})
    # Rank 0's catch-up call for the number it missed: the others gave up on that call and
    # raised, so it must not succeed either (docs/design.md "Errors", "The divergence check": raise on every rank that got there;
    # had the mesh been a miss, rank 0 would go on alone into new_group and hang).
    outs = w4.outcomes(only_rank_realizes, 0, DIVERGE, 1)
    check_outcomes(outs, raised={0: ("MeshError", r"`realize` requires every rank to call it with an equal mesh, "
                                                   r"but .*realize call #\d+")}, ok={1, 2, 3})
    assert_in_step(w4)
