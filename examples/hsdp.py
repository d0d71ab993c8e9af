"""HSDP (hybrid sharded data parallel) with FSDP2 on a realized 2-D mesh.

Run:  torchrun --nproc_per_node=8 examples/hsdp.py

The DeviceMesh tutorial's section 3, with FSDP2's ``fully_shard`` and a functional_mesh mesh:

    mesh = fm.make_mesh((2, 4), ("replicate", "shard"))
    rm = fm.realize(mesh)
    fully_shard(model, mesh=rm.device_mesh)   # 2-D mesh -> (Replicate(), Shard(0)) = HSDP

Parameters are sharded over the 4 ranks of a "shard" group and replicated over the 2 ranks of a
"replicate" group. Each of the 8 data-parallel ranks trains on its own slice of a fixed global
batch for a few SGD steps; FSDP2 averages the gradients over both mesh dims, so the losses equal
a single-process run on the full batch, which is checked here. Runs on CPU (gloo) and,
unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import functional_mesh as fm

REPLICATE, SHARD = 2, 4
GLOBAL_BATCH = 16  # divisible by REPLICATE * SHARD
STEPS = 3
LR = 0.1
TOL = 1e-5


class ToyModel(nn.Module):  # the tutorial's model
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def main() -> None:
    # FSDP2 notes (once per rank) that the root returns a view; we never modify it in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

    mesh = fm.make_mesh((REPLICATE, SHARD), ("replicate", "shard"))
    rm = fm.realize(mesh)
    device = rm.device

    torch.manual_seed(0)
    model = ToyModel().to(device)
    reference = copy.deepcopy(model)

    # Bottom-up, as FSDP2 recommends: one communication group per layer, then the root.
    for layer in (model.net1, model.net2):
        fully_shard(layer, mesh=rm.device_mesh)
    fully_shard(model, mesh=rm.device_mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(GLOBAL_BATCH, 10, generator=g).to(device)
    y = torch.randn(GLOBAL_BATCH, 5, generator=g).to(device)
    dp_size = mesh.size
    dp_rank = rm.local_rank("replicate") * SHARD + rm.local_rank("shard")  # row-major mesh coordinate
    local = GLOBAL_BATCH // dp_size
    x_local, y_local = x[dp_rank * local:(dp_rank + 1) * local], y[dp_rank * local:(dp_rank + 1) * local]

    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x_local), y_local)  # mean over the local batch
        loss.backward()  # reduce-scatter over "shard", all-reduce over "replicate", averaged
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the mesh is the whole world here
        losses.append(total.item() / dp_size)

    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    expected = []
    for _ in range(STEPS):
        ref_opt.zero_grad()
        loss = nn.functional.mse_loss(reference(x), y)
        loss.backward()
        ref_opt.step()
        expected.append(loss.item())
    for step, (got, want) in enumerate(zip(losses, expected)):
        assert abs(got - want) <= TOL, f"rank {rm.rank} step {step}: HSDP loss {got} != single-process {want}"

    w = model.net1.weight
    if rm.rank == 0:
        print(f"HSDP on {rm.device_mesh} ({rm.backend})")
        print(f"replicate groups {mesh['replicate'].groups().tolist()}")
        print(f"shard groups     {mesh['shard'].groups().tolist()}")
        print(f"net1.weight placements {tuple(w.placements)}, local shape {tuple(w.to_local().shape)} "
              f"of {tuple(w.shape)} on rank 0")
        for step, (got, want) in enumerate(zip(losses, expected)):
            print(f"step {step}: HSDP loss {got:.8f}  single-process loss {want:.8f}")
        print(f"HSDP losses match the single-process run to {TOL:g}")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
