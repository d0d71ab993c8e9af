"""Collectives by axis name, one :class:`Collective` record each (as JAX keeps a primitive's rules by it).

A record holds a collective's parameter checks, its typed-region rule, its untyped convention and its
steps; the public functions only pass their arguments to ``_call.dispatch``. Shared arguments and errors:
docs/api.md, "Shared arguments"; autograd: docs/design.md, "Collectives and autograd". ``_runs`` runs the
records, ``_call`` holds the call machinery. Examples use ``rm``, rank 5 of 8 on the fake backend.
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

    Backward: the identity (Megatron's g). In a typed region an operand invariant over ``axis`` is cast
    first (``pvary``), so its ``psum`` is ``n * x``, as in JAX.

    Args:
        x: this member's tensor.
        axis, mesh, async_op, op_dtype: docs/api.md, "Shared arguments".

    Returns:
        A new tensor, the sum, with ``x``'s shape and dtype, invariant over ``axis``.

    Raises:
        The shared errors (docs/api.md), and TypeError for a non-tensor ``x`` (for JAX's
        ``psum(1, axis)``, call :func:`axis_size`).

    Examples:
        >>> fm.psum(torch.ones(2, 3), "tp", mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PSUM, psum, x, axis, mesh, {"async_op": async_op, "op_dtype": op_dtype})


def pmean(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None, async_op: bool = False,
          op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """The mean of ``x`` over the members of ``axis``: ``psum(x, axis) / n``.

    Args:
        x: this member's floating-point tensor.
        axis, mesh, async_op, op_dtype: docs/api.md, "Shared arguments".

    Returns:
        A new tensor, the mean, with ``x``'s shape.

    Raises:
        The shared errors (docs/api.md).

    Examples:
        >>> fm.pmean(torch.ones(2, 3), ("dp", "tp"), mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PMEAN, pmean, x, axis, mesh, {"async_op": async_op, "op_dtype": op_dtype})


def pmax(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
         async_op: bool = False) -> torch.Tensor | Pending:
    """The elementwise maximum of ``x`` over the members of ``axis``.

    The gradient goes to the members holding the maximum, split evenly among ties (as ``torch.amax``).
    In a typed region it also ends a pending max (``P(unreduced=..., unreduced_kind="max")``).

    Args:
        x: this member's real tensor.
        axis, mesh, async_op: docs/api.md, "Shared arguments".

    Returns:
        A new tensor, the maximum, with ``x``'s shape and dtype, invariant over ``axis``.

    Raises:
        The shared errors (docs/api.md), and TypeError for a complex ``x``.

    Examples:
        >>> fm.pmax(torch.ones(2, 3), "tp", mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PMAX, pmax, x, axis, mesh, {"async_op": async_op})


def pmin(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
         async_op: bool = False) -> torch.Tensor | Pending:
    """:func:`pmax` with the minimum (and a pending min).

    Args:
        x: this member's real tensor.
        axis, mesh, async_op: docs/api.md, "Shared arguments".

    Returns:
        A new tensor, the minimum, with ``x``'s shape and dtype.

    Raises:
        The shared errors (docs/api.md), and TypeError for a complex ``x``.

    Examples:
        >>> fm.pmin(torch.arange(6).reshape(2, 3), ("dp", "tp"), mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PMIN, pmin, x, axis, mesh, {"async_op": async_op})


def pvary(x: torch.Tensor, axis: str | Sequence[str], *, mesh: RealizedMesh | None = None,
          async_op: bool = False) -> torch.Tensor | Pending:
    """Mark ``x``, the same on every member of ``axis``, as varying over it.

    The identity forward; backward, :func:`psum` of the cotangents (Megatron's f). A typed region inserts
    it where needed.

    Args:
        x: this member's tensor, invariant over ``axis``.
        axis, mesh, async_op: docs/api.md, "Shared arguments".

    Returns:
        ``x``'s values as a new tensor, varying over ``axis``.

    Raises:
        The shared errors (docs/api.md), and VmaError in a typed region when ``x`` already varies over an axis.

    Examples:
        >>> fm.pvary(torch.ones(3), "tp", mesh=rm).shape
        torch.Size([3])
    """
    return dispatch(PVARY, pvary, x, axis, mesh, {"async_op": async_op})


