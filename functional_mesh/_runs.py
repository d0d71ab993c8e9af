"""How each collective runs a bound call: its parameters checked, its steps over the call's groups.

One function (or a few) per collective, held by its record (``_collectives``): ``run``, the untyped
convention, the debug check's text. Each plans its ``_steps`` over ``call.hops()`` and passes each
through ``_call.apply_step``. Nothing here is public.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial
from typing import Any, cast

import torch

from . import _steps as S
from ._call import Call, apply_step
from ._errors import MeshError, requires
from ._handle import Hop
from ._validate import as_bool, as_dim, as_int

__all__ = ["all_gather", "all_to_all", "axis_index", "axis_size", "describe_exchange", "describe_gather",
           "describe_perm", "describe_ragged", "describe_scatter", "extremum", "extremum_untyped", "gather_fix",
           "gather_params", "identity", "pcast", "pcast_params", "pmean", "pmean_untyped", "ppermute", "psum",
           "psum_scatter", "psum_untyped", "pvary", "ragged_all_to_all", "tiled_params"]


# -- each collective's parameters, communication and conventions ------------------------------------


def tiled_params(api: str, params: dict[str, Any]) -> dict[str, Any]:
    as_bool(api, "tiled", params["tiled"])
    return params


# psum / pmean: all-reduce forward, identity backward; invariant over the axes (JAX's psum).


def psum(call: Call) -> torch.Tensor:
    x, check = call.x, call.debug_check()
    for hop in call.hops():
        x = apply_step(call, check, x, S.AllReduce(call.group(hop), "sum"), hop)
    return x


def pmean(call: Call) -> torch.Tensor:
    return psum(call) / call.axes.size


def psum_untyped(call: Call) -> torch.Tensor:
    """JAX's untyped convention: psum's cotangent is summed too (a pvary before it)."""
    return psum(call._replace(x=pvary(call)))


def pmean_untyped(call: Call) -> torch.Tensor:
    return psum_untyped(call) / call.axes.size




# pmax / pmin: the all-reduce of max (min); the gradient to the members holding the result, ties
# split evenly (torch.amax's rule); invariant over the axes (typed as psum).


def extremum(op: str, call: Call) -> torch.Tensor:
    x = call.x
    if x.is_complex():
        raise TypeError(requires(call.api, "a real tensor (complex numbers have no order)", "x.dtype", x.dtype))
    hops, check = call.hops(), call.debug_check()
    steps: tuple[S.Step, ...] = tuple(S.AllReduce(call.group(hop), op) for hop in hops)
    grad = x.requires_grad and torch.is_grad_enabled()
    checks = None
    if call.traced or check is not None or grad:
        checks = tuple(partial(check, axes=hop.axes, group=hop.pg) if check is not None and hop.size > 1 else None
                       for hop in hops)
    if call.slot is not None and hops[0].size > 1:  # async_op=True: the first reduction started, or arrived
        first = cast(S.AsyncStep, steps[0])  # every AllReduce can start
        steps = (call.slot.take(x, first, checks[0] if checks is not None else None), *steps[1:])
    if checks is not None:
        return S.Extremum.apply(x, steps, checks, grad)
    for step in steps:
        x = step.run(x)
    return x


def extremum_untyped(op: str, call: Call) -> torch.Tensor:
    """JAX's untyped convention: the result's cotangent is summed over the axes first (a pvary after it)."""
    return pvary(call._replace(x=extremum(op, call)))


# pvary / pcast(to="varying"): identity forward, psum backward; the result varies over the axes.


def pvary(call: Call) -> torch.Tensor:
    x, check = call.x, call.debug_check()
    for hop in call.hops():
        x = apply_step(call, check, x, S.Identity(call.group(hop)), hop)
    return x


def identity(call: Call) -> torch.Tensor:
    """An untyped region has no types to cast: pvary is the identity there (JAX)."""
    call.hops()  # the same errors as typed (a rank outside the mesh, an axis without a group)
    return call.x




def pcast_params(api: str, params: dict[str, Any]) -> dict[str, Any]:
    if params["to"] not in ("varying", "unreduced", "reduced"):
        raise MeshError(requires(api, "a supported target", "to", params["to"], "'varying', 'unreduced', 'reduced'"))
    return params


# pcast(to="unreduced"): identity forward and backward (a pending sum's cotangent is the same on every
# member, as the cotangent of the varying value it was); the result is a pending sum over the axes.
# pcast(to="reduced"): identity forward, psum backward (the reduced value's cotangent is a pending sum,
# which the invariant operand's is not: JAX's preduced, whose transpose is unreduced_psum). "relabel" (the
# rule's answer for to="varying" of a reduced value): identity both ways (JAX's reduced_vary_cast).


def pcast(call: Call) -> torch.Tensor:
    if call.params["to"] in ("varying", "reduced"):
        return pvary(call)
    if call.params["to"] == "relabel":
        return call.x.view_as(call.x)
    return identity(call).view_as(call.x)  # a new tensor: the region types it, not x












# all_gather: gather forward; backward psum_scatter (to="varying") or this member's slice (invariant).


def gather_params(api: str, params: dict[str, Any]) -> dict[str, Any]:
    tiled_params(api, params)
    to = params["to"]
    if to in ("invariant", "invarying"):
        return {**params, "to": "invariant"}
    if to != "varying":
        raise MeshError(requires(api, "a gather target", "to", to, "'varying', 'invariant' (or 'invarying')"))
    return params


def all_gather(call: Call) -> torch.Tensor:
    x, params = call.x, call.params
    if not params["tiled"]:
        x = x.unsqueeze(as_dim(call.api, x.ndim + 1, params["dim"]))
    d = as_dim(call.api, x.ndim, params["dim"])
    hops, check = call.hops(), call.debug_check()
    invariant = params["to"] == "invariant"
    for hop in reversed(hops):  # innermost axis first: the outermost ends up major
        x = apply_step(call, check, x, S.Gather(call.group(hop), hop.size, d, call.position(hop) if invariant else None), hop)
    return x




def gather_fix(names: tuple[str, ...], params: dict[str, Any]) -> str | None:
    """A result gathered to varying: its invariant form, which every member holds the same (not a psum of it)."""
    if params["to"] != "varying":
        return None
    axis = names[0] if len(names) == 1 else names
    return f"gather with all_gather(x, {axis!r}, to='invariant') instead (every member then holds the same value)"


def describe_gather(call: Call) -> str:
    """The parameters as the debug check compares them (dims counted from 0)."""
    params = call.params
    d = as_dim(call.api, call.x.ndim + (not params["tiled"]), params["dim"])
    return f", dim={d}, tiled={params['tiled']}" + (", to='invariant'" if params.get("to") == "invariant" else "")


# psum_scatter: reduce-scatter forward, all-gather backward; the result varies over the axes.


def psum_scatter(call: Call) -> torch.Tensor:
    x, params = call.x, call.params
    d = as_dim(call.api, x.ndim, params["dim"])
    n = call.axes.size
    if (x.shape[d] != n) if not params["tiled"] else (x.shape[d] % n):
        rule = f"dim {d} of size {n} (tiled=False)" if not params["tiled"] else f"dim {d} divisible by {n}"
        raise call.fail(rule, f"x.shape[{d}]", x.shape[d])
    hops, check = call.hops(), call.debug_check()
    for hop in hops:  # outermost axis first
        x = apply_step(call, check, x, S.Scatter(call.group(hop), hop.size, d), hop)
    return x if params["tiled"] else x.squeeze(d)




def describe_scatter(call: Call) -> str:
    return f", dim={as_dim(call.api, call.x.ndim, call.params['dim'])}, tiled={call.params['tiled']}"




# all_to_all: split_dim's blocks to the members, arrivals on concat_dim; backward the inverse.


def all_to_all(call: Call) -> torch.Tensor:
    x, params = call.x, call.params
    n = call.axes.size
    s = as_dim(call.api, x.ndim, params["split_dim"], "split_dim")
    c = as_dim(call.api, x.ndim, params["concat_dim"], "concat_dim")
    if not params["tiled"]:
        if x.shape[s] != n:
            raise call.fail(f"split_dim of size {n} (tiled=False)", f"x.shape[{s}]", x.shape[s])
        # stack at output position c: insert the new axis so that it lands at c once the
        # (size-1) split axis is squeezed away
        q, s_y = (c, s + 1) if c <= s else (c + 1, s)
        return _exchange(call, x.unsqueeze(q), s_y, q).squeeze(s_y)
    if x.shape[s] % n:
        raise call.fail(f"split_dim divisible by {n}", f"x.shape[{s}]", x.shape[s])
    return _exchange(call, x, s, c)


def _exchange(call: Call, x: torch.Tensor, s: int, c: int) -> torch.Tensor:
    """The tiled exchange of ``x`` (valid dims, ``split_dim`` divisible by the axes' size)."""
    hops, check = call.hops(), call.debug_check()
    if len(hops) == 1:
        (hop,) = hops
        return apply_step(call, check, x, S.Exchange(call.group(hop), hop.size, s, c), hop)
    # A tuple without its product group: one untiled exchange per axis, first axis major (a size-1
    # axis changes no destination). split_dim becomes one dim per axis (destination coordinates,
    # outermost first); the exchange over axis i turns dim i from "to whom" into "from whom", so
    # after the last one the blocks stand in sender order, major first, as the product group would
    # deliver them. Autograd composes: each step is an exchange with its own inverse.
    sizes = [hop.size for hop in hops]
    front = x.movedim(s, 0)
    y = front.reshape(*sizes, front.shape[0] // math.prod(sizes), *front.shape[1:])
    for i, hop in enumerate(hops):  # untiled over one axis: stack at i, the split axis i squeezed away
        y = apply_step(call, check, y.unsqueeze(i), S.Exchange(call.group(hop), hop.size, i + 1, i), hop)
        y = y.squeeze(i + 1)
    blocks = y.flatten(0, len(sizes) - 1).movedim(1, s + 1)  # (n, *x's dims with split_dim cut to one block)
    return blocks.movedim(0, c).flatten(c, c + 1)


def describe_exchange(call: Call) -> str:
    x, params = call.x, call.params
    s = as_dim(call.api, x.ndim, params["split_dim"], "split_dim")
    c = as_dim(call.api, x.ndim, params["concat_dim"], "concat_dim")
    if not params["tiled"]:  # the tiled exchange it makes, on x with a new dim
        s, c = (s + 1, c) if c <= s else (s, c + 1)
    return f", split_dim={s}, concat_dim={c}"


# ragged_all_to_all: rows by split sizes; backward the same exchange with the sizes swapped.


def _sizes(call: Call, what: str, sizes: object, n: int) -> tuple[int, ...]:
    """``sizes`` (a sequence of ints or a 1-D integer tensor) as ``n`` non-negative ints."""
    api = call.api
    if isinstance(sizes, torch.Tensor) and call.traced:  # its values would be data in the graph
        raise call.fail("sizes as Python ints under torch.compile (tensor sizes make the result's shape "
                        "data-dependent; read them with .tolist() before the compiled function)", what,
                        "a tensor")
    if isinstance(sizes, torch.Tensor):
        if sizes.ndim != 1 or sizes.dtype.is_floating_point or sizes.dtype.is_complex or sizes.dtype == torch.bool:
            raise TypeError(requires(api, f"a 1-D integer tensor or a sequence of ints for {what}", what,
                                     f"a {sizes.ndim}-d {str(sizes.dtype).removeprefix('torch.')} tensor"))
        sizes = sizes.tolist()
    elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise TypeError(requires(api, f"a 1-D integer tensor or a sequence of ints for {what}", what, sizes))
    values = tuple(as_int(api, what, v) for v in cast(Iterable[object], sizes))  # a list or an iterable
    if len(values) != n:
        raise call.fail(f"one size per member of {call.names!r} ({n})", what, values)
    if any(v < 0 for v in values):
        raise call.fail("sizes >= 0", what, values)
    return values


def ragged_all_to_all(call: Call) -> torch.Tensor:
    x, params = call.x, call.params
    n = call.axes.size
    if x.ndim == 0:
        raise call.fail("a tensor with at least one dim (rows are dim 0)", "x.shape", tuple(x.shape))
    sent = _sizes(call, "send_sizes", params["send_sizes"], n)
    if sum(sent) != x.shape[0]:
        raise call.fail(f"send_sizes summing to x.shape[0] ({x.shape[0]})", "send_sizes", sent)
    recv = params["recv_sizes"]
    hops = call.hops()
    if len(hops) > 1:
        raise MeshError(requires(call.api, "one axis, or a tuple whose product group was realized", "axis",
                                 call.names) + f"; pass products=[{call.names!r}] to realize", mesh=call.rm.mesh)
    (hop,) = hops
    group = call.group(hop)
    if recv is None:  # with async_op=True: exchanged once, when the call is issued
        got = _exchange_counts(call, sent, hop, group) if call.slot is None else \
            call.slot.once(lambda: _exchange_counts(call, sent, hop, group))
    else:
        got = _sizes(call, "recv_sizes", recv, n)
    check = call.debug_check()
    return apply_step(call, check, x, S.Ragged(group, sent, got), hop)


def _exchange_counts(call: Call, sent: tuple[int, ...], hop: Hop, group: Any) -> tuple[int, ...]:
    """What every member sends us: one small all-to-all of the counts (no gradient)."""
    if group is None:  # one member: what we send ourselves
        return sent
    if call.traced:
        raise call.fail("recv_sizes under torch.compile (the counts exchange makes shapes data-dependent)",
                        "recv_sizes", None)
    counts = torch.tensor(sent, dtype=torch.int64, device=call.x.device)
    return tuple(S.Exchange(group, hop.size, 0, 0).run(counts).tolist())


def describe_ragged(call: Call) -> str:
    return f", send_sizes={list(call.params['send_sizes'])!r}"


# ppermute: point to point by (source, destination) pairs; backward the inverse permutation.


def _permutation(call: Call, perm: object) -> list[tuple[int, int]]:
    """``perm`` as (source, destination) pairs of axis indices, each end used at most once."""
    n = call.axes.size
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Iterable):
        raise TypeError(requires(call.api, "an iterable of (source, destination) pairs", "perm", perm))
    pairs = []
    for pair in cast(Iterable[object], perm):  # checked iterable above
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


def ppermute(call: Call) -> torch.Tensor:
    me = call.member()
    pairs = tuple(_permutation(call, call.params["perm"]))
    hops, check = call.hops(), call.debug_check()
    if len(hops) == 1:  # one axis, or the product group: one all-to-all with empty blocks (traces)
        (hop,) = hops
        permute = S.RunTimePermute if call.one_graph and hop.size > 1 else S.Permute
        return apply_step(call, check, call.x, permute(call.group(hop), hop.size, call.position(hop), pairs), hop)
    if call.traced:
        rule = "under torch.compile, one axis or a tuple whose product group was realized"
        raise MeshError(requires(call.api, rule, "axis", call.names) + f"; pass products=[{call.names!r}] to realize",
                        mesh=call.rm.mesh)
    group = call.rm.mesh[call.names].group_of(call.rm.rank)
    assert group is not None  # call.member() above raised for a rank outside the mesh
    members = group.reshape(-1).tolist()
    bound = partial(check, axes=call.names, members=members) if check is not None else None
    step = cast(S.Step, S.PointToPoint(tuple(members), me, pairs))  # (mypy misreads the steps: pyproject.toml)
    if call.slot is not None:  # async_op=True: the sends and receives started, or arrived
        step = call.slot.take(call.x, cast(S.AsyncStep, step), bound)
    return S.Comm.apply(call.x, step, bound)


def describe_perm(call: Call) -> str:
    return f", perm={[tuple(p) for p in call.params['perm']]!r}"


# axis_index / axis_size: no communication.


def axis_index(call: Call) -> int:
    return call.position()




def axis_size(call: Call) -> int:
    return call.axes.size
