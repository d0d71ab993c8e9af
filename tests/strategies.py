"""Hypothesis builders for layouts and meshes, shared by the law, unit and oracle suites."""

from __future__ import annotations

import math

from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import Layout

NAMES = ("a", "b", "c", "d", "e", "f")


@st.composite
def factorizations(draw, max_size: int = 64, max_factors: int = 4) -> tuple[int, ...]:
    """A tuple of sizes >= 1 whose product is at most ``max_size``."""
    sizes: list[int] = []
    for _ in range(draw(st.integers(0, max_factors))):
        room = max_size // math.prod(sizes or [1])
        if room < 1:
            break
        sizes.append(draw(st.integers(1, min(room, 6))))
    return tuple(sizes)


@st.composite
def tiling_layouts(draw, max_n: int = 64) -> tuple[Layout, int]:
    """``(layout, n)`` where ``layout`` and its complement tile ``[0, n)``.

    Built as a random subset, in random order, of the modes of a random row-major grid,
    which is exactly the family of layouts a mesh axis can have.
    """
    shape = draw(factorizations(max_n, 5))
    strides = fm.layout.row_major_strides(shape)
    modes = list(zip(shape, strides))
    picked = draw(st.lists(st.sampled_from(range(len(modes))), unique=True)) if modes else []
    layout = Layout(tuple(modes[i][0] for i in picked), tuple(modes[i][1] for i in picked))
    return layout, math.prod(shape)


@st.composite
def any_layouts(draw, max_modes: int = 4) -> Layout:
    """Arbitrary small layouts (possibly overlapping, possibly with stride 0)."""
    k = draw(st.integers(0, max_modes))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(k))
    stride = tuple(draw(st.integers(0, 12)) for _ in range(k))
    return Layout(shape, stride)


@st.composite
def device_lists(draw, n: int):
    """``None`` (symbolic iota), an offset range, or an explicit permuted/offset list of ``n`` ranks."""
    kind = draw(st.sampled_from(["iota", "offset", "permuted", "sparse"]))
    if kind == "iota":
        return None
    if kind == "offset":
        start = draw(st.integers(0, 16))
        return range(start, start + n)
    if kind == "permuted":
        return draw(st.permutations(list(range(n))))
    pool = draw(st.lists(st.integers(0, 4 * n + 8), min_size=n, max_size=n, unique=True))
    return pool


@st.composite
def meshes(draw, max_size: int = 64, max_axes: int = 4, explicit_devices: bool = True) -> fm.Mesh:
    """A mesh from ``make_mesh`` (sizes >= 1), optionally on an explicit device list."""
    sizes = draw(factorizations(max_size, max_axes))
    names = NAMES[: len(sizes)]
    devices = draw(device_lists(math.prod(sizes))) if explicit_devices else None
    return fm.make_mesh(sizes, names, devices=devices)


@st.composite
def derived_meshes(draw, max_size: int = 64, steps: int = 4) -> fm.Mesh:
    """A mesh reached by a random chain of select / flatten / unflatten / transpose / rename / take."""
    mesh = draw(meshes(max_size))
    for _ in range(draw(st.integers(0, steps))):
        mesh = draw(transformed(mesh))
    return mesh


_fresh = iter(f"x{i}" for i in range(10**9))


@st.composite
def transformed(draw, mesh: fm.Mesh) -> fm.Mesh:
    """One random legal pure transformation of ``mesh``."""
    ops = ["transpose", "rename"] if mesh.ndim else []
    if mesh.ndim:
        ops += ["select", "flatten", "unflatten", "take"]
    if not ops:
        return mesh
    op = draw(st.sampled_from(ops))
    names = list(mesh.axis_names)
    if op == "take":
        return mesh.take(**draw(take_indexes(mesh)))
    if op == "select":
        k = draw(st.integers(1, len(names)))
        return mesh[tuple(draw(st.permutations(names))[:k])]
    if op == "transpose":
        return mesh.transpose(*draw(st.permutations(names)))
    if op == "rename":
        new = f"r{draw(st.integers(0, 99))}"
        return mesh if new in names else mesh.rename({names[0]: new})
    if op == "flatten":
        k = draw(st.integers(1, len(names)))
        axes = tuple(draw(st.permutations(names))[:k])
        name = draw(st.sampled_from(["_".join(axes), axes[0], "m" + "".join(axes)]))
        if name in set(names) - set(axes):
            return mesh
        return mesh.flatten(axes, name=name)
    # unflatten along the canonical modes: any split of each mode's size in order is legal
    axis = draw(st.sampled_from(names))
    lay = mesh.axis_layout(axis)
    sizes: list[int] = []
    for s in lay.shape:
        parts = draw(st.sampled_from(_two_way_splits(s)))
        sizes.extend(parts)
    if not sizes:
        sizes = [1]
    new = [f"u{draw(st.integers(0, 10**6))}_{i}" for i in range(len(sizes))]
    if len(set(new)) != len(new) or set(new) & set(names):
        return mesh
    return mesh.unflatten(axis, dict(zip(new, sizes)))


@st.composite
def positions_along(draw, size: int) -> int | slice | list[int]:
    """One axis's index for ``Mesh.take``: an int (negative too), a non-empty slice, or distinct ints in any order."""
    kind = draw(st.sampled_from(["int", "slice", "list"]))
    if kind == "int":
        return draw(st.integers(-size, size - 1))
    if kind == "list":
        picked = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))
        return [k - size if draw(st.booleans()) else k for k in picked]  # negative positions count from the end
    while True:
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        index = slice(draw(st.none() | st.integers(-size, size)), draw(st.none() | st.integers(-size, size)), step)
        if len(range(size)[index]):
            return index


@st.composite
def take_indexes(draw, mesh: fm.Mesh) -> dict[str, int | slice | list[int]]:
    """``{axis: index}`` for ``mesh.take``: a non-empty random subset of its axes, each indexed at random."""
    axes = draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    return {a: draw(positions_along(mesh.axis_size(a))) for a in axes}


def _two_way_splits(s: int) -> list[tuple[int, ...]]:
    return [(s,)] + [(d, s // d) for d in range(2, s) if s % d == 0]
