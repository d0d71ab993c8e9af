"""DistributedDataParallel over one axis of a 2-D mesh: DDP(model, process_group=rm.group("dp")).

Run:  torchrun --nproc_per_node=8 examples/ddp_axis.py

1. A (dp, tp) = (4, 2) mesh, realized once. ``rm.group("dp")`` is this rank's dp group: the 4
   ranks with its tp coordinate. There are two such groups (tp = 0 and tp = 1), and each is an
   independent DDP job.
2. Each tp slice trains the same seeded model on its own global batch (seeded by the tp
   coordinate); inside the slice, dp rank i takes rows i*B..(i+1)*B. DDP averages gradients
   over the dp group only, so every step equals one full-batch step in a single process.
3. Checks on every rank: the parameters are equal across the dp group (``fm.all_gather`` over
   "dp"), equal to a single-process run on that slice's concatenated batch (1e-5), and
   different between the two tp slices (``fm.all_gather`` over "tp": the groups did not mix).

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import functional_mesh as fm

DP, TP = 4, 2
DIM_IN, HIDDEN, DIM_OUT = 8, 16, 4
LOCAL_BATCH = 4
STEPS = 3
LR = 0.1
TOL = 1e-5


def slice_batch(tp_index: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one tp slice: the same on the slice's ranks, different across slices."""
    g = torch.Generator().manual_seed(100 + tp_index)
    x = torch.randn(LOCAL_BATCH * DP, DIM_IN, generator=g)
    y = torch.randn(LOCAL_BATCH * DP, DIM_OUT, generator=g)
    return x.to(device), y.to(device)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    if world != DP * TP:
        raise SystemExit(f"ddp_axis.py needs {DP * TP} processes, got {world}")
    mesh = fm.make_mesh((DP, TP), ("dp", "tp"))
    rm = fm.realize(mesh)
    rank, device = rm.rank, rm.device
    dp_group = rm.group("dp")
    dp_rank, tp_index = rm.local_rank("dp"), rm.local_rank("tp")
    assert dist.get_process_group_ranks(dp_group) == mesh["dp"].group_of(rank).tolist()
    assert dist.get_rank(dp_group) == dp_rank  # group rank = coordinate along dp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, DIM_OUT)).to(device)
    reference = copy.deepcopy(model)
    ddp = DDP(model, process_group=dp_group, device_ids=[device.index] if device.type == "cuda" else None)

    x, y = slice_batch(tp_index, device)
    rows = slice(dp_rank * LOCAL_BATCH, (dp_rank + 1) * LOCAL_BATCH)
    local_losses = train(ddp, x[rows], y[rows])  # DDP averages grads over the dp group

    expected = train(reference, x, y)  # single process, this slice's full batch
    mine = flat_params(model)
    with rm:
        across_dp = fm.all_gather(mine, "dp", tiled=False)  # (DP, n): every dp rank's parameters
        across_tp = fm.all_gather(mine, "tp", tiled=False)  # (TP, n): the two slices' parameters
        losses = [fm.pmean(torch.tensor(v, device=device), "dp").item() for v in local_losses]
    for i in range(DP):
        assert torch.equal(across_dp[i], mine), f"rank {rank}: dp rank {i} has different parameters"
    want = flat_params(reference)
    assert torch.allclose(mine, want, atol=TOL, rtol=0), (
        f"rank {rank}: DDP parameters differ from the single-process run by {(mine - want).abs().max().item():.3g}")
    for step, (got, w) in enumerate(zip(losses, expected)):
        assert abs(got - w) <= TOL, f"rank {rank} step {step}: loss {got} != single-process {w}"
    assert not torch.allclose(across_tp[0], across_tp[1]), "the two tp slices should have trained apart"

    if rank == 0:
        print(f"mesh {mesh} realized on {rm.backend} ({rm.device_type}), world {world}")
        print(f"dp groups {mesh['dp'].groups().tolist()}: one DDP job per tp slice, "
              f"global batch {LOCAL_BATCH * DP} = {LOCAL_BATCH} rows x {DP}")
        print(f"{'step':>4}  {'DDP loss (tp=0)':>16}  {'single-process':>15}")
        for step, (got, w) in enumerate(zip(losses, expected)):
            print(f"{step:>4}  {got:>16.8f}  {w:>15.8f}")
        print(f"max |param diff| vs single process {(mine - want).abs().max().item():.2e}; "
              f"tp slices differ by {(across_tp[0] - across_tp[1]).abs().max().item():.2e}")
        print(f"ddp over dp matches the single-process run to {TOL:g}; parameters equal across each dp group")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
