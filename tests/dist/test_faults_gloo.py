"""Killed and stuck workers: the survivors must fail, within the configured timeout, with a useful error.

torchrun is not used on purpose: its agent kills every sibling when one worker dies, which would
hide what the library does. Each test launches a small fresh world (3 or 4 spawned processes)
with a dedicated harness, because a world that lost a rank cannot be reused (the shared pool of
``_pool.py`` would have to be torn down anyway). As under torchrun, the TCPStore is hosted
outside the workers (here by the pytest process), so a dead rank 0 does not take the store down.

The knobs these tests exercise (docs/reliability.md lists them):

- ``realize(mesh, check=seconds)`` or ``$FUNCTIONAL_MESH_CHECK_TIMEOUT`` (default 60 s): how long
  rank 0 waits for every rank before raising ``MeshError`` naming the missing ones (the others
  wait for rank 0's verdict a little longer: at most 5 s, at most half the wait);
- ``realize(mesh, timeout=seconds)``: the timeout of the groups realize creates, which bounds a
  collective over those groups; ``None`` gives torch's default for new groups (30 min on gloo);
- ``init_process_group(timeout=...)``: the default group's timeout, which bounds collectives
  over an axis that realize maps to the default group (the whole world, ascending).

A fault is injected either by the victim itself (``SIGKILL`` to its own pid just before the
call, or from inside its first ``new_group``) or by the parent (``SIGKILL`` while the
survivors are already inside the call). Times are ``time.monotonic()`` stamps, comparable
across processes on one Linux machine.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm

HOST = "127.0.0.1"
pytestmark = pytest.mark.timeout(600)  # a world's start (up to START_S) and its budget, on busy cores
STORE_S = 20.0  # store timeout of every worker (≤ 30 s)
START_S = 180.0  # spawning and joining a world on two busy cores (58 s seen at load 45)
# Slack on top of a configured timeout: polling, two busy cores, error unwinding. At load 10-20 a survivor
# took 35.7 s to leave a realize whose group timeout was 3 s (9.8 s at load 15, 6 s of margin failing). Each
# bound's message check names the timeout that fired ("Timed out waiting 1500ms", "within 3 s"), and the
# lower bounds (the timeout less 0.3 s) keep "not before"; the upper bound only rules out torch's 30 min.
MARGIN_S = 20.0
STORE_PORT_ENV = "FM_FAULT_TEST_STORE_PORT"  # the test's TCPStore, for workers that re-form the job


class Report(NamedTuple):
    """What one rank did with the faulty call."""

    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    message: str = ""
    start: float = 0.0  # monotonic stamp just before the call
    end: float = 0.0  # monotonic stamp when it returned or raised

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def describe(self) -> str:
        what = f"ok {self.value!r}" if self.ok else f"{self.error_type}: {self.message}"
        return f"rank {self.rank} after {self.seconds:.1f} s: {what}"


class World(NamedTuple):
    """The outcome of one faulty run: survivors' reports, the kill stamp, and what was killed."""

    reports: dict[int, Report]
    killed_at: float | None  # monotonic stamp of the parent's SIGKILL (None: the victim killed itself)
    victim_exit: int | None  # the victim's exit code (-9 after SIGKILL), None if it was still alive
    hung: list[int]  # survivors that never answered and were killed by the parent
    phases: dict[str, float]  # seconds to start the world and to run the scenario (for the record)


