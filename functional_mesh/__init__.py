"""functional_mesh: device meshes as values, process groups at one effectful step.

The pure layer (``Mesh``, ``make_mesh``, layouts) imports without torch. The effectful and
torch-facing parts (``realize``, collectives, interop) load on first use (PEP 562), so
planning a mesh needs no torch at all.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import MeshError, UnknownAxisError
from .layout import Layout
from .mesh import Mesh, MeshShape, make_mesh
from .order import mesh_from_order, order_axes
from .sharding import NamedSharding, P, PartitionSpec
from .visualize import visualize, visualize_sharding

__version__ = "0.1.0"

# name -> submodule that defines it; loaded on first attribute access.
_LAZY: dict[str, str] = {
    "realize": "realize",
    "RealizedMesh": "realize",
    "CacheInfo": "realize",
    "cache_info": "realize",
    "clear_cache": "realize",
    "current_mesh": "realize",
    "from_device_mesh": "interop",
    "distribute": "interop",
    "sharding_of": "interop",
    "psum": "collectives",
    "pmean": "collectives",
    "pvary": "collectives",
    "all_gather": "collectives",
    "psum_scatter": "collectives",
    "all_to_all": "collectives",
    "ppermute": "collectives",
    "axis_index": "collectives",
    "axis_size": "collectives",
}

__all__ = [
    "Layout", "Mesh", "MeshError", "MeshShape", "NamedSharding", "P", "PartitionSpec", "UnknownAxisError",
    "make_mesh", "mesh_from_order", "order_axes", "visualize", "visualize_sharding", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'functional_mesh' has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    # Importing a submodule binds it as a package attribute: for ``realize`` (module and
    # function share the name) that shadows the function, so bind the function back.
    for lazy, where in _LAZY.items():
        if where == module:
            globals()[lazy] = getattr(loaded, lazy)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
