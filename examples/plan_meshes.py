"""Plan parallel layouts as pure values: no torch.distributed, no processes, any world size.

Run:  python examples/plan_meshes.py [world_size]

1. The DeviceMesh tutorial's hand-written 2-D (HSDP) rank lists, next to the one-line mesh
   that describes the same groups.
2. A torchtitan-style plan (pp, dp_replicate, dp_shard, cp, tp) derived from one world mesh,
   with the flattened data-parallel axes it needs, and how many distinct process groups
   `realize` would create for it (equal rank groups are shared).
3. A Megatron-style plan from an order string, the groups of Megatron's tokens, where each axis
   sits on hosts of 8 GPUs, and a picture of one pipeline stage's (cp, tp) grid.
"""

from __future__ import annotations

import sys

import functional_mesh as fm


def tutorial_2d(num_devices: int = 8) -> None:
    # The tutorial's manual setup: shard groups of consecutive ranks, replicate groups strided.
    shard_factor = num_devices // 2
    shard_rank_lists = [list(range(0, shard_factor)), list(range(shard_factor, num_devices))]
    replicate_rank_lists = [list(range(i, num_devices, shard_factor)) for i in range(shard_factor)]

    # The same groups as a value.
    mesh = fm.make_mesh((2, shard_factor), ("replicate", "shard"))
    assert mesh["shard"].groups().tolist() == shard_rank_lists
    assert mesh["replicate"].groups().tolist() == replicate_rank_lists
    print(f"{mesh}: shard groups {shard_rank_lists}, replicate groups {replicate_rank_lists}")


def torchtitan_plan(world: int = 32) -> None:
    pp, dp_replicate, cp, tp = 2, 2, 2, 2
    dp_shard = world // (pp * dp_replicate * cp * tp)
    mesh = fm.make_mesh((world,), ("world",)).unflatten(
        "world", {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
    )
    derived = {
        "dp": mesh.flatten(("dp_replicate", "dp_shard"), name="dp"),
        "dp_shard_cp": mesh.flatten(("dp_shard", "cp"), name="dp_shard_cp"),
        "dp_cp": mesh.flatten(("dp_replicate", "dp_shard", "cp"), name="dp_cp"),
        # the same layout as "dp", reached under another name: shares dp's groups
        "batch": mesh.flatten(("dp_replicate", "dp_shard"), name="batch"),
    }
    print(f"\n{mesh}")
    families = {name: mesh[name] for name in mesh.axis_names}
    families.update({name: m[name] for name, m in derived.items()})
    distinct: set[tuple[int, ...]] = set()
    calls = 0
    print(f"{'axis':>13} {'size':>4} {'groups':>6}  layout        rank 0's group")
    for name, fam in families.items():
        rows = [tuple(g) for g in fam.groups().reshape(fam.num_groups, -1).tolist()]
        calls += len(rows)
        distinct.update(rows)
        print(f"{name:>13} {fam.size:>4} {fam.num_groups:>6}  {str(fam.axis_layout(name)):12}  "
              f"{fam.group_of(0).tolist()}")
    print(f"{len(families)} axis families, {calls} group rows, {len(distinct)} distinct rank groups "
          f"(realize creates one process group per distinct group)")


def megatron_plan(world: int = 32, gpus_per_host: int = 8) -> None:
    tp, cp, pp = 4, 2, 2
    mesh = fm.mesh_from_order("tp-cp-ep-dp-pp", tp=tp, cp=cp, ep=1, dp=world // (tp * cp * pp), pp=pp)
    print(f"\n{mesh}  hosts of {gpus_per_host}: {mesh.host_span(gpus_per_host)}")
    for token in ("tp-cp", "dp-cp", "tp-pp"):
        family = mesh.flatten(fm.order_axes(mesh, token), name=token)[token]
        print(f"  Megatron token {token!r}: {family.num_groups} groups, rank 0's: {family.group_of(0).tolist()}")
    if mesh.host_span(gpus_per_host)["tp"] != "intra-host":
        print("  WARNING: tensor parallelism crosses hosts")
    print(fm.visualize(mesh["cp", "tp"], axis="cp"))


if __name__ == "__main__":
    tutorial_2d()
    torchtitan_plan(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
    megatron_plan(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
