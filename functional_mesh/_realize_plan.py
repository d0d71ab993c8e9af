"""realize's decisions, as pure functions of their inputs (no torch, no process group).

What :func:`functional_mesh.realize` decides before and around its effects: how to initialise
the default group from the torchrun environment, which backend and device type a request
means, how an axis's missing groups are made, the timeout of new groups, the text two ranks compare, and the log lines of a call. ``tests/unit/
test_realize_decisions.py`` tests them as tables; ``_realize.py`` carries them out.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ._errors import MeshError, requires
from ._mesh import Mesh, axis_position, select
from ._validate import as_name_tuple

__all__ = ["INIT_TIMEOUT_ENV", "AxisSettings", "InitPlan", "as_backend", "as_timeout",
           "axis_report", "check_device_type", "creation_method", "describe_options",
           "describe_request", "per_axis", "plan_init", "product_axes", "realized_axes", "resolve_backend"]

INIT_TIMEOUT_ENV = "FUNCTIONAL_MESH_INIT_TIMEOUT"  # seconds: the default group's start-up (unset: torch's default)
NATURAL_BACKEND = {"cpu": "gloo", "cuda": "nccl"}


class InitPlan(NamedTuple):
    """How realize initialises the default group when none exists."""

    backend: str
    device_type: str
    device_index: int | None  # CUDA: the current device and NCCL's bound device_id
    # the bound on start-up (the rendezvous of every rank) and on the default group's own collectives:
    # $FUNCTIONAL_MESH_INIT_TIMEOUT, else None (torch's default); never realize's per-axis timeout=
    timeout: datetime.timedelta | None = None


def plan_init(env: dict[str, str], cuda_available: bool, device_type: str | None, backend: str | None) -> InitPlan:
    """The default-group plan from the torchrun environment (``RANK``, ``WORLD_SIZE``, ...).

    CUDA takes its device from ``LOCAL_RANK`` (torchrun sets it; 0 when absent) and binds NCCL
    to it, so ``split_group`` is available later. The start-up's bound is ``$FUNCTIONAL_MESH_INIT_TIMEOUT``
    seconds, or torch's default: realize's ``timeout=`` is for the axes' collectives, and a rank that
    starts late (importing torch on a busy node) must not fail the others.
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise MeshError(
            requires("realize", "an initialised torch.distributed job or the torchrun environment",
                     "missing environment variables", missing)
            + "; run under torchrun, or call torch.distributed.init_process_group first"
        )
    device_type = device_type or ("cuda" if cuda_available else "cpu")
    check_device_type(device_type)
    if device_type == "cuda" and not cuda_available:
        raise MeshError(requires("realize", "an available device type", "device_type", "cuda", "'cpu'"))
    backend = backend or NATURAL_BACKEND[device_type]
    index = int(env.get("LOCAL_RANK", "0")) if device_type == "cuda" else None
    raw = env.get(INIT_TIMEOUT_ENV)
    timeout = None
    if raw is not None:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds < math.inf:
            raise MeshError(requires("realize", f"a positive number of seconds in ${INIT_TIMEOUT_ENV}",
                                     INIT_TIMEOUT_ENV, raw, "unset for torch's default"))
        timeout = datetime.timedelta(seconds=seconds)
    return InitPlan(backend, device_type, index, timeout)


def check_device_type(device_type: object) -> None:
    if not isinstance(device_type, str):
        raise TypeError(requires("realize", "a str device_type", "device_type", device_type, tuple(NATURAL_BACKEND)))
    if device_type not in NATURAL_BACKEND:
        raise MeshError(requires("realize", "a supported device type", "device_type", device_type,
                                 tuple(NATURAL_BACKEND)))


def resolve_backend(default_backend: str, device_type: str | None, backend: str | None,
                    cuda_available: bool) -> tuple[str, str, str | None]:
    """``(device_type, backend name for the cache key, backend argument for new_group)``.

    ``device_type=None`` follows the default group's backend; ``backend=None`` means the
    default group's backend when it serves the device type (as in ``new_group``), else the
    natural backend of the device type (gloo for cpu under an NCCL default). Under torch's
    single-process ``fake`` backend every group is fake and ``new_group`` gets ``None``.
    """
    as_backend(backend)
    default_backend = default_backend.lower()
    if device_type is None:
        if default_backend == "nccl":
            device_type = "cuda"
        elif default_backend in ("gloo", "fake"):
            device_type = "cpu"
        else:  # e.g. "cpu:gloo,cuda:nccl"
            device_type = "cuda" if cuda_available and "cuda" in default_backend else "cpu"
    check_device_type(device_type)
    if default_backend == "fake":
        if backend not in (None, "fake"):
            raise MeshError(requires("realize", "backend=None under torch's fake process group", "backend",
                                     backend, "None"))
        return device_type, "fake", None
    if backend is None:
        serves = default_backend == NATURAL_BACKEND[device_type] or f"{device_type}:" in default_backend
        if serves:
            return device_type, default_backend, None
        backend = NATURAL_BACKEND[device_type]
    return device_type, backend.lower(), backend


