"""Varying-axes types of ``shard_map`` regions: the values, the rules, the messages (pure: no torch).

What the types mean, the default rule and pending sums: docs/design.md, "Type rules" and "Pending
sums". Here are the values and the collectives' rules, pure functions of types that return a
:class:`Rule`; ``_op_rules`` maps torch functions to them, ``_interpret`` applies them. Type errors
are :class:`VmaError`, never a ``TypeError`` (docs/design.md, "Errors").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from ._errors import MeshError

__all__ = ["INVARIANT", "LINEAR_KINDS", "AxisTypes", "CollectiveRule", "Rule", "VmaError", "axis_index_rule",
           "check_write", "default_rule", "gather_rule", "kind_error", "op_error", "out_specs_error", "pcast_rule", "pmax_rule",
           "psum_rule", "psum_scatter_rule", "pvary_rule", "random_rule", "set_repr", "special_op_rule",
           "spread_rule", "unreduced_collective_error", "unreduced_op_rule", "unreduced_out_specs_error"]


@dataclass(frozen=True, slots=True)
class AxisTypes:
    """What :func:`functional_mesh.typeof` returns: the mesh axes a local tensor varies over, the axes
    over which it is unreduced (a pending reduction of kind ``unreduced_kind``: "sum", "max" or "min"),
    and those over which it is reduced (invariant, its gradient a pending sum); over every other axis
    it is invariant."""

    varying: frozenset[str]
    unreduced: frozenset[str] = frozenset()
    reduced: frozenset[str] = frozenset()
    unreduced_kind: str = "sum"
    _hash: int = field(init=False, repr=False, compare=False)  # kept: the interpreter's rule cache keys on types

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.varying, self.unreduced, self.reduced, self.unreduced_kind)))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        parts = [f"varying={set_repr(self.varying)}"]
        if self.unreduced:
            parts.append(f"unreduced={set_repr(self.unreduced)}")
        if self.reduced:
            parts.append(f"reduced={set_repr(self.reduced)}")
        if self.unreduced and self.unreduced_kind != "sum":
            parts.append(f"unreduced_kind={self.unreduced_kind!r}")
        return f"AxisTypes({', '.join(parts)})"


INVARIANT = AxisTypes(frozenset())  # the type of a tensor the region never typed (made outside it)


class Rule(NamedTuple):  # a NamedTuple: built on every collective's call in a region, ~6x cheaper than a dataclass
    """The typing of one op: per tensor operand the axes to ``pvary`` first, and the result's type.

    ``unreduced``: the axes the result is a pending reduction over, of kind ``kind``. ``sums``: per
    tensor operand, the axes its gradient is summed over although its type does not change (an
    operand multiplied into a pending sum: its local gradient is one term of the sum); empty for most
    ops. ``reduced``: the axes the result is reduced over; ``relabels``: per tensor operand, the
    reduced axes it is cast to varying over first (no communication either way); ``params``: what a
    collective's run takes from the types (``pcast`` of a reduced value: ``{"to": "relabel"}``).
    """

    casts: tuple[frozenset[str], ...]
    result: frozenset[str]
    unreduced: frozenset[str] = frozenset()
    sums: tuple[frozenset[str], ...] = ()
    reduced: frozenset[str] = frozenset()
    kind: str = "sum"
    relabels: tuple[frozenset[str], ...] = ()
    params: Mapping[str, Any] | None = None


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
        >>> f = fm.shard_map(lambda v: v * 2, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())
        >>> f(torch.ones(8))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        functional_mesh.VmaError: `shard_map` requires each result to be invariant over every mesh axis ...
        >>> g = fm.shard_map(lambda v: fm.psum(v * 2, "tp"), mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P())
        >>> g(torch.ones(8)).shape
        torch.Size([2])
    """

    __module__ = "functional_mesh"


__test__ = MappingProxyType({"VmaError": VmaError})  # its module is its public home, which doctest skips


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


