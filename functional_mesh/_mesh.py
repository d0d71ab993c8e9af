"""The immutable ``Mesh`` value: named axes over layouts and a device list.

A mesh of ``k`` named axes lives on a device list of ``N`` global ranks. Each axis is a
canonical :class:`~functional_mesh.layout.Layout` into ``[0, N)``; together the axes form a
block of ``size`` indices, and the complement of that block enumerates the *groups*: one
submesh per translate. Rank order inside a group is row-major over the axes in the mesh's
order, exactly as in torch's ``DeviceMesh``.

``Mesh`` holds the parts and their invariants (distinct names; axes that tile the devices),
equality, hashing and pickling. What it answers and does comes in three parts, each its own
module: its shape (``_mesh_shape``: names, sizes, layouts), its transformations
(``_mesh_transforms``: selections and reshapes, in O(ndim) from the layouts alone, sharing the
device list) and its groups (``_mesh_groups``: where the ranks are).

Examples:
    >>> mesh = make_mesh((2, 4), ("dp", "tp"))
    >>> mesh
    Mesh(dp=2, tp=4)
    >>> mesh["tp"].groups().tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> mesh["tp", "dp"].groups().tolist()          # any order, unlike torch
    [[[0, 4], [1, 5], [2, 6], [3, 7]]]
    >>> mesh.coordinate(6)
    (1, 2)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

import attrs

from . import _layout as L
from ._devices import DeviceList
from ._errors import MeshError, requires
from ._mesh_groups import Groups
from ._mesh_shape import MeshShape, Shape, axes_size
from ._mesh_transforms import Reshapes, Selections, select
from ._validate import as_axis_index, as_int, as_int_array, as_name_tuple, check_unique

__all__ = ["Mesh", "MeshShape", "axes_size", "axis_layouts", "axis_position", "family_modes", "make_mesh",
           "select"]


@attrs.frozen(weakref_slot=False)
class Mesh(Shape, Selections, Reshapes, Groups):
    """Named axes over canonical layouts on a device list; immutable, hashable, picklable.

    Build meshes with :func:`make_mesh`, :meth:`Mesh.from_ranks` or
    :func:`~functional_mesh.mesh_from_order`; the constructor takes the raw parts and validates
    them. Equal meshes (same names, canonical layouts and device list, however derived) hash
    equal; hashing and comparing are O(ndim). A frozen attrs class whose constructor, equality
    and hash are its own: ``attrs.evolve(mesh, axis_names=...)`` re-validates, while the
    transformations build new meshes through ``_derive`` without the constructor's checks.

    Args:
        axis_names: distinct non-empty names, one per axis.
        layouts: one :class:`~functional_mesh.Layout` per axis, mapping the axis coordinate to a
            position in ``devices``.
        devices: the global ranks (any iterable of distinct non-negative ints, or a
            ``DeviceList``); an int ``n`` means the symbolic ``0..n-1``.

    Raises:
        MeshError: names that repeat, or axes that overlap or do not tile the device list.
        TypeError: layouts that are not ``Layout`` objects, or names that are not str.

    Examples:
        >>> from functional_mesh import Layout
        >>> Mesh(("dp", "tp"), (Layout(2, 1), Layout(4, 2)), 8)    # dp fastest
        Mesh(dp=2, tp=4)
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
        """Check the invariants (distinct names; axes that tile the devices) and set the fields.

        ``comp`` is the complement when the caller's transformation provably keeps the set of
        covered indices (flatten, unflatten, transpose, rename; the laws test this).
        """
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
        """A mesh on the same device list; its invariants are checked, the parts are known types.

        ``same_cover``: the new axes cover the same indices as this mesh's, so the complement
        (the family of groups) is unchanged and reused.
        """
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

    def __reduce__(self):
        # Rebuild through the constructor: validated, and the hash recomputed in the new process.
        return (Mesh, (self._axis_names, self._layouts, self._devices))

    @classmethod
    def from_ranks(cls, ranks: object, axis_names: str | Sequence[str]) -> Mesh:
        """The mesh whose only group is a nested rank array, as torch's ``DeviceMesh(mesh=...)`` tensor.

        Args:
            ranks: a nested list, numpy array or tensor of distinct non-negative ints, one
                dimension per axis.
            axis_names: one distinct name per dimension of ``ranks``.

        Returns:
            A one-group mesh whose ``ranks`` equal ``ranks``.

        Raises:
            MeshError: a count of names other than ``ranks.ndim``, an empty array, or ranks that
                repeat or are negative.
            TypeError: ranks that are not ints.

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


def axis_position(mesh: Mesh, name: object, api: str = "Mesh.axis_size") -> int:
    """Position of axis ``name`` in ``mesh``, for the error of the public call ``api``.

    A non-str name is a ``TypeError``; an unknown one an ``UnknownAxisError`` with "did you mean".
    """
    try:  # the common case, unchecked; anything else raises below with the house message
        return mesh._axis_names.index(name)
    except ValueError:
        return as_axis_index(api, mesh._axis_names, name, mesh)


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
        devices: global ranks, flat, one per position: any iterable, numpy array or tensor of
            distinct non-negative ints (default: the symbolic ``0..N-1``). A range stays symbolic;
            the list is stored once and shared by every derived mesh.

    Returns:
        The mesh; one group when ``devices`` has one rank per position.

    Raises:
        MeshError: sizes that are not positive, names that repeat or do not match the sizes in
            number, or devices that repeat, are negative or are not one per position.
        TypeError: sizes, names or devices of the wrong type.

    Examples:
        >>> make_mesh((2, 2, 2), ("dp", "cp", "tp")).shape
        {'dp': 2, 'cp': 2, 'tp': 2}
        >>> make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))["dp"].groups().tolist()
        [[8, 12], [9, 13], [10, 14], [11, 15]]
        >>> make_mesh((2, 4), ("dp", "dp"))
        Traceback (most recent call last):
        ...
        functional_mesh.MeshError: `make_mesh` requires distinct axis names, but got axis_names=('dp', 'dp');
        'dp' appears twice
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
    if devices is None:
        device_list = DeviceList.iota(n_dev)
    else:
        device_list = DeviceList.from_values(api, devices)
        if len(device_list) != n_dev:
            raise MeshError(
                requires(api, f"one device per mesh position ({n_dev} for axis_sizes={sizes})",
                         "len(devices)", len(device_list)))
    return Mesh(names, L.row_major_axes(sizes), device_list)
