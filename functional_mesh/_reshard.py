"""``reshard`` across two meshes: a plan per leaf, then one packed exchange per stage over a bridge group.

``fm.reshard`` comes here from ``_interop`` when the destination mesh is not the source's. Local
copies stay in memory; every piece one rank sends another in a stage, of every leaf, goes in one
``uint8`` buffer, in one uneven ``all_to_all_single`` per stage (and bucket) over a members-only
bridge mesh that ``realize`` makes once: docs/across_meshes.md, "The call" and "The transport".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from . import _steps as S
from . import _torch
from ._agree import agree, as_check_timeout, next_call
from ._debug import CHECK_COLLECTIVES_ENV, is_check_on
from ._errors import MeshError, requires
from ._handle import Hop, RealizedMesh, comm_failure, hop_of
from ._mesh import Mesh
from ._pending import Pending, Slot
from ._realize import realize
from ._reshard_plan import ShapeDtypeStruct, plan_reshard
from ._sharding import NamedSharding

__all__ = ["BRIDGE_AXIS", "across"]

BRIDGE_AXIS = "reshard"  # the bridge mesh's one axis (its group is described "mesh_reshard")
_API = "reshard"


class _Leaf(NamedTuple):
    """One leaf of the call, planned: what this rank holds of it and where its destination block goes."""

    plan: Any  # the ReshardPlan
    dtype: torch.dtype
    shape: tuple[int, ...]
    local: torch.Tensor | None  # this rank's source block (contiguous), None when it holds none
    src_block: tuple[slice, ...] | None
    dst_block: tuple[slice, ...] | None
    out: torch.Tensor | None  # this rank's destination block, filled by the moves; None outside
    sends: tuple[Any, ...]  # this rank's moves out and in (the plan's canonical order), asked once
    receives: tuple[Any, ...]
    relays: bool  # this rank forwards pieces it received (sends in a stage > 0)


class _Call:
    """The state of one cross-mesh call between issue and wait (a ``Pending`` runs it twice)."""

    __slots__ = ("api", "names", "slot", "leaves", "exchanges", "done", "packed", "group", "hop", "pad", "union",
                 "rank", "device", "held", "finish")
    api: str
    names: tuple[str, ...]
    slot: Slot | None
    leaves: list[_Leaf]
    exchanges: list[tuple[tuple[int, ...], int, bool]]
    done: int
    packed: dict[int, Any]
    group: Any  # the bridge's ProcessGroup (None: nothing crosses)
    hop: Hop | None
    pad: bool
    union: list[int]
    rank: int
    device: torch.device
    held: list[list[Any]]
    finish: Callable[[list[torch.Tensor | None]], Any]

    def __init__(self) -> None:
        self.api, self.names, self.slot = _API, (BRIDGE_AXIS,), None
        self.done = 0  # exchanges finished
        self.packed = {}  # exchange number -> (buffer, step, receive list), packed once


# -- the call -----------------------------------------------------------------------------------------------


def across(xs: list[Any], srcs: list[NamedSharding], dsts: list[NamedSharding], mesh: Any, rebuild: Callable[[list[Any]], Any],
           *, async_op: bool, bucket_bytes: int | None, relays: bool = True) -> Any:
    """Run a cross-mesh reshard of the flat leaves ``xs`` (DTensors or ``ShapeDtypeStruct``s).

    ``srcs``/``dsts``: each leaf's source and destination sharding; ``rebuild``: the flat results
    (DTensors) to the caller's tree. Returns that tree on a destination rank, ``None`` elsewhere
    (a :class:`Pending` of it with ``async_op``).
    """
    rank = _torch.global_rank()
    dst_mesh = dsts[0].mesh
    for d in dsts[1:]:
        if d.mesh != dst_mesh:
            raise MeshError(requires(_API, "one destination mesh for every leaf of a call across meshes",
                                     "sharding.mesh", d.mesh, dst_mesh)
                            + "; call reshard once per destination mesh", mesh=d.mesh)
    in_dst = dst_mesh.coordinate(rank) is not None
    in_src = [s.mesh.coordinate(rank) is not None for s in srcs]
    if not in_dst and not any(in_src):
        named = sorted({repr(s.mesh) for s in srcs} | {repr(dst_mesh)})
        raise MeshError(requires(_API, "a rank of the source or the destination mesh (the ranks of neither call "
                                 "nothing)", "rank", rank, " or ".join(named)), mesh=dst_mesh)
    rm = _destination_handle(mesh, dst_mesh, in_dst, srcs)
    shapes, dtypes, device = _check_leaves(xs, srcs, in_src, rank)
    if device is None:
        device = torch.device(rm.device_type) if rm is not None else torch.device("cpu")
    meshes = {s.mesh for s in srcs} | {dst_mesh}  # usually two: a state dict's leaves share their meshes
    union = sorted({int(r) for m in meshes for r in m.devices.reshape(-1).tolist()})
    if is_check_on():
        _agree_on_call(union, rank, shapes, dtypes, srcs, dsts, device, bucket_bytes)
    call = _Call()
    call.rank, call.union, call.device = rank, union, device
    call.leaves = [_plan_leaf(x, s, d, shape, dtype, rank, device, relays)
                   for x, s, d, shape, dtype in zip(xs, srcs, dsts, shapes, dtypes, strict=True)]
    call.exchanges = _exchanges(call.leaves, bucket_bytes, rank)
    call.held = [[] for _ in call.leaves]  # per leaf: (box, tensor) pieces received for forwarding
    call.group = call.hop = None
    call.pad = False
    if any(crosses for _, _, crosses in call.exchanges):
        # members-only unless the union is the whole world: then every rank calls, and realize reuses the
        # default group (or splits it on NCCL), where members-only NCCL under a device-bound default is refused
        whole = len(union) == _torch.world_size()
        bridge = realize(Mesh.from_ranks(np.array(union), (BRIDGE_AXIS,)), device.type, members_only=not whole,
                         check=False)
        call.group = bridge.group(BRIDGE_AXIS)
        call.hop = hop_of(bridge, BRIDGE_AXIS, _API)
        call.pad = bridge.backend == "fake"  # see _pack: only torch's fake backend needs the byte

    def finish(outs: list[torch.Tensor | None]) -> Any:
        if rm is None:
            return None
        return rebuild([_torch.wrap_local(out, _torch.spec_of(rm.device_mesh, d.placements, leaf.shape,
                                                               _contiguous_stride(leaf.shape), leaf.dtype), False)
                        for out, d, leaf in zip(outs, dsts, call.leaves, strict=True)])

    call.finish = finish
    if not async_op:
        return _run(call)
    call.slot = Slot()
    return Pending(_run, call, None)


def _destination_handle(mesh: Any, dst_mesh: Mesh, in_dst: bool, srcs: list[NamedSharding]) -> RealizedMesh | None:
    """The destination's realized mesh on its ranks (``mesh=``, required there); ``None`` elsewhere."""
    if mesh is not None and not isinstance(mesh, RealizedMesh):
        raise TypeError(requires(_API, "a RealizedMesh for mesh", "mesh", mesh))
    if not in_dst:
        return None
    if mesh is None:
        raise MeshError(requires(_API, "mesh=<the destination's RealizedMesh> on every rank of the destination "
                                 "mesh (a sharding on a mesh other than the source's is a reshard across meshes)",
                                 "mesh", None, f"fm.realize({dst_mesh!r}, members_only=True)")
                        + f"; the source is on {' and '.join(sorted({repr(s.mesh) for s in srcs}))}, the "
                        f"destination sharding.mesh={dst_mesh!r}", mesh=dst_mesh)
    if mesh.mesh != dst_mesh:
        raise MeshError(requires(_API, "mesh= to be the destination's realized mesh", "mesh.mesh", mesh.mesh,
                                 dst_mesh), mesh=dst_mesh)
    return mesh


