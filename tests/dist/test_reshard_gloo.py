"""``fm.reshard`` across two meshes on real gloo workers (the shared world-8 pool).

Every case builds full tensors from a seed on every rank, distributes them on the source mesh,
reshards them to the destination, and checks on each destination rank that the local block is
the full tensor's block under the destination sharding, bit for bit (``torch.equal``), with the
destination's placements on the destination's torch mesh; ranks outside it get ``None``. The
bytes each rank hands ``all_to_all_single`` are counted (a wrapper around the transport's one
torch call) and their sum compared with the plans' ``bytes_moved`` (and that with a brute-force
reference planner's, which a relay cannot undercut); each rank's messages (non-empty blocks)
with one per (receiver, stage) it sends to, over all leaves.

Cases: a disjoint state dict (trainer dp_shard 2 × tp 2 on ranks 0-3 → generator dp 2 × tp 2 on
4-7, bf16 and fp32, a scalar, uneven dims, a ``_StridedShard`` leaf); colocated (the same 8 ranks,
another layout); overlapping with ``async_op=True``; uneven and empty blocks; a rank in neither
mesh (``MeshError`` on it at once; the others finish); the debug check naming a wrong
``ShapeDtypeStruct`` on every rank.
"""

from __future__ import annotations

import os
import zlib

import torch
import torch.distributed as dist
from torch.distributed.tensor.placement_types import _StridedShard

import functional_mesh as fm
from functional_mesh import NamedSharding, P, _torch
from tests.dist import _reshard_ref
from tests.dist._pool import pool_fixture
from tests.dist._settings import GROUP_TIMEOUT
from functional_mesh import ShapeDtypeStruct, plan_reshard

w8 = pool_fixture(8)
w4 = pool_fixture(4)  # the fast tier's smoke case only

WORLD = fm.make_mesh((8,), ("r",))
TRAINER = WORLD.take(r=slice(0, 4)).unflatten("r", {"dp_shard": 2, "tp": 2})  # ranks 0-3
GENERATOR = WORLD.take(r=slice(4, 8)).unflatten("r", {"dp": 2, "tp": 2})  # ranks 4-7

# name -> (shape, dtype, source spec on TRAINER, destination spec on GENERATOR)
STATE = {
    "embed": ((10, 4), torch.bfloat16, P("dp_shard", "tp"), P("tp")),
    "attn.wq": ((8, 6), torch.float32, P(("tp", "dp_shard")), P("tp")),  # FSDP2 + TP: _StridedShard
    "attn.wo": ((6, 8), torch.float32, P("dp_shard", "tp"), P(None, "tp")),
    "norm": ((5,), torch.bfloat16, P("dp_shard"), P("tp")),  # uneven: 3 + 2
    "bias": ((6,), torch.float32, P(), P("dp")),
    "scale": ((), torch.float32, P(), P()),
}


def full(name: str, shape, dtype) -> torch.Tensor:
    """The full value of ``name``: random bits from its name (bf16 and fp32 alike), the same on every rank."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


class Count:
    """Wraps the transport's torch call: bytes this rank sends to others, and the non-empty blocks (messages)."""

    def __init__(self) -> None:
        self.sent, self.messages, self.calls = 0, 0, 0
        self.real = _torch.all_to_all_start

    def __call__(self, x, out_splits, in_splits, group):
        self.calls += 1  # a rank with nothing to send or receive sends itself one byte: not counted
        others = [n for j, n in enumerate(in_splits) if j != group.rank()]
        self.sent += sum(others) * x.element_size()
        self.messages += sum(1 for n in others if n)
        return self.real(x, out_splits, in_splits, group)

    def __enter__(self):
        _torch.all_to_all_start = self
        return self

    def __exit__(self, *exc):
        _torch.all_to_all_start = self.real


def realize_member(mesh, members_only=True):
    if mesh.coordinate(dist.get_rank()) is None:
        return None
    return fm.realize(mesh, members_only=members_only, timeout=GROUP_TIMEOUT, check=GROUP_TIMEOUT)


