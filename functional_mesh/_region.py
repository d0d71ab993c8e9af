"""A ``shard_map`` region's state: its mesh, the types of its tensors, the casts it made, its collectives.

One :class:`Region` per call of a mapped function; eagerly a tensor's type is a :class:`Tag` on it
(under :data:`TAG`), under torch.compile a dict of the trace, and :meth:`Region.close` removes the
tags the boundary handed in. It applies each collective's record and names none but the implicit
``pvary`` cast (docs/design.md, "Type rules").
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Shard
from torch.utils.weak import WeakTensorKeyDictionary

from . import _collectives as C
from . import _torch, _vma
from ._call import Collective, bind
from ._errors import MeshError, UnknownAxisError, requires
from ._handle import RealizedMesh, resolve_mesh, selected_from
from ._pending import Pending

__all__ = ["NOTHING", "TAG", "Region", "Tag", "rewrap"]

NOTHING: frozenset[str] = frozenset()  # the one empty type: the interpreter compares types by identity first

TAG = "_functional_mesh_vma"  # the attribute that holds a tensor's type inside an eager typed region
_CAST = "_functional_mesh_cast"  # the attribute that holds a tensor's implicit casts inside an eager typed region


@torch.compiler.assume_constant_result
def _trace_id() -> int:
    """The trace dynamo is making now, as a constant of that trace (0 outside one)."""
    return _torch.trace_id()


class Tag:
    """A tensor's type in one eager region: valid only while ``region`` is the region that set it.

    ``axes``: the axes it varies over; ``unreduced``: those it is a pending reduction over (most often
    none), of kind ``kind``; ``reduced``: those it is reduced over; ``types``: all of it, as
    :func:`functional_mesh.typeof` says it (built once: the interpreter asks for it on every op).
    """

    __slots__ = ("region", "axes", "unreduced", "reduced", "kind", "types")

    def __init__(self, region: Region, axes: frozenset[str], unreduced: frozenset[str] = NOTHING,
                 reduced: frozenset[str] = NOTHING, kind: str = "sum") -> None:
        self.region, self.axes, self.unreduced = region, axes, unreduced
        self.reduced, self.kind = reduced, kind
        key = (axes, unreduced, reduced, kind)
        self.types = _TYPES.get(key) or _TYPES.setdefault(key, _vma.AxisTypes(*key))


# every eager type once (a few per mesh), so that the interpreter's rule cache finds its keys by identity
_TYPES: dict[tuple[frozenset[str], frozenset[str], frozenset[str], str], _vma.AxisTypes] = {}


class _Casts:
    """A tensor's implicit casts in one eager region (:meth:`Region.cast`): per axes, the tensor's
    ``_version`` when it was cast and the cast; valid while ``region`` is the region and ``tag`` the
    tensor's type."""

    __slots__ = ("region", "tag", "by_axes")

    def __init__(self, region: Region, tag: Tag | None) -> None:
        self.region, self.tag = region, tag
        self.by_axes: dict[frozenset[str], tuple[int, torch.Tensor]] = {}


