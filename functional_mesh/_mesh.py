"""The immutable ``Mesh`` value: named axes over layouts and a device list.

A mesh of ``k`` named axes lives on a device list of ``N`` global ranks. Each axis is a
canonical :class:`~functional_mesh.layout.Layout` into ``[0, N)``; together the axes form a
block of ``size`` indices, and the complement of that block enumerates the *groups*: one
submesh per translate. Rank order inside a group is row-major over the axes in the mesh's
order, exactly as in torch's ``DeviceMesh``.

Transformations (select, flatten, unflatten, transpose, rename) build new meshes from the
axes' layouts alone, in O(ndim), sharing the device list: they never look at the ranks and
never touch ``torch.distributed``.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Any

import numpy as np

from . import _layout as L
from ._devices import DeviceList
from ._errors import MeshError, UnknownAxisError, requires, unknown_axis
from ._validate import Frozen, as_int, as_int_array, as_name_tuple, check_unique

__all__ = ["Mesh", "MeshShape", "axes_size", "axis_layouts", "axis_position", "family_modes", "make_mesh",
           "select"]


class MeshShape(Frozen, Mapping[str, int]):
    """``mesh.shape``: an ordered, read-only mapping from axis name to size (as in JAX).

    A ``collections.abc.Mapping``: ``in``, ``get``, iteration, ``keys``, ``values``, ``items``,
    ``len`` and ``==`` (by items, so it equals a dict of the same sizes) answer as for any mapping.
    A key that is not an axis name is a ``KeyError`` (an ``UnknownAxisError``), so ``0 in mesh.shape``
    is ``False`` and ``mesh.shape.get(0)`` is ``None``; indexing by position, torch style
    (``mesh.shape[0]``), says what to write instead.
    """

    __slots__ = ("_items",)

    def __init__(self, names: Sequence[str], sizes: Sequence[int]) -> None:
        object.__setattr__(self, "_items", MappingProxyType(dict(zip(names, sizes, strict=True))))

    def __getitem__(self, key: str) -> int:
        try:
            return self._items[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key such as a list
            pass
        if isinstance(key, int) and not isinstance(key, bool):
            raise UnknownAxisError(
                requires("mesh.shape[...]", "an axis name (mesh.shape is a mapping, as in JAX)", "key", key,
                         tuple(self._items)) + f"; for sizes by position use mesh.axis_sizes[{key}]"
            )
        raise unknown_axis("mesh.shape[...]", key, tuple(self._items))

    def __contains__(self, key: object) -> bool:
        try:  # Mapping's answer (a lookup that raises KeyError is False), without building the message
            return key in self._items
        except TypeError:  # unhashable: not an axis name
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __reduce__(self):
        return (MeshShape, (tuple(self._items), tuple(self._items.values())))

    def __repr__(self) -> str:
        return repr(dict(self._items))


class _Size(int):
    """``mesh.size``: an int that explains itself when called like torch's ``DeviceMesh.size()``."""

    def __call__(self, *args: object) -> int:
        raise TypeError(
            "`Mesh.size` is a property (as in JAX), not a method: write mesh.size for the "
            "number of devices in one group, or mesh.axis_size('tp') for one axis"
        )

    def __reduce__(self):
        return (int, (int(self),))


