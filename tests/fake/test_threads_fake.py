"""The realize cache under concurrent threads, at a large world, under torch's single-process fake backend.

Fake collectives carry no data and ``realize`` skips its divergence check there, so one process
can play one rank of a 1,024-rank world and hammer the cache from many threads. What must hold:

- threads realizing the same and different meshes at once create exactly one group per
  distinct ordered member tuple (c10d's own counters say how many were made), every thread
  gets that one group object, and ``cache_info`` adds up (each distinct axis key misses once,
  every other lookup hits);
- ``clear_cache`` racing with realizing threads leaves nothing behind: stale meshes raise
  ``MeshError``, and after a last ``clear_cache`` c10d holds only the default group;
- ``with rm:`` and ``rm.device_mesh`` behave per thread as they do in one thread.

The thread switch interval is lowered while threads run, so they interleave inside realize
(CPython's default of 5 ms would let most of them run one after the other).
"""

from __future__ import annotations

import random
import sys
import threading
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm

WORLD, RANK = 1024, 517


@pytest.fixture
def fake_world():
    """A fake world of ``WORLD`` ranks seen from ``RANK``, torn down after the test."""
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=RANK, world_size=WORLD, store=FakeStore())
    fm.clear_cache()
    yield
    fm.clear_cache()
    dist.destroy_process_group()


