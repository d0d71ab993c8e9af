"""functional_mesh: device meshes as values, process groups at one effectful step.

This module only re-exports; the implementation lives in private modules (``_mesh.py``,
``_realize.py``, ...) whose layers ``README.md`` in this folder lists. The pure layer (``Mesh``,
``make_mesh``, shardings, layouts) imports without torch; the effectful and torch-facing names
(``realize``, collectives, interop) load their module on first use (PEP 562), so planning a mesh
needs no torch at all. The docstrings' examples that use ``rm`` run as rank 5 of 8 of torch's fake
backend, ``rm = realize(make_mesh((2, 4), ("dp", "tp")))`` (docs/api.md, "Examples").
"""

import importlib as _importlib  # private: dir(functional_mesh) lists the public names only
from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import layout as layout  # the public layout-algebra module: fm.layout.complement, ...
from ._errors import MeshError, UnknownAxisError
from ._layout import Layout
from ._mesh import Mesh, MeshShape, make_mesh
from ._order import mesh_from_order, order_axes
from ._reshard_plan import Move, ReshardPlan, ShapeDtypeStruct, plan_reshard
from ._sharding import NamedSharding, P, PartitionSpec
from ._visualize import visualize, visualize_sharding
from ._vma import AxisTypes, VmaError

__version__ = "0.1.0"

# name -> private module that defines it, imported on first attribute access: these modules
# import torch, which the names above never need.
_LAZY: dict[str, str] = {
    "realize": "_realize",
    "RealizedMesh": "_handle",
    "current_mesh": "_handle",
    "abort": "_handle",
    "CollectiveError": "_handle",
    "CacheInfo": "_cache",
    "cache_info": "_cache",
    "clear_cache": "_cache",
    "from_device_mesh": "_interop",
    "distribute": "_interop",
    "sharding_of": "_interop",
    "reshard": "_interop",
    "shard_map": "_shard_map",
    "typeof": "_shard_map",
    "pcast": "_collectives",
    "psum": "_collectives",
    "pmean": "_collectives",
    "pmax": "_collectives",
    "pmin": "_collectives",
    "pvary": "_collectives",
    "all_gather": "_collectives",
    "psum_scatter": "_collectives",
    "all_to_all": "_collectives",
    "ppermute": "_collectives",
    "ragged_all_to_all": "_collectives",
    "axis_index": "_collectives",
    "axis_size": "_collectives",
    "Pending": "_pending",
}

if _TYPE_CHECKING:  # the names below, for type checkers: imported here they would load torch
    from ._realize import realize as realize
    from ._handle import (RealizedMesh as RealizedMesh, current_mesh as current_mesh, abort as abort,
        CollectiveError as CollectiveError)
    from ._cache import CacheInfo as CacheInfo, cache_info as cache_info, clear_cache as clear_cache
    from ._interop import (from_device_mesh as from_device_mesh, distribute as distribute,
        sharding_of as sharding_of, reshard as reshard)
    from ._shard_map import shard_map as shard_map, typeof as typeof
    from ._collectives import (pcast as pcast, psum as psum, pmean as pmean, pmax as pmax, pmin as pmin,
        pvary as pvary, all_gather as all_gather, psum_scatter as psum_scatter, all_to_all as all_to_all,
        ppermute as ppermute, ragged_all_to_all as ragged_all_to_all, axis_index as axis_index,
        axis_size as axis_size)
    from ._pending import Pending as Pending

__all__ = [
    "AxisTypes", "Layout", "Mesh", "MeshError", "MeshShape", "Move", "NamedSharding", "P", "PartitionSpec",
    "ReshardPlan", "ShapeDtypeStruct", "UnknownAxisError", "VmaError",
    "make_mesh", "mesh_from_order", "order_axes", "plan_reshard", "visualize", "visualize_sharding", *_LAZY,
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'functional_mesh' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The public names (``__all__``, the ``layout`` module, ``__version__``) and the module's dunders;
    not the helpers this file imports, nor the private modules importing binds here (``_mesh``, ...)."""
    dunders = {n for n in globals() if n.startswith("__") and n.endswith("__")}
    return sorted({*__all__, "layout"} | dunders)
