"""``shard_map``: a function written for one shard, mapped over a realized mesh, typed by axis name.

The call is here (resolve the mesh, open a region, enter the arguments, run ``f``, check its pending
results were waited for, exit the results); its three rooms, ``_region``, ``_interpret`` and
``_boundary``, and what a region costs: docs/design.md, "Type rules" and "Eager cost".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import _torch, _vma
from ._boundary import check_specs, enter_all, exit_all
from ._call import member_error
from ._errors import MeshError, requires
from ._handle import RealizedMesh, current_region, open_region, resolve_mesh
from ._interpret import TypedMode
from ._pending import Pending
from ._region import Region

__all__ = ["shard_map", "typeof"]

# Whether this torch's dynamo can trace a region: a feature probe (_torch.region_trace_failure), run on the
# first compiled region and kept, so it costs nothing at import or eagerly. torch 2.11's dynamo cannot take a
# RealizedMesh as a constant of the trace (AsPythonConstantNotImplementedError), 2.12's stops with an internal
# NotImplementedError (a guard on a constant's frozenset); 2.13 traces one whole. The probe tries both in
# miniature; the release number decides nothing.
_NO_COMPILED_REGIONS = (
    "`shard_map` requires torch >= 2.13 (a dynamo that traces a region) to run a region under torch.compile, but "
    "got torch {}, whose dynamo cannot trace one (a probe of what a region does failed: {}); run the region "
    "eagerly (call it outside the compiled function, or wrap it in torch.compiler.disable, which a compiled model "
    "calls across a graph break), or compile the body's parts that communicate nothing (torch.compile functions "
    "without collectives, called in a region with check_vma=False)")


@torch.compiler.assume_constant_result
def _no_compiled_regions() -> str:
    """Why this torch cannot compile a region ("" where it can), as a constant of the trace."""
    failure = _torch.region_trace_failure()
    return "" if failure is None else _NO_COMPILED_REGIONS.format(torch.__version__, failure)


def typeof(t: torch.Tensor) -> _vma.AxisTypes:
    """The axes a local tensor varies over, inside a ``shard_map`` region with ``check_vma=True``.

    JAX's ``jax.typeof(x).vma``: a tensor that entered sharded over an axis varies over it; a
    ``psum`` over the axis makes it invariant; an op's result varies over the union of its
    operands' axes (docs/shard_map.md).

    Args:
        t: a tensor of the region (one made outside it reads as invariant).

    Returns:
        Its type: ``AxisTypes(varying=..., unreduced=..., reduced=..., unreduced_kind=...)`` (the last
        three shown where not empty or "sum").

    Raises:
        TypeError: ``t`` is not a tensor.
        MeshError: no enclosing region, or one with ``check_vma=False`` (it tracks no types).

    Examples:
        >>> def f(x):
        ...     print(fm.typeof(x), fm.typeof(fm.psum(x, "tp")))
        ...     return x
        >>> _ = fm.shard_map(f, in_specs=P("tp"), out_specs=P("tp"), mesh=rm)(torch.arange(8.0))
        AxisTypes(varying=frozenset({'tp'})) AxisTypes(varying=frozenset())
        >>> from torch.distributed.tensor import DTensor, Partial, Replicate
        >>> m = DTensor.from_local(torch.ones(2), rm.device_mesh, [Replicate(), Partial("max")])  # a pending max
        >>> _ = fm.shard_map(lambda x: print(fm.typeof(x)) or fm.pmax(x, "tp"), mesh=rm, out_specs=P(),
        ...                  in_specs=P(unreduced="tp", unreduced_kind="max"))(m)
        AxisTypes(varying=frozenset(), unreduced=frozenset({'tp'}), unreduced_kind='max')
        >>> fm.typeof(torch.ones(2))
        Traceback (most recent call last):
        ...
        functional_mesh.MeshError: `typeof` requires an enclosing shard_map region with check_vma=True, but got none
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(requires("typeof", "a torch.Tensor", "t", t))
    region = current_region()
    if region is None or not region.check_vma:
        raise MeshError("`typeof` requires an enclosing shard_map region with check_vma=True, but got "
                        + ("a region with check_vma=False" if region is not None else "none"))
    return region.types_of(t)


