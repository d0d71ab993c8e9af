"""The boundary of a ``shard_map`` region: what enters as the local tensors, what leaves as DTensors.

In: each argument fits its in_spec (else one ``MeshError`` listing every misfit); out: each result is
invariant over the axes its out_spec leaves out (else one ``VmaError``). One :class:`_Plan` per spec
and mesh; :class:`_Local` and :class:`_Global` for DTensors eagerly (docs/design.md, "Typed regions").
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from . import _steps as S
from . import _torch, _vma
from ._call import Call, resolve_axes, run_step
from ._errors import MeshError, requires
from ._handle import RealizedMesh, recall, remember
from ._interop import sharding_of
from ._layout import row_major_strides
from ._mesh import axes_size
from ._region import Region, selected
from ._sharding import NamedSharding, PartitionSpec, placement_plan

__all__ = ["check_specs", "enter_all", "exit_all"]


def check_specs(what: str, specs: Any) -> None:
    """Every leaf of ``specs`` (``in_specs`` or ``out_specs``) is a ``PartitionSpec``, else a ``TypeError``."""
    leaves = _torch.pytree.tree_leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    for leaf in leaves:
        if not isinstance(leaf, PartitionSpec):
            raise TypeError(requires("shard_map", f"PartitionSpec leaves in {what}", what, specs))


# -- leaves and their paths ---------------------------------------------------------------------------


def _prefix(what: str, specs: Any, values: Any) -> list[tuple[Any, Any, PartitionSpec]]:
    """``(path, leaf, spec)`` for every leaf of ``values``, its spec taken from the prefix ``specs``;
    a path is ``(what, key path)``."""
    pairs, tree = _torch.pytree.tree_flatten_with_path(values)
    if isinstance(specs, list) and isinstance(values, tuple):
        specs = tuple(specs)
    flat_specs = _torch.broadcast_prefix(specs, tree, is_leaf=lambda s: isinstance(s, PartitionSpec))
    if flat_specs is None:
        raise MeshError(requires("shard_map", f"{what} that is a pytree prefix of the "
                                 f"{'arguments' if what == 'in_specs' else 'results'}", what, specs)
                        + f"; the {'arguments' if what == 'in_specs' else 'results'} have structure {tree}")
    return [((what, path), leaf, spec) for (path, leaf), spec in zip(pairs, flat_specs, strict=True)]


def _leaves(what: str, specs: Any, values: Any) -> tuple[list[tuple[Any, Any, PartitionSpec]], Any]:
    """``(path, leaf, spec)`` per leaf, and the tree to rebuild ``values`` (``None``: one leaf; ``()``: a
    flat tuple). A path is ``what`` (one leaf), ``(what, i)`` (a flat tuple's) or ``(what, key path)``.

    The common shapes (one spec for one value; a tuple of specs for a tuple of non-containers)
    skip the pytree machinery: the boundary runs at every call.
    """
    if isinstance(specs, PartitionSpec) and not isinstance(values, (tuple, list, dict)):
        return [(what, values, specs)], None
    if type(values) is tuple and not any(isinstance(v, (tuple, list, dict)) for v in values):
        if isinstance(specs, PartitionSpec):  # one spec for every value
            return [((what, i), v, specs) for i, v in enumerate(values)], ()
        if type(specs) is tuple and len(values) == len(specs) and all(isinstance(p, PartitionSpec) for p in specs):
            return [((what, i), v, p) for i, (v, p) in enumerate(zip(values, specs, strict=True))], ()
    return _prefix(what, specs, values), _torch.pytree.tree_structure(values)


def _path(path: Any) -> str:
    """A leaf's path as messages show it: ``in_specs[1]``, ``out_specs['w']``, ... (made only for messages)."""
    if isinstance(path, str):
        return path
    what, key = path
    return f"{what}[{key}]" if isinstance(key, int) else what + _torch.pytree.keystr(key)


def _argument(path: Any) -> int | None:
    """The position of the argument a leaf of ``in_specs`` belongs to (``None``: not known)."""
    if isinstance(path, str):
        return None
    key = path[1]
    if isinstance(key, int):
        return key
    return getattr(key[0], "idx", None) if key else None


def _rebuild(leaves: list[Any], tree: Any) -> Any:
    if tree is None:
        return leaves[0]
    if tree == ():
        return tuple(leaves)
    return _torch.pytree.tree_unflatten(leaves, tree)


# -- plans --------------------------------------------------------------------------------------------


class _Plan:
    """What the boundary does for a leaf with one spec on one mesh, whatever its shape: its sharding
    and placements, the axes it names, the size each dim is split into and how a full argument
    enters (its gathers) or an untyped one sums its cotangent (its unnamed axes)."""

    __slots__ = ("sharding", "placements", "axes", "unreduced", "rank", "sizes", "split", "axes_of", "gathers",
                 "unnamed", "spec", "specs", "reduced", "kind", "cotangent", "reduced_dims")

    def __init__(self, rm: RealizedMesh, spec: PartitionSpec, check_vma: bool,
                 new: tuple[str, ...] | None = None) -> None:
        self.sharding = NamedSharding(rm.mesh, spec)
        self.placements = self.sharding.placements
        self.specs: dict[tuple[tuple[int, ...], torch.dtype], Any] = {}  # eagerly: a result's DTensor spec per shape
        self.axes = frozenset(a for d in range(len(spec)) for a in spec.axes_of(d))
        self.unreduced = spec.unreduced  # a pending reduction over these axes (DTensor's Partial(kind))
        self.kind = spec.unreduced_kind or "sum"
        self.reduced = spec.reduced if check_vma else frozenset()  # untyped: JAX drops reduced (summed as unnamed)
        self.unnamed = () if check_vma else tuple(a for a in rm.mesh.axis_names if a not in self.axes and a not in
                                                  self.unreduced and (new is None or a in new))
        # the placements of a cotangent where they are not the value's (None): a reduced axis's cotangent is a
        # pending sum, Partial("sum"). (A pending max's or min's gradient keeps the value's Partial(kind) label:
        # each member's masked term, which DTensor then passes through untouched.)
        self.cotangent = None
        self.reduced_dims = tuple((i, rm.mesh.axis_size(n)) for i, n in enumerate(rm.mesh.axis_names)
                                  if n in self.reduced)  # (mesh dim, size) of each reduced axis
        if self.reduced:
            plan = placement_plan(self.sharding)
            names = rm.mesh.axis_names
            self.cotangent = _torch.to_placements(tuple(
                "sum" if n in self.reduced else p for n, p in zip(names, plan, strict=True)))
        self.rank = len(spec)
        self.spec = str(spec)  # for messages (torch.compile cannot format a PartitionSpec while tracing)
        self.sizes = tuple(axes_size(rm, spec.axes_of(d)) for d in range(len(spec.entries)))
        self.split = tuple((d, k) for d, k in enumerate(self.sizes) if k > 1)  # the dims a shape must divide
        self.gathers = tuple((d, spec.axes_of(d)) for d in range(len(spec.entries)) if spec.axes_of(d))
        self.axes_of = tuple(spec.axes_of(d) for d in range(len(spec.entries)))

    def fits(self, shape: Sequence[int]) -> bool:
        """JAX's rule: the spec fits the rank, and every sharded dim divides evenly over its axes.

        Plain arithmetic on the shape: under torch.compile it runs while tracing (on symbolic sizes too).
        """
        if self.rank > len(shape):
            return False
        for d, k in self.split:
            if shape[d] % k:
                return False
        return True

    def misfit(self, shape: Sequence[int]) -> str:
        """Why ``shape`` does not fit (for a shape :meth:`fits` refuses)."""
        if self.rank > len(shape):
            return f"requires a value of rank at least {self.rank}, but got shape {tuple(shape)}"
        return "; ".join(
            f"maps dim {d} of size {shape[d]} (shape {tuple(shape)}) to axes {self.axes_of[d]} of total size {k}; "
            f"pad the value to a multiple of {k}, or shard it over other axes" for d, k in self.split if shape[d] % k)


_PLANS: dict[tuple[Any, ...], _Plan] = {}  # (mesh value, spec entries, check_vma[, manual axes]) -> plan


@torch.compiler.assume_constant_result
def _plan_of(rm: RealizedMesh, entries: tuple[Any, ...], check_vma: bool, new: tuple[str, ...] | None = None
             ) -> _Plan:
    """The plan of the spec ``PartitionSpec.from_key(entries)`` on ``rm``'s mesh, made once per mesh value.

    Under torch.compile this runs (in Python) while tracing and its result is a constant of the
    trace; it also makes sure ``rm.device_mesh`` exists then, which a compiled program cannot
    build. It takes the spec's entries, not the spec: a shard_map made inside the compiled
    function has specs that exist only as dynamo's record while it traces.
    """
    rm.device_mesh  # noqa: B018 - built once per realized mesh (and kept by it), outside any trace
    key = (rm.mesh, entries, check_vma) if new is None else (rm.mesh, entries, check_vma, new)  # the mesh value:
    plan = _PLANS.get(key)  # equal meshes (a selection made again) share plans
    if plan is None:
        plan = _PLANS[key] = _Plan(rm, PartitionSpec.from_key(entries), check_vma, new)
    return plan


@torch.compiler.assume_constant_result
def _submesh(rm: RealizedMesh, names: tuple[str, ...]) -> Any:
    """``rm.device_mesh`` sliced to ``names`` (mesh order): a partial-manual region's DTensors live there.

    Made once per handle and names, outside any trace (a constant of it, as :func:`_plan_of`'s plans)."""
    key = (_submesh, names)
    found = recall(rm, key)
    return found if found is not None else remember(rm, key, rm.device_mesh[names])


def _inner_mesh(region: Region) -> Any:
    """Where a partial-manual region's values live: the submesh of its automatic axes (``None``: none)."""
    return _submesh(region.rm, region.auto) if region.auto else None


def _outer_mesh(region: Region) -> tuple[Any, tuple[str, ...]]:
    """Where a region's arguments and results live, and its axis names: the realized mesh's DeviceMesh, or
    in a nested region its enclosing region's submesh."""
    outer = region.outer
    if outer is None:
        return region.rm.device_mesh, region.rm.mesh.axis_names
    return _submesh(region.rm, outer.auto), outer.auto


def _plan(region: Region, spec: PartitionSpec, path: Any = "a spec") -> _Plan:
    if region.partial:
        new = tuple(a for a in region.rm.mesh.axis_names if a in region.new)
        plan = _plan_of(region.rm, spec.key, region.check_vma, new)
        if not (plan.axes | plan.unreduced | plan.reduced) <= region.new:
            raise _not_manual(region, path, plan)
        if plan.reduced or plan.kind != "sum":  # docs/shard_map.md, "Manual over some axes": not yet
            raise MeshError(requires("shard_map", "specs without reduced= or a pending max/min in a region manual "
                                     "over some axes (axis_names=); make it manual over every axis",
                                     _path(path), plan.spec), mesh=region.rm.mesh)
        return plan
    if region.traced:
        return _plan_of(region.rm, spec.key, region.check_vma)
    # eagerly: the handle keeps its plans (one dict lookup per leaf and call), keyed by the spec's entries as
    # written (what its equality compares), not by the spec: dynamo (torch 2.11/2.12) hashes every key of the
    # handle's memo when a compiled collective looks an axis up there, and cannot hash a PartitionSpec
    entries = spec.key
    key = (_Plan, entries, region.check_vma)
    plan = recall(region.rm, key)
    if plan is None:
        plan = remember(region.rm, key, _plan_of(region.rm, entries, region.check_vma))
    return plan


def _not_manual(region: Region, path: Any, plan: _Plan) -> MeshError:
    """A spec of a partial-manual region that names an axis it is not manual over (JAX: a ValueError)."""
    names = region.rm.mesh.axis_names
    bad = [a for a in names if a in (plan.axes | plan.unreduced | plan.reduced) - region.new]
    return MeshError(
        f"`shard_map` requires in_specs and out_specs to name only the region's manual axes (axis_names: "
        f"{tuple(a for a in names if a in region.new)}), but {_path(path)}={plan.spec} names "
        f"{', '.join(map(repr, bad))}, which {'is' if len(bad) == 1 else 'are'} not manual in this "
        "region (inside, the other axes stay DTensor dims, placed as the argument's DTensor says); drop "
        f"{', '.join(map(repr, bad))} from the spec, or add {'it' if len(bad) == 1 else 'them'} to axis_names",
        mesh=region.rm.mesh)


# -- in -----------------------------------------------------------------------------------------------


def enter_all(region: Region, f: Callable[..., Any], args: tuple, in_specs: Any) -> list[Any]:
    """The local values ``f`` is called with: each tensor argument entered by its plan (and typed)."""
    entries, tree = _leaves("in_specs", in_specs, args)
    leaves: list[Any] = []
    misfits = None
    for path, leaf, spec in entries:
        if isinstance(leaf, torch.Tensor):
            plan = _plan(region, spec, path)
            if not plan.fits(leaf.shape):  # collect every misfit, then one error (_in_specs_error)
                misfits = [] if misfits is None else misfits
                misfits.append((path, plan, leaf.shape))
                continue
            if misfits is not None:
                continue
            if region.partial:
                outer = region.outer.types_of(leaf) if region.outer is not None else _vma.INVARIANT
                leaf = _enter_partial(region, path, leaf, plan)
                if region.check_vma and (plan.axes or plan.unreduced or outer.varying or outer.unreduced):
                    region.enter(leaf, plan.axes | outer.varying, plan.unreduced | outer.unreduced)
                leaves.append(leaf)
                continue
            leaf = _enter(region, path, leaf, plan)
            if region.check_vma and (plan.axes or plan.unreduced or plan.reduced):
                region.enter(leaf, plan.axes, plan.unreduced, plan.reduced, plan.kind)
        leaves.append(leaf)
    if misfits is not None:
        raise _in_specs_error(region.rm, f, len(args), misfits)
    return list(_rebuild(leaves, tree if tree is not None else ()))


def _in_specs_error(rm: RealizedMesh, f: Callable[..., Any], n: int, misfits: list[tuple[Any, _Plan, Any]]
                    ) -> MeshError:
    """Every argument that does not fit its in_spec, each with the parameter of ``f`` it is bound to,
    and the mesh (JAX's ``_spec_rank_error`` and ``_spec_divisibility_error``, in one)."""
    name, parameters = _name(f), _parameters(f, n)
    lines = []
    for path, plan, shape in misfits:
        i = _argument(path)
        bound = "" if parameters is None or i is None or i >= len(parameters) else \
            f" (bound to {name}'s parameter {parameters[i]})"
        lines.append(f"  {_path(path)}={plan.spec}{bound}: {plan.misfit(shape)}")
    count = len(misfits)
    return MeshError(
        f"`shard_map` requires every argument to fit its in_spec (a rank at least the spec's length, every "
        f"sharded dim divisible by the total size of its axes), but {count} argument{'s' if count != 1 else ''} "
        f"do{'' if count != 1 else 'es'} not (mesh {rm.mesh!r}{selected(rm)}):\n" + "\n".join(lines), mesh=rm.mesh)


def _parameters(f: Callable[..., Any], n: int) -> list[str] | None:
    """How ``f``'s parameters name its ``n`` positional arguments (``'x'``, ``*args[0]``), or ``None``
    where its signature is unknown or takes fewer positional arguments (a module: its ``forward``'s)."""
    try:
        parameters = inspect.signature(f.forward if isinstance(f, torch.nn.Module) else f).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature, or no callable
        return None
    names, rest = [], None
    for p in parameters:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(repr(p.name))
        elif p.kind is p.VAR_POSITIONAL:
            rest = p.name
    if rest is not None:
        names += [f"*{rest}[{j}]" for j in range(n - len(names))]
    return names[:n] if len(names) >= n else None


def _name(f: Callable[..., Any]) -> str:
    """How messages name ``f``: its ``__name__``, a partial's function's, else its class's (a module)."""
    name = getattr(f, "__name__", None) or getattr(getattr(f, "func", None), "__name__", None)
    return name if isinstance(name, str) else type(f).__name__


def _enter(region: Region, path: Any, value: torch.Tensor, plan: _Plan) -> torch.Tensor:
    rm = region.rm
    if isinstance(value, DTensor):
        dm = value.device_mesh
        if (dm is not rm.device_mesh and dm != rm.device_mesh) or tuple(value.placements) != plan.placements:
            raise MeshError(
                f"`shard_map` requires each DTensor argument to be sharded as its in_spec says, but {_path(path)} is "
                f"{_describe(value)} and its spec asks for {plan.sharding}; call fm.reshard(x, "
                f"{plan.sharding!r}) first (communication is always explicit)", mesh=rm.mesh)
        # with no gradient to route, the local tensor itself: what to_local gives under no_grad, without
        # its autograd node (~10 us per argument); with one, eagerly, to_local's view with a cheaper backward
        # (_Local); under torch.compile, or for a pending sum (whose gradient DTensor is Replicate), to_local
        if not (value.requires_grad and torch.is_grad_enabled()):
            local = value.to_local() if region.traced else _torch.local_tensor(value)
        elif plan.cotangent is not None:  # reduced: the gradient leaves as a pending sum
            local = value.to_local(grad_placements=plan.cotangent)
        elif region.traced or plan.unreduced:
            local = value.to_local()
        else:
            local = _Local.apply(value)
    elif plan.unreduced:
        raise MeshError(
            f"`shard_map` requires a DTensor with Partial({plan.kind!r}) placements for an in_spec with unreduced axes, "
            f"but "
            f"{_path(path)} is a plain tensor and its spec is {plan.spec} (a full value is no pending sum); pass "
            f"a DTensor (fm.sharding_of says P(..., unreduced=...) of one), or drop unreduced= from the spec",
            mesh=rm.mesh)
    elif not plan.gathers:
        local = value  # replicated: the full value is the local one, and its gradient is already full
    else:  # no communication; backward gathers the full gradient
        local = value
        for dim, axes in plan.gathers:
            local = _local_block(rm, local, axes, dim)
    # untyped: psum the cotangent over the unnamed axes (JAX's convention; typed, the rules make it
    # invariant there already); eagerly only where there will be a cotangent
    if plan.unnamed and (region.traced or (local.requires_grad and torch.is_grad_enabled())):
        return region.pvary(local, plan.unnamed)
    return local


def _enter_partial(region: Region, path: Any, value: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """A partial-manual region's argument: its block over the manual axes, a DTensor over the others (on
    their submesh, placed as the argument's DTensor is there; a plain tensor is replicated there)."""
    rm, inner = region.rm, region.auto
    if isinstance(value, DTensor):
        dm, names = _outer_mesh(region)
        placements = tuple(value.placements)
        # over each manual axis: placed as the spec says, or replicated (its block is taken here, as a full
        # tensor's is: no communication, the gradient gathered back)
        sliced = {a for i, a in enumerate(names) if a in region.new and isinstance(placements[i], Replicate)
                  and isinstance(plan.placements[rm.mesh.axis_names.index(a)], Shard)}
        kept = tuple(p for p, a in zip(placements, names, strict=True) if a not in region.new)
        if sliced:  # no dim both taken here and split over an automatic axis; the other manual axes as the spec says
            fits = not _mixed(plan, kept, sliced) and all(
                placements[i] == plan.placements[rm.mesh.axis_names.index(a)] for i, a in enumerate(names)
                if a in region.new and a not in sliced) and not any(
                sliced & set(axes) and not set(axes) <= sliced for _, axes in plan.gathers)
        else:
            fits = placements == _merged(region, plan, kept, names)
        if (value.device_mesh is not dm and value.device_mesh != dm) or not fits:
            raise MeshError(
                f"`shard_map` requires each DTensor argument to be on the region's mesh ({names}) and sharded over its "
                f"manual axes {tuple(a for a in names if a in region.new)} as its in_spec says (or replicated over "
                f"them), but {_path(path)} is a "
                f"DTensor with placements {placements} on {value.device_mesh} and its spec is {plan.spec}; "
                f"redistribute it first (communication is always explicit)", mesh=rm.mesh)
        kept = tuple(Shard(p.dim) if _shards(p) else p for p in kept)  # on the submesh: in its own order
        shape = [n // plan.sizes[d] if d < len(plan.sizes) else n for d, n in enumerate(value.shape)]
        local = value.to_local()
        for dim, axes in plan.gathers:
            if sliced & set(axes):
                local = _local_block(rm, local, axes, dim)
    elif plan.unreduced:
        return _enter(region, path, value, plan)  # its error: a full value is no pending sum
    else:
        kept = (Replicate(),) * len(inner)
        local = value
        for dim, axes in plan.gathers:
            local = _local_block(rm, local, axes, dim)
        shape = list(local.shape)
    if plan.unnamed and (region.traced or (local.requires_grad and torch.is_grad_enabled())):
        local = region.pvary(local, plan.unnamed)
    if not inner:
        return local
    return DTensor.from_local(local, _inner_mesh(region), kept, run_check=False, shape=torch.Size(shape),
                              stride=row_major_strides(shape))


def _merged(region: Region, plan: _Plan, kept: tuple[Any, ...], names: tuple[str, ...]) -> tuple[Any, ...]:
    """The placements over ``names`` of a value split over the manual axes as ``plan`` says and over the
    automatic ones as ``kept`` (their placements, in mesh order) says: a dim split over both is split over
    the manual axes first (JAX: the region's block of it is whole), so an automatic axis before them in mesh
    order is a ``_StridedShard`` there (what ``NamedSharding`` places for such a spec)."""
    rm, auto = region.rm, region.auto
    by_dim: dict[int, list[str]] = {}
    for p, a in zip(kept, auto, strict=True):
        if _shards(p):
            by_dim.setdefault(p.dim, []).append(a)
    if not by_dim:
        return tuple(plan.placements[rm.mesh.axis_names.index(a)] if a in region.new else kept[auto.index(a)]
                     for a in names)
    rank = max([len(plan.axes_of)] + [d + 1 for d in by_dim])
    entries = [tuple(plan.axes_of[d] if d < len(plan.axes_of) else ()) + tuple(by_dim.get(d, ())) for d in range(rank)]
    full = NamedSharding(rm.mesh, PartitionSpec(*[e or None for e in entries])).placements
    mixed = {a for d in by_dim if d < len(plan.axes_of) for a in plan.axes_of[d]}  # manual axes of a mixed dim
    return tuple((full if a in mixed else plan.placements)[rm.mesh.axis_names.index(a)] if a in region.new else
                 full[rm.mesh.axis_names.index(a)] if _shards(kept[auto.index(a)]) else kept[auto.index(a)]
                 for a in names)


def _shards(p: Any) -> bool:
    """Whether the placement ``p`` splits a dim: a ``Shard`` or a ``_StridedShard`` (not a subclass of it on
    every torch), not a ``Replicate`` or ``Partial``."""
    return isinstance(getattr(p, "dim", None), int)


def _mixed(plan: _Plan, kept: tuple[Any, ...], sliced: set[str]) -> bool:
    """Whether a dim the argument is replicated over (``sliced``) is also split over an automatic axis."""
    return bool({p.dim for p in kept if _shards(p)} & {d for d, axes in plan.gathers if sliced & set(axes)})


class _Local(torch.autograd.Function):
    """A DTensor argument's local tensor, eagerly, when it needs a gradient: ``to_local()``'s view, whose
    backward makes the gradient DTensor with the argument's own spec (``to_local``'s backward derives
    it anew with ``DTensor.from_local``: some 15 us per argument and step)."""

    @staticmethod
    def forward(ctx: Any, value: DTensor) -> torch.Tensor:
        local = _torch.local_tensor(value)
        ctx.spec, ctx.stride = _torch.dtensor_spec(value), local.stride()
        ctx.set_materialize_grads(False)
        return local.view_as(local)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> DTensor | None:
        if grad is None:
            return None
        spec = ctx.spec
        if grad.stride() != ctx.stride or torch.is_grad_enabled():  # another layout, or a graph of the backward
            return DTensor.from_local(grad, spec.mesh, spec.placements)
        return _torch.wrap_local(grad, copy.copy(spec), False)  # a copy, as to_local's: no spec is shared


def _local_block(rm: RealizedMesh, x: torch.Tensor, axes: tuple[str, ...], dim: int) -> torch.Tensor:
    """This rank's block of ``x`` along ``dim`` over ``axes`` (first axis major), without
    communication; backward gathers the cotangent (the transpose of ``all_gather(to="invariant")``).
    ``dim`` is a valid, non-negative dim: the boundary's plan checked it."""
    call = Call("shard_map", rm, x, resolve_axes("shard_map", rm, axes), {}, torch.compiler.is_compiling())
    for hop in call.hops():  # outermost first; backward gathers innermost first
        x = run_step(call, x, S.Slice(call.group(hop), hop.size, dim, call.position(hop)), hop)
    return x


def _describe(value: DTensor) -> str:
    try:
        return repr(sharding_of(value))
    except MeshError:
        return f"a DTensor with placements {tuple(value.placements)}"


# -- out ----------------------------------------------------------------------------------------------


def exit_all(region: Region, out: Any, out_specs: Any) -> Any:
    """The region's results as DTensors, after the type checks of out_specs (typed regions)."""
    rm = region.rm
    entries, tree = _leaves("out_specs", out_specs, out)
    plans = [_plan(region, spec, path) if isinstance(leaf, torch.Tensor) else None for path, leaf, spec in entries]
    if region.check_vma:
        region.check_trace("the region's results")
        failures, pending, others = [], [], []
        for (path, leaf, _), plan in zip(entries, plans, strict=True):
            if plan is not None:
                varying, named = region.type_of(leaf), plan.axes
                if region.outer is not None:  # the enclosing regions' axes pass through: theirs to check
                    varying = varying - region.outer.axes
                if varying - named:
                    fix = region.fix_for(leaf, varying - named)
                    if varying & plan.unreduced and not (varying - named - plan.unreduced):
                        axes = tuple(sorted(varying & plan.unreduced))
                        fix = (f"its out_spec says it is a pending sum over {axes}: cast it with "
                               f"fm.pcast(x, {axes if len(axes) > 1 else axes[0]!r}, to='unreduced')")
                    failures.append((_path(path), varying, named, plan.spec, fix))
                # (no pending or reduced value was ever made in the region: none of its results is one)
                types = _vma.INVARIANT if region.unreduced is None else region.types_of(leaf)
                unreduced = types.unreduced
                if unreduced != plan.unreduced and (unreduced - plan.unreduced or plan.unreduced - unreduced - varying):
                    pending.append((_path(path), varying, unreduced, plan.unreduced, plan.spec))
                elif unreduced and types.unreduced_kind != plan.kind:
                    others.append(f"  {_path(path)}: a pending {types.unreduced_kind} over {tuple(sorted(unreduced))}, "
                                  f"but its out_spec {plan.spec} says unreduced_kind={plan.kind!r}; end it with "
                                  f"fm.p{types.unreduced_kind}, or say unreduced_kind={types.unreduced_kind!r}")
                if types.reduced != plan.reduced:
                    extra, missing = sorted(types.reduced - plan.reduced), sorted(plan.reduced - types.reduced)
                    others.append(f"  {_path(path)}: reduced over {sorted(types.reduced)}, but its out_spec "
                                  f"{plan.spec} "
                                  f"says reduced over {sorted(plan.reduced)} (as in JAX, the two must be equal); "
                                  + (f"name {extra} in P(..., reduced=...)" if extra else
                                     f"cast it with fm.pcast(x, {missing!r}, to='reduced')"))
        if failures:
            raise _vma.out_specs_error(failures, [a for a in rm.mesh.axis_names if a in region.new], region.random)
        if pending:
            raise _vma.unreduced_out_specs_error(pending)
        if others:
            raise _vma.VmaError("`shard_map` requires each result's pending kind and reduced axes to be what its "
                                "out_spec says, but:\n" + "\n".join(others))
    leaves = []
    for (path, leaf, _), plan in zip(entries, plans, strict=True):
        if plan is not None:
            if plan.rank > leaf.ndim:  # a result is local: only the rank rule applies
                raise MeshError(requires("shard_map", f"a value of rank at least {plan.rank} for {_path(path)}="
                                         f"{plan.spec}", "shape", tuple(leaf.shape)), mesh=rm.mesh)
            leaf = _exit_partial(region, path, leaf, plan) if region.partial else _exit(region, leaf, plan)
        leaves.append(leaf)
    return _rebuild(leaves, tree)


def _exit(region: Region, local: torch.Tensor, plan: _Plan) -> DTensor:
    rm = region.rm
    if region.check_vma:
        missing = plan.axes - region.type_of(local)
        region.forget(local)
        if missing:  # invariant over a named axis: copies are concatenated, so the cotangent sums
            local = region.pvary(local, tuple(sorted(missing)))
    elif plan.unnamed:
        local = _Scale.apply(local, 1.0 / axes_size(rm, plan.unnamed))
    # the global shape: each dim's local size times the size of its axes; contiguous strides
    shape = [n * plan.sizes[d] if d < len(plan.sizes) else n for d, n in enumerate(local.shape)]
    if region.traced or plan.unreduced:  # (a pending sum's gradient is Replicate: from_local's own backward)
        return DTensor.from_local(local, rm.device_mesh, plan.placements, run_check=False, shape=torch.Size(shape),
                                  stride=row_major_strides(shape))
    # eagerly, from_local's result without re-deriving its spec: one spec per shape and dtype, copied
    key = (tuple(shape), local.dtype)
    spec = plan.specs.get(key)
    if spec is None or spec.mesh is not rm.device_mesh:  # (equal meshes share plans, not their DeviceMesh)
        if len(plan.specs) >= 64:
            plan.specs.clear()
        spec = plan.specs[key] = _torch.spec_of(rm.device_mesh, plan.placements, shape, row_major_strides(shape),
                                                local.dtype)
    if local.requires_grad and torch.is_grad_enabled():
        return _Global.apply(local, spec, plan.reduced_dims)
    return _torch.wrap_local(local.view_as(local), copy.copy(spec), False)


def _exit_partial(region: Region, path: Any, leaf: torch.Tensor, plan: _Plan) -> DTensor:
    """A partial-manual region's result: a DTensor over its manual axes (its out_spec) and the others (as the
    result's DTensor is placed there; a plain tensor is replicated there)."""
    rm, inner = region.rm, region.auto
    if isinstance(leaf, DTensor):
        sub = _inner_mesh(region)
        if sub is None or (leaf.device_mesh is not sub and leaf.device_mesh != sub):
            raise MeshError(requires("shard_map", f"results that are plain tensors or DTensors on the region's "
                                     f"automatic axes {inner}", _path(path), f"a DTensor on {leaf.device_mesh}"),
                            mesh=rm.mesh)
        kept = tuple(leaf.placements)
    else:
        kept = (Replicate(),) * len(inner)
    types = region.types_of(leaf) if region.check_vma else _vma.INVARIANT
    if region.check_vma:
        missing = plan.axes - types.varying
        region.forget(leaf)
        if missing:  # invariant over a named axis: copies are concatenated, so the cotangent sums
            leaf = region.pvary(leaf, tuple(sorted(missing)))
    local = leaf.to_local() if isinstance(leaf, DTensor) else leaf
    if not region.check_vma and plan.unnamed:
        local = _Scale.apply(local, 1.0 / axes_size(rm, plan.unnamed))
    dm, names = _outer_mesh(region)
    if any(_shards(p) and type(p) is not Shard for p in kept):
        raise MeshError(requires("shard_map", "results sharded over the automatic axes by Shard placements",
                                 _path(path), f"a DTensor with placements {kept}"), mesh=rm.mesh)
    out = DTensor.from_local(local, dm, _merged(region, plan, kept, names), run_check=False)
    if region.outer is not None and region.check_vma:  # the enclosing region's axes: its type of the result
        region.outer.record(out, types.varying & region.outer.axes, types.unreduced & region.outer.axes)
    return out


class _Global(torch.autograd.Function):
    """A result's DTensor, eagerly, when it needs a gradient: what ``DTensor.from_local`` makes (a view of the
    local tensor), from a spec made once per shape; backward, the cotangent's local tensor in these placements
    (``from_local``'s backward)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, spec: Any, reduced: tuple[tuple[int, int], ...] = ()) -> DTensor:
        ctx.spec, ctx.reduced = spec, reduced  # reduced: (mesh dim, size) where the cotangent is a pending sum
        ctx.set_materialize_grads(False)
        return _torch.wrap_local(local.view_as(local), copy.copy(spec), local.requires_grad)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, None, None]:
        if not isinstance(grad, DTensor):
            return grad, None, None
        spec = ctx.spec
        placements, scale = list(spec.placements), 1
        for dim, size in ctx.reduced:  # a reduced result's cotangent enters as a pending sum (its term here)
            if grad.placements[dim].is_partial():
                placements[dim] = grad.placements[dim]
            else:  # replicated: each member's term is its share (DTensor's Replicate -> Partial("sum"))
                scale *= size
        if tuple(grad.placements) != tuple(placements):
            grad = grad.redistribute(spec.mesh, placements)
        local = grad.to_local() if torch.is_grad_enabled() else _torch.local_tensor(grad)
        return (local / scale if scale != 1 else local), None, None


class _Scale(torch.autograd.Function):
    """Identity forward; the cotangent times ``factor`` backward (an untyped result, over its unnamed axes)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None
