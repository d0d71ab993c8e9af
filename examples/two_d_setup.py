"""The DeviceMesh tutorial's manual 2-D setup, next to the two-line functional_mesh version.

Run:  torchrun --nproc_per_node=8 examples/two_d_setup.py

The tutorial (pytorch.org "Getting Started with DeviceMesh", section 1) builds the groups of a
hybrid-sharding (HSDP) layout by hand: shard groups of consecutive ranks, (0,1,2,3) and
(4,5,6,7), and replicate groups of strided ranks, (0,4), (1,5), (2,6), (3,7). This script does
exactly that with ``new_group``, then describes the same layout as a value and realizes it:

    mesh = fm.make_mesh((2, 4), ("replicate", "shard"))
    rm = fm.realize(mesh)

and checks on every rank that both ways give groups with identical members (in identical
order) and identical all-reduce results. It runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import functional_mesh as fm


def manual_setup() -> tuple[dist.ProcessGroup, dist.ProcessGroup, torch.device]:
    """The tutorial's code (section 1), made device-agnostic: rank lists computed by hand."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    shard_factor = world_size // 2  # two shard groups

    # Step 1: shard groups, e.g. (0, 1, 2, 3) and (4, 5, 6, 7)
    shard_rank_lists = (list(range(0, shard_factor)), list(range(shard_factor, world_size)))
    shard_groups = (dist.new_group(shard_rank_lists[0]), dist.new_group(shard_rank_lists[1]))
    current_shard_group = shard_groups[0] if rank in shard_rank_lists[0] else shard_groups[1]

    # Step 2: replicate groups, e.g. (0, 4), (1, 5), (2, 6), (3, 7)
    current_replicate_group = None
    for i in range(shard_factor):
        replicate_group_ranks = list(range(i, world_size, shard_factor))
        replicate_group = dist.new_group(replicate_group_ranks)
        if rank in replicate_group_ranks:
            current_replicate_group = replicate_group
    assert current_replicate_group is not None
    return current_shard_group, current_replicate_group, device


def all_reduce_sum(value: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out = value.clone()
    dist.all_reduce(out, group=group)
    return out


def main() -> None:
    shard_group, replicate_group, device = manual_setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # The same layout as a value, then realized: two lines. realize() finds the default group
    # initialised above and follows its backend (gloo on CPU, NCCL on CUDA).
    mesh = fm.make_mesh((2, world_size // 2), ("replicate", "shard"))
    rm = fm.realize(mesh)

    checks = {"shard": shard_group, "replicate": replicate_group}
    # Distinct per-rank values, so a wrong group membership changes the sums.
    value = torch.tensor([float(rank + 1), float(10 ** (rank % 4) + rank)], device=device)
    for axis, manual_group in checks.items():
        manual_members = dist.get_process_group_ranks(manual_group)
        fm_members = dist.get_process_group_ranks(rm.group(axis))
        # identical members, in identical order, and equal to the pure value's prediction
        assert fm_members == manual_members, (axis, fm_members, manual_members)
        assert fm_members == mesh[axis].group_of(rank).tolist(), (axis, fm_members)
        manual_sum = all_reduce_sum(value, manual_group)
        fm_sum = all_reduce_sum(value, rm.group(axis))
        assert torch.equal(manual_sum, fm_sum), (axis, manual_sum, fm_sum)

    # Gather every rank's view, so rank 0 can print one table for the whole world.
    rows = [None] * world_size
    mine = {axis: dist.get_process_group_ranks(rm.group(axis)) for axis in checks}
    dist.all_gather_object(rows, (rank, rm.coordinate, mine))
    if rank == 0:
        print(f"manual new_group setup vs {mesh}, realized on {rm.backend}:")
        print(f"{'rank':>4}  {'coordinate':>10}  {'shard group':<14} {'replicate group'}")
        for r, coord, groups in rows:
            print(f"{r:>4}  {str(coord):>10}  {str(groups['shard']):<14} {groups['replicate']}")
        print(f"shard groups     {mesh['shard'].groups().tolist()}")
        print(f"replicate groups {mesh['replicate'].groups().tolist()}")
        print("groups and all-reduce results identical on every rank")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
