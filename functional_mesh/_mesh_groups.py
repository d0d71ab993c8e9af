"""A mesh's groups: where its ranks are, and each rank's place among them.

Pure functions over a mesh's parts (its axes' layouts, device list and family: the complement of
its axes, ``_layout.complement_modes``) behind :class:`~functional_mesh.Mesh`'s ``groups``,
``coordinate``, ``group_of``, ``host_span`` and ``ranks``. Groups come in torch's order; a coordinate
costs O(ndim) whatever the world size. The ``mesh`` argument rides on the errors only.
"""

from __future__ import annotations

import math

import numpy as np

from . import _layout as L
from ._devices import DeviceList
from ._errors import MeshError, requires
from ._validate import as_int

__all__ = ["coordinate", "group_of", "groups", "host_span", "num_groups", "only_group"]

Layouts = tuple[L.Layout, ...]


def num_groups(family: L.Modes) -> int:
    """The number of groups: one per offset of the family."""
    return math.prod([s for s, _ in family])


def groups(layouts: Layouts, devices: DeviceList) -> np.ndarray:
    """Every group's ranks, shape ``(groups, *axis sizes)``, groups in torch's order, each row-major."""
    return devices.take(L.groups(L.concat(*layouts), len(devices))).reshape((-1, *(lay.size for lay in layouts)))


def _index(api: str, devices: DeviceList, rank: object, mesh: object) -> int | None:
    """Position of global ``rank`` in the device list, or ``None`` when absent."""
    rank = as_int(api, "rank", rank)
    if rank < 0:
        raise MeshError(requires(api, "a non-negative global rank", "rank", rank), mesh=mesh)
    return devices.index_of(rank)


def coordinate(layouts: Layouts, devices: DeviceList, rank: object, mesh: object) -> tuple[int, ...] | None:
    """A rank's coordinate in its group, one index per axis (``None``: not in the device list)."""
    index = _index("Mesh.coordinate", devices, rank, mesh)
    if index is None:
        return None
    return tuple(L.digits_value(lay.modes, index) for lay in layouts)


def group_of(layouts: Layouts, devices: DeviceList, family: L.Modes, rank: object, mesh: object) -> np.ndarray | None:
    """The ranks of the group holding ``rank``, shape ``axis sizes`` (``None``: not in the device list)."""
    index = _index("Mesh.group_of", devices, rank, mesh)
    if index is None:
        return None
    offset = sum(((index // d) % s) * d for s, d in family)
    return devices.take(offset + L.indices(L.concat(*layouts))).reshape(tuple(lay.size for lay in layouts))


def host_span(axis_names: tuple[str, ...], layouts: Layouts, devices: DeviceList, ranks_per_host: object,
              mesh: object) -> dict[str, str]:
    """Per axis: whether its groups lie on one host each, span a host per member, or are mixed."""
    api = "Mesh.host_span"
    k = as_int(api, "ranks_per_host", ranks_per_host)
    if k < 1:
        raise MeshError(requires(api, "a positive number of ranks per host", "ranks_per_host", k), mesh=mesh)
    k = min(k, devices.max() + 1)  # one host holds every device: same answer, no overflow
    span: dict[str, str] = {}
    for name, lay in zip(axis_names, layouts, strict=True):
        hosts = np.sort(groups((lay,), devices) // k, axis=1)  # each row: the hosts of one group of the axis
        one_host, all_apart = (hosts[:, 0] == hosts[:, -1]).all(), (hosts[:, 1:] != hosts[:, :-1]).all()
        span[name] = "intra-host" if one_host else "cross-host" if all_apart else "mixed"
    return span


def only_group(layouts: Layouts, devices: DeviceList, family: L.Modes, mesh: object) -> np.ndarray:
    """The ranks of the one group, shape ``axis sizes``; a ``MeshError`` for a family."""
    n = num_groups(family)
    if n != 1:
        raise MeshError(
            f"`Mesh.ranks` requires a mesh with one group, but got num_groups={n} "
            f"({mesh!r}); use mesh.groups() or mesh.group_of(rank)", mesh=mesh)
    return groups(layouts, devices)[0]
