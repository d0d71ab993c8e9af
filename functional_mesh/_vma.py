"""Varying-axes types of ``shard_map`` regions: the values, the rules, the messages (pure: no torch).

Inside a region with ``check_vma=True`` every tensor carries the set of mesh axes it *varies*
over (JAX's "vma"); over every other axis of the region's mesh it is *invariant* (the same on
every rank of that axis). The lattice is two-valued per axis, so one default rule types nearly
every op: the result varies over the union of its operands' axes, and an operand invariant
where the result varies is first cast (``pvary``: identity forward, ``psum`` backward). The
collectives are the exceptions; their rules are here, next to the default, as pure functions
of types that return a :class:`Rule`: per operand the axes to cast first, and the result type.

Nothing here runs an op: ``_op_rules.py`` maps torch functions to these rules and
``_shard_map.py`` interprets them. Type errors are :class:`VmaError`, a ``MeshError`` (so a
``ValueError``): never a ``TypeError``, which torch turns into "unsupported operand type(s)" when
it is raised inside ``__torch_function__`` of a reflected operator (``2 - x``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import MeshError

__all__ = ["AxisTypes", "Rule", "VmaError", "axis_index_rule", "check_write", "default_rule", "gather_rule",
           "invariant_gather_rule", "op_error", "out_specs_error", "pvary_rule", "psum_rule", "psum_scatter_rule",
           "random_rule", "set_repr", "spread_rule"]


@dataclass(frozen=True, slots=True)
class AxisTypes:
    """What :func:`functional_mesh.typeof` returns: the mesh axes a local tensor varies over."""

    varying: frozenset[str]

    def __repr__(self) -> str:
        return f"AxisTypes(varying={set_repr(self.varying)})"


@dataclass(frozen=True, slots=True)
class Rule:
    """The typing of one op: per tensor operand the axes to ``pvary`` first, and the result's type."""

    casts: tuple[frozenset[str], ...]
    result: frozenset[str]


class VmaError(MeshError):
    """A type error of a typed ``shard_map`` region: a value varies over an axis where it must not.

    Raised on every rank alike (types depend on types only), before the op or the region's
    results communicate anything. A :class:`MeshError`, so a ``ValueError``. Raised by:

    - the region's results: one that varies over an axis its out_spec does not name (every such
      result is listed, with the fix: a ``psum`` or ``all_gather`` over that axis, or naming it);
    - an in-place write (``x += y``, ``x[i] = y``, ``out=``) of a value varying over more axes
      than the tensor written;
    - the collectives' type rules: ``psum``/``pmean``/``pmax``/``pmin``/``psum_scatter`` over a
      tuple of axes of a value that varies over some of them and not the others, ``pvary`` of a
      value already varying over the axis;
    - ops whose result types cannot be known: torch.distributed's own collectives and custom ops.

    Examples:
        Rank 5 of 8 under torch's fake backend, which moves no data: the examples show shapes
        and types.

        >>> import torch, torch.distributed as dist
        >>> import functional_mesh as fm
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
        >>> rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
        >>> f = fm.shard_map(lambda v: v * 2, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())
        >>> f(torch.ones(8))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        functional_mesh.VmaError: `shard_map` requires each result to be invariant over every mesh axis ...
        >>> g = fm.shard_map(lambda v: fm.psum(v * 2, "tp"), mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())
        >>> g(torch.ones(8)).shape
        torch.Size([2])
        >>> fm.clear_cache(); dist.destroy_process_group()
    """

    __module__ = "functional_mesh"


def set_repr(axes: Iterable[str]) -> str:
    """``frozenset({'x', 'y'})`` in a stable order, for messages that must match across ranks."""
    names = sorted(axes)
    return "frozenset()" if not names else "frozenset({" + ", ".join(map(repr, names)) + "})"


def _casts(operands: Sequence[frozenset[str]], result: frozenset[str]) -> tuple[frozenset[str], ...]:
    return tuple(result - t for t in operands)


def default_rule(operands: Sequence[frozenset[str]]) -> Rule:
    """Any elementwise, reduction, view or shape op: the union (join), every operand cast up to it.

    Laws (tests/laws/test_vma_laws.py): the join is commutative, associative and idempotent; after
    the casts every operand has exactly the result's type.
    """
    result = frozenset().union(*operands)
    return Rule(_casts(operands, result), result)


def check_write(api: str, written: frozenset[str], result: frozenset[str], shapes: Sequence[object] = ()) -> None:
    """An op that writes into a tensor (``x.add_(y)``, ``x[i] = y``, ``out=``) keeps that tensor's type.

    So the written tensor must already vary over every axis of the result: writing a value that
    varies over ``a`` into a tensor invariant over ``a`` would change the type of every alias.
    """
    extra = result - written
    if extra:
        raise VmaError(
            f"`{api}` writes in place into a tensor that varies over {set_repr(written)}, but the value it "
            f"writes varies over {set_repr(result)}: the tensor is invariant over {sorted(extra)}"
            f"{_shapes(shapes)}; write `x = x + y` (out of place) instead of `x += y`, or make the tensor vary "
            f"first with fm.pcast(x, {tuple(sorted(extra))!r}, to='varying')")


