"""Shrinking around a killed rank on real gloo workers, reusing the survivors' groups.

World 8 = (dp_replicate 2, dp_shard 2, tp 2): replica 0 is ranks 0-3, replica 1 ranks 4-7. One
training step on all 8, then rank 5 (replica 1) kills itself before the next. Every survivor's
step fails with a ``MeshError`` naming an axis; the survivors agree through the store on who is
alive (``agree_on_survivors``, the recipe of docs/reliability.md); the complete replica (0) keeps
going: ``fm.abort(ranks=<the ranks leaving>)`` aborts only the groups holding them, and
``fm.realize(mesh.take(dp_replicate=[0]), members_only=True)`` finds its dp_shard and tp groups
in the cache: 0 groups made, the very same ``ProcessGroup`` objects, no new default group. Its
next steps equal those of a world of 4 that started with that replica alone (``start_small``).
The ranks of the broken replica (4, 6, 7) leave.

The harness is this module's own (spawned workers, the store hosted by the pytest process so
that no worker's death takes it down; every wait bounded), as in test_faults_gloo.py.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm

HOST = "127.0.0.1"
STORE_S = 20.0
START_S = 300.0  # spawning 8 workers on two busy cores (at load 60, over 200 s)
AXIS_TIMEOUT_S = 4.0  # every group realize makes: bounds how long a survivor waits for a dead peer
LR = 0.1
AGREE_S = 15.0  # how long a survivor waits for the others to publish themselves (the slowest fails after ~2 axis timeouts)
AXES = ("dp_replicate", "dp_shard", "tp")


def train_step(rm: Any, w: torch.Tensor, step: int) -> torch.Tensor:
    """One SGD step of a linear model: the batch split over (dp_replicate, dp_shard), each block's
    gradient summed over tp in two halves (tp's work), then over dp_shard, then over dp_replicate."""
    n = rm.mesh.axis_size("dp_replicate") * rm.mesh.axis_size("dp_shard")
    gen = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randn(8, 1, generator=gen, dtype=torch.float64)
    i = rm.coordinate[0] * rm.mesh.axis_size("dp_shard") + rm.coordinate[1]
    rows = torch.arange(8)[i * 8 // n:(i + 1) * 8 // n]
    half = rows[rm.coordinate[2]::2]  # tp member t takes every other row of the block
    w = w.clone().requires_grad_(True)
    loss = ((x[half] @ w - y[half]) ** 2).sum() / 8
    (grad,) = torch.autograd.grad(loss, w)
    # inside the replica first, across replicas last: a lost replica then fails only collectives on
    # groups that hold its ranks (on gloo a group whose collective timed out is broken, see docs/reliability.md)
    grad = fm.psum(fm.psum(grad, "tp", mesh=rm), "dp_shard", mesh=rm)
    return (w - LR * fm.psum(grad, "dp_replicate", mesh=rm)).detach()


def agree_on_survivors(generation: str, world: int, wait_s: float) -> list[int]:
    """The survivors' agreement (docs/reliability.md): each publishes itself, waits up to ``wait_s``
    for the others, and the first to finish publishes the ranks it saw; everyone adopts that list."""
    store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank()
    store.set(f"{generation}/alive/{rank}", "1")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if store.check([f"{generation}/verdict"]):  # someone decided: adopt it now
            break
        if all(store.check([f"{generation}/alive/{r}"]) for r in range(world)):
            break
        time.sleep(0.05)
    seen = [r for r in range(world) if store.check([f"{generation}/alive/{r}"])]
    return json.loads(store.compare_set(f"{generation}/verdict", "", json.dumps(seen)).decode())


def shrink(rank: int, victim: int) -> dict[str, Any]:
    """The scenario on every rank; returns figures for the parent."""
    mesh = fm.make_mesh((2, 2, 2), AXES)
    rm = fm.realize(mesh, timeout=AXIS_TIMEOUT_S, check=20)
    before = {axis: rm.group(axis) for axis in ("dp_shard", "tp")}
    w1 = train_step(rm, torch.zeros(4, 1, dtype=torch.float64), 1)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict[str, Any] = {"w1": w1}
    start = time.monotonic()
    try:
        train_step(rm, w1, 2)
        out["step2"] = "ok"
    except fm.MeshError as e:
        out["step2"] = str(e)
    out["detect_s"] = time.monotonic() - start
    t = time.monotonic()
    alive = agree_on_survivors("elastic/1", 8, wait_s=AGREE_S)
    out["agree_s"] = time.monotonic() - t
    t = time.monotonic()
    # complete replicas go on: every rank of the replica is alive
    replicas = [p for p in range(2) if set(mesh.take(dp_replicate=p).ranks.reshape(-1).tolist()) <= set(alive)]
    out["alive"] = alive
    if not replicas:
        out["leaving"] = list(range(8))
        return out
    small_mesh = mesh.take(dp_replicate=replicas)
    leaving = sorted(set(range(8)) - set(small_mesh.ranks.reshape(-1).tolist()))
    out["alive"], out["leaving"] = alive, leaving
    if rank in leaving:
        return out
    made = fm.cache_info().groups
    fm.abort(ranks=leaving)
    small = fm.realize(small_mesh, members_only=True, timeout=AXIS_TIMEOUT_S, check=20)
    out["reform_s"] = time.monotonic() - t
    out["made"] = fm.cache_info().groups - made
    out["reused"] = sum(small.group(axis) is pg for axis, pg in before.items())
    w = w1
    for step in (2, 3):
        w = train_step(small, w, step)
    out["w3"] = w
    return out


def start_small(rank: int, w1: torch.Tensor) -> dict[str, Any]:
    """The run that began with one replica (world 4): steps 2 and 3 from the same weights."""
    rm = fm.realize(fm.make_mesh((1, 2, 2), AXES), timeout=AXIS_TIMEOUT_S, check=20)
    w = w1
    for step in (2, 3):
        w = train_step(rm, w, step)
    return {"w3": w}


# -- the harness -----------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, scenario: str, args: tuple, conn: mpc.Connection) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    store = dist.TCPStore(HOST, port, world, is_master=False, timeout=datetime.timedelta(seconds=STORE_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=10))
    dist.barrier()
    try:
        reply = ("ok", globals()[scenario](rank, *args))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        reply = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    conn.send(reply)
    conn.poll(START_S)  # sockets stay open until the parent is done
    sys.stdout.flush()
    os._exit(0)


def run_world(world: int, scenario: Any, *args: Any, victim: int | None = None, budget: float = 90.0) -> dict:
    """``scenario(rank, *args)`` on ``world`` fresh gloo workers; every survivor's reply, by rank."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore(HOST, 0, world, is_master=True, timeout=datetime.timedelta(seconds=STORE_S),
                          wait_for_workers=False)
    procs, conns = [], []
    try:
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world, store.port, scenario.__name__, args, child),
                               daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        replies: dict[int, Any] = {}
        survivors = [r for r in range(world) if r != victim]
        deadline = time.monotonic() + START_S + budget
        while len(replies) < len(survivors) and time.monotonic() < deadline:
            for r in survivors:
                if r not in replies and conns[r].poll():
                    replies[r] = conns[r].recv()
            mpc.wait([conns[r] for r in survivors if r not in replies], timeout=0.2)
        hung = [r for r in survivors if r not in replies]
        assert not hung, f"ranks {hung} never answered; answered: {replies}"
        errors = {r: msg for r, (kind, msg) in replies.items() if kind != "ok"}
        assert not errors, errors
        return {r: value for r, (_, value) in replies.items()}
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(("exit",))
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        del store


@pytest.mark.timeout(2 * START_S + 300)
def test_the_surviving_replica_reuses_its_groups_and_trains_on():
    out = run_world(8, shrink, 5, victim=5)
    w1 = out[0]["w1"]
    assert all(torch.equal(o["w1"], w1) for o in out.values())
    print("detect/agree:", {r: (round(o["detect_s"], 2), round(o["agree_s"], 2), o["alive"]) for r, o in out.items()})
    for rank, o in out.items():
        assert o["alive"] == [0, 1, 2, 3, 4, 6, 7] and o["leaving"] == [4, 5, 6, 7], o
        assert "requires every member of axis" in o["step2"], o["step2"]  # names the axis that failed
        assert o["detect_s"] <= 2 * AXIS_TIMEOUT_S + 6, o["detect_s"]
    for rank in (0, 1, 2, 3):
        o = out[rank]
        assert o["made"] == 0 and o["reused"] == 2, o  # dp_shard and tp: the groups of before
    small = run_world(4, start_small, w1)
    expected = small[0]["w3"]
    assert not torch.equal(expected, w1)
    for rank in (0, 1, 2, 3):
        assert torch.equal(out[rank]["w3"], expected), (out[rank]["w3"], expected)
    print("figures:", {r: {"detect_s": round(out[r]["detect_s"], 2), "agree_s": round(out[r]["agree_s"], 2),
                           "reform_s": round(out[r]["reform_s"], 3),
                           "made": out[r]["made"], "reused": out[r]["reused"]} for r in (0, 1, 2, 3)})
