"""The torch boundary: torch's mesh and placement objects, and the private torch APIs we read.

Everything the library hands to torch or reads back from it as a torch object passes here:
DTensor placements (to and from our placement plan), a ``DeviceMesh`` over groups realize made,
the layout of an existing ``DeviceMesh``. The private torch APIs it reads, and the releases they
are checked on, are listed in docs/design.md, "The private torch APIs we read"; where releases
differ, the difference is detected (a signature, an attribute, a probe), never read from the version.

Creates no process group but two kinds, for ``_cache`` only (:func:`one_rank_group`,
:func:`group_in_order`). The pure layers reach this module only lazily (``NamedSharding.placements``) so that planning a mesh needs no torch.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.tensor import debug as _DTENSOR_DEBUG
from torch.distributed.device_mesh import DeviceMesh

from ._errors import MeshError, requires
from ._vma import VmaError

__all__ = ["PlacementPlan", "abort_groups", "all_gather", "all_gather_start", "all_reduce", "all_reduce_start",
           "all_to_all", "all_to_all_start", "broadcast_prefix", "no_torch_function", "reduce_scatter_start", "wait",
           "can_split", "default_group",
           "default_store", "device_mesh_from_groups", "from_placements", "global_rank", "group_members",
           "group_in_order", "group_name", "one_graph_for_all_ranks", "run_time_coordinate", "shared_group_name", "key_meshes_by_job", "group_timeout", "known_groups", "local_tensor", "mesh_parts", "one_rank_group", "op_overload_name", "pytree",
           "raise_while_tracing", "reduce_scatter", "register_flattened", "rename_flattened", "set_group_desc",
           "to_placements", "torch_function_mode_active",
           "trace_time_error", "unregister_flattened"]

# Per mesh axis: None (replicated), (tensor dim, split factor) (a factor of None is Shard(dim), an int
# _StridedShard(dim, split_factor=factor)) or "sum", "max", "min" (a pending reduction: Partial(kind)). Built by
# functional_mesh._sharding.placement_plan.
PlacementPlan = tuple[tuple[int, int | None] | str | None, ...]


def to_placements(plan: PlacementPlan) -> tuple[Any, ...]:
    """DTensor placements for a placement plan, one per mesh axis (``"sum"``: ``Partial("sum")``, ...)."""
    # DTensor is imported on first use: it costs ~0.6 s, and realize and the collectives never need it
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return tuple(Replicate() if p is None else Partial(p) if isinstance(p, str) else Shard(p[0]) if p[1] is None
                 else _StridedShard(p[0], split_factor=p[1]) for p in plan)


def from_placements(api: str, placements: Sequence[Any], mesh: Any = None) -> PlacementPlan:
    """The placement plan of DTensor placements; a ``Partial`` other than a sum, max or min is a ``MeshError``."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    plan: list[tuple[int, int | None] | str | None] = []
    for placement in placements:
        if isinstance(placement, _StridedShard):  # a subclass of Shard on some torch versions: test it first
            plan.append((placement.dim, placement.split_factor))
        elif isinstance(placement, Shard):
            plan.append((placement.dim, None))
        elif isinstance(placement, Replicate):
            plan.append(None)
        elif isinstance(placement, Partial) and placement.reduce_op in ("sum", "max", "min"):
            plan.append(placement.reduce_op)
        else:
            raise MeshError(requires(api, "Shard, Replicate or Partial('sum' | 'max' | 'min') placements (a "
                                     "PartitionSpec has no other pending reduction: redistribute it first)",
                                     "placement", placement, "Shard, _StridedShard, Replicate, Partial('sum'), "
                                     "Partial('max'), Partial('min')"), mesh=mesh)
    return tuple(plan)


_C10D = torch.ops._c10d_functional  # functional collectives by group name: what torch.compile traces

# Each collective below takes ``group``: a group *name* (a str) under torch.compile, where torch's
# functional collectives trace (a constant of the graph), or the ProcessGroup itself eagerly,
# where the group's own method into a new buffer is what ``dist.*`` calls after its argument
# checks (ours are made once per handle and axes); the functional form would add a dispatch and a
# ``wait_tensor`` per call. Complex tensors go through ``dist.*``, which reduces them as pairs of
# reals. Same values either way; ``x`` is contiguous where a dim-0 block layout matters.


# The reductions of our steps, by the names torch's functional collectives take, with c10d's
# options for each (read-only: a mapping proxy).
REDUCE_OPS = ("sum", "max", "min")


def _options(kind: Any, op: str) -> Any:
    options = kind()
    options.reduceOp = getattr(dist.ReduceOp, op.upper())
    return options