def _check_leaves(xs: list[Any], srcs: list[NamedSharding], in_src: list[bool],
                  rank: int) -> tuple[list[tuple[int, ...]], list[torch.dtype], torch.device | None]:
    """Each leaf's global shape and dtype; the DTensors' device (``None`` when this rank holds none)."""
    shapes, dtypes, device = [], [], None
    for i, (x, src, member) in enumerate(zip(xs, srcs, in_src, strict=True)):
        if src.spec.unreduced:
            raise MeshError(requires(_API, "a source without unreduced axes across meshes (a pending sum is reduced "
                                     "on its own mesh first)", "source spec", src.spec)
                            + "; fm.reshard it to a spec without unreduced= on its mesh first", mesh=src.mesh)
        if isinstance(x, ShapeDtypeStruct):
            if member:
                raise MeshError(requires(_API, "the DTensor itself on a rank holding part of the source",
                                         f"leaf {i}", x, f"a DTensor on {src.mesh!r}"), mesh=src.mesh)
            shapes.append(tuple(int(n) for n in x.shape))
            dtypes.append(_as_dtype(x.dtype))
            continue
        shapes.append(tuple(x.shape))
        dtypes.append(x.dtype)
        device = x.device if device is None else device
        if not member:
            raise MeshError(requires(_API, "a DTensor whose mesh holds this rank", f"leaf {i} on rank", rank,
                                     src.mesh), mesh=src.mesh)
    return shapes, dtypes, device