# -- the worker ---------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, init_timeout: float, env: dict[str, str], scenario: str,
            args: tuple, conn: mpc.Connection) -> None:
    os.environ.update({"OMP_NUM_THREADS": "1", STORE_PORT_ENV: str(port), **env})
    torch.set_num_threads(1)
    td = datetime.timedelta
    store = dist.TCPStore(HOST, port, world, is_master=False, timeout=td(seconds=STORE_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=td(seconds=init_timeout))
    dist.barrier()  # every pair of the default group is connected before the fault
    conn.send(("ready",))
    if not conn.poll(START_S) or conn.recv()[0] != "go":
        os._exit(2)
    module, _, name = scenario.rpartition(":")  # scenarios of other test modules run on this harness too
    fn = getattr(importlib.import_module(module), name) if module else globals()[name]

    def entering() -> float:
        """Stamp the start of the faulty call and tell the parent (which may now kill the victim)."""
        stamp = time.monotonic()
        conn.send(("entering", stamp))
        return stamp

    start = time.monotonic()
    try:
        value, start = fn(rank, entering, *args)
        reply = ("report", True, value, "", "", start, time.monotonic())
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        end = time.monotonic()
        kind = type(e)
        reply = ("report", False, None, f"{kind.__module__}.{kind.__qualname__}", f"{e}\n{traceback.format_exc()}"
                 if not str(e) else str(e), start, end)
    conn.send(reply)
    # Stay alive (sockets open) until the parent is done, so one survivor leaving does not turn
    # another survivor's timeout into a "connection closed"; then leave without any teardown.
    conn.poll(START_S)
    sys.stdout.flush()
    os._exit(0)


# -- the parent ---------------------------------------------------------------------------------


def run_world(world: int, scenario: Callable[..., Any], *args: Any, victim: int | None, parent_kill: bool = False,
              init_timeout: float = 10.0, env: dict[str, str] | None = None, budget: float = 120.0,
              kill_delay: float = 0.5) -> World:
    """Launch ``world`` gloo workers, run ``scenario(rank, entering, *args)`` on each, collect the survivors.

    ``parent_kill``: SIGKILL ``victim`` ``kill_delay`` s after every survivor called ``entering()``.
    Survivors that do not report within ``budget`` s of the go are recorded as hung; every
    process is gone when this returns. The budget only tells a hang from a slow machine (a passing
    run returns when the last survivor reports): at load 45 the survivors of a 3-second scenario
    took over 40 s to reach it, so budgets are minutes.
    """
    ctx = mp.get_context("spawn")
    store = dist.TCPStore(HOST, 0, world, is_master=True, timeout=datetime.timedelta(seconds=STORE_S),
                          wait_for_workers=False)
    procs, conns = [], []
    t0 = time.monotonic()
    try:
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, name=f"fault-worker-{rank}/{world}", daemon=True,
                               args=(rank, world, store.port, init_timeout, env or {},
                                     f"{scenario.__module__}:{scenario.__name__}", args, child))
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        deadline = time.monotonic() + START_S
        for rank, conn in enumerate(conns):
            try:
                ready = conn.poll(max(deadline - time.monotonic(), 0.1)) and conn.recv() == ("ready",)
            except EOFError:
                ready = False
            if not ready:
                raise RuntimeError(f"rank {rank} did not start within {START_S:g} s (exit code {procs[rank].exitcode})")
        for conn in conns:
            conn.send(("go",))
        phases = {"start": time.monotonic() - t0}
        survivors = [r for r in range(world) if r != victim]
        entered: set[int] = set()
        reports: dict[int, Report] = {}
        killed_at = None
        deadline = time.monotonic() + budget
        while len(reports) < len(survivors) and time.monotonic() < deadline:
            for r in survivors:
                while r not in reports and conns[r].poll():
                    msg = conns[r].recv()
                    if msg[0] == "entering":
                        entered.add(r)
                    else:
                        reports[r] = Report(r, *msg[1:])
            if parent_kill and killed_at is None and entered >= set(survivors):
                time.sleep(kill_delay)  # let the survivors get inside the call
                procs[victim].kill()
                killed_at = time.monotonic()
            if len(reports) < len(survivors):
                mpc.wait([conns[r] for r in survivors if r not in reports], timeout=0.2)
        hung = [r for r in survivors if r not in reports]
        victim_exit = None
        if victim is not None:
            procs[victim].join(0.5)  # a killed victim is long dead by now; a stuck one is killed below
            victim_exit = procs[victim].exitcode
        phases["run"] = time.monotonic() - t0 - phases["start"]
        return World(reports, killed_at, victim_exit, hung, phases)
    finally:
        if victim is not None and victim < len(procs) and procs[victim].is_alive():
            procs[victim].kill()  # a stuck victim never leaves by itself
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(("exit",))
        for proc in procs:
            proc.join(5)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in conns:
            conn.close()
        del store


