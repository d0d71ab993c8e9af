"""Elastic replicas: a rank of replica 1 is lost; replica 0 goes on with the groups it already had.

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=8 examples/elastic_replicate.py

1. World 8 = (dp_replicate 2, dp_shard 2, tp 2): replica 0 is ranks 0-3, replica 1 ranks 4-7,
   every group with a 4 s timeout. One SGD step of a linear model on all 8.
2. Rank 5 leaves before step 2 (``os._exit(0)``: torchrun stops every worker when one *fails*,
   so the example exits cleanly; a SIGKILL behaves the same for the survivors, as
   tests/dist/test_elastic_gloo.py shows). Every survivor's step 2 raises a ``MeshError`` that
   names the axis that failed.
3. The survivors agree through the store on who is alive and on the last step all of them
   completed (docs/reliability.md, "Agreeing on who survived"), go back to that step, keep the complete replicas (``mesh.take(dp_replicate=[0])``), and the ranks of
   the broken replica leave.
4. Replica 0 aborts only the groups holding a leaving rank (``fm.abort(ranks=[4, 5, 6, 7])``)
   and realizes the shrunk mesh among its own ranks (``members_only=True``): its dp_shard and
   tp groups are found in the cache (0 groups made, the same ProcessGroup objects), and it
   trains steps 2 and 3. The default group is not re-formed: only its store is used.
5. Checks on rank 0: the weights equal those of a single process that starts from the same
   step-1 weights (replica 0 now takes the whole batch); prints the groups made and reused and the time to
   re-form.

CPU (gloo) only as written: NCCL's behaviour after a peer dies has not been run here.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

import functional_mesh as fm

AXES = ("dp_replicate", "dp_shard", "tp")
AXIS_TIMEOUT_S = 4.0
AGREE_S = 15.0
LR = 0.1
LOST = 5


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 4, generator=gen, dtype=torch.float64), torch.randn(8, 1, generator=gen, dtype=torch.float64)


def train_step(rm: fm.RealizedMesh, w: torch.Tensor, step: int) -> torch.Tensor:
    """The batch split over (dp_replicate, dp_shard); each block's gradient summed over tp halves."""
    n = rm.mesh.axis_size("dp_replicate") * rm.mesh.axis_size("dp_shard")
    x, y = data(step)
    i = rm.coordinate[0] * rm.mesh.axis_size("dp_shard") + rm.coordinate[1]
    rows = torch.arange(8)[i * 8 // n:(i + 1) * 8 // n][rm.coordinate[2]::2]
    w = w.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(((x[rows] @ w - y[rows]) ** 2).sum() / 8, w)
    # inside the replica first, across replicas last: a lost replica then fails only collectives on
    # groups that hold its ranks (on gloo a group whose collective timed out is broken, see docs/reliability.md)
    grad = fm.psum(fm.psum(grad, "tp", mesh=rm), "dp_shard", mesh=rm)
    return (w - LR * fm.psum(grad, "dp_replicate", mesh=rm)).detach()


def agree_on_survivors(generation: str, world: int, wait_s: float, step: int) -> tuple[list[int], int]:
    """Each survivor publishes itself and the last step it completed; the first to finish waiting
    publishes what it saw; all adopt that: the same ranks, and the smallest step among them."""
    store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank()
    store.set(f"{generation}/alive/{rank}", str(step))
    deadline = time.monotonic() + wait_s
    verdict = f"{generation}/verdict"
    keys = [f"{generation}/alive/{r}" for r in range(world)]
    while time.monotonic() < deadline and not store.check([verdict]) and not all(store.check([k]) for k in keys):
        time.sleep(0.05)
    seen = {r: int(store.get(k)) for r, k in enumerate(keys) if store.check([k])}
    decided = json.loads(store.compare_set(verdict, "", json.dumps(seen)).decode())
    return sorted(int(r) for r in decided), min(decided.values())


def main() -> None:
    mesh = fm.make_mesh((2, 2, 2), AXES)
    rm = fm.realize(mesh, timeout=AXIS_TIMEOUT_S)
    rank = rm.rank
    before = {axis: rm.group(axis) for axis in ("dp_shard", "tp")}
    weights = {1: train_step(rm, torch.zeros(4, 1, dtype=torch.float64), 1)}  # the state after each step
    done = 1
    if rank == LOST:
        os._exit(0)
    try:
        weights[2] = train_step(rm, weights[1], 2)
        raise AssertionError("step 2 should have failed: rank 5 is gone")
    except fm.MeshError as e:
        print(f"rank {rank}: step 2 failed: {str(e)[:110]}...")
    # who is alive, and the last step every survivor completed (replicas can be a step apart)
    alive, agreed = agree_on_survivors("elastic/1", 8, AGREE_S, done)
    w1 = weights[agreed]
    whole = [p for p in range(2) if set(mesh.take(dp_replicate=p).ranks.reshape(-1).tolist()) <= set(alive)]
    small_mesh = mesh.take(dp_replicate=whole)
    leaving = sorted(set(range(8)) - set(small_mesh.ranks.reshape(-1).tolist()))
    if rank in leaving:
        os._exit(0)  # the broken replica's live ranks leave (a real job might wait to rejoin)
    t = time.monotonic()
    made = fm.cache_info().groups
    fm.abort(ranks=leaving)
    small = fm.realize(small_mesh, members_only=True, timeout=AXIS_TIMEOUT_S)
    reform_s = time.monotonic() - t
    made = fm.cache_info().groups - made
    reused = sum(small.group(axis) is pg for axis, pg in before.items())
    assert made == 0 and reused == 2, (made, reused)
    w = w1
    for step in (2, 3):
        w = train_step(small, w, step)
    if rank == 0:  # one process over replica 0's data split: the same two steps
        ref = w1
        for step in (2, 3):
            x, y = data(step)
            wr = ref.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(((x @ wr - y) ** 2).sum() / 8, wr)  # replica 0 now takes the whole batch
            ref = (ref - LR * g).detach()
        torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)
        print(f"alive {alive}; replica 0 re-formed in {reform_s * 1e3:.1f} ms: {made} groups made, {reused} reused "
              f"(dp_shard, tp); steps 2-3 match a single process")
    fm.clear_cache()
    os._exit(0)  # the default group held rank 5: no destroy_process_group (it may wait on the dead peer)


if __name__ == "__main__":
    main()
