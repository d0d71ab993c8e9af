"""Bridges to torch values: DTensors from full tensors, and shardings and meshes read back from torch.

Nothing here creates a process group or communicates: ``distribute`` slices locally, and the
readers only look at torch objects, through the torch boundary (``_torch.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from . import _torch
from ._errors import MeshError, requires
from ._handle import resolve_mesh
from ._layout import Layout
from ._mesh import Mesh
from ._sharding import NamedSharding, spec_from_plan

__all__ = ["distribute", "from_device_mesh", "reshard", "sharding_of"]


def from_device_mesh(dm: Any) -> Mesh:
    """The pure ``Mesh`` of an existing torch ``DeviceMesh`` (all its groups, not just this rank's).

    Its groups, their order and every coordinate equal ``dm``'s (tests/fake/ checks this).
    """
    names, modes, ranks = _torch.mesh_parts(dm)
    return Mesh(names, tuple(Layout(shape, stride) for shape, stride in modes), ranks)


def distribute(tensor: torch.Tensor, sharding: NamedSharding, *, mesh: Any = None) -> DTensor | None:
    """The DTensor whose local shard is ``tensor[sharding.local_slices(tensor.shape, rank)]``.

    ``tensor`` is the full tensor on every rank; nothing is communicated. Returns ``None`` on a
    rank outside the mesh (it has no shard).
    """
    rm = resolve_mesh("distribute", mesh)
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


def sharding_of(dtensor: DTensor) -> NamedSharding:
    """The ``NamedSharding`` of an existing DTensor (``Shard``, ``_StridedShard``, ``Replicate``).

    ``Partial`` placements (pending reductions) have no sharding: a ``MeshError`` says to
    redistribute first.
    """
    if not isinstance(dtensor, DTensor):
        raise TypeError(requires("sharding_of", "a DTensor", "dtensor", dtensor))
    mesh = from_device_mesh(dtensor.device_mesh)
    plan = _torch.from_placements("sharding_of", dtensor.placements, mesh)
    return NamedSharding(mesh, spec_from_plan("sharding_of", mesh, plan))


def reshard(dtensor: DTensor, sharding: NamedSharding) -> DTensor:
    """``dtensor`` with the layout of ``sharding``: explicit communication through DTensor's ``redistribute``.

    ``sharding.mesh`` must be the mesh ``dtensor`` lives on (this rank's submesh of it, for a family
    mesh). The global value is unchanged; a ``Partial`` source is reduced on the way.
    """
    if not isinstance(dtensor, DTensor):
        raise TypeError(requires("reshard", "a DTensor", "dtensor", dtensor))
    if not isinstance(sharding, NamedSharding):
        raise TypeError(requires("reshard", "a NamedSharding", "sharding", sharding))
    dm, mesh = dtensor.device_mesh, sharding.mesh
    rank = _torch.global_rank()
    names = tuple(dm.mesh_dim_names or ())
    submesh = mesh.group_of(rank)
    if names != mesh.axis_names or submesh is None or dm.mesh.tolist() != submesh.tolist():
        raise MeshError(requires("reshard", "a sharding on the mesh the DTensor lives on", "sharding.mesh", mesh,
                                 f"the DTensor's mesh {from_device_mesh(dm)!r}"), mesh=mesh)
    return dtensor.redistribute(dm, sharding.placements)
