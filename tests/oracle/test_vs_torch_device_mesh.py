"""Oracle: our pure ``Mesh`` against torch's own ``DeviceMesh`` (docs/design.md, "Mesh semantics" and "Edge cases").

Torch runs under its single-process ``fake`` backend: one process simulates any rank of a
world of up to 64 ranks by destroying and re-initialising the default group. For a root mesh
(``init_device_mesh``, or an explicit permuted / offset / sparse rank tensor) and a chain of
operations that torch supports (ascending slices, ``_flatten`` of a slice, ``_unflatten``,
slicing a flattened name from the root), the same chain is built on both sides and, at every
step, we check:

(a) the group tables: ``mesh.groups()`` against the tensor torch builds its process groups
    from (``_layout.remap_to_tensor(_rank_map)``), the same per axis, and, read off that table,
    ``coordinate``/``group_of`` of every rank of the world;
(b) torch's public API on a sample of simulated ranks (first, last, a few random ones; all of
    them when the world has at most 8): ``dm.mesh`` against ``mesh.group_of(rank)``,
    ``dm.get_coordinate()`` against ``mesh.coordinate(rank)``, and the members of each axis's
    process group against the rank's line along that axis, as a set (c10d sorts members;
    ``get_local_rank`` is sorted c10d order and is never compared, docs/design.md "Mesh order");
(c) where torch rejects an unflatten (sizes that are not a layout, product mismatch), our
    ``fm.MeshError``.

Where torch rejects a slice only because its names are not in mesh order (``KeyError``) we
allow it: our result must be the transpose of torch's ascending selection.

Every expected value is read from torch; nothing expected comes from our own code.
"""

from __future__ import annotations

import math
import random
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import _layout as L

if not dist.is_available():  # pragma: no cover - every supported torch build has it
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.testing._internal.distributed.fake_pg  # noqa: E402,F401  (registers the "fake" backend)
from torch.distributed._mesh_layout import _MeshLayout  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

MAX_WORLD = 64          # docs/design.md "Tests": oracle worlds <= 64 ranks
SEEDED_CASES = 500      # chains run by the seeded test ...
MIN_ACCEPTED = 200      # ... of which at least this many must be accepted by torch and matched
MAX_AXES = 6            # cap on the rank of intermediate meshes
NAME_POOL = ("dp", "cp", "tp", "pp", "ep", "sp")

# torch 2.13 warns (deprecation) when a flattened name is sliced from the root; we do it on purpose.
_ROOT_SLICE_WARNING = "Slicing a flattened dim from root mesh"

# torch 2.11 and 2.12 (found by their older _MeshLayout, which has no collapse()) cannot do some of what
# 2.13's DeviceMesh does: _unflatten refuses every dim ("dim tp specified in `_unflatten` is not in
# ('dp', 'tp')") or the dims it made, slicing a flattened dim that is not contiguous raises
# NotImplementedError, and after an unflatten some selections in mesh order are refused as not
# ascending (KeyError). There
# the oracle has no answer for that step: a chain stops before it, a hand-written case is skipped.
OLD_DEVICE_MESH = not hasattr(_MeshLayout, "collapse")


def _torch_cannot(exc: BaseException) -> bool:
    """True when ``exc`` is an older torch's DeviceMesh refusing an operation 2.13 supports."""
    return OLD_DEVICE_MESH and (isinstance(exc, NotImplementedError)
                                or "specified in `_unflatten` is not in" in str(exc)
                                or (isinstance(exc, KeyError) and "ascending order" in str(exc)))


class TorchCannot(Exception):
    """This torch's DeviceMesh cannot do the step (see :func:`_torch_cannot`): no answer to compare."""


# -- the fake process group ---------------------------------------------------------------------


def _init_fake(rank: int, world: int) -> None:
    """Become ``rank`` of a ``world``-rank fake job (tearing down any previous default group)."""
    _destroy_fake()
    hook = sys.excepthook  # init_process_group wraps sys.excepthook on every call; keep it flat
    try:
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    finally:
        sys.excepthook = hook


def _destroy_fake() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_left_behind() -> Iterator[None]:
    yield
    _destroy_fake()


@contextmanager
def _torch_quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ROOT_SLICE_WARNING)
        yield


# -- cases: a root mesh and a chain of operations, the same on both sides ---------------------