def pcast(x: torch.Tensor, axis: str | Sequence[str], *, to: str = "varying",
          mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """JAX's ``pcast``: change how ``x`` is typed over ``axis``; no communication.

    ``to="unreduced"`` makes a varying value a pending sum over ``axis``, which :func:`psum` or
    :func:`psum_scatter` ends; ``to="reduced"`` an invariant one reduced (its gradient a pending
    sum) (docs/shard_map.md, "Pending sums", "Reduced"). Outside a typed region, the identity.

    Args:
        x: this member's tensor.
        axis, mesh, async_op: docs/api.md, "Shared arguments".
        to: ``"varying"`` (:func:`pvary`), ``"unreduced"`` or ``"reduced"``.

    Returns:
        What :func:`pvary` returns.

    Raises:
        The shared errors (docs/api.md), and:
        MeshError: another target.
        VmaError: in a typed region, a cast from a type ``x`` does not have (invariant to unreduced
            included, as in JAX).

    Examples:
        >>> fm.pcast(torch.ones(3), ("dp", "tp"), to="varying", mesh=rm).shape
        torch.Size([3])
        >>> _ = fm.shard_map(lambda w: print(fm.typeof(fm.pcast(w, "tp", to="reduced"))) or w, mesh=rm,
        ...                  in_specs=P(), out_specs=P())(torch.ones(3))
        AxisTypes(varying=frozenset(), reduced=frozenset({'tp'}))
    """
    return dispatch(PCAST, pcast, x, axis, mesh, {"to": to, "async_op": async_op})


def _jax_axis_keyword(public: Callable[..., Any]) -> Callable[..., Any]:
    """``public``, refusing JAX's ``axis=`` keyword (our ``dim=``) with a message that says so."""

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

    Backward: :func:`psum_scatter`; with ``to="invariant"`` (JAX's ``all_gather_invariant``) the result is
    invariant and backward keeps this member's block of the cotangent.

    Args:
        x: this member's block (the same shape on every member).
        axis, mesh, async_op, op_dtype: docs/api.md, "Shared arguments". JAX's ``axis=`` is our ``dim=``.
        dim: the dim to gather along.
        tiled: concatenate (``True``, our default; JAX's is ``False``) or stack.
        to: ``"varying"`` or ``"invariant"``.

    Returns:
        A new tensor: ``dim`` ``n`` times longer (tiled), or a new dim of size ``n``.

    Raises:
        The shared errors (docs/api.md), and:
        TypeError: ``tiled`` not a bool, or JAX's ``all_gather(x, axis_name, axis=d)``.
        MeshError: ``dim`` out of range, or an unknown target.

    Examples:
        >>> fm.all_gather(torch.ones(2, 3), "tp", mesh=rm).shape
        torch.Size([8, 3])
    """
    return dispatch(ALL_GATHER, all_gather, x, axis, mesh,
                     {"dim": dim, "tiled": tiled, "to": to, "async_op": async_op, "op_dtype": op_dtype})


all_gather = _jax_axis_keyword(all_gather)


def psum_scatter(x: torch.Tensor, axis: str | Sequence[str], *, dim: int = 0, tiled: bool = True,
                 mesh: RealizedMesh | None = None, async_op: bool = False,
                 op_dtype: torch.dtype | None = None) -> torch.Tensor | Pending:
    """Sum ``x`` over the members of ``axis`` and keep this member's block of ``dim`` (mesh order).

    The transpose of :func:`all_gather`. Untiled, ``dim`` has size ``n`` and is dropped.

    Args:
        x: this member's tensor; ``x.shape[dim]`` divisible by ``n`` (untiled: equal to it).
        axis, mesh, async_op, op_dtype: docs/api.md, "Shared arguments".
        dim: the dim to scatter (JAX's ``scatter_dimension``).
        tiled: keep a block of ``dim`` (``True``, our default; JAX's is ``False``) or drop it.

    Returns:
        A new tensor, varying over ``axis``: ``dim`` ``n`` times shorter, or without it.

    Raises:
        The shared errors (docs/api.md), and:
        MeshError: ``dim`` out of range or not divisible.

    Examples:
        >>> fm.psum_scatter(torch.ones(8, 3), "tp", mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PSUM_SCATTER, psum_scatter, x, axis, mesh,
                     {"dim": dim, "tiled": tiled, "async_op": async_op, "op_dtype": op_dtype})


def all_to_all(x: torch.Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int, *,
               tiled: bool = True, mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send block ``j`` of ``split_dim`` to member ``j``; concatenate what arrives along ``concat_dim``.

    Untiled (JAX's default), ``split_dim`` has size ``n`` and is removed and ``concat_dim`` is new.

    Args:
        x: this member's tensor; ``x.shape[split_dim]`` divisible by ``n``.
        axis, mesh, async_op: docs/api.md, "Shared arguments".
        split_dim: JAX's ``split_axis``.
        concat_dim: JAX's ``concat_axis``.
        tiled: ``True`` (our default) or ``False``.

    Returns:
        A new tensor: ``split_dim`` ``n`` times shorter and ``concat_dim`` ``n`` times longer.

    Raises:
        The shared errors (docs/api.md), and:
        MeshError: a dim out of range, ``split_dim`` not divisible.

    Examples:
        >>> fm.all_to_all(torch.ones(8, 6), "tp", 0, 1, mesh=rm).shape
        torch.Size([2, 24])
    """
    return dispatch(ALL_TO_ALL, all_to_all, x, axis, mesh,
                     {"split_dim": split_dim, "concat_dim": concat_dim, "tiled": tiled, "async_op": async_op})


def ragged_all_to_all(x: torch.Tensor, axis: str | Sequence[str], send_sizes: Any, recv_sizes: Any = None, *,
                      mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send ``send_sizes[j]`` rows of ``x`` (dim 0, in order) to member ``j``.

    The result holds the rows received, grouped by source in member order.

    Args:
        x: this member's rows.
        axis, mesh, async_op: docs/api.md, "Shared arguments". A tuple needs its product group.
        send_sizes: ints or a 1-D integer tensor, one per member, summing to ``x.shape[0]``.
        recv_sizes: the same for what arrives; ``None``: exchanged first (eagerly only).

    Returns:
        A new tensor of ``sum(recv_sizes)`` rows.

    Raises:
        The shared errors (docs/api.md), and:
        MeshError: sizes of the wrong length, negative or not summing to ``x``'s rows; tensor sizes or
            ``recv_sizes=None`` under torch.compile; a tuple without its product group.

    Examples:
        >>> fm.ragged_all_to_all(torch.ones(5, 3), "tp", [1, 2, 0, 2], [2, 0, 1, 1], mesh=rm).shape
        torch.Size([4, 3])
    """
    return dispatch(RAGGED_ALL_TO_ALL, ragged_all_to_all, x, axis, mesh,
                     {"send_sizes": send_sizes, "recv_sizes": recv_sizes, "async_op": async_op})


def ppermute(x: torch.Tensor, axis: str | Sequence[str], perm: Sequence[tuple[int, int]], *,
             mesh: RealizedMesh | None = None, async_op: bool = False) -> torch.Tensor | Pending:
    """Send ``x`` from member ``s`` to member ``d`` for each pair ``(s, d)`` of ``perm``.

    A member that receives nothing gets zeros. Every member must call it, also one outside ``perm``.

    Args:
        x: this member's tensor.
        axis, mesh, async_op: docs/api.md, "Shared arguments".
        perm: ``(source, destination)`` pairs of axis indices, each index at most once per side.

    Returns:
        A new tensor of ``x``'s shape.

    Raises:
        The shared errors (docs/api.md), and:
        TypeError: ``perm`` not pairs.
        MeshError: an index out of range or repeated, a tuple without its product group under torch.compile.

    Examples:
        >>> fm.ppermute(torch.ones(2, 3), "tp", [(i, (i + 1) % 4) for i in range(4)], mesh=rm).shape
        torch.Size([2, 3])
    """
    return dispatch(PPERMUTE, ppermute, x, axis, mesh, {"perm": perm, "async_op": async_op})


def axis_index(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """This rank's index along ``axis`` (a tuple: first name major). No communication.

    Args:
        axis, mesh: docs/api.md, "Shared arguments".

    Returns:
        An int in ``0 .. axis_size(axis) - 1`` (in a region: a varying 0-d int32 tensor, as in JAX).

    Raises:
        The shared errors (docs/api.md).

    Examples:
        >>> fm.axis_index("dp", mesh=rm), fm.axis_index(("dp", "tp"), mesh=rm), fm.axis_index(("tp", "dp"), mesh=rm)
        (1, 5, 3)
    """
    return dispatch(AXIS_INDEX, axis_index, None, axis, mesh, {})


def axis_size(axis: str | Sequence[str], *, mesh: RealizedMesh | None = None) -> int:
    """The size of ``axis`` (a tuple: the product). No communication; JAX's ``psum(1, axis_name)``.

    Args:
        axis, mesh: docs/api.md, "Shared arguments".

    Returns:
        A Python int.

    Raises:
        The shared errors (docs/api.md).

    Examples:
        >>> fm.axis_size(("dp", "tp"), mesh=rm)
        8
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
