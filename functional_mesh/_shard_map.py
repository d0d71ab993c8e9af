"""``shard_map``: a function written for one shard, mapped over a realized mesh, typed by axis name.

Three parts, kept apart (docs/design.md, "Type rules"): the *rules* are pure functions of types
(``_vma``); the *tables* say which torch functions are exceptions to the default rule
(``_op_rules``) and hold every collective as one record with its own rule (``_collectives``);
the *interpreter* here is a ``TorchFunctionMode`` that asks the tables, inserts the implicit
casts (``pvary``: identity forward, ``psum`` backward) before an op runs, runs it, and records
the result's type. It never names a particular op or collective.

What a region costs eagerly: a typed one, one table lookup and one attribute read per operand
for the common op (operands of one type, nothing written, nothing drawn), whose answer needs no
rule at all; other ops take the general path, with the default rule's answers cached per operand
types. An untyped region installs no mode: its ops are plain torch, and only the collectives ask
for the open region (JAX's untyped gradient convention).

The region's boundary:

- in: a DTensor whose sharding is the spec gives its local tensor; a plain tensor is the full
  value, sliced here without communication (its gradient is gathered back to the full shape);
- out: every result must be invariant over the axes its out_spec does not name (else one
  ``VmaError`` listing every failing result, with the fix for each); a result invariant over a
  named axis is cast to vary (backward ``psum``); each becomes a DTensor on ``rm.device_mesh``.

Eagerly a tensor's type is an attribute naming the region, removed from every tensor the
boundary hands in or out, so none leaks. Under torch.compile the whole region is traced: the
types (a dict of traced tensors), the table's answers and the boundary's plans are decided while
tracing, and the compiled code holds the ops, casts and collectives only.
``check_vma=False`` tracks nothing and uses JAX's untyped gradient convention instead.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from . import _collectives as C
from . import _steps as S
from . import _torch, _vma
from ._errors import MeshError, UnknownAxisError, requires
from ._handle import RealizedMesh, recall, remember, resolve_mesh, selected_from
from ._interop import sharding_of
from ._layout import row_major_strides
from ._mesh import axes_size
from ._op_rules import BIAS, is_random, op_kind, written_operand
from ._pending import Pending, raise_while_tracing
from ._sharding import NamedSharding, PartitionSpec

__all__ = ["shard_map", "typeof"]

_NOTHING: frozenset[str] = frozenset()

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


_TAG = "_functional_mesh_vma"  # the attribute that holds a tensor's type inside an eager typed region
_CAST = "_functional_mesh_cast"  # the attribute that holds a tensor's implicit casts inside an eager typed region


class _Tag:
    """A tensor's type in one eager region: valid only while ``region`` is the region that set it.

    ``axes``: the axes it varies over; ``unreduced``: those it is a pending sum over (most often none).
    """

    __slots__ = ("region", "axes", "unreduced")

    def __init__(self, region: _Region, axes: frozenset[str], unreduced: frozenset[str] = _NOTHING) -> None:
        self.region, self.axes, self.unreduced = region, axes, unreduced


class _Casts:
    """A tensor's implicit casts in one eager region (:meth:`_Region.cast`): per axes, the tensor's
    ``_version`` when it was cast and the cast; valid while ``region`` is the region and ``tag`` the
    tensor's type."""

    __slots__ = ("region", "tag", "by_axes")

    def __init__(self, region: _Region, tag: _Tag | None) -> None:
        self.region, self.tag = region, tag
        self.by_axes: dict[frozenset[str], tuple[int, torch.Tensor]] = {}


