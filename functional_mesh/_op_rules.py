"""The table of exceptions: which torch functions do not follow the default type rule, and how.

Keys are the function objects a ``TorchFunctionMode`` receives (``torch.rand``,
``torch.Tensor.normal_``, ``torch.nn.functional.dropout``, our collectives, ...). Every spelling
of one op is registered together, and a key registered twice is an error at import time. An op
that is in no table follows :func:`functional_mesh._vma.default_rule`: the result varies over
the union of its tensor operands' axes. What is here:

- ``PASS_THROUGH``: metadata and queries (``x.shape``, ``x.size()``, ``x.item()``, ...): no typing;
- random ops: the result varies over every axis of the region's mesh;
- collectives: their rule in ``_vma`` and how to read their arguments (:class:`CollectiveSpec`);
- in-place writes are recognised by name (``add_``, ``__iadd__``, ``__setitem__``) or by an
  ``out=`` / ``inplace=True`` argument (:func:`written_operand`);
- custom ops (``torch.ops.<namespace>.*`` outside aten/prims) cannot be typed: :func:`is_untypeable`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import _collectives as C
from . import _torch, _vma

__all__ = ["COLLECTIVES", "PASS_THROUGH", "CollectiveSpec", "is_random", "is_untypeable", "written_operand"]


_SEEN: set[Any] = set()


def _register(table: dict[Any, Any], value: Any, *keys: Any) -> None:
    """Put ``keys`` in ``table``; a key that any table already holds is an error at import time."""
    for key in keys:
        if key in _SEEN:
            raise RuntimeError(f"functional_mesh._op_rules: {key!r} has two rules")
        _SEEN.add(key)
        table[key] = value


_PASS: dict[Any, bool] = {}
PASS_THROUGH = _PASS.keys()

_T = torch.Tensor
_getters = ("shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "layout", "is_cuda",
            "is_sparse", "is_quantized", "is_meta", "names", "itemsize", "nbytes", "output_nr", "_version",
            "is_nested", "is_mkldnn")
_register(_PASS, True, *(getattr(_T, g).__get__ for g in _getters if hasattr(_T, g)))
_register(_PASS, True, *(getattr(_T, m) for m in (
    "size", "dim", "numel", "nelement", "stride", "storage_offset", "element_size", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "get_device", "data_ptr", "item", "tolist", "__len__",
    "__bool__", "__float__", "__int__", "__index__", "__complex__", "__repr__", "__format__", "__hash__",
    "requires_grad_", "retain_grad", "register_hook", "dim_order", "untyped_storage", "__reduce_ex__",
    "__deepcopy__", "is_set_to", "is_inference", "has_names") if hasattr(_T, m)))


# -- random ops -----------------------------------------------------------------------------------------

_RANDOM: dict[Any, Callable[..., bool] | None] = {}


def _dropout_is_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """A dropout in eval mode (``training=False``) or with ``p=0`` draws nothing."""
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    return bool(arguments.get("training", arguments.get("train", True))) and arguments.get("p", 0.5) != 0


_register(_RANDOM, None, torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
          torch.randint_like, torch.randperm, torch.normal, torch.bernoulli, torch.poisson, torch.multinomial,
          _T.normal_, _T.uniform_, _T.bernoulli_, _T.bernoulli, _T.exponential_, _T.geometric_, _T.log_normal_,
          _T.cauchy_, _T.random_, _T.multinomial, F.rrelu, F.gumbel_softmax)
_register(_RANDOM, _dropout_is_random, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
          F.feature_alpha_dropout)


def is_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws random numbers (each rank from its own generator)."""
    if func not in _RANDOM:
        return False
    condition = _RANDOM[func]
    return condition is None or condition(func, args, kwargs)


# -- in-place writes and untypeable ops -------------------------------------------------------------------

_IN_PLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                               "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                               "__irshift__", "__setitem__"})


def written_operand(func: Any, args: tuple, kwargs: dict) -> Any:
    """The tensor this call writes into (``None`` when it writes nothing).

    ``x.add_(y)``, ``x += y``, ``x[i] = y``: ``x``; ``torch.add(x, y, out=z)``: ``z``; a functional
    op called with ``inplace=True`` (``F.relu(x, inplace=True)``): its first tensor.
    """
    out = kwargs.get("out")
    if isinstance(out, torch.Tensor):
        return out
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_DUNDERS
    if (in_place or kwargs.get("inplace") is True) and args and isinstance(args[0], torch.Tensor):
        return args[0]
    return None


def is_untypeable(func: Any) -> bool:
    """A custom op (``torch.ops.<namespace>.*`` outside aten/prims): its outputs need not follow its inputs."""
    op = _torch.op_overload_name(func)
    return op is not None and op[0] not in ("aten", "prims")


# -- collectives ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """How a region types one collective: its rule, and whether it takes a tensor operand."""

    rule: Callable[..., _vma.Rule] | None  # (api, operand type, axes) -> Rule; None for axis_index/axis_size
    has_operand: bool = True


def _gather_rule(api: str, operand: frozenset[str], axes: frozenset[str], to: object = "varying") -> _vma.Rule:
    if C.as_gather_target(api, to) == "invariant":
        return _vma.invariant_gather_rule(api, operand, axes)
    return _vma.gather_rule(api, operand, axes)


COLLECTIVES: dict[Any, CollectiveSpec] = {}
_register(COLLECTIVES, CollectiveSpec(_vma.psum_rule), C.psum, C.pmean)
_register(COLLECTIVES, CollectiveSpec(_vma.pvary_rule), C.pvary, C.pcast)
_register(COLLECTIVES, CollectiveSpec(_gather_rule), C.all_gather)
_register(COLLECTIVES, CollectiveSpec(_vma.psum_scatter_rule), C.psum_scatter)
_register(COLLECTIVES, CollectiveSpec(_vma.spread_rule), C.all_to_all, C.ppermute)
_register(COLLECTIVES, CollectiveSpec(None, has_operand=False), C.axis_index, C.axis_size)


def registered() -> Iterable[Any]:
    """Every key of every table."""
    return frozenset(_SEEN)
