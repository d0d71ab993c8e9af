"""rm.device_mesh on real gloo workers (world 8): DTensor, FSDP2, HSDP and FSDP2 + TP.

Mesh order reaches torch: DTensor puts data by group rank but computes offsets from
``get_coordinate()``, so on a permuted device list the two agree only if every group that
realize made numbers its members in mesh order (docs/design.md, "Mesh order"). Expected shards come
from the pure coordinate and torch.chunk's rule (pieces of ceil(n / k), nested per mesh dim);
trained parameters come from a single-process reference run of the same model.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import functional_mesh as fm
from functional_mesh import Mesh, make_mesh
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w8 = pool_fixture(8)


PERMUTED = Mesh.from_ranks([[7, 6, 5, 4], [3, 2, 1, 0]], ("dp", "tp"))
PERMUTED_3D = Mesh.from_ranks(np.array([5, 1, 7, 3, 4, 0, 6, 2]).reshape(2, 2, 2), ("a", "b", "c"))
M24 = make_mesh((2, 4), ("dp", "tp"))


def realize(mesh: Mesh):
    return fm.realize(mesh, timeout=GROUP_TIMEOUT, check=CHECK_S)


def c10d_counts() -> tuple[int, int]:
    world = dist.distributed_c10d._world
    return world.group_count, len(world.pg_map)


# -- DTensor: uneven shards on permuted device lists ------------------------------------------------


def chunk(n: int, k: int, i: int) -> tuple[int, int]:
    """torch.chunk's rule as DTensor pads it: piece i of n split k ways, pieces of ceil(n / k)."""
    size = -(-n // k)
    start = min(i * size, n)
    return start, min(start + size, n)


def expected_bounds(mesh: Mesh, shard_dims: list[int], shape: tuple[int, ...], rank: int) -> list[tuple[int, int]]:
    """The global [start, stop) per tensor dim that ``rank`` holds: mesh dims applied in order, each
    splitting what the previous ones left (so two mesh dims on one tensor dim nest)."""
    coord = mesh.coordinate(rank)
    bounds = [(0, n) for n in shape]
    for mesh_dim, dim in enumerate(shard_dims):
        lo, hi = bounds[dim]
        start, stop = chunk(hi - lo, mesh.axis_sizes[mesh_dim], coord[mesh_dim])
        bounds[dim] = (lo + start, lo + stop)
    return bounds


def dtensor_roundtrip(mesh: Mesh, shard_dims: list[int], shape: tuple[int, ...]) -> dict:
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    rm = realize(mesh)
    dm = rm.device_mesh
    full = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    placements = [Shard(d) for d in shard_dims]
    dt = distribute_tensor(full, dm, placements)
    local_shape, offset = compute_local_shape_and_global_offset(full.shape, dm, placements)
    return {"local": dt.to_local().tolist(), "meta": (tuple(local_shape), tuple(offset)),
            "full_equal": bool(torch.equal(dt.full_tensor(), full)), "dm_mesh": dm.mesh.tolist(),
            "dm_coordinate": dm.get_coordinate(), "dm_names": dm.mesh_dim_names,
            "from_device_mesh": (fm.from_device_mesh(dm).axis_names, fm.from_device_mesh(dm).ranks.tolist())}


DTENSOR_CASES = {
    "permuted-shard0-shard1": (PERMUTED, [0, 1], (5, 3)),
    "permuted-shard0-shard0": (PERMUTED, [0, 0], (5, 3)),
    "permuted-transposed": (PERMUTED.transpose("tp", "dp"), [0, 1], (5, 3)),
    "permuted-3d-nested": (PERMUTED_3D, [0, 1, 0], (5, 3)),
    "iota-shard1-shard0": (M24, [1, 0], (3, 7)),
}


@pytest.mark.parametrize("case", list(DTENSOR_CASES))
def test_distribute_tensor_uneven_shards_follow_the_pure_coordinate(w8, case):
    mesh, shard_dims, shape = DTENSOR_CASES[case]
    full = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    for rank, res in enumerate(w8.run(dtensor_roundtrip, mesh, shard_dims, shape)):
        bounds = expected_bounds(mesh, shard_dims, shape, rank)
        want = full[tuple(slice(a, b) for a, b in bounds)]
        assert res["local"] == want.tolist(), (rank, bounds)
        # DTensor reports an empty shard's offset as the dim's global size (_utils.py, zero_global_offset)
        offsets = tuple(a if b > a else n for (a, b), n in zip(bounds, shape))
        assert res["meta"] == (tuple(want.shape), offsets), rank
        assert res["full_equal"], rank
        assert res["dm_mesh"] == mesh.ranks.tolist() and res["dm_names"] == mesh.axis_names
        assert tuple(res["dm_coordinate"]) == mesh.coordinate(rank)
        # the same mesh, although maybe over another device list (then unequal, docs/design.md "Edge cases")
        assert res["from_device_mesh"] == (mesh.axis_names, mesh.ranks.tolist()), rank


def test_expected_bounds_anchor():
    # 5 rows over (2, 4) nested: 3 + 2, then 1,1,1,0 and 1,1,0,0 (DTensor's (Shard(0), Shard(0)))
    sizes = [b - a for r in (7, 6, 5, 4, 3, 2, 1, 0) for a, b in [expected_bounds(PERMUTED, [0, 0], (5, 3), r)[0]]]
    assert sizes == [1, 1, 1, 0, 1, 1, 0, 0]


# -- FSDP2, HSDP, FSDP2 + TP against a single-process reference --------------------------------------

BATCH = 16
LR = 0.1
STEPS = 2


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 4, generator=g), torch.randn(BATCH, 4, generator=g)


