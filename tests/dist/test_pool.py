"""The worker-pool harness itself: results by rank, exceptions, and no hang on a dead or stuck worker.

World 2 keeps the deliberate re-spawns cheap (~2 s each).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.dist._pool import Pool, PoolError, WorkerFailed, pool_fixture

w2 = pool_fixture(2)


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
