"""realize's decisions, as pure functions of their inputs (no torch, no process group).

:func:`plan` makes one frozen :class:`RealizePlan` of a :func:`functional_mesh.realize` call before any
effect (docs/design.md, "One plan, then its effects"); ``_realize.py`` carries it out.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from ._errors import MeshError, requires
from ._mesh import Mesh, axis_position, select
from ._validate import as_name_tuple

__all__ = ["INIT_TIMEOUT_ENV", "AxisSettings", "DefaultGroup", "InitPlan", "RealizePlan", "Surroundings", "as_backend",
           "as_timeout", "axis_report", "check_device_type", "creation_method", "describe_options",
           "describe_request", "per_axis", "plan", "plan_init", "product_axes", "realized_axes", "resolve_backend"]

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

    CUDA binds NCCL to ``LOCAL_RANK``'s device (0 when absent); the bound is ``$FUNCTIONAL_MESH_INIT_TIMEOUT``
    or torch's default (docs/design.md, "Failures and start-up").
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

    The rules: docs/realize.md, step 2; under torch's ``fake`` backend every group is fake (``None``).
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

    "none" for a size-1 axis, "default" for the whole world ascending with the default group's
    settings (``borrow``), "split" where the default group can split (NCCL or the fake backend, every
    group ascending), else "new_group": docs/design.md, "Creation" and "Size-1 axes".
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

    Options objects neither compare by value nor travel, so their type name and public plain-valued
    attributes stand for them (one level deep, for NCCL's ``config``).
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


def describe_request(mesh: Mesh, device_type: str, settings: Mapping[Any, AxisSettings],
                     products: tuple[tuple[str, ...], ...], axes: tuple[str, ...] | None = None,
                     adopted: tuple[str | tuple[str, ...], ...] = ()) -> str:
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


# -- the whole plan of one call ------------------------------------------------------------------


class DefaultGroup(NamedTuple):
    """The job's default group as realize finds it (queries of torch, made before planning)."""

    backend: str  # str(torch.distributed.get_backend())
    world: int
    rank: int
    can_split: bool = False  # bound to a device whose backend splits (asked only for members_only)


class Surroundings(NamedTuple):
    """What realize reads of the process and of torch before it plans: values and queries, no effects."""

    env: Mapping[str, str]  # os.environ: the torchrun variables, when no default group exists
    default: DefaultGroup | None  # None: no default group yet; the plan starts one first
    cuda_available: bool
    backend_available: Callable[[str], bool]  # torch.distributed.is_backend_available
    known_backends: Sequence[str]  # torch.distributed.Backend.backend_list: the valid choices named in errors
    is_group: Callable[[object], bool]  # isinstance(value, torch.distributed.ProcessGroup)


@dataclass(frozen=True)
class RealizePlan:
    """Everything one realize call decided, before any effect; ``_realize`` carries it out in order:

    1. ``init``: start the default group (when none existed), its collectives then bounded by ``init_timeout``;
    2. ``request``: compare it among the ranks that called (``None``: no check), within ``wait_s``;
    3. make or look up the groups of ``families`` but the ``adopted`` ones, and return the handle.
    """

    mesh: Mesh
    init: InitPlan | None
    init_timeout: datetime.timedelta | None
    default_backend: str
    device_type: str
    backend: str  # the backend's name for the request (fake under the fake backend)
    settings: Mapping[Any, AxisSettings]
    axes: tuple[str, ...]
    products: tuple[tuple[str, ...], ...]
    families: tuple[tuple[Any, Mesh, AxisSettings], ...]  # (key, its one-axis family, its settings), mesh order
    adopted: Mapping[Any, Any]  # key -> the caller's group (groups=)
    world: int
    rank: int
    member: bool
    members_only: bool
    wait_s: float | None
    request: str | None


def plan(mesh: Mesh, device_type: str | None, *, backend: Any, timeout: Any, pg_options: Any, wait_s: float | None,
         products: Iterable[Sequence[str]], axes: Iterable[str] | None, members_only: bool,
         groups: Mapping[Any, Any] | None, found: Surroundings) -> RealizePlan:
    """The plan of ``realize(mesh, device_type, ...)`` in surroundings ``found``: a pure function.

    Every argument is checked here, in the order realize's errors are documented, so that a bad
    one raises before any group (the default group included) is made. ``wait_s`` is the check's
    wait, already read (``_agree.as_check_timeout``).
    """
    products_t = product_axes(mesh, products)
    axes_t = realized_axes(mesh, axes)
    keys: list[Any] = [*axes_t, *products_t]
    adopted = _adopted_groups(mesh, keys, groups, found.is_group)
    default = found.default
    if members_only and default is None:
        raise MeshError(requires("realize", "an initialised default group for members_only=True (its store is "
                                 "where the members meet)", "torch.distributed.is_initialized()", False)
                        + "; call torch.distributed.init_process_group on every rank first", mesh=mesh)
    timeouts = per_axis(mesh, keys, timeout, "timeout", as_timeout)
    backends = per_axis(mesh, keys, backend, "backend", as_backend)
    options = per_axis(mesh, keys, pg_options, "pg_options", lambda v: v)
    one_backend = None if isinstance(backend, Mapping) else as_backend(backend)
    cuda = found.cuda_available
    init = init_timeout = None
    if default is None:
        init = plan_init(dict(found.env), cuda, device_type, one_backend)
        init_timeout = None if isinstance(timeout, Mapping) else as_timeout(timeout)
        default = DefaultGroup(init.backend.lower(), *_torchrun_world(found.env))
    device_type, backend_name, backend_arg = resolve_backend(default.backend, device_type, one_backend, cuda)
    _check_available(device_type, backend_name, backend_arg, found)
    settings: dict[Any, AxisSettings] = {}
    for key in keys:
        _, name, arg = resolve_backend(default.backend, device_type, backends[key], cuda)
        _check_available(device_type, name, arg, found)
        settings[key] = AxisSettings(name, arg, timeouts[key], options[key], describe_options(options[key]))
    if members_only and any(s.backend == "nccl" for s in settings.values()) and default.can_split:
        # torch makes an NCCL group under a device-bound default group by ncclCommSplit of the default
        # communicator, a call of every rank of the world: members alone would hang there
        raise MeshError(requires("realize", "members_only=True without NCCL groups split from a device-bound "
                                 "default group (a split is a call of every rank)", "backend", "nccl",
                                 "backend='gloo' for these axes, or a default NCCL group started without device_id"),
                        mesh=mesh)
    member = _check_rank(mesh, default.world, default.rank, members_only)
    families = tuple([(name, mesh[name], settings[name]) for name in axes_t]
                     + [(names, mesh[names].flatten(name="product"), settings[names]) for names in products_t])
    if member:
        for key, family, _ in families:
            if key in adopted:
                _check_adopted(mesh, key, family, adopted[key], default.rank)
    request = (describe_request(mesh, device_type, settings, products_t, axes_t, tuple(adopted))
               if wait_s is not None and backend_name != "fake" else None)
    return RealizePlan(mesh, init, init_timeout, default.backend, device_type, backend_name,
                       MappingProxyType(settings), axes_t, products_t, families, MappingProxyType(adopted), default.world, default.rank, member, members_only, wait_s,
                       request)


