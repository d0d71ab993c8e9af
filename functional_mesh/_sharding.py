"""Sharding values: ``PartitionSpec`` and ``NamedSharding``, pure shard arithmetic.

A spec names, per dim, the axes that split it; uneven dims follow DTensor's ``torch.chunk`` rule
(docs/sharding.md). Nothing here imports torch: :attr:`NamedSharding.placements` asks ``_torch``
to turn the pure :func:`placement_plan` into DTensor placements.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from ._errors import MeshError, requires
from ._mesh import Mesh, axes_size, axis_position
from ._validate import Frozen, as_int

__all__ = ["KINDS", "UNREDUCED", "P", "NamedSharding", "PartitionSpec", "chunk_block", "global_shape_of", "placement_plan", "shape_of", "spec_from_plan"]

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


def _axis_set(keyword: str, value: object, given: tuple[Entry, ...]) -> frozenset[str]:
    """The axes of ``unreduced=`` or ``reduced=``: any iterable of names (one name alone as well), none on a dim."""
    given_names = (value,) if isinstance(value, str) else value
    try:
        names: tuple[Any, ...] = tuple(given_names)  # type: ignore[arg-type]  # Any: the caller's, checked below
    except TypeError:
        raise TypeError(requires("PartitionSpec", f"{keyword}= an iterable of axis names", keyword,
                                 value)) from None
    for name in names:
        if not isinstance(name, str):
            raise TypeError(requires("PartitionSpec", f"str axis names in {keyword}=", "name", name))
        if not name:
            raise MeshError(requires("PartitionSpec", "axis names that are non-empty", keyword, value))
    split = {a for e in given if e is not None for a in ((e,) if isinstance(e, str) else e)}
    both = sorted(split.intersection(names))
    if both:
        raise MeshError(requires("PartitionSpec", f"each axis either splitting a dim or in {keyword}=, not both",
                                 keyword, set(names)) + f"; {both} also split a dim of "
                        f"P({', '.join(map(repr, given))}): a value is sharded or {keyword} over an axis")
    return frozenset(names)


KINDS = ("sum", "max", "min")  # the kinds of a pending reduction (JAX's UnreducedKind; DTensor's Partial(op))


def _kind(value: object, unreduced: frozenset[str]) -> str | None:
    """``unreduced_kind=``: one of :data:`KINDS` (or JAX's ``UnreducedKind`` member), only with unreduced axes."""
    if value is None:
        return "sum" if unreduced else None
    name = getattr(value, "name", value)  # jax.sharding.UnreducedKind.max -> "max"
    if name not in KINDS:
        raise MeshError(requires("PartitionSpec", "a reduction kind", "unreduced_kind", value, "'sum', 'max', 'min'"))
    if not unreduced:
        raise MeshError(requires("PartitionSpec", "unreduced_kind= only with unreduced axes (as in JAX)",
                                 "unreduced_kind", value) + "; name the pending axes in unreduced=, or drop "
                        "unreduced_kind=")
    return str(name)


def _unsupported_keyword(given: dict[str, object]) -> TypeError:
    name, value = next(iter(given.items()))
    return TypeError(requires("PartitionSpec", "axis entries and the keywords unreduced=, reduced=, unreduced_kind= "
                              "only", name, value, "unreduced=, reduced=, unreduced_kind="))


class PartitionSpec(Frozen):
    """Per tensor dim: ``None``, an axis name, or a tuple of axis names; and the axes the value is unreduced over.

    Equal specs are interchangeable: equality and hash follow the entries as written, after each
    entry's normal form (``()`` is ``None``, ``("dp",)`` is ``"dp"``). Trailing ``None``s count, as
    in JAX: ``P("dp", None)`` asks for a value of rank at least 2 (``len(spec)``), so it differs
    from ``P("dp")``, and ``P(None)``, which does not fit a 0-d tensor, from ``P()``. They split a
    tensor they both fit the same way. ``entries`` is the spec without its trailing ``None``s: the
    dims that are split, and the replicated ones before them.

    ``unreduced`` (JAX's ``P(unreduced=...)``, DTensor's ``Partial("sum")``): the axes over which
    the value is a pending sum: each member holds a term, and the value meant is the sum of the
    members' terms. Such an axis splits no dim. Iterating a spec, ``len`` and indexing see the
    dims only.

    A plain ``__slots__`` value (see :class:`~functional_mesh._validate.Frozen`): its constructor
    takes the entries positionally, as JAX's does, which an attrs field cannot express.

    Args:
        *entries: one per tensor dim: ``None`` (replicated), an axis name, or a tuple (or list)
            of axis names (their product, first name major); ``()`` is ``None`` and ``("dp",)``
            is ``"dp"``.
        unreduced: any iterable of axis names (or one name), over which the value is a pending
            reduction; default none.
        reduced: axes over which the value is invariant and its gradient a pending sum.
        unreduced_kind: the pending reduction: "sum" (default), "max" or "min"; only with unreduced.

    Raises:
        MeshError: an empty axis name, an axis both splitting a dim and pending (or reduced), an
            axis both unreduced and reduced, a kind without unreduced axes.
        TypeError: an entry of another type, or another keyword.

    Examples:
        >>> P("dp", None) == P(("dp",), ()), P("dp", None) == P("dp")
        (True, False)
        >>> P(("dp", "cp"), "tp")
        P(('dp', 'cp'), 'tp')
        >>> len(P("dp", None)), P("dp", None).entries
        (2, ('dp',))
        >>> P("dp", unreduced={"tp"}), P("dp", unreduced=["tp"]) == P("dp", unreduced="tp")
        (P('dp', unreduced={'tp'}), True)
        >>> P(unreduced="tp", unreduced_kind="max"), P("dp", reduced={"tp"})
        (P(unreduced={'tp'}, unreduced_kind='max'), P('dp', reduced={'tp'}))
    """

    __slots__ = ("entries", "unreduced", "reduced", "unreduced_kind", "_given", "_key")
    entries: tuple[Entry, ...]  # without trailing Nones
    unreduced: frozenset[str]  # the axes of a pending reduction
    reduced: frozenset[str]  # invariant, with a pending-sum gradient
    unreduced_kind: str | None  # "sum", "max" or "min" with unreduced axes, else None
    _given: tuple[Entry, ...]  # as written, each entry in normal form
    _key: tuple[Any, ...]  # the value: what equality compares (the entries, then the sorted unreduced axes)

    def __init__(self, *entries: object, unreduced: object = (), reduced: object = (), unreduced_kind: object = None,
                 **unsupported: object) -> None:
        if unsupported:
            raise _unsupported_keyword(unsupported)
        given = tuple(_entry(e) for e in entries)
        normal = list(given)
        while normal and normal[-1] is None:
            normal.pop()
        pending = _axis_set("unreduced", unreduced, given) if unreduced != () else frozenset()
        kept = _axis_set("reduced", reduced, given) if reduced != () else frozenset()
        if pending & kept:
            raise MeshError(requires("PartitionSpec", "unreduced= and reduced= without common axes (as in JAX)",
                                     "reduced", set(kept)) + f"; {sorted(pending & kept)} are also unreduced")
        kind = _kind(unreduced_kind, pending)
        tail: tuple[Any, ...] = (*sorted(pending),)
        if kept:
            tail += (("reduced", *sorted(kept)),)
        if kind not in (None, "sum"):
            tail += (("kind", kind),)
        object.__setattr__(self, "entries", tuple(normal))
        object.__setattr__(self, "unreduced", pending)
        object.__setattr__(self, "reduced", kept)
        object.__setattr__(self, "unreduced_kind", kind)
        object.__setattr__(self, "_given", given)
        object.__setattr__(self, "_key", given + ((_UNREDUCED_KEY, *tail),) if tail else given)

    @property
    def key(self) -> tuple[Any, ...]:
        """The spec as a plain tuple, which :meth:`from_key` turns back into it (a constant torch.compile
        can hold, where a spec is only dynamo's record)."""
        return self._key

    @staticmethod
    def from_key(key: tuple[Any, ...]) -> PartitionSpec:
        """The spec whose :attr:`key` is ``key``.

        Args:
            key: what :attr:`key` gave.

        Returns:
            An equal spec.

        Raises:
            MeshError: a key no spec gave (an empty name, an axis both splitting and unreduced).
            TypeError: a key no spec gave (an entry of another type).

        Examples:
            >>> spec = P("dp", None, unreduced={"tp"})
            >>> P.from_key(spec.key) == spec, P.from_key(P("dp").key)
            (True, P('dp'))
        """
        if key and isinstance(key[-1], tuple) and key[-1][:1] == (_UNREDUCED_KEY,):
            tail = key[-1][1:]
            more = {t[0]: t[1:] for t in tail if isinstance(t, tuple) and t}
            kind = more.get("kind", (None,))[0]
            return PartitionSpec(*key[:-1], unreduced=tuple(a for a in tail if not isinstance(a, tuple)),
                                 reduced=more.get("reduced", ()), unreduced_kind=kind)
        return PartitionSpec(*key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionSpec):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple[Callable[[tuple[Any, ...]], PartitionSpec], tuple[tuple[Any, ...]]]:
        return (PartitionSpec.from_key, (self._key,))

    def __len__(self) -> int:
        return len(self._given)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._given)

    def __getitem__(self, i: int) -> Entry:
        return self._given[i]

    def axes_of(self, dim: int) -> tuple[str, ...]:
        """The axes splitting tensor dim ``dim``, major first.

        Args:
            dim: a non-negative tensor dim.

        Returns:
            The axis names that split ``dim``; empty when it is replicated or past the spec's end.

        Examples:
            >>> P(("dp", "tp"), None).axes_of(0), P("dp").axes_of(3)
            (('dp', 'tp'), ())
        """
        if dim >= len(self.entries):
            return ()
        e = self.entries[dim]
        return () if e is None else (e,) if isinstance(e, str) else e

    def __repr__(self) -> str:
        parts = [repr(e) for e in self._given]
        if self.unreduced:
            parts.append("unreduced={" + ", ".join(map(repr, sorted(self.unreduced))) + "}")
        if self.reduced:
            parts.append("reduced={" + ", ".join(map(repr, sorted(self.reduced))) + "}")
        if self.unreduced_kind not in (None, "sum"):
            parts.append(f"unreduced_kind={self.unreduced_kind!r}")
        return f"P({', '.join(parts)})"