# -- pending sums (unreduced) ------------------------------------------------------------------------------
#
# Which ops are linear, and how: ``_op_rules`` names each torch function's kind, one of these.
# "unary": one value operand (views, reshapes, neg, sum, ...): the sum of the members' results is
# the result of the sum. "add": its first two arguments, both pending over the same axes. "cat":
# its first argument, a sequence of values pending over the same axes. "mul": its first two
# arguments, one pending and the other invariant over those axes (or a number). "div": its first
# argument pending, its second invariant. "factors": every tensor operand a factor (matmul,
# einsum, linear without bias): one pending, the others invariant over those axes.
LINEAR_KINDS = ("unary", "view", "add", "cat", "mul", "div", "factors")  # "view": a unary op that keeps any kind

_PSUM_FIRST = "psum (invariant) or psum_scatter (varying) over {axes} first, e.g. fm.psum(x, {axis!r})"


def _fix(axes: frozenset[str]) -> str:
    names = tuple(sorted(axes))
    return _PSUM_FIRST.format(axes=names if len(names) > 1 else repr(names[0]),
                              axis=names if len(names) > 1 else names[0])


def _described(operands: Sequence[tuple[object, frozenset[str], frozenset[str]]]) -> str:
    parts = []
    for shape, varying, unreduced in operands:
        t = " ".join(([f"V:{','.join(sorted(varying))}"] if varying else [])
                     + ([f"U:{','.join(sorted(unreduced))}"] if unreduced else []))
        parts.append(f"{list(shape)}{{{t}}}")  # type: ignore[call-overload]
    return ", ".join(parts) or "none"


def unreduced_op_rule(op: str, kind: str, operands: Sequence[tuple[object, frozenset[str], frozenset[str]]],
                    roles: Sequence[str], adds_number: bool = False) -> Rule:
    """The rule of an op with at least one operand unreduced (a pending sum).

    ``kind``: the op's linearity (one of :data:`LINEAR_KINDS`, or "" for a nonlinear op).
    ``operands``: per tensor operand ``(shape, varying, unreduced)``; ``roles``: per tensor operand,
    what the op does with it: "value" (a term or factor) or "other" (an index, a shape to copy,
    ...); ``adds_number``: an op that adds gets a number as a term. Raises a ``VmaError`` naming the op, the axes and the fix: a nonlinear op, a sum with a
    value that is not pending over the same axes, a product of two pending sums or of a pending
    sum with a value that varies over its axes.
    """
    pending = frozenset().union(*(u for _, _, u in operands))
    values = [(i, v, u) for i, ((_, v, u), role) in enumerate(zip(operands, roles, strict=True)) if role == "value"]
    others = [u for (_, _, u), role in zip(operands, roles, strict=True) if role == "other"]
    axes_text = tuple(sorted(pending))
    where = f"operands: {_described(operands)}"  # (the region caches each rule that raises nothing)
    if not kind:
        raise VmaError(f"`{op}` is not linear, so it cannot take a value unreduced over {axes_text} (a pending sum: "
                       f"each member holds a term, and `{op}` of the terms does not add up to `{op}` of the sum); "
                       f"{_fix(pending)}; {where}")
    if any(others):
        raise VmaError(f"`{op}` uses a value unreduced over {axes_text} as an index, shape or mask, where it needs "
                       f"the value itself; {_fix(pending)}; {where}")
    if kind in ("unary", "add", "cat"):
        if adds_number:
            raise VmaError(f"`{op}` adds a number to a value unreduced over {axes_text}: every member would add it "
                           f"to its term, so the sum would hold it once per member (implicit communication); "
                           f"{_fix(pending)}, then add it; {where}")
        mismatch = [u for _, _, u in values if u != pending]
        if mismatch and not all(u for _, _, u in values):
            raise VmaError(f"`{op}` combines a value unreduced over {axes_text} with one that is not (every member "
                           f"would add it to its term: implicit communication); make every operand unreduced over "
                           f"the same axes (fm.pcast(y, axis, to='unreduced') of a varying y), or {_fix(pending)}; "
                           f"{where}")
        if mismatch:
            given = " and ".join(sorted({str(tuple(sorted(u))) for _, _, u in values}))
            raise VmaError(f"`{op}` adds values unreduced over different axes ({given}): a term would be added "
                           f"once per member of an axis it is not pending over (implicit communication); make "
                           f"every operand unreduced over the same axes {axes_text} (fm.pcast(y, axis, "
                           f"to='unreduced') of a varying y), or {_fix(pending)}; {where}")
        result = _default_over([v for _, v, _ in operands])
        return Rule(_casts([v for _, v, _ in operands], result), result, pending)
    # the products: exactly one pending factor, the others invariant over its axes
    factors = values if kind != "div" else values[:1]
    pending_factors = [i for i, _, u in factors if u]
    if kind == "div" and (not values or not values[0][2] or any(u for _, _, u in values[1:])):
        raise VmaError(f"`{op}` divides by a value unreduced over {axes_text}: the reciprocal of a sum is not the "
                       f"sum of reciprocals; {_fix(pending)}; {where}")
    if len(pending_factors) > 1 or any(u for _, _, u in values[1:] if kind == "div"):
        raise VmaError(f"`{op}` multiplies two values unreduced over {axes_text}: the product of two pending sums is "
                       f"not the sum of the members' products; psum one of them over {axes_text} first; {where}")
    mine = values[0][2] if kind == "div" else next(u for _, _, u in factors if u)
    clash = [(i, v & mine) for i, v, u in values if not u and v & mine]
    if clash:
        raise VmaError(f"`{op}` multiplies a value unreduced over {tuple(sorted(mine))} by one that varies over "
                       f"{sorted(clash[0][1])}: each member's term would be scaled by a different factor, which is "
                       f"no product of the sum; {_fix(mine)}, or psum the other factor; {where}")
    result = _default_over([v for _, v, _ in operands])
    sums = tuple(mine if (role == "value" and not u) else frozenset()
                 for (_, _, u), role in zip(operands, roles, strict=True))
    return Rule(_casts([v for _, v, _ in operands], result), result, mine, sums)