def _torchrun_world(env: Mapping[str, str]) -> tuple[int, int]:
    """``(world size, rank)`` the default group will have, from torchrun's ``WORLD_SIZE`` and ``RANK``."""
    try:
        return int(env["WORLD_SIZE"]), int(env["RANK"])
    except ValueError:
        raise MeshError(requires("realize", "integer RANK and WORLD_SIZE in the torchrun environment",
                                 "RANK, WORLD_SIZE", (env["RANK"], env["WORLD_SIZE"]))) from None


def _check_available(device_type: str, backend_name: str, backend_arg: str | None, found: Surroundings) -> None:
    """Refuse a backend this torch lacks or CUDA without a GPU."""
    if backend_name == "fake":
        return
    if device_type == "cuda" and not found.cuda_available:
        raise MeshError(requires("realize", "an available device type", "device_type", "cuda", "'cpu'"))
    if backend_arg is not None and not found.backend_available(backend_name):
        valid = [b for b in found.known_backends if b != "undefined" and found.backend_available(b)]
        raise MeshError(requires("realize", "a backend available in this torch build", "backend", backend_arg, valid))


def _check_rank(mesh: Mesh, world: int, rank: int, members_only: bool) -> bool:
    """The mesh's devices are ranks of the world, and a members-only caller is one of them; True for a member."""
    if mesh.device_list.max() >= world:
        raise MeshError(requires("realize", f"devices that are ranks of the world (0..{world - 1})",
                                 "largest device", mesh.device_list.max()), mesh=mesh)
    member = mesh.coordinate(rank) is not None
    if members_only and not member:
        raise MeshError(requires("realize", "members_only=True to be called by ranks of the mesh only", "rank",
                                 rank, f"devices {mesh.device_list.describe()}"), mesh=mesh)
    return member


def _adopted_groups(mesh: Mesh, keys: Sequence[Any], groups: Mapping[Any, Any] | None,
                    is_group: Callable[[object], bool]) -> dict[Any, Any]:
    """``groups=`` checked: each key one of the realized axes or products, each value a ProcessGroup."""
    if groups is None:
        return {}
    if not isinstance(groups, Mapping):
        raise TypeError(requires("realize", "groups=None or a mapping from an axis name (or a product tuple) "
                                 "to a ProcessGroup", "groups", groups))
    out: dict[Any, Any] = {}
    for raw, pg in groups.items():
        key = raw if isinstance(raw, str) else (tuple(raw) if isinstance(raw, (tuple, list)) else raw)
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        if key not in keys:
            raise MeshError(requires("realize", "groups= keys that are realized axes or products passed in "
                                     "products=", "groups key", raw, tuple(keys)), mesh=mesh)
        if not is_group(pg):
            raise TypeError(requires("realize", "a torch.distributed ProcessGroup for each groups= entry",
                                     f"groups[{raw!r}]", pg))
        out[key] = pg
    return out


def _check_adopted(mesh: Mesh, key: Any, family: Mesh, pg: Any, rank: int) -> None:
    """An adopted group must have the axis's size and hold this rank at its coordinate along it."""
    size = family.size
    coordinate = family.coordinate(rank)
    assert coordinate is not None  # checked by the caller: this rank is a member
    (position,) = coordinate
    label = key if isinstance(key, str) else "×".join(key)
    if pg.size() != size:
        raise MeshError(requires("realize", f"an adopted group of axis {label!r}'s size", f"groups[{key!r}]",
                                 f"a group of size {pg.size()}", size), mesh=mesh)
    if pg.rank() != position:
        raise MeshError(requires("realize", f"an adopted group that holds rank {rank} at its coordinate along "
                                 f"{label!r}", f"groups[{key!r}]",
                                 f"a group where rank {rank} is group rank {pg.rank()}", position), mesh=mesh)
