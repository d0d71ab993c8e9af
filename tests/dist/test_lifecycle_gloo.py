"""The lifecycle of realize's groups on real gloo workers (world 4): clear_cache, leaks, threads, pickling.

tests/dist/test_realize_gloo.py already checks that clear_cache destroys what realize made
(c10d's ``pg_map``), keeps a user group made *before* realize and the default group, and that
stale realized meshes raise. This module adds what that test does not look at:

- every c10d registry (not just ``pg_map``), open file descriptors and native threads come
  back to where they started after many realize/clear_cache cycles (gloo keeps sockets and
  threads per group, so a group left undestroyed shows up here; they are freed with the last
  reference to the group, so the cycles drop their stale realized meshes);
- groups the user makes *between* realize calls, with the very members of one of realize's
  groups, and a torch ``DeviceMesh`` made by ``init_device_mesh``, survive clear_cache and
  still reduce correctly;
- threads reading the cache concurrently (``rm[...]``, ``rm.group``, ``cache_info``,
  ``realize(mesh, check=False)`` of a realized mesh) get the same groups and create nothing;
- a ``RealizedMesh`` (root, selection, stale) refuses pickling and copying with a message
  that says what to do, while its ``Mesh`` crosses processes intact;
- a ``realize(..., check=False)`` lookup made on one rank only does not shift the divergence
  check's call numbering.

The big-world thread tests run under the fake backend (tests/fake/test_threads_fake.py).
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import Mesh, make_mesh
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4, own=True)  # counts threads and descriptors per process: a pool of its own

M22 = make_mesh((2, 2), ("dp", "tp"))
MESHES = [  # new groups (ascending and not), a size-1 axis (no group; rm.group lends the one-rank fake
    # group, which clear_cache destroys too), the default group
    M22,
    Mesh.from_ranks([[3, 2], [1, 0]], ("dp", "tp")),
    make_mesh((2, 1, 2), ("a", "one", "b")),
    M22["tp", "dp"].flatten(),
    make_mesh((4,), ("w",)),
]
PICKLE_MESSAGE = ("a RealizedMesh holds live process groups and cannot be pickled; pickle rm.mesh (a pure Mesh) "
                  "and call realize() on it in the receiving job")


def realize(mesh: Mesh, **kwargs):
    kwargs.setdefault("timeout", GROUP_TIMEOUT)
    kwargs.setdefault("check", CHECK_S)
    return fm.realize(mesh, **kwargs)


def registries() -> dict[str, int]:
    """Sizes of every per-group registry c10d keeps in this process.

    ``pg_group_ranks`` also holds one entry under ``GroupMember.NON_GROUP_MEMBER`` (-100): the
    members of the last group this rank was left out of, overwritten by every such new_group
    (bounded, torch's own); it is not counted.
    """
    w = dist.distributed_c10d._world
    ranks = [k for k in w.pg_group_ranks if k is not dist.GroupMember.NON_GROUP_MEMBER]
    return {"pg_map": len(w.pg_map), "pg_names": len(w.pg_names), "pg_group_ranks": len(ranks),
            "pg_backend_config": len(w.pg_backend_config), "pg_to_tag": len(w.pg_to_tag),
            "tags_to_pg": sum(len(v) for v in w.tags_to_pg.values()), "pg_coalesce_state": len(w.pg_coalesce_state)}


def resources() -> dict[str, int]:
    """Open file descriptors (gloo's sockets) and native threads of this process."""
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


def reduce_in(group) -> int:
    """The all-reduce of 10**rank over ``group`` (identifies its members), or -1 for a non-member."""
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        return -1
    t = torch.tensor([10 ** dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(t, group=group)
    return int(t.item())


def expected_reduce(mesh: Mesh, axis: str, rank: int) -> int:
    row = mesh[axis].group_of(rank)
    return -1 if row is None else int(sum(10 ** int(m) for m in row.reshape(-1)))


# -- checks (run on every rank) ---------------------------------------------------------------------


def cycles(n: int) -> dict:
    """``n`` realize/clear_cache cycles with the cycle collector off: after ``del`` of the realized meshes
    (and the torch meshes built over their groups), a group still alive is held by a leak or a reference
    cycle, and either fails the test."""
    fm.clear_cache()
    rank = dist.get_rank()
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        base = registries()
        base_res = resources()
        out: dict = {"per_cycle": []}
        for _ in range(n):
            rms = [realize(m) for m in MESHES]
            sums = [[reduce_in(rm.group(a)) for a in rm.mesh.axis_names] for rm in rms]
            # torch meshes over the groups: each root's, a selection's slice, and a product group
            # registered on its root (where torch's own flatten finds it)
            product = realize(MESHES[1], products=[("dp", "tp")])
            torch_meshes = [rm.device_mesh for rm in rms] + [product["tp"].device_mesh]
            flattened = product.device_mesh["dp", "tp"]._flatten()
            found = flattened.get_group() is product.group(("dp", "tp"))
            live = registries()["pg_map"]
            fm.clear_cache()
            # torch's destroy_process_group unregisters a gloo group, but its sockets and threads go
            # with the last reference to the ProcessGroup: here, the stale realized meshes.
            del rms, product, torch_meshes, flattened
            out["per_cycle"].append({"sums": sums, "live": live, "registries": registries(), "found": found,
                                     "info": tuple(fm.cache_info()), "res": resources()})
    finally:
        if collecting:
            gc.enable()
    out.update(base=base, base_res=base_res, world_sum=reduce_in(dist.group.WORLD), rank=rank)
    return out


def test_realize_clear_cache_cycles_leave_no_group_socket_or_thread_behind(w4):
    n = 8
    for res in w4.run(cycles, n):
        rank = res["rank"]
        assert len(res["per_cycle"]) == n
        for cycle in res["per_cycle"]:
            for mesh, sums in zip(MESHES, cycle["sums"]):
                assert sums == [expected_reduce(mesh, a, rank) for a in mesh.axis_names], (rank, mesh)
            assert cycle["found"], rank  # torch's flatten found the product group realize made
            assert cycle["live"] > res["base"]["pg_map"]  # groups existed during the cycle...
            assert cycle["registries"] == res["base"], rank  # ...and every registry is back to the start
            assert cycle["info"] == (0, 0, 0)
        # gloo holds sockets per group: n cycles of destroyed groups hold none (nor threads)
        for cycle in res["per_cycle"]:
            assert cycle["res"]["fds"] <= res["base_res"]["fds"], (rank, res["base_res"], cycle["res"])
            assert cycle["res"]["threads"] <= res["base_res"]["threads"], (rank, res["base_res"], cycle["res"])
        assert res["world_sum"] == 1111


def user_groups_survive() -> dict:
    fm.clear_cache()
    rank = dist.get_rank()
    rm = realize(M22)
    # made between realize calls, with the members of realize's tp group (0, 1) and (2, 3)
    mine = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    user_tp = mine[0] if rank in (0, 1) else mine[1]
    rm2 = realize(MESHES[1])
    from torch.distributed.device_mesh import init_device_mesh

    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))  # torch's own groups
    ours = [rm.group(a) for a in M22.axis_names] + [rm2.group(a) for a in MESHES[1].axis_names]
    before = {"distinct": user_tp is not rm.group("tp"),
              "same_members": dist.get_process_group_ranks(user_tp) == dist.get_process_group_ranks(rm.group("tp"))}
    fm.clear_cache()
    pg_map = dist.distributed_c10d._world.pg_map
    after = {
        "ours_gone": [g not in pg_map for g in ours],
        "user_alive": user_tp in pg_map, "user_sum": reduce_in(user_tp),
        "dm_sums": [reduce_in(dm.get_group(a)) for a in ("x", "y")],
        "world_sum": reduce_in(dist.group.WORLD),
        # realize again after clearing: fresh groups that work
        "again": reduce_in(realize(M22).group("tp")),
    }
    fm.clear_cache()
    for g in mine:
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    for a in ("x", "y"):
        dist.destroy_process_group(dm.get_group(a))
    return {"before": before, "after": after}


def test_clear_cache_leaves_groups_made_between_realize_calls_and_torch_device_meshes(w4):
    dm_mesh = make_mesh((2, 2), ("x", "y"))  # init_device_mesh's layout: row-major over 0..3
    for rank, res in enumerate(w4.run(user_groups_survive)):
        assert res["before"] == {"distinct": True, "same_members": True}
        after = res["after"]
        assert after["ours_gone"] == [True] * 4, rank
        assert after["user_alive"] and after["user_sum"] == expected_reduce(M22, "tp", rank)
        assert after["dm_sums"] == [expected_reduce(dm_mesh, a, rank) for a in ("x", "y")]
        assert after["world_sum"] == 1111
        assert after["again"] == expected_reduce(M22, "tp", rank)


def threads_read_the_cache(n_threads: int, iters: int) -> dict:
    fm.clear_cache()
    mesh = MESHES[1]
    rm = realize(mesh)
    expected = {a: rm.group(a) for a in mesh.axis_names}
    c10d0, info0 = registries(), fm.cache_info()
    count0 = dist.distributed_c10d._world.group_count
    barrier = threading.Barrier(n_threads)
    seen: list[list] = [[] for _ in range(n_threads)]
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for k in range(iters):
                again = fm.realize(mesh, check=False, timeout=GROUP_TIMEOUT)
                sel = rm["tp"] if k % 2 else rm["dp", "tp"]
                info = fm.cache_info()
                seen[i].append((again.group("dp"), again.group("tp"), sel.group("tp"), rm.group("dp"), info.groups))
        except BaseException as e:  # noqa: BLE001
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    alive = sum(t.is_alive() for t in threads)
    info = fm.cache_info()
    flat = [x for per in seen for x in per]
    return {
        "errors": errors, "alive": alive, "calls": len(flat),
        "same": all(dp is expected["dp"] and tp is expected["tp"] and s is expected["tp"] and d is expected["dp"]
                    for dp, tp, s, d, _ in flat),
        "groups_seen": sorted({g for *_, g in flat}),
        "lookups": (info.hits - info0.hits, info.misses - info0.misses, info.groups - info0.groups),
        "created": (dist.distributed_c10d._world.group_count - count0, registries() == c10d0),
        # the groups still work after the threads: one reduce per axis on the main thread
        "sums": [reduce_in(expected[a]) for a in mesh.axis_names],
    }


def test_threads_hitting_the_cache_get_the_same_groups_and_create_nothing(w4):
    n_threads, iters = 8, 25
    mesh = MESHES[1]
    for rank, res in enumerate(w4.run(threads_read_the_cache, n_threads, iters)):
        assert res["errors"] == [] and res["alive"] == 0, res["errors"]
        assert res["calls"] == n_threads * iters and res["same"], rank
        assert res["groups_seen"] == [len(mesh["dp"].groups()) + len(mesh["tp"].groups())]
        # every realize(check=False) is one hit per axis; nothing missed, nothing created
        assert res["lookups"] == (n_threads * iters * mesh.ndim, 0, 0)
        assert res["created"] == (0, True)
        assert res["sums"] == [expected_reduce(mesh, a, rank) for a in mesh.axis_names]


def pickling() -> dict:
    fm.clear_cache()
    rm = realize(M22)
    out: dict = {}
    for name, obj in {"root": rm, "selection": rm["tp"], "product": realize(M22, products=[("tp", "dp")])}.items():
        for how, fn in {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}.items():
            try:
                fn(obj)
                out[f"{name}/{how}"] = None
            except TypeError as e:
                out[f"{name}/{how}"] = str(e)
    fm.clear_cache()
    try:
        pickle.dumps(rm)  # stale: the same refusal, not a "destroyed" error
        out["stale"] = None
    except TypeError as e:
        out["stale"] = str(e)
    out["mesh"] = rm.mesh  # travels back to the parent through a pipe (pickle)
    out["selected"] = rm.mesh["tp"]
    return out


def return_the_realized_mesh():
    return realize(M22)


def test_realized_meshes_refuse_pickling_and_copying_while_their_mesh_crosses_processes(w4):
    for res in w4.run(pickling):
        for key in ("root", "selection", "product"):
            for how in ("pickle", "copy", "deepcopy"):
                assert res[f"{key}/{how}"] == PICKLE_MESSAGE, (key, how)
        assert res["stale"] == PICKLE_MESSAGE
        assert res["mesh"] == M22 and hash(res["mesh"]) == hash(M22)
        assert np.array_equal(res["mesh"].groups(), M22.groups())
        assert res["selected"] == M22["tp"]
    # sending the realized mesh itself to another process fails with our message
    outs = w4.outcomes(return_the_realized_mesh)
    for o in outs:
        assert not o.ok and o.error_type == "PicklingError" and PICKLE_MESSAGE in o.message, o.describe()


def lookup_on_rank_zero_only(check_s: float) -> dict:
    rank = dist.get_rank()
    realize(M22)  # every rank, checked: the mesh is in every cache
    if rank == 0:
        fm.realize(M22, check=False, timeout=GROUP_TIMEOUT)  # a pure cache lookup, on one rank only
    out = {}
    try:
        realize(M22, check=check_s)  # the next checked call, on every rank
        out["next"] = "ok"
    except fm.MeshError as e:
        out["next"] = str(e)
    if rank != 0:  # line the call numbers up again, whichever way realize counts
        fm.realize(M22, check=False, timeout=GROUP_TIMEOUT)
    realize(M22, check=check_s)  # in step again (raises otherwise)
    return out


def test_an_unchecked_lookup_on_one_rank_does_not_break_the_next_checked_call(w4):
    for o in w4.outcomes(lookup_on_rank_zero_only, 2):
        assert o.ok, o.describe()
        assert o.value == {"next": "ok"}, (o.rank, o.value)