def shard_map(f: Callable[..., Any] | None = None, /, *, in_specs: Any, out_specs: Any,
              mesh: RealizedMesh | None = None, check_vma: bool = True, axis_names: Any = None) -> Any:
    """Map ``f``, written for one shard, over the realized mesh: JAX's ``shard_map`` on torch.

    Args:
        f: the per-shard function (or omit it to use ``shard_map(...)`` as a decorator).
        in_specs: a ``PartitionSpec`` per argument, or any pytree prefix of the arguments.
        out_specs: a ``PartitionSpec`` per result, or any pytree prefix of the results.
        mesh: a ``RealizedMesh``; ``None`` = the enclosing region's, else the current ``with rm:`` mesh, at call time.
        check_vma: track which axes each tensor varies over, insert the implicit ``pvary``s and
            check the results against out_specs (docs/shard_map.md); ``False`` trusts out_specs.
        axis_names: the axes the region is manual over (a set; ``None``: every axis); the others stay
            DTensor dims inside, and regions nest over disjoint sets (docs/shard_map.md, "Manual over some axes").

    Returns:
        The mapped function: DTensor or full-tensor arguments in, DTensors out. A DTensor argument
        must be sharded as its spec says (else ``fm.reshard`` it first); a plain tensor is the full
        value, sliced to this rank's block without communication (its gradient is gathered back).

    Raises:
        TypeError: ``f`` is not callable, ``check_vma`` is not a bool, a spec leaf is not a
            ``PartitionSpec``, or ``mesh`` is not a ``RealizedMesh``.
        MeshError: when called: no mesh (``mesh=None`` outside ``with rm:``), a rank outside the
            mesh, a nested region over axes already manual, a spec naming an axis not in ``axis_names``,
            specs that are no pytree prefix of the values, a sharded dim that does not divide
            evenly, a DTensor sharded otherwise than its spec.
        VmaError: a collective over an axis not in ``axis_names``; with ``check_vma=True``: a result
            varies over an axis its out_spec does not name (one error lists every such result, with
            its fix), or an op the region cannot type.

    Examples:
        >>> double = fm.shard_map(lambda x: x * 2, in_specs=P("tp"), out_specs=P("tp"), mesh=rm)
        >>> y = double(torch.arange(8.0))  # a full tensor in: this rank's block is [2., 3.]
        >>> y.shape, y.to_local(), fm.sharding_of(y)
        (torch.Size([8]), tensor([4., 6.]), NamedSharding(Mesh(dp=2, tp=4), P('tp')))
        >>> @fm.shard_map(in_specs=P("tp"), out_specs=P(), mesh=rm)
        ... def local_sum(x):
        ...     return x.sum()  # varies over tp, but out_specs says it is the same on every member
        >>> local_sum(torch.arange(8.0))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        functional_mesh.VmaError: ...
        >>> total = fm.shard_map(lambda x: fm.psum(x.sum(), "tp"), in_specs=P("tp"), out_specs=P(), mesh=rm)
        >>> total(torch.arange(8.0)).shape
        torch.Size([])
    """
    if f is None:
        return functools.partial(shard_map, in_specs=in_specs, out_specs=out_specs, mesh=mesh, check_vma=check_vma,
                                 axis_names=axis_names)
    if not callable(f):
        raise TypeError(requires("shard_map", "a callable f", "f", f))
    if not isinstance(check_vma, bool):
        raise TypeError(requires("shard_map", "check_vma=True or False", "check_vma", check_vma))
    if mesh is not None and not isinstance(mesh, RealizedMesh):
        resolve_mesh("shard_map", mesh)  # the error for a pure Mesh or another type
    check_specs("in_specs", in_specs)
    check_specs("out_specs", out_specs)
    names = _axis_names(axis_names)

    @functools.wraps(f)
    def mapped(*args: Any) -> Any:
        if not torch.compiler.is_compiling():
            return _call(f, mesh, check_vma, in_specs, out_specs, args, names)
        why = _no_compiled_regions()  # "" where this torch's dynamo traces a region (probed once)
        if why:  # before dynamo meets the mesh: its own error there names none of this
            _torch.raise_while_tracing(False, why)
        try:
            return _call(f, mesh, check_vma, in_specs, out_specs, args, names)
        except MeshError as error:  # a type or boundary error while tracing: the user's error, not torch's
            _torch.raise_while_tracing(isinstance(error, _vma.VmaError), error.args[0])

    return mapped