def as_backend(backend: object) -> str | None:
    if backend is not None and not isinstance(backend, str):
        raise TypeError(requires("realize", "backend=None or a backend name (a str)", "backend", backend))
    return backend


def creation_method(rows: Sequence[tuple[int, ...]], world_size: int, default_backend: str, backend: str,
                    bound_device: bool, borrow: bool = True) -> str:
    """How one axis's missing groups are made: "none", "default", "split" or "new_group".

    - "none": a size-1 axis (every row one rank): nothing to communicate, so no group at all, on
      every backend. Nothing is created, so every rank's group counter stays where it was
      (torch >= 2.14 counts local groups too, docs/design.md "Size-1 axes"); torch APIs that want a group for
      such a dim are lent this rank's one-rank group on the fake backend (``RealizedMesh.group``).
    - "default": the only group is the whole world in ascending order, the backend is the
      default one and so are the other settings (``borrow``: no options, no timeout other than
      the default group's): reuse the default group (no call).
    - "split": one ``split_group`` call for the axis (the default group is bound to a device and
      can split, the requested backend is the default's -- NCCL, or the fake backend that
      simulates it -- and every group is ascending; ``split_group`` always sorts members).
    - "new_group": one ``new_group(ranks, sort_ranks=False)`` per missing tuple, on every rank.
    """
    if all(len(r) == 1 for r in rows):
        return "none"
    if len(rows) == 1 and rows[0] == tuple(range(world_size)) and backend == default_backend.lower() and borrow:
        return "default"
    ascending = all(all(a < b for a, b in zip(r, r[1:])) for r in rows)
    if default_backend.lower() in ("nccl", "fake") and backend == default_backend.lower() and bound_device and ascending:
        return "split"
    return "new_group"


def as_timeout(timeout: object) -> datetime.timedelta | None:
    rule = "timeout=None, a positive timedelta or a positive, finite number of seconds"
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        if timeout > datetime.timedelta(0):
            return timeout
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        if 0 < timeout < math.inf:
            try:
                return datetime.timedelta(seconds=timeout)
            except OverflowError:  # beyond timedelta's ~2.7 million years
                pass
    else:
        raise TypeError(requires("realize", rule, "timeout", timeout))
    raise MeshError(requires("realize", rule, "timeout", timeout))


class AxisSettings(NamedTuple):
    """The settings of one realized axis (or product): part of its cache key and of the check."""

    backend: str  # the backend's name (the cache key): "gloo", "nccl", ...
    backend_arg: str | None  # what new_group gets (None: the default group's backend)
    timeout: datetime.timedelta | None  # None: torch's default for new groups
    pg_options: Any  # the backend's options object, or None
    options_text: str  # describe_options(pg_options): what is compared across ranks and keys the cache

    @property
    def key(self) -> tuple[str, float | None, str]:
        return self.backend, self.timeout.total_seconds() if self.timeout else None, self.options_text

    def describe(self) -> str:
        timeout = f"{self.timeout.total_seconds():g} s" if self.timeout else "default"
        return f"{self.backend}, timeout {timeout}, pg_options {self.options_text}"


def per_axis(mesh: Mesh, keys: Sequence[str | tuple[str, ...]], value: object, what: str,
             convert: Any) -> dict[Any, Any]:
    """``value`` for each realized key: one value for all, or a mapping from an axis name or a
    product tuple (one of ``products=``) to a value; a key left out gets ``convert(None)``."""
    if not isinstance(value, Mapping):
        one = convert(value)
        return dict.fromkeys(keys, one)
    products = [k for k in keys if isinstance(k, tuple)]
    given: dict[Any, Any] = {}
    for raw, v in value.items():
        if isinstance(raw, str):
            axis_position(mesh, raw, "realize")  # unknown axis: the error, with "did you mean"
            key: Any = raw
        else:
            names = as_name_tuple("realize", raw, what)
            key = names[0] if len(names) == 1 else names
            if len(names) == 1:
                axis_position(mesh, key, "realize")
            elif names not in products:
                raise MeshError(requires("realize", f"{what} keys that are axis names or products passed in "
                                         "products=", what, names, tuple(mesh.axis_names) + tuple(products)),
                                mesh=mesh)
        if key in given:
            raise MeshError(requires("realize", f"one {what} per axis", what, value) + f" (twice for {key!r})",
                            mesh=mesh)
        given[key] = convert(v)
    default = convert(None)
    return {k: given.get(k, default) for k in keys}


