"""A mesh's groups: where its ranks are, and each rank's place among them.

:class:`Groups` is the part of :class:`~functional_mesh.Mesh` that reads the device list. A mesh
whose axes cover fewer positions than its device list stands for a *family* of submeshes, one
per offset of the complement of its axes (``_layout.complement_modes``); the family is
enumerated in torch's order, so ``mesh.groups()`` compares with a ``DeviceMesh`` line by line.
A rank's coordinate is read off the digits of its position in O(ndim) for a symbolic device
list, whatever the world size.

Examples:
    >>> import functional_mesh as fm
    >>> tp = fm.make_mesh((2, 4), ("dp", "tp"))["tp"]
    >>> tp.num_groups, tp.group_of(6).tolist(), tp.coordinate(6)
    (2, [4, 5, 6, 7], (2,))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _layout as L
from ._errors import MeshError, requires
from ._validate import as_int

__all__ = ["Groups"]


class Groups:
    """The groups of a :class:`~functional_mesh.Mesh` and each rank's place in them.

    A part of ``Mesh`` (no fields of its own): it reads the fields below, which ``Mesh`` sets, and
    ``Shape``'s ``axis_names``, ``axis_sizes`` and ``layout``, and selects axes (``mesh[name]``).
    """

    __slots__ = ()
    _layouts: tuple[L.Layout, ...]
    _devices: Any  # the DeviceList
    _complement: L.Modes  # the modes of the group offsets, outermost first: the family

    @property
    def num_devices(self) -> int:
        """Length ``N`` of the device list (all groups together)."""
        return len(self._devices)

    @property
    def devices(self) -> np.ndarray:
        """The device list as a read-only flat int64 array (materialised on demand)."""
        return self._devices.to_array()

    @property
    def device_list(self) -> Any:
        """The device list value (a ``DeviceList``), shared with every derived mesh."""
        return self._devices

    @property
    def num_groups(self) -> int:
        """Number of submeshes (groups) this mesh stands for."""
        return math.prod([s for s, _ in self._complement])

    def groups(self) -> np.ndarray:
        """Every group's global ranks.

        Groups come in torch's order (increasing first position in the device list); inside a
        group, ranks are row-major over the axes in mesh order.

        Returns:
            An int64 array of shape ``(num_groups, *axis_sizes)``.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 4), ("dp", "tp"))["dp"].groups().tolist()
            [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        return self._devices.take(L.groups(self.layout, len(self._devices))).reshape((-1, *self.axis_sizes))

    def _index(self, api: str, rank: int) -> int | None:
        """Position of global ``rank`` in the device list, or ``None`` when absent."""
        rank = as_int(api, "rank", rank)
        if rank < 0:
            raise MeshError(requires(api, "a non-negative global rank", "rank", rank), mesh=self)
        return self._devices.index_of(rank)

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """A rank's coordinate in its group, in mesh order.

        O(ndim) for a symbolic device list: each axis reads its own digits of the rank's position.

        Args:
            rank: a global rank.

        Returns:
            One index per axis, or ``None`` when ``rank`` is not in the device list.

        Raises:
            MeshError: a negative rank.
            TypeError: a rank that is not an int.

        Examples:
            >>> import functional_mesh as fm
            >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
            >>> mesh.coordinate(6), mesh["tp", "dp"].coordinate(6), mesh.coordinate(8)
            ((1, 2), (2, 1), None)
        """
        index = self._index("Mesh.coordinate", rank)
        if index is None:
            return None
        return tuple(L.digits_value(lay.modes, index) for lay in self._layouts)

    def group_of(self, rank: int) -> np.ndarray | None:
        """The group holding a rank. O(group size), whatever the world size.

        Args:
            rank: a global rank.

        Returns:
            The group's ranks, an int64 array of shape ``axis_sizes``; ``None`` when ``rank`` is
            not in the device list.

        Raises:
            MeshError: a negative rank.
            TypeError: a rank that is not an int.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 4), ("dp", "tp"))["dp"].group_of(6).tolist()
            [2, 6]
        """
        index = self._index("Mesh.group_of", rank)
        if index is None:
            return None
        offset = sum(((index // d) % s) * d for s, d in self._complement)
        return self._devices.take(offset + L.indices(self.layout)).reshape(self.axis_sizes)

    def host_span(self, ranks_per_host: int) -> dict[str, str]:
        """Where each axis's groups sit when hosts hold ``ranks_per_host`` consecutive ranks.

        The host of rank ``r`` is ``r // ranks_per_host`` (torchrun's numbering). O(devices).

        Args:
            ranks_per_host: ranks per host, a positive int.

        Returns:
            Per axis, in mesh order: ``"intra-host"`` when each group lies on one host (a size-1
            axis too), ``"cross-host"`` when each member of a group is on its own host, else ``"mixed"``.

        Raises:
            MeshError: ``ranks_per_host`` below 1.
            TypeError: ``ranks_per_host`` that is not an int.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 2, 4), ("dp", "cp", "tp")).host_span(ranks_per_host=8)
            {'dp': 'cross-host', 'cp': 'intra-host', 'tp': 'intra-host'}
            >>> fm.make_mesh((4, 4), ("dp", "tp")).flatten(("dp", "tp")).host_span(8)
            {'dp_tp': 'mixed'}
        """
        api = "Mesh.host_span"
        k = as_int(api, "ranks_per_host", ranks_per_host)
        if k < 1:
            raise MeshError(requires(api, "a positive number of ranks per host", "ranks_per_host", k), mesh=self)
        k = min(k, self._devices.max() + 1)  # one host holds every device: same answer, no overflow
        span: dict[str, str] = {}
        for name, size in zip(self.axis_names, self.axis_sizes, strict=True):
            hosts = np.sort(self[name].groups().reshape(-1, size) // k, axis=1)  # each row: one group's hosts
            one_host, all_apart = (hosts[:, 0] == hosts[:, -1]).all(), (hosts[:, 1:] != hosts[:, :-1]).all()
            span[name] = "intra-host" if one_host else "cross-host" if all_apart else "mixed"
        return span

    @property
    def ranks(self) -> np.ndarray:
        """The ranks of the only group, shape ``axis_sizes``; a ``MeshError`` for a family (use ``groups()``)."""
        if self.num_groups != 1:
            raise MeshError(
                f"`Mesh.ranks` requires a mesh with one group, but got num_groups={self.num_groups} "
                f"({self!r}); use mesh.groups() or mesh.group_of(rank)", mesh=self)
        return self.groups()[0]
