"""The interpreter of a typed ``shard_map`` region: a ``TorchFunctionMode`` that types every torch op.

For each op: the tables' rule (``_op_rules``, ``_collectives``; ``_vma``'s default otherwise), the
casts it asks for (:meth:`_region.Region.cast`), the op, the result's type; it never names an op or
a collective. One scan of the operands (:func:`_operand_types`) serves the common op; every other
takes :meth:`TypedMode._typed` (docs/design.md, "Type rules" and "Eager cost").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import _collectives as C
from . import _torch, _vma
from ._op_rules import BIAS, OpKind, is_random, op_kind, written_operand
from ._region import NOTHING, TAG, Region

__all__ = ["TypedMode"]

# The rules' answers, one cache: a rule depends on types only (shapes are for messages). The default
# rule's answer is keyed by the operands' types (a tuple of frozensets: the binary op's fast path looks it up
# without a call); an op with a pending-sum operand by (op, linear kind, varying types, unreduced types, roles,
# adds a number), a tuple that starts with a str, so the two kinds of keys never meet.
_RULES: dict[tuple[Any, ...], _vma.Rule] = {}


def _default_rule(operands: list[frozenset[str]]) -> _vma.Rule:
    key = tuple(operands)
    rule = _RULES.get(key)
    if rule is None:
        rule = _RULES[key] = _vma.default_rule(operands)
    return rule


class TypedMode(TorchFunctionMode):
    """Types every torch op of one region: the table's exception or the default rule, casts first.

    The common op whose tensor operands all have one type costs one table lookup and one type read
    per operand: its result has that type and nothing is cast. The same op with operands of several
    types (an invariant weight into a varying activation) adds the default rule's cached answer and
    each cast's cached tensor (:meth:`_region.Region.cast`): no pytree, no rule computed again.
    """

    def __init__(self, region: Region) -> None:
        super().__init__()
        self.region = region
        self.plain: dict[Any, bool] = {}  # eagerly: function -> whether the default rule types it (one lookup)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        region = self.region
        if not (region.traced or region.partial):  # (a partial-manual region's DTensors: the general path)
            plain = self.plain.get(func)
            if plain is None:
                kind = op_kind(func)
                plain = self.plain[func] = kind.role == "op" and not kind.random and not kind.writes_first
            if plain:
                if (len(args) == 2 and not kwargs and region.unreduced is None and isinstance(args[0], torch.Tensor)
                        and isinstance(args[1], torch.Tensor)):
                    a, b = args  # a binary op: its operands' types without a loop, a cast where they differ
                    ta, tb = getattr(a, TAG, None), getattr(b, TAG, None)
                    ta = ta.axes if ta is not None and ta.region is region else NOTHING
                    tb = tb.axes if tb is not None and tb.region is region else NOTHING
                    if ta is tb or ta == tb:
                        same = ta
                    else:
                        rule = _RULES.get((ta, tb)) or _default_rule([ta, tb])
                        ca, cb = rule.casts
                        args, same = (region.cast(a, ca) if ca else a, region.cast(b, cb) if cb else b), rule.result
                else:
                    same = _operand_types(region, args, kwargs)
                    if same is None:  # a container, a write or a pending sum: the general path
                        return self._typed(func, op_kind(func), args, kwargs or {})
                    if same.__class__ is list:  # operands of several types: each cast up to their join
                        rule = _default_rule(same)
                        args, kwargs = _cast_operands(region, args, kwargs, rule.casts)
                        same = rule.result
                out = func(*args, **kwargs) if kwargs else func(*args)
                if same:
                    if isinstance(out, torch.Tensor):  # an op's result: a tensor (the instance dict: see record)
                        out.__dict__[TAG] = region.tags.get(same) or region.tag_for(same)
                    else:
                        region.record(out, same)
                return out
        kind = op_kind(func)  # a constant of the trace under torch.compile
        if kind.role == "pass":  # metadata and queries: x.shape, x.size(), x.item(), ...
            return func(*args, **kwargs) if kwargs else func(*args)
        return self._typed(func, kind, args, kwargs or {})

    def _typed(self, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
        """The general path: any arguments, any op of the table."""
        region = self.region
        region.check_trace(kind.name)
        if region.traced and region.casts and written_operand(func, args, kwargs) is not None:
            region.retire_casts()  # a write, maybe into an alias of a cast tensor: cast anew (see Region.cast)
        if kind.role == "pass":
            return func(*args, **kwargs)
        if kind.role == "collective":
            rec = C.COLLECTIVES[func]
            mesh = kwargs.pop("mesh", None)
            x, axis = args if rec.operand else (None, args[0])
            return region.collective(rec, x, axis, mesh, kwargs)
        if kind.role == "raw collective":
            raise _vma.VmaError(
                f"`{kind.name}` (torch.distributed) writes a result whose type a typed shard_map region cannot "
                f"know: it would leave a tensor typed invariant while its values differ across ranks; use "
                f"{C.RAW[func]} by axis name instead, or run this region with check_vma=False")
        # (in a partial-manual region, torch's DTensor communicates over the other axes with c10d's functional
        # ops: their results vary as their operands do over the manual axes, the default rule)
        flat, tree = _operands(args, kwargs)
        positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        if kind.role == "untypeable" and not (region.partial and kind.name.startswith("_c10d_functional::")):
            raise _vma.op_error(kind.name, [(tuple(flat[i].shape), region.type_of(flat[i])) for i in positions],
                                "a custom op's result need not follow its inputs' types; run this region "
                                "with check_vma=False")
        if region.unreduced is not None:  # one scan: the whole types (a pending or reduced operand: its own path)
            full = [region.types_of(flat[i]) for i in positions]
            for t in full:
                if t.unreduced or t.reduced:
                    return self._unreduced_op(func, kind, args, kwargs, flat, tree, positions, full)
            operands = [t.varying for t in full]
        else:
            operands = [region.type_of(flat[i]) for i in positions]
        if kind.random and is_random(func, args, kwargs):
            region.drew_random()
            rule = _vma.random_rule(operands, region.axes)
        else:
            rule = _default_rule(operands)
        written = written_operand(func, args, kwargs)
        if written is not None:
            _vma.check_write(kind.name, region.type_of(written), rule.result,
                             [tuple(flat[i].shape) for i in positions])
        if any(rule.casts):
            for i, cast in zip(positions, rule.casts, strict=True):
                if cast and flat[i] is not written:
                    flat[i] = region.cast(flat[i], cast)
            args, kwargs = _torch.pytree.tree_unflatten(flat, tree) if tree is not None else (tuple(flat), kwargs)
        out = func(*args, **kwargs)
        region.record(out, rule.result if written is None else region.type_of(written))
        return out

    def _unreduced_op(self, func: Any, kind: OpKind, args: tuple, kwargs: dict, flat: list[Any], tree: Any,
                      positions: list[int], full: list[_vma.AxisTypes]) -> Any:
        """An op with an operand unreduced over some axes (a pending reduction) or reduced: the linear ops
        keep a pending sum, views and reductions of their kind a pending max or min, and the rule says
        what a reduced operand allows (``_vma.special_op_rule``); every other op is a ``VmaError``. An
        operand multiplied into the pending sum gets a cast whose backward sums its gradient over the
        sum's axes; a reduced operand meeting a varying one is relabelled varying (no communication)."""
        region = self.region
        linear = kind.linear
        values = _value_operands(linear, args, kwargs)
        if linear == "div" and not (args and isinstance(args[0], torch.Tensor)):
            linear = ""  # a number divided by a pending sum
        roles = ["value" if linear == "factors" or any(flat[i] is v for v in values) else "other" for i in positions]
        adds_number = linear == "add" and any(not isinstance(v, torch.Tensor) for v in values)
        pending = [t.unreduced for t in full]
        if linear == "factors" and func in BIAS and any(pending):  # F.linear(x, w, b): a bias is added to every term
            bias = args[BIAS[func]] if len(args) > BIAS[func] else kwargs.get("bias")
            if bias is not None:
                axes = tuple(sorted(frozenset().union(*pending)))
                raise _vma.VmaError(
                    f"`{kind.name}` with a bias cannot take a value unreduced over {axes}: every member would add "
                    f"the bias to its term, so the sum would hold it once per member; call it without the bias, "
                    f"then psum over {axes} and add the bias (or add it after a psum_scatter)")
        extremum = kind.extremum
        if extremum and kind.name in ("max", "min", "Tensor.max", "Tensor.min") and (
                (len(args) > 1 and not isinstance(args[1], torch.Tensor)) or "dim" in kwargs):
            extremum = ""  # torch.max(x, dim) also returns indices: refused (torch.amax keeps the kind)
        if kind.random and is_random(func, args, kwargs):
            raise _vma.VmaError(f"`{kind.name}` draws random numbers, which vary over every mesh axis, from a value "
                                f"that is reduced or unreduced: cast it to varying first (fm.pcast(x, axis, "
                                f"to='varying')), or psum it")
        # eagerly the types themselves (interned, their hash kept); dynamo hashes their fields only
        types = tuple((t.varying, t.unreduced, t.reduced, t.unreduced_kind) for t in full) if region.traced else \
            tuple(full)
        key = (kind.name, linear, types, tuple(roles), adds_number, extremum)
        rule = _RULES.get(key)
        if rule is None:
            rule = _RULES[key] = _vma.special_op_rule(
                kind.name, linear, [(tuple(flat[i].shape), t) for i, t in zip(positions, full, strict=True)],
                roles, adds_number, extremum)
        written = written_operand(func, args, kwargs)
        if written is not None:
            _vma.check_write(kind.name, region.type_of(written), rule.result,
                             [tuple(flat[i].shape) for i in positions])
            have = region.types_of(written)
            if (have.unreduced, have.reduced) != (rule.unreduced, rule.reduced):
                raise _vma.VmaError(
                    f"`{kind.name}` writes in place into a tensor unreduced over {tuple(sorted(have.unreduced))} and "
                    f"reduced over {tuple(sorted(have.reduced))}, but the value it writes is unreduced over "
                    f"{tuple(sorted(rule.unreduced))} and reduced over {tuple(sorted(rule.reduced))}; write "
                    f"`x = x * y` (out of place) instead")
        changed = False
        for k, i in enumerate(positions):
            if flat[i] is written:
                continue
            if rule.relabels and rule.relabels[k]:
                flat[i], changed = region.relabel(flat[i], rule.relabels[k]), True
            if rule.casts[k]:
                flat[i], changed = region.cast(flat[i], rule.casts[k]), True
            if rule.sums and rule.sums[k]:  # its gradient is one term of the pending sum: sum it
                flat[i], changed = region.pvary(flat[i], tuple(sorted(rule.sums[k]))), True
        if changed:
            args, kwargs = _torch.pytree.tree_unflatten(flat, tree) if tree is not None else (tuple(flat), kwargs)
        out = func(*args, **kwargs)
        if written is None:
            region.record(out, rule.result, rule.unreduced, rule.reduced, rule.kind)
        return out