class _Region:
    """One call of a mapped function: its realized mesh, whether it is typed, and the types.

    Eagerly a tensor's type is an attribute of the tensor (a :class:`_Tag` naming this region): one
    attribute read per operand is the cheapest lookup there is, a tensor the region never typed
    (made outside, or by an earlier region) reads as invariant, and the boundary removes the tags
    from every tensor it hands in or out, so none is seen outside. Under torch.compile the types
    are a plain dict of the traced tensors, which dynamo tracks: they are decided while tracing
    and are no part of the compiled code.
    """

    __slots__ = ("rm", "check_vma", "axes", "traced", "trace", "types", "tags", "sources", "random", "entered",
                 "casts", "unreduced", "waiting")

    def __init__(self, rm: RealizedMesh, check_vma: bool) -> None:
        self.rm = rm
        self.check_vma = check_vma
        self.axes = frozenset(rm.mesh.axis_names)
        self.traced = torch.compiler.is_compiling()
        self.trace = _trace_id() if self.traced else 0  # the trace the types belong to
        self.types: dict[Any, frozenset[str]] = {}  # under torch.compile: traced tensor -> axes
        # None until a value of the region is a pending sum (unreduced over some axes): until then no op
        # asks; then under torch.compile traced tensor -> its unreduced axes (eagerly empty: tags hold them)
        self.unreduced: dict[Any, frozenset[str]] | None = None
        self.tags: dict[Any, _Tag] = {}  # eagerly: one tag per type (varying axes; (varying, unreduced) pairs)
        # results of all_gather(to="varying") -> (api, axes, params), made on the first one: an out_specs
        # error that such a result causes says to gather to="invariant" (_made_by)
        self.sources: Any = None
        self.random = False  # whether a random op ran (the out_specs error then says why values vary)
        self.entered: list[torch.Tensor] = []  # tensors typed at the boundary (their tags go at exit)
        self.waiting: list[Pending] = []  # results issued here with async_op=True: waited for by the exit?
        # the implicit casts made (cast): under torch.compile traced tensor -> {axes: cast}; eagerly
        # they are an attribute of the tensor (a _Casts) and this lists the tensors that hold one (weakly: a
        # cast must not keep a tensor alive), whose attributes go at exit
        self.casts: Any = {} if self.traced else []

    def type_of(self, t: torch.Tensor) -> frozenset[str]:
        """The axes ``t`` varies over; a tensor the region never saw (created outside) is invariant."""
        if self.traced:
            return self.types.get(t, _NOTHING)
        tag = getattr(t, _TAG, None)
        return tag.axes if tag is not None and tag.region is self else _NOTHING

    def unreduced_of(self, t: torch.Tensor) -> frozenset[str]:
        """The axes ``t`` is a pending sum over (none for a tensor the region never saw)."""
        if self.unreduced is None:
            return _NOTHING
        if self.traced:
            return self.unreduced.get(t, _NOTHING)
        tag = getattr(t, _TAG, None)
        return tag.unreduced if tag is not None and tag.region is self else _NOTHING

    def record(self, out: Any, axes: frozenset[str], unreduced: frozenset[str] = _NOTHING) -> None:
        if out.__class__ is Pending:  # async_op=True: its tensor takes this type when waited for
            out.when_waited(self.record, axes, unreduced)
            return
        if unreduced or (self.unreduced is not None and self.traced):
            self._record_unreduced(out, axes, unreduced)
            return
        if isinstance(out, torch.Tensor):
            if self.traced:
                if axes:
                    self.types[out] = axes
                return
            # the instance dict directly: a tensor's setattr costs several times more
            if axes or getattr(out, _TAG, None) is not None:
                out.__dict__[_TAG] = self._tag(axes)
            return
        if isinstance(out, (tuple, list)):
            for o in out:
                self.record(o, axes)

    def _record_unreduced(self, out: Any, axes: frozenset[str], unreduced: frozenset[str]) -> None:
        if self.unreduced is None:
            self.unreduced = {}
        if isinstance(out, torch.Tensor):
            if self.traced:
                if axes:
                    self.types[out] = axes
                if unreduced:
                    self.unreduced[out] = unreduced
                else:
                    self.unreduced.pop(out, None)
                return
            key = (axes, unreduced)  # eagerly: one tag per type, beside the varying-only ones
            tag = self.tags.get(key)
            if tag is None:
                tag = self.tags[key] = _Tag(self, axes, unreduced)
            out.__dict__[_TAG] = tag
        elif isinstance(out, (tuple, list)):
            for o in out:
                self._record_unreduced(o, axes, unreduced)

    def issued(self, pending: Pending) -> None:
        """A collective issued in the region with ``async_op=True``: the exit checks it was waited for."""
        self.waiting.append(pending)

    def check_trace(self, before: str) -> None:
        """Under torch.compile the types live in one trace: a graph break inside a typed region loses
        them, and a region that went on would type by guesswork, so it is an error, unless no tensor
        varied before the break (then every tensor the new trace sees is invariant, as it reads)."""
        if not (self.traced and self.check_vma):
            return
        now = _trace_id()
        if now == self.trace or now == 0:  # the same trace, or eager code between graphs (real tensors)
            return
        if not self.types:  # nothing was typed varying: nothing is lost
            self.trace = now
            return
        raise MeshError(requires(
            "shard_map", "a typed region to trace in one graph under torch.compile (its types live in the "
            "trace)", "a graph break inside the region, before", before)
            + "; remove the break (torch._dynamo.explain lists it; fullgraph=True refuses it), or run the "
            "region with check_vma=False")

    def _tag(self, axes: frozenset[str]) -> _Tag:
        tag = self.tags.get(axes)
        if tag is None:
            tag = self.tags[axes] = _Tag(self, axes)
        return tag

    def forget(self, t: Any) -> None:
        """Remove this region's type from ``t`` (a tensor that leaves the region, or entered it)."""
        if isinstance(t, torch.Tensor) and not self.traced:
            tag = getattr(t, _TAG, None)
            if tag is not None and tag.region is self:
                del t.__dict__[_TAG]

    def cast(self, x: torch.Tensor, axes: frozenset[str]) -> torch.Tensor:
        """The implicit ``pvary``: identity forward, ``psum`` over ``axes`` backward.

        Made once per tensor and axes while the tensor is unchanged, and reused: an invariant weight
        used k times in a region is cast once, so the cotangents of its k uses add up before the one
        ``psum`` of its backward, not after k of them. Eagerly "unchanged" is the tensor's
        ``_version`` (which every alias's in-place write moves) and its type; under torch.compile,
        where a graph input's ``_version`` is a symbol no guard can compare, any in-place write the
        region sees retires every cast (:meth:`_TypedMode._typed`).
        """
        if self.traced:
            held = self.casts.get(x)
            hit = None if held is None else held.get(axes)
            if hit is not None:
                return hit
            y = _pvary(self.rm, x, tuple(sorted(axes)))
            self.record(y, self.type_of(x) | axes, self.unreduced_of(x))
            self.casts.setdefault(x, {})[axes] = y
            return y
        version = x._version
        tag = getattr(x, _TAG, None)
        held = getattr(x, _CAST, None)
        if held is not None and (held.region is not self or held.tag is not tag):
            held = None  # another region's, or made when the tensor had another type
        if held is not None:
            hit = held.by_axes.get(axes)
            if hit is not None and hit[0] == version:
                return hit[1]
        y = _pvary(self.rm, x, tuple(sorted(axes)))
        self.record(y, self.type_of(x) | axes, self.unreduced_of(x))
        if held is None:
            old = getattr(x, _CAST, None)
            if old is None or old.region is not self:
                self.casts.append(weakref.ref(x))
            held = x.__dict__[_CAST] = _Casts(self, tag)
        held.by_axes[axes] = (version, y)
        return y

    def forget_casts(self) -> None:
        """Remove this region's casts from the tensors that hold one (at exit)."""
        if self.traced:
            self.casts.clear()
            return
        for ref in self.casts:
            t = ref()
            if t is not None:
                held = t.__dict__.get(_CAST)
                if held is not None and held.region is self:
                    del t.__dict__[_CAST]
        self.casts.clear()

    # -- collectives: every one through its record ----------------------------------------------------

    def collective(self, rec: C.Collective, x: Any, axis: object, mesh: Any, params: dict[str, Any]) -> Any:
        api, rm = rec.name, self.rm
        if mesh is not None and mesh is not rm and resolve_mesh(api, mesh).mesh != rm.mesh:
            raise MeshError(requires(api, "inside shard_map, the region's mesh (or mesh=None)", "mesh", mesh,
                                     rm), mesh=rm.mesh)
        try:
            call = C.bind(rec, x, axis, rm, params)
        except UnknownAxisError as error:  # name the region's mesh: the axis may exist outside it
            raise UnknownAxisError(f"{error.args[0]} (inside shard_map over {rm.mesh!r}{_selected(rm)})",
                                   mesh=rm.mesh) from None
        if rec.rule is None:  # no tensor, no type (axis_size)
            return rec.run(call)
        if not self.check_vma:
            out = (rec.untyped or rec.run)(call)
            return out if rec.region_dtype is None else torch.tensor(out, dtype=rec.region_dtype)
        pending = self.unreduced_of(x) if rec.operand else _NOTHING
        if pending:  # a pending sum: the record's own rule for one, or an error (reduce first)
            if rec.unreduced is None:
                raise _vma.unreduced_collective_error(api, pending, frozenset(call.names))
            rule = rec.unreduced(api, self.type_of(x), pending, frozenset(call.names), call.params)
        else:
            rule = rec.rule(api, self.type_of(x) if rec.operand else _NOTHING, frozenset(call.names), call.params)
        if rec.operand and rule.casts[0]:
            call = call._replace(x=self.cast(x, rule.casts[0]))
        out = rec.run(call)
        if rec.region_dtype is not None:
            out = torch.tensor(out, dtype=rec.region_dtype)
        self.record(out, rule.result, rule.unreduced)
        # the source of what _made_by's hint is about: a weak-keyed entry costs ~5-10 us, so only those
        if api == "all_gather" and call.params.get("to") == "varying" and isinstance(out, torch.Tensor):
            if self.sources is None:
                self.sources = {} if self.traced else WeakTensorKeyDictionary()
            self.sources[out] = (api, call.names, call.params)
        return out


