"""The table of exceptions: which torch functions do not follow the default type rule, and how.

Keys are the function objects a ``TorchFunctionMode`` receives, every spelling of one op registered
together (a key twice is an import-time error); an op in no table follows
:func:`functional_mesh._vma.default_rule`. What the tables hold (``PASS_THROUGH``, random ops,
collectives, in-place writes, custom ops, ``LINEAR``): docs/design.md, "Type rules".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import _collectives as C
from . import _torch

__all__ = ["BIAS", "EXTREMUM", "LINEAR", "PASS_THROUGH", "OpKind", "is_random", "is_untypeable", "op_kind",
           "written_operand"]


_SEEN: set[Any] = set()
# Each dropout's parameters, read once at import: whether a call draws random numbers depends on
# them, bound with plain dict work (torch.compile cannot trace inspect.signature).
_PARAMETERS: dict[Any, tuple[tuple[str, Any, bool], ...]] = {}  # (name, default, may be positional)


def _read_parameters(*funcs: Any) -> None:
    for func in funcs:
        _PARAMETERS[func] = tuple((p.name, p.default, p.kind is p.POSITIONAL_OR_KEYWORD)
                                  for p in inspect.signature(func).parameters.values())


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``func``'s arguments by name, defaults filled in (``func``: a dropout).

    A call ``func`` itself refuses raises the ``TypeError`` that call raises.
    """
    parameters = _PARAMETERS[func]
    arguments: dict[str, Any] = {}
    for i, (name, default, positional) in enumerate(parameters):
        if i < len(args) and positional and name not in kwargs:
            arguments[name] = args[i]
        elif i >= len(args) and name in kwargs:
            arguments[name] = kwargs[name]
        elif i >= len(args) and default is not inspect.Parameter.empty:
            arguments[name] = default
        else:
            func(*args, **kwargs)  # positional where it may not be, twice, or missing: the call's own error
    if len(args) > len(parameters) or any(k not in arguments for k in kwargs):
        func(*args, **kwargs)  # too many or unknown arguments
    return arguments


def _register(table: dict[Any, Any], value: Any, *keys: Any) -> None:
    """Put ``keys`` in ``table``; a key that any table already holds is an error at import time."""
    for key in keys:
        if key in _SEEN:
            raise RuntimeError(f"functional_mesh._op_rules: {key!r} has two rules")
        _SEEN.add(key)
        table[key] = value


PASS_THROUGH: dict[Any, bool] = {}


_T = torch.Tensor
_getters = ("shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "layout", "is_cuda",
            "is_sparse", "is_quantized", "is_meta", "names", "itemsize", "nbytes", "output_nr", "_version",
            "is_nested", "is_mkldnn")
_register(PASS_THROUGH, True, *(getattr(_T, g).__get__ for g in _getters if hasattr(_T, g)))
_register(PASS_THROUGH, True, *(getattr(_T, m) for m in (
    "size", "dim", "numel", "nelement", "stride", "storage_offset", "element_size", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "get_device", "data_ptr", "item", "tolist", "__len__",
    "__bool__", "__float__", "__int__", "__index__", "__complex__", "__repr__", "__format__", "__hash__",
    "requires_grad_", "retain_grad", "register_hook", "dim_order", "untyped_storage", "__reduce_ex__",
    "__deepcopy__", "is_set_to", "is_inference", "has_names") if hasattr(_T, m)))


# -- random ops -----------------------------------------------------------------------------------------

_RANDOM: dict[Any, Callable[..., bool] | None] = {}


def _dropout_is_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """A dropout in eval mode (``training=False``) or with ``p=0`` draws nothing."""
    arguments = _bind(func, args, kwargs)
    return bool(arguments.get("training", arguments.get("train", True))) and arguments.get("p", 0.5) != 0


_register(_RANDOM, None, torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
          torch.randint_like, torch.randperm, torch.normal, torch.bernoulli, torch.poisson, torch.multinomial,
          _T.normal_, _T.uniform_, _T.bernoulli_, _T.bernoulli, _T.exponential_, _T.geometric_, _T.log_normal_,
          _T.cauchy_, _T.random_, _T.multinomial, F.rrelu, F.gumbel_softmax)
_DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)
_register(_RANDOM, _dropout_is_random, *_DROPOUTS)
_read_parameters(*_DROPOUTS)


def is_random(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws random numbers (each rank from its own generator)."""
    random = op_kind(func).random
    return random == "always" or (random == "maybe" and (rule := _RANDOM[func]) is not None
                                  and rule(func, args, kwargs))


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
    if (op_kind(func).writes_first or kwargs.get("inplace") is True) and args and isinstance(args[0], torch.Tensor):
        return args[0]
    return None


def is_untypeable(func: Any) -> bool:
    """A custom op (``torch.ops.<namespace>.*`` outside aten/prims): its outputs need not follow its inputs."""
    return op_kind(func).role == "untypeable"


# -- collectives ----------------------------------------------------------------------------------------
#
# Ours are records of the collectives' table (``_collectives.COLLECTIVES``: rule, parameters,
# communication); torch.distributed's own write into tensors whose types a region cannot know,
# so a typed region refuses them (``_collectives.RAW``: the collective of ours to use instead).

_OURS: dict[Any, bool] = {}
_register(_OURS, True, *C.COLLECTIVES)
_THEIRS: dict[Any, bool] = {}
_register(_THEIRS, True, *C.RAW)


# -- linear ops: what keeps a pending sum ---------------------------------------------------------------
#
# DTensor keeps a Partial("sum") placement through these (its sharding propagation), and so do we,
# with the same values. Each spelling of an op is listed (torch.x, Tensor.x, the operator, in place).

LINEAR: dict[Any, str] = {}


def _linear(kind: str, *names: str, functions: tuple[Any, ...] = ()) -> None:
    for name in names:
        for owner in (torch, _T):
            func = getattr(owner, name, None)
            if func is not None:
                LINEAR.setdefault(func, kind)
    for func in functions:
        LINEAR.setdefault(func, kind)


# views and reshapes: they keep a pending max or min too (kind "view"; a pending sum: as "unary")
_linear("view", "clone", "contiguous", "detach", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
        "squeeze", "unsqueeze", "squeeze_", "unsqueeze_", "transpose", "transpose_", "t", "t_", "permute", "movedim",
        "moveaxis", "swapaxes", "swapdims", "expand", "expand_as", "broadcast_to", "narrow", "select", "__getitem__",
        "split", "chunk", "tensor_split", "unbind", "flip", "fliplr", "flipud", "roll", "rot90", "diagonal", "ravel",
        "atleast_1d", "atleast_2d", "atleast_3d")
_linear("view", functions=tuple(getattr(_T, g).__get__ for g in ("T", "mT") if hasattr(_T, g)))
_linear("unary", "neg", "negative", "__neg__", "__pos__", "positive", "neg_", "negative_", "clone", "contiguous",
        "detach", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "squeeze_",
        "unsqueeze_", "transpose", "transpose_", "t", "t_", "permute", "movedim", "moveaxis", "swapaxes", "swapdims",
        "expand", "expand_as", "broadcast_to", "repeat", "tile", "narrow", "select", "__getitem__", "split", "chunk",
        "tensor_split", "unbind", "flip", "fliplr", "flipud", "roll", "rot90", "diagonal", "diag", "tril", "triu",
        "sum", "mean", "nansum", "cumsum", "index_select", "gather", "take_along_dim", "to", "float", "double",
        "half", "bfloat16", "type_as", "cpu", "cuda", "real", "imag", "conj", "resolve_conj", "resolve_neg", "ravel",
        "view_as_real", "view_as_complex", "atleast_1d", "atleast_2d", "atleast_3d", "trace")
_linear("unary", functions=tuple(getattr(_T, g).__get__ for g in ("T", "mT", "H", "mH") if hasattr(_T, g)))
_linear("add", "add", "sub", "subtract", "__add__", "__radd__", "__sub__", "__iadd__", "__isub__", "add_", "sub_",
        "subtract_")
_linear("cat", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack")
_linear("mul", "mul", "multiply", "__mul__", "__rmul__", "__imul__", "mul_", "multiply_")
_linear("div", "div", "divide", "true_divide", "__truediv__", "__itruediv__", "div_", "divide_", "true_divide_")
_linear("factors", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "vdot", "inner", "outer", "ger",
        "tensordot", "einsum", "kron")
_linear("factors", functions=(F.linear, F.bilinear))
BIAS: dict[Any, int] = {F.linear: 2, F.bilinear: 3}  # linear in their factors, but a bias adds: its position
# the reductions that keep a pending max (min) of their own kind; every other op refuses one
EXTREMUM: dict[Any, str] = {f: k for k, names in (("max", ("amax", "max", "maximum")),
                                                  ("min", ("amin", "min", "minimum")))
                            for name in names for owner in (torch, _T) if (f := getattr(owner, name, None)) is not None}
for _func in LINEAR:  # a linear op draws nothing, communicates nothing and is typed by the default rule
    if _func in _SEEN and _func not in PASS_THROUGH:
        raise RuntimeError(f"functional_mesh._op_rules: {_func!r} is linear and has another rule")


# -- what a function is, decided once per function --------------------------------------------------------


class OpKind(NamedTuple):
    """What the tables say about one function (plain constants)."""

    role: str  # "pass" (PASS_THROUGH), "collective" (ours), "raw collective" (torch.distributed's), "untypeable"
    # (a custom op) or "op" (the default rule)
    random: str  # "always", "maybe" (a dropout: depends on its arguments) or "" (draws nothing)
    writes_first: bool  # an in-place op by its name (``add_``, ``__iadd__``, ``__setitem__``)
    name: str  # how errors name it: "add", "Tensor.add_", "aten::add", "my_lib::op"
    linear: str  # its kind in ``LINEAR`` (keeps a pending sum), or "" (refuses one)
    extremum: str = ""  # "max"/"min": a reduction of that kind (``EXTREMUM``), which keeps a pending max/min


_KINDS: dict[Any, OpKind] = {}


@torch.compiler.assume_constant_result
def op_kind(func: Any) -> OpKind:
    """The tables' answer for ``func``, computed once per function.

    Under torch.compile the call runs while tracing and its result is a constant of the trace:
    a region's dispatch costs nothing in compiled code.
    """
    try:
        kind = _KINDS.get(func)
    except TypeError:  # an unhashable callable: classify it every time
        return _classify(func)
    if kind is None:
        kind = _KINDS[func] = _classify(func)
    return kind


def _classify(func: Any) -> OpKind:
    op = _torch.op_overload_name(func)  # torch.ops.<namespace>.<op>: ("namespace", "op")
    if func in PASS_THROUGH:
        role = "pass"
    elif func in C.COLLECTIVES:
        role = "collective"
    elif func in C.RAW:
        role = "raw collective"
    elif op is not None and op[0] not in ("aten", "prims"):
        role = "untypeable"
    else:
        role = "op"
    random = "" if func not in _RANDOM else "always" if _RANDOM[func] is None else "maybe"
    name = getattr(func, "__name__", "")
    writes_first = (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_DUNDERS
    try:
        linear = LINEAR.get(func, "")
    except TypeError:  # unhashable: in no table
        linear = ""
    try:
        extremum = EXTREMUM.get(func, "")
    except TypeError:
        extremum = ""
    return OpKind(role, random, writes_first, _display_name(func, op), linear, extremum)


def _display_name(func: Any, op: tuple[str, str] | None) -> str:
    if op is not None:
        return op[1]
    name = getattr(func, "__name__", None) or str(func)
    owner = getattr(func, "__objclass__", None)
    return f"Tensor.{name}" if owner is not None and owner.__name__ == "TensorBase" else name


def registered() -> Iterable[Any]:
    """Every key of every table."""
    return frozenset(_SEEN)
