"""Members-only realize and adopted groups on real gloo workers (the shared world-8 pool).

- ``realize(mesh, members_only=True)``: only the mesh's ranks call it; two disjoint meshes are
  realized at once, in opposite orders, and one side finishes while the other has not started;
  a bridge mesh over two ranks of each side carries weights across; equal rank sets share a
  group; a non-member gets a ``MeshError``; torch's group counter does not move (the pool's
  reset checks it stays equal on every rank).
- ``realize(mesh, groups={axis: pg})``: the handle uses the caller's group, the cache makes
  none for that axis, ``clear_cache``/``abort`` leave it working and registered; a group of the
  wrong size, with this rank at the wrong position, or under an unknown key is a ``MeshError``.

Expected values come from the pure mesh (``group_of``) and from arithmetic, never from realize.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import _torch, make_mesh
from tests.dist._pool import pool_fixture

w8 = pool_fixture(8)

TIMEOUT_S = 20  # every group made here, and the checks' waits


def trainer_and_generator():
    world = make_mesh((8,), ("r",))
    trainer = world.take(r=slice(0, 6)).unflatten("r", {"dp": 3, "tp": 2})
    generator = world.take(r=[6, 7]).rename({"r": "tp"})
    return trainer, generator


def check_disjoint(delay_s: float):
    """Trainer (ranks 0-5) realizes its mesh then its dp selection; the generator (6-7), after
    ``delay_s``, realizes them in the other order. Returns timestamps and the sums."""
    rank = dist.get_rank()
    trainer, generator = trainer_and_generator()
    counter = dist.distributed_c10d._world.group_count
    before = fm.cache_info().groups
    if rank < 6:
        start = time.monotonic()
        rm = fm.realize(trainer, members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
        dp_only = fm.realize(trainer["dp"], members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
        same = dp_only.group("dp") is rm.group("dp")  # equal rank sets: one group
        total = fm.psum(torch.tensor([float(rank)]), ("dp", "tp"), mesh=rm).item()
        members = {axis: dist.get_process_group_ranks(rm.group(axis)) for axis in ("dp", "tp")}
    else:
        time.sleep(delay_s)
        start = time.monotonic()
        rm = fm.realize(generator, members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
        again = fm.realize(generator.rename({"tp": "gen"}), members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
        same = again.group("gen") is rm.group("tp")
        total = fm.psum(torch.tensor([float(rank)]), "tp", mesh=rm).item()
        members = {"tp": dist.get_process_group_ranks(rm.group("tp"))}
    return {"start": start, "end": time.monotonic(), "same": same, "total": total, "members": members,
            "made": fm.cache_info().groups - before,
            "counter moved": dist.distributed_c10d._world.group_count - counter}


def test_disjoint_meshes_in_opposite_orders(w8):
    trainer, generator = trainer_and_generator()
    out = w8.run(check_disjoint, 2.0, timeout=60)
    trainer_end = max(o["end"] for o in out[:6])
    assert trainer_end < min(o["start"] for o in out[6:]), "the trainer waited for the generator's ranks"
    for rank, o in enumerate(out):
        assert o["same"] and o["counter moved"] == 0
        if rank < 6:
            assert o["total"] == sum(range(6))
            for axis in ("dp", "tp"):
                assert o["members"][axis] == trainer[axis].group_of(rank).reshape(-1).tolist()
            assert o["made"] == 2  # its own dp and tp groups: a rank makes no group it is not in
        else:
            assert o["total"] == 13 and o["members"]["tp"] == [6, 7] and o["made"] == 1


def check_bridge():
    """Trainer rank 0/1 send their weights to generator rank 6/7 over a bridge mesh of those four."""
    rank = dist.get_rank()
    trainer, generator = trainer_and_generator()
    weights = torch.arange(4.0) + 10 * rank if rank < 6 else torch.zeros(4)
    bridge = make_mesh((4, 2), ("side", "tp")).take(side=[0, 3])  # [[0, 1], [6, 7]]
    if rank < 6:
        fm.realize(trainer, members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
    else:
        fm.realize(generator, members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
    if rank in (0, 1, 6, 7):
        rm = fm.realize(bridge, members_only=True, timeout=TIMEOUT_S, check=TIMEOUT_S)
        weights = fm.ppermute(weights, "side", [(0, 1)], mesh=rm)
    return weights.tolist() if rank in (6, 7) else None


def test_bridge_carries_weights(w8):
    out = w8.run(check_bridge, timeout=60)
    assert out[6] == [0.0, 1.0, 2.0, 3.0] and out[7] == [10.0, 11.0, 12.0, 13.0]


def check_non_member():
    trainer, _ = trainer_and_generator()
    if dist.get_rank() != 7:
        return None
    try:
        fm.realize(trainer, members_only=True)
    except fm.MeshError as exc:
        return str(exc)
    return "no error"


def test_non_member_is_refused(w8):
    message = w8.run(check_non_member)[7]
    assert "realize" in message and "members_only" in message and "rank=7" in message and "0..5" in message


# -- adopted groups ----------------------------------------------------------------------------


def my_dp_group(order):
    """Every rank makes the dp groups of (dp 2, tp 4) with ``new_group`` (members in ``order``)."""
    mine = None
    for t in range(4):
        row = order([t, t + 4])
        keep = {"sort_ranks": False} if _torch.NEW_GROUP_SORT_RANKS else {}  # torch 2.11's always sorts
        pg = dist.new_group(row, timeout=__import__("datetime").timedelta(seconds=TIMEOUT_S), **keep)
        if dist.get_rank() in row:
            mine = pg
    return mine


def check_adopted():
    rank = dist.get_rank()
    mesh = make_mesh((2, 4), ("dp", "tp"))
    mine = my_dp_group(lambda r: r)
    before = fm.cache_info().groups
    rm = fm.realize(mesh, groups={"dp": mine}, timeout=TIMEOUT_S, check=TIMEOUT_S)
    out = {"is mine": rm.group("dp") is mine, "made": fm.cache_info().groups - before,
           "psum": fm.psum(torch.tensor([float(rank)]), "dp", mesh=rm).item(),
           "both": fm.psum(torch.tensor([1.0]), ("dp", "tp"), mesh=rm).item()}
    fm.abort()  # realize's groups go; the adopted one stays registered and working
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    out["after abort"] = (dist.get_process_group_ranks(mine), t.item())
    fm.clear_cache()
    out["after clear"] = mine in dist.distributed_c10d._world.pg_map
    return out


def test_adopted_group_is_used_and_kept(w8):
    for rank, o in enumerate(w8.run(check_adopted, timeout=60)):
        t = rank % 4
        assert o["is mine"] and o["made"] == 2  # tp's two groups only
        assert o["psum"] == 2 * t + 4 and o["both"] == 8.0
        assert o["after abort"] == ([t, t + 4], 2 * t + 4.0) and o["after clear"]


def check_adopted_errors():
    mesh = make_mesh((2, 4), ("dp", "tp"))
    reversed_dp = my_dp_group(lambda r: r[::-1])  # this rank at the other position
    tp_sized = dist.new_group(list(range(8)), timeout=__import__("datetime").timedelta(seconds=TIMEOUT_S))
    messages = []
    for groups in ({"dp": tp_sized}, {"dp": reversed_dp}, {"pp": reversed_dp}):
        try:
            fm.realize(mesh, groups=groups, check=TIMEOUT_S)
            messages.append("no error")
        except fm.MeshError as exc:
            messages.append(str(exc))
    return messages


def test_adopted_group_is_validated(w8):
    size, position, key = w8.run(check_adopted_errors, timeout=60)[5]
    assert "realize" in size and "size" in size and "size 8" in size and "2" in size
    assert "'pp'" in key and "('dp', 'tp')" in key
    if not _torch.NEW_GROUP_SORT_RANKS:
        pytest.skip("the position case: this torch's new_group has no sort_ranks and always sorts its ranks "
                    "(2.11), so there is no reversed group to adopt (the size and key cases passed)")
    assert "rank 5 is group rank 0" in position and "valid: 1" in position