def _typed(operands: Sequence[tuple[object, AxisTypes]]) -> str:
    parts = []
    for shape, t in operands:
        kind = f"_{t.unreduced_kind}" if t.unreduced and t.unreduced_kind != "sum" else ""
        text = " ".join(([f"V:{','.join(sorted(t.varying))}"] if t.varying else [])
                        + ([f"U{kind}:{','.join(sorted(t.unreduced))}"] if t.unreduced else [])
                        + ([f"R:{','.join(sorted(t.reduced))}"] if t.reduced else []))
        parts.append(f"{list(shape)}{{{text}}}")  # type: ignore[call-overload]
    return ", ".join(parts) or "none"


def special_op_rule(op: str, kind: str, operands: Sequence[tuple[object, AxisTypes]], roles: Sequence[str],
                    adds_number: bool = False, extremum: str = "") -> Rule:
    """The rule of an op with an operand that is unreduced (of any kind) or reduced.

    ``kind``: the op's linearity (:data:`LINEAR_KINDS`, "view" for a view or reshape, "" for
    nonlinear); ``extremum``: "max" or "min" for a reduction of that kind (``amax``, ``amin``).
    A pending max or min is kept by views, reshapes and reductions of its kind only; a reduced
    value by any op whose other value operands are reduced over the same axes or vary there (then
    it is cast to varying, no communication), and a product with a pending sum over those axes
    makes a pending sum. Everything else is a ``VmaError`` that names the op and the fix.
    """
    types = [t for _, t in operands]
    where = f"operands: {_typed(operands)}"
    pending = [t for t in types if t.unreduced]
    if any(t.unreduced_kind != "sum" for t in pending):
        return _kind_op_rule(op, kind, operands, roles, extremum, where)
    reduced = frozenset().union(*(t.reduced for t in types))
    if pending:
        rule = unreduced_op_rule(op, "unary" if kind == "view" else kind,
                                 [(shape, t.varying, t.unreduced) for shape, t in operands], roles, adds_number)
        if not reduced:
            return rule
        kept = reduced - rule.unreduced - rule.result  # reduced axes that stay reduced: every value reduced there
        _check_reduced_alike(op, kept, types, roles, where)
        sums, relabels = [], []
        for t, role, summed in zip(types, roles, rule.sums or [frozenset()] * len(types), strict=True):
            sums.append(summed - t.reduced if role == "value" else summed)
            relabels.append(t.reduced & rule.result)
        return Rule(tuple(c - t.reduced for c, t in zip(rule.casts, types, strict=True)), rule.result,
                    rule.unreduced, tuple(sums), reduced=kept, relabels=tuple(relabels))
    varying = frozenset().union(*(t.varying for t in types))
    _check_reduced_alike(op, reduced - varying, types, roles, where)
    return Rule(tuple(varying - t.varying - t.reduced for t in types), varying, reduced=reduced - varying,
                relabels=tuple((varying - t.varying) & t.reduced for t in types))


