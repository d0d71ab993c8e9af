"""``realize``: the one effectful step. Process groups for a mesh value, cached by layout.

Every rank of the default group calls ``realize(mesh)`` with equal meshes, in the same
order. Groups are cached in two levels:

1. an *axis key* (the axis's canonical layout, the device list, device type, backend and
   options) maps to the axis's groups, so a repeated or equivalent axis is a pure lookup;
2. each group is held under its *ordered* member tuple (+ backend + options), so an axis
   reached by another path (another name, another device list, a flatten or an unflatten)
   shares every group that already exists and creates only the missing ones.

Creation is one deterministic pass that every rank makes in the same order: ``split_group``
per axis when the default group is NCCL bound to a device and the axis's groups are ascending,
else one ``new_group`` per missing member tuple with ``sort_ranks=False``, so a member's group
rank *is* its coordinate along the axis (mesh order). Size-1 axes get local singleton groups
(no communication). An axis whose only group is the whole world, ascending, reuses the
default group.

Only this module (and what it calls) creates process groups.
"""

from __future__ import annotations

import contextvars
import datetime
import logging
import math
import os
import sys
import threading
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ._agree import _agree
from .errors import MeshError, requires
from .mesh import Mesh, _name_tuple

__all__ = [
    "CacheInfo",
    "RealizedMesh",
    "cache_info",
    "clear_cache",
    "current_mesh",
    "realize",
]

CHECK_TIMEOUT_ENV = "FUNCTIONAL_MESH_CHECK_TIMEOUT"
DEFAULT_CHECK_TIMEOUT_S = 60.0
_STORE_PREFIX = "functional_mesh/realize"
_NATURAL_BACKEND = {"cpu": "gloo", "cuda": "nccl"}
# One line per axis per realize call (size, groups, new groups, host span): INFO on rank 0, DEBUG
# elsewhere; silent unless enabled, e.g. logging.basicConfig(level=logging.INFO).
_LOG = logging.getLogger("functional_mesh.realize")


# -- decisions (pure, unit-tested) -------------------------------------------------------------


class InitPlan(NamedTuple):
    """How realize initialises the default group when none exists."""

    backend: str
    device_type: str
    device_index: int | None  # CUDA: the current device and NCCL's bound device_id