class Region:
    """One call of a mapped function: its realized mesh, whether it is typed, and the types."""

    __slots__ = ("rm", "check_vma", "axes", "traced", "trace", "types", "tags", "sources", "random", "entered",
                 "casts", "unreduced", "more", "waiting", "new", "outer", "auto", "partial", "mode")

    def __init__(self, rm: RealizedMesh, check_vma: bool, new: frozenset[str] | None = None,
                 outer: Region | None = None) -> None:
        self.rm = rm
        self.check_vma = check_vma
        # manual over ``new`` (default: every axis), and over the enclosing region's manual axes; the other
        # axes (``auto``, in mesh order) stay DTensor dims inside (docs/shard_map.md, "Manual over some axes")
        self.outer = outer
        if new is None and outer is None:  # manual over every axis: the common case
            self.new = self.axes = frozenset(rm.mesh.axis_names)
            self.auto: tuple[str, ...] = ()
            self.partial = False
        else:
            self.new = frozenset(rm.mesh.axis_names) if new is None else new
            self.axes = self.new if outer is None else self.new | outer.axes  # every manual axis
            self.auto = tuple(a for a in rm.mesh.axis_names if a not in self.axes)
            self.partial = bool(self.auto) or outer is not None
        self.mode: Any = None  # the TypedMode that types this region's ops (a nested region borrows its outer's)
        self.traced = torch.compiler.is_compiling()
        self.trace = _trace_id() if self.traced else 0  # the trace the types belong to
        self.types: dict[Any, frozenset[str]] = {}  # under torch.compile: traced tensor -> axes
        # None until a value of the region is a pending sum (unreduced over some axes) or reduced: until then no
        # op asks; then under torch.compile traced tensor -> its unreduced axes (eagerly empty: tags hold them),
        # and in ``more`` its reduced axes and kind where they are not the defaults
        self.unreduced: dict[Any, frozenset[str]] | None = None
        self.more: dict[Any, tuple[frozenset[str], str]] = {}
        self.tags: dict[Any, Tag] = {}  # eagerly: one tag per type (varying axes; (varying, unreduced) pairs)
        # results whose record has a fix for an out_specs error -> (axes, fix), made on the first one (fix_for)
        self.sources: Any = None
        self.random = False  # whether a random op ran (the out_specs error then says why values vary)
        self.entered: list[torch.Tensor] = []  # tensors typed at the boundary (their tags go at close)
        self.waiting: list[Pending] = []  # results issued here with async_op=True: waited for by the exit?
        # the implicit casts made (cast): under torch.compile traced tensor -> {axes: cast}; eagerly
        # they are an attribute of the tensor (a _Casts) and this lists the tensors that hold one (weakly: a
        # cast must not keep a tensor alive), whose attributes go at close
        self.casts: Any = {} if self.traced else []

    # -- types ------------------------------------------------------------------------------------------

    def type_of(self, t: torch.Tensor) -> frozenset[str]:
        """The axes ``t`` varies over; a tensor the region never saw (created outside) is invariant."""
        if self.partial and isinstance(t, DTensor):
            t = self._holder(t)
        if self.traced:
            return self.types.get(t, NOTHING)
        tag = getattr(t, TAG, None)
        return tag.axes if tag is not None and tag.region is self else NOTHING

    def unreduced_of(self, t: torch.Tensor) -> frozenset[str]:
        """The axes ``t`` is a pending sum over (none for a tensor the region never saw)."""
        if self.unreduced is None:
            return NOTHING
        if self.partial and isinstance(t, DTensor):
            t = self._holder(t)
        if self.traced:
            return self.unreduced.get(t, NOTHING)
        tag = getattr(t, TAG, None)
        return tag.unreduced if tag is not None and tag.region is self else NOTHING

    def types_of(self, t: torch.Tensor) -> _vma.AxisTypes:
        """``t``'s whole type: the axes it varies over, those it is a pending reduction over (and its kind),
        and those it is reduced over."""
        if self.partial and isinstance(t, DTensor):
            t = self._holder(t)
        if self.traced:
            if self.unreduced is None:
                return _vma.AxisTypes(self.types.get(t, NOTHING))
            reduced, kind = self.more.get(t, (NOTHING, "sum"))
            return _vma.AxisTypes(self.types.get(t, NOTHING), self.unreduced.get(t, NOTHING), reduced, kind)
        tag = getattr(t, TAG, None)
        return _vma.INVARIANT if tag is None or tag.region is not self else tag.types

    def _holder(self, t: DTensor) -> torch.Tensor:
        """Where a DTensor's type is: on it, or (one ``DTensor.from_local`` made in the region, which no op of the
        interpreter sees) on its local tensor; :meth:`record` types both, so ``to_local`` keeps it too."""
        if self.traced:
            return t if t in self.types or t in self.more or (self.unreduced is not None and t in self.unreduced) else \
                _torch.local_tensor(t)
        tag = getattr(t, TAG, None)
        return t if tag is not None and tag.region is self else _torch.local_tensor(t)

    def tag_for(self, axes: frozenset[str]) -> Tag:
        """The region's one tag of a tensor that varies over ``axes`` (eagerly)."""
        tag = self.tags.get(axes)
        if tag is None:
            tag = self.tags[axes] = Tag(self, axes)
        return tag

    def record(self, out: Any, axes: frozenset[str], unreduced: frozenset[str] = NOTHING,
               reduced: frozenset[str] = NOTHING, kind: str = "sum") -> None:
        """Give ``out`` (a tensor, a tuple or list of them, or a pending result) the type ``axes`` (and
        ``unreduced`` of ``kind``, ``reduced``)."""
        if out.__class__ is Pending:  # async_op=True: its tensor takes this type when waited for
            out.when_waited(self.record, axes, unreduced, reduced, kind)
            return
        if self.partial and isinstance(out, DTensor):  # and its local tensor, which to_local views
            self.record(_torch.local_tensor(out), axes, unreduced, reduced, kind)
        if unreduced or reduced or (self.unreduced is not None and self.traced):
            self._record_unreduced(out, axes, unreduced, reduced, kind if unreduced else "sum")
            return
        if isinstance(out, torch.Tensor):
            if self.traced:
                if axes:
                    self.types[out] = axes
                return
            # the instance dict directly: a tensor's setattr costs several times more
            if axes or getattr(out, TAG, None) is not None:
                out.__dict__[TAG] = self.tag_for(axes)
            return
        if isinstance(out, (tuple, list)):
            for o in out:
                self.record(o, axes)

    def _record_unreduced(self, out: Any, axes: frozenset[str], unreduced: frozenset[str],
                          reduced: frozenset[str] = NOTHING, kind: str = "sum") -> None:
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
                if reduced or kind != "sum":
                    self.more[out] = (reduced, kind)
                else:
                    self.more.pop(out, None)
                return
            key = (axes, unreduced, reduced, kind)  # eagerly: one tag per type, beside the varying-only ones
            tag = self.tags.get(key)
            if tag is None:
                tag = self.tags[key] = Tag(self, axes, unreduced, reduced, kind)
            out.__dict__[TAG] = tag
        elif isinstance(out, (tuple, list)):
            for o in out:
                self._record_unreduced(o, axes, unreduced, reduced, kind)

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

    def enter(self, t: torch.Tensor, axes: frozenset[str], unreduced: frozenset[str],
              reduced: frozenset[str] = NOTHING, kind: str = "sum") -> None:
        """Type an argument's local tensor at the boundary (its tag goes at :meth:`close`)."""
        self.record(t, axes, unreduced, reduced, kind)
        self.entered.append(t)

    def drew_random(self) -> None:
        """A random op ran: its values vary over every axis (an out_specs error then says why)."""
        self.random = True

    def forget(self, t: Any) -> None:
        """Remove this region's type from ``t`` (a tensor that leaves the region, or entered it)."""
        if isinstance(t, torch.Tensor) and not self.traced:
            tag = getattr(t, TAG, None)
            if tag is not None and tag.region is self:
                del t.__dict__[TAG]

    def close(self) -> None:
        """The region is over: the arguments' tensors carry no type, and no tensor a cast, out of it."""
        for t in self.entered:
            self.forget(t)
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

    # -- casts ------------------------------------------------------------------------------------------

    def pvary(self, x: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
        """The cast the region makes itself (no type recorded): identity forward, ``psum`` over ``axes`` backward."""
        if isinstance(x, DTensor):  # a partial-manual region's value: the cast is of its local tensor
            return rewrap(x, C.PVARY.run(bind(C.PVARY, x.to_local(), axes, self.rm, {})), True)
        return C.PVARY.run(bind(C.PVARY, x, axes, self.rm, {}))

    def cast(self, x: torch.Tensor, axes: frozenset[str]) -> torch.Tensor:
        """The implicit ``pvary``: identity forward, ``psum`` over ``axes`` backward.

        Made once per tensor and axes while the tensor is unchanged, and reused: an invariant weight
        used k times in a region is cast once, so the cotangents of its k uses add up before the one
        ``psum`` of its backward, not after k of them. Eagerly "unchanged" is the tensor's
        ``_version`` (which every alias's in-place write moves) and its type; under torch.compile,
        where a graph input's ``_version`` is a symbol no guard can compare, any in-place write the
        region sees retires every cast (:meth:`retire_casts`).
        """
        if self.traced:
            held = self.casts.get(x)
            hit = None if held is None else held.get(axes)
            if hit is not None:
                return hit
            y = self.pvary(x, tuple(sorted(axes)))
            t = self.types_of(x)
            self.record(y, t.varying | axes, t.unreduced, t.reduced, t.unreduced_kind)
            self.casts.setdefault(x, {})[axes] = y
            return y
        version = x._version
        tag = getattr(x, TAG, None)
        held = getattr(x, _CAST, None)
        if held is not None and (held.region is not self or held.tag is not tag):
            held = None  # another region's, or made when the tensor had another type
        if held is not None:
            hit = held.by_axes.get(axes)
            if hit is not None and hit[0] == version:
                return hit[1]
        y = self.pvary(x, tuple(sorted(axes)))
        t = self.types_of(x)
        self.record(y, t.varying | axes, t.unreduced, t.reduced, t.unreduced_kind)
        if held is None:
            old = getattr(x, _CAST, None)
            if old is None or old.region is not self:
                self.casts.append(weakref.ref(x))
            held = x.__dict__[_CAST] = _Casts(self, tag)
        held.by_axes[axes] = (version, y)
        return y

    def relabel(self, x: torch.Tensor, axes: frozenset[str]) -> torch.Tensor:
        """The implicit cast of a value reduced over ``axes`` to varying over them: no communication either
        way (its varying cotangent is the pending sum its reduced type asks for; JAX's reduced_vary_cast)."""
        t = self.types_of(x)
        y = x.view_as(x)
        self.record(y, t.varying | axes, t.unreduced, t.reduced - axes, t.unreduced_kind)
        return y

    def retire_casts(self) -> None:
        """Under torch.compile: the region saw an in-place write, maybe into an alias of a cast tensor: cast anew."""
        self.casts.clear()

    # -- collectives: every one through its record ----------------------------------------------------

    def collective(self, rec: Collective, x: Any, axis: object, mesh: Any, params: dict[str, Any]) -> Any:
        """One collective called in the region: the record's rule types it, after the cast the rule asks for."""
        api, rm = rec.name, self.rm
        if mesh is not None and mesh is not rm and resolve_mesh(api, mesh).mesh != rm.mesh:
            raise MeshError(requires(api, "inside shard_map, the region's mesh (or mesh=None)", "mesh", mesh,
                                     rm), mesh=rm.mesh)
        try:
            call = bind(rec, x, axis, rm, params)
        except UnknownAxisError as error:  # name the region's mesh: the axis may exist outside it
            raise UnknownAxisError(f"{error.args[0]} (inside shard_map over {rm.mesh!r}{selected(rm)})",
                                   mesh=rm.mesh) from None
        if self.partial:
            self._check_manual(api, call.names)
            if isinstance(x, DTensor):  # over the local tensor, the other axes' placements kept
                return self._on_local(rec, x, call)
        if rec.rule is None:  # no tensor, no type (axis_size)
            return rec.run(call)
        if not self.check_vma:
            out = (rec.untyped or rec.run)(call)
            return out if rec.region_dtype is None else torch.tensor(out, dtype=rec.region_dtype)
        rule = rec.rule(api, self.types_of(x) if rec.operand else _vma.INVARIANT, frozenset(call.names), call.params)
        if rec.operand and rule.casts[0]:
            call = call._replace(x=self.cast(x, rule.casts[0]))
        if rule.params:  # what the run takes from the types (a relabel instead of a pvary)
            call = call._replace(params={**call.params, **rule.params})
        out = rec.run(call)
        if rec.region_dtype is not None:
            out = torch.tensor(out, dtype=rec.region_dtype)
        self.record(out, rule.result, rule.unreduced, rule.reduced, rule.kind)
        if rec.fix is not None and isinstance(out, torch.Tensor):
            fix = rec.fix(call.names, call.params)
            if fix is not None:  # a weak-keyed entry costs ~5-10 us, so only for a result that has a fix
                if self.sources is None:
                    self.sources = {} if self.traced else WeakTensorKeyDictionary()
                self.sources[out] = (frozenset(call.names), fix)
        return out

    def _check_manual(self, api: str, names: tuple[str, ...]) -> None:
        """A collective in a partial-manual region talks over its manual axes only (JAX: an unbound axis name)."""
        auto = [a for a in names if a not in self.axes]
        if auto:
            raise _vma.VmaError(
                f"`{api}` over {auto[0]!r} inside a shard_map region requires an axis that is manual in this region "
                f"(axis_names: {tuple(a for a in self.rm.mesh.axis_names if a in self.axes)}), but {auto[0]!r} is "
                f"not manual in this region: it stays a DTensor dim inside, and torch's DTensor communicates over "
                f"it (x.redistribute(...)); add {auto[0]!r} to axis_names, or call `{api}` outside the region")

    def _on_local(self, rec: Collective, x: DTensor, call: Any) -> Any:
        """A collective of a DTensor operand (a partial-manual region's value): over its local tensor, then
        the DTensor again with the same placements over the other axes."""
        api, params = rec.name, call.params
        dims = [params[k] for k in ("dim", "split_dim", "concat_dim") if isinstance(params.get(k), int)]
        if api == "ragged_all_to_all":
            dims.append(0)
        sharded = [p.dim for p in x.placements if isinstance(p, Shard)]
        if sharded and (dims and (not params.get("tiled", True) or {d % x.ndim for d in dims} & set(sharded))):
            raise MeshError(requires(api, "inside a partial-manual shard_map region, a DTensor operand not sharded "
                                     "over its other axes along the dims the collective moves", "placements",
                                     tuple(x.placements), f"dims {dims}")
                            + "; redistribute it (x.redistribute(placements=...)) so those dims are Replicate first",
                            mesh=self.rm.mesh)
        if api in ("pmax", "pmin") and any(isinstance(p, Partial) for p in x.placements):
            raise MeshError(requires(api, "a DTensor operand with no Partial placement (a maximum of pending sums is "
                                     "no maximum)", "placements", tuple(x.placements))
                            + "; redistribute it to Replicate first", mesh=self.rm.mesh)
        if call.slot is not None:
            raise MeshError(requires(api, "async_op=False for a DTensor operand (a partial-manual region's value)",
                                     "async_op", True), mesh=self.rm.mesh)
        types = self.types_of(x) if self.check_vma else _vma.INVARIANT
        local = x.to_local()
        self.record(local, types.varying, types.unreduced)
        params = dict(params) if call.op_dtype is None else {**params, "op_dtype": call.op_dtype}
        out = self.collective(rec, local, call.names, None, params)
        self.forget(local)
        if not isinstance(out, torch.Tensor):
            return out
        y = rewrap(x, out, out.shape == local.shape)
        if self.check_vma:
            self.record(y, self.type_of(out), self.unreduced_of(out))
            self.forget(out)
        return y

    def fix_for(self, t: torch.Tensor, extra: frozenset[str]) -> str | None:
        """The fix an out_specs error suggests for ``t``, which varies over the axes ``extra`` its spec does
        not name, where the collective that made it over those axes says one (its record's ``fix``)."""
        source = None if self.sources is None else self.sources.get(t)
        if source is None or not extra <= source[0]:
            return None
        return source[1]

    def issued(self, pending: Pending) -> None:
        """A collective issued in the region with ``async_op=True``: the exit checks it was waited for."""
        self.waiting.append(pending)


def rewrap(x: DTensor, local: torch.Tensor, same: bool) -> DTensor:
    """``local`` as a DTensor with ``x``'s mesh and placements: ``x``'s shape where ``same`` (the local shape
    unchanged), else one from ``local``'s (evenly sharded)."""
    if same:
        return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape,
                                  stride=x.stride())
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False)


def selected(rm: RealizedMesh) -> str:
    """", a selection of (dp, tp)" for a region over a selection of a bigger realized mesh."""
    root = selected_from(rm)
    return "" if root is None else f", a selection of ({', '.join(root.axis_names)})"
