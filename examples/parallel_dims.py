"""A torchtitan-style ParallelDims on functional_mesh: one world mesh, derived axes, shared groups.

Run:  torchrun --nproc_per_node=8 examples/parallel_dims.py [--pp 1 --dp-replicate 2 --dp-shard 2 --cp 1 --tp 2]

torchtitan builds its meshes from one world mesh: it unflattens the world into
(pp, dp_replicate, dp_shard, cp, tp) and flattens the data-parallel dims it needs, "dp"
(dp_replicate x dp_shard: data loading), "dp_shard_cp" (dp_shard x cp: FSDP's shard dim) and
"dp_cp" (dp_replicate x dp_shard x cp: loss averaging). With torch's DeviceMesh each flatten and
unflatten makes fresh process groups, even when an equal group already exists. Here every
derived mesh is a pure value and ``fm.realize`` creates each distinct group once: a flattened
axis whose rank groups equal an existing axis's (e.g. "dp_shard_cp" when cp = 1, or "batch",
the same layout as "dp" under another name) is a cache hit that creates nothing.

``--dp-shard -1`` takes whatever the other sizes leave (as torchtitan does). Runs on CPU (gloo)
and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import argparse
import math
import os

import torch.distributed as dist

import functional_mesh as fm

DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def parse_sizes(world: int) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    for dim, default in defaults.items():
        parser.add_argument(f"--{dim.replace('_', '-')}", type=int, default=default, dest=dim)
    args = vars(parser.parse_args())
    sizes = {dim: args[dim] for dim in DIMS}
    if sizes["dp_shard"] == -1:
        rest = math.prod(v for k, v in sizes.items() if k != "dp_shard")
        sizes["dp_shard"] = world // rest if rest and world % rest == 0 else 0
    if any(v < 1 for v in sizes.values()) or math.prod(sizes.values()) != world:
        parser.error(f"sizes {sizes} must be positive with product {world} (the world size)")
    return sizes


def main() -> None:
    # The pure plan needs the world size only; realize() below initialises torch.distributed.
    world = int(os.environ["WORLD_SIZE"])
    sizes = parse_sizes(world)

    # 1. One world mesh, unflattened into the five parallel dims (pure values, O(ndim)).
    mesh = fm.make_mesh((world,), ("world",)).unflatten("world", sizes)
    rm = fm.realize(mesh)  # size-1 dims get no group: nothing to communicate
    after_base = fm.cache_info()

    # 2. The flattened data-parallel dims, each realized once. Only axes with new rank groups
    #    are cache misses; pp, cp and tp (and equal layouts) are lookups.
    flat = {
        "dp": mesh.flatten(("dp_replicate", "dp_shard"), name="dp"),
        "dp_shard_cp": mesh.flatten(("dp_shard", "cp"), name="dp_shard_cp"),
        "dp_cp": mesh.flatten(("dp_replicate", "dp_shard", "cp"), name="dp_cp"),
    }
    realized = {name: fm.realize(m) for name, m in flat.items()}
    after_flat = fm.cache_info()

    # 3. The same layout under another name, and the same groups reached by another path:
    #    "batch" (torchtitan's data-loading name for dp) and dp_cp unflattened back into an
    #    HSDP pair. All cache hits: no group is created.
    batch = fm.realize(mesh.flatten(("dp_replicate", "dp_shard"), name="batch"))
    hsdp_sizes = {"hsdp_replicate": sizes["dp_replicate"], "hsdp_shard": sizes["dp_shard"] * sizes["cp"]}
    hsdp = fm.realize(flat["dp_cp"].unflatten("dp_cp", hsdp_sizes))
    after_reuse = fm.cache_info()
    assert after_reuse.groups == after_flat.groups and after_reuse.misses == after_flat.misses, after_reuse
    assert batch.group("batch") is realized["dp"].group("dp")
    assert hsdp.group("hsdp_shard") is realized["dp_shard_cp"].group("dp_shard_cp")

    # 4. FSDP2 + TP meshes from ONE realized root (torch needs a shared root to compose them):
    #    the mesh with dp_shard_cp, sliced for FSDP (HSDP over dp_replicate x dp_shard_cp) and TP.
    fsdp_rm = realized["dp_shard_cp"]
    fsdp_mesh = fsdp_rm["dp_replicate", "dp_shard_cp"].device_mesh
    tp_mesh = fsdp_rm["tp"].device_mesh
    assert fsdp_mesh._get_root_mesh() is tp_mesh._get_root_mesh()  # private torch API, 2.13

    # Every axis: its size, layout, and the group of every rank (gathered to check and print).
    families = [(name, mesh[name], rm) for name in mesh.axis_names]
    families += [(name, m[name], realized[name]) for name, m in flat.items()]
    families += [("batch", batch.mesh["batch"], batch)]
    families += [(name, hsdp.mesh[name], hsdp) for name in hsdp_sizes]
    mine = {}
    for name, family, owner in families:
        members = dist.get_process_group_ranks(owner.group(name))
        assert members == family.group_of(owner.rank).tolist(), (name, members)
        mine[name] = members
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)

    if rm.rank == 0:
        print(f"world {world} -> {mesh}  ({rm.backend})")
        print(f"{'axis':<15} {'size':>4}  {'layout':<11} {'rank 0 group':<14} all groups (gathered from every rank)")
        rows = 0
        for name, family, _ in families:
            seen = sorted({tuple(e[name]) for e in everyone})
            assert seen == sorted(tuple(g) for g in family.groups().reshape(family.num_groups, -1).tolist())
            rows += family.num_groups
            print(f"{name:<15} {family.size:>4}  {str(family.axis_layout(name)):<11} {str(mine[name]):<14} "
                  f"{[list(g) for g in seen]}")
        print(f"FSDP mesh {fsdp_mesh} and TP mesh {tp_mesh}: one torch root")
        print(f"cache after the 5-D mesh:        {after_base}")
        print(f"after dp, dp_shard_cp, dp_cp:    {after_flat}")
        print(f"after batch and the HSDP pair:   {after_reuse}  (cache hits only, no new groups)")
        print(f"{len(families)} axes ask for {rows} group rows; realize created {after_reuse.groups} distinct groups")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