@dataclass(frozen=True)
class Root:
    """A root mesh: torch's ``init_device_mesh`` (``devices is None``) or an explicit rank tensor."""

    sizes: tuple[int, ...]
    names: tuple[str, ...]
    devices: tuple[int, ...] | None  # row-major flat global ranks
    world: int
    via_from_ranks: bool = False  # ours: Mesh.from_ranks(nested) instead of make_mesh(devices=flat)

    @property
    def device_list(self) -> list[int]:
        return list(range(math.prod(self.sizes))) if self.devices is None else list(self.devices)

    def torch_mesh(self) -> DeviceMesh:
        if self.devices is None:
            return init_device_mesh("cpu", self.sizes, mesh_dim_names=self.names)
        ranks = torch.tensor(self.devices, dtype=torch.int64).reshape(self.sizes)
        return DeviceMesh("cpu", ranks, mesh_dim_names=self.names)

    def ours_mesh(self) -> fm.Mesh:
        if self.devices is None:
            return fm.make_mesh(self.sizes, self.names)
        if self.via_from_ranks:
            return fm.Mesh.from_ranks(np.array(self.devices).reshape(self.sizes).tolist(), self.names)
        return fm.make_mesh(self.sizes, self.names, devices=list(self.devices))

    def __str__(self) -> str:
        kind = "init_device_mesh" if self.devices is None else f"DeviceMesh(ranks={list(self.devices)})"
        return f"{kind} sizes={self.sizes} names={self.names} world={self.world}"


@dataclass(frozen=True)
class Op:
    """One step of a chain.

    kind:
        ``slice``       torch ``dm[names]``; ours ``m[names]`` (a str, tuple or list).
        ``flatten``     torch ``dm[names]._flatten(name)``; ours ``m[names].flatten(name=)``,
                        ``m.flatten(names, name=)[merged]`` or ``m.flatten(name=)``.
        ``unflatten``   torch ``dm._unflatten(axis, sizes, new_names)``; ours ``m.unflatten``.
        ``root_slice``  torch ``root[names]`` where ``name`` is a flattened name of ``parts``;
                        ours ``root.flatten(parts, name=name)[names]``.
        ``transposed``  a side check, the chain does not move: ours ``m[names]`` with
                        ``names`` out of mesh order, against torch's ascending selection.
    """

    kind: str
    names: tuple[str, ...] = ()
    name: str | None = None
    sizes: tuple[int, ...] = ()
    new_names: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    style: str = ""
    by_index: bool = False

    def __str__(self) -> str:
        if self.kind == "slice":
            return f"[{self.names}]"
        if self.kind == "flatten":
            return f"[{self.names}]._flatten({self.name!r})/{self.style}"
        if self.kind == "unflatten":
            return f"._unflatten({self.name!r}, {self.sizes}, {self.new_names})"
        if self.kind == "root_slice":
            return f"root[{self.names}] ({self.name}={self.parts})"
        return f"transposed[{self.names}]"

    __repr__ = __str__


def torch_apply(op: Op, dm: DeviceMesh, root: DeviceMesh) -> DeviceMesh:
    if op.kind == "slice":
        return dm[op.names[0]] if op.style == "str" else dm[op.names]
    if op.kind == "flatten":
        return dm[op.names]._flatten(op.name)
    if op.kind == "unflatten":
        axis = dm.mesh_dim_names.index(op.name) if op.by_index else op.name
        return dm._unflatten(axis, op.sizes, op.new_names)
    if op.kind == "root_slice":
        return root[op.names]
    raise AssertionError(op)


def ours_apply(op: Op, m: fm.Mesh, root: fm.Mesh) -> fm.Mesh:
    if op.kind == "slice":
        key = {"str": op.names[0], "list": list(op.names)}.get(op.style, op.names)
        return m[key]
    if op.kind == "flatten":
        if op.style == "whole":
            return m.flatten(name=op.name)
        if op.style == "in_place":
            return m.flatten(op.names, name=op.name)[op.name or "_".join(op.names)]
        return m[op.names].flatten(name=op.name)
    if op.kind == "unflatten":
        pairs = list(zip(op.new_names, op.sizes))
        return m.unflatten(op.name, pairs if op.style == "pairs" else dict(pairs))
    if op.kind == "root_slice":
        return root.flatten(op.parts, name=op.name)[op.names]
    raise AssertionError(op)


# -- the comparisons --------------------------------------------------------------------------