def _as_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise MeshError(requires(_API, "a torch dtype or its name", "dtype", dtype))
    return found


def _agree_on_call(union: list[int], rank: int, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[torch.dtype],
                   srcs: Sequence[NamedSharding], dsts: Sequence[NamedSharding], device: torch.device,
                   bucket_bytes: int | None) -> None:
    """The debug check (``FUNCTIONAL_MESH_CHECK_COLLECTIVES``): every rank of both meshes asks for the same
    leaves (shapes, dtypes, shardings); a rank given a wrong ``ShapeDtypeStruct`` is named."""
    leaves = "; ".join(f"{str(dt).removeprefix('torch.')}{list(shape)} {src} -> {dst.spec}"
                       for shape, dt, src, dst in zip(shapes, dtypes, srcs, dsts, strict=True))
    request = (f"reshard of {len(shapes)} leaves to {dsts[0].mesh!r} on {device.type}"
               f"{'' if bucket_bytes is None else f', bucket_bytes={bucket_bytes}'}: {leaves}")
    space = "reshard/" + hashlib.sha1(",".join(map(str, union)).encode(), usedforsecurity=False).hexdigest()[:16]
    n = next_call(space)
    where = f"ranks {union}" if len(union) <= 16 else f"{len(union)} ranks"
    wait_s = as_check_timeout(True, os.environ, _API)
    assert wait_s is not None  # check=True: always a wait
    agree(_API, f"every rank of both meshes to make the same call ({CHECK_COLLECTIVES_ENV} on)",
          f"reshard call #{n} of {where}", f"functional_mesh/reshard/{space}/{n}", union, rank, request, wait_s)


def _plan_leaf(x: Any, src: NamedSharding, dst: NamedSharding, shape: tuple[int, ...], dtype: torch.dtype, rank: int,
               device: torch.device, relays: bool) -> _Leaf:
    plan = plan_reshard(src, dst, shape, dtype, relays=relays)
    src_block = src.local_slices(shape, rank)
    dst_block = dst.local_slices(shape, rank)
    local = None
    if src_block is not None:
        local = _torch.local_tensor(x)
        want = tuple(s.stop - s.start for s in src_block)
        if tuple(local.shape) != want:
            raise MeshError(requires(_API, "a DTensor whose local block is its sharding's", "local shape",
                                     tuple(local.shape), want) + f" for {src} of shape {shape}", mesh=src.mesh)
        local = local.detach()
        if not local.is_contiguous():
            local = local.contiguous()
    out = None
    if dst_block is not None:
        out = torch.empty(tuple(s.stop - s.start for s in dst_block), dtype=dtype, device=device)
    sends, receives = plan.sends(rank), plan.receives(rank)
    return _Leaf(plan, dtype, shape, local, src_block, dst_block, out, sends, receives,
                 any(m.stage > 0 for m in sends))