def plan_init(env: dict[str, str], cuda_available: bool, device_type: str | None, backend: str | None) -> InitPlan:
    """The default-group plan from the torchrun environment (``RANK``, ``WORLD_SIZE``, ...).

    CUDA takes its device from ``LOCAL_RANK`` (torchrun sets it; 0 when absent) and binds NCCL
    to it, so ``split_group`` is available later.
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise MeshError(
            requires("realize", "an initialised torch.distributed job or the torchrun environment",
                     "missing environment variables", missing)
            + "; run under torchrun, or call torch.distributed.init_process_group first"
        )
    device_type = device_type or ("cuda" if cuda_available else "cpu")
    _check_device_type(device_type)
    if device_type == "cuda" and not cuda_available:
        raise MeshError(requires("realize", "an available device type", "device_type", "cuda", "'cpu'"))
    backend = backend or _NATURAL_BACKEND[device_type]
    index = int(env.get("LOCAL_RANK", "0")) if device_type == "cuda" else None
    return InitPlan(backend, device_type, index)


def _check_device_type(device_type: object) -> None:
    if not isinstance(device_type, str):
        raise TypeError(requires("realize", "a str device_type", "device_type", device_type, tuple(_NATURAL_BACKEND)))
    if device_type not in _NATURAL_BACKEND:
        raise MeshError(requires("realize", "a supported device type", "device_type", device_type,
                                 tuple(_NATURAL_BACKEND)))


def resolve_backend(default_backend: str, device_type: str | None, backend: str | None,
                    cuda_available: bool) -> tuple[str, str, str | None]:
    """``(device_type, backend name for the cache key, backend argument for new_group)``.

    ``device_type=None`` follows the default group's backend; ``backend=None`` means the
    default group's backend when it serves the device type (as in ``new_group``), else the
    natural backend of the device type (gloo for cpu under an NCCL default). Under torch's
    single-process ``fake`` backend every group is fake and ``new_group`` gets ``None``.
    """
    if backend is not None and not isinstance(backend, str):
        raise TypeError(requires("realize", "backend=None or a backend name (a str)", "backend", backend))
    default_backend = default_backend.lower()
    if device_type is None:
        if default_backend == "nccl":
            device_type = "cuda"
        elif default_backend in ("gloo", "fake"):
            device_type = "cpu"
        else:  # e.g. "cpu:gloo,cuda:nccl"
            device_type = "cuda" if cuda_available and "cuda" in default_backend else "cpu"
    _check_device_type(device_type)
    if default_backend == "fake":
        if backend not in (None, "fake"):
            raise MeshError(requires("realize", "backend=None under torch's fake process group", "backend",
                                     backend, "None"))
        return device_type, "fake", None
    if backend is None:
        serves = default_backend == _NATURAL_BACKEND[device_type] or f"{device_type}:" in default_backend
        if serves:
            return device_type, default_backend, None
        backend = _NATURAL_BACKEND[device_type]
    return device_type, backend.lower(), backend


def creation_method(rows: Sequence[tuple[int, ...]], world_size: int, default_backend: str, backend: str,
                    bound_device: bool) -> str:
    """How one axis's missing groups are made: "default", "local", "split" or "new_group".

    - "default": the only group is the whole world in ascending order and the backend is the
      default one: reuse the default group (no call).
    - "local": singleton groups: each member makes its own, with local synchronisation.
    - "split": one ``split_group`` call for the axis (NCCL default group bound to a device,
      NCCL requested, every group ascending; ``split_group`` always sorts members).
    - "new_group": one ``new_group(ranks, sort_ranks=False)`` per missing tuple, on every rank.
    """
    if len(rows) == 1 and rows[0] == tuple(range(world_size)) and backend == default_backend.lower():
        return "default"
    if all(len(r) == 1 for r in rows):
        return "local"
    ascending = all(all(a < b for a, b in zip(r, r[1:])) for r in rows)
    if default_backend.lower() == "nccl" and backend == "nccl" and bound_device and ascending:
        return "split"
    return "new_group"


def check_timeout_seconds(check: bool | float, env: Mapping[str, str], api: str = "realize") -> float | None:
    """The divergence-check wait: ``None`` when off; ``check`` seconds, the env var, or 60 s."""
    if check is False:
        return None
    if check is True:
        raw = env.get(CHECK_TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_CHECK_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            raise MeshError(requires(api, f"a number of seconds in ${CHECK_TIMEOUT_ENV}", CHECK_TIMEOUT_ENV,
                                     raw)) from None
    elif isinstance(check, (int, float)) and not isinstance(check, bool):
        value = float(check)
    else:
        raise TypeError(requires(api, "check=True, False or a number of seconds", "check", check))
    if not 0 < value < math.inf:  # also refuses NaN
        raise MeshError(requires(api, "a positive, finite check timeout", "check", value))
    return value


def _timeout_td(timeout: object) -> datetime.timedelta | None:
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


# -- the cache ---------------------------------------------------------------------------------


class CacheInfo(NamedTuple):
    """``hits``/``misses``: axis lookups; ``groups``: distinct member tuples groups were made for."""

    hits: int
    misses: int
    groups: int


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.axes: dict[tuple, Any] = {}  # axis key -> this rank's group of that axis (None: not a member)
        self.groups: dict[tuple, Any] = {}  # (members, backend, options) -> ProcessGroup | None
        self.created: list[Any] = []  # ProcessGroups this process made (destroyed by clear_cache)
        self.made = 0  # distinct member tuples made (members or not; equal on every rank)
        self.hits = 0
        self.misses = 0
        self.epoch = 0
        self.calls = 0  # checked realize calls, for the divergence check's store keys


_CACHE = _Cache()


def cache_info() -> CacheInfo:
    """Hits and misses of axis lookups, and how many distinct groups were created."""
    with _CACHE.lock:
        return CacheInfo(_CACHE.hits, _CACHE.misses, _CACHE.made)


def clear_cache() -> None:
    """Destroy every process group realize created (and no other), and forget all keys.

    Realized meshes from before the call raise ``MeshError`` when used.
    """
    with _CACHE.lock:
        created, _CACHE.created = _CACHE.created, []
        _CACHE.axes.clear()
        _CACHE.groups.clear()
        _CACHE.made = _CACHE.hits = _CACHE.misses = 0
        _CACHE.epoch += 1
        if dist.is_initialized():
            for pg in created:
                dist.destroy_process_group(pg)


# -- realize -----------------------------------------------------------------------------------


def realize(
    mesh: Mesh,
    device_type: str | None = None,
    *,
    backend: str | None = None,
    timeout: float | datetime.timedelta | None = None,
    check: bool | float = True,
    products: Iterable[Sequence[str]] = (),
) -> RealizedMesh:
    """Create (or look up) the process groups of every axis of ``mesh``; a collective call.

    Every rank of the default group must call it, in the same order, with an equal mesh.
    Initialises the default group from the torchrun environment when none exists.

    Args:
        mesh: the mesh value. Its devices must be ranks of the world.
        device_type: "cpu" or "cuda"; ``None`` follows the default group's backend (or CUDA
            when available if realize initialises the default group).
        backend: ``None`` = the default group's backend when it serves ``device_type`` (as in
            ``new_group``), else gloo for cpu and NCCL for cuda.
        timeout: timeout of the created groups (seconds or a timedelta); ``None`` = torch's.
        check: compare the request across all ranks first and raise ``MeshError`` on every
            rank that got there when they differ or one never arrives: ``True`` (wait
            ``$FUNCTIONAL_MESH_CHECK_TIMEOUT`` or 60 s), ``False``, or a number of seconds.
        products: tuples of axis names whose product groups to create as well, for
            tuple-axis collectives (``products=[("dp", "cp")]``).

    Returns:
        The realized mesh: ``rm.group("tp")``, ``rm.coordinate``, ``rm.device_mesh``, ...
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(requires("realize", "a functional_mesh.Mesh", "mesh", mesh))
    timeout_td = _timeout_td(timeout)
    wait_s = check_timeout_seconds(check, os.environ)
    product_axes = _product_axes(mesh, products)
    if not dist.is_initialized():
        _init_default(device_type, backend, timeout_td)
    default_backend = str(dist.get_backend())
    device_type, backend_name, backend_arg = resolve_backend(default_backend, device_type, backend,
                                                             torch.cuda.is_available())
    _check_available(device_type, backend_name, backend_arg)
    world, rank = dist.get_world_size(), dist.get_rank()
    if mesh.device_list.max() >= world:
        raise MeshError(requires("realize", f"devices that are ranks of the world (0..{world - 1})",
                                 "largest device", mesh.device_list.max()), mesh=mesh)
    options = (timeout_td.total_seconds() if timeout_td else None,)
    if wait_s is not None and backend_name != "fake":
        with _CACHE.lock:  # only checked calls are numbered: a rank's unchecked lookups shift nothing
            _CACHE.calls += 1
            call = _CACHE.calls
        request = _describe(mesh, device_type, backend_name, options, product_axes)
        _check_same_request(call, request, rank, world, wait_s)
    families = [(name, mesh[name]) for name in mesh.axis_names]
    families += [(axes, mesh[axes].flatten(name="product")) for axes in product_axes]
    plan = _Plan(device_type, backend_name, backend_arg, options, timeout_td, world, rank, default_backend)
    groups: dict[Any, Any] = {}
    made: dict[Any, int] = {}
    with _CACHE.lock:
        for key, family in families:
            before = _CACHE.made
            groups[key] = plan.group_of_rank(family)
            made[key] = _CACHE.made - before
        epoch = _CACHE.epoch
    level = logging.INFO if rank == 0 else logging.DEBUG  # the lines are equal on every rank
    if _LOG.isEnabledFor(level):
        for line in axis_report(mesh, [(key, family, made[key]) for key, family in families],
                                os.environ.get("LOCAL_WORLD_SIZE")):
            _LOG.log(level, "rank %d: %s", rank, line)
    return RealizedMesh(mesh, device_type, backend_name, groups, rank, epoch, root=None)


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