def _table(dm: DeviceMesh, axis: int | None = None) -> np.ndarray:
    """The rank table torch creates process groups from: every submesh (of one axis)."""
    if axis is None:
        layout = dm._layout
    else:  # torch 2.11/2.12 index a _MeshLayout into a 1-dim _MeshLayout; 2.13+ into a flat layout to wrap
        one = dm._layout[axis]
        layout = one if isinstance(one, _MeshLayout) else _MeshLayout([one])
    table = layout.remap_to_tensor(dm._rank_map).numpy().astype(np.int64)
    # a flattened dim's layout stays nested on torch 2.11/2.12 (modes it cannot coalesce): one row per group
    return table if axis is None else table.reshape(table.shape[0], -1)


def _assert_same(ours: np.ndarray, want: np.ndarray, what: str) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != torch's {want.shape}"
    assert np.array_equal(ours, want), f"{what}:\nours\n{ours.tolist()}\ntorch\n{want.tolist()}"


def check_tables(dm: DeviceMesh, m: fm.Mesh, world: int) -> None:
    """(a): names, sizes, the group table, each axis's groups, every rank's place in them."""
    assert m.axis_names == tuple(dm.mesh_dim_names)
    assert m.axis_sizes == tuple(dm.shape)
    want = _table(dm)
    _assert_same(m.groups(), want, "groups()")
    for i, name in enumerate(m.axis_names):
        _assert_same(m[name].groups(), _table(dm, i), f"groups of axis {name!r}")
    where = {int(want[idx]): idx for idx in np.ndindex(want.shape)}
    for rank in range(world):
        if rank not in where:
            assert m.coordinate(rank) is None and m.group_of(rank) is None, rank
        else:
            g, *coord = where[rank]
            assert m.coordinate(rank) == tuple(coord), rank
            _assert_same(m.group_of(rank), want[g], f"group_of({rank})")


def check_rank_view(dm: DeviceMesh, m: fm.Mesh, rank: int) -> None:
    """(b): what torch's public API tells simulated ``rank``."""
    coord = dm.get_coordinate()
    assert m.coordinate(rank) == coord, f"coordinate({rank}): ours {m.coordinate(rank)}, torch {coord}"
    group = m.group_of(rank)
    if coord is None:
        assert group is None, f"group_of({rank}) should be None: torch has no coordinate"
        # torch only builds a mesh on a rank outside it when there is one group
        _assert_same(m.ranks, dm.mesh.numpy(), f"ranks seen from outside rank {rank}")
        return
    _assert_same(group, dm.mesh.numpy(), f"group_of({rank}) vs dm.mesh")
    for i, name in enumerate(m.axis_names):
        members = dist.get_process_group_ranks(dm.get_group(i))
        line = m[name].group_of(rank)
        assert sorted(members) == sorted(line.tolist()), f"{name!r} process group of rank {rank}"


def check_transposed(op: Op, dm: DeviceMesh, m: fm.Mesh, rank: int, world: int, tables: bool) -> None:
    """Ours allows any selection order; where torch refuses, match the transpose of torch's.

    The flattened transposed selection (``mesh.flatten(("tp", "dp"))``, what FSDP2 + TP build)
    must be torch's ascending table transposed, then reshaped.
    """
    ours = m[op.names]
    try:
        theirs = dm[op.names]
    except KeyError as exc:
        assert "ascending order" in str(exc), exc
    else:  # torch accepts when the order only differs by size-1 axes
        if tables:
            check_tables(theirs, ours, world)
        check_rank_view(theirs, ours, rank)
        return
    ascending = tuple(sorted(op.names, key=dm.mesh_dim_names.index))
    perm = [ascending.index(n) for n in op.names]
    theirs = dm[ascending]
    flat = ours.flatten()
    assert ours.axis_names == op.names
    assert ours.axis_sizes == tuple(theirs.shape[p] for p in perm)
    if tables:
        want = _table(theirs).transpose(0, *(1 + p for p in perm))
        _assert_same(ours.groups(), want, f"transposed groups() of {op.names}")
        _assert_same(flat.groups(), want.reshape(want.shape[0], -1), f"flattened transposed groups() of {op.names}")
    coord = theirs.get_coordinate()
    if coord is None:
        assert ours.coordinate(rank) is None and flat.coordinate(rank) is None
        return
    want_coord = tuple(coord[p] for p in perm)
    assert ours.coordinate(rank) == want_coord, f"transposed coordinate({rank})"
    assert flat.coordinate(rank) == (int(np.ravel_multi_index(want_coord, ours.axis_sizes)),)
    want_group = theirs.mesh.numpy().transpose(perm)
    _assert_same(ours.group_of(rank), want_group, f"transposed group_of({rank})")
    _assert_same(flat.group_of(rank), want_group.reshape(-1), f"flattened transposed group_of({rank})")


