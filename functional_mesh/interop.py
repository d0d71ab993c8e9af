"""Bridges to torch: a ``DeviceMesh`` over realized groups, and the ``Mesh`` of a ``DeviceMesh``.

Nothing here creates a process group: ``DeviceMesh.from_group`` wraps the groups ``realize``
made, after checking that every group's members are exactly the mesh row it stands for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .errors import MeshError, requires
from .layout import Layout
from .mesh import Mesh

if TYPE_CHECKING:
    from .realize import RealizedMesh

__all__ = ["device_mesh_of", "distribute", "from_device_mesh", "sharding_of"]


def device_mesh_of(rm: RealizedMesh) -> DeviceMesh:
    """The torch ``DeviceMesh`` of a realized mesh on a member rank.

    A selection whose axes keep its root's order is the torch slice of the root's
    ``DeviceMesh`` (one torch root, which FSDP2 + TP need); any other mesh gets its own root
    from ``DeviceMesh.from_group``.
    """
    mesh = rm.mesh
    if mesh.ndim == 0:
        raise MeshError(f"`RealizedMesh.device_mesh` requires a mesh with at least one axis, but got {mesh!r}",
                        mesh=mesh)
    root = rm._root
    if root is not None and _in_order(mesh.axis_names, root.mesh.axis_names):
        root_dm = root.device_mesh
        return root_dm[mesh.axis_names if mesh.ndim > 1 else mesh.axis_names[0]]
    submesh = mesh.group_of(rm.rank)
    groups = []
    for i, name in enumerate(mesh.axis_names):
        pg = rm.group(name)
        index = tuple(slice(None) if j == i else c for j, c in enumerate(rm.coordinate))
        row = submesh[index].reshape(-1).tolist()
        members = dist.get_process_group_ranks(pg)
        if members != row:
            raise MeshError(
                f"`RealizedMesh.device_mesh` requires each axis group to hold its mesh row in mesh order, "
                f"but axis {name!r} has group ranks {members} for row {row}", mesh=mesh)
        groups.append(pg)
    return DeviceMesh.from_group(groups, rm.device_type, mesh=torch.from_numpy(np.ascontiguousarray(submesh)),
                                 mesh_dim_names=mesh.axis_names)


def _in_order(names: tuple[str, ...], root_names: tuple[str, ...]) -> bool:
    """True when ``names`` is a subsequence of ``root_names`` in the same order."""
    it = iter(root_names)
    return all(n in it for n in names)


def from_device_mesh(dm: Any) -> Mesh:
    """The pure ``Mesh`` of an existing torch ``DeviceMesh`` (all its groups, not just this rank's).

    Its groups, their order and every coordinate equal ``dm``'s (tests/fake/ checks this).
    """
    if not isinstance(dm, DeviceMesh):
        raise TypeError(requires("from_device_mesh", "a torch DeviceMesh", "dm", dm))
    layout = getattr(dm, "_layout", None)
    rank_map = getattr(dm, "_rank_map", None)
    if layout is None or rank_map is None:  # pragma: no cover - torch < 2.10
        raise MeshError("`from_device_mesh` requires a torch DeviceMesh with CuTe layouts (torch >= 2.10)")
    names = dm.mesh_dim_names or tuple(f"dim{i}" for i in range(dm.ndim))
    layouts = tuple(Layout(axis.shape, axis.stride) for axis in layout)
    return Mesh(names, layouts, rank_map.reshape(-1).tolist())


def _realized(api: str, mesh: Any) -> RealizedMesh:
    """``mesh`` or the current ``with rm:`` mesh; a pure Mesh or nothing is a clear error."""
    from .realize import RealizedMesh, current_mesh

    rm = current_mesh() if mesh is None else mesh
    if isinstance(rm, Mesh):
        raise TypeError(f"`{api}` requires a RealizedMesh, but got the pure mesh {rm!r}; call fm.realize(mesh) "
                        f"and pass its result (or use `with rm:`)")
    if rm is None:
        raise MeshError(f"`{api}` requires mesh=<RealizedMesh> or an enclosing `with rm:` block, but got neither")
    if not isinstance(rm, RealizedMesh):
        raise TypeError(requires(api, "a RealizedMesh for mesh", "mesh", rm))
    return rm


def distribute(tensor: torch.Tensor, sharding: Any, *, mesh: Any = None) -> Any:
    """The DTensor whose local shard is ``tensor[sharding.local_slices(tensor.shape, rank)]``.

    ``tensor`` is the full tensor on every rank; nothing is communicated. Returns ``None`` on a
    rank outside the mesh (it has no shard).
    """
    from torch.distributed.tensor import DTensor

    from .sharding import NamedSharding

    rm = _realized("distribute", mesh)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(requires("distribute", "a NamedSharding", "sharding", sharding))
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(requires("distribute", "a torch.Tensor", "tensor", tensor))
    if sharding.mesh != rm.mesh:
        raise MeshError(requires("distribute", "the sharding's mesh to be the realized mesh", "sharding.mesh",
                                 sharding.mesh, rm.mesh), mesh=rm.mesh)
    slices = sharding.local_slices(tuple(tensor.shape), rm.rank)
    if slices is None:
        return None
    local = tensor[slices].contiguous().clone()
    return DTensor.from_local(local, rm.device_mesh, sharding.placements, run_check=False,
                              shape=tensor.shape, stride=tensor.stride())


def sharding_of(dtensor: Any) -> Any:
    """The ``NamedSharding`` of an existing DTensor (``Shard``, ``_StridedShard``, ``Replicate``).

    ``Partial`` placements (pending reductions) have no sharding: a ``MeshError`` says to
    redistribute first.
    """
    import itertools

    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from .sharding import NamedSharding, P

    if not isinstance(dtensor, DTensor):
        raise TypeError(requires("sharding_of", "a DTensor", "dtensor", dtensor))
    mesh = from_device_mesh(dtensor.device_mesh)
    by_dim: dict[int, list[str]] = {}
    for name, placement in zip(mesh.axis_names, dtensor.placements):
        if isinstance(placement, (Shard, _StridedShard)):
            by_dim.setdefault(placement.dim, []).append(name)
        elif not isinstance(placement, Replicate):
            raise MeshError(requires("sharding_of", "Shard or Replicate placements (a Partial is a pending "
                                     "reduction: redistribute it to Replicate first)", "placement", placement,
                                     "Shard, _StridedShard, Replicate"), mesh=mesh)
    entries: list[object] = [None] * dtensor.ndim
    for dim, names in by_dim.items():
        # the tuple order whose placements are exactly these (few axes: try the orders)
        for order in itertools.permutations(names):
            spec = [None] * (dim + 1)
            spec[dim] = order
            if NamedSharding(mesh, P(*spec)).placements == tuple(
                    p if i in [mesh.axis_names.index(n) for n in names] else Replicate()
                    for i, p in enumerate(dtensor.placements)):
                entries[dim] = order
                break
        else:
            raise MeshError(requires("sharding_of", "placements that a PartitionSpec can express", "placements",
                                     tuple(dtensor.placements)), mesh=mesh)
    return NamedSharding(mesh, P(*entries))