def _selected(rm: RealizedMesh) -> str:
    """", a selection of (dp, tp)" for a region over a selection of a bigger realized mesh."""
    root = selected_from(rm)
    return "" if root is None else f", a selection of ({', '.join(root.axis_names)})"


def _pvary(rm: RealizedMesh, x: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
    """The cast the region makes itself (no type recorded): identity forward, ``psum`` over ``axes`` backward."""
    return C.PVARY.run(C.bind(C.PVARY, x, axes, rm, {}))


class _Scale(torch.autograd.Function):
    """Identity forward; the cotangent times ``factor`` backward."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


# -- the interpreter ---------------------------------------------------------------------------------


_UNREDUCED_RULES: dict[tuple[Any, ...], _vma.Rule] = {}  # (op, kind, types, roles, adds a number) -> rule
_DEFAULT_RULES: dict[tuple[frozenset[str], ...], _vma.Rule] = {}  # operand types -> the default rule's answer


def _default_rule(operands: list[frozenset[str]]) -> _vma.Rule:
    key = tuple(operands)
    rule = _DEFAULT_RULES.get(key)
    if rule is None:
        rule = _DEFAULT_RULES[key] = _vma.default_rule(operands)
    return rule


class _TypedMode(TorchFunctionMode):
    """Types every torch op of one region: the table's exception or the default rule, casts first.

    The common op (tensors and scalars, positional or scalar keyword arguments, nothing written,
    nothing drawn) whose tensor operands all have one type costs one table lookup and one type
    read per operand: its result has that type and nothing is cast. The same op with operands of
    several types (an invariant weight into a varying activation) adds the default rule's cached
    answer and each cast's cached tensor (``_Region.cast``): no pytree, no rule computed again.
    """

    def __init__(self, region: _Region) -> None:
        super().__init__()
        self.region = region
        self.plain: dict[Any, bool] = {}  # eagerly: function -> whether the default rule types it (one lookup)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        region = self.region
        # a region with a pending sum: the fast paths for the ops none of whose operands is one
        if not region.traced and (region.unreduced is None or not _pending_operand(region, args, kwargs)):
            plain = self.plain.get(func)
            if plain is None:
                kind = op_kind(func)
                plain = self.plain[func] = kind.role == "op" and not kind.random and not kind.writes_first
        else:
            plain = False
        if plain:
            if len(args) == 2 and not kwargs and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
                a, b = args  # a binary op: its operands' types without a loop, a cast where they differ
                ta, tb = getattr(a, _TAG, None), getattr(b, _TAG, None)
                ta = ta.axes if ta is not None and ta.region is region else _NOTHING
                tb = tb.axes if tb is not None and tb.region is region else _NOTHING
                if ta is tb or ta == tb:
                    same = ta
                else:
                    rule = _DEFAULT_RULES.get((ta, tb)) or _default_rule([ta, tb])
                    ca, cb = rule.casts
                    args, same = (region.cast(a, ca) if ca else a, region.cast(b, cb) if cb else b), rule.result
            else:
                same = _one_type(region, args, kwargs)
            if same is None:  # operands of several types, flat: each cast up to their join (or the general path)
                joined = _joined(region, args, kwargs)
                if joined is None:
                    return self._typed(func, op_kind(func), args, kwargs or {})
                args, kwargs, same = joined
            out = func(*args, **kwargs) if kwargs else func(*args)
            if same:
                if isinstance(out, torch.Tensor):  # an op's result: a tensor (the instance dict: see record)
                    out.__dict__[_TAG] = region._tag(same)
                else:
                    region.record(out, same)
            return out
        kind = op_kind(func)  # a constant of the trace under torch.compile
        if kind.role == "pass":  # metadata and queries: x.shape, x.size(), x.item(), ...
            return func(*args, **kwargs) if kwargs else func(*args)
        return self._typed(func, kind, args, kwargs or {})

    def _typed(self, func: Any, kind: Any, args: tuple, kwargs: dict) -> Any:
        region = self.region
        region.check_trace(kind.name)
        if region.traced and region.casts and written_operand(func, args, kwargs) is not None:
            region.casts.clear()  # a write, maybe into an alias of a cast tensor: cast anew (see _Region.cast)
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
        flat, tree = _operands(args, kwargs)
        positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        operands = [region.type_of(flat[i]) for i in positions]
        if kind.role == "untypeable":
            raise _vma.op_error(kind.name, [(tuple(flat[i].shape), t) for i, t in zip(positions, operands,
                                                                                    strict=True)],
                                "a custom op's result need not follow its inputs' types; run this region "
                                "with check_vma=False")
        if region.unreduced is not None:
            pending = [region.unreduced_of(flat[i]) for i in positions]
            if any(pending):
                return self._unreduced_op(func, kind, args, kwargs, flat, tree, positions, operands, pending)
        if kind.random and is_random(func, args, kwargs):
            region.random = True
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


    def _unreduced_op(self, func: Any, kind: Any, args: tuple, kwargs: dict, flat: list[Any], tree: Any,
                 positions: list[int], operands: list[frozenset[str]], pending: list[frozenset[str]]) -> Any:
        """An op with an operand unreduced over some axes (a pending sum): the linear ops keep it
        (``_vma.unreduced_op_rule``), every other op is a ``VmaError``. An operand multiplied into the
        pending sum gets a cast whose backward sums its gradient over the sum's axes."""
        region = self.region
        linear = kind.linear
        values = _value_operands(linear, args, kwargs)
        if linear == "div" and not (args and isinstance(args[0], torch.Tensor)):
            linear = ""  # a number divided by a pending sum
        roles = ["value" if linear == "factors" or any(flat[i] is v for v in values) else "other" for i in positions]
        adds_number = linear == "add" and any(not isinstance(v, torch.Tensor) for v in values)
        if linear == "factors" and func in BIAS:  # F.linear(x, w, b): a bias is added to every member's term
            bias = args[BIAS[func]] if len(args) > BIAS[func] else kwargs.get("bias")
            if bias is not None:
                axes = tuple(sorted(frozenset().union(*pending)))
                raise _vma.VmaError(
                    f"`{kind.name}` with a bias cannot take a value unreduced over {axes}: every member would add "
                    f"the bias to its term, so the sum would hold it once per member; call it without the bias, "
                    f"then psum over {axes} and add the bias (or add it after a psum_scatter)")
        key = (kind.name, linear, tuple(operands), tuple(pending), tuple(roles), adds_number)
        rule = _UNREDUCED_RULES.get(key)  # the rule depends on types only (shapes are for messages)
        if rule is None:
            rule = _UNREDUCED_RULES[key] = _vma.unreduced_op_rule(
                kind.name, linear, [(tuple(flat[i].shape), t, u) for i, t, u in zip(positions, operands, pending,
                                                                                      strict=True)],
                roles, adds_number)
        written = written_operand(func, args, kwargs)
        if written is not None:
            _vma.check_write(kind.name, region.type_of(written), rule.result,
                             [tuple(flat[i].shape) for i in positions])
            if region.unreduced_of(written) != rule.unreduced:
                raise _vma.VmaError(
                    f"`{kind.name}` writes in place into a tensor unreduced over "
                    f"{tuple(sorted(region.unreduced_of(written)))}, but the value it writes is unreduced over "
                    f"{tuple(sorted(rule.unreduced))}; write `x = x * y` (out of place) instead")
        changed = False
        for k, i in enumerate(positions):
            if flat[i] is written:
                continue
            if rule.casts[k]:
                flat[i], changed = region.cast(flat[i], rule.casts[k]), True
            if rule.sums and rule.sums[k]:  # its gradient is one term of the pending sum: sum it
                flat[i], changed = _pvary(region.rm, flat[i], tuple(sorted(rule.sums[k]))), True
        if changed:
            args, kwargs = _torch.pytree.tree_unflatten(flat, tree) if tree is not None else (tuple(flat), kwargs)
        out = func(*args, **kwargs)
        if written is None:
            region.record(out, rule.result, rule.unreduced)
        return out


def _value_operands(linear: str, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments a linear op adds, multiplies or keeps (see ``_vma.LINEAR_KINDS``); its other
    tensor arguments are indices, shapes or masks."""
    if linear in ("add", "mul", "div"):
        second = args[1] if len(args) > 1 else kwargs.get("other")
        return [args[0], second] if args else []
    if linear == "cat":
        return list(args[0]) if args and isinstance(args[0], (list, tuple)) else list(kwargs.get("tensors", ()))
    if linear == "unary":
        return args[:1]
    return [a for a in args if isinstance(a, torch.Tensor)]  # factors: every tensor


def _pending_operand(region: _Region, args: tuple, kwargs: dict | None) -> bool:
    """Whether a tensor argument (flat, or a keyword's) is a pending sum in ``region`` (eagerly). One in
    a container is not looked for: the fast paths send a call with such a container to the general
    path, which finds it."""
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            tag = getattr(a, _TAG, None)
            if tag is not None and tag.unreduced and tag.region is region:
                return True
    return False


def _one_type(region: _Region, args: tuple, kwargs: dict | None) -> frozenset[str] | None:
    """The one type of the tensor operands of a flat call (``_NOTHING`` with none); ``None`` when they
    differ, or when an argument is a container of anything but ints (a shape or dims may be) or the
    call writes (``out=``, ``inplace=True``): the general path."""
    same = None
    for a in args:
        if isinstance(a, torch.Tensor):
            tag = getattr(a, _TAG, None)
            t = tag.axes if tag is not None and tag.region is region else _NOTHING
            if same is None:
                same = t
            elif t is not same and t != same:
                return None
        elif isinstance(a, (list, tuple)):  # a shape or dims (ints) stays on the fast path
            for e in a:
                if not isinstance(e, int):
                    return None
        elif isinstance(a, dict):
            return None
    if kwargs:
        for k, v in kwargs.items():
            if isinstance(v, (torch.Tensor, list, tuple, dict)) or k == "inplace":
                if not (isinstance(v, (list, tuple)) and all(isinstance(e, int) for e in v)):
                    return None
    return _NOTHING if same is None else same


def _joined(region: _Region, args: tuple, kwargs: dict) -> tuple[tuple, dict, frozenset[str]] | None:
    """The eager path of a flat op whose tensor operands differ in type (an invariant weight into a
    varying activation): its arguments with every operand cast up to the join (the default rule;
    casts are cached per tensor, :meth:`_Region.cast`), and the join. ``None`` (the general path)
    for an argument that is a container of anything but ints, or a call that writes (``out=``,
    ``inplace=``)."""
    types = []
    for a in args:
        if isinstance(a, torch.Tensor):
            tag = getattr(a, _TAG, None)
            types.append(tag.axes if tag is not None and tag.region is region else _NOTHING)
        elif isinstance(a, (list, tuple)):
            for e in a:
                if not isinstance(e, int):
                    return None
        elif isinstance(a, dict):
            return None
    keys = None
    if kwargs:
        for k, v in kwargs.items():
            if k == "out" or k == "inplace":
                return None
            if isinstance(v, torch.Tensor):
                tag = getattr(v, _TAG, None)
                types.append(tag.axes if tag is not None and tag.region is region else _NOTHING)
                keys = [k] if keys is None else [*keys, k]
            elif isinstance(v, (list, tuple)):
                for e in v:
                    if not isinstance(e, int):
                        return None
            elif isinstance(v, dict):
                return None
    rule = _default_rule(types)
    casts = rule.casts
    i, cast_args = 0, []
    for a in args:
        if isinstance(a, torch.Tensor):
            if casts[i]:
                a = region.cast(a, casts[i])
            i += 1
        cast_args.append(a)
    if keys is not None:
        kwargs = dict(kwargs)
        for k in keys:
            if casts[i]:
                kwargs[k] = region.cast(kwargs[k], casts[i])
            i += 1
    return tuple(cast_args), kwargs, rule.result


def _operands(args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    """Every argument of an op, flat, and the tree to rebuild them (``None``: ``args`` as they are).

    Most ops take tensors and scalars only, positionally: they skip the pytree machinery.
    """
    if not any(isinstance(a, (list, tuple, dict)) for a in args) and not any(
            isinstance(v, (torch.Tensor, list, tuple, dict)) for v in kwargs.values()):
        return list(args), None
    return _torch.pytree.tree_flatten((args, kwargs))


# -- the public API -------------------------------------------------------------------------------------


def typeof(t: torch.Tensor) -> _vma.AxisTypes:
    """The axes a local tensor varies over, inside a ``shard_map`` region with ``check_vma=True``.

    JAX's ``jax.typeof(x).vma``: a tensor that entered sharded over an axis varies over it; a
    ``psum`` over the axis makes it invariant; an op's result varies over the union of its
    operands' axes (docs/shard_map.md).

    Args:
        t: a tensor of the region (one made outside it reads as invariant).

    Returns:
        Its type: ``AxisTypes(varying=frozenset(axis names))``.

    Raises:
        TypeError: ``t`` is not a tensor.
        MeshError: no enclosing region, or one with ``check_vma=False`` (it tracks no types).

    Examples:
        >>> import torch, torch.distributed as dist
        >>> import functional_mesh as fm
        >>> from functional_mesh import P
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
        >>> rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
        >>> def f(x):
        ...     print(fm.typeof(x), fm.typeof(fm.psum(x, "tp")))
        ...     return x
        >>> _ = fm.shard_map(f, in_specs=P("tp"), out_specs=P("tp"), mesh=rm)(torch.arange(8.0))
        AxisTypes(varying=frozenset({'tp'})) AxisTypes(varying=frozenset())
        >>> fm.typeof(torch.ones(2))
        Traceback (most recent call last):
        ...
        functional_mesh.MeshError: `typeof` requires an enclosing shard_map region with check_vma=True, but got none
        >>> fm.clear_cache(); dist.destroy_process_group()
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(requires("typeof", "a torch.Tensor", "t", t))
    region = C.current_region()
    if region is None or not region.check_vma:
        raise MeshError("`typeof` requires an enclosing shard_map region with check_vma=True, but got "
                        + ("a region with check_vma=False" if region is not None else "none"))
    return _vma.AxisTypes(region.type_of(t), region.unreduced_of(t))


def shard_map(f: Callable[..., Any] | None = None, /, *, in_specs: Any, out_specs: Any,
              mesh: RealizedMesh | None = None, check_vma: bool = True) -> Any:
    """Map ``f``, written for one shard, over the realized mesh: JAX's ``shard_map`` on torch.

    Args:
        f: the per-shard function (or omit it to use ``shard_map(...)`` as a decorator).
        in_specs: a ``PartitionSpec`` per argument, or any pytree prefix of the arguments.
        out_specs: a ``PartitionSpec`` per result, or any pytree prefix of the results.
        mesh: a ``RealizedMesh``; ``None`` = the current ``with rm:`` mesh, at call time.
        check_vma: track which axes each tensor varies over, insert the implicit ``pvary``s and
            check the results against out_specs (docs/shard_map.md); ``False`` trusts out_specs.

    Returns:
        The mapped function: DTensor or full-tensor arguments in, DTensors out. A DTensor argument
        must be sharded as its spec says (else ``fm.reshard`` it first); a plain tensor is the full
        value, sliced to this rank's block without communication (its gradient is gathered back).

    Raises:
        TypeError: ``f`` is not callable, ``check_vma`` is not a bool, a spec leaf is not a
            ``PartitionSpec``, or ``mesh`` is not a ``RealizedMesh``.
        MeshError: when called: no mesh (``mesh=None`` outside ``with rm:``), a rank outside the
            mesh, a nested region, specs that are no pytree prefix of the values, a sharded dim
            that does not divide evenly, a DTensor sharded otherwise than its spec.
        VmaError: when called with ``check_vma=True``: a result varies over an axis its out_spec
            does not name (one error lists every such result, with its fix), or an op the region
            cannot type.

    Examples:
        Rank 5 of 8 on torch's fake backend, whose collectives carry no data: the local blocks
        show what this rank computes.

        >>> import torch, torch.distributed as dist
        >>> import functional_mesh as fm
        >>> from functional_mesh import P
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
        >>> rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
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
        >>> fm.clear_cache(); dist.destroy_process_group()
    """
    if f is None:
        return functools.partial(shard_map, in_specs=in_specs, out_specs=out_specs, mesh=mesh, check_vma=check_vma)
    if not callable(f):
        raise TypeError(requires("shard_map", "a callable f", "f", f))
    if not isinstance(check_vma, bool):
        raise TypeError(requires("shard_map", "check_vma=True or False", "check_vma", check_vma))
    if mesh is not None and not isinstance(mesh, RealizedMesh):
        resolve_mesh("shard_map", mesh)  # the error for a pure Mesh or another type
    _check_specs("in_specs", in_specs)
    _check_specs("out_specs", out_specs)

    @functools.wraps(f)
    def mapped(*args: Any) -> Any:
        if not torch.compiler.is_compiling():
            return _call(f, mesh, check_vma, in_specs, out_specs, args)
        why = _no_compiled_regions()  # "" where this torch's dynamo traces a region (probed once)
        if why:  # before dynamo meets the mesh: its own error there names none of this
            raise_while_tracing(False, why)
        try:
            return _call(f, mesh, check_vma, in_specs, out_specs, args)
        except MeshError as error:  # a type or boundary error while tracing: the user's error, not torch's
            raise_while_tracing(isinstance(error, _vma.VmaError), error.args[0])

    return mapped


def _call(f: Callable[..., Any], mesh: RealizedMesh | None, check_vma: bool, in_specs: Any, out_specs: Any,
          args: tuple) -> Any:
    rm = resolve_mesh("shard_map", mesh)
    if rm.coordinate is None:
        raise C.member_error("shard_map", rm)
    if C.current_region() is not None:
        raise MeshError("`shard_map` requires no enclosing shard_map region (nested regions are not "
                        "supported), but got one; call the inner function directly")
    region = _Region(rm, check_vma)
    try:
        local = _enter_all(region, args, in_specs)
        with C.open_region(region):
            if check_vma:  # typed: a mode sees every op
                with _TypedMode(region):
                    out = f(*local)
            else:  # untyped: plain torch; only the collectives ask for the region
                out = f(*local)
        if region.waiting:
            _check_waited(region.waiting)
        return _exit_all(region, out, out_specs)
    finally:
        for t in region.entered:  # the arguments' tensors carry no type out of the region
            region.forget(t)
        region.forget_casts()


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


@torch.compiler.assume_constant_result
def _trace_id() -> int:
    """The trace dynamo is making now, as a constant of that trace (0 outside one)."""
    return _torch.trace_id()


# -- the boundary -----------------------------------------------------------------------------------------


def _check_specs(what: str, specs: Any) -> None:
    leaves = _torch.pytree.tree_leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    for leaf in leaves:
        if not isinstance(leaf, PartitionSpec):
            raise TypeError(requires("shard_map", f"PartitionSpec leaves in {what}", what, specs))


def _prefix(what: str, specs: Any, values: Any) -> list[tuple[str, Any, PartitionSpec]]:
    """``(path, leaf, spec)`` for every leaf of ``values``, its spec taken from the prefix ``specs``."""
    pairs, tree = _torch.pytree.tree_flatten_with_path(values)
    if isinstance(specs, list) and isinstance(values, tuple):
        specs = tuple(specs)
    flat_specs = _torch.pytree._broadcast_to_and_flatten(specs, tree, is_leaf=lambda s: isinstance(s, PartitionSpec))
    if flat_specs is None:
        raise MeshError(requires("shard_map", f"{what} that is a pytree prefix of the "
                                 f"{'arguments' if what == 'in_specs' else 'results'}", what, specs)
                        + f"; the {'arguments' if what == 'in_specs' else 'results'} have structure {tree}")
    keystr = _torch.pytree.keystr
    return [(what + keystr(path), leaf, spec) for (path, leaf), spec in zip(pairs, flat_specs, strict=True)]


def _spec_axes(spec: PartitionSpec) -> frozenset[str]:
    return frozenset(a for d in range(len(spec)) for a in spec.axes_of(d))


def _check_shape(rm: RealizedMesh, path: Any, shape: Sequence[int], spec: PartitionSpec, plan: _Plan) -> None:
    """JAX's rule: the spec fits the rank, and every sharded dim divides evenly over its axes.

    Plain arithmetic on the shape: under torch.compile it runs while tracing (on symbolic sizes too).
    """
    if plan.rank > len(shape):
        raise MeshError(requires("shard_map", f"a value of rank at least {plan.rank} for {_path(path)}={spec}", "shape",
                                 tuple(shape)), mesh=rm.mesh)
    for d, k in enumerate(plan.sizes):
        n = shape[d]
        if n % k:
            raise MeshError(
                f"`shard_map` requires every sharded dim to divide evenly over its mesh axes, but {_path(path)}={spec} "
                f"maps dim {d} of size {n} (shape {tuple(shape)}) to axes {spec.axes_of(d)} of total size {k}; "
                f"pad the value to a multiple of {k}, or shard it over other axes", mesh=rm.mesh)


def _leaves(what: str, specs: Any, values: Any) -> tuple[list[tuple[str, Any, PartitionSpec]], Any]:
    """``(path, leaf, spec)`` per leaf, and the tree to rebuild ``values`` (``None``: a flat tuple or one leaf).

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


def _path(path: str | tuple[str, int]) -> str:
    """A leaf's path as messages show it: ``in_specs[1]``, ``out_specs['w']``, ... (made only for messages)."""
    return path if isinstance(path, str) else f"{path[0]}[{path[1]}]"


def _rebuild(leaves: list[Any], tree: Any) -> Any:
    if tree is None:
        return leaves[0]
    if tree == ():
        return tuple(leaves)
    return _torch.pytree.tree_unflatten(leaves, tree)


class _Plan:
    """What the boundary does for a leaf with one spec on one mesh, whatever its shape: its sharding
    and placements, the axes it names, the size each dim is split into and how a full argument
    enters (its gathers) or an untyped one sums its cotangent (its unnamed axes)."""

    __slots__ = ("sharding", "placements", "axes", "unreduced", "rank", "sizes", "gathers", "unnamed", "spec",
                 "specs")

    def __init__(self, rm: RealizedMesh, spec: PartitionSpec, check_vma: bool) -> None:
        self.sharding = NamedSharding(rm.mesh, spec)
        self.placements = self.sharding.placements
        self.specs: dict[tuple[tuple[int, ...], torch.dtype], Any] = {}  # eagerly: a result's DTensor spec per shape
        self.axes = _spec_axes(spec)
        self.unreduced = spec.unreduced  # a pending sum over these axes (DTensor's Partial("sum"))
        self.unnamed = () if check_vma else tuple(a for a in rm.mesh.axis_names
                                                  if a not in self.axes and a not in self.unreduced)
        self.rank = len(spec)
        self.spec = str(spec)  # for messages (torch.compile cannot format a PartitionSpec while tracing)
        self.sizes = tuple(axes_size(rm, spec.axes_of(d)) for d in range(len(spec.entries)))
        self.gathers = tuple((d, spec.axes_of(d)) for d in range(len(spec.entries)) if spec.axes_of(d))


_PLANS: dict[tuple[Any, tuple[Any, ...], bool], _Plan] = {}  # (mesh value, spec entries, check_vma) -> plan


@torch.compiler.assume_constant_result
def _plan_of(rm: RealizedMesh, entries: tuple[Any, ...], check_vma: bool) -> _Plan:
    """The plan of the spec ``PartitionSpec.from_key(entries)`` on ``rm``'s mesh, made once per mesh value.

    Under torch.compile this runs (in Python) while tracing and its result is a constant of the
    trace; it also makes sure ``rm.device_mesh`` exists then, which a compiled program cannot
    build. It takes the spec's entries, not the spec: a shard_map made inside the compiled
    function has specs that exist only as dynamo's record while it traces.
    """
    rm.device_mesh  # noqa: B018 - built once per realized mesh (and kept by it), outside any trace
    key = (rm.mesh, entries, check_vma)  # the mesh value: equal meshes (a selection made again) share plans
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _Plan(rm, PartitionSpec.from_key(entries), check_vma)
    return plan


def _plan(region: _Region, spec: PartitionSpec) -> _Plan:
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


def _enter_all(region: _Region, args: tuple, in_specs: Any) -> list[Any]:
    rm = region.rm
    entries, tree = _leaves("in_specs", in_specs, args)
    leaves = []
    for path, leaf, spec in entries:
        if isinstance(leaf, torch.Tensor):
            plan = _plan(region, spec)
            _check_shape(rm, path, leaf.shape, spec, plan)
            leaf = _enter(region, path, leaf, plan)
            if region.check_vma and (plan.axes or plan.unreduced):
                region.record(leaf, plan.axes, plan.unreduced)
                region.entered.append(leaf)
        leaves.append(leaf)
    return list(_rebuild(leaves, tree if tree is not None else ()))


def _enter(region: _Region, path: Any, value: torch.Tensor, plan: _Plan) -> torch.Tensor:
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
        elif region.traced or plan.unreduced:
            local = value.to_local()
        else:
            local = _Local.apply(value)
    elif plan.unreduced:
        raise MeshError(
            f"`shard_map` requires a DTensor with Partial('sum') placements for an in_spec with unreduced axes, but "
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
        return _pvary(rm, local, plan.unnamed)
    return local


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


class _Global(torch.autograd.Function):
    """A result's DTensor, eagerly, when it needs a gradient: what ``DTensor.from_local`` makes (a view of the
    local tensor), from a spec made once per shape; backward, the cotangent's local tensor in these placements
    (``from_local``'s backward)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, spec: Any) -> DTensor:
        ctx.spec = spec
        ctx.set_materialize_grads(False)
        return _torch.wrap_local(local.view_as(local), copy.copy(spec), local.requires_grad)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, None]:
        if not isinstance(grad, DTensor):
            return grad, None
        spec = ctx.spec
        if tuple(grad.placements) != spec.placements:
            grad = grad.redistribute(spec.mesh, spec.placements)
        return (grad.to_local() if torch.is_grad_enabled() else _torch.local_tensor(grad)), None


def _local_block(rm: RealizedMesh, x: torch.Tensor, axes: tuple[str, ...], dim: int) -> torch.Tensor:
    """This rank's block of ``x`` along ``dim`` over ``axes`` (first axis major), without
    communication; backward gathers the cotangent (the transpose of ``all_gather(to="invariant")``).
    ``dim`` is a valid, non-negative dim: the boundary's plan checked it."""
    call = C.Call("shard_map", rm, x, C.resolve_axes("shard_map", rm, axes), {}, torch.compiler.is_compiling())
    for hop in call.hops():  # outermost first; backward gathers innermost first
        x = C.run_step(call, x, S.Slice(call.group(hop), hop.size, dim, hop.index), hop)
    return x


def _describe(value: DTensor) -> str:
    try:
        return repr(sharding_of(value))
    except MeshError:
        return f"a DTensor with placements {tuple(value.placements)}"


def _exit_all(region: _Region, out: Any, out_specs: Any) -> Any:
    rm = region.rm
    entries, tree = _leaves("out_specs", out_specs, out)
    plans = [_plan(region, spec) if isinstance(leaf, torch.Tensor) else None for _, leaf, spec in entries]
    if region.check_vma:
        region.check_trace("the region's results")
        failures, pending = [], []
        for (path, leaf, _), plan in zip(entries, plans, strict=True):
            if plan is not None:
                varying, named = region.type_of(leaf), plan.axes
                if varying - named:
                    fix = _made_by(region, leaf, varying - named)
                    if varying & plan.unreduced and not (varying - named - plan.unreduced):
                        axes = tuple(sorted(varying & plan.unreduced))
                        fix = (f"its out_spec says it is a pending sum over {axes}: cast it with "
                               f"fm.pcast(x, {axes if len(axes) > 1 else axes[0]!r}, to='unreduced')")
                    failures.append((_path(path), varying, named, plan.spec, fix))
                unreduced = region.unreduced_of(leaf)
                if unreduced != plan.unreduced and (unreduced - plan.unreduced or plan.unreduced - unreduced - varying):
                    pending.append((_path(path), varying, unreduced, plan.unreduced, plan.spec))
        if failures:
            raise _vma.out_specs_error(failures, rm.mesh.axis_names, region.random)
        if pending:
            raise _vma.unreduced_out_specs_error(pending)
    leaves = []
    for (path, leaf, spec), plan in zip(entries, plans, strict=True):
        if plan is not None:
            if plan.rank > leaf.ndim:  # a result is local: only the rank rule applies
                _check_shape(rm, path, leaf.shape, spec, plan)
            leaf = _exit(region, leaf, plan)
        leaves.append(leaf)
    return _rebuild(leaves, tree)


def _made_by(region: _Region, leaf: torch.Tensor, extra: frozenset[str]) -> str | None:
    """The fix for a result that an ``all_gather(to="varying")`` over the extra axes made: its invariant form."""
    source = None if region.sources is None else region.sources.get(leaf)
    if source is None:
        return None
    api, names, params = source
    if api != "all_gather" or params.get("to") != "varying" or not extra <= frozenset(names):
        return None
    axis = names[0] if len(names) == 1 else names
    return f"gather with all_gather(x, {axis!r}, to='invariant') instead (every member then holds the same value)"


def _exit(region: _Region, local: torch.Tensor, plan: _Plan) -> DTensor:
    rm = region.rm
    if region.check_vma:
        missing = plan.axes - region.type_of(local)
        region.forget(local)
        if missing:  # invariant over a named axis: copies are concatenated, so the cotangent sums
            local = _pvary(rm, local, tuple(sorted(missing)))
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
        return _Global.apply(local, spec)
    return _torch.wrap_local(local.view_as(local), copy.copy(spec), False)
