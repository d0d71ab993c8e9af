"""The process groups realize asks for, from birth to death: the one module that makes, lends,
destroys and aborts them.

One cache per process (``CACHE``), in two levels; a group's life (made, lent, made by its members
alone, adopted, destroyed, aborted, retired on failure) and the epochs: docs/design.md, "The cache".
Which method makes a group is decided by the pure ``_realize_plan.py``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

from . import _torch
from ._agree import restart_numbering
from ._errors import MeshError
from ._mesh import Mesh
from ._realize_plan import INIT_TIMEOUT_ENV, AxisSettings, InitPlan, creation_method

__all__ = ["CACHE", "CacheInfo", "Family", "GroupCache", "Realized", "Request", "abort_all", "abort_holding",
           "cache_info", "clear_cache", "init_default", "read_failures", "retire_failed"]

_ABORT_LOCK_WAIT_S = 1.0  # abort waits this long for a realize call in progress, then goes ahead
# Failure marks in the default store: the counter holds how many there are, ``<prefix>/<i>`` the
# i-th (1-based), a JSON list of the failed group's cache keys ([members, settings key]).
_FAILED_PREFIX = "functional_mesh/failed"


class CacheInfo(NamedTuple):
    """The group cache's counters, as :func:`cache_info` returns them (all 0 after :func:`clear_cache`).

    ``hits`` and ``misses`` of the axis lookups, and the distinct member tuples ``groups`` were made for
    (docs/realize.md, "The cache and its lifecycle").

    Examples:
        >>> fm.CacheInfo(hits=2, misses=2, groups=6).groups
        6
    """

    hits: int
    misses: int
    groups: int


class Request(NamedTuple):
    """What making groups needs of one realize call."""

    device_type: str
    world: int
    rank: int
    default_backend: str
    member: bool  # this rank is in the mesh (only a member is lent the one-rank group)
    members_only: bool = False  # only the mesh's members called: each makes its own groups, locally


class Family(NamedTuple):
    """One realized key: an axis name or a product tuple, its 1-axis family and its settings."""

    key: str | tuple[str, ...]
    mesh: Mesh  # the family: one axis, whose groups are the key's groups
    settings: AxisSettings

    @property
    def label(self) -> str:
        """How group descriptions name the key: the axis, or a product's names joined by ``_``."""
        return self.key if isinstance(self.key, str) else "_".join(self.key)


class Realized(NamedTuple):
    """What one realize call got from the cache."""

    groups: dict[Any, Any]  # key -> this rank's group (None: not a member, or a size-1 family)
    made: dict[Any, int]  # key -> member tuples made for it by this call
    lent: Any  # the one-rank group lent for size-1 axes (None: no size-1 family, or not a member)
    epoch: int  # the epoch the groups belong to


class _GroupCacheFields:
    # The fields GroupCache sets (its __init__ says what each holds), declared once for the type checker,
    # for it and its four parts.
    lock: threading.RLock
    axes: dict[tuple[Any, ...], Any]
    groups: dict[tuple[Any, ...], Any]
    created: list[Any]
    labels: dict[Any, list[str]]
    self_group: Any
    flattened: list[tuple[weakref.ref[Any], tuple[str, ...]]]
    local: dict[tuple[Any, ...], Any]
    local_count: dict[tuple[Any, ...], int]
    made: int
    hits: int
    misses: int
    epoch: int
    ended: str
    failed_default: weakref.ref[Any] | None
    marks_read: tuple[Any, int]

    if TYPE_CHECKING:  # what the parts call on each other (_Making's, _Failing's)
        def _create(self, rows: tuple[tuple[int, ...], ...], label: str, settings: AxisSettings,
                    request: Request) -> None: ...

        def _local(self, rows: tuple[tuple[int, ...], ...], label: str, settings: AxisSettings,
                   request: Request) -> Any: ...

        def default_failed(self, default: Any) -> bool: ...


