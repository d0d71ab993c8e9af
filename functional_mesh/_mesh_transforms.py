"""A mesh's transformations: new meshes from its axes' layouts alone, in O(ndim).

:class:`Selections` (``mesh[...]``, ``transpose``) and :class:`Reshapes` (``flatten``,
``unflatten``, ``rename``) are the parts of :class:`~functional_mesh.Mesh` that derive new meshes.
Each computes new names and layouts from the old ones and hands them to ``Mesh._derive``, which
checks the invariants and shares the device list: no transformation looks at the ranks, so each
costs the same at 8 ranks and at a million, and none touches ``torch.distributed``. A selection
keeps some of the axes, in any order (fewer axes make a family of groups); a reshape keeps the
positions the mesh covers and changes only how they are named and grouped into axes.

Examples:
    >>> import functional_mesh as fm
    >>> mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    >>> mesh["tp", "dp"].flatten().groups().tolist()
    [[0, 4, 1, 5], [2, 6, 3, 7]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from . import _layout as L
from ._errors import MeshError, requires
from ._validate import as_axis_index, as_int, as_name_tuple, check_unique

__all__ = ["Reshapes", "Selections", "select"]


class Selections:
    """Which axes, in which order, at which positions: ``mesh[...]``, ``transpose`` and ``take``.

    A part of :class:`~functional_mesh.Mesh` (it holds no fields of its own): it reads the axis
    names and layouts (and, for ``take``, the device list and the family), and builds results
    through ``Mesh._derive``.
    """

    __slots__ = ()
    _axis_names: tuple[str, ...]  # set by Mesh
    _layouts: tuple[L.Layout, ...]  # set by Mesh
    _devices: Any  # set by Mesh: the DeviceList
    _complement: L.Modes  # set by Mesh: the modes of the group offsets
    _derive: Any  # Mesh._derive(api, names, layouts, same_cover) -> Mesh

    def _positions(self, api: str, names: object, what: str = "axes") -> tuple[int, ...]:
        names_t = as_name_tuple(api, names, what)
        if not names_t:
            raise MeshError(requires(api, "at least one axis", what, names_t, self._axis_names), mesh=self)
        check_unique(api, names_t, what)
        return tuple(as_axis_index(api, self._axis_names, n, self) for n in names_t)

    def __getitem__(self, names: str | Sequence[str]) -> Any:
        """Select axes, in the given order: ``mesh["tp"]``, ``mesh["tp", "dp"]``.

        The result keeps each axis's layout. When it covers fewer ranks than the device list it is
        a *family*: one group per value of the axes left out. Any order is legal (torch's
        ``DeviceMesh`` refuses an order other than the mesh's).

        Args:
            names: one axis name, or a tuple or list of distinct names.

        Returns:
            The mesh of those axes, in that order.

        Raises:
            UnknownAxisError: a name that is not an axis.
            MeshError: a name given twice, or no name.
            TypeError: a position instead of a name (the message says which name to write).

        Examples:
            >>> import functional_mesh as fm
            >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
            >>> mesh["tp"]
            Mesh(tp=4; 2 groups over devices 0..7)
            >>> mesh["tp", "dp"].groups().tolist()
            [[[0, 4], [1, 5], [2, 6], [3, 7]]]
        """
        return select(self, names, "Mesh[...]")

    def transpose(self, *axes: str | Sequence[str]) -> Any:
        """Reorder the axes.

        Args:
            *axes: a permutation of all axis names, as separate arguments or one tuple.

        Returns:
            The same groups with their axes in the new order (equal to ``mesh[axes]``).

        Raises:
            UnknownAxisError: a name that is not an axis.
            MeshError: names that are not a permutation of all axis names.

        Examples:
            >>> import functional_mesh as fm
            >>> m = fm.make_mesh((2, 4), ("dp", "tp")).transpose("tp", "dp")
            >>> m, m.ranks.tolist()
            (Mesh(tp=4, dp=2), [[0, 4], [1, 5], [2, 6], [3, 7]])
        """
        names = axes[0] if len(axes) == 1 and not isinstance(axes[0], str) else axes
        names = as_name_tuple("Mesh.transpose", tuple(names) if isinstance(names, list) else names, "axes")
        for n in names:
            as_axis_index("Mesh.transpose", self._axis_names, n, self)
        if sorted(names) != sorted(self._axis_names) or len(set(names)) != len(names):
            raise MeshError(
                requires("Mesh.transpose", "a permutation of all axis names", "axes", names, self._axis_names),
                mesh=self)
        pos = tuple(self._axis_names.index(n) for n in names)
        return self._derive("Mesh.transpose", names, tuple(self._layouts[i] for i in pos), True)


    def take(self, /, **positions: int | slice | Sequence[int]) -> Any:
        """Keep some positions along axes, as numpy indexing of the mesh's grid of ranks does.

        An int (negative counts from the end) keeps one position and removes its axis; a slice or
        a sequence of distinct ints keeps the axis, with those positions in that order. Axes not
        named stay whole; over a family every group is indexed alike. The result lives on a device
        list of the ranks it keeps: a range, in O(ndim), when they form one; otherwise the ranks.

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
            >>> import functional_mesh as fm
            >>> mesh = fm.make_mesh((4, 2), ("pp", "tp"))
            >>> mesh.take(pp=[0, -1]).ranks.tolist()           # the first and last stage
            [[0, 1], [6, 7]]
            >>> mesh.take(pp=2), mesh.take(pp=slice(1, 3))["tp"].groups().tolist()
            (Mesh(tp=2; devices 4..5), [[2, 3], [4, 5]])
        """
        api = "Mesh.take"
        if not positions:
            raise MeshError(requires(api, "at least one axis=index", "positions", positions, self._axis_names),
                            mesh=self)
        chosen = {}
        for name, index in positions.items():
            i = as_axis_index(api, self._axis_names, name, self)
            chosen[i] = _along(api, name, index, self._layouts[i].size)
        kept = [i for i in range(len(self._layouts)) if not isinstance(chosen.get(i), int)]
        sizes = tuple(len(chosen[i]) if i in chosen else self._layouts[i].size for i in kept)
        devices = _taken(self._devices, self._complement, self._layouts, chosen)
        return type(self)(tuple(self._axis_names[i] for i in kept), L.row_major_axes(sizes), devices)


class Reshapes:
    """The same positions under other axes: ``flatten`` merges axes, ``unflatten`` splits one, ``rename`` renames.

    A part of :class:`~functional_mesh.Mesh` (it holds no fields of its own). Every reshape covers
    the positions the mesh covered, so the family of groups is unchanged.
    """

    __slots__ = ()
    _axis_names: tuple[str, ...]  # set by Mesh
    _layouts: tuple[L.Layout, ...]  # set by Mesh
    _derive: Any  # Mesh._derive(api, names, layouts, same_cover) -> Mesh
    _positions: Any  # Selections._positions(api, names, what) -> positions

    def flatten(self, axes: str | Sequence[str] | None = None, name: str | None = None) -> Any:
        """Merge axes into one, row-major in the listed order.

        The merged axis takes the place of the first listed axis among the remaining ones. Any
        axes may be merged, adjacent or not, in any order.

        Args:
            axes: the axes to merge (default: all), one name or a tuple of distinct names.
            name: the merged axis's name (default: the listed names joined with ``"_"``).

        Returns:
            The mesh with the merged axis; the same groups as ``P(axes)`` names.

        Raises:
            UnknownAxisError: an axis that the mesh does not have.
            MeshError: a repeated axis, a mesh with no axes, or a ``name`` that a remaining axis has.
            TypeError: a ``name`` that is not a str.

        Examples:
            >>> import functional_mesh as fm
            >>> m = fm.make_mesh((2, 2, 2), ("a", "b", "c"))
            >>> m.flatten(("c", "a"))
            Mesh(b=2, c_a=4)
            >>> m.flatten(("a", "c"))["a_c"].groups().tolist()
            [[0, 1, 4, 5], [2, 3, 6, 7]]
        """
        pos = tuple(range(len(self._axis_names))) if axes is None else self._positions("Mesh.flatten", axes)
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

    def unflatten(self, axis: str, sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> Any:
        """Split one axis into new axes, row-major, in its place.

        The sizes must multiply to the axis size and split it along its canonical modes: a
        non-contiguous ``(2,3):(6,1)`` axis splits as ``(2, 3)`` or ``(6,)``, not ``(3, 2)``. The new
        names may reuse the old one.

        Args:
            axis: the axis to split.
            sizes: ``{name: size}``, or a sequence of ``(name, size)`` pairs, outermost first.

        Returns:
            The mesh with the new axes where ``axis`` stood.

        Raises:
            UnknownAxisError: ``axis`` is not an axis.
            MeshError: sizes that are not positive, whose product is not the axis size, that do
                not line up with the axis's modes, or new names that clash with the other axes.
            TypeError: ``sizes`` of another type.

        Examples:
            >>> import functional_mesh as fm
            >>> m = fm.make_mesh((8,), ("world",)).unflatten("world", {"dp": 2, "tp": 4})
            >>> m["dp"].groups().tolist()
            [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        api = "Mesh.unflatten"
        if isinstance(axis, str):
            i = as_axis_index(api, self._axis_names, axis, self)
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
                parts.append(L.canonical_layout(L.compose_mode(old, size, step)))
            except MeshError:
                raise MeshError(
                    requires(api, f"sizes that split axis {axis!r} along its modes {old} (outermost first)",
                             "sizes", dict(items),
                             f"sizes whose inner-to-outer products line up with the modes, e.g. {old.shape} "
                             f"or ({old.size},)"),
                    mesh=self) from None
        names = self._axis_names[:i] + new_names + self._axis_names[i + 1:]
        return self._derive(api, names, self._layouts[:i] + tuple(parts) + self._layouts[i + 1:], True)

    def rename(self, mapping: Mapping[str, str]) -> Any:
        """Rename axes simultaneously; names not in the mapping stay.

        Args:
            mapping: ``{old: new}``; ``{"a": "b", "b": "a"}`` swaps two names.

        Returns:
            The same mesh under the new names.

        Raises:
            UnknownAxisError: an old name that is not an axis.
            MeshError: new names that repeat or are empty.
            TypeError: a mapping of another type.

        Examples:
            >>> import functional_mesh as fm
            >>> fm.make_mesh((2, 4), ("dp", "tp")).rename({"dp": "data", "tp": "model"})
            Mesh(data=2, model=4)
        """
        if not isinstance(mapping, Mapping):
            raise TypeError(requires("Mesh.rename", "a mapping {old: new}", "mapping", mapping))
        for old, new in mapping.items():
            as_axis_index("Mesh.rename", self._axis_names, old, self)
            as_name_tuple("Mesh.rename", (new,), "new name")
        names = tuple(mapping.get(n, n) for n in self._axis_names)
        return self._derive("Mesh.rename", names, self._layouts, True)


def select(mesh: Any, names: object, api: str) -> Any:
    """``mesh[names]``, for the error of the public call ``api`` (``realize(axes=)``, ``rm[...]``, ...)."""
    if isinstance(names, int) and not isinstance(names, bool):
        msg = requires(api, "axis names, not positions", "key", names, mesh._axis_names)
        if -len(mesh._axis_names) <= names < len(mesh._axis_names):
            msg += f"; write mesh[{mesh._axis_names[names]!r}]"
        raise TypeError(msg)
    pos = mesh._positions(api, names)
    return mesh._derive(api, tuple(mesh._axis_names[i] for i in pos), tuple(mesh._layouts[i] for i in pos),
                        len(pos) == len(mesh._axis_names))


def _along(api: str, name: str, index: object, size: int) -> int | range | tuple[int, ...]:
    """One axis's positions for ``take``: an int (the axis goes), or a range or tuple of distinct ones (it stays)."""
    valid = f"{-size}..{size - 1}"
    if isinstance(index, slice):
        try:
            kept: range | tuple[int, ...] = range(size)[index]
        except (TypeError, ValueError):  # bounds that are not ints; a step of 0
            raise TypeError(requires(api, "a slice of int positions with a non-zero step", name, index)) from None
    elif isinstance(index, (str, bytes, Mapping, AbstractSet)):
        raise TypeError(requires(api, "an int, a slice or a sequence of int positions", name, index))
    elif not isinstance(index, Iterable) or getattr(index, "ndim", 1) == 0:  # an int, a numpy int
        k = as_int(api, name, index)
        if not -size <= k < size:
            raise MeshError(requires(api, f"a position of axis {name!r} (size {size})", name, k, valid))
        return k % size
    else:
        given = tuple(as_int(api, "position", k) for k in index)
        if any(not -size <= k < size for k in given):
            raise MeshError(requires(api, f"positions of axis {name!r} (size {size})", name, index, valid))
        kept = tuple(k % size for k in given)
        if len(set(kept)) != len(kept):
            twice = next(k for j, k in enumerate(kept) if k in kept[:j])
            raise MeshError(requires(api, f"distinct positions of axis {name!r}", name, index, valid)
                            + f"; position {twice} appears twice")
    if not kept:
        raise MeshError(requires(api, f"a non-empty selection of axis {name!r} (size {size})", name, index, valid))
    return kept


def _taken(devices: Any, family: L.Modes, layouts: tuple[L.Layout, ...], chosen: dict[int, Any]) -> Any:
    """The device list of a ``take``: the positions it keeps, group by group in torch's order, each row-major.

    When the positions form a layout, a range of devices stays a range in O(ndim); otherwise the
    positions are enumerated (O(ranks kept)).
    """
    walk = _walk(family, layouts, chosen)
    if walk is not None:
        return devices.sublist_of_layout(*walk)
    positions = L.indices(L.canonical_layout(family))
    for i, lay in enumerate(layouts):
        picked = chosen.get(i, range(lay.size))
        values = L.modes_value(lay.modes, np.asarray(picked, dtype=np.int64))
        positions = positions + values if isinstance(picked, int) else np.add.outer(positions, values)
    return devices.sublist(positions)


def _walk(family: L.Modes, layouts: tuple[L.Layout, ...], chosen: dict[int, Any]) -> tuple[int, L.Modes] | None:
    """The kept positions as ``offset + layout(i)`` (signed modes), or ``None`` when no layout expresses them.

    An axis fits when it stays whole, keeps one position, or walks its one mode in equal steps.
    """
    offset, walks = 0, list(family)
    for i, lay in enumerate(layouts):
        picked = chosen.get(i, range(lay.size))
        if isinstance(picked, int) or len(picked) == 1:
            offset += L.modes_value(lay.modes, picked if isinstance(picked, int) else picked[0])
        elif picked == range(lay.size):
            walks.extend(lay.modes)
        elif len(lay.modes) == 1 and (isinstance(picked, range)  # a slice: equal steps, known without a loop
                                      or len({b - a for a, b in zip(picked, picked[1:])}) == 1):
            offset += L.modes_value(lay.modes, picked[0])
            walks.append((len(picked), (picked[1] - picked[0]) * lay.modes[0][1]))
        else:
            return None
    return offset, tuple(walks)


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