def _exchanges(leaves: list[_Leaf], bucket_bytes: int | None, rank: int) -> list[tuple[tuple[int, ...], int, bool]]:
    """``(leaf indices, stage, whether anything crosses between ranks)`` per exchange, in the order every rank
    runs them.

    From each plan's size alone (``bytes_moved``, ``stages``: arithmetic on the layouts), never from its
    list of moves, which names every destination rank: a bucket whose leaves move no byte between ranks
    skips its exchanges; otherwise each stage is one exchange (a relay stage of another leaf may carry
    nothing from this one).
    """
    buckets: list[list[int]] = [[]]
    size = 0
    for i, leaf in enumerate(leaves):
        crossing = leaf.plan.bytes_moved
        if bucket_bytes is not None and buckets[-1] and size + crossing > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += crossing
    out = []
    for bucket in buckets:
        crosses = any(leaves[i].plan.bytes_moved for i in bucket)
        stages = max((leaves[i].plan.stages for i in bucket), default=0)
        out += [(tuple(bucket), k, crosses) for k in range(stages)]
    return out


# -- running it ---------------------------------------------------------------------------------------------


def _run(call: _Call) -> Any:
    """Every exchange from the first not yet done; with a slot, the first one is started (issue) or arrived."""
    for e in range(call.done, len(call.exchanges)):
        bucket, stage, crosses = call.exchanges[e]
        if e not in call.packed:
            call.packed[e] = _pack(call, bucket, stage, crosses)
        buf, step, receive = call.packed[e]
        if step is not None:
            try:
                if call.slot is not None:
                    step = call.slot.take(buf, step, None)
                arrived = step.run(buf)
            except RuntimeError as exc:
                assert call.hop is not None  # a step: something crosses, over the bridge's hop
                raise comm_failure(_API, call.hop, call.device.type, exc) from exc
            _unpack(call, arrived, receive)
        call.packed.pop(e)
        call.done = e + 1
    return call.finish([leaf.out for leaf in call.leaves])


def _pack(call: _Call, bucket: tuple[int, ...], stage: int, crosses: bool) -> tuple[Any, Any, list[Any]]:
    """This rank's local copies of the stage, done now; its send buffer, the step, and what it receives in order."""
    rank, union = call.rank, call.union
    position = {r: j for j, r in enumerate(union)}
    to: list[list[tuple[int, Any]]] = [[] for _ in union]
    frm: list[list[tuple[int | None, Any]]] = [[] for _ in union]  # None: this rank's byte to itself
    for i in bucket:
        leaf = call.leaves[i]
        for m in leaf.sends:
            if m.stage != stage or not m.nbytes:
                continue
            if m.dst_rank == rank:
                _place(call, i, m.index, _piece(call, i, m.index))
            else:
                to[position[m.dst_rank]].append((i, m))
        for m in leaf.receives:
            if m.stage == stage and m.nbytes and m.src_rank != rank:
                frm[position[m.src_rank]].append((i, m))
    if not crosses:
        return None, None, []
    sent = [sum(m.nbytes for _, m in row) for row in to]
    got = [sum(m.nbytes for _, m in row) for row in frm]
    me = position[rank]
    if call.pad and (not sum(sent) or not sum(got)):  # one byte to itself, dropped on arrival: torch's fake
        sent[me] = got[me] = 1  # backend refuses an empty buffer whose peer block is not (gloo does not, so
        # there nothing but the plan's bytes goes through torch.distributed)
        frm[me].append((None, 1))
    buf = torch.empty(sum(sent), dtype=torch.uint8, device=call.device)
    at = 0
    for j, row in enumerate(to):
        if j == me:
            at += sent[me]
        for i, m in row:
            piece = _piece(call, i, m.index)
            _as_bytes(buf[at:at + m.nbytes], piece.shape, piece.dtype).copy_(_bytes_of(piece))
            at += m.nbytes
    return buf, S.Ragged(call.group, tuple(sent), tuple(got)), [pair for row in frm for pair in row]