_ALLREDUCE = MappingProxyType({op: _options(dist.AllreduceOptions, op) for op in REDUCE_OPS})
_REDUCE_SCATTER = MappingProxyType({op: _options(dist.ReduceScatterOptions, op) for op in REDUCE_OPS})


def all_reduce(x: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """The reduction ``op`` (one of :data:`REDUCE_OPS`) over ``group``, as a new tensor.

    Eagerly the result is a clone of ``x`` reduced in place: its gradient is the clone's, the
    identity, which is psum's own backward (the other reductions take theirs from their autograd
    node); the in-place reduction goes through a detached alias.
    """
    if isinstance(group, str):
        return _C10D.wait_tensor(_C10D.all_reduce(x, op, group))
    y = x.clone(memory_format=torch.contiguous_format)
    target = y.detach() if y.requires_grad else y
    if target.is_complex():  # c10d's wrapper reduces complex values as pairs of reals
        dist.all_reduce(target, op=_ALLREDUCE[op].reduceOp, group=group)
    else:  # the group's own method: what dist.all_reduce calls, without its checks (~3 us)
        group.allreduce([target], _SUM if op == "sum" else _ALLREDUCE[op]).wait()
    return y


_SUM = _ALLREDUCE["sum"]  # psum's, without the mapping lookup


def all_gather(x: torch.Tensor, n: int, group: Any) -> torch.Tensor:
    """Every member's ``x`` concatenated along dim 0, in group-rank order."""
    return wait(*all_gather_start(x, n, group))


def reduce_scatter(x: torch.Tensor, op: str, n: int, group: Any) -> torch.Tensor:
    """The reduction ``op`` over the group, this member's ``1/n`` block of dim 0."""
    return wait(*reduce_scatter_start(x, op, n, group))


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    """Block ``j`` of dim 0 (``in_splits[j]`` rows) to member ``j``; arrivals in member order."""
    return wait(*all_to_all_start(x, out_splits, in_splits, group))


# Started, not waited for (``async_op=True``): each ``*_start`` returns ``(buffer, work)``. Eagerly the
# buffer is the tensor the collective writes and ``work`` its c10d ``Work`` (the group's method or
# ``dist.*(async_op=True)``); under torch.compile the buffer is the functional collective's result and
# ``work`` is ``None``: :func:`wait` is then its ``wait_tensor``.


def wait(buffer: torch.Tensor, work: Any) -> torch.Tensor:
    """The result of a started collective: its ``Work`` waited for (eagerly), or its ``wait_tensor`` (compiled)."""
    if work is None:
        return _C10D.wait_tensor(buffer)
    work.wait()
    return buffer


def all_reduce_start(x: torch.Tensor, op: str, group: Any) -> tuple[torch.Tensor, Any]:
    """:func:`all_reduce`, started: ``x`` (no gradient is taken through it) reduced in a new buffer."""
    if isinstance(group, str):
        return _C10D.all_reduce(x, op, group), None
    y = x.clone(memory_format=torch.contiguous_format)
    if y.is_complex():
        return y, dist.all_reduce(y, op=_ALLREDUCE[op].reduceOp, group=group, async_op=True)
    return y, group.allreduce([y], _ALLREDUCE[op])


def all_gather_start(x: torch.Tensor, n: int, group: Any) -> tuple[torch.Tensor, Any]:
    """:func:`all_gather`, started."""
    if isinstance(group, str):
        return _C10D.all_gather_into_tensor(x, n, group), None
    out = x.new_empty((n * x.shape[0], *x.shape[1:]))
    if x.is_complex():
        return out, dist.all_gather_into_tensor(out, x, group=group, async_op=True)
    return out, group._allgather_base(out, x)


def reduce_scatter_start(x: torch.Tensor, op: str, n: int, group: Any) -> tuple[torch.Tensor, Any]:
    """:func:`reduce_scatter`, started."""
    if isinstance(group, str):
        return _C10D.reduce_scatter_tensor(x, op, n, group), None
    out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
    if x.is_complex():
        return out, dist.reduce_scatter_tensor(out, x, op=_REDUCE_SCATTER[op].reduceOp, group=group, async_op=True)
    return out, group._reduce_scatter_base(out, x, _REDUCE_SCATTER[op])


def all_to_all_start(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                     group: Any) -> tuple[torch.Tensor, Any]:
    """:func:`all_to_all`, started."""
    if isinstance(group, str):
        return _C10D.all_to_all_single(x, out_splits, in_splits, group), None
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    if x.is_complex():
        return out, dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=True)
    return out, group.alltoall_base(out, x, out_splits, in_splits)