@pytest.fixture
def interleave():
    """Switch threads every few microseconds while the test runs."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def run_threads(n: int, target, *args) -> list[str]:
    """Start ``n`` threads at once on ``target(i, *args)``; their errors (bounded joins)."""
    barrier = threading.Barrier(n)
    errors: list[str] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            target(i, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=body, args=(i,), name=f"realizer-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 60 s"
    return errors


def meshes() -> list[fm.Mesh]:
    """Meshes whose groups overlap in every way the cache shares (docs/design.md "The cache", "Edge cases")."""
    base = fm.make_mesh((16, 8, 8), ("dp", "cp", "tp"))
    return [
        base,
        fm.make_mesh((WORLD,), ("w",)).unflatten("w", {"dp": 16, "cp": 8, "tp": 8}),  # equal, another path
        base.flatten(("cp", "tp"), name="cp_tp"),  # new contiguous groups
        base.flatten(("tp", "cp")),  # the same rank sets in another order: other groups
        base["tp", "dp"],  # a family of 2-D submeshes: axes shared with base
        fm.Mesh.from_ranks(list(reversed(range(WORLD))), ("w",)).unflatten("w", {"a": 128, "b": 8}),  # permuted
        fm.make_mesh((8, 1, 128), ("x", "one", "y")),  # a size-1 axis: no group; torch is lent one, made once
        fm.make_mesh((WORLD,), ("w",)),  # the whole world, ascending: the default group
    ]


def pure_rows(mesh: fm.Mesh, axis: str) -> list[tuple[int, ...]]:
    fam = mesh[axis]
    return [tuple(r) for r in fam.groups().reshape(fam.num_groups, -1).tolist()]


def test_concurrent_realize_makes_one_group_per_member_tuple_and_consistent_counts(fake_world, interleave):
    ms = meshes()
    n_threads, repeats = 12, 2
    world_order = tuple(range(WORLD))
    # What must exist, from the pure meshes alone
    tuples = {row for m in ms for a in m.axis_names for row in pure_rows(m, a)} - {world_order}
    world_groups = {t for t in tuples if len(t) > 1}  # new_group on every rank (c10d's counter)
    mine = {t for t in tuples if RANK in t}  # groups this rank belongs to (c10d's pg_map); (RANK,): the lent one
    # size-1 axes need no lookup and no group (docs/design.md "Size-1 axes": no one-rank communicator)
    axis_keys = {(m[a].axis_layout(a), m[a].device_list) for m in ms for a in m.axis_names if m.axis_size(a) > 1}
    lookups = n_threads * repeats * sum(1 for m in ms for a in m.axis_names if m.axis_size(a) > 1)

    c10d = dist.distributed_c10d._world
    count0, pg_map0 = c10d.group_count, len(c10d.pg_map)
    seen: dict[tuple[int, ...], set[int]] = defaultdict(set)  # member tuple -> ids of group objects
    wrong: list = []
    keep: list = []  # hold every group so ids stay unique while we compare them

    def realize_all(i: int) -> None:
        order = [m for m in ms for _ in range(repeats)]
        random.Random(i).shuffle(order)
        for mesh in order:
            rm = fm.realize(mesh)
            for axis in mesh.axis_names:
                group = rm.group(axis)
                members = tuple(dist.get_process_group_ranks(group))
                if members != tuple(mesh[axis].group_of(RANK).reshape(-1).tolist()):
                    wrong.append((repr(mesh), axis, members))
                seen[members].add(id(group))
                keep.append(group)

    assert run_threads(n_threads, realize_all) == []
    assert wrong == []
    # one object per tuple: also one lent group for (RANK,), however many threads asked at once
    assert {t: len(ids) for t, ids in seen.items() if len(ids) != 1} == {}
    # each tuple created once, by one thread; the lent one-rank group is not counted by torch
    # (was: + 1 on torch >= 2.14 for the one local singleton group every rank made)
    assert c10d.group_count - count0 == len(world_groups)
    assert len(c10d.pg_map) - pg_map0 == len(mine)
    info = fm.cache_info()
    assert info == fm.CacheInfo(hits=lookups - len(axis_keys), misses=len(axis_keys), groups=len(world_groups))


def test_clear_cache_racing_with_realize_leaves_only_the_default_group(fake_world, interleave):
    ms = meshes()[:4]
    c10d = dist.distributed_c10d._world
    stop = threading.Event()
    stale: list[str] = []

    def realizer(i: int) -> None:
        rng = random.Random(i)
        while not stop.is_set():
            mesh = rng.choice(ms)
            rm = fm.realize(mesh)
            try:
                for axis in mesh.axis_names:
                    rm.group(axis)
                rm[mesh.axis_names[0]]
            except fm.MeshError as e:  # cleared between realize and use: must say so
                stale.append(str(e))

    def clearer(i: int) -> None:
        if i == 0:
            for _ in range(30):
                fm.clear_cache()
                threading.Event().wait(0.005)
            stop.set()
        else:
            realizer(i)

    assert run_threads(6, clearer) == []
    assert all("whose groups clear_cache() destroyed; call realize(mesh) again" in s for s in stale), stale[:3]
    fm.clear_cache()
    assert list(c10d.pg_map) == [dist.group.WORLD]
    assert fm.cache_info() == fm.CacheInfo(0, 0, 0)
    # the cache works normally afterwards
    rm = fm.realize(ms[0])
    assert dist.get_process_group_ranks(rm.group("tp")) == ms[0]["tp"].group_of(RANK).tolist()


def test_with_rm_entered_in_two_threads_at_once_sets_each_thread_current_mesh(fake_world):
    rm = fm.realize(fm.make_mesh((32, 32), ("dp", "tp")))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[int, list] = {}

    def enter(i: int) -> None:
        # thread 0 enters, then thread 1; thread 0 leaves first, while thread 1 is still inside
        if i == 1:
            first_in.wait(10)
        try:
            with rm:
                seen[i] = [fm.current_mesh() is rm]
                (first_in if i == 0 else second_in).set()
                (second_in if i == 0 else first_out).wait(10)
                seen[i].append(fm.current_mesh() is rm)
        finally:
            if i == 0:
                first_out.set()
        seen[i].append(fm.current_mesh())

    errors = run_threads(2, enter)
    if errors:
        raise ValueError("; ".join(errors))
    assert seen == {0: [True, True, None], 1: [True, True, None]}


def read_device_meshes(i: int, rm, sel, out: list) -> None:
    out.append((rm.device_mesh, sel.device_mesh))


def test_device_mesh_asked_by_many_threads_at_once_is_built_once(fake_world, interleave):
    mesh = fm.make_mesh((16, 8, 8), ("dp", "cp", "tp"))
    distinct = []
    for _ in range(10):  # fresh realized meshes: device_mesh not built yet
        rm = fm.realize(mesh)
        sel = rm["cp", "tp"]
        got: list = []
        assert run_threads(8, read_device_meshes, rm, sel, got) == []
        distinct.append((len({id(a) for a, _ in got}), len({id(b) for _, b in got})))
        assert all(a == got[0][0] for a, _ in got)  # equal meshes in any case
        fm.clear_cache()
    assert distinct == [(1, 1)] * 10
