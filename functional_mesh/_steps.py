"""The collectives' steps: one communication each, the autograd nodes that pair them, and the debug check.

A step is a tuple of constants: its kind, its group (a ProcessGroup eagerly, the group's *name*
under torch.compile, ``None`` for a size-1 hop with no group) and plain ints. :func:`run` carries
one out through ``_torch`` (c10d directly when the group is a ProcessGroup, torch's functional
collectives when it is a name). :class:`Comm` pairs a forward step with its backward step as one
autograd node of tensors and constants, which torch.compile traces whole; :class:`P2P` is the
point-to-point fallback of ``ppermute`` over a tuple without its product group (eager only).
The records of ``_collectives`` say which steps each collective makes.

The debug check (``FUNCTIONAL_MESH_CHECK_COLLECTIVES``, off by default) compares what the members
of a group ask for before each step communicates; see ``_collectives``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import _torch
from ._agree import _agree, _next_call
from ._errors import MeshError, requires
from ._realize_plan import check_timeout_seconds

__all__ = ["CHECK_COLLECTIVES_ENV", "Check", "Comm", "P2P", "debug_check", "run", "send_recv"]

CHECK_COLLECTIVES_ENV = "FUNCTIONAL_MESH_CHECK_COLLECTIVES"
_CHECK_MODES = {"1": "group", "group": "group", "mesh": "mesh"}  # setting -> participants


# -- the opt-in debug check (FUNCTIONAL_MESH_CHECK_COLLECTIVES) -----------------------------------


class Check:
    """Agreement before each communication of one public collective call (debug mode only).

    Built per call when the mode is on; the autograd functions keep it for their backward.
    """

    def __init__(self, api: str, rm: Any, names: tuple[str, ...], params: str, mode: str, setting: str) -> None:
        self.api, self.rm, self.names, self.params, self.mode, self.setting = api, rm, names, params, mode, setting
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


# The debug setting is read at every call, from os.environ's own mapping where it has one (CPython:
# bytes keys on POSIX): a dict lookup, where os.environ.get encodes the key first (~1 us).
_ENVIRON = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(CHECK_COLLECTIVES_ENV) if _ENVIRON is not None else None


def _setting() -> str | None:
    if _ENVIRON is None:
        return os.environ.get(CHECK_COLLECTIVES_ENV)
    raw = _ENVIRON.get(_ENV_KEY)
    return None if raw is None else os.environ.decodevalue(raw)


def debug_check(api: str, rm: Any, names: tuple[str, ...], traced: bool, params: Callable[[], str]) -> Check | None:
    """The debug check of one call, or ``None`` when the mode is off (one environment lookup).

    ``params``: the call's parameters as the check compares them (made only when the mode is on).
    """
    setting = _setting()
    if not setting or setting == "0":
        return None
    if setting not in _CHECK_MODES:
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} to be a known mode", CHECK_COLLECTIVES_ENV, setting,
                                 "'0' (off), '1' or 'group' (each group's members agree), 'mesh' (the whole "
                                 "mesh agrees)"), mesh=rm.mesh)
    if rm.backend == "fake":  # fake collectives carry no data: nothing to compare
        return None
    if traced:  # the agreement talks to the store: it cannot be part of a graph
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} off under torch.compile (the collective check runs "
                                 "in eager mode only)", CHECK_COLLECTIVES_ENV, setting, "'0' or unset")
                        + "; run the program eagerly to check it, then compile it with the check off", mesh=rm.mesh)
    return Check(api, rm, names, params(), _CHECK_MODES[setting], setting)


# -- steps: one communication each, and the autograd node that pairs them --------------------------
#
# A step is a tuple: its kind, its group (a ProcessGroup eagerly, the group's name under compile,
# None for a size-1 hop) and plain ints. torch.compile traces an autograd.Function whose arguments
# are tensors and constants, and torch's functional collectives take groups by name; so every
# collective traces without a graph break. The debug check exists only in eager mode.


def run(step: tuple | None, x: torch.Tensor) -> torch.Tensor:
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
        _, group, n, dim = step
        if dim == 0:
            return _torch.all_gather(x.contiguous(), n, group)
        return _torch.all_gather(x.movedim(dim, 0).contiguous(), n, group).movedim(0, dim)
    if kind == "scatter":  # the sum over members, this member's 1/n block of dim
        _, group, n, dim = step
        if dim == 0:
            return _torch.reduce_scatter(x.contiguous(), n, group)
        return _torch.reduce_scatter(x.movedim(dim, 0).contiguous(), n, group).movedim(0, dim)
    if kind == "slice":  # this member's 1/n block of dim, without communication
        _, n, dim, index = step
        size = x.shape[dim] // n
        return x.narrow(dim, index * size, size).clone(memory_format=torch.contiguous_format)  # never a view
    if kind == "exchange":  # chunk i of split_dim to member i; arrivals concatenated on concat_dim
        _, group, n, split_dim, concat_dim = step
        chunks = x.movedim(split_dim, 0)
        chunks = chunks.reshape(n, chunks.shape[0] // n, *chunks.shape[1:]).contiguous()
        out = _torch.all_to_all(chunks, [1] * n, [1] * n, group)  # out[j]: member j's chunk for us
        if split_dim == 0 and concat_dim == 0:
            return out.flatten(0, 1)
        # out[j] is member j's block with split_dim in front: put it back, then lay the blocks
        # side by side along concat_dim (member order)
        return out.movedim(1, split_dim + 1).movedim(0, concat_dim).flatten(concat_dim, concat_dim + 1)
    if kind == "ragged":  # rows of dim 0 by split sizes: sent[j] rows to member j, got[j] from member j
        _, group, sent, got = step
        return _torch.all_to_all(x.contiguous(), list(got), list(sent), group)
    if kind == "permute":  # send to d for (me, d), receive from s for (s, me); nothing received: zeros
        _, group, n, me, pairs = step
        dest = [d for src, d in pairs if src == me] or [me]  # a rank with nothing to send sends to itself,
        source = [src for src, d in pairs if d == me]  # so no rank's buffer is empty (torch's fake backend
        flat = x.reshape(-1)  # refuses an empty one); that block is dropped below
        numel = flat.numel()
        sent = [numel if j == dest[0] else 0 for j in range(n)]
        got = [numel * ((j in source) + (j == me and dest[0] == me and me not in source)) for j in range(n)]
        out = _torch.all_to_all(flat.contiguous(), got, sent, group)
        if not source:
            return torch.zeros_like(x)
        start = sum(got[:source[0]])
        return out[start:start + numel].reshape(x.shape)
    raise AssertionError(f"unknown step {kind!r}")  # pragma: no cover - the steps are ours


class Comm(torch.autograd.Function):
    """``forward`` then ``backward`` steps as one autograd node; ``check`` (eager debug mode) runs
    before each side that communicates."""

    @staticmethod
    def forward(ctx, x, forward, backward, check):
        ctx.backward, ctx.check = backward, check
        if check is not None and forward is not None:
            check(x, backward=False)
        return run(forward, x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward is None:
            return grad, None, None, None
        if ctx.check is not None:
            ctx.check(grad, backward=True)
        return run(ctx.backward, grad), None, None, None


def send_recv(x: torch.Tensor, members: list[int], me: int, pairs: list[tuple[int, int]]) -> torch.Tensor:
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


class P2P(torch.autograd.Function):
    """ppermute over a tuple of axes without its product group: point to point (eager only)."""

    @staticmethod
    def forward(ctx, x, members, me, pairs, check):
        ctx.members, ctx.me, ctx.pairs, ctx.check = members, me, pairs, check
        if check is not None:
            check(x, backward=False)
        return send_recv(x, members, me, pairs)

    @staticmethod
    def backward(ctx, grad):
        if ctx.check is not None:
            ctx.check(grad, backward=True)
        return send_recv(grad, ctx.members, ctx.me, [(d, s) for s, d in ctx.pairs]), None, None, None, None
