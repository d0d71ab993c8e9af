"""3-D parallel training: HSDP (FSDP2) x tensor parallel on one realized mesh, checked exactly.

Run:  torchrun --nproc_per_node=8 examples/train_3d.py        (or: make demo)

1. One mesh value, (dp_replicate, dp_shard, tp) = (2, 2, 2), realized once: every process group
   is made here, by ``fm.realize``, and nowhere else. (Other world sizes that are multiples of
   4 work too: dp_replicate = world / 4.)
2. A small MLP (Linear -> ReLU -> Linear). Tensor parallel over ``rm["tp"]``: fc1 column-wise,
   fc2 row-wise (Megatron style). Then FSDP2 ``fully_shard`` over
   ``rm["dp_replicate", "dp_shard"]`` (HSDP: replicate across dp_replicate, shard across
   dp_shard). Both torch meshes are slices of the one ``rm.device_mesh`` root, which is what
   FSDP2 + TP require.
3. A few SGD steps on a fixed, seeded global batch; each data-parallel rank trains on its own
   slice of it with the mean loss over its local batch. FSDP2 averages gradients over the
   data-parallel mesh (reduce-scatter over dp_shard, all-reduce over dp_replicate), so with
   equal local batches every step equals one full-batch step in a single process. That
   single-process run is done here too, and the losses (and the final weights) must agree to
   1e-5.
4. A table of the mesh's axes and their groups.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import functional_mesh as fm

DP_SHARD, TP = 2, 2  # dp_replicate = world // (DP_SHARD * TP): 2 at world 8
DIM_IN, HIDDEN, DIM_OUT = 8, 16, 4  # HIDDEN divisible by TP (fc1 columns, fc2 rows)
LOCAL_BATCH = 4  # rows per data-parallel rank; the global batch is LOCAL_BATCH * dp size
STEPS = 3
LR = 0.1
TOL = 1e-5
DP = ("dp_replicate", "dp_shard")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM_IN, HIDDEN)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(HIDDEN, DIM_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def global_batch(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The same fixed batch on every rank (generated on CPU, so it is device-independent)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(rows, DIM_IN, generator=g)
    y = torch.randn(rows, DIM_OUT, generator=g)
    return x.to(device), y.to(device)


def train_single_process(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The reference: no distribution, the full batch, the mean loss, plain SGD."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def group_table(rm: fm.RealizedMesh) -> str:
    """One line per axis (and the dp product): size, layout (shape:stride), this rank's group, all groups."""
    mesh = rm.mesh
    rows = [(name, name, mesh[name]) for name in mesh.axis_names]
    rows.append((" x ".join(DP), DP, mesh[DP].flatten(name="dp")))  # the product group (products=)
    mine_label = f"rank {rm.rank} group"
    lines = [f"{'axis':<26} {'size':>4}  {'layout':<10} {mine_label:<14} {'groups':>6}  all groups"]
    for label, axis, family in rows:
        (name,) = family.axis_names
        mine = dist.get_process_group_ranks(rm.group(axis))
        assert mine == family.group_of(rm.rank).tolist(), (label, mine)
        lines.append(f"{label:<26} {family.size:>4}  {str(family.axis_layout(name)):<10} {str(mine):<14} "
                     f"{family.num_groups:>6}  {family.groups().tolist()}")
    return "\n".join(lines)


def quiet_torch_notes() -> None:
    """Silence two advisory notes that would repeat once per rank.

    FSDP2 warns that the root module returns a view (we never modify the output in place), and
    DTensor notes that gathering a (_StridedShard, Shard) parameter for the final check takes
    two all-gathers (fine for a check).
    """
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def main() -> None:
    quiet_torch_notes()
    world = int(os.environ["WORLD_SIZE"])  # set by torchrun
    if world % (DP_SHARD * TP):
        raise SystemExit(f"train_3d.py needs a world size divisible by {DP_SHARD * TP}, got {world}")
    mesh = fm.make_mesh((world // (DP_SHARD * TP), DP_SHARD, TP), ("dp_replicate", "dp_shard", "tp"))
    # One realize for everything; products= also makes the (dp_replicate x dp_shard) groups,
    # used below to average the loss over the data-parallel ranks for printing.
    rm = fm.realize(mesh, products=[DP])
    rank = rm.rank
    device = rm.device

    torch.manual_seed(0)
    model = MLP().to(device)
    reference = copy.deepcopy(model)  # same initial weights, stays single-process

    # Both torch meshes are slices of rm.device_mesh (one root): FSDP2 can compose them.
    tp_mesh = rm["tp"].device_mesh
    dp_mesh = rm[DP].device_mesh
    assert tp_mesh._get_root_mesh() is dp_mesh._get_root_mesh() is rm.device_mesh  # private torch API, 2.13

    parallelize_module(model, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=dp_mesh)  # 2-D mesh: HSDP, (Replicate(), Shard(0)) over (dp_replicate, dp_shard)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    # Each data-parallel rank takes its own contiguous slice of the global batch; the two tp
    # ranks of a data-parallel rank see the same slice (TP splits the weights, not the data).
    dp_size = rm.axis_size("dp_replicate") * rm.axis_size("dp_shard")
    dp_rank = rm.local_rank("dp_replicate") * rm.axis_size("dp_shard") + rm.local_rank("dp_shard")
    assert dp_rank == dist.get_rank(rm.group(DP))  # group rank = coordinate (mesh order)
    x, y = global_batch(LOCAL_BATCH * dp_size, device)
    rows = slice(dp_rank * LOCAL_BATCH, (dp_rank + 1) * LOCAL_BATCH)
    x_local, y_local = x[rows], y[rows]

    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x_local), y_local)  # mean over the local batch
        loss.backward()  # FSDP2 averages the gradients over dp_replicate x dp_shard
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=rm.group(DP))  # equal local batches: global mean = mean of means
        losses.append(total.item() / dp_size)

    expected = train_single_process(reference, x, y)
    for step, (got, want) in enumerate(zip(losses, expected)):
        assert abs(got - want) <= TOL, f"rank {rank} step {step}: 3-D loss {got} != single-process {want}"
    # The final weights too: gather each DTensor parameter to a full tensor.
    final = {name: p.full_tensor() for name, p in model.named_parameters()}
    for name, want in reference.named_parameters():
        assert torch.allclose(final[name], want, atol=TOL, rtol=0), f"rank {rank}: {name} differs"

    if rank == 0:
        print(f"mesh {mesh} realized on {rm.backend} ({rm.device_type}), world {world}, "
              f"global batch {len(x)} = {LOCAL_BATCH} rows x {dp_size} data-parallel ranks")
        print(f"tp mesh   {tp_mesh}\nhsdp mesh {dp_mesh}  (both slices of {rm.device_mesh})")
        print(f"fc1.weight placements {tuple(model.fc1.weight.placements)} "
              f"local shape {tuple(model.fc1.weight.to_local().shape)} of {tuple(model.fc1.weight.shape)}")
        print(f"{'step':>4}  {'3-D parallel loss':>18}  {'single-process loss':>19}")
        for step, (got, want) in enumerate(zip(losses, expected)):
            print(f"{step:>4}  {got:>18.8f}  {want:>19.8f}")
        print(f"losses match to {TOL:g} at every step; final weights match")
        print(group_table(rm))
        print(fm.cache_info())

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
