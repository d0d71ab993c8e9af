"""The worker-pool harness itself: results by rank, exceptions, no hang on a dead or stuck worker, and
the reset that lets modules share one pool per world size.

World 2 keeps the deliberate re-spawns cheap (~2 s each).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from tests.dist._pool import PRELOAD, START_TIMEOUT_S, Pool, PoolError, WorkerFailed, pool_fixture, shared_pool

w2 = pool_fixture(2, own=True)  # kills and hangs its workers on purpose: a pool of its own


def rank_and_sum(value: int) -> tuple[int, int, str]:
    t = torch.tensor([value * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), int(t.item()), os.environ["OMP_NUM_THREADS"]


def raise_on(rank: int) -> str:
    if dist.get_rank() == rank:
        raise KeyError("boom on purpose")
    return "fine"


def die_on(rank: int) -> None:
    if dist.get_rank() == rank:
        os._exit(7)


def sleep_on(rank: int, seconds: float) -> None:
    if dist.get_rank() == rank:
        time.sleep(seconds)


def test_results_come_back_by_rank(w2):
    assert w2.run(rank_and_sum, 5) == [(0, 15, "1"), (1, 15, "1")]


def parent_and_preloaded() -> tuple[int, list[str]]:
    return os.getppid(), [name for name in PRELOAD if name not in sys.modules]


def test_workers_fork_from_a_server_that_already_imported_torch_and_the_library(w2):
    # this module imports torch but not the library: functional_mesh._realize & co. are there
    # because the forkserver imported them before forking the worker
    (parent0, missing0), (parent1, missing1) = w2.run(parent_and_preloaded)
    assert missing0 == missing1 == [] and "functional_mesh._realize" in PRELOAD
    assert parent0 == parent1 != os.getpid()  # the forkserver's children, not this process's


def test_a_test_that_takes_a_pool_gets_the_start_budget_on_top_of_its_timeout(w2, request):
    # tests/conftest.py: the test whose setup starts a pool may spend START_TIMEOUT_S on it
    (marker,) = [m for m in request.node.iter_markers("timeout")]
    assert marker.args == (request.config.getoption("timeout") + START_TIMEOUT_S,)


def test_an_exception_is_reported_with_its_rank_and_the_pool_stays_usable(w2):
    outs = w2.outcomes(raise_on, 1)
    assert outs[0].ok and outs[0].value == "fine"
    assert not outs[1].ok and outs[1].error_type == "builtins.KeyError" and "boom on purpose" in outs[1].message
    with pytest.raises(WorkerFailed, match=r"(?s)raised on ranks \[1\].*KeyError.*boom on purpose"):
        w2.run(raise_on, 1)
    assert w2.run(rank_and_sum, 1) == [(0, 3, "1"), (1, 3, "1")]


def test_a_dead_worker_fails_the_check_then_the_pool_respawns(w2):
    launches = w2.launches
    t0 = time.monotonic()
    with pytest.raises(PoolError, match=r"rank\(s\) \[1\] died \(exit codes \{1: 7\}\)"):
        w2.run(die_on, 1)
    assert time.monotonic() - t0 < 10
    assert w2.run(rank_and_sum, 2) == [(0, 6, "1"), (1, 6, "1")]
    assert w2.launches == launches + 1


def test_a_hung_worker_fails_the_check_within_its_timeout_then_the_pool_respawns(w2):
    t0 = time.monotonic()
    with pytest.raises(PoolError, match=r"rank\(s\) \[0\] did not answer within 2 s \(answered: \[1\]\)"):
        w2.run(sleep_on, 0, 60, timeout=2)
    assert time.monotonic() - t0 < 10
    assert w2.run(rank_and_sum, 1) == [(0, 3, "1"), (1, 3, "1")]


def test_a_check_must_be_importable_by_the_workers(w2):
    with pytest.raises(TypeError, match="module-level function"):
        w2.run(lambda: None)


def test_close_is_clean_and_repeatable():
    pool = Pool(2).start()
    assert pool.run(rank_and_sum, 1) == [(0, 3, "1"), (1, 3, "1")]
    pool.close()
    assert pool.procs == [] and not pool.broken
    pool.close()  # closing twice is harmless


# -- sharing: reset between modules -----------------------------------------------------------------


def double_on_a_reversed_mesh() -> list[float]:
    """A DTensor op over a group realize makes (ranks 1, 0: not the default group's order)."""
    import functional_mesh as fm

    rm = fm.realize(fm.Mesh.from_ranks([1, 0], ("x",)), check=False)
    t = fm.distribute(torch.arange(4.0), fm.NamedSharding(rm.mesh, fm.P("x")), mesh=rm)
    return (t * 2).full_tensor().tolist()


def leave_state_behind() -> None:
    """What a careless module could leave on a rank: realized groups and DTensor's cached shardings
    over them, groups of its own, dtype, grad mode, an environment variable."""
    import functional_mesh as fm

    double_on_a_reversed_mesh()
    fm.realize(fm.make_mesh((2,), ("x",)), check=False)  # the whole world: realize borrows the default group
    fm.realize(fm.make_mesh((1, 2), ("one", "x")), check=False)  # a size-1 axis: the lent one-rank group
    dist.new_group([0, 1])
    dist.new_group([1, 0])
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    os.environ["FM_TEST_LEFT_BEHIND"] = "1"


def what_is_left() -> dict:
    import functional_mesh as fm

    c10d = dist.distributed_c10d._world
    return {"groups": len(c10d.pg_map), "cache": fm.cache_info().groups, "dtype": torch.get_default_dtype(),
            "grad": torch.is_grad_enabled(), "env": os.environ.get("FM_TEST_LEFT_BEHIND")}


def bump_group_counter_on(rank: int) -> None:
    if dist.get_rank() == rank:
        dist.distributed_c10d._world.group_count += 1


def count_a_realize_check_on(rank: int) -> None:
    from functional_mesh import _agree

    if dist.get_rank() == rank:
        _agree.next_call("realize")


def test_reset_clears_what_a_module_left_on_every_rank():
    pool = Pool(2).start()
    try:
        pool.run(leave_state_behind)
        left = pool.run(what_is_left)
        # default, (1, 0), the lent one-rank group, two of the user's
        assert [r["groups"] for r in left] == [5, 5]
        assert [r["dtype"] for r in left] == [torch.float64] * 2 and [r["env"] for r in left] == ["1", "1"]
        pool.reset()
        assert pool.run(what_is_left) == [{"groups": 1, "cache": 0, "dtype": torch.float32, "grad": True,
                                           "env": None}] * 2
        # the same mesh realized again: new groups, and no cached sharding that names the destroyed ones
        assert pool.run(double_on_a_reversed_mesh) == [[0.0, 2.0, 4.0, 6.0]] * 2
        assert pool.run(rank_and_sum, 1) == [(0, 3, "1"), (1, 3, "1")]  # the default group still works
        assert pool.launches == 1
    finally:
        pool.close()


@pytest.mark.parametrize(("skew", "named"), [(bump_group_counter_on, "group counter"),
                                             (count_a_realize_check_on, "realize check calls")])
def test_reset_refuses_ranks_that_disagree_on_what_it_cannot_undo_and_kills_the_pool(skew, named):
    pool = Pool(2).start()
    try:
        pool.run(skew, 1)
        with pytest.raises(PoolError, match=rf"(?s)earlier module left state.*{named} differs between ranks"):
            pool.reset()
        assert pool.broken and pool.procs == []
        assert pool.run(rank_and_sum, 1) == [(0, 3, "1"), (1, 3, "1")]  # a fresh world
        assert pool.launches == 2
    finally:
        pool.close()


def test_modules_borrow_one_shared_pool_per_world_size_reset_each_time():
    pool = shared_pool(2)
    launches = pool.launches
    pool.run(leave_state_behind)
    again = shared_pool(2)  # what the next module's fixture does
    assert again is pool and pool.launches == launches
    assert pool.run(what_is_left) == [{"groups": 1, "cache": 0, "dtype": torch.float32, "grad": True,
                                       "env": None}] * 2
