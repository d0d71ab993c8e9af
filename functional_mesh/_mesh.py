"""The immutable ``Mesh`` value: named axes, each a canonical layout into a device list.

The complement of the axes' block enumerates the *groups*, one submesh per translate; inside a group,
ranks are row-major over the axes in mesh order, as in torch's ``DeviceMesh``. The work is done by
pure functions that know no ``Mesh``: ``_mesh_shape``, ``_mesh_transforms`` and ``_mesh_groups``.

Examples:
    >>> mesh = make_mesh((2, 4), ("dp", "tp"))
    >>> mesh["tp", "dp"].groups().tolist()          # any order, unlike torch
    [[[0, 4], [1, 5], [2, 6], [3, 7]]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

import attrs
import numpy as np

from . import _layout as L
from . import _mesh_groups as G
from . import _mesh_transforms as T
from ._devices import DeviceList
from ._errors import MeshError, requires
from ._mesh_shape import MeshShape, MeshSize, axes_size
from ._validate import as_axis_index, as_int, as_int_array, as_name_tuple, check_unique

__all__ = ["Mesh", "MeshShape", "axes_size", "axis_layouts", "axis_position", "family_modes", "make_mesh",
           "select"]


@attrs.frozen(weakref_slot=False, init=False)  # init=False: what attrs detects anyway, said for mypy
class Mesh:
    """Named axes over canonical layouts on a device list; immutable, hashable, picklable.

    Build meshes with :func:`make_mesh`, :meth:`Mesh.from_ranks` or
    :func:`~functional_mesh.mesh_from_order`; equal parts, however derived, hash equal (O(ndim)).

    Args:
        axis_names: distinct non-empty names, one per axis.
        layouts: one :class:`~functional_mesh.Layout` per axis, from its coordinate to a position in ``devices``.
        devices: the global ranks (any iterable of distinct non-negative ints, or a
            ``DeviceList``); an int ``n`` means the symbolic ``0..n-1``.

    Raises:
        MeshError: names that repeat, or axes that overlap or do not tile the device list.
        TypeError: layouts that are not ``Layout`` objects, or names that are not str.

    Examples:
        >>> from functional_mesh import Layout
        >>> Mesh(("dp", "tp"), (Layout(2, 1), Layout(4, 2)), 8).ranks.tolist()
        [[0, 2, 4, 6], [1, 3, 5, 7]]
    """

    _axis_names: tuple[str, ...]
    _layouts: tuple[L.Layout, ...]
    _devices: DeviceList
    _complement: L.Modes = attrs.field(init=False, eq=False, repr=False)  # the group offsets' modes: the family
    _hash: int | None = attrs.field(init=False, eq=False, repr=False)  # computed on first use

    def __init__(self, axis_names: Sequence[str], layouts: Sequence[L.Layout], devices: int | object) -> None:
        names = as_name_tuple("Mesh", axis_names)
        if isinstance(layouts, L.Layout) or not isinstance(layouts, Iterable):
            raise TypeError(requires("Mesh", "a sequence of Layouts, one per axis", "layouts", layouts))
        layouts = tuple(layouts)
        for lay in layouts:
            if not isinstance(lay, L.Layout):
                raise TypeError(requires("Mesh", "a Layout per axis", "layout", lay))
        if len(layouts) != len(names):
            raise MeshError(requires("Mesh", "one layout per axis name", "layouts", layouts, names))
        if isinstance(devices, int) and not isinstance(devices, bool):
            devices = DeviceList.iota(devices, "Mesh")
        self._init(names, layouts, DeviceList.from_values("Mesh", devices))

    def _init(self, names: tuple[str, ...], layouts: tuple[L.Layout, ...], devices: DeviceList,
              comp: L.Modes | None = None, api: str = "Mesh") -> None:
        """Check the invariants and set the fields; ``comp``: a complement known unchanged."""
        check_unique(api, names, "resulting axis names" if api != "Mesh" else "axis_names")
        if comp is None:
            try:
                comp = L.complement_modes([m for lay in layouts for m in lay.modes], len(devices), layouts)
            except MeshError as e:
                raise MeshError(
                    f"`{api}` requires axes that do not overlap and tile the {len(devices)} devices, "
                    f"but got layouts {tuple(str(x) for x in layouts)} for axes {names}: {e}"
                ) from None
        object.__setattr__(self, "_axis_names", names)
        object.__setattr__(self, "_layouts", layouts)
        object.__setattr__(self, "_devices", devices)
        object.__setattr__(self, "_complement", comp)
        object.__setattr__(self, "_hash", None)

    def _derive(self, api: str, names: tuple[str, ...], layouts: tuple[L.Layout, ...], same_cover: bool) -> Mesh:
        """A mesh on the same device list; ``same_cover``: reuse this mesh's complement."""
        new = object.__new__(Mesh)
        new._init(names, layouts, self._devices, self._complement if same_cover else None, api)
        return new

    def __eq__(self, other: object) -> bool:
        """Structural equality after canonicalisation: names, axis layouts and device list."""
        if not isinstance(other, Mesh):
            return NotImplemented
        return self is other or (
            self._axis_names == other._axis_names
            and self._layouts == other._layouts
            and self._devices == other._devices
        )

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash((self._axis_names, self._layouts, self._devices)))
        return self._hash  # type: ignore[return-value]

    def __reduce__(self) -> tuple[type[Mesh], tuple[tuple[str, ...], tuple[L.Layout, ...], DeviceList]]:
        # Rebuild through the constructor: validated, and the hash recomputed in the new process.
        return (Mesh, (self._axis_names, self._layouts, self._devices))

    @classmethod
    def from_ranks(cls, ranks: object, axis_names: str | Sequence[str]) -> Mesh:
        """The mesh whose only group is a nested rank array, as torch's ``DeviceMesh(mesh=...)`` tensor.

        Args:
            ranks: a nested list, numpy array or tensor of distinct non-negative ints, a dim per axis.
            axis_names: one distinct name per dimension of ``ranks``.

        Returns:
            A one-group mesh whose ``ranks`` equal ``ranks``.

        Raises:
            MeshError: a count of names other than ``ranks.ndim``, an empty array, or ranks that
                repeat or are negative.

        Examples:
            >>> m = Mesh.from_ranks([[0, 2], [1, 3]], ("dp", "tp"))
            >>> m["tp"].groups().tolist()
            [[0, 2], [1, 3]]
        """
        names = as_name_tuple("Mesh.from_ranks", axis_names)
        array = as_int_array("Mesh.from_ranks", ranks)
        if array.ndim != len(names):
            raise MeshError(
                requires("Mesh.from_ranks", "one axis name per dimension of ranks", "axis_names", names)
                + f" for ranks of shape {array.shape}"
            )
        if 0 in array.shape:
            raise MeshError(requires("Mesh.from_ranks", "a non-empty rank array", "ranks shape", array.shape))
        devices = DeviceList.from_values("Mesh.from_ranks", array.reshape(-1))
        return cls(names, L.row_major_axes(array.shape), devices)

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self._axis_names, self.axis_sizes, strict=True)) or "()"
        if self.num_groups > 1:
            return f"Mesh({axes}; {self.num_groups} groups over devices {self._devices.describe()})"
        if not self._devices.is_iota:
            return f"Mesh({axes}; devices {self._devices.describe()})"
        return f"Mesh({axes})"

    # -- its shape: names, sizes, layouts (what JAX's AbstractMesh knows) ----------------------------

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The axis names, in mesh order."""
        return self._axis_names

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """The axis sizes, in mesh order."""
        return tuple(lay.size for lay in self._layouts)

    @property
    def shape(self) -> MeshShape:
        """Ordered read-only mapping ``{name: size}`` (a :class:`MeshShape`), as JAX's ``mesh.shape``."""
        return MeshShape(self._axis_names, self.axis_sizes)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self._axis_names)

    @property
    def size(self) -> int:
        """Number of devices in one group: the product of the axis sizes (a property, as in JAX)."""
        return MeshSize(axes_size(self, self._axis_names))

    @property
    def layout(self) -> L.Layout:
        """The layout of all axes together (coordinates row-major over the axes)."""
        return L.concat(*self._layouts)

    def axis_size(self, name: str) -> int:
        """The size of one axis.

        Args:
            name: an axis name.

        Returns:
            The number of members along ``name``.

        Raises:
            UnknownAxisError: ``name`` is not an axis (with "did you mean" on a plausible typo).

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp")).axis_size("tp")
            4
        """
        try:  # the common case, unchecked; anything else raises below with the house message
            return self._layouts[self._axis_names.index(name)].size
        except ValueError:
            return self._layouts[as_axis_index("Mesh.axis_size", self._axis_names, name, self)].size

    def axis_layout(self, name: str) -> L.Layout:
        """The canonical layout of one axis: where its members sit in the device list (``realize``'s cache key).

        Args:
            name: an axis name.

        Returns:
            The axis's :class:`~functional_mesh.Layout` into the device list.

        Raises:
            UnknownAxisError: ``name`` is not an axis.

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp")).axis_layout("dp")
            Layout(2:4)
        """
        return self._layouts[as_axis_index("Mesh.axis_layout", self._axis_names, name, self)]

    # -- selections: which axes, in which order, at which positions (_mesh_transforms) ----------------

    def __getitem__(self, names: str | Sequence[str]) -> Mesh:
        """Select axes, in the given order: ``mesh["tp"]``, ``mesh["tp", "dp"]``.

        A selection that leaves axes out is a *family*: one group per value of those axes.

        Args:
            names: one axis name, or a tuple or list of distinct names.

        Returns:
            The mesh of those axes, in that order.

        Raises:
            UnknownAxisError: a name that is not an axis.
            MeshError: a name given twice, or no name.
            TypeError: a position instead of a name (the message says which name to write).

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp"))["tp"]
            Mesh(tp=4; 2 groups over devices 0..7)
        """
        return select(self, names, "Mesh[...]")

    def transpose(self, *axes: str | Sequence[str]) -> Mesh:
        """Reorder the axes.

        Args:
            *axes: a permutation of all axis names, as separate arguments or one tuple.

        Returns:
            The same groups with their axes in the new order (equal to ``mesh[axes]``).

        Raises:
            UnknownAxisError: a name that is not an axis.
            MeshError: names that are not a permutation of all axis names.

        Examples:
            >>> m = fm.make_mesh((2, 4), ("dp", "tp")).transpose("tp", "dp")
            >>> m, m.ranks.tolist()
            (Mesh(tp=4, dp=2), [[0, 4], [1, 5], [2, 6], [3, 7]])
        """
        names, layouts = T.transpose(self._axis_names, self._layouts, axes, self)
        return self._derive("Mesh.transpose", names, layouts, True)

    def take(self, /, **positions: int | slice | Sequence[int]) -> Mesh:
        """Keep some positions along axes, as numpy indexing of the mesh's grid of ranks does.

        An int removes its axis, a slice or distinct ints keep it (docs/concepts.md, "Taking positions").

        Args:
            **positions: ``axis=index`` per axis to index: an int, a slice, or ints.

        Returns:
            The mesh whose groups are ``mesh.groups()`` indexed along those axes (coordinates
            counted anew from 0).

        Raises:
            UnknownAxisError: a name that is not an axis.
            MeshError: no axis, a position outside its axis, a position given twice, or an empty
                selection.
            TypeError: an index that is not an int, a slice or a sequence of ints.

        Examples:
            >>> fm.make_mesh((4, 2), ("pp", "tp")).take(pp=[0, -1]).ranks.tolist()   # first and last stage
            [[0, 1], [6, 7]]
        """
        names, layouts, devices = T.take(self._axis_names, self._layouts, self._devices, self._complement, positions,
                                         self)
        return type(self)(names, layouts, devices)

    # -- reshapes: the same positions under other axes, so the family is unchanged (_mesh_transforms) -

    def flatten(self, axes: str | Sequence[str] | None = None, name: str | None = None) -> Mesh:
        """Merge axes into one, row-major in the listed order.

        The merged axis stands where the first listed one stood; the axes need not be adjacent.

        Args:
            axes: the axes to merge (default: all), one name or a tuple of distinct names.
            name: the merged axis's name (default: the listed names joined with ``"_"``).

        Returns:
            The mesh with the merged axis; the same groups as ``P(axes)`` names.

        Raises:
            UnknownAxisError: an axis that the mesh does not have.
            MeshError: a repeated axis, a mesh with no axes, or a ``name`` that a remaining axis has.

        Examples:
            >>> fm.make_mesh((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"))["a_c"].groups().tolist()
            [[0, 1, 4, 5], [2, 3, 6, 7]]
        """
        names, layouts = T.flatten(self._axis_names, self._layouts, axes, name, self)
        return self._derive("Mesh.flatten", names, layouts, True)

    def unflatten(self, axis: str, sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> Mesh:
        """Split one axis into new axes, row-major, in its place.

        The sizes must split the axis along its modes (docs/concepts.md, "Unflatten follows the modes").

        Args:
            axis: the axis to split.
            sizes: ``{name: size}``, or a sequence of ``(name, size)`` pairs, outermost first.

        Returns:
            The mesh with the new axes where ``axis`` stood.

        Raises:
            UnknownAxisError: ``axis`` is not an axis.
            MeshError: sizes that are not positive, whose product is not the axis size, that do
                not line up with the axis's modes, or new names that clash with the other axes.

        Examples:
            >>> m = fm.make_mesh((8,), ("world",)).unflatten("world", {"dp": 2, "tp": 4})
            >>> m["dp"].groups().tolist()
            [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        names, layouts = T.unflatten(self._axis_names, self._layouts, axis, sizes, self)
        return self._derive("Mesh.unflatten", names, layouts, True)

    def rename(self, mapping: Mapping[str, str]) -> Mesh:
        """Rename axes simultaneously; names not in the mapping stay.

        Args:
            mapping: ``{old: new}``; ``{"a": "b", "b": "a"}`` swaps two names.

        Returns:
            The same mesh under the new names.

        Raises:
            UnknownAxisError: an old name that is not an axis.
            MeshError: new names that repeat or are empty.

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp")).rename({"dp": "data", "tp": "model"})
            Mesh(data=2, model=4)
        """
        return self._derive("Mesh.rename", T.rename(self._axis_names, mapping, self), self._layouts, True)

    # -- its groups: where the ranks are, and each rank's place among them (_mesh_groups) -------------

    @property
    def num_devices(self) -> int:
        """Length ``N`` of the device list (all groups together)."""
        return len(self._devices)

    @property
    def devices(self) -> np.ndarray:
        """The device list as a read-only flat int64 array (materialised on demand)."""
        return self._devices.to_array()

    @property
    def device_list(self) -> DeviceList:
        """The device list value (a ``DeviceList``), shared with every derived mesh."""
        return self._devices

    @property
    def num_groups(self) -> int:
        """Number of submeshes (groups) this mesh stands for."""
        return G.num_groups(self._complement)

    def groups(self) -> np.ndarray:
        """Every group's global ranks.

        Groups come in torch's order (by first position in the device list).

        Returns:
            An int64 array of shape ``(num_groups, *axis_sizes)``.

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp"))["dp"].groups().tolist()
            [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        return G.groups(self._layouts, self._devices)

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """A rank's coordinate in its group, in mesh order (O(ndim) for a symbolic device list).

        Args:
            rank: a global rank.

        Returns:
            One index per axis, or ``None`` when ``rank`` is not in the device list.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
            >>> mesh.coordinate(6), mesh["tp", "dp"].coordinate(6), mesh.coordinate(8)
            ((1, 2), (2, 1), None)
        """
        return G.coordinate(self._layouts, self._devices, rank, self)

    def group_of(self, rank: int) -> np.ndarray | None:
        """The group holding a rank. O(group size), whatever the world size.

        Args:
            rank: a global rank.

        Returns:
            The group's ranks, an int64 array of shape ``axis_sizes``; ``None`` when ``rank`` is
            not in the device list.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> fm.make_mesh((2, 4), ("dp", "tp"))["dp"].group_of(6).tolist()
            [2, 6]
        """
        return G.group_of(self._layouts, self._devices, self._complement, rank, self)

    def host_span(self, ranks_per_host: int) -> dict[str, str]:
        """Where each axis's groups sit when hosts hold ``ranks_per_host`` consecutive ranks.

        Args:
            ranks_per_host: ranks per host, a positive int.

        Returns:
            Per axis, in mesh order: ``"intra-host"`` when each group lies on one host (a size-1
            axis too), ``"cross-host"`` when each member of a group is on its own host, else ``"mixed"``.

        Raises:
            MeshError: ``ranks_per_host`` below 1.

        Examples:
            >>> fm.make_mesh((4, 4), ("dp", "tp")).flatten(("dp", "tp")).host_span(8)
            {'dp_tp': 'mixed'}
        """
        return G.host_span(self._axis_names, self._layouts, self._devices, ranks_per_host, self)

    @property
    def ranks(self) -> np.ndarray:
        """The ranks of the only group, shape ``axis_sizes``; a ``MeshError`` for a family (use ``groups()``)."""
        return G.only_group(self._layouts, self._devices, self._complement, self)


def axis_position(mesh: Mesh, name: object, api: str = "Mesh.axis_size") -> int:
    """Position of axis ``name`` in ``mesh``; errors name the public call ``api``."""
    try:  # the common case, unchecked; anything else raises below with the house message
        return mesh._axis_names.index(name)
    except ValueError:
        return as_axis_index(api, mesh._axis_names, name, mesh)


def select(mesh: Mesh, names: object, api: str) -> Mesh:
    """``mesh[names]``, for the error of the public call ``api`` (``realize(axes=)``, ``rm[...]``, ...)."""
    axis_names, layouts = T.select(mesh._axis_names, mesh._layouts, names, api, mesh)
    return mesh._derive(api, axis_names, layouts, len(axis_names) == len(mesh._axis_names))


def axis_layouts(mesh: Mesh) -> tuple[L.Layout, ...]:
    """The canonical layout of every axis, in mesh order."""
    return mesh._layouts


def family_modes(mesh: Mesh) -> L.Modes:
    """The modes that enumerate ``mesh``'s groups (the complement of its axes), outermost first."""
    return mesh._complement


def make_mesh(axis_sizes: Sequence[int], axis_names: str | Sequence[str], *, devices: object = None) -> Mesh:
    """A mesh of the given sizes and names over ``devices``, row-major (the last axis fastest, as in torch).

    Args:
        axis_sizes: positive ints, outermost first.
        axis_names: distinct names, one per size.
        devices: distinct non-negative global ranks, one per position (default: the symbolic ``0..N-1``).

    Returns:
        The mesh; one group when ``devices`` has one rank per position.

    Raises:
        MeshError: sizes that are not positive, names that repeat or do not match the sizes in
            number, or devices that repeat, are negative or are not one per position.

    Examples:
        >>> make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))["dp"].groups().tolist()
        [[8, 12], [9, 13], [10, 14], [11, 15]]
    """
    api = "make_mesh"
    if isinstance(axis_sizes, (str, bytes, Mapping, AbstractSet)) or not isinstance(axis_sizes, Iterable):
        raise TypeError(requires(api, "a tuple of int axis sizes", "axis_sizes", axis_sizes))
    sizes = tuple(as_int(api, "axis size", s) for s in axis_sizes)
    names = as_name_tuple(api, axis_names)
    if len(names) != len(sizes):
        raise MeshError(requires(api, "one axis name per size", "axis_names", names) + f" for axis_sizes={sizes}")
    check_unique(api, names)
    for n, s in zip(names, sizes, strict=True):
        if s < 1:
            raise MeshError(requires(api, "positive axis sizes", f"axis_sizes[{n!r}]", s))
    n_dev = math.prod(sizes)
    device_list: DeviceList
    if devices is None:
        device_list = DeviceList.iota(n_dev)
    else:
        device_list = DeviceList.from_values(api, devices)
        if len(device_list) != n_dev:
            raise MeshError(
                requires(api, f"one device per mesh position ({n_dev} for axis_sizes={sizes})",
                         "len(devices)", len(device_list)))
    return Mesh(names, L.row_major_axes(sizes), device_list)