_OUTSIDE = "needs to either have all its original dimensions"  # torch, on a rank outside a family


def replay(root: Root, ops: list[Op], rank: int, tables: bool = False) -> None:
    """Rebuild the whole chain as simulated ``rank`` and check every step."""
    _init_fake(rank, root.world)
    with _torch_quiet():
        t_root, o_root = root.torch_mesh(), root.ours_mesh()
        t, o = t_root, o_root
        if tables:
            check_tables(t, o, root.world)
        check_rank_view(t, o, rank)
        for op in ops:
            try:
                if op.kind == "transposed":
                    check_transposed(op, t, o, rank, root.world, tables)
                    continue
                t = torch_apply(op, t, t_root)
            except (NotImplementedError, ValueError, KeyError) as exc:
                if not _torch_cannot(exc):
                    raise
                raise TorchCannot(f"torch {torch.__version__} cannot {op}: {exc}") from exc
            except RuntimeError as exc:
                if _OUTSIDE not in str(exc):
                    raise
                # torch cannot even build a family mesh on a rank outside it; we say None
                assert o_root.coordinate(rank) is None and o_root.group_of(rank) is None
                return
            o = ours_apply(op, o, o_root)
            if tables:
                check_tables(t, o, root.world)
            check_rank_view(t, o, rank)


# -- generating torch-legal chains ------------------------------------------------------------


def _factors(rng: random.Random, n: int, max_parts: int = 3) -> list[int]:
    """A random ordered factorisation of ``n`` into at most ``max_parts`` factors (``[n]`` if prime)."""
    parts: list[int] = []
    while len(parts) < max_parts - 1 and rng.random() < 0.6:
        divisors = [d for d in range(2, n) if n % d == 0]
        if not divisors:
            break
        d = rng.choice(divisors)
        parts.append(d)
        n //= d
    parts.append(n)
    rng.shuffle(parts)
    return parts


def _primes(rng: random.Random, n: int) -> list[int]:
    """The prime factors of ``n`` in random order."""
    primes, p = [], 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    rng.shuffle(primes)
    return primes or [1]


def _split_sizes(rng: random.Random, modes: tuple[int, ...], size: int) -> tuple[int, ...]:
    """Sizes for unflattening an axis whose canonical modes are ``modes`` (outermost first).

    Mostly legal by construction (runs of whole modes merged exactly, single modes refined);
    sometimes any factorisation or the modes reversed (legal or not: torch decides); rarely a
    product mismatch.
    """
    r = rng.random()
    if r < 0.04:
        return rng.choice([(size + 1,), (2, size), (size, 3)])
    if len(modes) > 1 and r < 0.45:  # often not a layout: (2,3):(6,1) as (3, 2)
        sizes = list(reversed(modes)) if len(set(modes)) > 1 else _primes(rng, size)
    elif r < 0.25 + 0.35 * (len(modes) > 1):
        sizes = _factors(rng, size, 4)
    else:
        sizes = []
        i = 0
        while i < len(modes):
            j = i + rng.choice([1, 1, 1, 2, 3])
            run = modes[i:j]
            sizes += [math.prod(run)] if len(run) > 1 else _factors(rng, run[0])
            i = j
    if rng.random() < 0.12:
        sizes.insert(rng.randint(0, len(sizes)), 1)
    return tuple(sizes)


def _ascending(rng: random.Random, m: fm.Mesh, k: int) -> tuple[str, ...]:
    return tuple(sorted(rng.sample(m.axis_names, k), key=m.axis_names.index))


