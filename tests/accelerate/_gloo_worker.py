"""One of 8 gloo workers (tests/accelerate/test_gloo.py starts them with torchrun): accelerate's mesh vs ours.

For each of the 15 valid (dp_replicate, dp_shard, cp, tp) configurations: accelerate 1.15's own
``ParallelismConfig.build_device_mesh`` and ours, on real gloo groups: the same dims, flattened
dims, group members, local ranks and coordinates, an all-reduce over every dim and flattened dim
of each mesh giving the same sums, and the groups each made (torch's group counter). Then FSDP2
(HSDP, dp_replicate 2 x dp_shard 4) over the mesh slice accelerate hands ``fully_shard``
(``mesh[config.fsdp_dim_names]``): 3 AdamW steps on each mesh from the same weights and data,
whose losses and gradient norms must be bit-identical. Rank 0 prints ``RESULT`` lines.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
from accelerate.parallelism_config import ParallelismConfig

import functional_mesh as fm
from functional_mesh.integrations import accelerate as fm_accelerate

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_mesh_vs_accelerate import CONFIGS, describe, make_config  # noqa: E402


def sums(dm) -> dict[str, float]:
    """An all-reduce of (rank + 1) over every dim and flattened dim with a group of its own."""
    out = {}
    for name in [*dm.mesh_dim_names, *dm._flatten_mapping]:
        if dm[name].size() == 1:
            continue
        x = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(x, group=dm.get_group(name))
        out[name] = x.item()
    return out


def train(dm, config: ParallelismConfig) -> list[tuple[float, float]]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fully_shard(model, mesh=dm[tuple(config.fsdp_dim_names)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(dist.get_rank() // 1)
    out = []
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        opt.zero_grad()
        out.append((loss.item(), norm.full_tensor().item() if hasattr(norm, "full_tensor") else norm.item()))
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    counter = dist.distributed_c10d._world
    totals = {"theirs": 0, "ours": 0}
    for config in CONFIGS:
        before = counter.group_count
        theirs_dm = make_config(**config).build_device_mesh("cpu")
        made_theirs = counter.group_count - before
        before = counter.group_count
        ours_dm = fm_accelerate.build_device_mesh(make_config(**config), "cpu")
        made_ours = counter.group_count - before
        theirs, ours = describe(theirs_dm), describe(ours_dm)
        assert ours == theirs, f"rank {rank} {config}: ours {ours} != accelerate's {theirs}"
        assert sums(ours_dm) == sums(theirs_dm), f"rank {rank} {config}: all-reduce sums differ"
        totals["theirs"] += made_theirs
        totals["ours"] += made_ours
        if rank == 0:
            label = "x".join(str(v) for v in config.values())
            print(f"RESULT config {label} dims {ours['dims']} flattened {ours['flattened']} "
                  f"groups accelerate {made_theirs} ours {made_ours}", flush=True)
    if rank == 0:
        print(f"RESULT total groups accelerate {totals['theirs']} ours {totals['ours']}", flush=True)

    config = make_config(dp_replicate_size=2, dp_shard_size=4)
    theirs = train(config.build_device_mesh("cpu"), config)
    ours = train(fm_accelerate.build_device_mesh(make_config(dp_replicate_size=2, dp_shard_size=4), "cpu"), config)
    assert ours == theirs, f"rank {rank}: losses/grad norms ours {ours} != accelerate's {theirs}"
    if rank == 0:
        print("RESULT hsdp " + " ".join(f"loss={loss!r} grad_norm={norm!r}" for loss, norm in ours), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from tests._exit import exit_now  # the repository is on PYTHONPATH (test_gloo.py sets it)

    main()
    exit_now()
