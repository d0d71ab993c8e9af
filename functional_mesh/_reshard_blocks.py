"""The block arithmetic under a reshard plan: which pieces of one sharding meet a block of another.

Each dim is split by a nested chunk tree (``torch.chunk``'s rule, major axis first, as
:func:`~functional_mesh._sharding.chunk_block`); the functions here answer the plan's questions about
those trees by arithmetic, visiting only what they name. Pure: numpy and our layouts, no torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from . import _layout as L
from ._devices import DeviceList
from ._mesh import axis_layouts
from ._sharding import NamedSharding

__all__ = ["Side", "bounds", "chunk", "common_ranks", "count_before", "leaves", "linear", "nonempty", "piece_lists",
           "pieces", "relay_root"]


# -- one dim: the nested chunk tree (torch.chunk's rule, major axis first) ------------------------------

def chunk(n: int, sizes: tuple[int, ...], idx: tuple[int, ...]) -> tuple[int, int]:
    """``[start, stop)`` of the leaf ``idx`` (one index per axis) of ``[0, n)`` split by ``sizes``."""
    start, length = 0, n
    for size, i in zip(sizes, idx, strict=True):
        piece = -(-length // size) if length else 0
        lo = min(i * piece, length)
        start, length = start + lo, min(piece, length - lo)
    return start, start + length


def leaves(n: int, sizes: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple[int, ...], int, int]]:
    """The non-empty leaves that meet ``[lo, hi)``, in position order: ``(idx, start, stop)``; only those are visited."""
    out: list[tuple[tuple[int, ...], int, int]] = []
    depth = len(sizes)

    def walk(level: int, start: int, length: int, idx: tuple[int, ...]) -> None:
        if level == depth:
            out.append((idx, start, start + length))
            return
        piece = -(-length // sizes[level])
        first = max(0, (lo - start) // piece)
        last = min(sizes[level] - 1, (hi - 1 - start) // piece)
        for i in range(first, last + 1):
            at = i * piece
            if at >= length:
                break
            walk(level + 1, start + at, min(piece, length - at), idx + (i,))

    if lo < hi and n > 0:
        walk(0, 0, n, ())
    return out


def nonempty(length: int, sizes: tuple[int, ...], level: int) -> int:
    """How many non-empty leaves a node of ``length`` at ``level`` has (its children: equal but the last)."""
    if length == 0:
        return 0
    if level == len(sizes):
        return 1
    piece = -(-length // sizes[level])
    k = -(-length // piece)
    return (k - 1) * nonempty(piece, sizes, level + 1) + nonempty(length - piece * (k - 1), sizes, level + 1)


def count_before(n: int, sizes: tuple[int, ...], x: int) -> int:
    """How many non-empty leaves end at or before ``x``: one path down the tree, O(depth²)."""
    count, start, length = 0, 0, n
    for level, size in enumerate(sizes):
        if length == 0 or x <= start:
            return count
        if x >= start + length:
            return count + nonempty(length, sizes, level)
        piece = -(-length // size)
        f = (x - start) // piece  # the child holding x; the ones before it are all full-size
        count += f * nonempty(piece, sizes, level + 1)
        start, length = start + f * piece, min(piece, length - f * piece)
    return count + (1 if length and start + length <= x else 0)


def piece_lists(shape: tuple[int, ...], sizes: tuple[tuple[int, ...], ...],
                 block: list[tuple[int, int]]) -> list[tuple[tuple[int, tuple[tuple[int, ...], int, int]], ...]]:
    """Per dim, the leaves of a split that meet ``block``: ``(rank among those meeting it, (idx, start, stop))``."""
    return [tuple(enumerate(leaves(n, s, lo, hi))) for n, s, (lo, hi) in zip(shape, sizes, block, strict=True)]


def pieces(shape: tuple[int, ...], sizes: tuple[tuple[int, ...], ...], block: list[tuple[int, int]]
           ) -> Iterator[tuple[tuple[int, tuple[tuple[int, ...], int, int]], ...]]:
    """The pieces of a split that meet ``block``, row-major over the dims: per dim ``(rank, (idx, start, stop))``."""
    return itertools.product(*piece_lists(shape, sizes, block))


def relay_root(k: int, count: int, replicas: int) -> int:
    """The replica at the root of the tree of piece ``k`` of the ``count`` meeting a block: ``(k * R) // count``.

    Fewer pieces than replicas: the roots lie ``R / count`` apart. More: each replica roots ``count / R`` of
    them, consecutive pieces together."""
    return k * replicas // count


def linear(idx: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    value = 0
    for i, s in zip(idx, sizes, strict=True):
        value = value * s + i
    return value


# -- one side of the plan: a sharding read as split and replica coordinates -----------------------------

class Side:
    """A sharding's layout, read once: per dim the mesh axes that split it, and the replica axes."""

    __slots__ = ("mesh", "dims", "sizes", "replica_axes", "replica_sizes", "replicas", "modes", "devices",
                 "ndim_mesh")

    def __init__(self, sharding: NamedSharding, ndim: int) -> None:
        mesh = sharding.mesh
        position = {n: i for i, n in enumerate(mesh.axis_names)}
        axis_sizes = mesh.axis_sizes
        self.mesh = mesh
        self.dims = tuple(tuple(position[a] for a in sharding.spec.axes_of(d)) for d in range(ndim))
        self.sizes = tuple(tuple(axis_sizes[p] for p in axes) for axes in self.dims)
        split = {p for axes in self.dims for p in axes}
        self.replica_axes = tuple(i for i in range(mesh.ndim) if i not in split)
        self.replica_sizes = tuple(axis_sizes[i] for i in self.replica_axes)
        self.replicas = math.prod(self.replica_sizes)
        self.modes = tuple(lay.modes for lay in axis_layouts(mesh))
        self.devices = mesh.device_list
        self.ndim_mesh = mesh.ndim

    def split(self, coord: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(coord[p] for p in axes) for axes in self.dims)

    def replica(self, coord: tuple[int, ...]) -> int:
        value = 0
        for p, s in zip(self.replica_axes, self.replica_sizes, strict=True):
            value = value * s + coord[p]
        return value

    def split_position(self, split: tuple[tuple[int, ...], ...]) -> int:
        """The split coordinates' part of a position in the device list."""
        modes, pos = self.modes, 0
        for axes, idx in zip(self.dims, split, strict=True):
            for p, i in zip(axes, idx, strict=True):
                pos += L.modes_value(modes[p], i)
        return pos

    def replica_position(self, replica: int) -> int:
        """The replica index's part of a position in the device list."""
        modes, pos = self.modes, 0
        for p, s in zip(reversed(self.replica_axes), reversed(self.replica_sizes), strict=True):
            replica, c = divmod(replica, s)
            pos += L.modes_value(modes[p], c)
        return pos

    def rank_of(self, split: tuple[tuple[int, ...], ...], replica: int) -> int:
        """The global rank at split coordinates ``split`` and replica index ``replica``: O(axes)."""
        return self.devices[self.split_position(split) + self.replica_position(replica)]

    def block(self, shape: tuple[int, ...], split: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
        return [chunk(n, sizes, idx) for n, sizes, idx in zip(shape, self.sizes, split, strict=True)]

    def blocks_of(self, shape: tuple[int, ...], ranks: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per dim, ``[start, stop)`` of the blocks of ``ranks`` (all devices of this mesh), as arrays."""
        devices = self.devices
        if devices.is_symbolic:
            step = devices[1] - devices[0] if len(devices) > 1 else 1
            positions = (ranks - devices[0]) // step
        else:
            array = devices.to_array()
            order = np.argsort(array, kind="stable")
            positions = order[np.searchsorted(array[order], ranks)]
        coords = [L.digits_value(m, positions) for m in self.modes]
        out = []
        for n, axes in zip(shape, self.dims, strict=True):
            start, length = np.zeros(ranks.size, dtype=np.int64), np.full(ranks.size, n, dtype=np.int64)
            for p in axes:
                size = self.mesh.axis_sizes[p]
                piece = -(-length // size)
                lo = np.minimum(coords[p] * piece, length)
                start, length = start + lo, np.minimum(piece, length - lo)
            out.append((start, start + length))
        return out

    def piece_offset(self, split: tuple[tuple[int, ...], ...]) -> int:
        value = 0
        for idx, sizes in zip(split, self.sizes, strict=True):
            value = value * math.prod(sizes) + linear(idx, sizes)
        return value


def bounds(devices: DeviceList) -> tuple[int, int]:
    """The smallest and largest rank of a non-empty device list: O(1) for a range."""
    if devices.is_symbolic:
        a, b = devices[0], devices[len(devices) - 1]
        return min(a, b), max(a, b)
    array = devices.to_array()
    return int(array.min()), int(array.max())


def common_ranks(a: DeviceList, b: DeviceList) -> np.ndarray:
    """The ranks in both device lists: O(1) when their spans are apart, else O(the smaller list)."""
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    if ahi < blo or bhi < alo:
        return np.zeros(0, dtype=np.int64)
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    ranks = small.to_array()
    ranks = ranks[(ranks >= max(alo, blo)) & (ranks <= min(ahi, bhi))]
    if large.is_symbolic and len(large) > 1:
        start, step = large[0], large[1] - large[0]
        q, r = np.divmod(ranks - start, step)
        return ranks[(r == 0) & (q >= 0) & (q < len(large))]
    return ranks[np.isin(ranks, large.to_array())]
