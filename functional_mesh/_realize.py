"""``realize``: the one effectful step. Process groups for a mesh value, cached by layout.

How: docs/design.md, "realize" (one frozen plan from :func:`~functional_mesh._realize_plan.plan`,
then :func:`_apply`'s effects in order: start-up, the check, the groups of ``_cache``, the handle);
what a user sees: docs/realize.md.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._agree import agree, as_check_timeout, next_call
from ._cache import CACHE, Family, Realized, Request, init_default, read_failures
from ._errors import MeshError, requires
from ._handle import RealizedMesh
from ._mesh import Mesh
from ._realize_plan import DefaultGroup, RealizePlan, Surroundings, axis_report, plan
from ._torch import can_split, default_group, key_meshes_by_job

__all__ = ["realize"]

_STORE_PREFIX = "functional_mesh/realize"
# One line per axis per realize call (size, groups, new groups, host span): INFO on rank 0, DEBUG
# elsewhere; silent unless enabled, e.g. logging.basicConfig(level=logging.INFO).
_LOG = logging.getLogger("functional_mesh.realize")


# -- realize -----------------------------------------------------------------------------------


def realize(
    mesh: Mesh,
    device_type: str | None = None,
    *,
    backend: str | None | Mapping[Any, str | None] = None,
    timeout: float | datetime.timedelta | None | Mapping[Any, float | datetime.timedelta | None] = None,
    pg_options: Any = None,
    check: bool | float = True,
    products: Iterable[Sequence[str]] = (),
    axes: Iterable[str] | None = None,
    members_only: bool = False,
    groups: Mapping[Any, Any] | None = None,
) -> RealizedMesh:
    """Create (or look up) the process groups of every axis of ``mesh``; a collective call.

    Every rank of the default group (or of the mesh, ``members_only=True``) calls it, in the same order,
    with an equal mesh. Step by step, and each argument at length: docs/realize.md.

    Args:
        mesh: the mesh value; its devices must be ranks of the world.
        device_type: "cpu" or "cuda"; ``None`` follows the default group's backend.
        backend: ``None``: the default group's when it serves ``device_type``, else gloo (cpu) or NCCL.
        timeout: of the created groups (seconds or a timedelta); ``None``: torch's. Not the start-up's
            (``$FUNCTIONAL_MESH_INIT_TIMEOUT``).
        pg_options: the backend's options object for ``new_group``/``split_group``.
        check: compare the request across the ranks first: ``True`` (``$FUNCTIONAL_MESH_CHECK_TIMEOUT``
            or 60 s), ``False``, or seconds.
        products: tuples of axis names whose product groups to make too (``[("dp", "cp")]``).
        axes: the axes to make groups for (default: all).
        members_only: only the mesh's ranks call it; each makes only its own groups.
        groups: ``{axis or product: process_group}``: the caller's groups to use, never destroyed.
        (``backend``, ``timeout`` and ``pg_options`` also take ``{axis or product: value}``.)

    Returns:
        The realized mesh: ``rm.group("tp")``, ``rm.coordinate``, ``rm.device_mesh``, ...

    Raises:
        TypeError: ``mesh`` is not a ``Mesh``, or an argument has the wrong type.
        MeshError: a device not in the world, a backend or device type not available, a per-axis key
            naming no axis, ranks that differ or never arrive (``check``), a member that died, a
            failed start-up, a misused ``members_only`` or a misfit adopted group (docs/realize.md).

    Examples:
        ``rm`` is ``fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))`` as rank 5 of 8 (docs/api.md, "Examples"):

        >>> import torch.distributed as dist
        >>> rm
        RealizedMesh(Mesh(dp=2, tp=4), fake, rank 5: coordinate (1, 1))
        >>> dist.get_process_group_ranks(rm.group("tp"))
        [4, 5, 6, 7]
        >>> again = fm.realize(fm.make_mesh((2, 4), ("dp", "tp"))["tp", "dp"])  # a lookup: no new group
        >>> again.group("tp") is rm.group("tp"), fm.cache_info()
        (True, CacheInfo(hits=2, misses=2, groups=6))
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(requires("realize", "a functional_mesh.Mesh", "mesh", mesh))
    if not isinstance(members_only, bool):
        raise TypeError(requires("realize", "members_only=True or False", "members_only", members_only))
    wait_s = as_check_timeout(check, os.environ)
    decided = plan(mesh, device_type, backend=backend, timeout=timeout, pg_options=pg_options, wait_s=wait_s,
                   products=products, axes=axes, members_only=members_only, groups=groups,
                   found=_surroundings(members_only))
    return _apply(decided)


