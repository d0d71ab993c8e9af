"""A mesh's shape: the values its axes' names and sizes make (what JAX's ``AbstractMesh`` knows).

:class:`~functional_mesh.Mesh` answers its names, sizes and layouts from its own fields; this module
holds the values it answers with: ``mesh.shape``, a :class:`MeshShape`, and ``mesh.size``, a
:class:`MeshSize`; and :func:`axes_size`, the one product of axis sizes.

Examples:
    >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    >>> mesh.shape, mesh.size, axes_size(mesh, ("tp", "dp"))
    ({'dp': 2, 'tp': 4}, 8, 8)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ._errors import UnknownAxisError, requires, unknown_axis
from ._validate import Frozen

__all__ = ["MeshShape", "MeshSize", "axes_size"]


class MeshShape(Frozen, Mapping[str, int]):
    """``mesh.shape``: an ordered, read-only mapping from axis name to size (as in JAX).

    A ``collections.abc.Mapping`` (``==`` by items, so it equals a dict of the same sizes), made at
    each ``mesh.shape``.

    Args:
        names: the axis names, in mesh order.
        sizes: one size per name.

    Raises:
        UnknownAxisError: (a ``KeyError``) for a key that is not an axis name, so ``0 in mesh.shape``
            is ``False`` and ``mesh.shape.get(0)`` is ``None``; indexing by position, torch style
            (``mesh.shape[0]``), says what to write instead.

    Examples:
        >>> shape = fm.make_mesh((2, 4), ("dp", "tp")).shape
        >>> shape["tp"], "dp" in shape, shape == {"dp": 2, "tp": 4}, list(shape.items())
        (4, True, True, [('dp', 2), ('tp', 4)])
    """

    __slots__ = ("_items",)
    _items: MappingProxyType[str, int]

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

    def __reduce__(self) -> tuple[type[MeshShape], tuple[tuple[str, ...], tuple[int, ...]]]:
        return (MeshShape, (tuple(self._items), tuple(self._items.values())))

    def __repr__(self) -> str:
        return repr(dict(self._items))


class MeshSize(int):
    """``mesh.size``: an int that explains itself when called like torch's ``DeviceMesh.size()``."""

    def __call__(self, *args: object) -> int:
        raise TypeError(
            "`Mesh.size` is a property (as in JAX), not a method: write mesh.size for the "
            "number of devices in one group, or mesh.axis_size('tp') for one axis"
        )

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        return (int, (int(self),))


def axes_size(mesh: Any, axes: Iterable[str]) -> int:
    """The size of the product of ``axes``: the product of their sizes (1 for no axes).

    ``mesh`` is anything with ``axis_size(name)``: a ``Mesh``, or a ``RealizedMesh`` (whose lookup is a
    dict). The one place a product of axis sizes is computed; a plain loop, so torch.compile traces it.
    """
    size = 1
    for name in axes:
        size *= mesh.axis_size(name)
    return size