def sources(state, src_mesh, rm_src):
    """Each leaf as this rank passes it: the DTensor on a source rank, a ShapeDtypeStruct elsewhere."""
    out = {}
    for name, (shape, dtype, spec, _) in state.items():
        sharding = NamedSharding(src_mesh, spec)
        if rm_src is not None:
            out[name] = fm.distribute(full(name, shape, dtype), sharding, mesh=rm_src)
        else:
            out[name] = ShapeDtypeStruct(shape, dtype, sharding=sharding)
    return out


def verdicts(state, got, dst_mesh, rm_dst):
    """Per leaf, on a destination rank: placements, torch mesh, shape and local bits right."""
    rank = dist.get_rank()
    if rm_dst is None:
        return None if got is None else f"rank {rank} outside the destination got {type(got)}"
    bad = []
    for name, (shape, dtype, _, spec) in state.items():
        out, dst = got[name], NamedSharding(dst_mesh, spec)
        want = full(name, shape, dtype)[dst.local_slices(shape, rank)]
        if tuple(out.placements) != tuple(dst.placements) or out.device_mesh is not rm_dst.device_mesh:
            bad.append(f"{name}: placements {out.placements}")
        elif tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            bad.append(f"{name}: shape {tuple(out.shape)} {out.dtype}")
        elif not torch.equal(out.to_local(), want):
            bad.append(f"{name}: values differ")
    return bad


def planned(state, src_mesh, dst_mesh):
    """The plans' total bytes between ranks (arithmetic on the layouts), and the reference planner's."""
    total = sum(plan_reshard(NamedSharding(src_mesh, s), NamedSharding(dst_mesh, d), shape, dtype).bytes_moved
                for shape, dtype, s, d in state.values())
    reference = sum(_reshard_ref.bytes_between_ranks(_reshard_ref.reference_moves(
        NamedSharding(src_mesh, s), NamedSharding(dst_mesh, d), shape, dtype.itemsize))
        for shape, dtype, s, d in state.values())
    return total, reference


def check_refit(state, src_mesh, dst_mesh, world_realize, async_op=False, bucket_bytes=None):
    """One reshard of ``state`` from ``src_mesh`` to ``dst_mesh``; verdicts and counts per rank."""
    rank = dist.get_rank()
    if world_realize:  # every rank in both meshes: realized by the world
        rm_src = fm.realize(src_mesh, timeout=GROUP_TIMEOUT, check=GROUP_TIMEOUT)
        rm_dst = fm.realize(dst_mesh, timeout=GROUP_TIMEOUT, check=GROUP_TIMEOUT)
        rm_src = rm_src if rm_src.coordinate is not None else None
        rm_dst = rm_dst if rm_dst.coordinate is not None else None
    else:
        rm_src, rm_dst = realize_member(src_mesh), realize_member(dst_mesh)
    if rm_src is None and rm_dst is None:
        return {"idle": True}
    x = sources(state, src_mesh, rm_src)
    strided = [n for n, v in x.items() if rm_src is not None and any(isinstance(p, _StridedShard) for p in v.placements)]
    specs = {name: NamedSharding(dst_mesh, d) for name, (_, _, _, d) in state.items()}
    with Count() as count:
        groups_before = fm.cache_info().groups
        got = fm.reshard(x, specs, mesh=rm_dst, async_op=async_op, bucket_bytes=bucket_bytes)
        pending = isinstance(got, fm.Pending)
        if pending:
            text = repr(got)
            got = got.wait()
        again = fm.reshard(x, specs, mesh=rm_dst, bucket_bytes=bucket_bytes)  # the bridge is a cache hit now
        made_again = fm.cache_info().groups - groups_before
    plans = [plan_reshard(NamedSharding(src_mesh, s), NamedSharding(dst_mesh, d), shape, dtype)
             for shape, dtype, s, d in state.values()]  # here, beside the transport: the same plan code
    pairs = {(m.stage, m.dst_rank) for p in plans for m in p.sends(rank) if m.dst_rank != rank and m.nbytes}
    return {"bad": verdicts(state, got, dst_mesh, rm_dst), "again": verdicts(state, again, dst_mesh, rm_dst),
            "pairs": len(pairs),
            "sent": count.sent // 2, "messages": count.messages // 2, "calls": count.calls // 2,
            "pending": pending and "reshard" in text, "strided": strided, "made_again": made_again, "rank": rank}


