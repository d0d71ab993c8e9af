"""Collectives by axis name over a realized mesh, with JAX's autograd rules.

Tensors in, new tensors out. ``axis`` is one axis name or a tuple of names (their product,
first name major). Chunk order is mesh order: realize creates every group with its members in
mesh order, so group rank ``i`` is coordinate ``i`` along the axis.

Autograd (our own functions, the same on every supported torch), with replicated cotangents
as in Megatron: ``psum`` backward is the identity ("g"), ``pvary`` is the identity forward
and ``psum`` backward ("f"), ``pmean`` is ``psum / n``, ``all_gather`` and ``psum_scatter`` are
each other's transposes, ``all_to_all`` backward is the inverse all-to-all and ``ppermute``
backward is the inverse permutation.

A tuple of axes uses the product group when the cache holds it (``realize(mesh,
products=[axes])``); otherwise ``psum``/``pvary`` go axis by axis, ``all_gather`` innermost axis
first, ``psum_scatter`` outermost first, ``ppermute`` point to point. ``all_to_all`` over a tuple
needs the product group. A collective never creates a group.

A size-1 axis has no group (realize makes none) and costs no communication: it is left out of a
tuple's plan (it changes no index), and a collective over size-1 axes only is one local step
(a copy; zeros for a ``ppermute`` that sends nothing), with the same values and gradients.

Debug mode (off by default): with ``FUNCTIONAL_MESH_CHECK_COLLECTIVES=1`` in the environment (read
at every call), each communication first compares, among the members of the group it is about to
use, what every member asks for (operation, axes, mesh, tensor shape and dtype), through the
default store with realize's bounded wait (``$FUNCTIONAL_MESH_CHECK_TIMEOUT``, default 60 s), and
raises ``MeshError`` on every member that got there when they differ or one does not arrive.
``=mesh`` compares among every device of the mesh instead: it also catches a rank whose program
uses another axis than the rest of the mesh, but needs every rank of the mesh to make the same
sequence of collectives (SPMD). Off, the cost is one environment lookup per call.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import handle_torch_function, has_torch_function

from . import _torch
from ._agree import _agree, _next_call
from ._errors import MeshError, requires
from ._handle import Hop, RealizedMesh, hop_of, index_along, resolve_mesh
from ._mesh import axis_position
from ._realize_plan import check_timeout_seconds
from ._validate import as_bool, as_dim, as_int, as_name_tuple, check_unique

__all__ = ["all_gather", "all_to_all", "as_gather_target", "axis_index", "axis_size", "Call",
           "CHECK_COLLECTIVES_ENV", "check_pcast_target", "local_block", "NO_TENSOR", "pcast", "pmean", "ppermute", "psum",
           "psum_scatter", "pvary", "resolve_call"]

CHECK_COLLECTIVES_ENV = "FUNCTIONAL_MESH_CHECK_COLLECTIVES"
_CHECK_MODES = {"1": "group", "group": "group", "mesh": "mesh"}  # setting -> participants


# -- one preamble for every collective -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One public collective call, resolved: its mesh, operand and axes, validated in one place.

    ``groups()`` is the communication plan: the product group when the cache holds it, else one
    group per axis (outermost first).
    """

    api: str
    rm: RealizedMesh
    x: torch.Tensor | None
    names: tuple[str, ...]
    tiled: bool

    def member(self) -> None:
        """Raise unless this rank belongs to the mesh."""
        rm = self.rm
        if rm.coordinate is None:
            raise MeshError(requires(self.api, "a rank that belongs to the mesh", "rank", rm.rank,
                                     f"devices {rm.mesh.device_list.describe()}"), mesh=rm.mesh)

    def groups(self) -> list[Hop]:
        """The groups to talk over: the product group when realized, else one per axis (outermost first).

        Size-1 axes are left out (their index is 0: the others' indices and order are unchanged);
        when every axis has size 1, one size-1 hop remains, which ``_run`` carries out locally.
        """
        self.member()
        rm, names = self.rm, self.names
        if len(names) > 1 and rm.has_group(names):
            return [hop_of(rm, names, self.api)]
        hops = [hop_of(rm, n, self.api) for n in names]
        return [h for h in hops if h.size > 1] or hops[:1]

    def size(self) -> int:
        size = 1
        for n in self.names:
            size *= self.rm.axis_size(n)
        return size

    def fail(self, rule: str, name: str, value: object) -> MeshError:
        return MeshError(requires(self.api, rule, name, value), mesh=self.rm.mesh)