def survivors_failed(w: World, within: float, since: str = "start") -> list[Report]:
    """Every survivor raised, at most ``within`` s after it entered the call (or after the kill)."""
    assert not w.hung, f"survivors {w.hung} hung; answered: {[r.describe() for r in w.reports.values()]}"
    failed = sorted((r for r in w.reports.values() if not r.ok), key=lambda r: r.rank)
    for r in w.reports.values():
        origin = w.killed_at if since == "kill" else r.start
        assert r.end - origin <= within, f"{r.describe()}: more than {within:g} s"
    return failed


def self_kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# -- scenarios (run in the workers; return (value, stamp of the faulty call's start)) ------------


def realize_with_victim(rank: int, entering: Callable[[], float], victim: int, mode: str, check: Any,
                        timeout: float | None) -> tuple[Any, float]:
    mesh = fm.make_mesh((dist.get_world_size(),), ("w",))
    if rank == victim:
        if mode == "self":
            self_kill()
        time.sleep(120)  # "parent": wait to be killed
    start = entering()
    rm = fm.realize(mesh, timeout=timeout, check=check)
    return repr(rm.mesh), start


def realize_killed_in_new_group(rank: int, entering: Callable[[], float], victim: int,
                                timeout: float) -> tuple[Any, float]:
    """The divergence check passes; the victim dies inside its first new_group."""
    if rank == victim:
        from functional_mesh import _torch

        real, real_in_order = dist.new_group, _torch.group_in_order

        def dying_new_group(*args: Any, **kwargs: Any) -> Any:
            self_kill()
            return real(*args, **kwargs)

        def dying_group_in_order(*args: Any, **kwargs: Any) -> Any:
            self_kill()
            return real_in_order(*args, **kwargs)

        dist.new_group = dying_new_group  # fault injection in the victim only
        _torch.group_in_order = dying_group_in_order  # where new_group cannot keep mesh order (torch 2.11)
    start = entering()
    world = dist.get_world_size()
    rm = fm.realize(fm.Mesh.from_ranks(list(reversed(range(world))), ("w",)), timeout=timeout, check=5)
    return repr(rm.mesh), start


def psum_with_victim(rank: int, entering: Callable[[], float], victim: int, mode: str, mesh: Any, axis: str,
                     timeout: float | None) -> tuple[Any, float]:
    rm = fm.realize(mesh, timeout=timeout, check=5)
    warm = fm.psum(torch.ones(1), axis, mesh=rm)  # the group's connections are live before the fault
    assert warm.item() == mesh.axis_size(axis)
    if rank == victim:
        if mode == "self":
            self_kill()
        time.sleep(120)  # "parent": wait to be killed; "hang": never enter the collective
    start = entering()
    out = fm.psum(torch.tensor([float(rank)]), axis, mesh=rm)
    return out.item(), start


def stuck_peer(rank: int, entering: Callable[[], float], victim: int, cases: list) -> tuple[Any, float]:
    """``cases``: (mesh, axis, realize timeout). The victim realizes and warms every group up, then
    stops taking part; each survivor records how each psum fails, one after the other."""
    rms = [fm.realize(mesh, timeout=timeout, check=5) for mesh, _, timeout in cases]
    for rm, (mesh, axis, _) in zip(rms, cases):
        assert fm.psum(torch.ones(1), axis, mesh=rm).item() == mesh.axis_size(axis)
    if rank == victim:
        time.sleep(120)  # alive, connections open, never enters a collective again
    first = entering()
    out = []
    for rm, (_, axis, _) in zip(rms, cases):
        start = time.monotonic()
        try:
            fm.psum(torch.ones(1), axis, mesh=rm)
            out.append(("ok", "", time.monotonic() - start))
        except RuntimeError as e:
            out.append((type(e).__name__, str(e), time.monotonic() - start))
    return out, first