def gen_root(rng: random.Random) -> Root:
    ndim = rng.choice([1, 2, 2, 3, 3, 3, 4])
    sizes: list[int] = []
    for _ in range(ndim):
        room = MAX_WORLD // math.prod(sizes or [1])
        options = [s for s in (2, 2, 2, 3, 4, 4, 5, 6, 8) if s <= room]
        sizes.append(1 if not options or rng.random() < 0.06 else rng.choice(options))
    n = math.prod(sizes)
    names = tuple(rng.sample(NAME_POOL, ndim))
    kind = rng.choices(["init", "iota", "permuted", "offset", "sparse"], [4, 1, 2, 1.5, 1.5])[0]
    if kind == "sparse" and n > MAX_WORLD // 2:
        kind = "permuted"
    devices: list[int] | None
    if kind == "init":
        devices = None
    elif kind == "iota":
        devices = list(range(n))
    elif kind == "permuted":
        devices = rng.sample(range(n), n)
    elif kind == "offset":
        start = rng.randint(0, MAX_WORLD - n)
        devices = list(range(start, start + n))
    else:
        devices = rng.sample(range(min(MAX_WORLD, n + rng.randint(1, 2 * n))), n)
    span = n if devices is None else max(devices) + 1
    world = span if rng.random() < 0.6 else rng.randint(span, min(MAX_WORLD, 2 * span + 4))
    return Root(tuple(sizes), names, None if devices is None else tuple(devices), world, rng.random() < 0.5)


def sample_ranks(rng: random.Random, root: Root) -> list[int]:
    """A member first (the chain is generated there), then first, last, random ranks; all if W <= 8."""
    members = root.device_list
    first = rng.choice(members)
    if root.world <= 8:
        others = set(range(root.world))
    else:
        others = {0, root.world - 1, min(members), max(members), rng.choice(members),
                  rng.randrange(root.world), rng.randrange(root.world)}
    return [first, *sorted(others - {first})]


