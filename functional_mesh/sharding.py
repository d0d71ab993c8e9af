"""Sharding values: ``PartitionSpec`` and ``NamedSharding``, pure shard arithmetic.

A ``PartitionSpec`` says, per tensor dim, which mesh axes split it: ``None`` (replicated), an
axis name, or a tuple of names (their product, first name major, as in JAX). Uneven dims follow
DTensor's rule, ``torch.chunk``'s: each axis splits its piece into chunks of ``ceil(n / k)``, the
last ones smaller or empty; a tuple splits by its first axis, then each piece by the next.

Nothing here imports torch except :attr:`NamedSharding.placements`, which builds DTensor
placement objects on demand.

Examples:
    >>> import functional_mesh as fm
    >>> mesh = fm.make_mesh((4, 2), ("x", "y"))
    >>> sh = fm.NamedSharding(mesh, fm.P("x", "y"))
    >>> sh.shard_shape((8, 4))
    (2, 2)
    >>> sh.local_slices((8, 4), 3)
    (slice(2, 4, None), slice(2, 4, None))
    >>> fm.NamedSharding(mesh, fm.P(("y", "x"), None)).local_slices((8, 4), 1)
    (slice(4, 5, None), slice(0, 4, None))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from .errors import MeshError, check_int, requires
from .mesh import Mesh

__all__ = ["P", "NamedSharding", "PartitionSpec"]

Entry = str | tuple[str, ...] | None


def _entry(value: object) -> Entry:
    """Normalise one spec entry: ``()`` -> None, ``("a",)`` -> "a" (equal meaning, equal value)."""
    if value is None or isinstance(value, str):
        if value == "":
            raise MeshError(requires("PartitionSpec", "axis names that are non-empty", "entry", value))
        return value
    if isinstance(value, (tuple, list)):
        for name in value:
            if not isinstance(name, str):
                raise TypeError(requires("PartitionSpec", "str axis names inside a tuple entry", "name", name))
            if not name:
                raise MeshError(requires("PartitionSpec", "axis names that are non-empty", "entry", tuple(value)))
        if len(value) == 0:
            return None
        return value[0] if len(value) == 1 else tuple(value)
    raise TypeError(requires("PartitionSpec", "None, an axis name or a tuple of axis names per dim", "entry", value))


@attrs.frozen(init=False, repr=False)
class PartitionSpec:
    """Per tensor dim: ``None``, an axis name, or a tuple of axis names. Trailing ``None``s dropped.

    Examples:
        >>> P("dp", None) == P("dp") == P(("dp",))
        True
        >>> P(("dp", "cp"), "tp")
        P(('dp', 'cp'), 'tp')
    """

    entries: tuple[Entry, ...]

    def __init__(self, *entries: object) -> None:
        normal = [_entry(e) for e in entries]
        while normal and normal[-1] is None:
            normal.pop()
        object.__setattr__(self, "entries", tuple(normal))

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i: int) -> Entry:
        return self.entries[i]

    def axes_of(self, dim: int) -> tuple[str, ...]:
        """The axes splitting ``dim``, major first (empty when replicated or past the end)."""
        if dim >= len(self.entries):
            return ()
        e = self.entries[dim]
        return () if e is None else (e,) if isinstance(e, str) else e

    def __repr__(self) -> str:
        return f"P({', '.join(map(repr, self.entries))})"


P = PartitionSpec


@attrs.frozen(init=False, repr=False)
class NamedSharding:
    """How a tensor is laid out over a mesh: ``spec`` names, per dim, the axes that split it.

    Over a family mesh (e.g. ``mesh["tp"]`` of a 2-D mesh) every submesh holds its own copy,
    sharded the same way.

    Raises:
        MeshError: an unknown axis (with "did you mean"), or an axis used twice.
    """

    mesh: Mesh
    spec: PartitionSpec

    def __init__(self, mesh: Mesh, spec: PartitionSpec | Sequence[object] = PartitionSpec()) -> None:
        if not isinstance(mesh, Mesh):
            raise TypeError(requires("NamedSharding", "a functional_mesh.Mesh", "mesh", mesh))
        if not isinstance(spec, PartitionSpec):
            if isinstance(spec, (tuple, list)):
                spec = PartitionSpec(*spec)
            else:
                raise TypeError(requires("NamedSharding", "a PartitionSpec", "spec", spec))
        seen: dict[str, int] = {}
        for dim in range(len(spec)):
            for name in spec.axes_of(dim):
                mesh.axis_index_of(name, "NamedSharding")
                if name in seen:
                    raise MeshError(
                        requires("NamedSharding", "each mesh axis at most once in the spec", "spec", spec)
                        + f"; axis {name!r} splits dims {seen[name]} and {dim}", mesh=mesh)
                seen[name] = dim
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "spec", spec)

    def _shape(self, api: str, global_shape: Sequence[int]) -> tuple[int, ...]:
        if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Sequence):
            raise TypeError(requires(api, "a tuple of ints for global_shape", "global_shape", global_shape))
        shape = tuple(check_int(api, "dim size", n) for n in global_shape)
        for d, n in enumerate(shape):
            if n < 0:
                raise MeshError(requires(api, "non-negative dim sizes", f"global_shape[{d}]", n))
        if len(self.spec) > len(shape):
            raise MeshError(
                requires(api, f"a tensor with at least as many dims as the spec ({len(self.spec)})",
                         "global_shape", shape) + f" for spec {self.spec}", mesh=self.mesh)
        return shape

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the largest shard (the first one along every split)."""
        shape = self._shape("NamedSharding.shard_shape", global_shape)
        out = []
        for d, n in enumerate(shape):
            for name in self.spec.axes_of(d):
                n = -(-n // self.mesh.axis_size(name))
            out.append(n)
        return tuple(out)

    def local_slices(self, global_shape: Sequence[int], rank: int) -> tuple[slice, ...] | None:
        """``rank``'s part of the global tensor, one slice per dim (``None`` if not a device)."""
        shape = self._shape("NamedSharding.local_slices", global_shape)
        coord = self.mesh.coordinate(rank)
        if coord is None:
            return None
        return self._slices(shape, dict(zip(self.mesh.axis_names, coord)))

    def _slices(self, shape: tuple[int, ...], index: dict[str, int]) -> tuple[slice, ...]:
        out = []
        for d, n in enumerate(shape):
            start, length = 0, n
            for name in self.spec.axes_of(d):  # torch.chunk's rule, major axis first
                piece = -(-length // self.mesh.axis_size(name)) if length else 0
                lo = min(index[name] * piece, length)
                start, length = start + lo, min(piece, length - lo)
            out.append(slice(start, start + length))
        return tuple(out)

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[int, tuple[slice, ...]]:
        """``{rank: slices}`` for every device of the mesh (every group of a family)."""
        shape = self._shape("NamedSharding.devices_indices_map", global_shape)
        return {rank: self._slices(shape, dict(zip(self.mesh.axis_names, self.mesh.coordinate(rank))))
                for rank in self.mesh.devices.tolist()}

    @property
    def is_fully_replicated(self) -> bool:
        """True when no axis of size > 1 splits any dim."""
        return all(self.mesh.axis_size(n) == 1 for d in range(len(self.spec)) for n in self.spec.axes_of(d))

    @property
    def placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh axis in mesh order.

        An axis that splits dim ``d`` is ``Shard(d)`` when the axes of ``d`` are listed in mesh
        order (DTensor applies placements in mesh order, each splitting the previous piece).
        Listed against mesh order, an axis that must split *inside* pieces made by axes that
        DTensor applies later becomes ``_StridedShard(d, split_factor=...)`` (the product of
        those later axes' sizes) — what FSDP2 + TP produce for ``P(("tp", "dp"))``.
        """
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.placement_types import _StridedShard

        order = {n: i for i, n in enumerate(self.mesh.axis_names)}
        out: list[Any] = [Replicate()] * self.mesh.ndim
        for d in range(len(self.spec)):
            axes = self.spec.axes_of(d)
            for j, name in enumerate(axes):
                later_outer = [a for a in axes[:j] if order[a] > order[name]]
                factor = math.prod(self.mesh.axis_size(a) for a in later_outer)
                out[order[name]] = _StridedShard(d, split_factor=factor) if later_outer else Shard(d)
        return tuple(out)

    def __repr__(self) -> str:
        return f"NamedSharding({self.mesh!r}, {self.spec!r})"