_OPERANDS = (torch.Tensor, list, tuple, dict)  # what makes an argument more than a scalar to the scan
_CONTAINERS = (list, tuple, dict)


def _operand_types(region: Region, args: tuple, kwargs: dict | None) -> frozenset[str] | list[frozenset[str]] | None:
    """The one scan of a flat call's arguments (eagerly): the one type of its tensor operands
    (``NOTHING`` with none), or, when they differ, each operand's type in order (the positional ones,
    then the keyword ones: :func:`_cast_operands` casts in that order).

    ``None`` sends the call to the general path: an argument that is a container of anything but ints
    (a shape or dims stays here), a dict, a call that writes (``out=``, ``inplace=True``), or an operand
    that is a pending sum. A pending sum inside a container is not looked for: the container alone sends
    the call to the general path, which finds it. Operands of one type, the common call, cost one type
    read each and nothing else; from the first that differs on, each type is collected.
    """
    if kwargs:
        for k, v in kwargs.items():  # scalar keywords (dim=-1, eps=1e-5) need no more than this look
            if isinstance(v, _OPERANDS) or k == "out" or k == "inplace":
                if kwargs.get("out") is not None or kwargs.get("inplace"):
                    return None
                args = (*args, *kwargs.values())
                break
    same = types = None
    for a in args:
        if isinstance(a, torch.Tensor):
            tag = getattr(a, TAG, None)
            if tag is not None and tag.region is region:
                if tag.unreduced or tag.reduced:
                    return None
                t = tag.axes
            else:
                t = NOTHING
            if same is None:
                same = t
            elif t is not same and t != same:
                if types is None:  # the first that differs: every operand before it has the one type
                    k = 0
                    for b in args:
                        if b is a:
                            break
                        if isinstance(b, torch.Tensor):
                            k += 1
                    types = same = [same] * k  # a list, which no type equals: each type after it is collected
                types.append(t)
        elif isinstance(a, _CONTAINERS):
            if isinstance(a, dict):
                return None
            for e in a:
                if not isinstance(e, int):
                    return None
    return NOTHING if same is None else same