def no_torch_function() -> Any:
    """A context where no torch function mode or tensor subclass sees torch's ops (``DisableTorchFunction``)."""
    return torch._C.DisableTorchFunction()


def group_name(pg: Any) -> str:
    """The name functional collectives know a group by."""
    return pg.group_name


# -- one graph for every rank (torch's compile_on_one_rank; docs/compile.md, "Compile caches across ranks") --


# whether this torch resolves a mesh's groups when a graph runs (``_dtensor.mesh_get_process_group``): where it
# does not (torch 2.11, 2.12), its dynamo cannot take our handle as a constant either, and the flag changes nothing
# of ours (docs/compile.md, "One graph for every rank")
_RUN_TIME_GROUPS = hasattr(getattr(torch.ops, "_dtensor"), "mesh_get_process_group")


def one_graph_for_all_ranks() -> bool:
    """Whether torch's ``compile_on_one_rank`` is on: ``torch.compiler.config`` (torch >= 2.14) or
    ``torch.distributed.config`` (2.13, a deprecated alias later), on a torch that can share the graph
    (:data:`_RUN_TIME_GROUPS`); read while tracing."""
    if not _RUN_TIME_GROUPS:
        return False
    config = getattr(torch.compiler, "config", None)
    if config is not None and hasattr(config, "compile_on_one_rank"):
        return bool(config.compile_on_one_rank)
    return bool(getattr(getattr(dist, "config", None), "compile_on_one_rank", False))


def run_time_coordinate(groups: list[list[int]]) -> Any:
    """This rank's position in the row of ``groups`` (every group of some axes, ``(n_groups, size)``) that
    holds it, as a value the graph computes at run time: torch's
    ``device_mesh::_runtime_compute_coordinate_on_dim`` (what ``DeviceMesh._sym_get_coordinate`` calls
    under ``compile_on_one_rank``), ranged ``0 .. size - 1``. A SymInt while tracing; ``groups`` is
    a constant every rank shares."""
    import torch.distributed._ops.device_mesh  # noqa: F401  (registers the operator)

    return torch.ops.device_mesh._runtime_compute_coordinate_on_dim(torch.tensor(groups, dtype=torch.int), 0)


# -- a DeviceMesh in the FX graph cache key: the job's mesh, not this rank's (docs/compile.md) --


_JOB = "_functional_mesh_every_group"  # a DeviceMesh of ours: its root's every group (the same on every rank)


def _mesh_cache_key(mesh: DeviceMesh) -> tuple[Any, ...] | None:
    """What tells ``mesh`` apart from the job's other meshes on every rank alike: device type, dim names,
    layout in its root, and the root's every group where we built the root, else the root's rank map
    (torch >= 2.10's ``_layout``/``_rank_map``; ``None`` without them)."""
    layout, rank_map = getattr(mesh, "_layout", None), getattr(mesh, "_rank_map", None)
    if layout is None or rank_map is None:
        return None
    job = getattr(getattr(mesh, "_root_mesh", None) or mesh, _JOB, None)
    return ("DeviceMesh", mesh.device_type, mesh.mesh_dim_names, str(layout),
            tuple(rank_map.tolist()) if job is None else job)


def _key_meshes_by_job(codecache: Any) -> None:
    """Under ``compile_on_one_rank``, inductor's FX graph cache keys a graph's ``DeviceMesh`` input by
    :func:`_mesh_cache_key` instead of pickling the object (its ``_rank``, ``_coordinate_on_dim``, this
    rank's group names): the compiled code takes the mesh when it runs, and what tracing read of it is
    in the graph, which is in the key. Without the flag, torch's own reduction."""
    pickler: Any = getattr(codecache, "FxGraphCachePickler", None)
    torch_reduce = getattr(pickler, "_reduce_fake_script_object", None)
    if torch_reduce is None or getattr(torch_reduce, "_functional_mesh", False):
        return

    def reduce(self: Any, t: Any) -> Any:
        real = getattr(t, "real_obj", None)
        key = _mesh_cache_key(real) if isinstance(real, DeviceMesh) and one_graph_for_all_ranks() else None
        return torch_reduce(self, t) if key is None else (tuple, ((t.script_class_name, *key),))  # hashed, never loaded

    reduce._functional_mesh = True  # type: ignore[attr-defined]
    pickler._reduce_fake_script_object = reduce


_CODECACHE = "torch._inductor.codecache"