def _check_reduced_alike(op: str, axes: frozenset[str], types: Sequence[AxisTypes], roles: Sequence[str],
                         where: str) -> None:
    """Every value operand is reduced over ``axes`` (a result reduced there), none merely invariant (JAX's rule)."""
    for a in sorted(axes):
        if any(role == "value" and a not in t.reduced for t, role in zip(types, roles, strict=True)):
            raise VmaError(f"`{op}` combines a value reduced over {a!r} (invariant, its gradient a pending sum) with "
                           f"one that is invariant there, whose gradient is no pending sum (implicit communication); "
                           f"cast it as well (fm.pcast(y, {a!r}, to='reduced')), or cast the reduced one to varying "
                           f"(fm.pcast(x, {a!r}, to='varying')); {where}")


def _kind_op_rule(op: str, kind: str, operands: Sequence[tuple[object, AxisTypes]], roles: Sequence[str],
                  extremum: str, where: str) -> Rule:
    """A pending max or min: kept by views, reshapes, ``cat`` and the reductions of its own kind."""
    types = [t for _, t in operands]
    pending = [t for t in types if t.unreduced]
    first = pending[0]
    if any((t.unreduced, t.unreduced_kind) != (first.unreduced, first.unreduced_kind) for t in pending):
        raise VmaError(f"`{op}` combines values pending different reductions or over different axes; end each "
                       f"first ({_ENDS[first.unreduced_kind]}(x, {_name(first.unreduced)})); {where}")
    k, axes = first.unreduced_kind, first.unreduced
    values = [t for t, role in zip(types, roles, strict=True) if role == "value"]
    if extremum and extremum != k:
        raise VmaError(f"`{op}` is a {extremum} reduction, but got a value unreduced over {tuple(sorted(axes))} of kind "
                       f"{k!r} (a pending {k}: the {extremum} of the members' terms is no {extremum} of their {k}); "
                       f"end it with {_ENDS[k]}(x, {_name(axes)}) first; {where}")
    if extremum or kind == "cat":
        if any(not t.unreduced for t in values):
            raise VmaError(f"`{op}` combines a value pending a {k} over {tuple(sorted(axes))} with one that is not; "
                           f"end it with {_ENDS[k]}(x, {_name(axes)}) first; {where}")
    elif kind != "view":
        raise VmaError(f"`{op}` requires a pending sum (unreduced_kind 'sum') or no pending value, but got one unreduced "
                       f"over {tuple(sorted(axes))} of kind {k!r} (a pending {k}): only views, reshapes and {k} "
                       f"reductions (torch.a{k}) keep it; end it with {_ENDS[k]}(x, {_name(axes)}) first; {where}")
    if any(t.unreduced for t, role in zip(types, roles, strict=True) if role == "other"):
        raise VmaError(f"`{op}` uses a value pending a {k} as an index, shape or mask; end it with "
                       f"{_ENDS[k]}(x, {_name(axes)}) first; {where}")
    varying = frozenset().union(*(t.varying for t in types))
    reduced = frozenset().union(*(t.reduced for t in types)) - varying
    _check_reduced_alike(op, reduced, types, roles, where)
    return Rule(tuple(varying - t.varying - t.reduced for t in types), varying, axes, reduced=reduced, kind=k,
                relabels=tuple((varying - t.varying) & t.reduced for t in types))