def reference() -> tuple[list[torch.Tensor], float]:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = batch()
    for _ in range(STEPS):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return [p.detach().clone() for p in model.parameters()], nn.functional.mse_loss(model(x), y).item()


def train(kind: str, mesh: Mesh) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    rm = realize(mesh)
    before = c10d_counts()
    rm.device_mesh  # noqa: B018  (a size-1 dim holds the one-rank group lent to torch, made on first use)
    lent = c10d_counts()
    model = tiny_model()
    out: dict = {"lent": tuple(a - b for a, b in zip(lent, before))}
    if kind == "fsdp":  # 1-D
        fully_shard(model, mesh=rm.device_mesh)
        dp_index, dp_size = rm.coordinate[0], mesh.size
    elif kind == "hsdp":  # 2-D: replicate over the first axis, shard over the second
        fully_shard(model, mesh=rm.device_mesh)
        (rep, shard), (n_rep, n_shard) = rm.coordinate, mesh.axis_sizes
        dp_index, dp_size = rep * n_shard + shard, mesh.size
    else:  # "fsdp+tp" on (dp, tp): both torch meshes are slices of one realized root
        root = rm.device_mesh
        tp_mesh, dp_mesh = rm["tp"].device_mesh, rm["dp"].device_mesh
        out["roots"] = [tp_mesh._get_root_mesh() is root, dp_mesh._get_root_mesh() is root,
                        rm["dp", "tp"].device_mesh._get_root_mesh() is root]
        out["slices"] = (tp_mesh.mesh.tolist(), dp_mesh.mesh.tolist())
        parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=dp_mesh)
        dp_index, dp_size = rm.local_rank("dp"), mesh.axis_size("dp")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = batch()
    start, stop = dp_index * BATCH // dp_size, (dp_index + 1) * BATCH // dp_size
    for _ in range(STEPS):
        nn.functional.mse_loss(model(x[start:stop]), y[start:stop]).backward()
        opt.step()
        opt.zero_grad()
    sharded = list(model.parameters())  # resharded after the step: DTensors on dp (x tp)
    out["sharded"] = [(isinstance(p, DTensor), p.device_mesh.mesh.tolist() if isinstance(p, DTensor) else None,
                       p.to_local().numel() < p.numel() if isinstance(p, DTensor) else None) for p in sharded]
    params = [p.full_tensor() for p in sharded]
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(x), y).item()
    ref_params, ref_loss = reference()
    out["max_diff"] = max((a - b).abs().max().item() for a, b in zip(params, ref_params))
    out["loss"], out["ref_loss"] = loss, ref_loss
    out["created"] = tuple(a - b for a, b in zip(c10d_counts(), lent))
    return out


