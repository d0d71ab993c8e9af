"""The collectives' call machinery: resolve ``axis``, check a call, send it where it goes, run its steps.

:func:`dispatch` (to a typed region, the open region, or :func:`bind` and the record),
:func:`register` (``op_dtype``, ``async_op``) and :func:`apply_step`: docs/design.md, "Collectives
and autograd"; what each costs: "Eager cost". The records and the public functions are ``_collectives``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial, wraps
from typing import Any, NamedTuple, cast

import torch
from torch.overrides import handle_torch_function, has_torch_function

from . import _steps as S
from . import _torch, _vma
from ._debug import Check, debug_check, is_check_on
from ._errors import MeshError, requires
from ._handle import (Hop, RealizedMesh, check_alive, comm_failure, current_region, hop_of, index_along, recall,
                      remember, resolve_mesh)
from ._mesh import axes_size, axis_position
from ._pending import Pending, Slot
from ._validate import as_bool, as_name_tuple, check_unique

__all__ = ["COLLECTIVES", "COLLECTIVES_BY_NAME", "Axes", "Call", "Collective", "apply_step", "bind", "dispatch",
           "member_error", "plan_hops", "register", "resolve_axes", "run_step"]


# -- resolving axes: validated once per handle ------------------------------------------------------


class Axes(NamedTuple):
    """``axis`` resolved on one realized mesh: names, total size, the groups to talk over, this rank's index.

    ``hops``: the product group when realized, else one group per axis of size > 1 (outermost
    first), or one size-1 hop when every axis has size 1; ``None`` on a rank outside the mesh or
    when an axis has no group (the collective that needs one raises the handle's error).
    ``index``: this rank's index along the axes, first axis major (``None`` outside the mesh).
    """

    names: tuple[str, ...]
    size: int
    hops: tuple[Hop, ...] | None
    index: int | None  # type: ignore[assignment]  # a field named as tuple.index, which it shadows


def resolve_axes(api: str, rm: RealizedMesh, axis: object) -> Axes:
    """``axis`` on ``rm``: checked and planned on first use, then kept on the handle (one dict lookup)."""
    found = recall(rm, axis)  # a list of names is valid, but never kept
    if found is not None:
        return found
    check_alive(rm, api)
    names = as_name_tuple(api, axis, "axis")
    if not names:
        raise MeshError(requires(api, "at least one axis", "axis", names, rm.mesh.axis_names), mesh=rm.mesh)
    for name in names:
        axis_position(rm.mesh, name, api)  # unknown axis: an error with "did you mean"
    check_unique(api, names, "axis")
    size = axes_size(rm, names)
    hops = index = None
    if rm.coordinate is not None:
        index = index_along(rm, names)
        try:
            hops = plan_hops(rm, names, api)
        except MeshError:  # an axis without a group: raised again, by the collective that needs it
            hops = None
    axes = Axes(names, size, hops, index)
    return remember(rm, axis, axes) if isinstance(axis, (str, tuple)) else axes


def plan_hops(rm: RealizedMesh, names: tuple[str, ...], api: str) -> tuple[Hop, ...]:
    if len(names) > 1 and rm.has_group(names):
        return (hop_of(rm, names, api),)
    hops = [hop_of(rm, n, api) for n in names]
    return tuple(h for h in hops if h.size > 1) or tuple(hops[:1])


# -- one call, bound ----------------------------------------------------------------------------------


class Call(NamedTuple):
    """One call of a collective, checked: its mesh, operand, resolved axes and parameters."""

    api: str
    rm: RealizedMesh
    x: Any  # the operand (None for axis_index/axis_size)
    axes: Axes
    params: dict[str, Any]
    traced: bool  # under torch.compile: steps name their groups (functional collectives)
    slot: Slot | None = None  # async_op=True: where the started communication waits (``_pending``)
    op_dtype: torch.dtype | None = None  # communicate and reduce in this dtype, cast back once

    @property
    def names(self) -> tuple[str, ...]:
        return self.axes.names

    def hops(self) -> tuple[Hop, ...]:
        """The groups to talk over; a rank outside the mesh, or an axis without a group, is an error here."""
        hops = self.axes.hops
        if hops is None:
            self.member()
            hops = plan_hops(self.rm, self.axes.names, self.api)  # raises the handle's error
        return hops

    def member(self) -> int:
        """This rank's index along the axes; a rank outside the mesh is an error."""
        index = self.axes.index
        if index is None:
            raise member_error(self.api, self.rm)
        return index

    def group(self, hop: Hop) -> Any:
        """What a step names its group by: the ProcessGroup eagerly, its name under compile (None: size 1);
        under ``compile_on_one_rank`` the name every group of the hop's axes shares (:func:`shared_name`)."""
        if not self.traced:
            return hop.pg
        return shared_name(self.rm, hop) if hop.name is not None and _torch.one_graph_for_all_ranks() else hop.name

    @property
    def one_graph(self) -> bool:
        """Traced under torch's ``compile_on_one_rank``: the graph must be the same on every rank of an axis."""
        return self.traced and _torch.one_graph_for_all_ranks()

    def position(self, hop: Hop | None = None) -> Any:
        """This rank's index along ``hop``'s axes (``None``: the call's axes); under torch.compile with
        ``compile_on_one_rank`` a value of the graph (:func:`run_time_index`), the same graph on every rank."""
        index = self.member() if hop is None else hop.index
        if index is None:
            raise member_error(self.api, self.rm)
        size = self.axes.size if hop is None else hop.size
        if size > 1 and self.one_graph:
            return run_time_index(self.rm, self.names if hop is None else hop.axes)
        return index

    def fail(self, rule: str, name: str, value: object) -> MeshError:
        return MeshError(requires(self.api, rule, name, value), mesh=self.rm.mesh)

    def debug_check(self) -> Check | None:
        """The debug check of this call (``None`` when off): one environment lookup per call."""
        if not is_check_on():
            return None
        rec = COLLECTIVES_BY_NAME.get(self.api)
        describe = rec.describe if rec is not None and rec.describe is not None else None
        return debug_check(self.api, self.rm, self.names, self.traced,
                           (lambda: describe(self)) if describe is not None else str)


# -- one graph for every rank (torch's compile_on_one_rank) ---------------------------------------------
#
# Under the flag, what differs between the ranks of an axis leaves the graph's constants: a rank's
# index along axes is torch's run-time coordinate operator over every group of those axes (a constant
# every rank shares), and a group is named by a name every group of its axes registers on its own
# members (``_torch.shared_group_name``), resolved to the caller's group when the graph runs.


def run_time_index(rm: RealizedMesh, axes: tuple[str, ...]) -> Any:
    """This rank's index along ``axes`` (first axis major), computed when the graph runs: a SymInt."""
    return _torch.run_time_coordinate(_every_group(rm, axes))


@torch.compiler.assume_constant_result
def _every_group(rm: RealizedMesh, axes: tuple[str, ...]) -> list[list[int]]:
    """Every group of ``axes``, each a list of ranks (first axis major): made in Python, a constant of the trace."""
    groups = recall(rm, ("every group", axes))
    if groups is None:
        rows = rm.mesh[axes].groups()
        groups = remember(rm, ("every group", axes), rows.reshape(rows.shape[0], -1).tolist())
    return groups


@torch.compiler.assume_constant_result
def shared_name(rm: RealizedMesh, hop: Hop) -> str:
    """The name of ``hop``'s group that every group of its axes registers under (on its own members)."""
    name = recall(rm, ("shared name", hop.axes))
    if name is None:
        key = hashlib.sha1(f"{rm.backend}:{rm.device_type}:{_every_group(rm, hop.axes)}".encode()).hexdigest()[:16]
        name = _torch.shared_group_name(hop.pg, f"fm:{','.join(hop.axes)}:{key}")
        remember(rm, ("shared name", hop.axes), name)
    return name


def member_error(api: str, rm: RealizedMesh) -> MeshError:
    """The error of a call that needs this rank in the mesh, on a rank outside it."""
    return MeshError(requires(api, "a rank that belongs to the mesh", "rank", rm.rank,
                              f"devices {rm.mesh.device_list.describe()}"), mesh=rm.mesh)


def bind(rec: Collective, x: Any, axis: object, rm: RealizedMesh, params: dict[str, Any],
         traced: bool | None = None) -> Call:
    """Check one call in the order users see its errors: tensor, parameters, axes (the mesh: before)."""
    api = rec.name
    if rec.operand and not isinstance(x, torch.Tensor):
        message = requires(api, "a torch.Tensor", "x", x)
        if api == "psum" and isinstance(x, (int, float)):  # JAX's psum(1, axis_name): the size of the axes
            message += "; for the size of the axes (JAX's psum(1, axis_name)) call fm.axis_size(axis), a Python int"
        raise TypeError(message)
    async_op = params.pop("async_op", False)  # how the call runs, not what it computes: kept out of params
    op_dtype = params.pop("op_dtype", None)
    if rec.check_params is not None:
        params = rec.check_params(api, params)
    if async_op is not False:
        async_op = as_bool(api, "async_op", async_op)
    if op_dtype is not None:
        op_dtype = _op_dtype(api, x, op_dtype)
    if traced is None:
        traced = torch.compiler.is_compiling()
    return Call(api, rm, x, resolve_axes(api, rm, axis), params, traced, Slot() if async_op else None, op_dtype)


def _op_dtype(api: str, x: torch.Tensor, op_dtype: object) -> torch.dtype:
    """``op_dtype``, a dtype of ``x``'s kind (floating-point, complex or integer), else a ``MeshError``."""
    kind = "floating-point" if x.is_floating_point() else "complex" if x.is_complex() else "integer"
    if isinstance(op_dtype, torch.dtype) and op_dtype != torch.bool and (
            op_dtype.is_floating_point == (kind == "floating-point") and op_dtype.is_complex == (kind == "complex")):
        return op_dtype
    valid = "None, " + {"floating-point": "torch.float16, torch.bfloat16, torch.float32, torch.float64",
                        "complex": "torch.complex64, torch.complex128",
                        "integer": "torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64"}[kind]
    article = "an" if kind == "integer" else "a"
    raise MeshError(requires(api, f"op_dtype=None or {article} {kind} torch.dtype for x of dtype {x.dtype} (the "
                             "dtype to communicate and reduce in)", "op_dtype", op_dtype, valid))


# -- the record ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Collective:
    """Everything about one collective.

    ``run`` carries out a bound call: its forward steps, each with its backward step (the
    autograd rule), size-1 axes as local steps, and the debug check before each step that
    communicates. ``rule`` types it in a typed region (``_vma.CollectiveRule``: from the operand's
    :class:`~functional_mesh._vma.AxisTypes`, pending sums included, the axes and the parameters;
    ``None``: the result is no tensor and has no type); ``untyped`` is JAX's convention
    in an untyped region (``None``: ``run`` as it is). ``region_dtype``: a region returns the
    result as a 0-d tensor of this dtype (``axis_index``: a value that varies over its axes).
    """

    name: str
    operand: bool  # takes a tensor ``x`` first
    run: Callable[[Call], Any]
    rule: _vma.CollectiveRule | None
    check_params: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    untyped: Callable[[Call], Any] | None = None
    region_dtype: torch.dtype | None = None
    describe: Callable[[Call], str] | None = None  # the parameters, as the debug check and messages show them
    # the fix an out_specs error suggests for a result of this call that varies over the call's axes, where the
    # generic one (psum or all_gather over them) would mislead: (axes, params) -> the fix, or None (generic)
    fix: Callable[[tuple[str, ...], dict[str, Any]], str | None] | None = None


COLLECTIVES: dict[Any, Collective] = {}  # public function -> its record (filled by register, at import)
COLLECTIVES_BY_NAME: dict[str, Collective] = {}  # its name -> its record


def dispatch(rec: Collective, public: Callable[..., Any], x: Any, axis: object, mesh: Any,
             params: dict[str, Any]) -> Any:
    """One public call: a torch function mode (a typed region) or a tensor subclass sees it as one op;
    else the open region (an untyped one) handles it; else the record runs."""
    if rec.operand:
        if has_torch_function((x,)) or _mode_active():
            return handle_torch_function(public, (x,), x, axis, mesh=mesh, **params)
    elif _mode_active():
        return handle_torch_function(public, (), axis, mesh=mesh, **params)
    traced = torch.compiler.is_compiling()
    region = current_region(traced)
    if region is not None:
        return region.collective(rec, x, axis, mesh, params)
    return rec.run(bind(rec, x, axis, resolve_mesh(rec.name, mesh), params, traced))


_mode_active = _torch.torch_function_mode_active


def register(public: Callable[..., Any], rec: Collective) -> Collective:
    """Enter ``rec`` in the table, its functions taking the call's ``op_dtype`` and ``async_op`` (:func:`_issuable`)."""
    rec = replace(rec, run=_issuable(rec.run), untyped=None if rec.untyped is None else _issuable(rec.untyped))
    COLLECTIVES[public] = COLLECTIVES_BY_NAME[rec.name] = rec
    return rec


def _issuable(fn: Callable[[Call], Any]) -> Callable[[Call], Any]:
    """``fn`` (a record's function) as every call runs it: in ``op_dtype`` (cast back once) and, with
    ``async_op=True``, issued: a :class:`Pending` whose ``wait()`` gives what ``fn`` returns."""
    def run(call: Call) -> Any:
        if call.slot is None and call.op_dtype is None:  # the common call: one more frame, nothing else
            return fn(call)
        return _issue(fn, call)

    return wraps(fn)(run)


def _issue(fn: Callable[[Call], Any], call: Call) -> Any:
    dtype = None
    if call.op_dtype is not None and call.op_dtype != call.x.dtype:  # cast here, once, also for a pending call
        dtype = call.x.dtype
        call = call._replace(x=call.x.to(call.op_dtype))
    if call.slot is None:
        out = fn(call)
        return out if dtype is None else out.to(dtype)
    pending = Pending(fn, call, dtype)
    region = current_region(call.traced)
    if region is not None:  # it checks, when its function returns, that every one was waited for
        region.issued(pending)
    return pending


def apply_step(call: Call, check: Check | None, x: torch.Tensor, step: S.Step, hop: Hop) -> torch.Tensor:
    """One step of ``call`` over ``hop``, with its transpose backward.

    Eagerly, with no check and no gradient to send back through communication, the step runs as
    it is: ``AllReduce``'s buffer is a clone, whose gradient is its transpose (the identity).
    Otherwise (compiling, debug check, or a transpose that communicates) one autograd node pairs
    the step with its transpose.
    """
    bound = partial(check, axes=hop.axes, group=hop.pg) if check is not None and hop.size > 1 else None
    if call.traced:
        if call.slot is not None and hop.size > 1 and not step.local:  # a step that communicates can start
            step = call.slot.take(x, cast(S.AsyncStep, step), bound)
        return S.Comm.apply(x, step, bound)
    try:  # eagerly, a failed communication names its axis, group and timeout (torch's error chained)
        if call.slot is not None and hop.size > 1 and not step.local:  # async_op=True: started, or arrived
            step = call.slot.take(x, cast(S.AsyncStep, step), bound)
        if bound is not None or (x.requires_grad and torch.is_grad_enabled() and not step.grad_by_torch):
            return S.Comm.apply(x, step, bound)
        return step.run(x)
    except RuntimeError as exc:
        raise comm_failure(call.api, hop, x.device.type, exc) from exc


def run_step(call: Call, x: torch.Tensor, step: S.Step, hop: Hop) -> torch.Tensor:
    """One step of ``call`` over ``hop``, with its transpose, as the collectives run theirs (no debug
    check): for the region boundary's own steps (``_boundary``: a full argument's local block)."""
    return apply_step(call, None, x, step, hop)