def _axis_names(axis_names: Any) -> tuple[str, ...] | None:
    """``axis_names`` checked at ``shard_map``: ``None`` (every axis), else its names, sorted (the mesh checks them)."""
    if axis_names is None:
        return None
    if isinstance(axis_names, str) or not isinstance(axis_names, (set, frozenset, tuple, list)) or not all(
            isinstance(a, str) for a in axis_names):
        raise TypeError(requires("shard_map", "axis_names=None or a set of mesh axis names", "axis_names",
                                 axis_names))
    return tuple(sorted(set(axis_names))) or None  # JAX: an empty set is every axis


def _region(rm: RealizedMesh, check_vma: bool, names: tuple[str, ...] | None) -> Region:
    """The region of one call: manual over ``names`` (``None``: every axis the enclosing region leaves)."""
    outer = current_region()
    if names is None and outer is None:  # the common case: manual over every axis
        return Region(rm, check_vma)
    axes = rm.mesh.axis_names
    if names is not None:
        unknown = [a for a in names if a not in axes]
        if unknown:
            raise MeshError(requires("shard_map", "axis_names that are axes of the mesh", "axis_names", names, axes),
                            mesh=rm.mesh)
    if outer is None:
        return Region(rm, check_vma, None if names is None or len(names) == len(axes) else frozenset(names))
    if not isinstance(outer, Region) or outer.rm.mesh != rm.mesh or outer.check_vma != check_vma:
        raise MeshError(requires("shard_map", "a region nested in a region over the same mesh, with the same "
                                 "check_vma", "an enclosing region", "over another mesh or check_vma"))
    left = tuple(a for a in axes if a not in outer.axes)
    new = frozenset(left if names is None else names)
    taken = sorted(new & outer.axes)
    if taken or not new:
        raise MeshError(
            "`shard_map` requires a nested region to be manual over axes its enclosing regions are not (regions nest "
            f"over disjoint axis sets), but got axis_names={names} inside a region manual over "
            f"{tuple(a for a in axes if a in outer.axes)} (the axes left: {left}); call the inner function directly, "
            "or make the outer region manual over fewer axes (axis_names=...)", mesh=rm.mesh)
    return Region(rm, check_vma, new, outer)


def _call(f: Callable[..., Any], mesh: RealizedMesh | None, check_vma: bool, in_specs: Any, out_specs: Any,
          args: tuple, names: tuple[str, ...] | None = None) -> Any:
    enclosing = current_region() if mesh is None else None
    rm = enclosing.rm if isinstance(enclosing, Region) else resolve_mesh("shard_map", mesh)  # nested: its mesh
    if rm.coordinate is None:
        raise member_error("shard_map", rm)
    region = _region(rm, check_vma, names)
    outer = region.outer
    try:
        local = enter_all(region, f, args, in_specs)
        with open_region(region):
            if check_vma and outer is not None:  # nested: the enclosing region's mode types this region's ops
                region.mode, outer.mode.region = outer.mode, region
                try:
                    out = f(*local)
                finally:
                    outer.mode.region = outer
            elif check_vma:  # typed: a mode sees every op
                region.mode = TypedMode(region)
                with region.mode:
                    out = f(*local)
            else:  # untyped: plain torch; only the collectives ask for the region
                out = f(*local)
        if region.waiting:
            _check_waited(region.waiting)
        return exit_all(region, out, out_specs)
    finally:
        region.close()  # the arguments' tensors carry no type, and no tensor a cast, out of the region


def _check_waited(issued: list[Pending]) -> None:
    """Every result issued in the region with ``async_op=True`` must have been waited for when it returns."""
    unwaited = [p for p in issued if not p.waited]
    if unwaited:
        names = ", ".join(f"{p.api} over {(p.axis[0] if len(p.axis) == 1 else p.axis)!r}" for p in unwaited)
        raise MeshError(
            "`shard_map` requires every collective issued in the region with async_op=True to be waited for before "
            "the region's function returns (its communication would outlive the region, and a member waiting for "
            f"it would hang), but {len(unwaited)} {'was' if len(unwaited) == 1 else 'were'} never waited for: "
            f"{names}; call .wait() on each pending result and use the tensor it returns")