_UNREDUCED_KEY = None  # starts the tuple of unreduced axes in a spec's key (a dim's tuple holds names only)

P = PartitionSpec


@attrs.frozen(init=False, repr=False)
class NamedSharding:
    """How a tensor is laid out over a mesh: ``spec`` names, per dim, the axes that split it.

    Over a family mesh every submesh holds its own copy, sharded the same way (docs/sharding.md).

    Args:
        mesh: a pure :class:`~functional_mesh.Mesh` (or a family of meshes).
        spec: a :class:`PartitionSpec`, or a tuple/list of its entries (default ``P()``,
            replicated).

    Raises:
        UnknownAxisError: an axis of ``spec`` that the mesh lacks (with "did you mean").
        MeshError: an axis used on two dims.

    Examples:
        >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
        >>> fm.NamedSharding(mesh, P("tp")).shard_shape((6, 4))
        (2, 4)
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
                axis_position(mesh, name, "NamedSharding")
                if name in seen:
                    raise MeshError(
                        requires("NamedSharding", "each mesh axis at most once in the spec", "spec", spec)
                        + f"; axis {name!r} splits dims {seen[name]} and {dim}", mesh=mesh)
                seen[name] = dim
        for name in sorted(spec.unreduced | spec.reduced):
            axis_position(mesh, name, "NamedSharding")
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "spec", spec)

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the largest shard: the first one along every split.

        Args:
            global_shape: the full tensor's shape, with at least ``len(spec)`` dims.

        Returns:
            Per dim, ``ceil(n / k)`` for ``k`` the product of the axes splitting it.

        Raises:
            MeshError: fewer dims than the spec, or a negative size.

        Examples:
            >>> fm.NamedSharding(fm.make_mesh((4,), ("tp",)), P("tp")).shard_shape((6, 3))
            (2, 3)
        """
        shape = global_shape_of(self, "NamedSharding.shard_shape", global_shape)
        # the first block of torch.chunk's nested splits: ceil(ceil(n / a) / b) == ceil(n / (a * b))
        return tuple(-(-n // axes_size(self.mesh, self.spec.axes_of(d))) for d, n in enumerate(shape))

    def local_slices(self, global_shape: Sequence[int], rank: int) -> tuple[slice, ...] | None:
        """A rank's block of the global tensor.

        Args:
            global_shape: the full tensor's shape.
            rank: a global rank.

        Returns:
            One slice per dim; ``None`` when ``rank`` is not a device of the mesh.

        Raises:
            MeshError: a shape the spec does not fit, or a negative rank.

        Examples:
            >>> fm.NamedSharding(fm.make_mesh((2, 4), ("dp", "tp")), P("tp")).local_slices((6, 4), 5)
            (slice(2, 4, None), slice(0, 4, None))
        """
        shape = global_shape_of(self, "NamedSharding.local_slices", global_shape)
        coord = self.mesh.coordinate(rank)
        if coord is None:
            return None
        return self._slices(shape, dict(zip(self.mesh.axis_names, coord, strict=True)))

    def _slices(self, shape: tuple[int, ...], index: dict[str, int]) -> tuple[slice, ...]:
        splits = tuple(tuple((self.mesh.axis_size(name), index[name]) for name in self.spec.axes_of(d))
                       for d in range(len(shape)))
        return chunk_block(shape, splits)

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[int, tuple[slice, ...]]:
        """Every device's block, as JAX's method of the same name. O(devices).

        Args:
            global_shape: the full tensor's shape.

        Returns:
            ``{rank: slices}`` for every device of the mesh (every group of a family).

        Raises:
            MeshError: a shape the spec does not fit.

        Examples:
            >>> fm.NamedSharding(fm.make_mesh((2,), ("tp",)), P("tp")).devices_indices_map((4,))
            {0: (slice(0, 2, None),), 1: (slice(2, 4, None),)}
        """
        shape = global_shape_of(self, "NamedSharding.devices_indices_map", global_shape)
        out = {}
        for rank in self.mesh.devices.tolist():
            coordinate = self.mesh.coordinate(rank)
            assert coordinate is not None  # a rank of the mesh's own devices
            out[rank] = self._slices(shape, dict(zip(self.mesh.axis_names, coordinate, strict=True)))
        return out

    @property
    def is_fully_replicated(self) -> bool:
        """True when no axis of size > 1 splits any dim or holds a pending sum: every device holds the whole tensor."""
        return all(self.mesh.axis_size(n) == 1 for d in range(len(self.spec)) for n in self.spec.axes_of(d)) and \
            all(self.mesh.axis_size(n) == 1 for n in self.spec.unreduced)

    @property
    def placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh axis in mesh order (see :func:`placement_plan`); imports torch."""
        # The one function-level import between our modules: the torch boundary imports torch,
        # and this pure module must import without it (planning a mesh needs no torch).
        from . import _torch

        return _torch.to_placements(placement_plan(self))

    def __repr__(self) -> str:
        return f"NamedSharding({self.mesh!r}, {self.spec!r})"


def shape_of(api: str, name: str, value: object) -> tuple[int, ...]:
    """``value`` as a tuple of non-negative ints (a tensor's shape), for the public call ``api``; ``name``
    is how messages call the argument."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(requires(api, f"a tuple of ints for {name}", name, value))
    shape = tuple(as_int(api, "dim size", n) for n in value)
    for d, n in enumerate(shape):
        if n < 0:
            raise MeshError(requires(api, "non-negative dim sizes", f"{name}[{d}]", n))
    return shape


def global_shape_of(sharding: NamedSharding, api: str, global_shape: object) -> tuple[int, ...]:
    """``global_shape`` as a tuple of ints, checked against ``sharding``'s spec for the public call ``api``."""
    shape = shape_of(api, "global_shape", global_shape)
    if len(sharding.spec) > len(shape):
        raise MeshError(
            requires(api, f"a tensor with at least as many dims as the spec ({len(sharding.spec)})",
                     "global_shape", shape) + f" for spec {sharding.spec}", mesh=sharding.mesh)
    return shape


def chunk_block(shape: Sequence[int], splits: Sequence[Sequence[tuple[int, int]]]) -> tuple[slice, ...]:
    """One member's block of a tensor of ``shape``: per dim, torch.chunk's rule for each
    ``(axis size, index along it)`` in ``splits[dim]``, major axis first (dims past ``splits``
    are whole). Plain arithmetic, so torch.compile traces it (on symbolic sizes too)."""
    out = []
    for d, n in enumerate(shape):
        start, length = 0, n
        for size, i in splits[d] if d < len(splits) else ():
            piece = -(-length // size) if length else 0
            lo = min(i * piece, length)
            start, length = start + lo, min(piece, length - lo)
        out.append(slice(start, start + length))
    return tuple(out)


UNREDUCED = "sum"  # a mesh axis's placement-plan entry for a pending sum over it: DTensor's Partial("sum")
# (a pending max or min: "max", "min", DTensor's Partial("max") / Partial("min"); a reduced axis: None, Replicate)


def placement_plan(sharding: NamedSharding) -> tuple[tuple[int, int | None] | str | None, ...]:
    """Per mesh axis: ``None`` (replicated), ``(dim, split_factor)`` or a kind of :data:`KINDS` (a pending
    reduction, :data:`UNREDUCED` for a sum): DTensor's placements as values.

    An axis that splits dim ``d`` is ``(d, None)``, DTensor's ``Shard(d)``, when the axes of ``d`` are
    listed in mesh order (DTensor applies placements in mesh order, each splitting the previous
    piece). Listed against mesh order, an axis that must split *inside* pieces made by axes that
    DTensor applies later is ``(d, f)``, ``_StridedShard(d, split_factor=f)``, where ``f`` is the
    product of those later axes' sizes: what FSDP2 + TP produce for ``P(("tp", "dp"))``.
    """
    mesh, spec = sharding.mesh, sharding.spec
    order = {n: i for i, n in enumerate(mesh.axis_names)}
    plan: list[tuple[int, int | None] | str | None] = [None] * mesh.ndim
    for d in range(len(spec)):
        axes = spec.axes_of(d)
        for j, name in enumerate(axes):
            later_outer = [a for a in axes[:j] if order[a] > order[name]]
            plan[order[name]] = (d, axes_size(mesh, later_outer) if later_outer else None)
    for name in spec.unreduced:
        plan[order[name]] = spec.unreduced_kind
    return tuple(plan)


def spec_from_plan(api: str, mesh: Mesh, plan: Sequence[tuple[int, int | None] | str | None]) -> PartitionSpec:
    """The ``PartitionSpec`` whose placement plan on ``mesh`` is ``plan`` (inverse of :func:`placement_plan`).

    Axes splitting one dim are tried in every order (a dim has few axes); a plan no spec expresses
    is a ``MeshError``.
    """
    by_dim: dict[int, list[str]] = {}
    unreduced = [name for name, p in zip(mesh.axis_names, plan, strict=True) if isinstance(p, str)]
    kinds = sorted({p for p in plan if isinstance(p, str)})
    if len(kinds) > 1:  # a spec has one kind of pending reduction
        raise MeshError(requires(api, "pending reductions of one kind (a PartitionSpec has one unreduced_kind)",
                                 "placements", tuple(plan)), mesh=mesh)
    splits = [None if isinstance(p, str) else p for p in plan]  # str: a kind, the one str a plan holds
    for name, p in zip(mesh.axis_names, splits, strict=True):
        if p is not None:
            by_dim.setdefault(p[0], []).append(name)
    entries: list[object] = [None] * (max(by_dim, default=-1) + 1)
    for dim, names in by_dim.items():
        wanted = [p for p in splits if p is not None and p[0] == dim]
        for order in itertools.permutations(names):
            entries[dim] = order
            trial = placement_plan(NamedSharding(mesh, PartitionSpec(*entries)))
            if [p for p in trial if p is not None and p[0] == dim] == wanted:
                break
        else:
            raise MeshError(requires(api, "placements that a PartitionSpec can express", "placements", tuple(splits)),
                            mesh=mesh)
    return PartitionSpec(*entries, unreduced=unreduced, unreduced_kind=kinds[0] if kinds else None)