def _surroundings(members_only: bool) -> Surroundings:
    """What the plan reads of torch and the process: the default group (if any), CUDA, the backends."""
    default = None
    if dist.is_initialized():
        default = DefaultGroup(str(dist.get_backend()), dist.get_world_size(), dist.get_rank(),
                               members_only and can_split(default_group()))
    return Surroundings(os.environ, default, torch.cuda.is_available(), dist.is_backend_available,
                        dist.Backend.backend_list, lambda pg: isinstance(pg, dist.ProcessGroup))


def _apply(p: RealizePlan) -> RealizedMesh:
    """Carry out a plan, the effects in order: the default group, the check, the groups, the handle."""
    if p.init is not None:
        init_default(p.init, p.init_timeout)
    if p.request is not None:
        assert p.wait_s is not None  # a plan asks for the check only with a wait
        _agree_on(p.mesh, p.request, p.members_only, p.rank, p.world, p.wait_s)
        # after the check every member has arrived, so the marks of groups that failed on any of
        # them are in the store: all drop those groups alike and make new ones together
        read_failures()
    families = [Family(*f) for f in p.families]
    got = CACHE.realize_groups([f for f in families if f.key not in p.adopted],
                               Request(p.device_type, p.world, p.rank, p.default_backend, p.member, p.members_only))
    key_meshes_by_job()  # a compiled graph's DeviceMesh input, keyed alike on every rank (docs/compile.md)
    return _assemble(p.mesh, families, p.adopted, got, p.device_type, p.backend, p.rank, p.member)


# -- the handle --------------------------------------------------------------------------------


def _assemble(mesh: Mesh, families: list[Family], adopted: Mapping[Any, Any], got: Realized, device_type: str,
            backend_name: str, rank: int, member: bool) -> RealizedMesh:
    """The realized mesh over the cache's groups and the adopted ones, in mesh order; its axes logged."""
    for family in families:
        if family.key in adopted:
            got.groups[family.key] = adopted[family.key] if member else None
            got.made[family.key] = 0
    ordered = {f.key: got.groups[f.key] for f in families}  # mesh order, adopted ones too (a product given
    got.groups.clear()                                      # twice is one key)
    got.groups.update(ordered)
    level = logging.INFO if rank == 0 else logging.DEBUG  # the lines are equal on every rank
    if _LOG.isEnabledFor(level):
        for line in axis_report(mesh, [(f.key, f.mesh, got.made[f.key]) for f in families],
                                os.environ.get("LOCAL_WORLD_SIZE")):
            _LOG.log(level, "rank %d: %s", rank, line)
    return RealizedMesh(mesh, device_type, backend_name, got.groups, rank, got.epoch, root=None, self_group=got.lent)


# -- divergence check (the agreement itself lives in _agree.py) ----------------------------------


def _agree_on(mesh: Mesh, request: str, members_only: bool, rank: int, world: int, wait_s: float) -> None:
    """Compare ``request`` among the ranks that called: the mesh's members, or the whole world."""
    if members_only:
        _check_same_request_among(mesh, request, rank, wait_s)
    else:
        call = next_call("realize")  # only checked calls are numbered: unchecked lookups shift nothing
        _check_same_request(call, request, rank, world, wait_s)


def _check_same_request(call: int, request: str, rank: int, world: int, wait_s: float) -> None:
    """realize's check: the whole world, led by rank 0, compares the request of call ``call``."""
    agree("realize", "every rank to call it with an equal mesh", f"realize call #{call}",
          f"{_STORE_PREFIX}/{call}", range(world), rank, request, wait_s)


def _check_same_request_among(mesh: Mesh, request: str, rank: int, wait_s: float) -> None:
    """members_only's check: the mesh's ranks alone, led by the smallest, keyed by the member set
    (its calls numbered apart from every other set's), so disjoint meshes check at once."""
    members = sorted(int(r) for r in mesh.devices.reshape(-1).tolist())
    space = "realize:" + hashlib.sha1(",".join(map(str, members)).encode(), usedforsecurity=False).hexdigest()[:16]
    call = next_call(space)
    agree("realize", "every member to call it with an equal mesh", f"members-only realize call #{call}",
          f"{_STORE_PREFIX}/{space}/{call}", members, rank, request, wait_s)