def _default_over(varying: Sequence[frozenset[str]]) -> frozenset[str]:
    return frozenset().union(*varying)


# -- the collectives' rules: one type value in, one Rule out -------------------------------------------------
#
# Every collective's record (``_collectives``) holds one of these in its ``rule`` slot, with one signature,
# :data:`CollectiveRule`: ``(api, types, axes, params) -> Rule``, as JAX's ``collective_vma_rule`` reads one
# aval. ``types`` is the operand's :class:`AxisTypes` (varying and unreduced axes; :data:`INVARIANT` for a
# collective without an operand), ``axes`` the call's axes, ``params`` its checked parameters. A rule that does
# not keep a pending sum refuses one (:func:`unreduced_collective_error`): it would move or compare the terms.

CollectiveRule = Callable[[str, AxisTypes, frozenset[str], Mapping[str, Any]], Rule]

_NO_PARAMS: Mapping[str, Any] = MappingProxyType({})


def unreduced_collective_error(api: str, unreduced: frozenset[str], axes: frozenset[str]) -> VmaError:
    """A collective that moves members' values (gather, exchange, permute, ...) of a pending sum."""
    names = tuple(sorted(unreduced))
    return VmaError(f"`{api}` over {tuple(sorted(axes))} requires a value that is not unreduced, but got one unreduced "
                    f"over {names} (a pending sum: `{api}` would move or compare its terms, not the sum); reduce "
                    f"first: {_fix(unreduced)}")


def _name(axes: frozenset[str]) -> str:
    names = tuple(sorted(axes))
    return repr(names[0]) if len(names) == 1 else repr(names)


_ENDS = {"sum": "fm.psum", "max": "fm.pmax", "min": "fm.pmin"}


def kind_error(api: str, wanted: str, types: AxisTypes) -> VmaError:
    """An op or collective that needs a pending reduction of kind ``wanted`` got another kind."""
    got = types.unreduced_kind
    return VmaError(f"`{api}` requires a value whose pending reduction is of kind {wanted!r}, but got one unreduced "
                    f"over {tuple(sorted(types.unreduced))} of kind {got!r} (a pending {got}); end it with "
                    f"{_ENDS[got]}(x, {_name(types.unreduced)}) first")


def _refuse_reduced(api: str, types: AxisTypes, axes: frozenset[str]) -> None:
    """A collective over an axis the value is reduced over (JAX: "cannot accept args which are reduced")."""
    both = types.reduced & axes
    if both:
        raise VmaError(f"`{api}` over {tuple(sorted(axes))} requires a value that is not reduced over these axes, but "
                       f"got one reduced over {sorted(both)} (invariant, its gradient a pending sum); cast it with "
                       f"fm.pcast(x, {_name(both)}, to='varying') first")


def _refuse_pending(api: str, types: AxisTypes, axes: frozenset[str]) -> None:
    if types.unreduced:
        raise unreduced_collective_error(api, types.unreduced, axes)
    _refuse_reduced(api, types, axes)


def _check_sum_kind(api: str, types: AxisTypes) -> None:
    """A value pending a max or a min passes no collective but the one that ends it (JAX's rule)."""
    if types.unreduced and types.unreduced_kind != "sum":
        raise kind_error(api, "sum", types)


