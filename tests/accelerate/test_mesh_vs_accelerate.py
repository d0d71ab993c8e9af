"""accelerate 1.15.0's own ``ParallelismConfig.build_device_mesh`` against ours, under torch's fake backend.

Every valid combination of (dp_replicate, dp_shard, cp, tp) on 8 ranks, every rank (one process
plays each in turn): the same dims, the same flattened dims, the same group and local rank per
dim, the same coordinate. The group counts of both (torch's group counter, which every named
group advances) are summed over the configurations and printed. Runs in the accelerate venv
(``make test-accelerate``); skipped where accelerate is not installed.
"""

from __future__ import annotations

import itertools
import math

import pytest

accelerate = pytest.importorskip("accelerate")

import torch.distributed as dist  # noqa: E402
import torch.testing._internal.distributed.fake_pg  # noqa: E402,F401  (registers the "fake" backend)
from accelerate.parallelism_config import ParallelismConfig  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import functional_mesh as fm  # noqa: E402
from functional_mesh.integrations import accelerate as fm_accelerate  # noqa: E402

WORLD = 8


def configs(world: int = WORLD) -> list[dict[str, int]]:
    """Every (dp_replicate, dp_shard, cp, tp) of product ``world`` that accelerate 1.15 accepts."""
    out = []
    for sizes in itertools.product([1, 2, 4, 8], repeat=4):
        if math.prod(sizes) != world:
            continue
        r, s, c, t = sizes
        if (t > 1 or c > 1) and r > 1 and s == 1:  # accelerate refuses DDP + TP/CP
            continue
        out.append({"dp_replicate_size": r, "dp_shard_size": s, "cp_size": c, "tp_size": t})
    return out


CONFIGS = configs()


def make_config(**sizes: int) -> ParallelismConfig:
    """accelerate's config; for tp > 1 with a stand-in tp_handler, since its default one (made in
    ``__post_init__``) requires transformers >= 4.52, which building the mesh never uses."""
    handler = {"tp_handler": object()} if sizes.get("tp_size", 1) > 1 else {}
    return ParallelismConfig(**sizes, **handler)


def test_every_configuration_is_enumerated():
    # 20 ways to split 2^3 into four powers of two, less the 5 with dp_replicate > 1 = dp_shard * 0 + TP/CP
    assert len(CONFIGS) == 15


def start(rank: int) -> None:
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=WORLD, store=FakeStore())


def group_count() -> int:
    return dist.distributed_c10d._world.group_count


def describe(dm) -> dict:
    """Everything a user of the mesh can ask: dims, flattened dims, per-dim groups and local ranks."""
    names = list(dm.mesh_dim_names) + list(dm._flatten_mapping)  # private: the flattened dims by name
    return {
        "dims": tuple(dm.mesh_dim_names),
        "flattened": sorted(dm._flatten_mapping),
        "mesh": dm.mesh.tolist(),
        "coordinate": dm.get_coordinate(),
        "device_type": dm.device_type,
        "per_dim": {n: (dm[n].mesh.tolist(), dist.get_process_group_ranks(dm.get_group(n)) if dm[n].size() > 1
                        else [dist.get_rank()], dm.get_local_rank(n) if n in dm.mesh_dim_names else dm[n].get_local_rank())
                    for n in names},
        "fsdp": dm[tuple(n for n in ("dp_replicate", "dp_shard_cp") if n in names)].mesh.tolist(),
        # private: each flattened dim's layout, as torch's own _flatten computes it (torch 2.11/2.12 refuse to
        # slice a flattened dim whose layout is not theirs: "only allows slicing out a contiguous flattened dim")
        "flat_layouts": {n: str(dm._flatten_mapping[n]._layout) for n in sorted(dm._flatten_mapping)},
    }


@pytest.fixture(scope="module")
def counts():
    totals = {"theirs": 0, "ours": 0}
    yield totals
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    print(f"\ngroups made per rank over {len(CONFIGS)} configurations: accelerate {totals['theirs']}, "
          f"functional_mesh {totals['ours']}")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(str(v) for v in c.values()))
def test_our_mesh_is_accelerates(config, counts):
    for rank in range(WORLD):
        start(rank)
        before = group_count()
        theirs = describe(make_config(**config).build_device_mesh("cpu"))
        made_theirs = group_count() - before
        start(rank)
        before = group_count()
        dm = fm_accelerate.build_device_mesh(make_config(**config), "cpu")
        ours = describe(dm)
        made_ours = group_count() - before
        assert ours == theirs, f"rank {rank}"
        assert made_ours <= made_theirs, (made_ours, made_theirs)
        if rank == 0:
            counts["theirs"] += made_theirs
            counts["ours"] += made_ours


def test_where_accelerate_builds_none_we_build_none():
    start(0)
    assert ParallelismConfig(dp_replicate_size=1).build_device_mesh("cpu") is None
    assert fm_accelerate.build_device_mesh(ParallelismConfig(dp_replicate_size=1), "cpu") is None
    config = ParallelismConfig(sp_size=2, dp_shard_size=4)
    assert config.build_device_mesh("cpu") is None
    assert fm_accelerate.build_device_mesh(config, "cpu") is None


def test_a_flattened_dim_of_one_dim_is_that_dims_group():
    start(0)
    dm = fm_accelerate.build_device_mesh(make_config(dp_shard_size=4, tp_size=2), "cpu")
    assert dm.get_group("dp") is dm.get_group("dp_shard") is dm.get_group("dp_shard_cp") is dm.get_group("dp_cp")


def test_sizes_that_are_not_the_world_are_refused():
    start(0)
    with pytest.raises(fm.MeshError, match=r"product is the world size 8, but got dp_shard=2 \* tp=2 = 4"):
        fm_accelerate.build_device_mesh(make_config(dp_shard_size=2, tp_size=2), "cpu")
    with pytest.raises(TypeError, match="requires an accelerate ParallelismConfig"):
        fm_accelerate.build_device_mesh(object(), "cpu")


def test_adopt_sets_the_mesh_accelerator_will_read():
    start(0)
    config = fm_accelerate.adopt(ParallelismConfig(dp_replicate_size=2, dp_shard_size=4), "cpu")
    assert config.get_device_mesh("cpu") is config.device_mesh
    assert config.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard")
    with pytest.raises(fm.MeshError, match="whose mesh was not built yet"):
        fm_accelerate.adopt(config, "cpu")


def test_the_version_check():
    assert fm_accelerate.check_version() == accelerate.__version__ == "1.15.0"