class _Lookup(_GroupCacheFields):
    """A part of :class:`GroupCache`: each family's group found by its axis key, or made (by
    :class:`_Making`) and kept under it; the descriptions of the groups; the one-rank group lent
    for size-1 axes. No fields of its own: it reads and writes those ``GroupCache`` sets."""

    def realize_groups(self, families: Sequence[Family], request: Request) -> Realized:
        """This rank's group of every family, made where missing; one pass, in the same order on every rank."""
        groups: dict[Any, Any] = {}
        made: dict[Any, int] = {}
        with self.lock:
            for family in families:
                before = self.made
                groups[family.key] = self._group_of_rank(family, request)
                made[family.key] = self.made - before
            # the one-rank group torch is lent for size-1 axes, made here so that the handle has no effects
            lent = self._lent_group() if request.member and any(f.mesh.size == 1 for f in families) else None
            return Realized(groups, made, lent, self.epoch)

    def _group_of_rank(self, family: Family, request: Request) -> Any:
        """This rank's group of one family (``None`` when not a member).

        A group made for it is described as ``mesh_<label>`` (torch's ``group_desc``), and a group
        that serves several axes names them all (``mesh_dp+batch``), so NCCL dumps and spmd_types
        name axes.
        """
        mesh, settings = family.mesh, family.settings
        (name,) = mesh.axis_names
        if mesh.size == 1:  # creation_method's "none": no lookup, no group, no communicator
            return None
        # members-only lookups have keys of their own: a rank's members-only groups depend on the
        # calls it took part in, so a world call must never find them (its ranks would then disagree
        # on which groups to make, a hang)
        axis_key = (mesh.axis_layout(name), mesh.device_list, request.device_type, settings.key,
                    request.members_only)
        if axis_key in self.axes:  # a hit: O(1), whatever the world size
            self.hits += 1
            mine = self.axes[axis_key]
            self._describe(mine, family.label)
            return mine
        self.misses += 1
        rows = tuple(tuple(r) for r in mesh.groups().reshape(mesh.num_groups, -1).tolist())
        try:
            if request.members_only:
                mine = self._local(rows, family.label, settings, request)
                self.axes[axis_key] = mine
                self._describe(mine, family.label)
                return mine
            self._create(rows, family.label, settings, request)
        except RuntimeError as exc:  # c10d's DistStoreError / gloo errors: a member died or stopped
            timeout = f"{settings.timeout.total_seconds():g} s" if settings.timeout else "torch's default timeout"
            raise MeshError(
                f"`realize` could not create the process groups of axis {name!r} (first {list(rows[0])}, "
                f"{len(rows)} in all) within {timeout}: a member rank probably died or stopped calling realize "
                f"(set realize(..., timeout=seconds) to fail sooner); torch said: {exc}") from exc
        group = mesh.group_of(request.rank)
        mine = None if group is None else self.groups[(tuple(group.reshape(-1).tolist()), settings.key)]
        self.axes[axis_key] = mine
        self._describe(mine, family.label)
        return mine


    def _describe(self, pg: Any, label: str) -> None:
        """Add ``label`` to the ``group_desc`` of a group realize made (never to the default group)."""
        labels = self.labels.get(pg) if pg is not None else None
        if labels is None or label in labels:
            return
        labels.append(label)
        _torch.set_group_desc(pg, "mesh_" + "+".join(labels))

    def _lent_group(self) -> Any:
        """The one-rank group lent to torch for size-1 axes (docs/design.md, "Size-1 axes"), made once."""
        if self.self_group is None:
            self.self_group = _torch.one_rank_group(f"functional_mesh_self_{dist.get_rank()}_{self.epoch}",
                                                    "mesh_size1")
            self.created.append(self.self_group)
        return self.self_group