class Mesh(Frozen):
    """Named axes over canonical layouts on a device list; immutable, hashable, picklable.

    A plain ``__slots__`` value (see :class:`~functional_mesh._validate.Frozen`): transformations
    build new meshes through ``_derive`` without re-running the public constructor's checks.

    Build meshes with :func:`make_mesh` or :meth:`Mesh.from_ranks`; the constructor takes the
    raw parts (axis names, one :class:`Layout` per axis, a device list) and validates them.

    Args:
        axis_names: distinct non-empty names, one per axis.
        layouts: one layout per axis, mapping the axis coordinate to an index into ``devices``.
        devices: the global ranks; an int ``n`` means the symbolic ``0..n-1``.

    Raises:
        MeshError: when names repeat, or the axes overlap or do not tile the device list.
    """

    __slots__ = ("_axis_names", "_layouts", "_devices", "_complement", "_hash")
    _axis_names: tuple[str, ...]
    _layouts: tuple[L.Layout, ...]
    _devices: DeviceList
    _complement: L.Modes  # modes of the group offsets (outermost first): the family
    _hash: int | None  # computed on first use

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
        """The mesh whose only group is the nested rank array ``ranks`` (torch's ``mesh=`` tensor).

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
        return cls(names, _row_major_axes(array.shape), devices)

    # -- shape ---------------------------------------------------------------------------------

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
        """Ordered mapping ``{name: size}``."""
        return MeshShape(self._axis_names, self.axis_sizes)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self._axis_names)

    @property
    def size(self) -> int:
        """Number of devices in one group: the product of the axis sizes."""
        return _Size(axes_size(self, self._axis_names))

    @property
    def num_groups(self) -> int:
        """Number of submeshes (groups) this mesh stands for."""
        return math.prod([s for s, _ in self._complement])

    @property
    def num_devices(self) -> int:
        """Length ``N`` of the device list (all groups together)."""
        return len(self._devices)

    @property
    def devices(self) -> np.ndarray:
        """The device list as a read-only int64 array (materialised on demand)."""
        return self._devices.to_array()

    @property
    def device_list(self) -> DeviceList:
        """The device list value itself, shared with every derived mesh."""
        return self._devices

    @property
    def layout(self) -> L.Layout:
        """The layout of all axes together (coordinates row-major over the axes)."""
        return L.concat(*self._layouts)

    def axis_size(self, name: str) -> int:
        """Size of axis ``name``."""
        return self._layouts[axis_position(self, name)].size

    def axis_layout(self, name: str) -> L.Layout:
        """The canonical layout of axis ``name`` (the realize cache key of its groups)."""
        return self._layouts[axis_position(self, name, "Mesh.axis_layout")]

    # -- transformations -----------------------------------------------------------------------

    def _positions(self, api: str, names: object, what: str = "axes") -> tuple[int, ...]:
        names_t = as_name_tuple(api, names, what)
        if not names_t:
            raise MeshError(requires(api, "at least one axis", what, names_t, self._axis_names), mesh=self)
        check_unique(api, names_t, what)
        return tuple(axis_position(self, n, api) for n in names_t)

    def __getitem__(self, names: str | Sequence[str]) -> Mesh:
        """Select axes, in the given order: ``mesh["tp"]``, ``mesh["tp", "dp"]``."""
        return select(self, names, "Mesh[...]")

    def flatten(self, axes: str | Sequence[str] | None = None, name: str | None = None) -> Mesh:
        """Merge ``axes`` (default: all) into one axis, row-major in the listed order.

        The merged axis takes the place of the first listed axis among the remaining ones;
        its default name joins the listed names with ``"_"``.

        Examples:
            >>> m = make_mesh((2, 2, 2), ("a", "b", "c"))
            >>> m.flatten(("c", "a"))
            Mesh(b=2, c_a=4)
            >>> m.flatten(("a", "c"))["a_c"].groups().tolist()
            [[0, 1, 4, 5], [2, 3, 6, 7]]
        """
        pos = tuple(range(self.ndim)) if axes is None else self._positions("Mesh.flatten", axes)
        if not pos:
            raise MeshError("`Mesh.flatten` requires a mesh with at least one axis, but got a 0-axis mesh", mesh=self)
        listed = tuple(self._axis_names[i] for i in pos)
        if name is None:
            name = "_".join(listed)
        if not isinstance(name, str):
            raise TypeError(requires("Mesh.flatten", "one str for name", "name", name))
        (merged_name,) = as_name_tuple("Mesh.flatten", name, "name")
        names: list[str] = []
        layouts: list[L.Layout | None] = []
        at = 0
        for i, n in enumerate(self._axis_names):  # one pass: the merged axis in its first part's place
            if i == pos[0]:
                at = len(names)
                names.append(merged_name)
                layouts.append(None)
            elif i not in pos:
                names.append(n)
                layouts.append(self._layouts[i])
        if merged_name in names[:at] or merged_name in names[at + 1:]:
            remaining = tuple(n for i, n in enumerate(self._axis_names) if i not in pos)
            raise MeshError(
                requires("Mesh.flatten", "a merged name distinct from the remaining axes", "name", merged_name)
                + f"; remaining axes: {remaining}", mesh=self)
        layouts[at] = L.concat(*(self._layouts[i] for i in pos))
        return self._derive("Mesh.flatten", tuple(names), tuple(layouts), True)

    def unflatten(self, axis: str, sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> Mesh:
        """Split ``axis`` into new axes, row-major, in its place: ``unflatten("w", {"dp": 2, "tp": 4})``.

        The sizes must multiply to the axis size and split it along its canonical modes
        (a non-contiguous ``(2,3):(6,1)`` axis splits as ``(2, 3)`` or ``(6,)``, not ``(3, 2)``).

        Examples:
            >>> m = make_mesh((8,), ("world",)).unflatten("world", {"dp": 2, "tp": 4})
            >>> m["dp"].groups().tolist()
            [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        api = "Mesh.unflatten"
        if isinstance(axis, str):
            i = axis_position(self, axis, api)
        else:  # a 1-tuple names one axis, as in selections; more is a mistake, not "the first one"
            positions = self._positions(api, axis, "axis")
            if len(positions) != 1:
                raise MeshError(requires(api, "one axis to split", "axis", axis, self._axis_names), mesh=self)
            i = positions[0]
        items = _size_items(api, sizes)
        new_names = tuple(n for n, _ in items)
        new_sizes = tuple(s for _, s in items)
        old = self._layouts[i]
        if math.prod(new_sizes) != old.size:
            raise MeshError(
                requires(api, f"sizes whose product equals the size of axis {axis!r} ({old.size})", "sizes",
                         dict(items)), mesh=self)
        parts = []
        for size, step in zip(new_sizes, L.row_major_strides(new_sizes)):  # equal lengths by construction
            try:
                parts.append(L.Layout._from_modes(L.compose_mode(old, size, step)))
            except MeshError:
                raise MeshError(
                    requires(api, f"sizes that split axis {axis!r} along its modes {old} (outermost first)",
                             "sizes", dict(items),
                             f"sizes whose inner-to-outer products line up with the modes, e.g. {old.shape} "
                             f"or ({old.size},)"),
                    mesh=self) from None
        names = self._axis_names[:i] + new_names + self._axis_names[i + 1:]
        return self._derive(api, names, self._layouts[:i] + tuple(parts) + self._layouts[i + 1:], True)

    def transpose(self, *axes: str | Sequence[str]) -> Mesh:
        """Reorder the axes: ``transpose("tp", "dp", "cp")`` (a permutation of all names)."""
        names = axes[0] if len(axes) == 1 and not isinstance(axes[0], str) else axes
        names = as_name_tuple("Mesh.transpose", tuple(names) if isinstance(names, list) else names, "axes")
        for n in names:
            axis_position(self, n, "Mesh.transpose")
        if sorted(names) != sorted(self._axis_names) or len(set(names)) != len(names):
            raise MeshError(
                requires("Mesh.transpose", "a permutation of all axis names", "axes", names, self._axis_names),
                mesh=self)
        pos = tuple(self._axis_names.index(n) for n in names)
        return self._derive("Mesh.transpose", names, tuple(self._layouts[i] for i in pos), True)

    def rename(self, mapping: Mapping[str, str]) -> Mesh:
        """Rename axes simultaneously: ``rename({"dp": "data"})``; ``{"a": "b", "b": "a"}`` swaps."""
        if not isinstance(mapping, Mapping):
            raise TypeError(requires("Mesh.rename", "a mapping {old: new}", "mapping", mapping))
        for old, new in mapping.items():
            axis_position(self, old, "Mesh.rename")
            as_name_tuple("Mesh.rename", (new,), "new name")
        names = tuple(mapping.get(n, n) for n in self._axis_names)
        return self._derive("Mesh.rename", names, self._layouts, True)

    # -- queries -------------------------------------------------------------------------------

    def groups(self) -> np.ndarray:
        """Every submesh's global ranks: int64 array of shape ``(num_groups, *axis_sizes)``.

        Groups come in torch's order (increasing first index into the device list).
        """
        idx = L.groups(self.layout, len(self._devices))
        return self._devices.take(idx).reshape((-1, *self.axis_sizes))

    def _index(self, api: str, rank: int) -> int | None:
        """Position of global ``rank`` in the device list, or ``None`` when absent."""
        rank = as_int(api, "rank", rank)
        if rank < 0:
            raise MeshError(requires(api, "a non-negative global rank", "rank", rank), mesh=self)
        return self._devices.index_of(rank)

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """``rank``'s coordinate in its submesh (mesh order), or ``None`` if it is not a device.

        O(ndim) for a symbolic device list: each axis reads its own digits of the rank's index.
        """
        index = self._index("Mesh.coordinate", rank)
        if index is None:
            return None
        return tuple(L.digits_value(lay.modes, index) for lay in self._layouts)

    def group_of(self, rank: int) -> np.ndarray | None:
        """The submesh holding ``rank`` (shape ``axis_sizes``), or ``None`` if it is not a device."""
        index = self._index("Mesh.group_of", rank)
        if index is None:
            return None
        offset = sum(((index // d) % s) * d for s, d in self._complement)
        return self._devices.take(offset + L.indices(self.layout)).reshape(self.axis_sizes)

    def host_span(self, ranks_per_host: int) -> dict[str, str]:
        """Where each axis's groups sit when hosts hold ``ranks_per_host`` consecutive ranks.

        Host of a global rank ``r`` is ``r // ranks_per_host`` (torchrun's numbering, one agent
        per host). Per axis: ``"intra-host"`` when every group of the axis lies on one host,
        ``"cross-host"`` when every group has each member on a different host, ``"mixed"``
        otherwise. A size-1 axis is intra-host. Reads every rank once: O(devices).

        Examples:
            >>> make_mesh((2, 2, 4), ("dp", "cp", "tp")).host_span(ranks_per_host=8)
            {'dp': 'cross-host', 'cp': 'intra-host', 'tp': 'intra-host'}
            >>> make_mesh((4, 4), ("dp", "tp")).flatten(("dp", "tp")).host_span(8)
            {'dp_tp': 'mixed'}
        """
        api = "Mesh.host_span"
        k = as_int(api, "ranks_per_host", ranks_per_host)
        if k < 1:
            raise MeshError(requires(api, "a positive number of ranks per host", "ranks_per_host", k), mesh=self)
        k = min(k, self._devices.max() + 1)  # one host holds every device: same answer, no overflow
        span: dict[str, str] = {}
        for name, size in zip(self._axis_names, self.axis_sizes, strict=True):
            hosts = np.sort(self[name].groups().reshape(-1, size) // k, axis=1)
            if (hosts[:, 0] == hosts[:, -1]).all():
                span[name] = "intra-host"
            elif (hosts[:, 1:] != hosts[:, :-1]).all():
                span[name] = "cross-host"
            else:
                span[name] = "mixed"
        return span

    @property
    def ranks(self) -> np.ndarray:
        """The ranks of the only group, shape ``axis_sizes``; a ``MeshError`` for a family."""
        if self.num_groups != 1:
            raise MeshError(
                f"`Mesh.ranks` requires a mesh with one group, but got num_groups={self.num_groups} "
                f"({self!r}); use mesh.groups() or mesh.group_of(rank)", mesh=self)
        return self.groups()[0]

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
    if not isinstance(name, str):
        raise TypeError(requires(api, "a str axis name", "axis", name))
    try:
        return mesh._axis_names.index(name)
    except ValueError:
        raise unknown_axis(api, name, mesh._axis_names, mesh) from None


def select(mesh: Mesh, names: object, api: str) -> Mesh:
    """``mesh[names]``, for the error of the public call ``api`` (``realize(axes=)``, ``rm[...]``, ...)."""
    if isinstance(names, int) and not isinstance(names, bool):
        msg = requires(api, "axis names, not positions", "key", names, mesh._axis_names)
        if -mesh.ndim <= names < mesh.ndim:
            msg += f"; write mesh[{mesh._axis_names[names]!r}]"
        raise TypeError(msg)
    pos = mesh._positions(api, names)
    return mesh._derive(api, tuple(mesh._axis_names[i] for i in pos), tuple(mesh._layouts[i] for i in pos),
                        len(pos) == mesh.ndim)


def axes_size(mesh: Any, axes: Iterable[str]) -> int:
    """The size of the product of ``axes``: the product of their sizes (1 for no axes).

    ``mesh`` is anything with ``axis_size(name)``: a ``Mesh``, or a ``RealizedMesh`` (whose lookup is a
    dict). The one place a product of axis sizes is computed; a plain loop, so torch.compile traces it.
    """
    size = 1
    for name in axes:
        size *= mesh.axis_size(name)
    return size


def axis_layouts(mesh: Mesh) -> tuple[L.Layout, ...]:
    """The canonical layout of every axis, in mesh order."""
    return mesh._layouts


def family_modes(mesh: Mesh) -> L.Modes:
    """The modes that enumerate ``mesh``'s groups (the complement of its axes), outermost first."""
    return mesh._complement


def _row_major_axes(sizes: Sequence[int]) -> tuple[L.Layout, ...]:
    """One layout per axis of a compact row-major grid over ``sizes``."""
    # equal lengths by construction: the strides are computed from the sizes
    return tuple(L.Layout._from_modes(((s, d),)) for s, d in zip(sizes, L.row_major_strides(sizes)))


def _size_items(api: str, sizes: object) -> tuple[tuple[str, int], ...]:
    if type(sizes) is dict and sizes:  # the common case, checked without per-item calls
        items = tuple(sizes.items())
        if all(type(n) is str and n and type(s) is int and s >= 1 for n, s in items):
            return items
    if isinstance(sizes, Mapping):
        pairs = tuple(sizes.items())
    elif isinstance(sizes, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in sizes):
        pairs = tuple(tuple(p) for p in sizes)
    else:
        raise TypeError(requires(api, "a mapping {name: size} (or (name, size) pairs)", "sizes", sizes))
    if not pairs:
        raise MeshError(requires(api, "at least one new axis", "sizes", sizes))
    names = as_name_tuple(api, tuple(n for n, _ in pairs), "sizes")
    values = tuple(as_int(api, "size", s) for _, s in pairs)
    for n, s in zip(names, values, strict=True):
        if s < 1:
            raise MeshError(requires(api, "positive sizes", f"sizes[{n!r}]", s))
    return tuple(zip(names, values, strict=True))


def make_mesh(axis_sizes: Sequence[int], axis_names: str | Sequence[str], *, devices: object = None) -> Mesh:
    """A mesh of the given sizes and names over ``devices`` (default: the symbolic ``0..N-1``).

    Args:
        axis_sizes: positive ints, outermost first.
        axis_names: distinct names, one per size.
        devices: global ranks, flat, one per device: any iterable, numpy array or tensor of
            distinct non-negative ints. Stored once and shared by every derived mesh.

    Examples:
        >>> make_mesh((2, 2, 2), ("dp", "cp", "tp")).shape
        {'dp': 2, 'cp': 2, 'tp': 2}
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
    if devices is None:
        device_list = DeviceList.iota(n_dev)
    else:
        device_list = DeviceList.from_values(api, devices)
        if len(device_list) != n_dev:
            raise MeshError(
                requires(api, f"one device per mesh position ({n_dev} for axis_sizes={sizes})",
                         "len(devices)", len(device_list)))
    return Mesh(names, _row_major_axes(sizes), device_list)