def assert_refit(out, state, src_mesh, dst_mesh, *, buckets=False):
    active = [o for o in out if not o.get("idle")]
    for o in active:
        assert o["bad"] in (None, []), o
        assert o["again"] in (None, []), o
    bytes_moved, reference = planned(state, src_mesh, dst_mesh)
    assert sum(o["sent"] for o in active) == bytes_moved >= reference > 0
    for o in active:  # one message per (sender, receiver) pair per stage (per bucket, with buckets)
        assert (o["messages"] >= o["pairs"]) if buckets else (o["messages"] == o["pairs"]), o
    if buckets:
        assert sum(o["messages"] for o in active) > sum(o["pairs"] for o in active)
    return active


def test_disjoint_state_dict_trainer_to_generator(w8):
    out = w8.run(check_refit, STATE, TRAINER, GENERATOR, False, timeout=90)
    active = assert_refit(out, STATE, TRAINER, GENERATOR)
    assert all(o["strided"] == ["attn.wq"] for o in active[:4])  # the FSDP2 + TP leaf is a _StridedShard
    stages = max(plan_reshard(NamedSharding(TRAINER, s), NamedSharding(GENERATOR, d), shape, dt).stages
                 for shape, dt, s, d in STATE.values())
    assert {o["calls"] for o in active} == {stages}  # one exchange per stage for the whole state dict
    assert all(o["made_again"] == 0 for o in active)


def test_disjoint_in_buckets(w8):
    out = w8.run(check_refit, STATE, TRAINER, GENERATOR, False, False, 64, timeout=90)
    active = assert_refit(out, STATE, TRAINER, GENERATOR, buckets=True)
    assert {o["calls"] for o in active} != {1}  # more than one exchange: 64-byte buckets


COLOCATED_SRC = fm.make_mesh((4, 2), ("dp_shard", "tp"))
COLOCATED_DST = fm.Mesh.from_ranks(torch.arange(8).reshape(2, 4).T.contiguous().tolist(), ("tp", "dp"))
COLOCATED = {
    "w": ((8, 12), torch.float32, P(("tp", "dp_shard")), P("dp", "tp")),
    "v": ((7, 3), torch.bfloat16, P("dp_shard"), P("tp")),
    "c": ((4,), torch.float32, P(), P(("dp", "tp"))),
}


def test_colocated_same_ranks_another_layout(w8):
    out = w8.run(check_refit, COLOCATED, COLOCATED_SRC, COLOCATED_DST, True, timeout=90)
    assert len(assert_refit(out, COLOCATED, COLOCATED_SRC, COLOCATED_DST)) == 8


OVERLAP_SRC = WORLD.take(r=slice(0, 6)).unflatten("r", {"dp": 3, "tp": 2})  # ranks 0-5
OVERLAP_DST = fm.Mesh.from_ranks([[7, 5, 3], [6, 4, 2]], ("tp", "dp"))  # ranks 2-7, permuted
OVERLAP = {
    "w": ((9, 4), torch.float32, P("dp", "tp"), P("tp")),
    "b": ((3,), torch.bfloat16, P("tp"), P(("dp", "tp"))),  # uneven: 6 blocks of 3 rows, some empty
}


def test_overlapping_async(w8):
    out = w8.run(check_refit, OVERLAP, OVERLAP_SRC, OVERLAP_DST, False, True, timeout=90)
    active = assert_refit(out, OVERLAP, OVERLAP_SRC, OVERLAP_DST)
    assert len(active) == 8 and all(o["pending"] for o in active)


EMPTY = {
    "few": ((3, 5), torch.float32, P("tp"), P(None, ("dp", "tp"))),  # 3 rows over 2 and 5 columns over 4
    "none": ((0, 4), torch.float32, P("dp_shard"), P("tp")),  # nothing at all
    "thin": ((2,), torch.bfloat16, P(("dp_shard", "tp")), P(("dp", "tp"))),  # 2 over 4: two empty blocks
}