def _check_not_mixed(api: str, operand: frozenset[str], axes: frozenset[str]) -> None:
    """A reduction over several axes needs an operand that varies over all of them or over none (JAX)."""
    varying, invariant = operand & axes, axes - operand
    if varying and invariant:
        raise VmaError(
            f"`{api}` over {tuple(sorted(axes))} requires a value that varies over all of these axes or over none, "
            f"but got one that varies over {sorted(varying)} and not over {sorted(invariant)}; reduce over "
            f"{tuple(sorted(varying))} alone, or fm.pcast(x, {tuple(sorted(invariant))!r}, to='varying') first")


def _check_one_state(api: str, varying: frozenset[str], unreduced: frozenset[str], axes: frozenset[str]) -> None:
    """A reduction over several axes needs them all in one state: all unreduced, all varying, or all
    invariant (JAX 0.10: one of varying, unreduced, reduced or invariant)."""
    pending, other = axes & unreduced, axes - unreduced
    if pending and other:
        raise VmaError(
            f"`{api}` over {tuple(sorted(axes))} requires a value in one state over all of these axes (all "
            f"unreduced, all varying or all invariant), but got one unreduced over {sorted(pending)} and not over "
            f"{sorted(other)} (its varying axes: {set_repr(varying)}); reduce over {tuple(sorted(pending))} first, "
            f"then over {tuple(sorted(other))}")
    _check_not_mixed(api, varying | pending, axes)


def _ends(api: str, kind: str, types: AxisTypes, axes: frozenset[str], scatter: bool = False) -> Rule:
    """``psum`` (kind sum), ``pmax``/``pmin`` (max/min) over ``axes``: invariant over them (varying with
    ``scatter``); a pending reduction of ``kind`` over the axes ends there."""
    varying, unreduced = types.varying, types.unreduced
    if unreduced & axes and types.unreduced_kind != kind:
        raise kind_error(api, kind, types)
    if kind == "sum":
        _check_sum_kind(api, types)
    _refuse_reduced(api, types, axes)
    _check_one_state(api, varying, unreduced, axes)
    done = varying | (unreduced & axes)
    left = unreduced - axes
    return Rule((axes - done,), varying | axes if scatter else varying - axes, left, reduced=types.reduced,
                kind=types.unreduced_kind if left else "sum")


def psum_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any] = _NO_PARAMS) -> Rule:
    """``psum``/``pmean`` over ``axes``: invariant over them; an invariant operand is cast first (``n * x``).

    A pending sum over the axes ends there (invariant); over other axes it stays pending. Over a
    tuple the axes must be in one state (all varying, all unreduced or all invariant): an operand
    that varies over some of them and not the others is a ``VmaError``, as in JAX. A pending max or
    min, or a value reduced over the axes, is refused.
    """
    return _ends(api, "sum", types, axes)


def pmax_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any] = _NO_PARAMS) -> Rule:
    """``pmax``/``pmin``: typed as ``psum`` (invariant over ``axes``); a pending max (``pmax``) or min
    (``pmin``) over the axes ends there, and any other pending value is refused: the largest of the
    members' terms is not the largest value of their sum."""
    kind = api[1:]  # "max" or "min"
    if types.unreduced and types.unreduced_kind == "sum":
        names = tuple(sorted(types.unreduced))
        raise VmaError(f"`{api}` over {tuple(sorted(axes))} requires a value that is not unreduced (valid: varying or "
                       f"invariant over every axis), but got one unreduced over {names} (a pending sum: `{api}` "
                       f"would compare the members' terms, which is no {kind} of their sum); reduce first: "
                       f"{_fix(types.unreduced)}, then `{api}`")
    if types.unreduced and not types.unreduced & axes:
        raise VmaError(f"`{api}` over {tuple(sorted(axes))} requires a value pending a {kind} over these axes or not "
                       f"pending at all, but got one unreduced over {tuple(sorted(types.unreduced))} (kind "
                       f"{types.unreduced_kind!r}); end it with {_ENDS[types.unreduced_kind]}(x, "
                       f"{_name(types.unreduced)}) first")
    return _ends(api, kind, types, axes)


