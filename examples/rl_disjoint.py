"""RL post-training layout: a trainer on ranks 0-5, a generator on ranks 6-7, each realized by its own ranks.

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=8 examples/rl_disjoint.py

1. The world is one axis of 8; ``take`` cuts it in two: the trainer mesh (dp, tp) = (3, 2) on
   ranks 0-5 and the generator mesh (tp=2) on ranks 6-7. Each side calls
   ``fm.realize(..., members_only=True)`` on its own ranks only, in its own order (the trainer
   realizes its mesh then its dp selection, the generator the other way round): no call on the
   other side's ranks.
2. The trainer takes one data-parallel SGD step of a linear model (gradient summed over tp
   halves, then over dp).
3. A bridge mesh (side=2, tp=2) = [[0, 1], [6, 7]] joins the trainer's first dp row to the
   generator: its four ranks realize it members-only, and ``fm.ppermute`` over "side" sends
   each trainer tp shard to the generator rank at the same tp position.
4. The generator gathers the two shards over its own tp axis. Checks: every trainer rank holds
   the same weights (``fm.all_gather`` over dp) and they equal a single-process step; the
   generator's full copy, sent back over the bridge, equals the trainer's bit for bit.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import functional_mesh as fm

LR = 0.1


def main() -> None:
    if not dist.is_initialized():  # members-only realize needs the job's default group (its store)
        dist.init_process_group()  # torchrun's environment; gloo for CPU tensors, NCCL for CUDA ones
    rank = dist.get_rank()
    world = fm.make_mesh((8,), ("r",))
    trainer_mesh = world.take(r=slice(0, 6)).unflatten("r", {"dp": 3, "tp": 2})
    generator_mesh = world.take(r=[6, 7]).rename({"r": "tp"})
    bridge_mesh = fm.make_mesh((4, 2), ("side", "tp")).take(side=[0, 3])  # [[0, 1], [6, 7]]

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 4, generator=gen, dtype=torch.float64), torch.randn(12, 1, generator=gen, dtype=torch.float64)
    w0 = torch.zeros(4, 1, dtype=torch.float64)
    w = None
    if rank < 6:
        rm = fm.realize(trainer_mesh, members_only=True)
        dp = fm.realize(trainer_mesh["dp"], members_only=True)  # equal rank sets: the same groups
        assert dp.group("dp") is rm.group("dp")
        i, t = rm.local_rank("dp"), rm.local_rank("tp")
        rows = torch.arange(12)[i * 4:(i + 1) * 4][t::2]  # dp member i's block, tp member t's half
        wg = w0.clone().requires_grad_(True)
        loss = ((x[rows] @ wg - y[rows]) ** 2).sum() / 12
        (grad,) = torch.autograd.grad(loss, wg)
        grad = fm.psum(fm.psum(grad, "tp", mesh=rm), "dp", mesh=rm)
        w = (w0 - LR * grad).detach()
        every = fm.all_gather(w, "dp", tiled=False, mesh=rm)
        assert all(torch.equal(every[k], w) for k in range(3)), "trainer replicas differ"
        wr = w0.clone().requires_grad_(True)  # the same step in one process
        (full,) = torch.autograd.grad(((x @ wr - y) ** 2).sum() / 12, wr)
        torch.testing.assert_close(w, w0 - LR * full, rtol=1e-12, atol=1e-12)
    else:
        rm = fm.realize(generator_mesh.rename({"tp": "gen"}), members_only=True)  # the other order
        again = fm.realize(generator_mesh, members_only=True)
        assert again.group("tp") is rm.group("gen")
    if rank in (0, 1, 6, 7):  # trainer shard t -> generator rank at tp position t
        bridge = fm.realize(bridge_mesh, members_only=True)
        t = bridge.local_rank("tp")
        shard = w[t * 2:(t + 1) * 2] if rank < 6 else torch.zeros(2, 1, dtype=torch.float64)
        got = fm.ppermute(shard, "side", [(0, 1)], mesh=bridge)  # the trainer side receives zeros
    if rank >= 6:
        gen_w = fm.all_gather(got, "tp", mesh=again)  # the generator's full copy, over its own mesh
        print(f"rank {rank}: generator weights {gen_w.flatten().tolist()}")
    if rank in (0, 1, 6, 7):  # the copy goes back for the trainer to compare
        back = fm.ppermute(gen_w if rank >= 6 else torch.zeros(4, 1, dtype=torch.float64), "side", [(1, 0)],
                           mesh=bridge)
        if rank < 6:
            assert torch.equal(back, w), f"the generator's copy {back.flatten().tolist()} is not the trainer's"
    if rank == 0:
        print("trainer (ranks 0-5) and generator (ranks 6-7) realized members-only; generator's copy equals the "
              "trainer's weights")
    fm.clear_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
