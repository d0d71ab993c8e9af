"""functional_mesh: device meshes as values, process groups at one effectful step.

This module only re-exports; the implementation lives in private modules (``_mesh.py``,
``_realize.py``, ...) whose layers ``README.md`` in this folder lists. The pure layer (``Mesh``,
``make_mesh``, shardings, layouts) imports without torch; the effectful and torch-facing names
(``realize``, collectives, interop) load their module on first use (PEP 562), so planning a mesh
needs no torch at all. The docstrings' examples that use ``rm`` run as rank 5 of 8 of torch's fake
backend, ``rm = realize(make_mesh((2, 4), ("dp", "tp")))`` (docs/api.md, "Examples").
"""

import importlib as _importlib  # private: dir(functional_mesh) lists the public names only

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