def per_axis_timeouts(rank: int, entering: Callable[[], float], victim: int, timeouts: dict) -> tuple[Any, float]:
    """(dp=2, tp=2) with a timeout per axis; the victim stops taking part; each survivor psums over
    dp then tp and records how each ends, then aborts and records how long that took."""
    mesh = fm.make_mesh((2, 2), ("dp", "tp"))
    rm = fm.realize(mesh, timeout=timeouts, check=5)
    for axis in ("dp", "tp"):
        assert fm.psum(torch.ones(1), axis, mesh=rm).item() == 2  # every group's connections are live
    if rank == victim:
        time.sleep(120)  # alive, connections open, never enters a collective again
    first = entering()
    out: dict[str, Any] = {}
    for axis in ("dp", "tp"):
        start = time.monotonic()
        try:
            fm.psum(torch.ones(1), axis, mesh=rm)
            out[axis] = ("ok", "", time.monotonic() - start)
        except RuntimeError as e:
            out[axis] = (type(e).__name__, str(e), time.monotonic() - start)
    out["abort"] = _abort_and_observe(rm)
    return out, first


def _abort_and_observe(rm: Any) -> dict[str, Any]:
    """fm.abort(): its duration, and what the handle and the cache say afterwards."""
    start = time.monotonic()
    fm.abort()
    seconds = time.monotonic() - start
    try:
        rm.group(rm.mesh.axis_names[0])
        error = None
    except fm.MeshError as e:
        error = str(e)
    return {"seconds": seconds, "error": error, "cache": tuple(fm.cache_info())}


REFORM_LR = 0.1


