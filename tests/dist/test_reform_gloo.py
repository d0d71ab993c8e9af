"""Re-forming after a failure: a group that failed is never handed out again; start-up has its own bound.

Real gloo workers, spawned by the harness of ``test_faults_gloo.py`` (a fresh world per case, the
TCPStore hosted by the test), or, for the start-up cases, plain processes that find each other
through the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and
let ``realize`` start the default group, as a torchrun worker does.

The first case is the one docs/reliability.md's recipe must survive: (dp_replicate 2, tp 2), axis
timeout 2 s, replica 1 leaves in the middle of step 2. Rank 1's ``dp_replicate`` psum fails at once
(its partner is dead) while rank 0, which finished step 2, waits in step 3's ``tp`` psum that rank 1
never joins; after 2 s gloo closes that group's pairs. Before the fix, the members-only realize
of replica 0 handed back the cached ``tp`` group and its first psum failed ("Application timeout
caused pair closure"); and the two survivors had finished different steps.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm

from examples.elastic_replicate import agree_on_survivors  # the recipe of docs/reliability.md, as users run it

from .test_faults_gloo import MARGIN_S, run_world, self_kill

pytestmark = pytest.mark.timeout(600)  # a world's start and its budget, on busy cores

LR = 0.25
TIMEOUT_S = 2.0


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(500 + step)
    return torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randn(8, 1, generator=gen, dtype=torch.float64)


def reference(steps: int) -> torch.Tensor:
    """One process, the whole batch: what every layout must give (the loss is a sum, split anyhow)."""
    w = torch.zeros(4, 1, dtype=torch.float64)
    for step in range(1, steps + 1):
        x, y = data(step)
        (g,) = torch.autograd.grad(((x @ w.requires_grad_(True) - y) ** 2).sum() / 8, w)
        w = (w - LR * g).detach()
    return w


def train_step(rm: Any, w: torch.Tensor, step: int, between: Callable[[], None] = lambda: None) -> torch.Tensor:
    """Rows split over (dp_replicate, tp); the gradient summed over tp first, then across replicas
    (``between`` runs between the two sums)."""
    n = rm.mesh.axis_size("dp_replicate") * rm.mesh.axis_size("tp")
    i = rm.coordinate[0] * rm.mesh.axis_size("tp") + rm.coordinate[1]
    x, y = data(step)
    rows = slice(i * 8 // n, (i + 1) * 8 // n)
    w = w.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(((x[rows] @ w - y[rows]) ** 2).sum() / 8, w)
    g = fm.psum(g, "tp", mesh=rm)
    between()
    return (w - LR * fm.psum(g, "dp_replicate", mesh=rm)).detach()


def lose_replica_one_mid_step(rank: int, entering: Callable[[], float]) -> tuple[Any, float]:
    mesh = fm.make_mesh((2, 2), ("dp_replicate", "tp"))
    rm = fm.realize(mesh, timeout=TIMEOUT_S, check=10)
    old_tp = rm.group("tp")
    weights = {0: torch.zeros(4, 1, dtype=torch.float64)}  # the state after each completed step
    weights[1] = train_step(rm, weights[0], 1)
    start = entering()
    out: dict[str, Any] = {}
    done = 1
    # replica 1 leaves mid-step: rank 3 between step 2's tp and dp_replicate psums ...
    between = self_kill if rank == 3 else (lambda: None)
    try:
        for step in (2, 3):
            weights[step] = train_step(rm, weights[done], step, between)
            done = step
            if rank == 2:  # ... and rank 2 right after it (it finished step 2, then it is gone)
                return {"done": done}, start
    except fm.MeshError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["done"] = done
    out["detect_s"] = time.monotonic() - start
    alive, agreed = agree_on_survivors("reform/1", 4, 2 * TIMEOUT_S + 3, done)  # rank 0 arrives after ~2 s
    out["alive"], out["agreed"] = alive, agreed
    small_mesh = mesh.take(dp_replicate=[0])
    leaving = sorted(set(range(4)) - set(small_mesh.ranks.reshape(-1).tolist()))
    fm.abort(ranks=leaving)
    made = fm.cache_info().groups
    small = fm.realize(small_mesh, members_only=True, timeout=TIMEOUT_S, check=10)
    out["made"] = fm.cache_info().groups - made
    out["reused_tp"] = small.group("tp") is old_tp
    w = weights[agreed]  # every survivor goes back to the last step all of them completed
    for step in range(agreed + 1, 4):
        w = train_step(small, w, step)
    out["w3"] = w
    return out, start


def test_a_group_that_failed_is_made_again_and_survivors_agree_on_the_step():
    w = run_world(4, lose_replica_one_mid_step, victim=3, budget=180.0)
    assert not w.hung, [r.describe() for r in w.reports.values()]
    assert all(r.ok for r in w.reports.values()), [r.describe() for r in w.reports.values()]
    r0, r1 = w.reports[0].value, w.reports[1].value
    assert w.reports[2].value == {"done": 2}
    # rank 0 finished step 2 and failed in step 3's tp psum after tp's timeout; rank 1 failed step 2 at once
    assert r0["done"] == 2 and re.search(r"psum.*axis 'tp' \(group ranks \[0, 1\]\)", r0["error"]), r0["error"]
    assert TIMEOUT_S - 0.5 <= r0["detect_s"] <= TIMEOUT_S + MARGIN_S, r0["detect_s"]
    assert r1["done"] == 1 and "axis 'dp_replicate' (group ranks [1, 3])" in r1["error"], r1["error"]
    for out in (r0, r1):
        assert out["alive"] == [0, 1] and out["agreed"] == 1, out
        # the failed tp group left the cache on both members (rank 1 read rank 0's mark): one new group each
        assert out["made"] == 1 and out["reused_tp"] is False, out
        torch.testing.assert_close(out["w3"], reference(3), rtol=1e-12, atol=1e-12)
    print("figures:", {r: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in w.reports[r].value.items()
                           if k in ("detect_s", "done", "agreed", "made")} for r in (0, 1)})


def other_rank_failed_first(rank: int, entering: Callable[[], float]) -> tuple[Any, float]:
    """Only rank 0 sees its tp group fail (rank 1 leaves the psum out): rank 1's cached group must go too."""
    mesh = fm.make_mesh((2,), ("tp",))  # ranks 0 and 1 of a world of 3: rank 2 takes part in realize only
    rm = fm.realize(mesh, timeout=TIMEOUT_S, check=10)
    old = rm.group("tp") if rank < 2 else None
    start = entering()
    out: dict[str, Any] = {}
    if rank == 0:
        try:
            fm.psum(torch.ones(1), "tp", mesh=rm)
        except fm.MeshError as e:
            out["error"] = type(e).__name__
    made = fm.cache_info().groups
    again = fm.realize(mesh, timeout=TIMEOUT_S, check=10)  # a world call: both look the mark up after the check
    out["made"] = fm.cache_info().groups - made
    if rank < 2:
        out["same"] = again.group("tp") is old
        out["sum"] = fm.psum(torch.full((1,), float(rank + 1)), "tp", mesh=again).item()
    return out, start