class ChainGenerator:
    """Draws operations that torch accepts (only unflatten sizes are left to torch to judge)."""

    def __init__(self, rng: random.Random, root: Root, ours_root: fm.Mesh) -> None:
        self.rng = rng
        self.root = root
        self.ours_root = ours_root
        self.fresh = 0
        # flattened names torch's root has recorded -> (layout of the merged axis, root axes or ())
        self.flattened: dict[str, tuple[L.Layout, tuple[str, ...]]] = {}

    def _name(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def next_op(self, m: fm.Mesh) -> Op:
        rng = self.rng
        if m.ndim >= 3 and not self.flattened and rng.random() < 0.5:
            return self._flatten(m, adjacent=False)  # a multi-mode axis, for unflatten to split
        kinds, weights = ["slice", "flatten", "unflatten"], [3, 3, 4]
        if m.ndim >= 2:
            kinds.append("transposed")
            weights.append(2)
        if any(parts for _, parts in self.flattened.values()):
            kinds.append("root_slice")
            weights.append(2)
        if any(len(m.axis_layout(n).shape) > 1 for n in m.axis_names):
            weights[2] = 10  # split what a non-adjacent flatten made
        if m.ndim >= MAX_AXES:
            weights[2] = 0
        return getattr(self, "_" + rng.choices(kinds, weights)[0])(m)

    def _slice(self, m: fm.Mesh) -> Op:
        names = _ascending(self.rng, m, self.rng.randint(1, m.ndim))
        style = "str" if len(names) == 1 and self.rng.random() < 0.5 else self.rng.choice(["tuple", "list"])
        return Op("slice", names, style=style)

    def _flatten(self, m: fm.Mesh, adjacent: bool | None = None) -> Op:
        rng = self.rng
        if adjacent is None:
            adjacent = m.ndim < 3 or rng.random() < 0.5
        if not adjacent:  # non-adjacent axes: a multi-mode merged axis
            first, last = m.axis_names[0], m.axis_names[-1]
            middle = [n for n in m.axis_names[1:-1] if rng.random() < 0.3]
            names = (first, *middle, last)
        else:
            names = _ascending(rng, m, rng.randint(1, m.ndim))
        default = "_".join(names)
        merged = L.concat(*(m.axis_layout(n) for n in names))
        if len(names) == 1 and rng.random() < 0.4:
            name = rng.choice([None, names[0]])  # torch hands back the 1-D mesh itself
        else:
            known = self.flattened.get(default)
            reusable = default not in self.root.names and (known is None or known[0] == merged)
            name = rng.choice([None, default]) if reusable and rng.random() < 0.6 else self._name("f")
        resolved = name or default
        others = set(m.axis_names) - set(names)
        styles = ["select"] + ["in_place"] * (resolved not in others) + ["whole"] * (len(names) == m.ndim)
        return Op("flatten", names, name=name, style=rng.choice(styles))

    def _unflatten(self, m: fm.Mesh) -> Op:
        rng = self.rng
        # axes of several modes (flattened non-adjacent axes) are where torch rejects splits
        axis = rng.choices(m.axis_names, [1 + 3 * (len(m.axis_layout(n).shape) > 1) for n in m.axis_names])[0]
        size = m.axis_size(axis)
        sizes = _split_sizes(rng, m.axis_layout(axis).shape or (1,), size)
        if len(sizes) + m.ndim - 1 > MAX_AXES:
            sizes = (size,)
        new_names = [self._name("u") for _ in sizes]
        if rng.random() < 0.3:
            new_names[rng.randrange(len(new_names))] = axis  # the old name may be reused
        return Op("unflatten", name=axis, sizes=sizes, new_names=tuple(new_names),
                  style=rng.choice(["dict", "pairs"]), by_index=rng.random() < 0.3)

    def _transposed(self, m: fm.Mesh) -> Op:
        ascending = _ascending(self.rng, m, self.rng.randint(2, m.ndim))
        names = list(ascending)
        while tuple(names) == ascending:
            self.rng.shuffle(names)
        return Op("transposed", tuple(names))

    def _root_slice(self, m: fm.Mesh) -> Op:
        rng = self.rng
        name = rng.choice(sorted(n for n, (_, parts) in self.flattened.items() if parts))
        parts = self.flattened[name][1]
        order = self.root.names
        lo, hi = order.index(parts[0]), order.index(parts[-1])
        # torch needs the collapsed strides sorted: no other axis may sit between the parts
        others = [n for i, n in enumerate(order) if n not in parts and not lo < i < hi]
        chosen = rng.sample(others, rng.randint(0, len(others)))
        items = sorted([name, *chosen], key=lambda n: lo if n == name else order.index(n))
        return Op("root_slice", tuple(items), name=name, parts=parts)

    def accepted(self, op: Op, before: fm.Mesh) -> None:
        """Track the flattened names torch's root now knows."""
        if op.kind != "flatten":
            return
        resolved = op.name or "_".join(op.names)
        if len(op.names) == 1 and resolved == op.names[0]:
            return  # torch returned the 1-D mesh itself and recorded nothing
        is_root_axis = all(
            n in self.root.names and before.axis_layout(n) == self.ours_root.axis_layout(n) for n in op.names
        )
        merged = L.concat(*(before.axis_layout(n) for n in op.names))
        self.flattened[resolved] = (merged, op.names if is_root_axis else ())


@dataclass
class Stats:
    cases: int = 0
    accepted: int = 0  # chains torch accepted (at least one operation) and we matched
    ops: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    roots: Counter = field(default_factory=Counter)
    rank_views: int = 0
    torch_cannot: int = 0  # chains cut short where an older torch's DeviceMesh cannot do a step

    def __str__(self) -> str:
        return (f"{self.accepted}/{self.cases} chains accepted and matched; ops {dict(self.ops)}; "
                f"torch rejections matched {dict(self.rejected)}; roots {dict(self.roots)}; "
                f"rank views {self.rank_views}; cut short by torch {torch.__version__}: {self.torch_cannot}")


def _unflatten_rejection(op: Op, m: fm.Mesh) -> str:
    return "product" if math.prod(op.sizes) != m.axis_size(op.name) else "along its modes"


def run_case(rng: random.Random, stats: Stats, label: str = "") -> None:
    """Generate one chain interactively on a member rank, then replay it on the other ranks."""
    root = gen_root(rng)
    ranks = sample_ranks(rng, root)
    ops: list[Op] = []
    try:
        _init_fake(ranks[0], root.world)
        with _torch_quiet():
            t_root, o_root = root.torch_mesh(), root.ours_mesh()
            gen = ChainGenerator(rng, root, o_root)
            t, o = t_root, o_root
            check_tables(t, o, root.world)
            check_rank_view(t, o, ranks[0])
            for _ in range(rng.randint(1, 5)):
                op = gen.next_op(o)
                if op.kind == "transposed":
                    try:
                        check_transposed(op, t, o, ranks[0], root.world, tables=True)
                    except KeyError as exc:
                        if not _torch_cannot(exc):
                            raise
                        stats.torch_cannot += 1
                        break
                    ops.append(op)
                    continue
                try:
                    t_next = torch_apply(op, t, t_root)
                except (AssertionError, ValueError, NotImplementedError, KeyError) as exc:
                    if _torch_cannot(exc):
                        stats.torch_cannot += 1
                        break
                    if op.kind != "unflatten" or isinstance(exc, (NotImplementedError, KeyError)):
                        raise
                    reason = _unflatten_rejection(op, o)
                    with pytest.raises(fm.MeshError, match=reason):
                        ours_apply(op, o, o_root)
                    stats.rejected[reason] += 1
                    continue
                o_next = ours_apply(op, o, o_root)
                gen.accepted(op, o)
                ops.append(op)
                t, o = t_next, o_next
                check_tables(t, o, root.world)
                check_rank_view(t, o, ranks[0])
        for rank in ranks[1:]:
            replay(root, ops, rank)
    except BaseException as exc:
        if isinstance(exc, TorchCannot) or _torch_cannot(exc):  # an older torch has no answer here
            stats.torch_cannot += 1
            return
        exc.add_note(f"oracle case {label}: {root}\n  ops: {ops}\n  ranks: {ranks}")
        raise
    finally:
        _destroy_fake()
    stats.cases += 1
    stats.rank_views += len(ranks) * (1 + len(ops))
    stats.roots["init_device_mesh" if root.devices is None else "explicit"] += 1
    chain_ops = [op for op in ops if op.kind != "transposed"]
    stats.ops.update(op.kind for op in ops)
    if chain_ops:
        stats.accepted += 1


# -- the generated suites ---------------------------------------------------------------------


def test_seeded_random_chains_match_torch():
    stats = Stats()
    for seed in range(SEEDED_CASES):
        run_case(random.Random(seed), stats, label=f"seed={seed}")
    print(stats)
    assert stats.accepted >= MIN_ACCEPTED, str(stats)
    # the generator must keep reaching every kind of operation, rejection and root (an older torch
    # refuses every unflatten, so there none is compared and chains are shorter)
    least_ops = {"slice": 150, "flatten": 200, "unflatten": 200, "transposed": 40, "root_slice": 30}
    if OLD_DEVICE_MESH:
        least_ops = {"slice": 100, "flatten": 100, "unflatten": 0, "transposed": 40, "root_slice": 10}
    for kind, least in least_ops.items():
        assert stats.ops[kind] >= least, f"too few {kind}: {stats}"
    if not OLD_DEVICE_MESH:
        assert stats.rejected["along its modes"] >= 8 and stats.rejected["product"] >= 5, str(stats)
    assert stats.roots["explicit"] >= 150 and stats.roots["init_device_mesh"] >= 150, str(stats)


@given(st.randoms(use_true_random=False))
def test_hypothesis_chains_match_torch(rng):
    run_case(rng, Stats())


# -- hand-written cases from the seeds (expected values still come from torch) ----------------

DP_CP_TP = Root((2, 2, 2), ("dp", "cp", "tp"), None, 8)


def _all_ranks(root: Root, ops: list[Op]) -> None:
    try:
        for rank in range(root.world):
            replay(root, ops, rank, tables=rank == root.device_list[0])
    except TorchCannot as exc:
        pytest.skip(str(exc))
    finally:
        _destroy_fake()


@pytest.mark.parametrize("names", [("dp",), ("cp",), ("tp",), ("dp", "cp"), ("dp", "tp"), ("cp", "tp")])
def test_3d_axis_groups(names):
    _all_ranks(DP_CP_TP, [Op("slice", names)])


def test_world8_unflatten_2x4_then_nested():
    world = Root((8,), ("world",), None, 8)
    _all_ranks(world, [
        Op("unflatten", name="world", sizes=(2, 4), new_names=("a", "b")),
        Op("unflatten", name="b", sizes=(2, 2), new_names=("b0", "b1")),
        Op("slice", ("a", "b1")),
    ])
    _all_ranks(world, [Op("unflatten", name="world", sizes=(2, 4), new_names=("a", "b")), Op("slice", ("a",))])
    _all_ranks(world, [Op("unflatten", name="world", sizes=(2, 4), new_names=("a", "b")), Op("slice", ("b",))])


def test_permuted_device_list():
    permuted = Root((2, 4), ("x", "y"), (7, 6, 5, 4, 3, 2, 1, 0), 8)
    _all_ranks(permuted, [Op("transposed", ("y", "x")), Op("slice", ("y",))])
    _all_ranks(permuted, [Op("slice", ("x",))])
    _all_ranks(permuted, [Op("flatten", ("x", "y"), style="whole")])
    _all_ranks(Root((2, 4), ("x", "y"), (7, 6, 5, 4, 3, 2, 1, 0), 8, via_from_ranks=True), [])
    try:  # rank 0's coordinate, spelled out
        _init_fake(0, 8)
        dm = DeviceMesh("cpu", torch.tensor([[7, 6, 5, 4], [3, 2, 1, 0]]), mesh_dim_names=("x", "y"))
        assert fm.Mesh.from_ranks([[7, 6, 5, 4], [3, 2, 1, 0]], ("x", "y")).coordinate(0) == dm.get_coordinate()
    finally:
        _destroy_fake()


@pytest.mark.parametrize("style", ["select", "in_place"])
def test_non_contiguous_flatten(style):
    _all_ranks(DP_CP_TP, [Op("flatten", ("dp", "tp"), style=style), Op("unflatten", name="dp_tp", sizes=(2, 2),
                                                                         new_names=("dp", "tp"))])


def test_transposed_selection_is_the_transpose_of_torchs():
    _all_ranks(DP_CP_TP, [Op("transposed", ("cp", "dp")), Op("transposed", ("tp", "dp", "cp")),
                          Op("transposed", ("tp", "cp", "dp"))])


def test_flattened_name_sliced_from_the_root():
    _all_ranks(DP_CP_TP, [Op("flatten", ("dp", "cp")), Op("root_slice", ("dp_cp", "tp"), name="dp_cp",
                                                            parts=("dp", "cp"))])
    _all_ranks(DP_CP_TP, [Op("flatten", ("cp", "tp"), name="inner"), Op("root_slice", ("dp", "inner"),
                                                                         name="inner", parts=("cp", "tp"))])


def test_mesh_smaller_than_world_and_ranks_outside_it():
    _all_ranks(Root((2, 2), ("dp", "tp"), (9, 11, 13, 15), 16), [Op("slice", ("tp",)), Op("flatten", ("tp",), "t")])
    _all_ranks(Root((2, 3), ("dp", "tp"), None, 10), [Op("flatten", ("dp", "tp"))])


# -- (c) what torch rejects, we reject -----------------------------------------------------------


def _modes_regex(dm: DeviceMesh, axis: int) -> str:
    lay = dm._layout[axis]
    text = f"{lay.shape[0]}:{lay.stride[0]}" if len(lay.shape) == 1 else \
        f"({','.join(map(str, lay.shape))}):({','.join(map(str, lay.stride))})"
    return "along its modes " + re.escape(text)


@pytest.mark.parametrize(("sizes", "flat", "split"), [
    ((2, 2, 3), ("a", "c"), (3, 2)),
    ((2, 2, 3), ("a", "c"), (3, 1, 2)),
    ((3, 2, 2), ("a", "c"), (2, 3)),
    ((2, 3, 5), ("a", "c"), (5, 2)),
    ((4, 2, 3), ("a", "c"), (3, 4)),
    ((2, 2, 2, 3), ("a", "c", "d"), (3, 4)),
])
def test_unflatten_that_is_not_a_layout_is_rejected_like_torch(sizes, flat, split):
    try:
        _init_fake(0, math.prod(sizes))
        dm = init_device_mesh("cpu", sizes, mesh_dim_names=("a", "b", "c", "d")[: len(sizes)])
        flattened = dm[flat]._flatten()
        with pytest.raises((AssertionError, ValueError)):
            flattened._unflatten(0, split, tuple(f"x{i}" for i in range(len(split))))
        ours = fm.make_mesh(sizes, ("a", "b", "c", "d")[: len(sizes)])[flat].flatten()
        with pytest.raises(fm.MeshError, match=_modes_regex(flattened, 0)):
            ours.unflatten("_".join(flat), {f"x{i}": s for i, s in enumerate(split)})
    finally:
        _destroy_fake()


@pytest.mark.parametrize("split", [(2, 2), (3, 3), (12, 1), (5,)])
def test_unflatten_product_mismatch_is_rejected_like_torch(split):
    try:
        _init_fake(0, 6)
        dm = init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp"))
        with pytest.raises(ValueError, match="product" if not OLD_DEVICE_MESH else "product|_unflatten"):
            dm._unflatten("tp", split, tuple(f"x{i}" for i in range(len(split))))
        with pytest.raises(fm.MeshError, match=r"product .* size of axis 'tp' \(3\)"):
            fm.make_mesh((2, 3), ("dp", "tp")).unflatten("tp", {f"x{i}": s for i, s in enumerate(split)})
    finally:
        _destroy_fake()


def test_no_process_group_is_left_behind():
    hook = sys.excepthook
    run_case(random.Random(12345), Stats())
    assert not dist.is_initialized()
    assert sys.excepthook is hook