def _cast_operands(region: Region, args: tuple, kwargs: dict | None, casts: tuple[frozenset[str], ...]
                   ) -> tuple[tuple, dict | None]:
    """``args`` and ``kwargs`` with each tensor operand cast (:meth:`_region.Region.cast`) as ``casts``
    says, in :func:`_operand_types`'s order."""
    i, cast_args = 0, []
    for a in args:
        if isinstance(a, torch.Tensor):
            if casts[i]:
                a = region.cast(a, casts[i])
            i += 1
        cast_args.append(a)
    if i < len(casts) and kwargs:  # tensor operands by keyword
        cast_kwargs = {}
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                if casts[i]:
                    v = region.cast(v, casts[i])
                i += 1
            cast_kwargs[k] = v
        kwargs = cast_kwargs
    return tuple(cast_args), kwargs


def _value_operands(linear: str, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments a linear op adds, multiplies or keeps (see ``_vma.LINEAR_KINDS``); its other
    tensor arguments are indices, shapes or masks."""
    if linear in ("add", "mul", "div"):
        second = args[1] if len(args) > 1 else kwargs.get("other")
        return [args[0], second] if args else []
    if linear == "cat":
        return list(args[0]) if args and isinstance(args[0], (list, tuple)) else list(kwargs.get("tensors", ()))
    if linear in ("unary", "view"):
        return list(args[:1])
    return [a for a in args if isinstance(a, torch.Tensor)]  # factors: every tensor


def _operands(args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    """Every argument of an op, flat, and the tree to rebuild them (``None``: ``args`` as they are).

    Most ops take tensors and scalars only, positionally: they skip the pytree machinery.
    """
    if not any(isinstance(a, (list, tuple, dict)) for a in args) and not any(
            isinstance(v, (torch.Tensor, list, tuple, dict)) for v in kwargs.values()):
        return list(args), None
    return _torch.pytree.tree_flatten((args, kwargs))