class _AfterCodecache:
    """A ``sys.meta_path`` finder that patches inductor's cache module once it is imported (it costs seconds)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _CODECACHE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                _key_meshes_by_job(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def key_meshes_by_job() -> None:
    """Make :func:`_key_meshes_by_job` hold (at realize; idempotent, nothing imported)."""
    if not _RUN_TIME_GROUPS:
        return
    if _CODECACHE in sys.modules:
        _key_meshes_by_job(sys.modules[_CODECACHE])
    elif not any(isinstance(f, _AfterCodecache) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterCodecache())


_SHARED_NAMES: dict[str, Any] = {}  # a name every group of one axis shares -> this rank's group


def shared_group_name(pg: Any, name: str) -> str:
    """``name`` in c10d's group registry for ``pg``, this rank's group of an axis whose every group
    registers under the same ``name`` on its own members: a graph that names it is the same on every
    rank, and the functional collectives resolve it at run time to the caller's group. A name held
    by a group destroyed since is taken over; one held by another live group takes a suffix."""
    c10d = dist.distributed_c10d
    base, k = name, 0
    while name in _SHARED_NAMES:
        held = _SHARED_NAMES[name]
        if held is pg:
            return name
        if held in c10d._world.pg_names:  # another live group
            k += 1
            name = f"{base}#{k}"
            continue
        c10d._unregister_process_group(name)  # its group was destroyed
        del _SHARED_NAMES[name]
    c10d._unregister_process_group(name)  # one left by a world destroyed since (none: nothing happens)
    c10d._register_process_group(name, pg)
    _SHARED_NAMES[name] = pg
    return name


def default_group() -> Any:
    """The default process group (``distributed_c10d._get_default_group``, private)."""
    return dist.distributed_c10d._get_default_group()


def default_store() -> Any:
    """The default group's store (``distributed_c10d._get_default_store``, private)."""
    return dist.distributed_c10d._get_default_store()


def can_split(pg: Any) -> bool:
    """Whether ``pg`` is bound to a device whose backend can ``split_group`` (NCCL; fake on torch >= 2.14)."""
    device = getattr(pg, "bound_device_id", None)
    if device is None:
        return False
    try:
        return bool(pg._get_backend(device).supports_splitting)
    except RuntimeError:  # no backend for that device
        return False


def one_rank_group(name: str, desc: str) -> Any:
    """A process group of this rank alone on torch's fake backend: no communicator on any device.

    Made under ``name`` without moving torch's group counter, so one rank may make it alone; what its
    collectives compute: docs/design.md, "Size-1 axes".
    """
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    timeout = dist.constants.default_pg_timeout
    pg = _helper_group([dist.get_rank()], "fake", name, timeout, desc, None)
    if str(dist.get_backend()) == "fake" or _exact_for_one_rank(pg):
        return pg
    # torch 2.11 and 2.12 (feature-detected): the fake backend is not exact for one rank, so the lent
    # group is a real one-rank gloo group (docs/design.md, "Size-1 axes", says why not NCCL).
    _forget(pg)
    return _helper_group([dist.get_rank()], "gloo", f"{name}_exact", timeout, desc, None)


def _exact_for_one_rank(pg: Any) -> bool:
    """Whether ``pg`` (one rank) gives exact reduce-scatter and all-to-all results (two 2-element CPU ops)."""
    x = torch.tensor([1.0, 2.0])
    out = torch.zeros(2)
    pg._reduce_scatter_base(out, x).wait()
    exact = torch.equal(out, x)
    out = torch.zeros(2)
    pg.alltoall_base(out, x, [], []).wait()
    return exact and torch.equal(out, x)


def _forget(pg: Any) -> None:
    """Drop a group this module made (and never handed out) from c10d's registries."""
    dist.distributed_c10d._cleanup_process_group_global_state(pg)
    untagged = dist.distributed_c10d._world.tags_to_pg.get("", [])  # the constructor lists every group under
    if pg in untagged:  # "" too, which the cleanup leaves (destroy_process_group removes it)
        untagged.remove(pg)


# torch >= 2.12: ``new_group(sort_ranks=False)`` keeps the caller's order (group rank = position in
# ``ranks``); torch 2.11's ``new_group`` has no ``sort_ranks`` and always sorts (feature-detected).
NEW_GROUP_SORT_RANKS = "sort_ranks" in inspect.signature(dist.new_group).parameters