class _Making(_GroupCacheFields):
    """A part of :class:`GroupCache`: the groups missing for an axis's member tuples, made by every
    rank (``new_group``, ``split_group``, or the default group borrowed) or, for a members-only
    call, by this rank's group's members alone; each kept under its ordered member tuple."""

    def _create(self, rows: tuple[tuple[int, ...], ...], label: str, settings: AxisSettings,
                request: Request) -> None:
        missing = [r for r in rows if (r, settings.key) not in self.groups]
        if not missing:
            return
        default = _torch.default_group()
        usable = not self.default_failed(default)  # a collective failed on it: neither borrowed nor split
        borrow = usable and settings.pg_options is None and settings.timeout in (
            None, _torch.group_timeout(default, request.device_type))
        method = creation_method(missing, request.world, request.default_backend, settings.backend,
                                 usable and _torch.can_split(default), borrow)
        kwargs: dict[str, Any] = {"timeout": settings.timeout, "group_desc": f"mesh_{label}",
                                  "pg_options": settings.pg_options}
        if method == "default":
            self.groups[(missing[0], settings.key)] = default
            return
        if method == "split":
            pg = dist.split_group(split_ranks=[list(r) for r in missing], **kwargs)
            # a rank in no split gets None (torch 2.13) or GroupMember.NON_GROUP_MEMBER, -100 (2.14+)
            pg = pg if isinstance(pg, dist.ProcessGroup) else None
            if pg is not None:
                self.created.append(pg)
            for row in missing:
                self._store(row, settings, pg if request.rank in row else None, label)
            return
        for row in missing:  # every rank, same order: c10d names groups by a shared counter
            if _torch.NEW_GROUP_SORT_RANKS or list(row) == sorted(row):
                pg = dist.new_group(list(row), backend=settings.backend_arg,
                                    **({"sort_ranks": False} if _torch.NEW_GROUP_SORT_RANKS else {}), **kwargs)
            else:  # torch 2.11's new_group sorts its ranks: the same group, in mesh order, through the boundary
                pg = _torch.group_in_order(row, settings.backend_arg, **kwargs)
            if not isinstance(pg, dist.ProcessGroup):  # NON_GROUP_MEMBER on a rank outside the row
                pg = None
            else:
                self.created.append(pg)
            self._store(row, settings, pg, label)

    def _local(self, rows: tuple[tuple[int, ...], ...], label: str, settings: AxisSettings,
               request: Request) -> Any:
        """This rank's group among ``rows``, made by its members alone where no group holds them yet.

        A group a world call made (``self.groups``, equal on every rank) or a members-only call
        made (``self.local``, equal on the row's members: they all took part in that call) is
        reused. Nothing is made for rows without this rank.
        """
        row = next((r for r in rows if request.rank in r), None)
        if row is None:  # pragma: no cover - realize refuses a non-member first
            return None
        key = (row, settings.key)
        found = self.groups.get(key, self.local.get(key))
        if found is not None:
            return found
        default = _torch.default_group()
        if (row == tuple(range(request.world)) and not self.default_failed(default)
                and settings.backend == request.default_backend.lower()
                and settings.pg_options is None
                and settings.timeout in (None, _torch.group_timeout(default, request.device_type))):
            self.local[key] = default  # the whole world, in order: the default group (no call)
            return default
        count = self.local_count.get(key, 0)
        self.local_count[key] = count + 1
        digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()[:16]
        pg = _torch.local_group(row, settings.backend_arg, f"functional_mesh_local_{digest}_{count}",
                                timeout=settings.timeout, group_desc=f"mesh_{label}", pg_options=settings.pg_options)
        self.created.append(pg)
        self.local[key] = pg
        self.made += 1
        self.labels.setdefault(pg, [label])
        return pg

    def _store(self, row: tuple[int, ...], settings: AxisSettings, pg: Any, label: str) -> None:
        self.groups[(row, settings.key)] = pg
        self.made += 1
        if pg is not None and pg not in self.labels:
            self.labels[pg] = [label]