def describe_options(options: object) -> str:
    """What ranks compare (and the cache keys) for a ``pg_options`` object: its type and public fields.

    Options objects (``ProcessGroupNCCL.Options``, ...) do not compare by value and cannot be
    sent between ranks, so their type name and their public, plain-valued attributes stand for
    them (one level deep for a nested config object such as NCCL's ``config``); methods and
    private attributes are left out.
    """
    if options is None:
        return "None"
    return _fields(options, depth=1)


def _fields(obj: object, depth: int) -> str:
    parts = []
    for name in sorted(dir(obj)):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # a property that raises is not a field we can compare
            continue
        if callable(value):
            continue
        if value is None or isinstance(value, (bool, int, float, str, datetime.timedelta)):
            parts.append(f"{name}={value!r}")
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            parts.append(f"{name}={list(value)!r}")
        elif depth > 0:
            parts.append(f"{name}={_fields(value, depth - 1)}")
    return f"{type(obj).__qualname__}({', '.join(parts)})"


def axis_report(mesh: Mesh, families: Sequence[tuple[Any, Mesh, int]], ranks_per_host: str | None) -> list[str]:
    """The log lines of one realize call: per axis (or product), size, groups, new groups, host span.

    ``ranks_per_host`` is torchrun's ``LOCAL_WORLD_SIZE`` (a string, or ``None`` outside torchrun).
    """
    per_host = int(ranks_per_host) if ranks_per_host and ranks_per_host.isdigit() and int(ranks_per_host) else None
    lines = []
    for key, family, created in families:
        (name,) = family.axis_names
        span = (family.host_span(per_host)[name] + f" ({per_host} ranks per host)" if per_host
                else "host span unknown (LOCAL_WORLD_SIZE unset)")
        label = key if isinstance(key, str) else "×".join(key)
        lines.append(f"realize {mesh!r}: axis {label} size={family.size} groups={family.num_groups} "
                     f"new_groups={created} {span}")
    return lines


def product_axes(mesh: Mesh, products: Iterable[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    if isinstance(products, (str, bytes)) or not isinstance(products, Iterable):
        raise TypeError(requires("realize", "an iterable of tuples of axis names for products", "products",
                                 products))
    out = []
    for axes in products:
        names = as_name_tuple("realize", axes, "products")
        select(mesh, names, "realize")  # validates: known, distinct, non-empty
        out.append(names)
    return tuple(out)


def realized_axes(mesh: Mesh, axes: Iterable[str] | None) -> tuple[str, ...]:
    """The axes whose groups a realize call makes: ``None`` means all of them, in mesh order."""
    if axes is None:
        return mesh.axis_names
    if isinstance(axes, (str, bytes)) or not isinstance(axes, Iterable):
        raise TypeError(requires("realize", "axes=None or an iterable of axis names", "axes", axes))
    names = as_name_tuple("realize", tuple(axes), "axes")
    if names:
        select(mesh, names, "realize")  # validates: known (with "did you mean"), distinct
    return tuple(n for n in mesh.axis_names if n in names)


def describe_request(mesh: Mesh, device_type: str, settings: Mapping[Any, AxisSettings], products: tuple,
                     axes: tuple[str, ...] | None = None, adopted: tuple = ()) -> str:
    """The text every rank compares before a realize call (the divergence check)."""
    layouts = ",".join(f"{n}={mesh.axis_layout(n)}" for n in mesh.axis_names)
    described = {s.describe() for s in settings.values()}
    if len(described) == 1:  # one setting for every axis: said once
        setting = f"settings=({described.pop()})"
    else:
        setting = "settings=(" + "; ".join(f"{k if isinstance(k, str) else '×'.join(k)}: {s.describe()}"
                                           for k, s in settings.items()) + ")"
    text = (f"{mesh!r} [{layouts}; devices {mesh.device_list.digest()}] device_type={device_type} "
            f"{setting} products={products}")
    if axes is not None and axes != mesh.axis_names:
        text += f" axes={axes}"
    if adopted:  # keys whose groups the caller made (realize(groups=...)): the groups themselves are local
        text += f" adopted={adopted}"
    return text