def test_uneven_and_empty_blocks(w8):
    out = w8.run(check_refit, EMPTY, TRAINER, GENERATOR, False, timeout=90)
    assert_refit(out, EMPTY, TRAINER, GENERATOR)


NEITHER_SRC = WORLD.take(r=slice(0, 3)).rename({"r": "a"})
NEITHER_DST = WORLD.take(r=slice(3, 6)).rename({"r": "b"})


def check_neither():
    rank = dist.get_rank()
    shape, sharding = (6,), NamedSharding(NEITHER_SRC, P("a"))
    rm_src, rm_dst = realize_member(NEITHER_SRC), realize_member(NEITHER_DST)
    x = fm.distribute(full("n", shape, torch.float32), sharding, mesh=rm_src) if rm_src is not None else \
        ShapeDtypeStruct(shape, torch.float32, sharding=sharding)
    got = fm.reshard(x, NamedSharding(NEITHER_DST, P()), mesh=rm_dst)  # ranks 6 and 7 call it too, wrongly
    if rm_dst is None:
        return got
    return torch.equal(got.to_local(), full("n", shape, torch.float32))


def test_rank_in_neither_mesh_is_refused_and_the_others_finish(w8):
    outs = w8.outcomes(check_neither, timeout=60)
    for o in outs[:3]:
        assert o.ok and o.value is None, o.describe()
    for o in outs[3:6]:
        assert o.ok and o.value is True, o.describe()
    for o in outs[6:]:
        assert not o.ok and o.error_name == "MeshError", o.describe()
        assert "`reshard` requires a rank of the source or the destination mesh" in o.message and "rank=" in o.message


def check_wrong_struct():
    """Rank 6 declares the wrong shape, rank 7 the wrong dtype; the debug check names them on every rank."""
    rank = dist.get_rank()
    before = os.environ.get("FUNCTIONAL_MESH_CHECK_TIMEOUT")
    os.environ.update(FUNCTIONAL_MESH_CHECK_COLLECTIVES="1", FUNCTIONAL_MESH_CHECK_TIMEOUT="10")
    try:
        rm_src, rm_dst = realize_member(TRAINER), realize_member(GENERATOR)
        sharding = NamedSharding(TRAINER, P("tp"))
        if rm_src is not None:
            x = fm.distribute(full("s", (4, 2), torch.float32), sharding, mesh=rm_src)
        else:
            shape, dtype = ((4, 3) if rank == 6 else (4, 2)), (torch.bfloat16 if rank == 7 else torch.float32)
            x = ShapeDtypeStruct(shape, dtype, sharding=sharding)
        try:
            fm.reshard(x, NamedSharding(GENERATOR, P()), mesh=rm_dst)
        except fm.MeshError as exc:
            return str(exc)
        return "no error"
    finally:
        del os.environ["FUNCTIONAL_MESH_CHECK_COLLECTIVES"]
        if before is not None:
            os.environ["FUNCTIONAL_MESH_CHECK_TIMEOUT"] = before


def test_debug_check_names_a_wrong_shape_dtype_struct(w8):
    for rank, message in enumerate(w8.run(check_wrong_struct, timeout=60)):
        assert message.startswith("`reshard` requires every rank of both meshes to make the same call"), (rank, message)
        assert "ranks [6] asked for" in message and "float32[4, 3]" in message, (rank, message)
        assert "ranks [7] asked for" in message and "bfloat16[4, 2]" in message, (rank, message)


SMOKE_SRC = WORLD.take(r=[0, 1]).rename({"r": "tp"})
SMOKE_DST = WORLD.take(r=[3, 2]).rename({"r": "dp"})  # ranks 3, 2: replicated, so relays
SMOKE = {
    "w": ((5, 3), torch.bfloat16, P("tp"), P()),
    "b": ((4,), torch.float32, P(), P("dp")),
}


def test_smoke_world4_disjoint(w4):
    """The fast tier's representative (tests/conftest.py SMOKE): ranks 0-1 to ranks 3-2, bf16 and fp32."""
    out = w4.run(check_refit, SMOKE, SMOKE_SRC, SMOKE_DST, False, timeout=60)
    assert len(assert_refit(out, SMOKE, SMOKE_SRC, SMOKE_DST)) == 4