NO_TENSOR = object()  # resolve_call's x for the collectives that take no tensor


def resolve_call(api: str, x: object, axis: object, mesh: object, tiled: object = True) -> Call:
    """Validate a call in the order users see its errors: mesh, tensor, ``tiled``, axes."""
    rm = resolve_mesh(api, mesh)
    if x is not NO_TENSOR and not isinstance(x, torch.Tensor):
        raise TypeError(requires(api, "a torch.Tensor", "x", x))
    tiled = as_bool(api, "tiled", tiled)
    names = as_name_tuple(api, axis, "axis")
    if not names:
        raise MeshError(requires(api, "at least one axis", "axis", names, rm.mesh.axis_names), mesh=rm.mesh)
    for name in names:
        axis_position(rm.mesh, name, api)  # unknown axis: an error with "did you mean"
    check_unique(api, names, "axis")
    return Call(api, rm, None if x is NO_TENSOR else x, names, tiled)


# -- the opt-in debug check (FUNCTIONAL_MESH_CHECK_COLLECTIVES) -----------------------------------


class _Check:
    """Agreement before each communication of one public collective call (debug mode only).

    Built per call when the mode is on; the autograd functions keep it for their backward.
    """

    def __init__(self, api: str, rm: Any, names: tuple[str, ...], mode: str, setting: str, params: str) -> None:
        self.api, self.rm, self.names, self.mode, self.params = api, rm, names, mode, params
        self.setting = setting
        self.wait_s = check_timeout_seconds(True, os.environ, api)

    def __call__(self, x: torch.Tensor, axes: tuple[str, ...], *, members: Sequence[int] | None = None,
                 group: Any = None, backward: bool = False) -> None:
        """Agree on the step over ``axes`` (``members``, or the members of ``group``) that sends ``x``."""
        rm = self.rm
        if self.mode == "mesh":
            devices = rm.mesh.device_list
            participants = devices.to_array().tolist()
            space, where = f"mesh/{devices.digest()}", f"mesh devices {devices.describe()}"
            rule = "every device of the mesh to make the same sequence of collective calls"
        else:
            participants = list(members) if members is not None else dist.get_process_group_ranks(group)
            text = ",".join(map(str, participants))
            space = "group/" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]
            where = f"group {participants}" if len(participants) <= 16 else f"a group of {len(participants)} ranks"
            rule = "every member of the group to make the same collective call"
        if len(participants) < 2:  # nobody to disagree with
            return
        n = _next_call(space)
        over = "" if axes == self.names else f", step over {axes!r}"
        step = f"backward of {self.api}" if backward else self.api
        request = (f"{step}(axis={self.names!r}{self.params}{over}) on {rm.mesh!r} with "
                   f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}")
        _agree(self.api, f"{rule} ({CHECK_COLLECTIVES_ENV}={self.setting})", f"collective call #{n} of {where}",
               f"functional_mesh/collective/{space}/{n}", participants, rm.rank, request, self.wait_s)


def _check(call: Call, params: str = "") -> _Check | None:
    """The debug check of one call, or ``None`` when the mode is off (one environment lookup)."""
    api, rm, names = call.api, call.rm, call.names
    setting = os.environ.get(CHECK_COLLECTIVES_ENV)
    if not setting or setting == "0":
        return None
    if setting not in _CHECK_MODES:
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} to be a known mode", CHECK_COLLECTIVES_ENV, setting,
                                 "'0' (off), '1' or 'group' (each group's members agree), 'mesh' (the whole "
                                 "mesh agrees)"), mesh=rm.mesh)
    if rm.backend == "fake":  # fake collectives carry no data: nothing to compare
        return None
    if torch.compiler.is_compiling():  # the agreement talks to the store: it cannot be part of a graph
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} off under torch.compile (the collective check runs "
                                 "in eager mode only)", CHECK_COLLECTIVES_ENV, setting, "'0' or unset")
                        + "; run the program eagerly to check it, then compile it with the check off", mesh=rm.mesh)
    return _Check(api, rm, names, _CHECK_MODES[setting], setting, params)


