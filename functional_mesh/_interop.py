"""Bridges to torch values: DTensors from full tensors, and shardings and meshes read back from torch.

Only ``reshard`` communicates (``redistribute`` on one mesh, ``_reshard.py`` across two). Under
``torch.compile`` what depends on the meshes alone is a plan, a constant of the graph:
docs/compile.md, "DTensor boundaries".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import DTensor

from . import _torch
from ._errors import MeshError, requires
from ._handle import current_mesh, resolve_mesh
from ._layout import Layout
from ._mesh import Mesh
from ._reshard import across
from ._reshard_plan import ShapeDtypeStruct
from ._sharding import NamedSharding, PartitionSpec, chunk_block, spec_from_plan

__all__ = ["distribute", "from_device_mesh", "reshard", "sharding_of"]


def from_device_mesh(dm: Any) -> Mesh:
    """The pure ``Mesh`` of an existing torch ``DeviceMesh`` (all its groups, not just this rank's).

    A dim without a name is called ``dim<i>``. No communication, no group made.

    Args:
        dm: a torch ``DeviceMesh`` (``init_device_mesh``, a slice, a flattened mesh, ``rm.device_mesh``).

    Returns:
        The mesh value: realize it to get a ``RealizedMesh`` over groups of its own.

    Raises:
        TypeError: ``dm`` is not a ``DeviceMesh``.

    Examples:
        >>> mesh = rm.mesh
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> dm = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
        >>> fm.from_device_mesh(dm["tp"]).groups().tolist()  # every rank's group, not only this one's
        [[0, 1], [2, 3], [4, 5], [6, 7]]
        >>> fm.from_device_mesh(rm.device_mesh) == mesh
        True
    """
    names, modes, ranks = _torch.mesh_parts(dm)
    return Mesh(names, tuple(Layout(shape, stride) for shape, stride in modes), ranks)


def distribute(tensor: torch.Tensor, sharding: NamedSharding, *, mesh: Any = None) -> DTensor | None:
    """The DTensor whose local shard is ``tensor[sharding.local_slices(tensor.shape, rank)]``.

    Nothing is communicated (``distribute_tensor`` scatters from one rank).

    Args:
        tensor: the full value, the same on every rank.
        sharding: where each block goes: a ``NamedSharding`` on the realized mesh's ``Mesh``.
        mesh: the ``RealizedMesh``; ``None`` = the current ``with rm:`` mesh.

    Returns:
        The DTensor on ``rm.device_mesh`` (``_StridedShard`` where the spec needs it), or ``None``
        on a rank outside the mesh (it has no shard).

    Raises:
        TypeError: ``tensor`` is not a tensor, ``sharding`` not a ``NamedSharding``, or ``mesh``
            not a ``RealizedMesh``.
        MeshError: ``sharding.mesh`` is not the realized mesh's, the tensor has fewer dims than the
            spec, the spec has unreduced axes (a full tensor is no pending sum), or ``mesh=None``
            outside ``with rm:``.

    Examples:
        >>> mesh = rm.mesh
        >>> x = fm.distribute(torch.arange(8.0), fm.NamedSharding(mesh, P("tp")), mesh=rm)
        >>> x.shape, x.to_local(), x.placements
        (torch.Size([8]), tensor([2., 3.]), (Replicate(), Shard(dim=0)))
    """
    rm = resolve_mesh("distribute", mesh)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(requires("distribute", "a NamedSharding", "sharding", sharding))
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(requires("distribute", "a torch.Tensor", "tensor", tensor))
    plan = _distribute_plan(rm, sharding.mesh, sharding.spec.key)
    if plan.problem:
        raise MeshError(plan.problem, mesh=rm.mesh)
    rank = plan.rank  # checked on every rank, in the mesh or not: the same inputs, the same error
    if rank > tensor.dim():
        raise MeshError(requires("distribute", f"a tensor with at least as many dims as the spec ({rank})",
                                 "tensor.shape", tuple(tensor.shape)) + f" for spec {plan.spec}", mesh=rm.mesh)
    if plan.splits is None:
        return None
    local = tensor[chunk_block(tensor.shape, plan.splits)].contiguous().clone()
    return DTensor.from_local(local, rm.device_mesh, plan.placements, run_check=False,
                              shape=tensor.shape, stride=tensor.stride())


class _DTensorPlan(NamedTuple):
    """What ``distribute`` (a DTensor from a full tensor) or ``reshard`` (a DTensor redistributed) needs of
    the meshes: a function of them alone, so a constant of a compiled graph."""

    problem: str  # the error message, or "" when the call is valid
    placements: tuple[Any, ...] = ()  # the sharding's DTensor placements
    # distribute: per spec dim, (axis size, this rank's index along it) per splitting axis, major
    # first; None on a rank outside the mesh
    splits: tuple[tuple[tuple[int, int], ...], ...] | None = None
    spec: str = ""  # the spec, for messages (dynamo cannot format a PartitionSpec)
    rank: int = 0  # the spec's rank: the fewest dims a tensor needs
    other_mesh: bool = False  # reshard: the sharding is on another mesh (eagerly, a reshard across meshes)


# Under torch.compile the two plans run as plain Python while dynamo traces (their numpy, their
# generator arguments to math.prod and building a torch DeviceMesh would each break the graph, or
# fail: dynamo cannot build a DeviceMesh), and their answers are constants of the graph. Sound
# because dynamo guards on their arguments: a realized mesh, a Mesh and a DTensor's torch mesh by
# identity, the spec's entries by value, so another one is traced, and planned, anew. They take
# the spec's entries, not the NamedSharding: one built inside the compiled function exists only as
# dynamo's record while it traces, and its entries are constants either way (a Mesh made there is
# refused with a message, not an internal error of dynamo's).
@torch.compiler.assume_constant_result
def _distribute_plan(rm: Any, mesh: Mesh, key: tuple[Any, ...]) -> _DTensorPlan:
    if _built_while_tracing(mesh):
        return _DTensorPlan(_BUILT_WHILE_TRACING.format(api="distribute"))
    if mesh != rm.mesh:
        return _DTensorPlan(requires("distribute", "the sharding's mesh to be the realized mesh", "sharding.mesh", mesh,
                              rm.mesh))
    spec = PartitionSpec.from_key(key)
    if spec.unreduced:
        return _DTensorPlan(requires("distribute", "a sharding without unreduced axes (a full tensor is no pending "
                                     "sum)", "sharding.spec", spec)
                            + "; distribute it sharded or replicated, then make a pending sum inside a region "
                            "(fm.pcast(x, axis, to='unreduced')), or fm.reshard a DTensor to it")
    if rm.coordinate is None:
        return _DTensorPlan("", spec=str(spec), rank=len(spec))
    rm.device_mesh  # noqa: B018 - built now (it is made on first use), outside any trace
    index = dict(zip(rm.axis_names, rm.coordinate, strict=True))
    splits = tuple(tuple((rm.axis_size(a), index[a]) for a in spec.axes_of(d)) for d in range(len(spec)))
    return _DTensorPlan("", NamedSharding(mesh, spec).placements, splits, str(spec), len(spec))


_BUILT_WHILE_TRACING = ("`{api}` requires, under torch.compile, a sharding whose Mesh was made outside the compiled "
                        "function, but got one made inside it; make the mesh (or use rm.mesh) before compiling")


def _built_while_tracing(mesh: Mesh) -> bool:
    """Whether ``mesh`` was made inside the function dynamo traces: then a plan gets dynamo's unfinished
    object (its attributes are only in dynamo's record of the trace, so reading its axis names fails), not a
    Mesh."""
    return not hasattr(mesh, "axis_names")


def sharding_of(dtensor: DTensor) -> NamedSharding:
    """The ``NamedSharding`` of an existing DTensor (``Shard``, ``_StridedShard``, ``Replicate``, ``Partial``).

    Read from the DTensor's torch mesh and placements alone: no communication. A ``Partial("sum")``
    placement on a mesh dim is a pending sum over that axis: ``P(..., unreduced={axis})`` (the
    DTensor's ``full_tensor()`` is the sum of the members' local tensors); ``Partial("max")``,
    ``Partial("min")`` add ``unreduced_kind=``.

    Args:
        dtensor: a DTensor on any torch ``DeviceMesh``.

    Returns:
        Its sharding, on the ``Mesh`` of its torch mesh (:func:`from_device_mesh`).

    Raises:
        TypeError: ``dtensor`` is not a DTensor.
        MeshError: a ``Partial`` placement other than a sum, max or min (``avg``, ...:
            redistribute it first), or placements no ``PartitionSpec`` can say.

    Examples:
        >>> mesh = rm.mesh
        >>> x = fm.distribute(torch.ones(4, 8), fm.NamedSharding(mesh, P("tp", "dp")), mesh=rm)
        >>> fm.sharding_of(x)
        NamedSharding(Mesh(dp=2, tp=4), P('tp', 'dp'))
        >>> from torch.distributed.tensor import DTensor, Partial, Shard
        >>> fm.sharding_of(DTensor.from_local(torch.ones(2, 8), rm.device_mesh, [Partial(), Shard(0)]))
        NamedSharding(Mesh(dp=2, tp=4), P('tp', unreduced={'dp'}))
    """
    if not isinstance(dtensor, DTensor):
        raise TypeError(requires("sharding_of", "a DTensor", "dtensor", dtensor))
    mesh = from_device_mesh(dtensor.device_mesh)
    plan = _torch.from_placements("sharding_of", dtensor.placements, mesh)
    return NamedSharding(mesh, spec_from_plan("sharding_of", mesh, plan))


def reshard(x: Any, sharding: Any, *, mesh: Any = None, async_op: bool = False,
            bucket_bytes: int | None = None) -> Any:
    """``x`` with the layout of ``sharding``: explicit communication, on one mesh or across two.

    On one mesh (``sharding.mesh`` is the DTensor's), DTensor's ``redistribute``: a collective
    call of that mesh's ranks. Across meshes, a call of every rank of both, with a
    ``ShapeDtypeStruct`` where a rank holds no source block: docs/across_meshes.md, "The call".

    Args:
        x: a DTensor, a ``ShapeDtypeStruct`` (a rank without a source block), or a pytree of them.
        sharding: a ``NamedSharding``, a ``PartitionSpec`` (on ``mesh``, or the current mesh), or
            a pytree of them matching ``x`` (or a prefix of it).
        mesh: across meshes, the destination's ``RealizedMesh`` on its ranks (default: the current
            mesh when it is the destination's); on one mesh, where a bare ``PartitionSpec`` lives.
        async_op: ``True``: an ``fm.Pending`` at once; its ``wait()`` gives the result.
        bucket_bytes: across meshes, the most bytes one exchange carries between ranks; ``None``: one bucket.

    Returns:
        On one mesh, a DTensor with ``sharding``'s placements. Across meshes, the tree of DTensors
        on a rank of the destination, ``None`` elsewhere. A ``Pending`` of it with ``async_op=True``.

    Raises:
        TypeError: a leaf neither a DTensor nor a ``ShapeDtypeStruct``, a sharding neither a
            ``NamedSharding`` nor a ``PartitionSpec``, or ``mesh`` not a ``RealizedMesh``.
        MeshError: a bare ``PartitionSpec`` with no mesh; across meshes, what docs/across_meshes.md
            ("Errors") lists: this rank in neither mesh, ``mesh=`` missing or wrong, an unreduced
            source, a leaf on the wrong side, leaves bound for several meshes, trees that do not
            match, ranks that asked for different calls.

    Examples:
        >>> mesh = rm.mesh
        >>> x = fm.distribute(torch.arange(8.0), fm.NamedSharding(mesh, P("tp")), mesh=rm)
        >>> y = fm.reshard(x, fm.NamedSharding(mesh, P()))  # an all-gather over tp
        >>> fm.sharding_of(y), y.to_local().shape
        (NamedSharding(Mesh(dp=2, tp=4), P()), torch.Size([8]))
    """
    if isinstance(x, DTensor) and not async_op and bucket_bytes is None:
        target = _as_sharding(sharding, mesh)
        dm = x.device_mesh
        plan = _reshard_plan(dm, target.mesh, target.spec.key, _torch.global_rank())
        if not plan.problem:
            return x.redistribute(dm, plan.placements)
        if not plan.other_mesh or torch.compiler.is_compiling():
            raise MeshError(plan.problem, mesh=target.mesh)
    return _across(x, sharding, mesh, async_op, bucket_bytes)


def _as_sharding(sharding: Any, mesh: Any) -> NamedSharding:
    """A ``NamedSharding``, or a bare ``PartitionSpec`` put on ``mesh`` (default: the current mesh)."""
    if isinstance(sharding, NamedSharding):
        return sharding
    if isinstance(sharding, PartitionSpec):
        return NamedSharding(resolve_mesh("reshard", mesh).mesh, sharding)
    raise TypeError(requires("reshard", "a NamedSharding or a PartitionSpec", "sharding", sharding))


def _is_value(v: Any) -> bool:
    return isinstance(v, (torch.Tensor, ShapeDtypeStruct))


def _is_sharding(v: Any) -> bool:
    return isinstance(v, (NamedSharding, PartitionSpec))


def _across(x: Any, sharding: Any, mesh: Any, async_op: bool, bucket_bytes: int | None) -> Any:
    """``reshard`` of a tree, or across meshes: the leaves and their shardings, for the transport."""
    if bucket_bytes is not None and (isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int)
                                     or bucket_bytes <= 0):
        raise MeshError(requires("reshard", "bucket_bytes=None or a positive int", "bucket_bytes", bucket_bytes))
    pytree = _torch.pytree
    leaves, tree = pytree.tree_flatten(x, is_leaf=_is_value)
    flat: list[Any] | None
    if _is_sharding(sharding):
        flat = [sharding] * len(leaves)
    else:
        if isinstance(sharding, list) and isinstance(x, tuple):
            sharding = tuple(sharding)
        flat = _torch.broadcast_prefix(sharding, tree, is_leaf=_is_sharding)
        if flat is None:
            raise MeshError(requires("reshard", "a sharding tree that matches the value's tree (or a prefix of it)",
                                     "sharding", sharding) + f"; the value has structure {tree}")
    if not leaves:
        return x
    current = current_mesh()
    srcs, dsts = [], []
    for i, (leaf, s) in enumerate(zip(leaves, flat, strict=True)):
        if isinstance(leaf, DTensor):
            srcs.append(sharding_of(leaf))
        elif isinstance(leaf, ShapeDtypeStruct):
            if not isinstance(leaf.sharding, NamedSharding):
                raise MeshError(requires("reshard", "a ShapeDtypeStruct with the source's NamedSharding (sharding=)",
                                         f"leaf {i}.sharding", leaf.sharding))
            srcs.append(leaf.sharding)
        else:
            raise TypeError(requires("reshard", "a DTensor or an fm.ShapeDtypeStruct for each leaf", f"leaf {i}", leaf))
        if isinstance(s, PartitionSpec):
            where = mesh if mesh is not None else current
            if where is None:
                raise MeshError(requires("reshard", "mesh=<RealizedMesh> or an enclosing `with rm:` block for a bare "
                                         "PartitionSpec", "sharding", s))
            s = NamedSharding(resolve_mesh("reshard", where).mesh, s)
        elif not isinstance(s, NamedSharding):
            raise TypeError(requires("reshard", "a NamedSharding or a PartitionSpec", f"sharding of leaf {i}", s))
        dsts.append(s)
    if mesh is None and current is not None and current.mesh == dsts[0].mesh:
        mesh = current
    return across(leaves, srcs, dsts, mesh, lambda outs: pytree.tree_unflatten(outs, tree),
                  async_op=async_op, bucket_bytes=bucket_bytes)


@torch.compiler.assume_constant_result
def _reshard_plan(dm: Any, mesh: Mesh, key: tuple[Any, ...], rank: int) -> _DTensorPlan:
    if _built_while_tracing(mesh):
        return _DTensorPlan(_BUILT_WHILE_TRACING.format(api="reshard"))
    submesh = mesh.group_of(rank)
    if tuple(dm.mesh_dim_names or ()) != mesh.axis_names or submesh is None or dm.mesh.tolist() != submesh.tolist():
        return _DTensorPlan(requires("reshard", "a sharding on the mesh the DTensor lives on", "sharding.mesh", mesh,
                              f"the DTensor's mesh {from_device_mesh(dm)!r}")
                            + " (under torch.compile; eagerly a reshard across meshes)", other_mesh=True)
    return _DTensorPlan("", NamedSharding(mesh, PartitionSpec.from_key(key)).placements)