def psum_scatter_rule(api: str, types: AxisTypes, axes: frozenset[str],
                      params: Mapping[str, Any] = _NO_PARAMS) -> Rule:
    """``psum_scatter`` over ``axes``: each member's block of the sum, varying over them; a pending sum
    over the axes ends there; mixed operands are an error (one state over a tuple, as :func:`psum_rule`)."""
    return _ends(api, "sum", types, axes, scatter=True)


def pvary_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any] = _NO_PARAMS) -> Rule:
    """``pvary``/``pcast(to="varying")``: the operand must be invariant over ``axes``; the result varies.

    A value pending over other axes stays pending; over the call's own axes it is an error.
    """
    varying, unreduced = types.varying, types.unreduced
    if unreduced & axes:
        raise unreduced_collective_error(api, unreduced & axes, axes)
    _check_sum_kind(api, types)
    _refuse_reduced(api, types, axes)
    already = varying & axes
    if already:
        raise VmaError(
            f"`{api}` requires a value invariant over the axes it casts to varying, but got a value that "
            f"already varies over {sorted(already)} (its axes: {set_repr(varying)}); drop those axes from the call")
    return Rule((frozenset(),), varying | axes, unreduced, reduced=types.reduced, kind=types.unreduced_kind)


def _unreduced_cast_rule(api: str, types: AxisTypes, axes: frozenset[str]) -> Rule:
    """``pcast(x, axes, to="unreduced")``: a value varying over ``axes`` becomes a pending sum over them.

    From invariant it is an error, as in JAX: every member holds the whole value, so the sum of
    the members' would be ``n`` times it.
    """
    varying, unreduced = types.varying, types.unreduced
    _check_sum_kind(api, types)
    already = axes & unreduced
    if already:
        raise VmaError(f"`{api}` requires a value varying over the axes it casts to unreduced, but got one already "
                       f"unreduced over {sorted(already)}; drop those axes from the call")
    invariant = axes - varying
    if invariant:
        raise VmaError(f"`{api}` requires a value varying over the axes it casts to unreduced, but got one invariant "
                       f"over {sorted(invariant)}: every member holds the whole value, so the sum of the members' "
                       f"would be n times it (n: the size of {tuple(sorted(invariant))}); cast it to varying first (fm.pcast(x, {tuple(sorted(invariant))!r}, to='varying')) "
                       f"if that sum is meant, or divide by fm.axis_size first")
    return Rule((frozenset(),), varying - axes, unreduced | axes, reduced=types.reduced)


def _reduced_cast_rule(api: str, types: AxisTypes, axes: frozenset[str]) -> Rule:
    """``pcast(x, axes, to="reduced")``: a value invariant over ``axes`` becomes reduced over them (JAX's
    ``preduced``): the same value, whose gradient is a pending sum there; backward sums it (``psum``)."""
    bad = [(what, axes & got) for what, got in (("varies", types.varying), ("is unreduced", types.unreduced),
                                                ("is already reduced", types.reduced)) if axes & got]
    if bad:
        what, where = bad[0]
        fix = ("drop those axes from the call" if what == "is already reduced" else
               f"make it invariant first ({_fix(where)})" if what == "is unreduced" else
               "make it invariant first (fm.psum, or fm.all_gather(x, axis, to='invariant'))")
        raise VmaError(f"`{api}` requires a value invariant over the axes it casts to reduced, but got one that {what} "
                       f"over {sorted(where)}; {fix}")
    _check_sum_kind(api, types)
    return Rule((frozenset(),), types.varying, types.unreduced, reduced=types.reduced | axes,
                kind=types.unreduced_kind)