def _unpack(call: _Call, arrived: torch.Tensor, receive: list[tuple[int, Any]]) -> None:
    at = 0
    for i, m in receive:
        if i is None:  # this rank's byte to itself
            at += m
            continue
        leaf = call.leaves[i]
        chunk = arrived[at:at + m.nbytes]
        at += m.nbytes
        shape = tuple(s.stop - s.start for s in m.index)
        if leaf.dst_block is not None and _inside(m.index, leaf.dst_block):  # the common case: into place, as bytes
            assert leaf.out is not None  # a destination block: its buffer
            region = leaf.out[_relative(m.index, leaf.dst_block)]
            _bytes_of(region).copy_(_as_bytes(chunk, shape, leaf.dtype))
            if leaf.relays:  # a later stage forwards it from where it landed
                call.held[i].append((m.index, region))
        else:  # a piece to forward that is not (all) this rank's: kept whole
            _place(call, i, m.index, chunk.clone().view(leaf.dtype).reshape(shape))


def _piece(call: _Call, i: int, index: tuple[slice, ...]) -> torch.Tensor:
    """The box ``index`` of leaf ``i``, from this rank's source block or a piece it received earlier."""
    leaf = call.leaves[i]
    if leaf.src_block is not None and _inside(index, leaf.src_block):
        assert leaf.local is not None  # a source block: its tensor
        return leaf.local[_relative(index, leaf.src_block)]
    for box, tensor in call.held[i]:
        if _inside(index, box):
            return tensor[_relative(index, box)]
    raise AssertionError(f"rank {call.rank} holds no piece {index} of leaf {i}")  # pragma: no cover - the plan's


def _place(call: _Call, i: int, index: tuple[slice, ...], piece: torch.Tensor) -> None:
    """Write ``piece`` (the box ``index``) where it meets this rank's destination block; keep it for relays."""
    leaf = call.leaves[i]
    if leaf.relays:
        call.held[i].append((index, piece))
    if leaf.dst_block is None:
        return
    meet = tuple(slice(max(a.start, b.start), min(a.stop, b.stop)) for a, b in zip(index, leaf.dst_block, strict=True))
    if any(s.stop <= s.start for s in meet):
        return
    assert leaf.out is not None  # a destination block: its buffer
    leaf.out[_relative(meet, leaf.dst_block)] = piece[_relative(meet, index)]


def _inside(index: tuple[slice, ...], box: tuple[slice, ...]) -> bool:
    return all(b.start <= s.start and s.stop <= b.stop for s, b in zip(index, box, strict=True))


def _relative(index: tuple[slice, ...], box: tuple[slice, ...]) -> tuple[slice, ...]:
    return tuple(slice(s.start - b.start, s.stop - b.start) for s, b in zip(index, box, strict=True))


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` as bytes, its last dim ``itemsize`` times longer (a view: the last dim has stride 1)."""
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8)


def _as_bytes(flat: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A flat byte range as the byte view of a tensor of ``shape`` and ``dtype`` (no alignment needed)."""
    shape = tuple(shape) or (1,)
    return flat.view(*shape[:-1], shape[-1] * dtype.itemsize)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, out = 1, []
    for n in reversed(tuple(shape)):
        out.append(stride)
        stride *= max(n, 1)
    return tuple(reversed(out))