def random_rule(operands: Sequence[frozenset[str]], mesh_axes: frozenset[str]) -> Rule:
    """Random ops (``rand``, ``dropout``, ``normal_``, ...) vary over every axis of the region's mesh.

    Each rank draws from its own generator state: a dropout mask on a replicated activation
    differs across ``tp``, which is the bug these types exist to catch.
    """
    return Rule(_casts(operands, mesh_axes), mesh_axes)


def _check_not_mixed(api: str, operand: frozenset[str], axes: frozenset[str]) -> None:
    """A reduction over several axes needs an operand that varies over all of them or over none (JAX)."""
    varying, invariant = operand & axes, axes - operand
    if varying and invariant:
        raise VmaError(
            f"`{api}` over {tuple(sorted(axes))} requires a value that varies over all of these axes or over none, "
            f"but got one that varies over {sorted(varying)} and not over {sorted(invariant)}; reduce over "
            f"{tuple(sorted(varying))} alone, or fm.pcast(x, {tuple(sorted(invariant))!r}, to='varying') first")


def psum_rule(api: str, operand: frozenset[str], axes: frozenset[str]) -> Rule:
    """``psum``/``pmean`` over ``axes``: invariant over them; an invariant operand is cast first (``n * x``).

    An operand that varies over some of the axes and not the others is a ``VmaError``, as in JAX.
    """
    _check_not_mixed(api, operand, axes)
    return Rule((axes - operand,), operand - axes)


def psum_scatter_rule(api: str, operand: frozenset[str], axes: frozenset[str]) -> Rule:
    """``psum_scatter`` over ``axes``: the result varies over them; mixed operands are an error (JAX)."""
    _check_not_mixed(api, operand, axes)
    return spread_rule(api, operand, axes)


def pvary_rule(api: str, operand: frozenset[str], axes: frozenset[str]) -> Rule:
    """``pvary``/``pcast(to="varying")``: the operand must be invariant over ``axes``; the result varies."""
    already = operand & axes
    if already:
        raise VmaError(
            f"`{api}` requires a value invariant over the axes it casts to varying, but got a value that "
            f"already varies over {sorted(already)} (its axes: {set_repr(operand)}); drop those axes from the call")
    return Rule((frozenset(),), operand | axes)


def spread_rule(api: str, operand: frozenset[str], axes: frozenset[str]) -> Rule:
    """``all_gather(to="varying")``, ``all_to_all``, ``ppermute``: the result varies over ``axes``.

    An operand invariant over some of ``axes`` is cast first, as JAX does.
    """
    return Rule((axes - operand,), operand | axes)


gather_rule = spread_rule


def invariant_gather_rule(api: str, operand: frozenset[str], axes: frozenset[str]) -> Rule:
    """``all_gather(to="invariant")``: every member gets the same value, invariant over ``axes``.

    The operand is cast to vary over ``axes`` first: gathering copies of an invariant block is
    legal, and its backward (this rank's slice of the cotangent) then sums over the copies.
    """
    return Rule((axes - operand,), operand - axes)


def axis_index_rule(axes: frozenset[str]) -> Rule:
    """``axis_index``: a value that varies over exactly its axes."""
    return Rule((), axes)


def _shapes(shapes: Sequence[object]) -> str:
    return f" (operand shapes {list(shapes)})" if shapes else ""


def op_error(op: str, operands: Sequence[tuple[object, frozenset[str]]], why: str) -> VmaError:
    """The error of one op: its name, each operand's shape and axes, and why."""
    described = ", ".join(f"{list(shape)}{{V:{','.join(sorted(t))}}}" for shape, t in operands)
    return VmaError(f"`{op}` cannot be typed inside shard_map: {why}; operands: {described or 'none'}")


def out_specs_error(failures: Sequence[tuple[Any, ...]], mesh_axes: Sequence[str], random: bool = False) -> VmaError:
    """Every result that still varies over an axis its out_spec does not name, then the fix.

    ``failures``: ``(path, varying, named, spec)`` per result, and optionally the fix to suggest
    when the generic one would mislead (a result an ``all_gather`` made: its invariant form).

    ``random``: the region drew random numbers, which vary over every axis; the message says so.
    """
    lines = []
    for path, varying, named, spec, *fix in failures:
        extra = sorted(varying - named)
        axes = ", ".join(repr(a) for a in extra)
        how = fix[0] if fix and fix[0] else f"psum or all_gather over {axes}"
        lines.append(f"  {path}: varies over {set_repr(varying)}, but its out_spec {spec} does not name {axes}; "
                     f"{how}, or name {axes} in out_specs")
    if random:
        lines.append("  (this region ran random ops such as torch.rand, dropout or normal_: they vary over every mesh "
                     "axis, because each rank draws from its own generator; draw the numbers outside the region and "
                     "pass them in, or name the axes in out_specs)")
    return VmaError("`shard_map` requires each result to be invariant over every mesh axis its out_spec does not "
                    f"name, but {len(failures)} result{'s' if len(failures) != 1 else ''} still var"
                    f"{'y' if len(failures) != 1 else 'ies'} (mesh axes {tuple(mesh_axes)}):\n" + "\n".join(lines))