def pcast_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any]) -> Rule:
    """``pcast(x, axes, to=...)``: ``to="varying"`` as :func:`pvary_rule` (of a value reduced over all of
    ``axes``: a relabel, no communication either way); ``to="unreduced"``: a pending sum over ``axes`` of
    a value varying over them; ``to="reduced"``: :func:`_reduced_cast_rule`."""
    to = params["to"]
    if to == "varying":
        if axes & types.reduced:
            if axes - types.reduced:
                raise VmaError(f"`{api}` over {tuple(sorted(axes))} requires a value in one state over these axes, but "
                               f"got one reduced over {sorted(axes & types.reduced)} and not over "
                               f"{sorted(axes - types.reduced)}; cast over each group of axes apart")
            _check_sum_kind(api, types)
            return Rule((frozenset(),), types.varying | axes, types.unreduced, reduced=types.reduced - axes,
                        kind=types.unreduced_kind, params={"to": "relabel"})
        return pvary_rule(api, types, axes)
    if to == "reduced":
        return _reduced_cast_rule(api, types, axes)
    if types.reduced & axes:
        raise VmaError(f"`{api}` requires a value varying over the axes it casts to unreduced, but got one reduced over "
                       f"{sorted(types.reduced & axes)}; cast it to varying first (fm.pcast(x, "
                       f"{_name(types.reduced & axes)}, to='varying'))")
    return _unreduced_cast_rule(api, types, axes)


def spread_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any] = _NO_PARAMS) -> Rule:
    """``all_to_all``, ``ragged_all_to_all``, ``ppermute``: the result varies over ``axes``.

    An operand invariant over some of ``axes`` is cast first, as JAX does; a pending sum is refused.
    """
    _refuse_pending(api, types, axes)
    return Rule((axes - types.varying,), types.varying | axes, reduced=types.reduced)


def gather_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any]) -> Rule:
    """``all_gather``: ``to="varying"`` as :func:`spread_rule`; ``to="invariant"``: every member gets the
    same value, invariant over ``axes``.

    The operand is cast to vary over ``axes`` first either way: gathering copies of an invariant block
    is legal, and the invariant form's backward (this rank's slice of the cotangent) then sums over
    the copies. A pending sum is refused.
    """
    _refuse_pending(api, types, axes)
    varying = types.varying
    return Rule((axes - varying,), varying - axes if params["to"] == "invariant" else varying | axes,
                reduced=types.reduced)


def axis_index_rule(api: str, types: AxisTypes, axes: frozenset[str], params: Mapping[str, Any] = _NO_PARAMS
                    ) -> Rule:
    """``axis_index``: a value that varies over exactly its axes (no operand)."""
    return Rule((), axes)


def unreduced_out_specs_error(failures: Sequence[tuple[str, frozenset[str], frozenset[str], frozenset[str], str]]
                            ) -> VmaError:
    """Results whose pending sums differ from what their out_specs say: ``(path, varying, unreduced,
    unreduced in the spec, spec)`` per result."""
    lines = []
    for path, _, unreduced, named, spec in failures:
        extra, missing = sorted(unreduced - named), sorted(named - unreduced)
        if extra:
            lines.append(f"  {path}: unreduced over {extra} (a pending sum), but its out_spec {spec} does not say so; "
                         f"{_fix(frozenset(extra))}, or name {extra} in P(..., unreduced=...)")
        if missing:
            lines.append(f"  {path}: invariant over {missing}, but its out_spec {spec} says unreduced over them (a "
                         f"pending sum, whose terms add up to the value); an invariant value is no such sum: "
                         f"return it replicated (drop {missing} from unreduced=)")
    return VmaError("`shard_map` requires each result to be unreduced over exactly the axes its out_spec names in "
                    f"unreduced=, but {len(failures)} result{'s' if len(failures) != 1 else ''} differ"
                    f"{'' if len(failures) != 1 else 's'}:\n" + "\n".join(lines))


def _shapes(shapes: Sequence[object]) -> str:
    return f" (operand shapes {list(shapes)})" if shapes else ""


def op_error(op: str, operands: Sequence[tuple[Sequence[int], frozenset[str]]], why: str) -> VmaError:
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
