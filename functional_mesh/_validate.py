"""Converters and checks for user input, shared by every layer (pure: no torch).

``as_*(api, ...)`` converts (returns the normal form or raises), ``check_*(api, ...)`` raises on bad
input (docs/design.md, "House rules"): ``TypeError`` for a wrong type, ``MeshError`` for a bad value,
phrased by :func:`functional_mesh._errors.requires` and naming ``api``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from ._errors import MeshError, requires, unknown_axis

__all__ = ["MAX_RANK", "as_axis_index", "as_bool", "as_dim", "as_int", "as_int_array", "as_int_tuple",
           "as_name_tuple", "check_unique"]

MAX_RANK = 2**63 - 1  # ranks are int64; a list is also indexed by int64 positions


def as_int(api: str, name: str, value: object) -> int:
    """``value`` as an ``int``; a bool, float, str or other non-integer is a ``TypeError``.

    Integer-like scalars (numpy integers, 0-d integer arrays or tensors) are accepted through
    ``operator.index``, which refuses floats instead of truncating them.
    """
    if type(value) is int:  # the common case, without a call
        return value
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(requires(api, f"an int for {name}", name, value))


def as_int_tuple(api: str, name: str, value: int | Sequence[int]) -> tuple[int, ...]:
    """An int, or an ordered sequence of ints, as a tuple of ints (a shape or strides)."""
    if isinstance(value, (Mapping, AbstractSet)):  # unordered (a mapping would give its keys): not a shape
        raise TypeError(requires(api, f"an int or a sequence of ints for {name}", name, value))
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or getattr(value, "ndim", 1) == 0:
        return (as_int(api, name, value),)
    return tuple(as_int(api, name, v) for v in value)


def as_bool(api: str, name: str, value: object) -> bool:
    """``value`` when it is a ``bool``; anything else (0, 1, None, "yes") is a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(requires(api, f"{name}=True or False", name, value))
    return value


def as_dim(api: str, ndim: int, dim: object, name: str = "dim") -> int:
    """``dim`` of an ``ndim``-d tensor, negative dims counted from the end, as ``0..ndim-1``."""
    d = as_int(api, name, dim)
    if not -ndim <= d < ndim:
        valid = f"{-ndim}..{ndim - 1}" if ndim else "none (a 0-d tensor has no dims to gather, scatter or split)"
        raise MeshError(requires(api, f"a dim of the {ndim}-d tensor", name, d, valid))
    return d % ndim


def as_name_tuple(api: str, names: object, what: str = "axis_names") -> tuple[str, ...]:
    """A name, or a tuple/list of names, as a tuple of non-empty ``str``; other types are a ``TypeError``."""
    if isinstance(names, str):
        if not names:
            raise MeshError(requires(api, "non-empty axis names", what, names))
        return (names,)
    if not isinstance(names, (tuple, list)):
        raise TypeError(requires(api, f"a str or a tuple of str for {what}", what, names))
    for n in names:
        if not isinstance(n, str):
            raise TypeError(requires(api, f"str axis names in {what}", "name", n))
        if not n:
            raise MeshError(requires(api, "non-empty axis names", what, tuple(names)))
    return tuple(names)


def as_axis_index(api: str, axis_names: tuple[str, ...], name: object, mesh: object = None) -> int:
    """The position of axis ``name`` in ``axis_names``; ``mesh``, if given, rides on the error.

    A non-str name is a ``TypeError``; an unknown one an ``UnknownAxisError`` with "did you mean".
    """
    if not isinstance(name, str):
        raise TypeError(requires(api, "a str axis name", "axis", name))
    try:
        return axis_names.index(name)
    except ValueError:
        raise unknown_axis(api, name, axis_names, mesh) from None


def check_unique(api: str, names: tuple[str, ...], what: str = "axis_names") -> None:
    """Raise ``MeshError`` naming the first name that appears twice in ``names``."""
    if len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise MeshError(requires(api, "distinct axis names", what, names) + f"; {n!r} appears twice")
        seen.add(n)


def as_int_array(api: str, values: object) -> np.ndarray:
    """An int64 array (nesting kept as shape) from ints only: floats, bools, strings are a ``TypeError``.

    Unordered containers (sets, and mappings, whose iteration would silently give their keys) are a
    ``TypeError`` too: a device list has an order.
    """
    if isinstance(values, (str, bytes)):
        raise TypeError(requires(api, "an iterable of int ranks for devices", "devices", values))
    if isinstance(values, (Mapping, AbstractSet)):
        raise TypeError(requires(api, "an ordered iterable of int ranks for devices", "devices", values))
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor, without importing torch
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise TypeError(requires(api, "integer devices", "devices dtype", str(values.dtype)))
        if values.dtype.kind == "u" and values.size and int(values.max()) > MAX_RANK:
            raise MeshError(requires(api, f"global ranks up to {MAX_RANK}", "device", int(values.max())))
        return values.astype(np.int64, copy=False)
    if not isinstance(values, Iterable):
        raise TypeError(requires(api, "an iterable of int ranks for devices", "devices", values))
    if not isinstance(values, (list, tuple)):
        values = list(values)
    _collect_ints(api, values, [])
    try:
        return np.asarray(values, dtype=np.int64)
    except ValueError:
        raise MeshError(requires(api, "a rectangular (non-ragged) nesting of ranks", "devices", values)) from None


def _collect_ints(api: str, values: Iterable[Any], out: list[int]) -> None:  # Any: the caller's; index() checks
    for v in values:
        if isinstance(v, (list, tuple, np.ndarray)):
            _collect_ints(api, v, out)
            continue
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(requires(api, "int devices", "device", v))
        try:
            rank = operator.index(v)
        except TypeError:
            raise TypeError(requires(api, "int devices", "device", v)) from None
        if rank > MAX_RANK:  # np.asarray(..., int64) would raise OverflowError
            raise MeshError(requires(api, f"global ranks up to {MAX_RANK}", "device", rank))
        if rank < -MAX_RANK - 1:
            raise MeshError(requires(api, "non-negative global ranks", "device", rank))
        out.append(rank)


class Frozen:
    """Base of the library's hand-built values: no assignment or deletion after construction.

    For the values that cannot be attrs classes at no cost (which, and why: docs/design.md, "House
    rules"). Constructors set slots with ``object.__setattr__``; every other assignment is an
    ``AttributeError``, as on a frozen attrs class.
    """

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: cannot set {name!r}; "
                             f"derive a new value instead (its methods return new values)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: cannot delete {name!r}")
