"""A mesh's shape: its named axes, their sizes and layouts (what JAX's ``AbstractMesh`` knows).

:class:`Shape` is the part of :class:`~functional_mesh.Mesh` that answers from the axes alone,
without the device list: names, sizes, ``mesh.shape`` (a :class:`MeshShape`), the layout of an
axis. Every answer is a plain read, O(number of axes); :func:`axes_size` is the one product of
axis sizes.

Examples:
    >>> import functional_mesh as fm
    >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    >>> mesh.shape, mesh.size, axes_size(mesh, ("tp", "dp"))
    ({'dp': 2, 'tp': 4}, 8, 8)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from . import _layout as L
from ._errors import UnknownAxisError, requires, unknown_axis
from ._validate import Frozen, as_axis_index

__all__ = ["MeshShape", "Shape", "axes_size"]


class MeshShape(Frozen, Mapping[str, int]):
    """``mesh.shape``: an ordered, read-only mapping from axis name to size (as in JAX).

    A ``collections.abc.Mapping``: ``in``, ``get``, iteration, ``keys``, ``values``, ``items``,
    ``len`` and ``==`` (by items, so it equals a dict of the same sizes) answer as for any mapping.
    A plain ``__slots__`` value on :class:`~functional_mesh._validate.Frozen`: a view made at each
    ``mesh.shape``, built from names and sizes, which are not its fields.

    Args:
        names: the axis names, in mesh order.
        sizes: one size per name.

    Raises:
        UnknownAxisError: (a ``KeyError``) for a key that is not an axis name, so ``0 in mesh.shape``
            is ``False`` and ``mesh.shape.get(0)`` is ``None``; indexing by position, torch style
            (``mesh.shape[0]``), says what to write instead.

    Examples:
        >>> import functional_mesh as fm
        >>> shape = fm.make_mesh((2, 4), ("dp", "tp")).shape
        >>> shape["tp"], "dp" in shape, shape == {"dp": 2, "tp": 4}, list(shape.items())
        (4, True, True, [('dp', 2), ('tp', 4)])
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


class Shape:
    """The shape of a :class:`~functional_mesh.Mesh`: what it answers from its axes alone.

    A part of ``Mesh`` (it holds no fields of its own): it reads the axis names and layouts that
    ``Mesh`` sets. All O(number of axes).
    """

    __slots__ = ()
    _axis_names: tuple[str, ...]  # set by Mesh
    _layouts: tuple[L.Layout, ...]  # set by Mesh: one canonical layout per axis

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
        return _Size(axes_size(self, self._axis_names))

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
            TypeError: ``name`` is not a str.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 4), ("dp", "tp")).axis_size("tp")
            4
        """
        try:  # the common case, unchecked; anything else raises below with the house message
            return self._layouts[self._axis_names.index(name)].size
        except ValueError:
            return self._layouts[as_axis_index("Mesh.axis_size", self._axis_names, name, self)].size

    def axis_layout(self, name: str) -> L.Layout:
        """The canonical layout of one axis: where its members sit in the device list.

        Equal layouts mean equal groups, however the meshes were derived, so this is the key
        under which ``realize`` caches an axis's process groups.

        Args:
            name: an axis name.

        Returns:
            The axis's :class:`~functional_mesh.Layout` into the device list.

        Raises:
            UnknownAxisError: ``name`` is not an axis.
            TypeError: ``name`` is not a str.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 4), ("dp", "tp")).axis_layout("dp")
            Layout(2:4)
        """
        return self._layouts[as_axis_index("Mesh.axis_layout", self._axis_names, name, self)]


def axes_size(mesh: Any, axes: Iterable[str]) -> int:
    """The size of the product of ``axes``: the product of their sizes (1 for no axes).

    ``mesh`` is anything with ``axis_size(name)``: a ``Mesh``, or a ``RealizedMesh`` (whose lookup is a
    dict). The one place a product of axis sizes is computed; a plain loop, so torch.compile traces it.
    """
    size = 1
    for name in axes:
        size *= mesh.axis_size(name)
    return size