# -- one step of communication, and its autograd function ---------------------------------------------
#
# A step is a tuple of constants: its kind, then the group *name* and plain ints. torch.compile
# traces an autograd.Function whose arguments are tensors and constants, and torch's functional
# collectives (``torch.ops._c10d_functional``, reached through ``_torch``) take groups by name;
# so every collective below traces without a graph break. The debug check is a Python callable
# and exists only in eager mode (``_check`` refuses it under compile).


def _run(step: tuple | None, x: torch.Tensor) -> torch.Tensor:
    """Carry out one step on ``x`` (``None``: the identity, as a new tensor)."""
    if step is None:
        return x.view_as(x)
    kind = step[0]
    if kind != "slice" and step[1] is None:  # a size-1 hop has no group: one member, nothing to send
        # all_reduce, gather, scatter, exchange over one member give x itself, in a new buffer as
        # the collective would; a permute gives x when (0, 0) is a pair, else zeros
        return torch.zeros_like(x) if kind == "permute" and not step[4] else x.clone()
    if kind == "all_reduce":
        return _torch.all_reduce(x, step[1])
    if kind == "gather":  # every member's x along dim, in group-rank (= mesh) order
        _, name, n, dim = step
        return _torch.all_gather(x.movedim(dim, 0).contiguous(), n, name).movedim(0, dim)
    if kind == "scatter":  # the sum over members, this member's 1/n block of dim
        _, name, n, dim = step
        return _torch.reduce_scatter(x.movedim(dim, 0).contiguous(), n, name).movedim(0, dim)
    if kind == "slice":  # this member's 1/n block of dim, without communication
        _, n, dim, index = step
        size = x.shape[dim] // n
        return x.narrow(dim, index * size, size).clone(memory_format=torch.contiguous_format)  # never a view
    if kind == "exchange":  # chunk i of split_dim to member i; arrivals concatenated on concat_dim
        _, name, n, split_dim, concat_dim = step
        chunks = x.movedim(split_dim, 0)
        chunks = chunks.reshape(n, chunks.shape[0] // n, *chunks.shape[1:]).contiguous()
        out = _torch.all_to_all(chunks, [1] * n, [1] * n, name)  # out[j]: member j's chunk for us
        return torch.cat([out[j].movedim(0, split_dim) for j in range(n)], dim=concat_dim)
    if kind == "permute":  # send to d for (me, d), receive from s for (s, me); nothing received: zeros
        _, name, n, me, pairs = step
        dest = [d for src, d in pairs if src == me] or [me]  # a rank with nothing to send sends to itself,
        source = [src for src, d in pairs if d == me]  # so no rank's buffer is empty (torch's fake backend
        flat = x.reshape(-1)  # refuses an empty one); that block is dropped below
        numel = flat.numel()
        sent = [numel if j == dest[0] else 0 for j in range(n)]
        got = [numel * ((j in source) + (j == me and dest[0] == me and me not in source)) for j in range(n)]
        out = _torch.all_to_all(flat, got, sent, name)
        if not source:
            return torch.zeros_like(x)
        start = sum(got[:source[0]])
        return out[start:start + numel].reshape(x.shape)
    raise AssertionError(f"unknown step {kind!r}")  # pragma: no cover - the steps are ours


class _Comm(torch.autograd.Function):
    """``forward`` then ``backward`` steps as one autograd node; ``check`` (eager debug mode) runs
    before each side that communicates."""

    @staticmethod
    def forward(ctx, x, forward, backward, check):
        ctx.backward, ctx.check = backward, check
        if check is not None and forward is not None:
            check(x, backward=False)
        return _run(forward, x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward is None:
            return grad, None, None, None
        if ctx.check is not None:
            ctx.check(grad, backward=True)
        return _run(ctx.backward, grad), None, None, None


def _apply(x: torch.Tensor, forward: tuple | None, backward: tuple | None, check: Any, hop: Hop) -> torch.Tensor:
    # a size-1 hop communicates nothing, so there is nothing to agree on (and no group to ask)
    bound = partial(check, axes=hop.axes, group=hop.pg) if check is not None and hop.size > 1 else None
    return _Comm.apply(x, forward, backward, bound)


def _send_recv(x: torch.Tensor, members: list[int], me: int, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """Point to point on global ranks (a tuple without its product group; eager only)."""
    src = x.contiguous()
    out = torch.zeros_like(src)  # contiguous too: gloo receives only into contiguous tensors
    ops = []
    for s, d in pairs:
        if s == me and d == me:
            out = src.clone()
        elif s == me:
            ops.append(dist.P2POp(dist.isend, src, members[d]))
        elif d == me:
            ops.append(dist.P2POp(dist.irecv, out, members[s]))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return out


class _P2P(torch.autograd.Function):
    """ppermute over a tuple of axes without its product group: point to point (eager only)."""

    @staticmethod
    def forward(ctx, x, members, me, pairs, check):
        ctx.members, ctx.me, ctx.pairs, ctx.check = members, me, pairs, check
        if check is not None:
            check(x, backward=False)
        return _send_recv(x, members, me, pairs)

    @staticmethod
    def backward(ctx, grad):
        if ctx.check is not None:
            ctx.check(grad, backward=True)
        return _send_recv(grad, ctx.members, ctx.me, [(d, s) for s, d in ctx.pairs]), None, None, None, None


# -- public API ----------------------------------------------------------------------------------


def _routed(x: object) -> bool:
    """Whether a torch function mode (a shard_map region) or a tensor subclass should see this call.

    Eagerly ``has_torch_function`` answers both; torch.compile answers it for subclasses only,
    so the mode stack is asked too.
    """
    return has_torch_function((x,)) or _torch.torch_function_mode_active()


def _psum(call: Call) -> torch.Tensor:
    x, groups = call.x, call.groups()
    check = _check(call)
    for hop in groups:
        x = _apply(x, ("all_reduce", hop.name), None, check, hop)
    return x


def psum(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Sum ``x`` over ``axis``; backward is the identity (the result is replicated over ``axis``)."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(psum, (x,), x, axis, mesh=mesh)
    return _psum(resolve_call("psum", x, axis, mesh))


def pmean(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``axis``: ``psum(x) / n``."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(pmean, (x,), x, axis, mesh=mesh)
    call = resolve_call("pmean", x, axis, mesh)
    return _psum(call) / call.size()


def pvary(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Identity forward, ``psum`` backward: mark a replicated value entering ``axis``-varying compute."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(pvary, (x,), x, axis, mesh=mesh)
    call = resolve_call("pvary", x, axis, mesh)
    x, groups = call.x, call.groups()
    check = _check(call)
    for hop in groups:
        x = _apply(x, None, ("all_reduce", hop.name), check, hop)
    return x


def all_gather(x: torch.Tensor, axis: str | Sequence[str], *, dim: int = 0, tiled: bool = True,
               to: str = "varying", mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Every member's ``x`` along ``dim`` in mesh order: concatenated (``tiled``) or stacked at ``dim``.

    ``to="varying"`` (the default): backward is ``psum_scatter`` (each member's cotangent may
    differ). ``to="invariant"`` (JAX's spelling ``"invarying"`` too): the result is the same on
    every member, so is its cotangent, and backward keeps this member's slice (no communication).
    """
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(all_gather, (x,), x, axis, dim=dim, tiled=tiled, to=to, mesh=mesh)
    call = resolve_call("all_gather", x, axis, mesh, tiled)
    invariant = as_gather_target(call.api, to) == "invariant"
    x, groups = call.x, call.groups()
    if not call.tiled:
        x = x.unsqueeze(as_dim(call.api, x.ndim + 1, dim))
    d = as_dim(call.api, x.ndim, dim)
    check = _check(call, f", dim={d}, tiled={call.tiled}" + (", to='invariant'" if invariant else ""))
    for hop in reversed(groups):  # innermost axis first: the outermost ends up major
        back = ("slice", hop.size, d, hop.index) if invariant else ("scatter", hop.name, hop.size, d)
        x = _apply(x, ("gather", hop.name, hop.size, d), back, check, hop)
    return x


def psum_scatter(x: torch.Tensor, axis: str | Sequence[str], *, dim: int = 0, tiled: bool = True,
                 mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Sum over ``axis`` and keep this member's block of ``dim`` (mesh order); untiled drops ``dim``."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(psum_scatter, (x,), x, axis, dim=dim, tiled=tiled, mesh=mesh)
    call = resolve_call("psum_scatter", x, axis, mesh, tiled)
    x, groups = call.x, call.groups()
    d = as_dim(call.api, x.ndim, dim)
    n = call.size()
    if (x.shape[d] != n) if not call.tiled else (x.shape[d] % n):
        rule = f"dim {d} of size {n} (tiled=False)" if not call.tiled else f"dim {d} divisible by {n}"
        raise call.fail(rule, f"x.shape[{d}]", x.shape[d])
    check = _check(call, f", dim={d}, tiled={call.tiled}")
    for hop in groups:  # outermost axis first
        x = _apply(x, ("scatter", hop.name, hop.size, d), ("gather", hop.name, hop.size, d), check, hop)
    return x if call.tiled else x.squeeze(d)


def all_to_all(x: torch.Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int, *,
               tiled: bool = True, mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Split ``split_dim`` into one block per member, send block ``i`` to member ``i``, and
    concatenate what arrives along ``concat_dim`` (mesh order). Untiled: ``split_dim`` must have
    size ``n`` and is removed; a new ``concat_dim`` of size ``n`` stacks the arrivals."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(all_to_all, (x,), x, axis, split_dim, concat_dim, tiled=tiled, mesh=mesh)
    call = resolve_call("all_to_all", x, axis, mesh, tiled)
    x, groups = call.x, call.groups()
    n = call.size()
    s, c = as_dim(call.api, x.ndim, split_dim, "split_dim"), as_dim(call.api, x.ndim, concat_dim, "concat_dim")
    if not call.tiled:
        if x.shape[s] != n:
            raise call.fail(f"split_dim of size {n} (tiled=False)", f"x.shape[{s}]", x.shape[s])
        # stack at output position c: insert the new axis so that it lands at c once the
        # (size-1) split axis is squeezed away
        q, s_y = (c, s + 1) if c <= s else (c + 1, s)
        return all_to_all(x.unsqueeze(q), call.names, s_y, q, mesh=call.rm).squeeze(s_y)
    if x.shape[s] % n:
        raise call.fail(f"split_dim divisible by {n}", f"x.shape[{s}]", x.shape[s])
    if len(groups) > 1:
        return _all_to_all_composed(call, groups, s, c)
    (hop,) = groups
    check = _check(call, f", split_dim={s}, concat_dim={c}")
    return _apply(x, ("exchange", hop.name, n, s, c), ("exchange", hop.name, n, c, s), check, hop)


def _all_to_all_composed(call: Call, hops: list[Hop], s: int, c: int) -> torch.Tensor:
    """A tuple all-to-all without its product group: one untiled exchange per axis, first axis major
    (``hops``: one per axis of size > 1; a size-1 axis changes no destination).

    ``split_dim`` becomes one dim per axis (destination coordinates, outermost first); the
    exchange over axis ``i`` turns dim ``i`` from "to whom" into "from whom", so after the last
    one the blocks stand in sender order, major first, as the product group would deliver them.
    Autograd composes: each step is an all-to-all with its own inverse.
    """
    x = call.x
    sizes = [hop.size for hop in hops]
    front = x.movedim(s, 0)
    y = front.reshape(*sizes, front.shape[0] // math.prod(sizes), *front.shape[1:])
    for i, hop in enumerate(hops):
        y = all_to_all(y, hop.axes[0], i, i, tiled=False, mesh=call.rm)
    blocks = y.flatten(0, len(sizes) - 1).movedim(1, s + 1)  # (n, *x's dims with split_dim cut to one block)
    return blocks.movedim(0, c).flatten(c, c + 1)


def pcast(x: torch.Tensor, axis: str | Sequence[str], *, to: str = "varying",
          mesh: RealizedMesh | None = None) -> torch.Tensor:
    """JAX's ``pcast``: ``to="varying"`` is :func:`pvary` (the only target supported)."""
    if _routed(x):
        return handle_torch_function(pcast, (x,), x, axis, to=to, mesh=mesh)
    check_pcast_target(to)
    return pvary(x, axis, mesh=mesh)


def check_pcast_target(to: object) -> None:
    """``pcast``'s ``to=``: only "varying" is supported."""
    if to != "varying":
        raise MeshError(requires("pcast", "a supported target", "to", to, "'varying'"))


def as_gather_target(api: str, to: object) -> str:
    """``all_gather``'s ``to=``: "varying" or "invariant" (JAX's "invarying" accepted)."""
    if to in ("invariant", "invarying"):
        return "invariant"
    if to != "varying":
        raise MeshError(requires(api, "a gather target", "to", to, "'varying', 'invariant' (or 'invarying')"))
    return "varying"


def ppermute(x: torch.Tensor, axis: str | Sequence[str], perm: Sequence[tuple[int, int]], *,
             mesh: RealizedMesh | None = None) -> torch.Tensor:
    """Send ``x`` from axis index ``s`` to ``d`` for each ``(s, d)`` in ``perm``; ranks that
    receive nothing get zeros. Backward sends gradients along the inverse permutation."""
    if _routed(x):  # a shard_map region (or a tensor subclass) types this call as one op
        return handle_torch_function(ppermute, (x,), x, axis, perm, mesh=mesh)
    call = resolve_call("ppermute", x, axis, mesh)
    call.member()
    pairs = tuple(_permutation(call, perm))
    check = _check(call, f", perm={list(pairs)}")
    groups, me = call.groups(), _axis_index(call)
    if len(groups) == 1:  # one axis, or the product group: one all-to-all with empty blocks (traces)
        (hop,) = groups
        inverse = tuple((d, s) for s, d in pairs)
        forward, backward = ("permute", hop.name, hop.size, me, pairs), ("permute", hop.name, hop.size, me, inverse)
        return _apply(call.x, forward, backward, check, hop)
    if torch.compiler.is_compiling():
        rule = "under torch.compile, one axis or a tuple whose product group was realized"
        raise MeshError(requires(call.api, rule, "axis", call.names) + f"; pass products=[{call.names!r}] to realize",
                        mesh=call.rm.mesh)
    members = call.rm.mesh[call.names].group_of(call.rm.rank).reshape(-1).tolist()
    bound = partial(check, axes=call.names, members=members) if check is not None else None
    return _P2P.apply(call.x, members, me, list(pairs), bound)


def local_block(x: torch.Tensor, axis: str | Sequence[str], dim: int, *, mesh: RealizedMesh) -> torch.Tensor:
    """This rank's block of ``x`` along ``dim`` over ``axis`` (a tuple: first axis major), without
    communication; backward gathers the cotangent (the transpose of ``all_gather(to="invariant")``).

    shard_map's boundary: a full tensor enters a region as its local block (``dim``: a valid,
    non-negative dim; the boundary's plan checked it).
    """
    call = resolve_call("shard_map", x, axis, mesh)
    x = call.x
    for hop in call.groups():  # outermost first; backward gathers innermost first
        x = _apply(x, ("slice", hop.size, dim, hop.index), ("gather", hop.name, hop.size, dim), None, hop)
    return x


def _permutation(call: Call, perm: object) -> list[tuple[int, int]]:
    """``perm`` as (source, destination) pairs of axis indices, each end used at most once."""
    n = call.size()
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Iterable):
        raise TypeError(requires(call.api, "an iterable of (source, destination) pairs", "perm", perm))
    pairs = []
    for pair in perm:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(requires(call.api, "(source, destination) pairs", "pair", pair))
        s, d = (as_int(call.api, "axis index", v) for v in pair)
        if not (0 <= s < n and 0 <= d < n):
            raise call.fail(f"axis indices in 0..{n - 1}", "pair", (s, d))
        pairs.append((s, d))
    for what, ends in (("source", [s for s, _ in pairs]), ("destination", [d for _, d in pairs])):
        if len(set(ends)) != len(ends):
            raise call.fail(f"each {what} at most once (a permutation)", "perm", tuple(pairs))
    return pairs


def _axis_index(call: Call) -> int:
    call.member()
    return index_along(call.rm, call.names)


def axis_index(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """This rank's index along ``axis`` (a tuple: row-major, first axis major). No communication.

    Inside a ``shard_map`` region it is a 0-d int32 tensor that varies over ``axis`` (as in JAX).
    """
    if _torch.torch_function_mode_active():
        return handle_torch_function(axis_index, (), axis, mesh=mesh)
    return _axis_index(resolve_call("axis_index", NO_TENSOR, axis, mesh))


def axis_size(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """The size of ``axis`` (a tuple: the product). No communication."""
    if _torch.torch_function_mode_active():
        return handle_torch_function(axis_size, (), axis, mesh=mesh)
    return resolve_call("axis_size", NO_TENSOR, axis, mesh).size()
