"""A data + tensor parallel MLP written as one per-shard function with fm.shard_map, trained and checked.

Run:  torchrun --nproc_per_node=8 examples/shard_map_mlp.py [--steps 4] [--untyped] [--compile]

1. A (dp, tp) = (2, 4) mesh, realized once.
2. Parameters are DTensors, made from full tensors that are equal on every rank (seeded):
   ``w1 (DIM_IN, HIDDEN)`` split by columns over tp, ``P(None, "tp")``; ``w2 (HIDDEN, DIM_OUT)``
   split by rows, ``P("tp", None)``. The batch is split by rows over dp, ``P("dp", None)``.
3. The per-shard step has no annotation beyond the one collective the math needs:
       h = relu(x @ w1)            # x varies over dp, w1 over tp: h varies over both
       y = psum(h @ w2, "tp")      # invariant over tp again: out_specs P("dp", None) holds
   The weights are invariant over dp where the batch varies, so the region casts them
   (``pvary``: identity forward, psum backward): their gradients come out summed over dp, with
   no DDP wrapper and no hand-written all-reduce. With ``--untyped`` (``check_vma=False``) the
   same gradients come from JAX's untyped convention instead. With ``--compile`` the mapped step
   is compiled whole (``torch.compile(step, fullgraph=True)``): the types are decided while
   tracing, and the compiled step runs the ops and collectives only.
4. Plain SGD on the DTensors. A single process training the full model on the full batch is
   the reference: every step's loss, and the final weights, must agree to 1e-5 on every rank.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import P

DP, TP = 2, 4
DIM_IN, HIDDEN, DIM_OUT, BATCH = 8, 16, 4, 6  # HIDDEN divisible by TP, BATCH by DP
LR, TOL = 0.1, 1e-5


def full_problem() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(DIM_IN, HIDDEN, generator=g, dtype=torch.float64) / DIM_IN ** 0.5
    w2 = torch.randn(HIDDEN, DIM_OUT, generator=g, dtype=torch.float64) / HIDDEN ** 0.5
    x = torch.randn(BATCH, DIM_IN, generator=g, dtype=torch.float64)
    target = torch.randn(BATCH, DIM_OUT, generator=g, dtype=torch.float64)
    return w1, w2, x, target


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One shard's forward: the whole of tensor parallelism is the psum over tp."""
    h = torch.relu(x @ w1)
    return fm.psum(h @ w2, "tp")


def train(forward, target: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, steps: int) -> list[float]:
    """Plain SGD on the mean squared error of ``forward(w1, w2)`` (full tensors or DTensors alike)."""
    losses = []
    for _ in range(steps):
        loss = ((forward(w1, w2) - target) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w1 -= LR * w1.grad
            w2 -= LR * w2.grad
        w1.grad = w2.grad = None
        losses.append(loss.item())
    return losses


def reference(steps: int) -> tuple[list[float], torch.Tensor, torch.Tensor]:
    """One process, the full model on the full batch."""
    w1, w2, x, target = full_problem()
    w1.requires_grad_()
    w2.requires_grad_()
    losses = train(lambda a, b: torch.relu(x @ a) @ b, target, w1, w2, steps)
    return losses, w1.detach(), w2.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--untyped", action="store_true", help="check_vma=False (JAX's untyped convention)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the mapped step (fullgraph=True)")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world != DP * TP:
        raise SystemExit(f"shard_map_mlp.py needs {DP * TP} processes, got {world}")
    rm = fm.realize(fm.make_mesh((DP, TP), ("dp", "tp")))
    w1_full, w2_full, x_full, t_full = full_problem()
    w1 = fm.distribute(w1_full.to(rm.device), fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm).requires_grad_()
    w2 = fm.distribute(w2_full.to(rm.device), fm.NamedSharding(rm.mesh, P("tp", None)), mesh=rm).requires_grad_()
    x, target = x_full.to(rm.device), t_full.to(rm.device)
    step = fm.shard_map(mlp, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None),
                        mesh=rm, check_vma=not args.untyped)
    if args.compile:
        step = torch.compile(step, fullgraph=True)

    # step(...) is a DTensor (BATCH, DIM_OUT), rows over dp; the loss reads all of it
    losses = train(lambda a, b: step(x, a, b).full_tensor(), target, w1, w2, args.steps)

    want_losses, want_w1, want_w2 = reference(args.steps)
    for i, (got, want) in enumerate(zip(losses, want_losses, strict=True)):
        assert abs(got - want) <= TOL, f"rank {rm.rank}: step {i} loss {got} != single process {want}"
    for name, got, want in (("w1", w1.full_tensor().cpu(), want_w1), ("w2", w2.full_tensor().cpu(), want_w2)):
        assert torch.allclose(got, want, atol=TOL, rtol=0), f"rank {rm.rank}: final {name} differs"
    if rm.rank == 0:
        print(f"mesh {rm.mesh} on {rm.backend}, check_vma={not args.untyped}, compiled={args.compile}")
        print("losses " + " ".join(f"{v:.6f}" for v in losses))
        print(f"losses and final weights match a single process to {TOL:g} on every rank")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
