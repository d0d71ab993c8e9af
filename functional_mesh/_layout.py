"""Pure integer layout algebra in the spirit of CuTe, linearised row-major.

Layouts are kept canonical (:func:`coalesce`), so equal functions are equal values; what a layout
computes: docs/design.md, "Ranks and layouts".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ._errors import MeshError
from ._validate import Frozen, as_int, as_int_tuple

__all__ = [
    "Layout",
    "coalesce",
    "complement",
    "composition",
    "concat",
    "cosize",
    "decompose",
    "groups",
    "indices",
    "is_injective",
    "row_major",
    "row_major_strides",
    "size",
]

Modes = tuple[tuple[int, int], ...]  # ((shape, stride), ...), outermost first


def canonical_modes(modes: Iterable[tuple[int, int]]) -> Modes:
    """Coalesce ``modes``: drop size-1 modes, merge an outer mode into the inner one it continues.

    Preserves the function ``i -> index`` exactly (law: ``indices`` is unchanged), for strides of
    any sign (a device list walks its ranks backwards with a negative one).
    """
    out: list[tuple[int, int]] = []  # built innermost first
    for shape, stride in reversed(tuple(modes)):
        if shape == 1:
            continue
        if out:
            inner_shape, inner_stride = out[-1]
            if inner_shape * inner_stride == stride:
                out[-1] = (inner_shape * shape, inner_stride)
                continue
        out.append((shape, stride))
    out.reverse()
    return tuple(out)


class Layout(Frozen):
    """A flat layout ``shape:stride`` in canonical (coalesced) form; immutable, hashable.

    Calling a layout on a flat coordinate gives its index; layouts with the same function are equal.

    Args:
        shape: positive mode sizes, outermost first (one int for one mode).
        stride: non-negative steps, one per mode (default: row-major over ``shape``).

    Raises:
        MeshError: a mode size below 1, a negative stride, or a stride count unlike the shape's.

    Examples:
        >>> Layout((2, 4), (4, 1)) == Layout(8)
        True
        >>> Layout((2, 4), (1, 2))(1)                 # coordinate 1 = digits (0, 1)
        2
    """

    __slots__ = ("modes", "_hash")  # modes: the ``(shape, stride)`` pairs, outermost first
    modes: Modes
    _hash: int

    def __init__(self, shape: int | Sequence[int] = (), stride: int | Sequence[int] | None = None) -> None:
        shape_t = as_int_tuple("Layout", "shape", shape)
        if any(s < 1 for s in shape_t):
            raise MeshError(f"`Layout` requires positive mode sizes, but got shape={shape_t!r}")
        if stride is None:
            stride_t = row_major_strides(shape_t)
        else:
            stride_t = as_int_tuple("Layout", "stride", stride)
            if len(stride_t) != len(shape_t):
                raise MeshError(
                    f"`Layout` requires one stride per mode, but got shape={shape_t!r}, stride={stride_t!r}"
                )
            if any(d < 0 for d in stride_t):
                raise MeshError(f"`Layout` requires non-negative strides, but got stride={stride_t!r}")
        self._set(canonical_modes(zip(shape_t, stride_t, strict=True)))

    def _set(self, modes: Modes) -> None:
        object.__setattr__(self, "modes", modes)
        object.__setattr__(self, "_hash", hash(modes))

    @property
    def shape(self) -> tuple[int, ...]:
        """The extent of each mode, outermost first."""
        return tuple(s for s, _ in self.modes)

    @property
    def stride(self) -> tuple[int, ...]:
        """The index step of each mode, outermost first."""
        return tuple(d for _, d in self.modes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self is other or self.modes == other.modes

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Callable[[Iterable[tuple[int, int]]], Layout], tuple[Modes]]:
        return (canonical_layout, (self.modes,))

    @property
    def size(self) -> int:
        """Number of coordinates: the product of the mode sizes."""
        return math.prod([s for s, _ in self.modes])  # a list: torch.compile traces it

    @property
    def cosize(self) -> int:
        """One past the largest index: ``layout(size - 1) + 1``."""
        return 1 + sum((s - 1) * d for s, d in self.modes)

    def __call__(self, coordinate: int) -> int:
        """The index of flat (row-major) ``coordinate`` in ``[0, size)``."""
        i = as_int("Layout.__call__", "coordinate", coordinate)
        if not 0 <= i < self.size:
            raise MeshError(
                f"`Layout.__call__` requires a coordinate in [0, {self.size}), but got coordinate={i!r}"
            )
        return modes_value(self.modes, i)

    def __repr__(self) -> str:
        return f"Layout({self})"

    def __str__(self) -> str:
        if not self.shape:
            return "1:0"
        if len(self.shape) == 1:
            return f"{self.shape[0]}:{self.stride[0]}"
        return f"({','.join(map(str, self.shape))}):({','.join(map(str, self.stride))})"


def canonical_layout(modes: Iterable[tuple[int, int]]) -> Layout:
    """The layout of ``modes``, coalesced, without the constructor's checks: the algebra's own constructor.

    For modes already known to be ints with positive sizes (every transformation's result, and a
    device list's walk, whose strides may be negative); ``Layout(shape, stride)`` checks user input.
    """
    lay = object.__new__(Layout)
    lay._set(canonical_modes(modes))
    return lay


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Compact row-major strides over ``shape``: the last mode has stride 1.

    Args:
        shape: mode sizes, outermost first.

    Returns:
        One stride per mode; each is the product of the sizes after it.

    Examples:
        >>> row_major_strides((2, 3, 4))
        (12, 4, 1)
    """
    strides = []
    step = 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


def row_major_axes(sizes: Sequence[int]) -> tuple[Layout, ...]:
    """One single-mode layout per axis of a compact row-major grid over ``sizes`` (a mesh's axes)."""
    # equal lengths by construction: the strides are computed from the sizes
    return tuple(canonical_layout(((s, d),)) for s, d in zip(sizes, row_major_strides(sizes)))


def row_major(shape: Sequence[int]) -> Layout:
    """The compact row-major layout over ``shape``: the identity on ``[0, prod(shape))``.

    Args:
        shape: positive mode sizes, outermost first.

    Returns:
        The canonical layout (one mode of ``prod(shape)``, or ``1:0`` for an empty shape).

    Raises:
        MeshError: a size below 1.

    Examples:
        >>> row_major((2, 3))
        Layout(6:1)
    """
    return Layout(shape)


def size(layout: Layout) -> int:
    """Number of coordinates of ``layout``: the product of its mode sizes.

    Args:
        layout: a layout.

    Returns:
        ``layout.size``.

    Examples:
        >>> size(Layout((2, 3), (6, 1)))
        6
    """
    return layout.size


def cosize(layout: Layout) -> int:
    """One past the largest index ``layout`` produces: ``layout(size - 1) + 1``.

    Args:
        layout: a layout.

    Returns:
        ``layout.cosize``: the length of the smallest range ``[0, n)`` that holds its indices.

    Examples:
        >>> cosize(Layout((2, 3), (6, 1)))
        9
    """
    return layout.cosize


def coalesce(shape: Sequence[int], stride: Sequence[int]) -> Layout:
    """The canonical layout with the same function as ``shape:stride``.

    Args:
        shape: positive mode sizes, outermost first.
        stride: one non-negative stride per mode.

    Returns:
        The canonical :class:`Layout`.

    Raises:
        MeshError: a size below 1, a negative stride, or a stride count unlike the shape's.

    Examples:
        >>> coalesce((2, 2, 3), (6, 3, 1)), coalesce((2, 1, 3), (3, 7, 1))
        (Layout(12:1), Layout(6:1))
    """
    return Layout(shape, stride)


def concat(*layouts: Layout) -> Layout:
    """The layout whose modes are those of ``layouts`` in order (outermost first).

    How several axes flatten into one: ``(i_1, ..., i_k)`` maps to ``layouts[0](i_1) + ...``.

    Args:
        *layouts: layouts, outermost first.

    Returns:
        The canonical layout of their modes together.

    Examples:
        >>> concat(Layout(2, 4), Layout(4, 1))              # contiguous: one mode
        Layout(8:1)
    """
    return canonical_layout(m for lay in layouts for m in lay.modes)


def complement_modes(modes: Iterable[tuple[int, int]], n: int, shown: object) -> Modes:
    """Modes (outermost first) of the complement of ``modes`` within ``[0, n)``.

    The complement fills every gap between the modes (sorted by stride) and repeats the whole
    block up to ``n``. It exists iff each stride is a multiple of the span below it and ``n``
    is a multiple of the total span; otherwise ``MeshError`` naming ``shown``.
    """
    gaps: list[tuple[int, int]] = []
    span = 1
    for shape, stride in sorted(modes, key=_by_stride):
        if stride == 0 or stride % span:
            raise MeshError(
                f"`complement` requires a layout whose modes do not overlap and are aligned "
                f"(each stride a multiple of the span below it), but got layout={shown}"
            )
        if stride > span:
            gaps.append((stride // span, span))
        span = stride * shape
    if n < 1 or n % span:
        raise MeshError(
            f"`complement` requires a size that is a multiple of the layout's span {span}, "
            f"but got n={n!r} for layout={shown}"
        )
    if n > span:
        gaps.append((n // span, span))
    gaps.reverse()
    return tuple(gaps)


def _by_stride(mode: tuple[int, int]) -> int:
    return mode[1]


def complement(layout: Layout, n: int) -> Layout:
    """The layout ``c`` of offsets such that ``{c(j) + layout(i)}`` is exactly ``[0, n)``.

    Its modes by decreasing stride, so its translates come in increasing order of their smallest
    index (torch's and Megatron's group order); ``size(layout) * size(c) == n``.

    Args:
        layout: an injective layout whose modes are aligned (each stride a multiple of the
            span of the modes below it).
        n: the size of the range to tile.

    Returns:
        The complement layout (``1:0`` when ``layout`` alone covers ``[0, n)``).

    Raises:
        MeshError: when ``layout`` overlaps itself, is not aligned, or does not divide ``n``.

    Examples:
        >>> complement(Layout(2, 4), 8)                     # dp of (dp=2, tp=4): one group per tp
        Layout(4:1)
    """
    n = as_int("complement", "n", n)
    return canonical_layout(complement_modes(layout.modes, n, layout))


def composition(outer: Layout, inner: Layout) -> Layout:
    """The layout ``outer ∘ inner``: coordinate ``i`` maps to ``outer(inner(i))``.

    ``inner`` selects coordinates of ``outer``; the result exists as a layout when each mode
    of ``inner`` walks ``outer``'s modes in whole steps (CuTe's divisibility condition).

    Args:
        outer: the layout applied second.
        inner: the layout applied first; its indices must lie in ``[0, size(outer))``.

    Returns:
        The composed layout.

    Raises:
        MeshError: when ``inner`` leaves ``outer``'s domain or is not expressible over its modes.

    Examples:
        >>> composition(Layout((2, 4), (1, 2)), Layout(4, 2))   # every 2nd coordinate
        Layout((2,2):(1,4))
    """
    if inner.cosize > outer.size:
        raise MeshError(
            f"`composition` requires the inner layout to stay inside the outer layout's "
            f"{outer.size} coordinates, but got inner={inner} (cosize {inner.cosize}) for outer={outer}"
        )
    modes: list[tuple[int, int]] = []
    for s, d in inner.modes:
        modes.extend(compose_mode(outer, s, d, inner))
    return canonical_layout(modes)


def compose_mode(outer: Layout, shape: int, stride: int, shown: object = None) -> list[tuple[int, int]]:
    """Modes (outermost first) of ``outer`` restricted to the arithmetic walk ``shape:stride``.

    ``shown`` names the inner layout in the error message (default: the walk itself).
    """
    if stride == 0:
        return [(shape, 0)]
    picked: list[tuple[int, int]] = []  # innermost first
    rest_shape, rest_stride = shape, stride
    for a_shape, a_stride in reversed(outer.modes):
        if rest_shape == 1:
            break
        if rest_stride >= a_shape:
            if rest_stride % a_shape:
                break  # the walk straddles this mode: not a layout
            rest_stride //= a_shape
            continue
        if a_shape % rest_stride:
            break
        available = a_shape // rest_stride
        take = min(available, rest_shape)
        if rest_shape > available and rest_shape % available:
            break
        picked.append((take, a_stride * rest_stride))
        rest_shape //= take
        rest_stride = 1
    if rest_shape != 1:
        raise MeshError(
            f"`composition` requires each mode of the inner layout to split the outer layout's "
            f"modes evenly, but got mode {shape}:{stride} of inner={shown or f'{shape}:{stride}'} "
            f"against outer={outer}"
        )
    return picked[::-1]


def is_injective(layout: Layout) -> bool:
    """True when no two coordinates of ``layout`` map to the same index.

    Args:
        layout: a layout.

    Returns:
        Whether ``layout`` is one-to-one (the axes of a mesh must be).

    Examples:
        >>> is_injective(Layout((2, 2), (4, 1))), is_injective(Layout((2, 2), (1, 1)))
        (True, False)
    """
    span = 1
    for stride, shape in sorted((d, s) for s, d in layout.modes):
        if stride < span:
            return bool(np.unique(indices(layout)).size == layout.size)
        span = stride * shape
    return True


def indices(layout: Layout) -> np.ndarray:
    """The indices of ``layout`` for coordinates ``0..size-1``, as an int64 array.

    Args:
        layout: a layout.

    Returns:
        A 1-d int64 array of ``size(layout)`` indices.

    Examples:
        >>> indices(Layout((2, 2), (1, 4))).tolist()
        [0, 4, 1, 5]
    """
    out = np.zeros(1, dtype=np.int64)
    for s, d in layout.modes:
        out = np.add.outer(out, np.arange(s, dtype=np.int64) * d).reshape(-1)
    return out


def groups(layout: Layout, n: int) -> np.ndarray:
    """Every translate of ``layout`` inside ``[0, n)``: shape ``(n // size, size)``.

    Row ``j`` is ``complement(layout, n)(j) + indices(layout)``; the rows partition ``[0, n)``.

    Args:
        layout: an injective, aligned layout whose size divides ``n``.
        n: the size of the range to tile.

    Returns:
        An int64 array of shape ``(n // size(layout), size(layout))``.

    Raises:
        MeshError: as :func:`complement`.

    Examples:
        >>> groups(Layout(2, 4), 8).tolist()
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    """
    offsets = indices(complement(layout, n))
    return np.add.outer(offsets, indices(layout))


def decompose(layout: Layout, n: int, index: int) -> tuple[int, int]:
    """Locate ``index`` in ``[0, n)``: ``(j, i)`` with ``complement(layout, n)(j) + layout(i) == index``.

    Args:
        layout: an injective, aligned layout whose size divides ``n``.
        n, index: the size of the range, and a position in it.

    Returns:
        ``(group, coordinate)``: which translate holds ``index``, and where in it.

    Raises:
        MeshError: an ``index`` outside ``[0, n)``, or a layout as :func:`complement` refuses.

    Examples:
        >>> decompose(Layout(2, 4), 8, 5)                   # 5 = complement(1) + layout(1)
        (1, 1)
    """
    index = as_int("decompose", "index", index)
    if not 0 <= index < n:
        raise MeshError(f"`decompose` requires an index in [0, {n}), but got index={index!r}")
    comp = complement_modes(layout.modes, n, layout)
    return digits_value(comp, index), digits_value(layout.modes, index)


def modes_value(modes: Modes, coordinate: int) -> int:
    """The index of flat (row-major) ``coordinate`` under ``modes``: the layout's function, unchecked.

    The inverse direction of :func:`digits_value` for an index the modes own.
    """
    index = 0
    for s, d in reversed(modes):
        coordinate, digit = divmod(coordinate, s)
        index += digit * d
    return index


def digits_value(modes: Modes, index: int) -> int:
    """The row-major coordinate over ``modes`` of the digits of ``index`` in a tiling they belong to.

    In a tiling of ``[0, n)`` every mode ``s:d`` owns the digit ``(index // d) % s``.
    """
    value = 0
    for s, d in modes:
        value = value * s + (index // d) % s
    return value
