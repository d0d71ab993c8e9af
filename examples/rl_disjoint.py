"""RL post-training layout: a trainer on ranks 0-5, a generator on ranks 6-7, each realized by its own ranks.

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=8 examples/rl_disjoint.py

1. The world is one axis of 8; ``take`` cuts it in two: the trainer mesh (dp, tp) = (3, 2) on
   ranks 0-5 and the generator mesh (tp=2) on ranks 6-7. Each side calls
   ``fm.realize(..., members_only=True)`` on its own ranks only, in its own order (the trainer
   realizes its mesh then its dp selection, the generator the other way round): no call on the
   other side's ranks.
2. The trainer takes one data-parallel SGD step of a linear model (gradient summed over tp
   halves, then over dp).
3. The refit: ``fm.reshard`` moves the trainer's weights (a DTensor sharded over tp) to the
   generator's mesh, replicated: every rank of both meshes calls it once; trainer ranks pass their
   DTensor, generator ranks an ``fm.ShapeDtypeStruct`` (they hold none of the source) and their
   realized mesh. The plan sends each trainer tp shard to one generator rank, which forwards it to
   the other (a relay stage), in one all-to-all per stage over a bridge group of the ranks of both
   meshes, which realize makes (here they are the whole world, so it is the default group).
4. Checks: every trainer rank holds the same weights (``fm.all_gather`` over dp) and they equal a
   single-process step; the generator's full copy, resharded back to the trainer, equals the
   trainer's bit for bit.

Runs on CPU (gloo); written for CUDA (NCCL) too, but not run on a GPU here.
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

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 4, generator=gen, dtype=torch.float64), torch.randn(12, 1, generator=gen, dtype=torch.float64)
    w0 = torch.zeros(4, 1, dtype=torch.float64)
    w: torch.Tensor | None = None
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
    spec = fm.NamedSharding(trainer_mesh, fm.P("tp"))  # the trainer's weights: rows split over tp
    if rank < 6:
        w = fm.distribute(w, spec, mesh=rm)
    else:
        w = fm.ShapeDtypeStruct((4, 1), torch.float64, sharding=spec)  # a generator rank holds none of it
    gen_w = fm.reshard(w, fm.NamedSharding(generator_mesh, fm.P()), mesh=again if rank >= 6 else None)
    if rank >= 6:  # a full copy on every generator rank
        print(f"rank {rank}: generator weights {gen_w.to_local().flatten().tolist()}")
    back_from = gen_w if rank >= 6 else fm.ShapeDtypeStruct((4, 1), torch.float64,
                                                           sharding=fm.NamedSharding(generator_mesh, fm.P()))
    back = fm.reshard(back_from, fm.NamedSharding(trainer_mesh, fm.P()), mesh=rm if rank < 6 else None)
    if rank < 6:  # the copy came back for the trainer to compare
        assert torch.equal(back.to_local(), w.full_tensor()), (
            f"the generator's copy {back.to_local().flatten().tolist()} is not the trainer's")
    if rank == 0:
        print("trainer (ranks 0-5) and generator (ranks 6-7) realized members-only; generator's copy equals the "
              "trainer's weights")
    fm.clear_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
