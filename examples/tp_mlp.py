"""A Megatron-style tensor-parallel MLP written by hand with fm.pvary / fm.psum, checked exactly.

Run:  torchrun --nproc_per_node=8 examples/tp_mlp.py [--dtensor]

1. A (dp, tp) = (2, 4) mesh, realized once (realize initialises the default group from torchrun).
2. Full weights are created identically on every rank (seeded). Each rank keeps its shard:
   fc1 ``W1 (HIDDEN, DIM_IN)`` by columns of the layer (output features, dim 0) over tp,
   ``P("tp", None)``; fc2 ``W2 (DIM_OUT, HIDDEN)`` by rows of the layer (input features, dim 1)
   over tp, ``P(None, "tp")``. The slices come from ``NamedSharding.local_slices``; with
   ``--dtensor``, ``fm.distribute(...).to_local()`` must give the same shards (off by default:
   importing DTensor and building the DeviceMesh costs ~1.5 s per process).
3. Forward, by hand (Megatron's f and g):
       h = relu(fm.pvary(x, "tp") @ W1_local.T)     # f: identity forward, psum backward
       y = fm.psum(h @ W2_local.T, "tp")            # g: psum forward, identity backward
   Each dp rank takes its own slice of a fixed global batch; the loss is the mean over the local
   batch. After backward the gradients are averaged over dp with ``fm.pmean`` (what DDP does).
4. The same MLP in one process on the full batch is the reference: the dp-averaged loss, every
   rank's W1/W2 shard gradient (against the matching slice of the full gradient) and the input
   gradient (which needs pvary's psum backward) must agree to 1e-5 on every rank.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import functional_mesh as fm

DP, TP = 2, 4
DIM_IN, HIDDEN, DIM_OUT = 8, 16, 4  # HIDDEN divisible by TP
LOCAL_BATCH = 3  # rows per dp rank
TOL = 1e-5


def full_problem() -> tuple[torch.Tensor, ...]:
    """Weights, global batch and targets: the same on every rank (generated on CPU)."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(HIDDEN, DIM_IN, generator=g) / DIM_IN ** 0.5
    w2 = torch.randn(DIM_OUT, HIDDEN, generator=g) / HIDDEN ** 0.5
    x = torch.randn(LOCAL_BATCH * DP, DIM_IN, generator=g)
    target = torch.randn(LOCAL_BATCH * DP, DIM_OUT, generator=g)
    return w1, w2, x, target


def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((y - target) ** 2).mean()


def reference(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, target: torch.Tensor):
    """Single process, full model, full batch: loss and the gradients of W1, W2 and x."""
    w1, w2, x = (t.clone().requires_grad_() for t in (w1, w2, x))
    loss = loss_fn(torch.relu(x @ w1.T) @ w2.T, target)
    loss.backward()
    return loss.detach(), w1.grad, w2.grad, x.grad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtensor", action="store_true", help="also check fm.distribute(...).to_local()")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world != DP * TP:
        raise SystemExit(f"tp_mlp.py needs {DP * TP} processes, got {world}")
    mesh = fm.make_mesh((DP, TP), ("dp", "tp"))
    rm = fm.realize(mesh)
    rank, device = rm.rank, rm.device

    w1_full, w2_full, x_full, t_full = full_problem()
    col = fm.NamedSharding(mesh, fm.P("tp", None))  # fc1: output features over tp
    row = fm.NamedSharding(mesh, fm.P(None, "tp"))  # fc2: input features over tp
    s1, s2 = col.local_slices(w1_full.shape, rank), row.local_slices(w2_full.shape, rank)
    w1 = w1_full[s1].clone().to(device).requires_grad_()
    w2 = w2_full[s2].clone().to(device).requires_grad_()
    if args.dtensor:  # the DTensor route gives the same shards (no communication)
        assert torch.equal(fm.distribute(w1_full.to(device), col, mesh=rm).to_local(), w1.detach())
        assert torch.equal(fm.distribute(w2_full.to(device), row, mesh=rm).to_local(), w2.detach())

    # Data parallel over dp: rows by dp coordinate; the tp ranks of a dp rank see the same rows.
    dp_rank = rm.local_rank("dp")
    rows = slice(dp_rank * LOCAL_BATCH, (dp_rank + 1) * LOCAL_BATCH)
    x = x_full[rows].clone().to(device).requires_grad_()
    target = t_full[rows].to(device)

    with rm:
        h = torch.relu(fm.pvary(x, "tp") @ w1.T)  # (B, HIDDEN / TP): this rank's hidden features
        y = fm.psum(h @ w2.T, "tp")  # partial sums over the hidden shards -> full output
        loss = loss_fn(y, target)  # mean over the local batch, identical on the tp ranks
        loss.backward()
        # Data parallel: average over dp (equal local batches -> the full-batch mean).
        got_loss = fm.pmean(loss.detach(), "dp")
        g1, g2 = fm.pmean(w1.grad, "dp"), fm.pmean(w2.grad, "dp")
        # x.grad is per dp rank (its own rows): gather the rows back in dp order.
        gx = fm.all_gather(x.grad, "dp", dim=0)

    want_loss, want_g1, want_g2, want_gx = reference(w1_full, w2_full, x_full, t_full)
    # The local loss's gradient w.r.t. its rows is 1/DP of the full-batch one (mean over fewer rows).
    checks = [
        ("loss", got_loss.cpu(), want_loss),
        ("W1 shard grad", g1.cpu(), want_g1[s1]),
        ("W2 shard grad", g2.cpu(), want_g2[s2]),
        ("x grad", gx.cpu() / DP, want_gx),
    ]
    for name, got, want in checks:
        assert torch.allclose(got, want, atol=TOL, rtol=0), (
            f"rank {rank}: {name} differs by {(got - want).abs().max().item():.3g}")

    if rank == 0:
        print(f"mesh {mesh} realized on {rm.backend} ({rm.device_type}), world {world}")
        print(f"W1 {tuple(w1_full.shape)} sharded {col.spec} -> local {tuple(w1.shape)}; "
              f"W2 {tuple(w2_full.shape)} sharded {row.spec} -> local {tuple(w2.shape)}")
        print(f"loss {got_loss.item():.8f} (single process {want_loss.item():.8f})")
        print(f"max |grad diff|: W1 {(g1.cpu() - want_g1[s1]).abs().max().item():.2e}, "
              f"W2 {(g2.cpu() - want_g2[s2]).abs().max().item():.2e}, "
              f"x {(gx.cpu() / DP - want_gx).abs().max().item():.2e}")
        if args.dtensor:
            print("fm.distribute(...).to_local() gives the same shards")
        print(f"loss and gradients match to {TOL:g} on every rank")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