def train_step(rm: Any, w: torch.Tensor, step: int) -> torch.Tensor:
    """One data-parallel SGD step of a linear model: the global batch split over (dp_replicate, dp_shard)."""
    axes = ("dp_replicate", "dp_shard")
    n = rm.mesh.axis_size(axes[0]) * rm.mesh.axis_size(axes[1])
    gen = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randn(8, 1, generator=gen, dtype=torch.float64)
    i = rm.coordinate[0] * rm.mesh.axis_size(axes[1]) + rm.coordinate[1]
    rows = slice(i * 8 // n, (i + 1) * 8 // n)
    w = w.clone().requires_grad_(True)
    loss = ((x[rows] @ w - y[rows]) ** 2).sum() / 8
    (grad,) = torch.autograd.grad(loss, w)
    return (w - REFORM_LR * fm.psum(grad, axes, mesh=rm)).detach()


def lose_a_replica_and_reform(rank: int, entering: Callable[[], float], victim: int, timeout: float) -> tuple[Any, float]:
    """(dp_replicate=2, dp_shard=2): a step on 4 ranks, then ``victim`` dies before the next one. The
    survivors fail within the axis timeout, abort, start a new default group of 3 (a new store
    prefix), realize dp_replicate=1 over the complete replica and train the step again."""
    mesh = fm.make_mesh((2, 2), ("dp_replicate", "dp_shard"))
    rm = fm.realize(mesh, timeout=timeout, check=5)
    w1 = train_step(rm, torch.zeros(4, 1, dtype=torch.float64), 1)
    if rank == victim:
        self_kill()
    start = entering()
    out: dict[str, Any] = {"w1": w1}
    try:
        train_step(rm, w1, 2)
        out["step2"] = "ok"
    except RuntimeError as e:
        out["step2"] = f"{type(e).__name__}: {e}"
    out["detect_s"] = time.monotonic() - start
    out["abort"] = _abort_and_observe(rm)
    # re-form: the job's default group is broken too; the survivors start a new one
    t = time.monotonic()
    dist.destroy_process_group()
    out["destroy_s"] = time.monotonic() - t
    survivors = [r for r in range(4) if r != victim]
    base = dist.TCPStore(HOST, int(os.environ[STORE_PORT_ENV]), is_master=False,
                         timeout=datetime.timedelta(seconds=STORE_S))
    dist.init_process_group("gloo", store=dist.PrefixStore("reform/1", base), rank=survivors.index(rank),
                            world_size=len(survivors), timeout=datetime.timedelta(seconds=10))
    small = fm.make_mesh((1, 2), ("dp_replicate", "dp_shard"), devices=[0, 1])  # the complete replica
    rm = fm.realize(small, timeout=timeout, check=5)
    out["w2"] = None if rm.coordinate is None else train_step(rm, w1, 2)
    out["reform_s"] = time.monotonic() - t
    return out, start


def start_small(rank: int, entering: Callable[[], float], w1: torch.Tensor, timeout: float) -> tuple[Any, float]:
    """The run that began with the smaller mesh: step 2 from the same weights."""
    rm = fm.realize(fm.make_mesh((1, 2), ("dp_replicate", "dp_shard")), timeout=timeout, check=5)
    start = entering()
    return train_step(rm, w1, 2), start


# -- tests ----------------------------------------------------------------------------------------


def test_a_rank_killed_before_realize_is_named_by_every_survivor_within_the_env_check_wait():
    # The check wait comes from $FUNCTIONAL_MESH_CHECK_TIMEOUT (realize's default check=True).
    w = run_world(3, realize_with_victim, 2, "self", True, 10.0, victim=2,
                  env={"FUNCTIONAL_MESH_CHECK_TIMEOUT": "2"})
    assert w.victim_exit == -signal.SIGKILL
    failed = survivors_failed(w, within=2 + MARGIN_S)
    assert [r.rank for r in failed] == [0, 1]
    for r in failed:
        assert r.error_type == "functional_mesh.MeshError", r.describe()
        # the judge's verdict names rank 2; on busy cores a survivor may give up on the verdict first, and then
        # names rank 2 as not arrived itself (seen at load 15-20)
        assert re.search(r"ranks \[2\] did not reach realize call #1 within 2 s|got no verdict from rank 0 within 2 s; "
                         r"ranks not arrived: \[2\]", r.message), r.describe()
    judge = w.reports[0]
    assert judge.seconds >= 2 - 0.5, judge.describe()  # rank 0 really waited the configured time


def test_rank_zero_killed_inside_realize_is_named_by_the_others_after_their_longer_wait():
    # Rank 0 judges the check; the others wait for its verdict a little longer, then name it.
    w = run_world(3, realize_with_victim, 0, "parent", 1, 10.0, victim=0, parent_kill=True)
    assert w.victim_exit == -signal.SIGKILL and w.killed_at is not None
    failed = survivors_failed(w, within=1 + 5 + MARGIN_S)
    assert [r.rank for r in failed] == [1, 2]
    for r in failed:
        assert r.error_type == "functional_mesh.MeshError", r.describe()
        # rank 0 among those not arrived (on busy cores a slow survivor may be listed beside it: [0, 1], load 15-20)
        assert re.search(r"got no verdict from rank 0 within 1 s; ranks not arrived: \[0(, \d)?\]", r.message), r.describe()
        assert r.seconds >= 1 - 0.3, r.describe()  # not before the check wait


def test_a_rank_killed_inside_group_creation_fails_the_survivors_within_the_group_timeout():
    # The check passed, so the survivors are in new_group when rank 1 dies (record what gloo says).
    w = run_world(3, realize_killed_in_new_group, 1, 3.0, victim=1)
    assert w.victim_exit == -signal.SIGKILL
    # from entering realize: the check waits up to its 5 s for the last rank (the ranks' skew on busy cores:
    # 9.8 s in all at load 15-20), then the group's 3 s; far below the store's 20 s or torch's 30 min
    failed = survivors_failed(w, within=5 + 3 + MARGIN_S)
    assert [r.rank for r in failed] == [0, 2], [r.describe() for r in w.reports.values()]
    for r in failed:  # gloo's rendezvous gives up waiting for the dead rank's address; realize names the axis
        assert r.error_type == "functional_mesh.MeshError", r.describe()
        assert "could not create the process groups of axis 'w' (first [2, 1, 0], 1 in all) within 3 s" in r.message, \
            r.describe()
        assert "wait timeout after 3000ms" in r.message, r.describe()  # torch's own words are kept
        assert r.seconds >= 3 - 0.5, r.describe()  # realize's timeout, not something shorter


GLOO_PEER_GONE = r"Connection (closed|reset) by peer|Timed out waiting \d+ms"


def test_a_rank_killed_before_a_psum_fails_its_group_and_spares_the_other_group():
    mesh = fm.make_mesh((2, 2), ("dp", "tp"))  # tp groups (0, 1) and (2, 3); rank 3 dies
    w = run_world(4, psum_with_victim, 3, "self", mesh, "tp", 5.0, victim=3)
    assert w.victim_exit == -signal.SIGKILL
    failed = survivors_failed(w, within=5 + MARGIN_S)
    assert [r.rank for r in failed] == [2], [r.describe() for r in w.reports.values()]
    assert re.search(GLOO_PEER_GONE, failed[0].message), failed[0].describe()
    assert w.reports[0].value == w.reports[1].value == 0 + 1  # the group without the victim sums its ranks


def test_a_rank_killed_inside_a_world_psum_fails_the_others_within_the_default_group_timeout():
    mesh = fm.make_mesh((3,), ("w",))  # the whole world, ascending: realize reuses the default group
    w = run_world(3, psum_with_victim, 1, "parent", mesh, "w", None, victim=1, parent_kill=True, init_timeout=5.0)
    assert w.victim_exit == -signal.SIGKILL and w.killed_at is not None
    failed = survivors_failed(w, within=5 + MARGIN_S, since="kill")
    assert [r.rank for r in failed] == [0, 2], [r.describe() for r in w.reports.values()]
    for r in failed:
        # a MeshError naming the axis (also a RuntimeError, as torch's was), torch's words kept
        assert r.error_type == "functional_mesh._handle.CollectiveError" and re.search(GLOO_PEER_GONE, r.message), \
            r.describe()
        assert "axis 'w' (group ranks [0, 1, 2])" in r.message, r.describe()


def test_a_stuck_rank_fails_psums_after_the_timeout_of_their_group_not_before():
    # A permuted world axis is a group realize creates: realize's timeout (1.5 s) bounds it. The
    # ascending world axis without settings is the default group: init_process_group's timeout (3 s)
    # bounds it. With a timeout of its own it is a group of its own (was: the default group, with
    # the default group's timeout, whatever realize's timeout said).
    world = fm.make_mesh((3,), ("w",))
    cases = [(fm.Mesh.from_ranks([2, 1, 0], ("w",)), "w", 1.5), (world, "w", None), (world, "w", {"w": 1.5})]
    w = run_world(3, stuck_peer, 1, cases, victim=1, init_timeout=3.0)
    assert not w.hung and sorted(w.reports) == [0, 2]
    for r in w.reports.values():
        assert r.ok, r.describe()
        (kind1, msg1, s1), (kind2, msg2, s2), (kind3, msg3, s3) = r.value
        assert kind1 == kind2 == kind3 == "CollectiveError", r.value
        assert "Timed out waiting 1500ms" in msg1 and 1.5 - 0.3 <= s1 <= 1.5 + MARGIN_S, (msg1, s1)
        assert "Timed out waiting 3000ms" in msg2 and 3 - 0.3 <= s2 <= 3 + MARGIN_S, (msg2, s2)
        assert "Timed out waiting 1500ms" in msg3 and 1.5 - 0.3 <= s3 <= 1.5 + MARGIN_S, (msg3, s3)


# -- per-axis timeouts, abort, re-forming the job -------------------------------------------------


def test_per_axis_timeouts_bound_each_axis_and_abort_returns_at_once():
    # rank 3 stops taking part: dp's group (1, 3) gives up after dp's 2 s, tp's group (2, 3) after
    # tp's 4 s; the others complete. Then every survivor aborts, without a collective.
    w = run_world(4, per_axis_timeouts, 3, {"dp": 2, "tp": 4}, victim=3, budget=120.0)
    assert not w.hung and sorted(w.reports) == [0, 1, 2], [r.describe() for r in w.reports.values()]
    for r in w.reports.values():
        assert r.ok, r.describe()
    outcome = {r: {a: w.reports[r].value[a][0] for a in ("dp", "tp")} for r in (0, 1, 2)}
    assert outcome == {0: {"dp": "ok", "tp": "ok"}, 1: {"dp": "CollectiveError", "tp": "ok"},
                       2: {"dp": "ok", "tp": "CollectiveError"}}, outcome
    _, msg, s = w.reports[1].value["dp"]
    assert "Timed out waiting 2000ms" in msg and 2 - 0.3 <= s <= 2 + MARGIN_S, (msg, s)
    # the survivor can tell which axis failed: its name, the group's ranks and the timeout
    assert "`psum` requires every member of axis 'dp' (group ranks [1, 3])" in msg and "(2 s)" in msg, msg
    _, msg, s = w.reports[2].value["tp"]
    assert "Timed out waiting 4000ms" in msg and 4 - 0.3 <= s <= 4 + MARGIN_S, (msg, s)
    assert "axis 'tp' (group ranks [2, 3])" in msg and "(4 s)" in msg, msg
    for r in w.reports.values():
        aborted = r.value["abort"]
        assert aborted["seconds"] < 1.0, aborted  # bounded: no collective, no wait on the stuck peer
        assert aborted["cache"] == (0, 0, 0)
        assert "whose groups abort() aborted" in aborted["error"], aborted


def test_survivors_of_a_lost_replica_abort_reform_and_match_a_run_that_started_small():
    timeout = 3.0
    w = run_world(4, lose_a_replica_and_reform, 3, timeout, victim=3, budget=150.0)
    assert w.victim_exit == -signal.SIGKILL
    assert not w.hung and sorted(w.reports) == [0, 1, 2], [r.describe() for r in w.reports.values()]
    for r in w.reports.values():
        assert r.ok, r.describe()
        out = r.value
        assert out["step2"].startswith("CollectiveError") and re.search(GLOO_PEER_GONE, out["step2"]), out["step2"]
        assert out["detect_s"] <= timeout + MARGIN_S, out["detect_s"]  # within the axis timeout
        assert out["abort"]["seconds"] < 1.0 and out["abort"]["cache"] == (0, 0, 0), out["abort"]
        assert "whose groups abort() aborted" in out["abort"]["error"]
    w1 = w.reports[0].value["w1"]
    assert all(torch.equal(w.reports[r].value["w1"], w1) for r in (1, 2))
    assert w.reports[2].value["w2"] is None  # outside the smaller mesh
    small = run_world(2, start_small, w1, timeout, victim=None)
    assert not small.hung and all(r.ok for r in small.reports.values()), [r.describe() for r in small.reports.values()]
    expected = small.reports[0].value
    assert not torch.equal(expected, w1)  # the step moved the weights
    for r in (0, 1):
        assert torch.equal(w.reports[r].value["w2"], expected), (w.reports[r].value["w2"], expected)
    print("phases:", w.phases, small.phases)
    print("figures:", {r: {k: round(v, 3) for k, v in w.reports[r].value.items() if k.endswith("_s")}
                       | {"abort_s": round(w.reports[r].value["abort"]["seconds"], 4)} for r in (0, 1, 2)})