def _check_available(device_type: str, backend_name: str, backend_arg: str | None) -> None:
    """Refuse, before any group is made, a backend this torch lacks or CUDA without a GPU."""
    if backend_name == "fake":
        return
    if device_type == "cuda" and not torch.cuda.is_available():
        raise MeshError(requires("realize", "an available device type", "device_type", "cuda", "'cpu'"))
    if backend_arg is not None and not dist.is_backend_available(backend_name):
        valid = [b for b in dist.Backend.backend_list if b != "undefined" and dist.is_backend_available(b)]
        raise MeshError(requires("realize", "a backend available in this torch build", "backend", backend_arg, valid))


def _product_axes(mesh: Mesh, products: Iterable[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    if isinstance(products, (str, bytes)) or not isinstance(products, Iterable):
        raise TypeError(requires("realize", "an iterable of tuples of axis names for products", "products",
                                 products))
    out = []
    for axes in products:
        names = _name_tuple("realize", axes, "products")
        mesh[names]  # validates: known, distinct, non-empty
        out.append(names)
    return tuple(out)


def _init_default(device_type: str | None, backend: str | None, timeout: datetime.timedelta | None) -> None:
    plan = plan_init(dict(os.environ), torch.cuda.is_available(), device_type, backend)
    kwargs: dict[str, Any] = {"backend": plan.backend}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if plan.device_index is not None:
        torch.cuda.set_device(plan.device_index)
        kwargs["device_id"] = torch.device("cuda", plan.device_index)
    dist.init_process_group(**kwargs)


def _describe(mesh: Mesh, device_type: str, backend: str, options: tuple, products: tuple) -> str:
    layouts = ",".join(f"{n}={mesh.axis_layout(n)}" for n in mesh.axis_names)
    text = (f"{mesh!r} [{layouts}; devices {mesh.device_list.digest()}] device_type={device_type} "
            f"backend={backend} options={options} products={products}")
    return text


class _Plan:
    """One realize call's parameters; makes (or finds) the groups of an axis family."""

    def __init__(self, device_type: str, backend: str, backend_arg: str | None, options: tuple,
                 timeout: datetime.timedelta | None, world: int, rank: int, default_backend: str) -> None:
        self.device_type, self.backend, self.backend_arg = device_type, backend, backend_arg
        self.options, self.timeout, self.world, self.rank = options, timeout, world, rank
        self.default_backend = default_backend

    def group_of_rank(self, family: Mesh) -> Any:
        """This rank's group of the 1-axis ``family`` (``None`` when not a member)."""
        (name,) = family.axis_names
        axis_key = (family.axis_layout(name), family.device_list, self.device_type, self.backend, self.options)
        if axis_key in _CACHE.axes:  # a hit: O(1), whatever the world size
            _CACHE.hits += 1
            return _CACHE.axes[axis_key]
        _CACHE.misses += 1
        rows = tuple(tuple(r) for r in family.groups().reshape(family.num_groups, -1).tolist())
        try:
            self._create(rows)
        except MeshError:
            raise
        except RuntimeError as exc:  # c10d's DistStoreError / gloo errors: a member died or stopped
            timeout = f"{self.timeout.total_seconds():g} s" if self.timeout else "torch's default timeout"
            raise MeshError(
                f"`realize` could not create the process groups of axis {name!r} (first {list(rows[0])}, "
                f"{len(rows)} in all) within {timeout}: a member rank probably died or stopped calling realize "
                f"(set realize(..., timeout=seconds) to fail sooner); torch said: {exc}") from exc
        group = family.group_of(self.rank)
        mine = None if group is None else _CACHE.groups[(tuple(group.reshape(-1).tolist()), self.backend,
                                                          self.options)]
        _CACHE.axes[axis_key] = mine
        return mine

    def _create(self, rows: tuple[tuple[int, ...], ...]) -> None:
        missing = [r for r in rows if (r, self.backend, self.options) not in _CACHE.groups]
        if not missing:
            return
        default = dist.distributed_c10d._get_default_group()
        method = creation_method(missing, self.world, self.default_backend, self.backend,
                                 bool(getattr(default, "bound_device_id", None)))
        kwargs: dict[str, Any] = {"timeout": self.timeout}
        if method == "default":
            _CACHE.groups[(missing[0], self.backend, self.options)] = default
            return
        if method == "local":
            for row in missing:
                pg = None
                if row[0] == self.rank:
                    pg = dist.new_group(list(row), backend=self.backend_arg, use_local_synchronization=True,
                                        **kwargs)
                    _CACHE.created.append(pg)
                self._store(row, pg)
            return
        if method == "split":
            pg = dist.split_group(split_ranks=[list(r) for r in missing], **kwargs)
            if pg is not None:
                _CACHE.created.append(pg)
            for row in missing:
                self._store(row, pg if self.rank in row else None)
            return
        for row in missing:  # every rank, same order: c10d names groups by a shared counter
            pg = dist.new_group(list(row), backend=self.backend_arg, sort_ranks=False, **kwargs)
            if pg is dist.GroupMember.NON_GROUP_MEMBER or pg is None:
                pg = None
            else:
                _CACHE.created.append(pg)
            self._store(row, pg)

    def _store(self, row: tuple[int, ...], pg: Any) -> None:
        _CACHE.groups[(row, self.backend, self.options)] = pg
        _CACHE.made += 1


# -- divergence check (the agreement itself lives in _agree.py) ----------------------------------


def _check_same_request(call: int, request: str, rank: int, world: int, wait_s: float) -> None:
    """realize's check: the whole world, led by rank 0, compares the request of call ``call``."""
    _agree("realize", "every rank to call it with an equal mesh", f"realize call #{call}",
           f"{_STORE_PREFIX}/{call}", range(world), rank, request, wait_s)


# -- the realized mesh -------------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[tuple[RealizedMesh, ...]] = contextvars.ContextVar("functional_mesh_current",
                                                                                     default=())


def current_mesh() -> RealizedMesh | None:
    """The innermost ``with rm:`` mesh of this thread/task, or ``None``."""
    stack = _CURRENT.get()
    return stack[-1] if stack else None


class RealizedMesh:
    """A mesh value with this rank's process groups. Made by :func:`realize`; not picklable.

    Attributes:
        mesh: the pure :class:`Mesh`.
        device_type: "cpu" or "cuda".
        backend: the groups' backend ("gloo", "nccl", or "fake" under torch's fake group).
        rank: this process's global rank.
        coordinate: this rank's coordinate in its submesh (mesh order), ``None`` if outside.
    """

    def __init__(self, mesh: Mesh, device_type: str, backend: str, groups: dict[Any, Any], rank: int,
                 epoch: int, root: RealizedMesh | None) -> None:
        self.mesh = mesh
        self.device_type = device_type
        self.backend = backend
        self.rank = rank
        self.coordinate = mesh.coordinate(rank)
        self._groups = groups  # axis name or product tuple -> ProcessGroup | None
        self._epoch = epoch
        self._root = root
        self._device_mesh: Any = None

    def _check_alive(self, api: str) -> None:
        if self._epoch != _CACHE.epoch:
            raise MeshError(f"`{api}` requires a realized mesh whose groups still exist, but got {self!r}, "
                            f"whose groups clear_cache() destroyed; call realize(mesh) again")

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self.mesh.axis_names

    def axis_size(self, axis: str) -> int:
        """Size of ``axis`` (no communication)."""
        return self.mesh.axis_size(axis)

    def group(self, axis: str | Sequence[str]) -> Any:
        """This rank's ``ProcessGroup`` for ``axis`` (``None`` when this rank is outside the mesh).

        A tuple of axes gives the product group when it was realized (``products=``).
        """
        self._check_alive("RealizedMesh.group")
        if isinstance(axis, str):
            self.mesh.axis_index_of(axis, "RealizedMesh.group")
            return self._groups[axis]
        names = _name_tuple("RealizedMesh.group", axis, "axis")
        if len(names) == 1:
            return self.group(names[0])
        self.mesh[names]
        if names not in self._groups:
            raise MeshError(requires("RealizedMesh.group", "a product of axes that was realized", "axis", names,
                                     tuple(k for k in self._groups if isinstance(k, tuple)))
                            + f"; pass products=[{names!r}] to realize", mesh=self.mesh)
        return self._groups[names]

    def has_group(self, axes: tuple[str, ...]) -> bool:
        """True when the product group of ``axes`` was realized with this mesh."""
        return axes in self._groups

    @property
    def device(self) -> torch.device:
        """This rank's device: ``cuda:<current device>`` (realize set it from LOCAL_RANK) or ``cpu``."""
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device_type)

    def local_rank(self, axis: str) -> int:
        """This rank's index along ``axis`` (its coordinate; also its group rank)."""
        i = self.mesh.axis_index_of(axis, "RealizedMesh.local_rank")
        if self.coordinate is None:
            raise MeshError(requires("RealizedMesh.local_rank", "a rank that belongs to the mesh", "rank",
                                     self.rank, f"devices {self.mesh.device_list.describe()}"), mesh=self.mesh)
        return self.coordinate[i]

    def __getitem__(self, names: str | Sequence[str]) -> RealizedMesh:
        """A realized selection, served from the cache (no communication, no new groups)."""
        self._check_alive("RealizedMesh[...]")
        sub = self.mesh[names]
        groups = {n: self._groups[n] for n in sub.axis_names}
        root = self._root or self
        return RealizedMesh(sub, self.device_type, self.backend, groups, self.rank, self._epoch, root)

    @property
    def device_mesh(self) -> Any:
        """A torch ``DeviceMesh`` over the same groups (``None`` on ranks outside the mesh).

        Built once, lazily, with ``DeviceMesh.from_group`` (no new groups). A selection whose
        axes keep the root's order is a slice of the root's ``device_mesh``, so FSDP2 and
        tensor parallel can share one torch root.
        """
        self._check_alive("RealizedMesh.device_mesh")
        if self.coordinate is None:
            return None
        if self._device_mesh is None:
            from .interop import device_mesh_of

            with _CACHE.lock:  # one torch mesh per realized mesh, even when threads ask at once
                if self._device_mesh is None:
                    self._device_mesh = device_mesh_of(self)
        return self._device_mesh

    def __enter__(self) -> RealizedMesh:
        self._check_alive("with RealizedMesh")
        _CURRENT.set(_CURRENT.get() + (self,))
        return self

    def __exit__(self, *exc: object) -> None:
        # The stack is per thread/task (a context variable), so no token is kept on the shared
        # object: two threads may enter and leave the same realized mesh in any order.
        _CURRENT.set(_CURRENT.get()[:-1])

    def __reduce__(self):
        raise TypeError(
            "a RealizedMesh holds live process groups and cannot be pickled; pickle rm.mesh (a pure Mesh) "
            "and call realize() on it in the receiving job"
        )

    def __repr__(self) -> str:
        where = "outside the mesh" if self.coordinate is None else f"coordinate {self.coordinate}"
        return f"RealizedMesh({self.mesh!r}, {self.backend}, rank {self.rank}: {where})"


class _RealizeModule(types.ModuleType):
    """This module, callable as :func:`realize`.

    Importing ``functional_mesh.realize`` makes Python bind the *module* to the package
    attribute ``functional_mesh.realize``, shadowing the function of the same name; calling the
    module keeps ``fm.realize(mesh)`` right whichever import came first.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> RealizedMesh:
        return realize(*args, **kwargs)


sys.modules[__name__].__class__ = _RealizeModule
