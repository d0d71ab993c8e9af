"""A mesh's transformations: new axes from its axes' layouts alone, in O(ndim).

Pure functions over a mesh's parts behind :class:`~functional_mesh.Mesh`'s selections (``mesh[...]``,
``transpose``, ``take``: some axes, in any order) and reshapes (``flatten``, ``unflatten``, ``rename``:
the same positions, so the same family). Each returns new names and layouts and never looks at the
ranks. The ``mesh`` argument rides on the errors only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from . import _layout as L
from ._devices import DeviceList
from ._errors import MeshError, requires
from ._validate import as_axis_index, as_int, as_name_tuple, check_unique

__all__ = ["flatten", "positions", "rename", "select", "take", "transpose", "unflatten"]

Names = tuple[str, ...]
Layouts = tuple[L.Layout, ...]


def positions(api: str, axis_names: Names, names: object, mesh: object, what: str = "axes") -> tuple[int, ...]:
    """The positions of ``names`` (one name or distinct names, at least one) among ``axis_names``."""
    names_t = as_name_tuple(api, names, what)
    if not names_t:
        raise MeshError(requires(api, "at least one axis", what, names_t, axis_names), mesh=mesh)
    check_unique(api, names_t, what)
    return tuple([as_axis_index(api, axis_names, n, mesh) for n in names_t])


def select(axis_names: Names, layouts: Layouts, names: object, api: str, mesh: object) -> tuple[Names, Layouts]:
    """``mesh[names]``: the named axes, in that order, each with its layout."""
    if isinstance(names, int) and not isinstance(names, bool):
        msg = requires(api, "axis names, not positions", "key", names, axis_names)
        if -len(axis_names) <= names < len(axis_names):
            msg += f"; write mesh[{axis_names[names]!r}]"
        raise TypeError(msg)
    pos = positions(api, axis_names, names, mesh)
    return tuple([axis_names[i] for i in pos]), tuple([layouts[i] for i in pos])


def transpose(axis_names: Names, layouts: Layouts, axes: tuple[Any, ...], mesh: object) -> tuple[Names, Layouts]:
    """``mesh.transpose(*axes)``: a permutation of all the axes, as separate names or one tuple."""
    names = axes[0] if len(axes) == 1 and not isinstance(axes[0], str) else axes
    names = as_name_tuple("Mesh.transpose", tuple(names) if isinstance(names, list) else names, "axes")
    for n in names:
        as_axis_index("Mesh.transpose", axis_names, n, mesh)
    if sorted(names) != sorted(axis_names) or len(set(names)) != len(names):
        raise MeshError(
            requires("Mesh.transpose", "a permutation of all axis names", "axes", names, axis_names), mesh=mesh)
    return names, tuple(layouts[axis_names.index(n)] for n in names)


def take(axis_names: Names, layouts: Layouts, devices: DeviceList, family: L.Modes,
         chosen_positions: Mapping[str, Any], mesh: object) -> tuple[Names, Layouts, DeviceList]:
    """``mesh.take(**positions)``: the axes kept, row-major over the device list of the ranks kept."""
    api = "Mesh.take"
    if not chosen_positions:
        raise MeshError(requires(api, "at least one axis=index", "positions", chosen_positions, axis_names),
                        mesh=mesh)
    chosen: dict[int, int | range | tuple[int, ...]] = {}
    for name, index in chosen_positions.items():
        i = as_axis_index(api, axis_names, name, mesh)
        chosen[i] = _along(api, name, index, layouts[i].size)
    kept = [i for i in range(len(layouts)) if not isinstance(chosen.get(i), int)]
    sizes = tuple(len(c) if (c := chosen.get(i)) is not None and not isinstance(c, int) else layouts[i].size
                  for i in kept)
    return tuple(axis_names[i] for i in kept), L.row_major_axes(sizes), _taken(devices, family, layouts, chosen)


def flatten(axis_names: Names, layouts: Layouts, axes: object, name: object, mesh: object) -> tuple[Names, Layouts]:
    """``mesh.flatten(axes, name)``: the listed axes (default all) merged, in the first one's place."""
    pos = tuple(range(len(axis_names))) if axes is None else positions("Mesh.flatten", axis_names, axes, mesh)
    if not pos:
        raise MeshError("`Mesh.flatten` requires a mesh with at least one axis, but got a 0-axis mesh", mesh=mesh)
    listed = tuple(axis_names[i] for i in pos)
    if name is None:
        name = "_".join(listed)
    if not isinstance(name, str):
        raise TypeError(requires("Mesh.flatten", "one str for name", "name", name))
    (merged_name,) = as_name_tuple("Mesh.flatten", name, "name")
    names: list[str] = []
    new: list[L.Layout | None] = []
    at = 0
    for i, n in enumerate(axis_names):  # one pass: the merged axis in its first part's place
        if i == pos[0]:
            at = len(names)
            names.append(merged_name)
            new.append(None)
        elif i not in pos:
            names.append(n)
            new.append(layouts[i])
    if merged_name in names[:at] or merged_name in names[at + 1:]:
        remaining = tuple(n for i, n in enumerate(axis_names) if i not in pos)
        raise MeshError(
            requires("Mesh.flatten", "a merged name distinct from the remaining axes", "name", merged_name)
            + f"; remaining axes: {remaining}", mesh=mesh)
    new[at] = L.concat(*(layouts[i] for i in pos))
    return tuple(names), tuple(new)  # type: ignore[arg-type]  # every None was replaced


def unflatten(axis_names: Names, layouts: Layouts, axis: object, sizes: object, mesh: object) -> tuple[Names, Layouts]:
    """``mesh.unflatten(axis, sizes)``: one axis split into new ones, row-major along its modes, in its place."""
    api = "Mesh.unflatten"
    if isinstance(axis, str):
        i = as_axis_index(api, axis_names, axis, mesh)
    else:  # a 1-tuple names one axis, as in selections; more is a mistake, not "the first one"
        found = positions(api, axis_names, axis, mesh, "axis")
        if len(found) != 1:
            raise MeshError(requires(api, "one axis to split", "axis", axis, axis_names), mesh=mesh)
        i = found[0]
    items = _size_items(api, sizes)
    new_names = tuple(n for n, _ in items)
    new_sizes = tuple(s for _, s in items)
    old = layouts[i]
    if math.prod(new_sizes) != old.size:
        raise MeshError(
            requires(api, f"sizes whose product equals the size of axis {axis!r} ({old.size})", "sizes",
                     dict(items)), mesh=mesh)
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
                mesh=mesh) from None
    return axis_names[:i] + new_names + axis_names[i + 1:], layouts[:i] + tuple(parts) + layouts[i + 1:]


def rename(axis_names: Names, mapping: object, mesh: object) -> Names:
    """``mesh.rename(mapping)``: every name through ``{old: new}``, all at once; names not in it stay."""
    if not isinstance(mapping, Mapping):
        raise TypeError(requires("Mesh.rename", "a mapping {old: new}", "mapping", mapping))
    for old, new in mapping.items():
        as_axis_index("Mesh.rename", axis_names, old, mesh)
        as_name_tuple("Mesh.rename", (new,), "new name")
    return tuple(mapping.get(n, n) for n in axis_names)


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


def _taken(devices: DeviceList, family: L.Modes, layouts: Layouts, chosen: dict[int, Any]) -> DeviceList:
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


def _walk(family: L.Modes, layouts: Layouts, chosen: dict[int, Any]) -> tuple[int, L.Modes] | None:
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