def group_in_order(ranks: Sequence[int], backend: str | None, *, timeout: Any, group_desc: str,
                   pg_options: Any) -> Any:
    """What ``new_group(ranks, sort_ranks=False)`` makes, on a torch whose ``new_group`` sorts (2.11).

    Every rank of the world calls it, as ``new_group``; its group ranks follow ``ranks``' order
    (``None`` outside ``ranks``). Only where ``NEW_GROUP_SORT_RANKS`` is false.
    """
    c10d = dist.distributed_c10d
    backend_name = dist.Backend(backend or dist.get_backend())
    timeout = timeout if timeout is not None else c10d._get_default_timeout(backend_name)
    name = c10d._process_group_name(list(ranks), use_hashed_name=False)
    pg = _helper_group(list(ranks), backend_name, name, timeout, group_desc, pg_options)
    return pg if isinstance(pg, dist.ProcessGroup) else None


def local_group(ranks: Sequence[int], backend: str | None, name: str, *, timeout: Any, group_desc: str,
                pg_options: Any) -> Any:
    """A group of ``ranks`` (group ranks in that order) made by its members alone, named ``name``.

    ``new_group(ranks, use_local_synchronization=True)`` with the caller's name (why: docs/realize.md,
    "Members only"); the members meet in the default store under ``name/``.
    """
    c10d = dist.distributed_c10d
    backend_name = dist.Backend(backend or dist.get_backend())
    timeout = timeout if timeout is not None else c10d._get_default_timeout(backend_name)
    return _helper_group(list(ranks), backend_name, name, timeout, group_desc, pg_options)


def _helper_group(ranks: list[int], backend: Any, name: str, timeout: Any, desc: str, options: Any) -> Any:
    """torch's private group constructor (``_new_process_group_helper``) for ``ranks`` in that order."""
    c10d = dist.distributed_c10d
    rank = dist.get_rank()
    group_rank = ranks.index(rank) if rank in ranks else None
    pg, _ = c10d._new_process_group_helper(len(ranks), group_rank, ranks, backend, default_store(), name,
                                          backend_options=options, timeout=timeout, group_desc=desc)
    if group_rank is not None:
        c10d._world.pg_group_ranks[pg] = {r: i for i, r in enumerate(ranks)}  # what new_group records
    return pg


def group_timeout(pg: Any, device_type: str) -> Any:
    """The timeout of ``pg``'s backend for ``device_type`` (a timedelta), or ``None`` when torch does not say.

    Private: ``ProcessGroup._get_backend(device).options._timeout`` (gloo and NCCL backends).
    """
    try:
        return pg._get_backend(torch.device(device_type)).options._timeout
    except (AttributeError, RuntimeError):
        return None


def set_group_timeout(pg: Any, timeout: Any) -> None:
    """Set the timeout of ``pg``'s later operations (``ProcessGroup.set_timeout``, where this torch has it;
    elsewhere the group keeps the timeout it started with, and a whole-world axis with another
    timeout gets a group of its own)."""
    setter = getattr(pg, "set_timeout", None)
    if setter is not None:
        setter(timeout)


def abort_groups(groups: Sequence[Any]) -> None:
    """Abort ``groups`` on this rank and forget them in torch's registries; no collective call.

    NCCL aborts go inside one ``ncclGroupStart``/``ncclGroupEnd`` (one at a time can deadlock), then
    each group leaves c10d's registries (``destroy_process_group`` may wait on a dead peer); a group
    whose abort raises (the fake backend) is still forgotten. docs/reliability.md, "Abort".
    """
    nccl = _coalescing_backend(groups)
    if nccl is not None:
        nccl._group_start()
    try:
        for pg in groups:
            try:
                pg.abort()
            except RuntimeError:  # no abort for this backend: forgetting it below is all we can do
                pass
    finally:
        if nccl is not None:
            nccl._group_end()
    for pg in groups:
        dist.distributed_c10d._cleanup_process_group_global_state(pg)


def _coalescing_backend(groups: Sequence[Any]) -> Any:
    """The NCCL backend of one of ``groups`` that can bracket aborts (``_group_start``), or ``None``."""
    nccl_type = getattr(dist, "ProcessGroupNCCL", None)
    if nccl_type is None or not torch.cuda.is_available():
        return None
    for pg in groups:
        try:
            backend = pg._get_backend(torch.device("cuda"))
        except RuntimeError:
            continue
        if isinstance(backend, nccl_type) and hasattr(backend, "_group_start"):
            return backend
    return None


def op_overload_name(func: Any) -> tuple[str, str] | None:
    """``(namespace, "namespace::op")`` of a ``torch.ops.<namespace>.<op>`` callable, else ``None``."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name.split("::")[0], func._qualified_op_name
    if isinstance(func, torch._ops.OpOverload):
        return func.namespace, func.name()
    return None


def known_groups() -> Any:
    """The process groups torch knows now (``distributed_c10d._world.pg_map``, private): a group
    destroyed by ``dist.destroy_process_group()`` is no longer one of them."""
    return dist.distributed_c10d._world.pg_map


def local_tensor(dtensor: Any) -> torch.Tensor:
    """A DTensor's local tensor as it is (``DTensor._local_tensor``, private: what ``to_local`` returns under
    ``no_grad``), for an argument that needs no gradient."""
    return dtensor._local_tensor


def dtensor_spec(dtensor: Any) -> Any:
    """A DTensor's spec as it is (``DTensor._spec``, private): its mesh, placements and global meta."""
    return dtensor._spec