def test_a_group_failed_on_one_member_is_dropped_by_every_member_at_the_next_realize():
    w = run_world(3, other_rank_failed_first, victim=None, budget=120.0)
    assert not w.hung and all(r.ok for r in w.reports.values()), [r.describe() for r in w.reports.values()]
    assert w.reports[0].value["error"] == "CollectiveError"
    for r in (0, 1):
        out = w.reports[r].value
        assert out["made"] == 1 and out["same"] is False and out["sum"] == 3.0, (r, out)
    # rank 2, outside the mesh, read the mark too and took part in making the new group (a world call)
    assert w.reports[2].value["made"] == 1


# -- start-up: the default group's own bound ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_like(rank: int, world: int, port: int, delay: float, env: dict[str, str], queue: Any) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    torch.set_num_threads(1)
    time.sleep(delay)
    start = time.monotonic()
    try:
        rm = fm.realize(fm.make_mesh((world,), ("w",)), timeout=2)  # the first call: realize starts the job
        value = fm.psum(torch.ones(1), "w", mesh=rm).item()
        timeout = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout
        borrowed = rm.group("w") is dist.group.WORLD
        queue.put((rank, "ok", (value, timeout.total_seconds(), borrowed), time.monotonic() - start))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        queue.put((rank, type(e).__name__, f"{e}" or traceback.format_exc(), time.monotonic() - start))
    queue.close()
    queue.join_thread()  # the report is written before the process leaves without teardown
    os._exit(0)


def _run_torchrun_like(world: int, delays: dict[int, float], env: dict[str, str], budget: float) -> dict[int, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_torchrun_like, args=(r, world, port, delays.get(r, 0.0), env, queue), daemon=True)
             for r in range(world) if delays.get(r) is not None or r not in delays]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + budget
    try:
        while len(out) < len(procs) and time.monotonic() < deadline:
            try:
                rank, *rest = queue.get(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception:  # noqa: BLE001 - queue.Empty at the deadline
                break
            out[rank] = rest
    finally:
        for p in procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(2)
    return out


def test_a_rank_that_starts_late_does_not_fail_the_others_through_an_axis_timeout():
    out = _run_torchrun_like(2, {1: 5.0}, {}, budget=90.0)
    assert sorted(out) == [0, 1], out
    for rank, (status, value, seconds) in out.items():
        assert status == "ok", (rank, status, value)
        assert value[0] == 2.0
        # the start-up waited past the axis's 2 s; then the default group took timeout= for its collectives,
        # so the whole-world axis borrowed it (no group of its own)
        assert value[1] == 2.0 and value[2] is True, value
    assert out[0][2] >= 4.0  # rank 0 did wait for the late rank (5 s, less its own start)


def test_a_start_up_that_fails_is_a_mesh_error_naming_it_within_its_own_bound():
    out = _run_torchrun_like(2, {1: None}, {"FUNCTIONAL_MESH_INIT_TIMEOUT": "3"}, budget=60.0)  # rank 1 never starts
    assert sorted(out) == [0], out
    status, message, seconds = out[0]
    assert status == "MeshError", (status, message)
    assert "`realize` requires every rank of the job to start the default group" in message, message
    assert "within 3 s ($FUNCTIONAL_MESH_INIT_TIMEOUT)" in message and "torch said:" in message, message
    assert 2.5 <= seconds <= 3 + MARGIN_S + 10, seconds
