"""Slicing a realized 3-D mesh into an HSDP mesh and a TP mesh that share one torch root.

Run:  torchrun --nproc_per_node=8 examples/slicing_3d.py

The DeviceMesh tutorial's section 4 with functional_mesh:

    mesh = fm.make_mesh((2, 2, 2), ("replicate", "shard", "tp"))
    rm = fm.realize(mesh)                         # every group is made here, once
    hsdp = rm["replicate", "shard"]               # for FSDP2 (HSDP)
    tp = rm["tp"]                                 # for tensor parallel

Selections are served from realize's cache (no new groups), and their ``device_mesh`` is a torch
slice of the one ``rm.device_mesh`` root, so FSDP2 and tensor parallel can be composed on them
(see train_3d.py). The script also builds the tutorial's torch mesh with ``init_device_mesh``
and checks that every group agrees, then shows a transposed selection, which torch refuses.
Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import functional_mesh as fm

NAMES = ("replicate", "shard", "tp")


def main() -> None:
    mesh = fm.make_mesh((2, 2, 2), NAMES)
    rm = fm.realize(mesh)
    before = fm.cache_info()

    hsdp_rm = rm["replicate", "shard"]
    tp_rm = rm["tp"]
    hsdp_mesh, tp_mesh = hsdp_rm.device_mesh, tp_rm.device_mesh
    assert fm.cache_info() == before  # slicing is a lookup: no new groups, no cache traffic
    # One torch root for both, as FSDP2 + TP require (torch's _get_root_mesh is private API).
    assert hsdp_mesh._get_root_mesh() is tp_mesh._get_root_mesh() is rm.device_mesh

    # The tutorial's step 3, on our slices: the process groups of each parallelism.
    groups = {
        "replicate": hsdp_mesh["replicate"].get_group(),
        "shard": hsdp_mesh["shard"].get_group(),
        "tp": tp_mesh.get_group(),
    }
    for axis, pg in groups.items():
        assert pg is rm.group(axis)  # the very groups realize made
    mine = {axis: dist.get_process_group_ranks(pg) for axis, pg in groups.items()}

    # The tutorial's torch code, for comparison: the same groups, member for member.
    mesh_3d = init_device_mesh(rm.device_type, (2, 2, 2), mesh_dim_names=NAMES)
    torch_mine = {
        "replicate": dist.get_process_group_ranks(mesh_3d["replicate", "shard"]["replicate"].get_group()),
        "shard": dist.get_process_group_ranks(mesh_3d["replicate", "shard"]["shard"].get_group()),
        "tp": dist.get_process_group_ranks(mesh_3d["tp"].get_group()),
    }
    assert mine == torch_mine, (mine, torch_mine)
    assert hsdp_mesh.get_coordinate() == mesh_3d["replicate", "shard"].get_coordinate()

    # A transposed selection: legal here (its own torch root, same groups); torch refuses it.
    swapped = rm["tp", "replicate"]
    assert swapped.group("tp") is rm.group("tp")
    swapped_dm = swapped.device_mesh  # DeviceMesh.from_group over the same two groups
    assert tuple(swapped_dm.get_coordinate()) == (rm.local_rank("tp"), rm.local_rank("replicate"))
    try:
        mesh_3d["tp", "replicate"]
        torch_says = "accepted"
    except (KeyError, RuntimeError, ValueError) as err:
        torch_says = f"{type(err).__name__}: {err.args[0] if err.args else err}"

    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (rm.rank, rm.coordinate, mine))
    if rm.rank == 0:
        print(f"3-D mesh {mesh} realized on {rm.backend}: {rm.device_mesh}")
        print(f"HSDP slice {hsdp_mesh}, TP slice {tp_mesh}: one torch root")
        print(f"{'rank':>4}  {'coordinate':>10}  {'replicate':<10} {'shard':<10} tp")
        for r, coord, g in rows:
            print(f"{r:>4}  {str(coord):>10}  {str(g['replicate']):<10} {str(g['shard']):<10} {g['tp']}")
        print(f"{fm.cache_info()} (the slices added nothing)")
        print("groups equal torch init_device_mesh's on every rank")
        print(f"rm['tp', 'replicate'] -> {swapped.mesh}, {swapped_dm} with rank 0's submesh "
              f"{swapped_dm.mesh.tolist()}")
        print(f"torch mesh_3d['tp', 'replicate'] -> {torch_says}")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
