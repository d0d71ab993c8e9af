"""Collectives by axis name: one table of records, each holding everything about one collective.

As JAX keeps each primitive's rules beside its implementation (``jax/_src/lax/parallel.py``),
each collective here is one :class:`Collective` record: its parameters and how they are checked,
its type rule for a typed ``shard_map`` region, its untyped-region convention, and its
communication (steps of ``_steps``, each with its transpose). The public functions are thin and
uniform: each passes its arguments to ``_call.dispatch``, which sends the call to the open region
(if any) or runs the record. The region (``_region``) handles every collective through its
record and never names one. Adding a collective is one record, its public function, tests, docs.

What the collectives share (tensors in, new tensors out; ``axis``, ``mesh``, ``async_op``,
``op_dtype``; the plan of a tuple of axes; the errors) is written once, in docs/api.md, "Shared
arguments", and their autograd rules in docs/design.md, "Collectives and autograd". A size-1 axis
has no group and costs no communication (docs/design.md, "Size-1 axes"). The examples use ``rm``,
rank 5 of 8 on torch's fake backend (docs/api.md, "Examples").

Two rooms beside this one: ``_runs`` holds how each record runs a bound call (its parameters
checked, its steps over the call's groups, its untyped convention, its debug text); ``_call`` the
call machinery (resolving ``axis``, checking a call, dispatch, issuing with ``async_op`` and
``op_dtype``, the debug check, each step paired with its transpose), whose docstring says what a
call costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial, wraps
from typing import Any

import torch
import torch.distributed as dist

from . import _runs as R
from . import _vma
from ._call import COLLECTIVES, Collective, dispatch, register
from ._errors import requires
from ._handle import RealizedMesh
from ._pending import Pending

__all__ = ["COLLECTIVES", "RAW", "all_gather", "all_to_all", "axis_index", "axis_size", "pcast", "pmax", "pmean",
           "pmin", "ppermute", "psum", "psum_scatter", "pvary", "ragged_all_to_all"]


# -- the public functions: thin and uniform ----------------------------------------------------------
#
# Fake collectives carry no data: the examples show shapes and types, and the text says the values.

def psum(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None, async_op: bool = False,
         op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """Sum ``x`` over the members of ``axis``: every member gets the same total.

    Four members holding ``0, 1, 2, 3`` each get ``6``. The result is invariant over ``axis``;
    its backward is the identity (each member's cotangent passes back as it is, Megatron's g).
    In a typed region an operand that is invariant over ``axis`` is cast first (``pvary``), so its
    ``psum`` is ``n * x``, as in JAX.

    Args:
        x: this member's tensor.
        axis, mesh, async_op, op_dtype: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        A new tensor, the sum, with ``x``'s shape and dtype.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``x`` is not a tensor (for ``psum(1, axis)``, JAX's idiom for the size of the
            axes, call :func:`axis_size`).

    Examples:
        >>> fm.psum(torch.ones(2, 3), "tp", mesh=rm).shape
        torch.Size([2, 3])
        >>> pending = fm.psum(torch.ones(2, 3), "tp", mesh=rm, async_op=True)  # started; returns at once
        >>> pending.wait().shape
        torch.Size([2, 3])
        >>> fm.psum(torch.ones(2, dtype=torch.bfloat16), "tp", mesh=rm, op_dtype=torch.float32).dtype
        torch.bfloat16
        >>> def body(v):
        ...     print(fm.typeof(fm.psum(v, "tp")))
        ...     return v
        >>> _ = fm.shard_map(body, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P("tp"))(torch.ones(8))
        AxisTypes(varying=frozenset())
    """
    return dispatch(PSUM, psum, x, axis, mesh, {"async_op": async_op, "op_dtype": op_dtype})


def pmean(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None, async_op: bool = False,
          op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """The mean of ``x`` over the members of ``axis``: ``psum(x, axis) / n``.

    Four members holding ``0, 1, 2, 3`` each get ``1.5``. Typed and differentiated as
    :func:`psum` (backward: the cotangent divided by ``n``).

    Args:
        x: this member's tensor (floating point: the division is true division; with ``op_dtype``,
            in that dtype).
        axis, mesh, async_op, op_dtype: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        A new tensor, the mean, with ``x``'s shape.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments").

    Examples:
        >>> fm.pmean(torch.ones(2, 3), ("dp", "tp"), mesh=rm).shape
        torch.Size([2, 3])
        >>> grads = torch.ones(4, dtype=torch.bfloat16)
        >>> fm.pmean(grads, "dp", mesh=rm, op_dtype=torch.float32, async_op=True).wait().dtype
        torch.bfloat16
    """
    return dispatch(PMEAN, pmean, x, axis, mesh, {"async_op": async_op, "op_dtype": op_dtype})


def pmax(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
         async_op: bool = False) -> torch.Tensor | Pending:
    """The elementwise maximum of ``x`` over the members of ``axis``: every member gets the same.

    Four members holding ``[0, 5]``, ``[3, 5]``, ``[1, 2]``, ``[2, 0]`` each get ``[3, 5]``. The
    result is invariant over ``axis`` (typed as :func:`psum`). Its gradient goes to the members
    whose ``x`` holds the maximum, split evenly where several do, as ``torch.amax`` over the
    stacked members does: above, the cotangent of ``3`` goes to the second member, and half of
    the cotangent of ``5`` to each of the first two.

    Args:
        x: this member's tensor (real: integers or floating point).
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        A new tensor, the maximum, with ``x``'s shape and dtype.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``x`` is complex.

    Examples:
        >>> x = torch.ones(2, 3, requires_grad=True)
        >>> y = fm.pmax(x, "tp", mesh=rm)
        >>> y.shape, y.requires_grad
        (torch.Size([2, 3]), True)
        >>> def body(v):
        ...     print(fm.typeof(fm.pmax(v, "tp")))
        ...     return v
        >>> _ = fm.shard_map(body, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P("tp"))(torch.ones(8))
        AxisTypes(varying=frozenset())
    """
    return dispatch(PMAX, pmax, x, axis, mesh, {"async_op": async_op})


def pmin(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
         async_op: bool = False) -> torch.Tensor | Pending:
    """The elementwise minimum of ``x`` over the members of ``axis``: :func:`pmax` with ``min``.

    Four members holding ``[0, 5]``, ``[3, 5]``, ``[1, 2]``, ``[2, 0]`` each get ``[0, 0]``; the
    gradient goes to the members holding the minimum, split evenly among ties (``torch.amin``).

    Args:
        x: this member's tensor (real: integers or floating point).
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        A new tensor, the minimum, with ``x``'s shape and dtype.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``x`` is complex.

    Examples:
        >>> fm.pmin(torch.arange(6).reshape(2, 3), ("dp", "tp"), mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PMIN, pmin, x, axis, mesh, {"async_op": async_op})