TRAIN_CASES = {
    "fsdp-1d-reversed": ("fsdp", Mesh.from_ranks([7, 6, 5, 4, 3, 2, 1, 0], ("dp",))),
    "hsdp-2d-permuted": ("hsdp", PERMUTED.rename({"dp": "replicate", "tp": "shard"})),
    "fsdp+tp": ("fsdp+tp", M24),
    "fsdp+tp-permuted": ("fsdp+tp", PERMUTED),
    # size-1 dims: torch asks for their group (FSDP2 reads its rank and size; HSDP all-reduces over a
    # size-1 replicate dim; TP's distribute_tensor scatters over a size-1 tp dim): the lent one
    "fsdp-1d-size-1": ("fsdp", make_mesh((8, 1), ("x", "dp"))["dp"]),  # every rank alone
    "hsdp-replicate-1": ("hsdp", make_mesh((1, 8), ("replicate", "shard"))),
    "hsdp-shard-1": ("hsdp", PERMUTED.flatten().unflatten("dp_tp", {"replicate": 8, "shard": 1})),
    "fsdp+tp-tp-1": ("fsdp+tp", make_mesh((8, 1), ("dp", "tp"))),
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_fsdp2_trains_like_one_process(w8, case):
    kind, mesh = TRAIN_CASES[case]
    results = w8.run(train, kind, mesh, timeout=30)
    for rank, res in enumerate(results):
        assert res["max_diff"] < 1e-5, (rank, res)
        assert abs(res["loss"] - res["ref_loss"]) < 1e-5, (rank, res)
        assert res["loss"] == results[0]["loss"]  # the same on every rank
        assert res["created"] == (0, 0), res  # FSDP2/TP made no group of their own
        # rm.device_mesh made none either, but the one-rank fake group lent to a size-1 dim: outside
        # torch's group counter, once per process (until clear_cache)
        assert res["lent"][0] == 0 and res["lent"][1] in ((0, 1) if 1 in mesh.axis_sizes else (0,)), res
        # every parameter is sharded over the whole submesh (dp, or dp x tp) or, when its shard dim
        # has size 1, whole on every rank
        submesh = mesh.group_of(rank).tolist()
        sharding = mesh.axis_sizes[1] if kind == "hsdp" else mesh.size
        assert res["sharded"] == [(True, submesh, sharding > 1)] * 4, (rank, res["sharded"])
        if kind == "fsdp+tp":
            assert res["roots"] == [True, True, True]
            assert res["slices"] == (mesh["tp"].group_of(rank).tolist(), mesh["dp"].group_of(rank).tolist())


def dtensor_op_after_clear_cache(how: str) -> list[list[float]]:
    """Realize, a DTensor op, then clear_cache/abort and the same again: the second op must use the new groups."""
    mesh = fm.Mesh.from_ranks(np.array([7, 6, 5, 4, 3, 2, 1, 0]), ("x",))
    out = []
    for _ in range(2):
        rm = fm.realize(mesh)
        t = fm.distribute(torch.arange(8.0), fm.NamedSharding(mesh, fm.P("x")), mesh=rm)
        out.append((t * 2).full_tensor().tolist())
        fm.clear_cache() if how == "clear_cache" else fm.abort()
    return out


@pytest.mark.parametrize("how", ["clear_cache", "abort"])
def test_a_dtensor_op_after_clear_cache_uses_the_new_groups(w8, how):
    # DTensor's sharding-propagation cache keys plans by a DeviceMesh equal across the two handles: kept,
    # the second op ran on the destroyed groups ("Could not resolve the process group registered under the name N")
    for rank_out in w8.run(dtensor_op_after_clear_cache, how):
        assert rank_out == [[2.0 * i for i in range(8)]] * 2