def spec_of(mesh: DeviceMesh, placements: tuple[Any, ...], shape: Sequence[int], stride: Sequence[int],
            dtype: torch.dtype) -> Any:
    """The spec of a DTensor of global ``shape`` and ``stride`` (``DTensorSpec`` and ``TensorMeta``, private)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    return DTensorSpec(mesh, tuple(placements), tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), dtype))


def wrap_local(local: torch.Tensor, spec: Any, requires_grad: bool) -> Any:
    """A DTensor of the local tensor ``local`` with ``spec``: DTensor's constructor, which ``from_local``
    ends with; no autograd edge to ``local`` and no check (the caller's spec is right by construction)."""
    from torch.distributed.tensor import DTensor

    return DTensor(local, spec, requires_grad=requires_grad)


def broadcast_prefix(prefix: Any, tree: Any, is_leaf: Any = None) -> list[Any] | None:
    """Each leaf of ``prefix`` repeated over the leaves of the tree structure ``tree`` it stands for, flat
    (``None``: ``prefix`` is no pytree prefix of ``tree``): ``torch.utils._pytree._broadcast_to_and_flatten``."""
    return pytree._broadcast_to_and_flatten(prefix, tree, is_leaf=is_leaf)


def trace_id() -> int:
    """Which trace dynamo is making now (0 outside one): ``torch._guards.TracingContext.try_get()``,
    private. A graph break ends a trace and the code after it is traced anew, under another id.
    (Callers under torch.compile wrap it as a constant of the trace; not here, where decorating at
    import would load torch._dynamo with every realize.)"""
    context = torch._guards.TracingContext.try_get()
    return 0 if context is None else id(context)


_TRACE_TIME_ERRORS: dict[type, type] = {}


def trace_time_error(cls: type[MeshError]) -> type[MeshError]:
    """A subclass of ``cls`` that torch.compile re-raises unchanged from a trace.

    Private API: dynamo passes a ``torch._dynamo.exc.UserError`` through as it is, and wraps any
    other exception raised while tracing in its own error. Made on first use (while tracing, so
    ``torch._dynamo`` is loaded already).
    """
    made = _TRACE_TIME_ERRORS.get(cls)
    if made is None:
        from torch._dynamo.exc import UserError, UserErrorType

        def __init__(self: Any, message: str) -> None:
            UserError.__init__(self, UserErrorType.INVALID_INPUT, message)
            self.mesh = None

        made = _TRACE_TIME_ERRORS[cls] = type(cls.__name__, (cls, UserError),
                                              {"__init__": __init__, "__module__": cls.__module__,
                                               "__str__": lambda self: str(self.args[0])})
    return made


@torch.compiler.assume_constant_result
def raise_while_tracing(vma: bool, message: str) -> None:
    """Raise, while torch.compile traces, the ``VmaError`` (``vma``) or ``MeshError`` eager mode raises.

    Raised in traced code, torch would report its own "Observed exception" (with ``fullgraph=True``;
    torch 2.11 always); raised from here, in Python while tracing, it is an instance of our class
    that torch passes on as it is (the same message; torch appends where in the user's code it
    happened). The regions raise their type errors so, and ``Pending.is_completed`` its own.
    """
    raise trace_time_error(VmaError if vma else MeshError)(message)


# Whether a ``TorchFunctionMode`` is active (a typed ``shard_map`` region): private ``torch._C`` API,
# bound directly (no wrapper call: the collectives ask on every call).
torch_function_mode_active = torch._C._is_torch_function_mode_enabled


def global_rank() -> int:
    """This process's rank in the default group."""
    return dist.get_rank()


def world_size() -> int:
    """The default group's size."""
    return dist.get_world_size()


def set_group_desc(pg: Any, desc: str) -> None:
    """Rename a process group's description (``ProcessGroup._set_group_desc``, private)."""
    pg._set_group_desc(desc)


def group_members(pg: Any) -> list[int]:
    """The global ranks of process group ``pg``, in group-rank order."""
    return dist.get_process_group_ranks(pg)


UNREALIZED_GROUP = "functional_mesh:unrealized:{}"  # a group name torch cannot resolve: the axis has no group


def device_mesh_from_groups(groups: Sequence[Any], device_type: str, submesh: np.ndarray,
                            names: tuple[str, ...], every_group: np.ndarray) -> DeviceMesh:
    """A torch ``DeviceMesh`` over existing groups, one per axis (no new group); ``every_group``
    (``(n_groups, *submesh.shape)``) keys it in a compile cache (:func:`_mesh_cache_key`).

    A ``None`` group (an axis left out by ``realize(axes=...)``) gets the name
    ``functional_mesh:unrealized:<axis>``, so anything that asks torch for it fails naming the axis.
    """
    mesh = torch.from_numpy(np.ascontiguousarray(submesh))
    if all(g is not None for g in groups):
        dm = DeviceMesh.from_group(list(groups), device_type, mesh=mesh, mesh_dim_names=names)
    else:
        dm = DeviceMesh(device_type, mesh.to(torch.int), mesh_dim_names=names, _init_backend=False)
        dm._dim_group_names = [UNREALIZED_GROUP.format(n) if g is None else g.group_name
                               for g, n in zip(groups, names, strict=True)]
        dm._pg_registry.update({g.group_name: g for g in groups if g is not None})
    setattr(dm, _JOB, (every_group.shape, tuple(every_group.reshape(-1).tolist())))
    return dm


def flat_layout(layout: Any) -> Any:
    """The 1-dim ``_MeshLayout`` torch gives a flattened mesh of ``layout`` (private, feature-detected).

    torch >= 2.13: ``_MeshLayout([layout.collapse()])`` (a list of flat layouts); torch 2.11 and 2.12:
    ``layout.coalesce()``, nested when it keeps several modes (what their ``_flatten`` computes).
    """
    if hasattr(layout, "collapse"):
        return _MeshLayout([layout.collapse()])
    flat = layout.coalesce()
    return flat.nest() if len(flat) > 1 else flat


def register_flattened(root: DeviceMesh, names: tuple[str, ...], pg: Any) -> None:
    """Make ``root[names]._flatten()`` find the product group ``pg`` instead of creating a new one.

    torch flattens meshes itself (FSDP2 over ``("dp_shard", "cp")``) and reuses one cached by name in
    the root's ``_flatten_mapping`` with the same layout: so it is built here, over realize's group.
    """
    flat = _flattened(root, flat_layout(root[names]._layout), "_".join(names), [pg.group_name])
    root._pg_registry[pg.group_name] = pg
    root._flatten_mapping["_".join(names)] = flat


def rename_flattened(root: DeviceMesh, flattened: Mapping[str, tuple[str, ...]]) -> None:
    """Make ``root``'s flattened meshes exactly ``{name: dims}``, each over the group ``root`` holds already.

    For a framework's own names (accelerate's "dp", also over one dim): several dims take the product
    :func:`register_flattened` put under the dims joined by "_", one dim its group with
    :func:`flat_layout`'s layout; joined names not asked for are dropped.
    """
    made = root._flatten_mapping
    named = {}
    for name, dims in flattened.items():
        source = root[dims[0]] if len(dims) == 1 else made["_".join(dims)]
        layout = flat_layout(source._layout) if len(dims) == 1 else source._layout
        named[name] = _flattened(root, layout, name, list(source._dim_group_names))
    made.clear()
    made.update(named)


def _flattened(root: DeviceMesh, layout: Any, name: str, group_names: list[str]) -> DeviceMesh:
    """A flattened mesh of ``root`` named ``name``, over groups ``root`` holds (no new group)."""
    flat = DeviceMesh(root.device_type, _layout=layout, _rank_map=root._rank_map, mesh_dim_names=(name,),
                      _root_mesh=root, _init_backend=False)
    flat._dim_group_names = group_names
    return flat


def forget_sharding_plans() -> None:
    """Empty DTensor's sharding-propagation caches (no-op where this torch has none).

    They key a plan by the ``DeviceMesh``, which compares equal across handles of an equal mesh:
    after ``clear_cache``/``abort`` a new handle's DTensor op would get a plan holding the old,
    destroyed groups ("Could not resolve the process group registered under the name N").
    """
    clear = getattr(_DTENSOR_DEBUG, "_clear_sharding_prop_cache", None)
    if clear is not None:
        clear()


def unregister_flattened(root: DeviceMesh, names: tuple[str, ...]) -> None:
    """Undo :func:`register_flattened` (the product group was destroyed or aborted).

    The flattened mesh refers back to its root (``_root_mesh``) and the root to it
    (``_flatten_mapping``): a reference cycle that keeps the root's groups (``_pg_registry``) alive
    until the cycle collector runs. Dropping the root's entry leaves them to reference counting.
    """
    root._flatten_mapping.pop("_".join(names), None)


def mesh_parts(dm: Any) -> tuple[tuple[str, ...], list[tuple[Any, Any]], list[int]]:
    """``(dim names, per-dim (shape, stride), flat rank map)`` of a torch ``DeviceMesh``: all its groups."""
    if not isinstance(dm, DeviceMesh):
        raise TypeError(requires("from_device_mesh", "a torch DeviceMesh", "dm", dm))
    names = dm.mesh_dim_names or tuple(f"dim{i}" for i in range(dm.ndim))
    return tuple(names), [(axis.shape, axis.stride) for axis in dm._layout], dm._rank_map.reshape(-1).tolist()


# -- what this torch's dynamo can trace (probed once, where it is first needed) ----------------------------


class _ProbeMesh:
    """Stands in for a realized mesh in :func:`region_trace_failure`: a plain object with slots."""

    __slots__ = ("axes",)

    def __init__(self, axes: tuple[str, ...]) -> None:
        self.axes = axes


class _ProbePlan:
    """Stands in for a region's plan: an object holding a frozenset of axis names."""

    __slots__ = ("axes",)

    def __init__(self, axes: frozenset[str]) -> None:
        self.axes = axes


def _probe_plan_of(mesh: _ProbeMesh, axis: str) -> _ProbePlan:
    return _ProbePlan(frozenset(mesh.axes) | frozenset((axis,)))


def _probe_region(x: torch.Tensor) -> torch.Tensor:
    # what a compiled region does on entry and at its first op, in miniature: pass an object it
    # does not know as an argument of a function whose result is a constant of the trace (the
    # region's plan of the mesh), then take set differences with the frozenset that constant holds
    # (the default rule's casts: `x in s` on it)
    plan = _PROBE_PLAN_OF(_PROBE_MESH, "b")
    joined = plan.axes | frozenset(("c",))
    return x + len(joined - plan.axes)


_PROBE_MESH = _ProbeMesh(("a",))
_PROBE_PLAN_OF: Any = None  # _probe_plan_of as a constant of the trace, made on first use
_REGION_TRACE: list[str | None] = []  # the probe's answer, once known


def region_trace_failure() -> str | None:
    """Why this torch's dynamo cannot trace a ``shard_map`` region (``None`` where it can).

    A feature probe, run once per process on the first compiled region, inside its trace, and cached:
    it compiles a miniature of a region (:func:`_probe_region`) and answers dynamo's error, type and
    first line. What it finds on 2.11 and 2.12, and what it costs: docs/design.md, "Torch versions".
    """
    if not _REGION_TRACE:
        global _PROBE_PLAN_OF
        if _PROBE_PLAN_OF is None:
            _PROBE_PLAN_OF = torch.compiler.assume_constant_result(_probe_plan_of)
        from torch._dynamo import utils as dynamo_utils

        events = _compile_event_stacks()
        saved = [list(stack) for stack in events]
        counters = getattr(dynamo_utils, "counters", None)  # what a program counts (graphs, breaks)
        counted = {key: counter.copy() for key, counter in counters.items()} if counters is not None else None
        try:
            torch.compile(_probe_region, backend="eager", fullgraph=True, dynamic=False)(torch.zeros(()))
        except Exception as error:  # noqa: BLE001 - any failure to trace is the answer
            first = str(error).strip().splitlines()
            _REGION_TRACE.append(f"{type(error).__name__}: {first[0] if first else ''}".rstrip(": "))
        else:
            _REGION_TRACE.append(None)
        finally:
            for stack, before in zip(events, saved, strict=True):
                stack[:] = before
            if counters is not None and counted is not None:  # the probe's graph is no graph of the program's
                counters.clear()
                counters.update(counted)
    return _REGION_TRACE[0]


def _compile_event_stacks() -> list[list[Any]]:
    """The enclosing compile's event stacks (private ``torch._dynamo.utils.get_chromium_event_logger()``,
    ``get_stack``/``get_pt2_compile_substack``; feature-detected, none where absent).

    A compile inside a trace ends the events of the trace around it on torch 2.11/2.12 (which then logs
    "Start event not in stack" as it ends them again): :func:`region_trace_failure` puts them back.
    """
    from torch._dynamo import utils

    logger = getattr(utils, "get_chromium_event_logger", None)
    if logger is None:
        return []
    events = logger()
    return [getattr(events, name)() for name in ("get_stack", "get_pt2_compile_substack") if hasattr(events, name)]