def pvary(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
          async_op: bool = False) -> torch.Tensor | Pending:
    """Mark ``x``, the same on every member of ``axis``, as entering computation that varies over it.

    The identity forward; backward, the sum of the members' cotangents (:func:`psum`, Megatron's
    f), which is the gradient of a value every member uses. A typed ``shard_map`` region inserts
    it where needed; outside a region, write it where a replicated value meets varying values.

    Args:
        x: this member's tensor, invariant over ``axis`` (in a typed region: typed so).
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        ``x``'s values as a new tensor, varying over ``axis``.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        VmaError: in a typed region, ``x`` already varies over one of the axes.

    Examples:
        >>> fm.pvary(torch.ones(3, requires_grad=True), "tp", mesh=rm).shape
        torch.Size([3])
        >>> def body(v):
        ...     print(fm.typeof(fm.pvary(v, "dp")))
        ...     return v
        >>> _ = fm.shard_map(body, mesh=rm, in_specs=fm.P("tp"), out_specs=fm.P("tp"))(torch.ones(8))
        AxisTypes(varying=frozenset({'dp', 'tp'}))
    """
    return dispatch(PVARY, pvary, x, axis, mesh, {"async_op": async_op})


def pcast(x: torch.Tensor, axis: str | Sequence[str], *, to: str = "varying",
          mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """JAX's ``pcast``: change how ``x`` is typed over ``axis``; no communication.

    ``to="varying"`` is :func:`pvary`. ``to="unreduced"``: a value varying over ``axis`` becomes a
    *pending sum* over it (JAX's ``unreduced``, DTensor's ``Partial("sum")``), which linear ops keep
    and :func:`psum` or :func:`psum_scatter` ends, once (docs/shard_map.md, "Pending sums"); forward
    and backward are the identity, and outside a typed region both casts are.

    Args:
        x: this member's tensor: invariant over ``axis`` (``to="varying"``) or varying over it
            (``to="unreduced"``).
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").
        to: the target: ``"varying"`` or ``"unreduced"``.

    Returns:
        What :func:`pvary` returns.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        MeshError: another target.
        VmaError: in a typed region: ``to="varying"`` of a value that already varies over one
            of the axes (or is unreduced over it); ``to="unreduced"`` of a value invariant over
            one of the axes (its members' sum would be ``n`` times it; JAX refuses it too) or
            already unreduced over it.

    Examples:
        >>> fm.pcast(torch.ones(3), ("dp", "tp"), to="varying", mesh=rm).shape
        torch.Size([3])
        >>> def row_parallel(x, w):  # x: (4, 8/tp), w: (8/tp, 6): each member's product is one term
        ...     y = fm.pcast(x @ w, "tp", to="unreduced")
        ...     z = 2 * y.reshape(2, 12)  # still a pending sum: nothing communicated yet
        ...     print(fm.typeof(z))
        ...     return fm.psum_scatter(z, "tp", dim=1)  # the sum, this member's block of it
        >>> f = fm.shard_map(row_parallel, mesh=rm, in_specs=(P(None, "tp"), P("tp")), out_specs=P(None, "tp"))
        >>> f(torch.ones(4, 8), torch.ones(8, 6)).shape
        AxisTypes(varying=frozenset(), unreduced=frozenset({'tp'}))
        torch.Size([2, 12])
    """
    return dispatch(PCAST, pcast, x, axis, mesh, {"to": to, "async_op": async_op})


def _jax_axis_keyword(public: Callable[..., Any]) -> Callable[..., Any]:
    """``public`` (whose second argument is ``axis``), saying what JAX's ``axis=`` keyword is here.

    JAX writes ``all_gather(x, axis_name, axis=0)``; Python would refuse our version of that
    call with "got multiple values for argument 'axis'". This wrapper names the translation
    instead (one dict lookup per call).
    """

    @wraps(public)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "axis" in kwargs and len(args) > 1:
            raise TypeError(requires(public.__name__, "the mesh axis as its second argument and the gathered dim "
                                     "as dim= (our axis is JAX's axis_name; JAX's axis= is our dim=)",
                                     "axis", kwargs["axis"])
                            + f"; write fm.{public.__name__}(x, {args[1]!r}, dim={kwargs['axis']!r})")
        return public(*args, **kwargs)

    return call


def all_gather(x: torch.Tensor, axis: str | Sequence[str], *, dim: int = 0, tiled: bool = True,
               to: str = "varying", mesh: RealizedMesh | None = None, async_op: bool = False,
               op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """Every member's ``x`` along ``dim``, in mesh order: concatenated (``tiled``) or stacked.

    Four members holding ``[0]``, ``[1]``, ``[2]``, ``[3]`` each get ``[0, 1, 2, 3]``
    (``tiled=False``: ``[[0], [1], [2], [3]]``). ``tiled=True`` is our default, JAX's is ``False``.
    ``to="varying"``: the result varies over ``axis`` (its cotangent may differ per member), and
    backward is :func:`psum_scatter`. ``to="invariant"`` (JAX's ``all_gather_invariant``; its
    spelling ``"invarying"`` too): every member gets and uses the same value, invariant over
    ``axis``, and backward keeps this member's block of the cotangent (no communication).

    Args:
        x: this member's block (every member's of the same shape).
        axis, mesh, async_op, op_dtype: as for every collective (docs/api.md, "Shared
            arguments"). JAX's keyword ``axis=`` (the dim) is our ``dim=``.
        dim: the dim to gather along (tiled: concatenated; untiled: a new dim at ``dim``).
        tiled: concatenate (``True``) or stack (``False``).
        to: ``"varying"`` or ``"invariant"``.

    Returns:
        A new tensor: ``x`` with ``dim`` ``n`` times longer (tiled), or with a new dim of size ``n``.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``tiled`` not a bool, or the JAX spelling ``all_gather(x, axis_name, axis=d)``
            (ours: ``all_gather(x, axis, dim=d)``).
        MeshError: ``dim`` out of range, or an unknown target.

    Examples:
        >>> x = torch.ones(2, 3)
        >>> fm.all_gather(x, "tp", mesh=rm).shape
        torch.Size([8, 3])
        >>> fm.all_gather(x, ("dp", "tp"), dim=1, tiled=False, mesh=rm).shape
        torch.Size([2, 8, 3])
        >>> fm.all_gather(x, "tp", mesh=rm, async_op=True).wait().shape
        torch.Size([8, 3])
    """
    return dispatch(ALL_GATHER, all_gather, x, axis, mesh,
                     {"dim": dim, "tiled": tiled, "to": to, "async_op": async_op, "op_dtype": op_dtype})


all_gather = _jax_axis_keyword(all_gather)


def psum_scatter(x: torch.Tensor, axis: str | Sequence[str], *, dim: int = 0, tiled: bool = True,
                 mesh: RealizedMesh | None = None, async_op: bool = False,
                 op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """Sum ``x`` over the members of ``axis`` and keep this member's block of ``dim`` (mesh order).

    Four members each holding ``[0, 1, 2, 3]``: member ``i`` gets ``[4 * i]`` (``tiled=False``:
    ``dim`` must have size ``n`` and is dropped, giving ``4 * i``). The transpose of
    :func:`all_gather`: backward gathers the cotangents. The result varies over ``axis``.

    Args:
        x: this member's tensor; ``x.shape[dim]`` divisible by the members' count (untiled: equal).
        axis, mesh, async_op, op_dtype: as for every collective (docs/api.md, "Shared arguments").
        dim: the dim to scatter (JAX's ``scatter_dimension``).
        tiled: keep a block of ``dim`` (``True``, our default; JAX's is ``False``) or drop ``dim``.

    Returns:
        A new tensor: ``x`` with ``dim`` ``n`` times shorter, or without ``dim`` (untiled).

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``tiled`` not a bool.
        MeshError: ``dim`` out of range or not divisible.

    Examples:
        >>> fm.psum_scatter(torch.ones(8, 3), "tp", mesh=rm).shape
        torch.Size([2, 3])
        >>> fm.psum_scatter(torch.ones(3, 8), ("dp", "tp"), dim=1, tiled=False, mesh=rm).shape
        torch.Size([3])
        >>> grads = torch.ones(8, 3, dtype=torch.bfloat16)  # reduced in float32, one rounding to bfloat16
        >>> fm.psum_scatter(grads, "tp", mesh=rm, op_dtype=torch.float32, async_op=True).wait().dtype
        torch.bfloat16
    """
    return dispatch(PSUM_SCATTER, psum_scatter, x, axis, mesh,
                     {"dim": dim, "tiled": tiled, "async_op": async_op, "op_dtype": op_dtype})


def all_to_all(x: torch.Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int, *,
               tiled: bool = True, mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send block ``j`` of ``split_dim`` to member ``j``; concatenate what arrives along ``concat_dim``.

    Arrivals stand in mesh order. Two members holding ``[a0, a1]`` and ``[b0, b1]`` (split and
    concat dim 0) get ``[a0, b0]`` and ``[a1, b1]``. Untiled (JAX's default): ``split_dim`` has
    size ``n`` and is removed, and a new ``concat_dim`` of size ``n`` stacks the arrivals. Backward
    is the inverse exchange; the result varies over ``axis``. A tuple of axes uses its product
    group when realized, else one exchange per axis, with the same result.

    Args:
        x: this member's tensor; ``x.shape[split_dim]`` divisible by the members' count.
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").
        split_dim: the dim cut into one block per member (JAX's ``split_axis``).
        concat_dim: the dim the arrivals are laid along (JAX's ``concat_axis``).
        tiled: ``True`` (our default) or ``False`` (JAX's).

    Returns:
        A new tensor: ``split_dim`` ``n`` times shorter and ``concat_dim`` ``n`` times longer.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``tiled`` not a bool.
        MeshError: a dim out of range, ``split_dim`` not divisible.

    Examples:
        >>> fm.all_to_all(torch.ones(8, 6), "tp", 0, 1, mesh=rm).shape
        torch.Size([2, 24])
        >>> fm.all_to_all(torch.ones(4, 6), "tp", 0, 1, tiled=False, mesh=rm).shape
        torch.Size([6, 4])
    """
    return dispatch(ALL_TO_ALL, all_to_all, x, axis, mesh,
                     {"split_dim": split_dim, "concat_dim": concat_dim, "tiled": tiled, "async_op": async_op})


def ragged_all_to_all(x: torch.Tensor, axis: str | Sequence[str], send_sizes: Any, recv_sizes: Any = None, *,
                      mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send rows of ``x`` (dim 0) by split sizes: ``send_sizes[j]`` rows to member ``j``, in order.

    The first ``send_sizes[0]`` rows go to member 0, the next ``send_sizes[1]`` to member 1, and
    so on (member order: mesh order, a tuple first name major). The result holds the rows
    received, grouped by source member in member order. Backward is the same exchange with the
    sizes swapped; the result varies over ``axis``. A tuple of axes needs its product group.

    Args:
        x: this member's rows (at least one dim).
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments"); a tuple of
            names needs its product group realized.
        send_sizes: a sequence of ints or a 1-D integer tensor, one size per member, summing to
            ``x.shape[0]``.
        recv_sizes: the same for what arrives; ``None``: the members exchange their counts first
            (one small all-to-all; eagerly only, under torch.compile pass them as Python ints).

    Returns:
        A new tensor of ``sum(recv_sizes)`` rows.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: sizes not ints.
        MeshError: sizes of the wrong length, negative or not summing to ``x``'s rows, tensor sizes
            or ``recv_sizes=None`` under torch.compile, a tuple without its product group.

    Examples:
        >>> fm.ragged_all_to_all(torch.ones(5, 3), "tp", [1, 2, 0, 2], [2, 0, 1, 1], mesh=rm).shape
        torch.Size([4, 3])
    """
    return dispatch(RAGGED_ALL_TO_ALL, ragged_all_to_all, x, axis, mesh,
                     {"send_sizes": send_sizes, "recv_sizes": recv_sizes, "async_op": async_op})


def ppermute(x: torch.Tensor, axis: str | Sequence[str], perm: Sequence[tuple[int, int]], *,
             mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send ``x`` from member ``s`` to member ``d`` for each pair ``(s, d)`` of ``perm``.

    Members are axis indices (:func:`axis_index`). A member that receives nothing gets zeros:
    with ``perm=[(0, 1)]`` on two members holding ``a`` and ``b``, member 0 gets zeros and member
    1 gets ``a``. Backward sends the cotangents along the inverse pairs; the result varies over
    ``axis``. Every member must call it (and run its backward), also one that sends or receives
    nothing.

    Args:
        x: this member's tensor.
        axis, mesh, async_op: as for every collective (docs/api.md, "Shared arguments").
        perm: ``(source, destination)`` pairs of axis indices, each index at most once as a source
            and once as a destination.

    Returns:
        A new tensor of ``x``'s shape.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments"), and:
        TypeError: ``perm`` not pairs.
        MeshError: an index out of range or used twice, a tuple without its product group under
            torch.compile.

    Examples:
        >>> fm.ppermute(torch.ones(2, 3), "tp", [(i, (i + 1) % 4) for i in range(4)], mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PPERMUTE, ppermute, x, axis, mesh, {"perm": perm, "async_op": async_op})


def axis_index(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """This rank's index along ``axis`` (a tuple: row-major, first name major). No communication.

    Inside a ``shard_map`` region it is a 0-d int32 tensor that varies over ``axis``, as in JAX.

    Args:
        axis, mesh: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        An int in ``0 .. axis_size(axis) - 1`` (in a region: a 0-d int32 tensor).

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments").

    Examples:
        >>> fm.axis_index("dp", mesh=rm), fm.axis_index(("dp", "tp"), mesh=rm), fm.axis_index(("tp", "dp"), mesh=rm)
        (1, 5, 3)
    """
    return dispatch(AXIS_INDEX, axis_index, None, axis, mesh, {})


def axis_size(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """The size of ``axis`` (a tuple: the product of the sizes). No communication.

    JAX's idiom ``psum(1, axis_name)`` for this is ``fm.axis_size(axis)`` here.

    Args:
        axis, mesh: as for every collective (docs/api.md, "Shared arguments").

    Returns:
        A Python int.

    Raises:
        Every collective's errors (docs/api.md, "Shared arguments").

    Examples:
        >>> fm.axis_size("tp", mesh=rm), fm.axis_size(("dp", "tp"), mesh=rm)
        (4, 8)
        >>> with rm:
        ...     fm.axis_size("dp")
        2
    """
    return dispatch(AXIS_SIZE, axis_size, None, axis, mesh, {})


PSUM = register(psum, Collective("psum", True, R.psum, _vma.psum_rule, untyped=R.psum_untyped))
PMEAN = register(pmean, Collective("pmean", True, R.pmean, _vma.psum_rule, untyped=R.pmean_untyped))
PMAX = register(pmax, Collective("pmax", True, partial(R.extremum, "max"), _vma.pmax_rule,
                                 untyped=partial(R.extremum_untyped, "max")))
PMIN = register(pmin, Collective("pmin", True, partial(R.extremum, "min"), _vma.pmax_rule,
                                 untyped=partial(R.extremum_untyped, "min")))
PVARY = register(pvary, Collective("pvary", True, R.pvary, _vma.pvary_rule, untyped=R.identity))
PCAST = register(pcast, Collective("pcast", True, R.pcast, _vma.pcast_rule, R.pcast_params, untyped=R.identity))
ALL_GATHER = register(all_gather, Collective("all_gather", True, R.all_gather, _vma.gather_rule, R.gather_params,
                                             describe=R.describe_gather, fix=R.gather_fix))
PSUM_SCATTER = register(psum_scatter, Collective("psum_scatter", True, R.psum_scatter, _vma.psum_scatter_rule,
                                                 R.tiled_params, describe=R.describe_scatter))
ALL_TO_ALL = register(all_to_all, Collective("all_to_all", True, R.all_to_all, _vma.spread_rule, R.tiled_params,
                                             describe=R.describe_exchange))
RAGGED_ALL_TO_ALL = register(ragged_all_to_all, Collective("ragged_all_to_all", True, R.ragged_all_to_all,
                                                           _vma.spread_rule, describe=R.describe_ragged))
PPERMUTE = register(ppermute, Collective("ppermute", True, R.ppermute, _vma.spread_rule, describe=R.describe_perm))
AXIS_INDEX = register(axis_index, Collective("axis_index", False, R.axis_index, _vma.axis_index_rule,
                                             region_dtype=torch.int32))
AXIS_SIZE = register(axis_size, Collective("axis_size", False, R.axis_size, None))


# -- raw torch.distributed calls ---------------------------------------------------------------------


# torch.distributed's own collectives write into tensors a typed region cannot see the types of:
# inside one they are refused, with the collective of ours that does the same by axis name.
# (torch routes each of these through __torch_function__; names missing from a torch release are skipped.)
_RAW_ADVICE = {
    "all_reduce": "fm.psum (or fm.pmean)", "all_reduce_coalesced": "fm.psum", "reduce": "fm.psum",
    "all_gather": "fm.all_gather", "all_gather_into_tensor": "fm.all_gather", "all_gather_coalesced": "fm.all_gather",
    "all_gather_single": "fm.all_gather", "gather": "fm.all_gather",
    "reduce_scatter": "fm.psum_scatter", "reduce_scatter_tensor": "fm.psum_scatter",
    "reduce_scatter_single": "fm.psum_scatter", "scatter": "fm.all_to_all",
    "all_to_all_single": "fm.all_to_all (equal blocks) or fm.ragged_all_to_all (split sizes)",
    "all_to_all": "fm.all_to_all (equal blocks) or fm.ragged_all_to_all (split sizes)",
    "broadcast": "fm.all_gather or fm.ppermute", "send": "fm.ppermute", "recv": "fm.ppermute",
    "isend": "fm.ppermute", "irecv": "fm.ppermute",
}
RAW: dict[Any, str] = {}  # torch.distributed function -> the fm collective to use instead
for _name, _advice in _RAW_ADVICE.items():
    _fn = getattr(dist, _name, None)
    if _fn is not None:
        RAW.setdefault(_fn, _advice)