class _Ending(_GroupCacheFields):
    """A part of :class:`GroupCache`: forgetting groups when they end (``clear_cache``, ``abort``),
    all of them or those holding given ranks, and starting the next epoch."""

    def forget(self, ended: str) -> list[Any]:
        """Empty the cache, start a new epoch, and return the groups realize made.

        A torch mesh that a product group was registered on forgets it: that flattened mesh and
        the root refer to each other, a cycle that would hold the root's groups (sockets, threads)
        until the cycle collector runs; without it, they go with the last reference to the mesh.
        """
        for ref, axes in self.flattened:
            root = ref()
            if root is not None:
                _torch.unregister_flattened(root, axes)
        self.flattened = []
        _torch.forget_sharding_plans()
        created, self.created = self.created, []
        self.axes, self.groups, self.labels, self.local = {}, {}, {}, {}
        self.self_group = None
        self.made = self.hits = self.misses = 0
        self.ended = ended
        self.epoch += 1
        return created

    def forget_holding(self, ranks: frozenset[int], ended: str) -> list[Any]:
        """Forget the groups whose members include one of ``ranks``, start a new epoch, and return
        the ones realize made (the default group, when borrowed, is only forgotten).

        Every other group stays, so the next realize finds it; the axis lookups are dropped (an axis
        whose groups were partly forgotten must be looked up again, row by row, on every rank alike).
        """
        for ref, axes in self.flattened:  # the torch meshes belong to handles of the ending epoch
            root = ref()
            if root is not None:
                _torch.unregister_flattened(root, axes)
        self.flattened = []
        _torch.forget_sharding_plans()
        gone = {pg for table in (self.groups, self.local) for (row, _), pg in table.items()
                if pg is not None and not ranks.isdisjoint(row)}
        self.groups = {k: pg for k, pg in self.groups.items() if ranks.isdisjoint(k[0])}
        self.local = {k: pg for k, pg in self.local.items() if ranks.isdisjoint(k[0])}
        self.axes = {}
        aborted = [pg for pg in self.created if pg in gone]
        self.created = [pg for pg in self.created if pg not in gone]
        for pg in aborted:
            self.labels.pop(pg, None)
        self.ended = ended
        self.epoch += 1
        return aborted



class _Failing(_GroupCacheFields):
    """A part of :class:`GroupCache`: groups on which a collective failed, dropped from the cache
    (here, or on another member that marked them in the store) so that no realize hands them out
    again; the next realize over those ranks makes a new group, by the same rules as any miss."""

    def keys_of(self, pg: Any) -> list[tuple]:
        """The cache keys (members, settings key) under which ``pg`` is held, world and members-only."""
        return [k for table in (self.groups, self.local) for k, v in table.items() if v is pg]

    def retire(self, keys: Sequence[tuple], failed: Any = None) -> list[Any]:
        """Forget the groups under ``keys`` (this rank's, or ``None`` where it is not a member) and
        every axis lookup; return the groups realize made among them, for the caller to abort.

        ``failed``: the group that failed here, when it is the default group (borrowed by an axis):
        it is flagged, never aborted, and realize neither borrows nor splits it again.
        """
        wanted = set(keys)
        gone = [pg for table in (self.groups, self.local) for k, pg in table.items() if k in wanted and pg is not None]
        if failed is not None:
            self.failed_default = weakref.ref(failed)
        if not wanted & (self.groups.keys() | self.local.keys()):
            return []
        self.groups = {k: pg for k, pg in self.groups.items() if k not in wanted}
        self.local = {k: pg for k, pg in self.local.items() if k not in wanted}
        self.axes = {}  # an axis with a retired row is looked up again, row by row, on every rank alike
        ours = [pg for pg in self.created if any(pg is g for g in gone)]
        self.created = [pg for pg in self.created if not any(pg is g for g in gone)]
        for pg in ours:
            self.labels.pop(pg, None)
        return ours

    def default_failed(self, default: Any) -> bool:
        """Whether a collective failed on the job's default group (this one, not an earlier job's)."""
        return self.failed_default is not None and self.failed_default() is default


