"""Megatron-style order strings: ``"tp-cp-ep-dp-pp"`` to a mesh, and tokens to mesh axes.

Megatron's leftmost token varies fastest; a row-major mesh lists the tokens reversed
(docs/concepts.md, "Megatron order strings").
"""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import MeshError, requires, unknown_axis
from ._mesh import Mesh, make_mesh
from ._validate import as_int

__all__ = ["mesh_from_order", "order_axes"]


def _tokens(api: str, order: object) -> tuple[str, ...]:
    if not isinstance(order, str):
        raise TypeError(requires(api, 'an order string like "tp-cp-ep-dp-pp"', "order", order))
    tokens = tuple(order.split("-"))
    if not order or any(not t for t in tokens):
        raise MeshError(requires(api, 'non-empty tokens joined by "-", like "tp-cp-ep-dp-pp"', "order", order))
    seen = sorted({t for t in tokens if tokens.count(t) > 1})
    if seen:
        raise MeshError(requires(api, "each token once", "order", order) + f" (repeated: {seen})")
    return tokens


def mesh_from_order(order: str, *, devices: Iterable[int] | None = None, **sizes: int) -> Mesh:
    """The mesh of a Megatron order string: leftmost token fastest, so axes are the tokens reversed.

    A token ``order`` leaves out must have size 1 (as Megatron requires): it becomes an outermost axis.

    Args:
        order: tokens joined by ``"-"``, fastest first, e.g. ``"tp-cp-ep-dp-pp"``.
        devices: global ranks of the mesh positions (default ``0..N-1``); Megatron's
            ``rank_offset=k`` is ``devices=range(k, k + N)``.
        **sizes: one positive int per token, e.g. ``tp=2, cp=2, ep=1, dp=2, pp=2``.

    Returns:
        The :class:`~functional_mesh.Mesh` whose axes are the tokens reversed (then the extra
        size-1 axes, outermost), row-major over ``devices``.

    Raises:
        MeshError: an empty or repeated token, a token without a size, a size other than 1 for
            an axis the order leaves out, or sizes and devices that ``make_mesh`` refuses.

    Examples:
        >>> mesh_from_order("tp-dp", tp=4, dp=2, pp=1, cp=1)       # pp, cp: size 1, appended
        Mesh(cp=1, pp=1, dp=2, tp=4)
    """
    api = "mesh_from_order"
    tokens = _tokens(api, order)
    missing = [t for t in tokens if t not in sizes]
    if missing:
        raise MeshError(requires(api, "a size for every token of the order", "order", order)
                        + f"; no size for {missing} (given: {sorted(sizes)})")
    extra = []
    for name, size in sizes.items():
        if name not in tokens:
            if as_int(api, f"size of {name!r}", size) != 1:
                raise MeshError(requires(api, f"size 1 for an axis not in the order ({order!r})",
                                         name, size) + f"; add {name!r} to the order")
            extra.append(name)
    names = tokens + tuple(extra)
    return make_mesh(tuple(sizes[n] for n in reversed(names)), tuple(reversed(names)), devices=devices)


def order_axes(mesh: Mesh, token: str) -> tuple[str, ...]:
    """The axes a Megatron token names (``"tp-dp"``), in mesh order: ready for ``mesh.flatten``.

    Megatron treats a token as a set: ``"tp-dp"`` and ``"dp-tp"`` give the same axes.

    Args:
        mesh: a :class:`~functional_mesh.Mesh`, typically from :func:`mesh_from_order`.
        token: axis names joined by ``"-"``, in any order.

    Returns:
        The named axes in mesh order.

    Raises:
        UnknownAxisError: a token that is not an axis of ``mesh``.
        MeshError: an empty or repeated token.

    Examples:
        >>> mesh = mesh_from_order("tp-cp-dp-pp", tp=2, cp=2, dp=2, pp=2)
        >>> order_axes(mesh, "tp-pp"), order_axes(mesh, "pp-tp")
        (('pp', 'tp'), ('pp', 'tp'))
    """
    api = "order_axes"
    if not isinstance(mesh, Mesh):
        raise TypeError(requires(api, "a functional_mesh.Mesh", "mesh", mesh))
    wanted = _tokens(api, token)
    for t in wanted:
        if t not in mesh.axis_names:
            raise unknown_axis(api, t, mesh.axis_names, mesh)
    return tuple(n for n in mesh.axis_names if n in wanted)