class GroupCache(_Lookup, _Making, _Ending, _Failing):
    """Every group realize made, by axis key and by ordered member tuple; one per process (``CACHE``).

    Its fields are the bookkeeping; its parts look groups up (:class:`_Lookup`), make the missing
    ones (:class:`_Making`), forget them when they end (:class:`_Ending`) and when a collective
    on one fails (:class:`_Failing`)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.axes: dict[tuple, Any] = {}  # axis key -> this rank's group of that axis (None: not a member)
        self.groups: dict[tuple, Any] = {}  # (members, settings key) -> ProcessGroup | None
        self.created: list[Any] = []  # ProcessGroups this process made (destroyed by clear_cache)
        self.labels: dict[Any, list[str]] = {}  # made group -> the axes it serves (its group_desc)
        self.self_group: Any = None  # this rank's one-rank fake-backend group, lent to torch for size-1 axes
        # torch meshes on which a product group was registered (their flattened mesh and they refer
        # to each other): (weak reference, product axes), released when the groups end
        self.flattened: list[tuple[weakref.ref, tuple[str, ...]]] = []
        # members-only groups: (members, settings key) -> this rank's group (only tuples holding it)
        self.local: dict[tuple, Any] = {}
        # (members, settings key) -> members-only groups this process made for it: the name's suffix.
        # Kept for the life of the process (clear_cache and abort too): the store keeps the keys of
        # an old group's meeting, so a new group of equal members needs a name of its own.
        self.local_count: dict[tuple, int] = {}
        self.made = 0  # distinct member tuples made (members or not; equal on every rank that made the same calls)
        self.hits = 0
        self.misses = 0
        # The generation of the cache: a handle made at another epoch is stale (its groups were
        # destroyed or aborted); ``ended`` says how, for the stale handle's message.
        self.epoch = 0
        self.ended = ""
        # Failures: the default group, when a collective on it failed (a weak reference: a re-formed
        # job's new default group is not flagged); the store whose failure marks were read, and how many.
        self.failed_default: weakref.ref | None = None
        self.marks_read: tuple[Any, int] = (None, 0)

    def keep_flattened(self, root: Any, axes: tuple[str, ...]) -> None:
        """Remember that the product group of ``axes`` was registered on the torch mesh ``root``
        (``_torch.register_flattened``), to release it with the groups."""
        with self.lock:
            self.flattened = [(ref, names) for ref, names in self.flattened if ref() is not None]
            self.flattened.append((weakref.ref(root), axes))

    def info(self) -> CacheInfo:
        """The counters, read under the lock."""
        with self.lock:
            return CacheInfo(self.hits, self.misses, self.made)

    def ended_for(self, epoch: int) -> str:
        """How the groups of ``epoch`` ended (``""``: they are the live ones)."""
        return "" if epoch == self.epoch else self.ended



CACHE = GroupCache()


def retire_failed(pg: Any) -> None:
    """A collective on ``pg`` raised: the group leaves the cache, is aborted, and is marked for its other members.

    Called when the error is built (``_handle.comm_failure``); docs/design.md, "Failures and start-up".
    An adopted group is left alone; bounded: the lock is waited for as ``abort`` does, and a store
    that cannot be reached only loses the mark.
    """
    try:
        default = _torch.default_group()
    except (RuntimeError, ValueError):  # pragma: no cover - no job: nothing is cached either
        return
    locked = CACHE.lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
    try:
        keys = CACHE.keys_of(pg)
        ours = CACHE.retire(keys, failed=pg if pg is default else None)
    finally:
        if locked:
            CACHE.lock.release()
    if not keys:
        return
    try:
        store = _torch.default_store()
        i = store.add(_FAILED_PREFIX, 1)
        store.set(f"{_FAILED_PREFIX}/{i}", json.dumps([[list(row), list(skey)] for row, skey in keys]))
    except Exception:  # a dead store (its host died): the other members cannot be told; see docs/reliability.md
        pass
    _torch.abort_groups(ours)


def read_failures() -> int:
    """Forget the groups other members marked as failed since this rank last looked; return how many keys.

    After realize's check (docs/design.md, "Failures and start-up"); one store round trip when nothing failed.
    """
    store = _torch.default_store()
    seen_store, seen = CACHE.marks_read
    if seen_store is not store:  # a new default group (a re-formed job): its store's marks are counted from 0
        seen = 0
    count = store.add(_FAILED_PREFIX, 0)
    if count <= seen:
        CACHE.marks_read = (store, count)
        return 0
    names = [f"{_FAILED_PREFIX}/{i}" for i in range(seen + 1, count + 1)]
    # a mark whose writer died between counting it and writing it is skipped, never waited for
    marks = [store.get(name) for name in names if store.check([name])]
    keys = [(tuple(row), tuple(skey)) for mark in marks for row, skey in json.loads(mark.decode())]
    default = _torch.default_group()
    world = tuple(range(_torch.world_size()))
    with CACHE.lock:
        # a marked whole-world key held by the default group on this rank: the default group failed there
        failed = default if any(CACHE.groups.get(k, CACHE.local.get(k)) is default and k[0] == world
                                for k in keys) else None
        ours = CACHE.retire(keys, failed=failed)
        CACHE.marks_read = (store, count)
    _torch.abort_groups(ours)
    return len(keys)


def init_default(plan: InitPlan, timeout: datetime.timedelta | None) -> None:
    """Start the job's default group as ``plan`` says (realize, when no default group exists).

    Bounded by ``plan.timeout``, never an axis's; a failure is a ``MeshError`` with torch's error
    chained. Once up, its collectives take realize's one ``timeout=`` when given, so a whole-world
    axis with that timeout still borrows it.
    """
    kwargs: dict[str, Any] = {"backend": plan.backend}
    if plan.timeout is not None:
        kwargs["timeout"] = plan.timeout
    if plan.device_index is not None:
        torch.cuda.set_device(plan.device_index)
        kwargs["device_id"] = torch.device("cuda", plan.device_index)
    try:
        dist.init_process_group(**kwargs)
    except RuntimeError as exc:  # c10d's DistStoreError / DistNetworkError: a rank missing, the store unreachable
        bound = (f"{plan.timeout.total_seconds():g} s (${INIT_TIMEOUT_ENV})" if plan.timeout is not None
                 else f"torch's default timeout (set ${INIT_TIMEOUT_ENV} in seconds to change it)")
        raise MeshError(
            f"`realize` requires every rank of the job to start the default group (init_process_group, backend "
            f"{plan.backend!r}) within {bound}, but the start-up failed: a rank probably did not start, or "
            f"MASTER_ADDR/MASTER_PORT do not reach the store; realize's timeout= bounds the axes' collectives, "
            f"not this; torch said: {type(exc).__name__}: {exc}") from exc
    if timeout is not None:
        _torch.set_group_timeout(_torch.default_group(), timeout)


def cache_info() -> CacheInfo:
    """Hits and misses of realize's axis lookups, and how many distinct groups it created.

    No communication: this rank's counters, which are the same on every rank of an SPMD program.

    Returns:
        The counters since the process started or the last :func:`clear_cache` or ``abort``.

    Examples:
        >>> fm.cache_info()  # rm's two axes: dp 4 groups, tp 2 groups
        CacheInfo(hits=0, misses=2, groups=6)
    """
    return CACHE.info()


def clear_cache() -> None:
    """Destroy every process group realize created (and no other), and forget all keys.

    Realized meshes from before the call raise ``MeshError`` when used. A group torch no longer
    knows is only forgotten. Call it on every rank, before ``dist.destroy_process_group()``.

    Examples:
        >>> import torch.distributed as dist
        >>> fm.clear_cache()
        >>> fm.cache_info()
        CacheInfo(hits=0, misses=0, groups=0)
        >>> rm.group("tp")
        Traceback (most recent call last):
        ...
        functional_mesh.MeshError: `RealizedMesh.group` requires a realized mesh whose groups still exist, but got RealizedMesh(Mesh(dp=2, tp=4), fake, rank 5: coordinate (1, 1)), whose groups clear_cache() destroyed; call realize(mesh) again
        >>> dist.destroy_process_group()
    """
    with CACHE.lock:
        created = CACHE.forget("clear_cache() destroyed")
        if dist.is_initialized():
            live = _torch.known_groups()
            for pg in created:
                if pg in live:
                    dist.destroy_process_group(pg)


def abort_all() -> None:
    """Abort every group realize made, forget them, and number checked calls from 1 again (``fm.abort``).

    Waits at most ``_ABORT_LOCK_WAIT_S`` for a realize call in progress (which may be stuck
    creating groups with a dead peer), then goes ahead without the lock: abort must end. No
    collective call.
    """
    locked = CACHE.lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
    try:
        groups = CACHE.forget("abort() aborted")
    finally:
        if locked:
            CACHE.lock.release()
    restart_numbering()
    _torch.abort_groups(groups)


def abort_holding(ranks: frozenset[int]) -> int:
    """Abort the groups realize made that hold one of ``ranks``; keep every other one (``fm.abort(ranks=...)``).

    Like :func:`abort_all`: no collective call, a bounded wait for the lock, checked calls numbered
    from 1 again, and every handle of the ending epoch is stale. Returns how many groups were aborted.
    """
    locked = CACHE.lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
    try:
        groups = CACHE.forget_holding(ranks, f"abort(ranks={sorted(ranks)}) aborted or retired")
    finally:
        if locked:
            CACHE.lock.release()
    restart_numbering()
    _torch.abort_groups(groups)
    return len(groups)
