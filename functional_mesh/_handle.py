"""The realized handle: a mesh value with this rank's process groups, read-only.

``RealizedMesh`` is made by :func:`functional_mesh.realize` and only read afterwards: its mesh,
rank, coordinate and groups stay consistent because nothing can reassign them (slots, read-only
properties, :class:`~functional_mesh._validate.Frozen`). It also owns the ``with rm:`` stack and
:func:`resolve_mesh`, the ``mesh=None`` → current-mesh rule every axis-name op uses. Creates no
process group: its torch ``DeviceMesh`` wraps the groups realize made. Other modules read a
handle through the functions at the end of this module, never through its slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from . import _torch
from ._cache import CACHE, abort_all, abort_holding, retire_failed
from ._context import ContextStack
from ._errors import MeshError, requires
from ._mesh import Mesh, axes_size, axis_position, select
from ._pending import Pending
from ._validate import Frozen, as_name_tuple
from ._vma import AxisTypes

__all__ = ["CollectiveError", "Hop", "OpenRegion", "RealizedMesh", "abort", "check_alive", "comm_failure", "current_mesh",
           "current_region", "hop_of", "index_along", "open_region", "recall", "remember", "resolve_mesh",
           "selected_from"]

# The `with rm:` meshes: per thread/task eagerly; compiled code sees the innermost of the process.
_CURRENT: ContextStack[RealizedMesh] = ContextStack("functional_mesh_current", shared=True)


def current_mesh() -> RealizedMesh | None:
    """The innermost ``with rm:`` mesh of this thread or asyncio task, or ``None``.

    Every axis-name function called with ``mesh=None`` uses it; under ``torch.compile``, the innermost
    of the process (docs/design.md, "torch.compile": threads with different meshes pass ``mesh=``).

    Returns:
        The realized mesh of the innermost enclosing ``with rm:`` block, or ``None`` outside any.

    Examples:
        >>> with rm:
        ...     fm.current_mesh() is rm, fm.axis_index("tp")
        (True, 1)
        >>> fm.current_mesh() is None
        True
    """
    return _CURRENT.top()


# -- the open shard_map region, beside the ``with rm:`` meshes --------------------------------------
#
# shard_map opens a region around the mapped function; every collective called inside goes to it.
# A typed region also sees every torch op (its TorchFunctionMode); an untyped one installs no mode
# at all, so its ops cost what plain torch costs, and only the collectives ask for it here.


class OpenRegion(Protocol):
    """What the package asks of an open ``shard_map`` region (``_region.Region`` is the one).

    The collectives' dispatch hands it each call (:meth:`collective`: ``rec`` is the call's record,
    a ``_call.Collective``, typed loosely here because that module sits above this one) and each
    call issued with ``async_op=True`` (:meth:`issued`); ``typeof`` reads :attr:`check_vma` and
    :meth:`types_of`.
    """

    check_vma: bool

    def collective(self, rec: Any, x: object, axis: object, mesh: object, params: dict[str, Any]) -> Any: ...

    def issued(self, pending: Pending) -> None: ...

    def types_of(self, t: torch.Tensor) -> AxisTypes: ...


# Per thread/task eagerly; a region opened while torch.compile traces is what the compiled code
# sees (and the eager code between its graphs); one opened eagerly is no part of compiled code.
_REGIONS: ContextStack[OpenRegion] = ContextStack("functional_mesh_region", shared=False)


def current_region(compiling: bool | None = None) -> OpenRegion | None:
    """The open ``shard_map`` region of this thread/task (under torch.compile: of the trace), or ``None``.

    ``compiling``: ``torch.compiler.is_compiling()``, when the caller knows it already.
    """
    return _REGIONS.top(compiling)


class open_region:  # noqa: N801 - used as a context manager, like a function
    """Make ``region`` the open region while the mapped function runs."""

    __slots__ = ("region", "traced")

    def __init__(self, region: OpenRegion) -> None:
        self.region, self.traced = region, False

    def __enter__(self) -> OpenRegion:
        self.traced = _REGIONS.push(self.region)
        return self.region

    def __exit__(self, *exc: object) -> None:
        _REGIONS.pop(self.region, self.traced)


def resolve_mesh(api: str, mesh: object) -> RealizedMesh:
    """``mesh`` or the current ``with rm:`` mesh; a pure Mesh or nothing is a clear error."""
    rm = current_mesh() if mesh is None else mesh
    if isinstance(rm, RealizedMesh):
        return rm
    if isinstance(rm, Mesh):
        raise TypeError(f"`{api}` requires a RealizedMesh, but got the pure mesh {rm!r}; call fm.realize(mesh) "
                        f"and pass its result (or use `with rm:`)")
    if rm is None:
        raise MeshError(f"`{api}` requires mesh=<RealizedMesh> or an enclosing `with rm:` block, but got neither")
    raise TypeError(requires(api, "a RealizedMesh for mesh", "mesh", rm))


def _read_only(slot: str, doc: str) -> Any:
    """A property that reads ``slot`` and has no setter (a plain function: torch.compile traces it)."""

    def read(self: Any) -> Any:
        return getattr(self, slot)

    return property(read, doc=doc)


class _RealizedFields:
    # The fields of RealizedMesh (its __slots__), declared once for the type checker, for it and its two parts.
    __slots__ = ()
    _mesh: Mesh
    _device_type: str
    _backend: str
    _rank: int
    _coordinate: tuple[int, ...] | None
    _groups: dict[Any, Any]  # axis name or product tuple -> ProcessGroup | None
    _epoch: int
    _root: RealizedMesh | None
    _device_mesh: Any  # torch's DeviceMesh, or None before first use
    _sizes: dict[str, int]
    _index: dict[str, int]
    _hops: dict[Any, Hop]
    _self_group: Any  # a ProcessGroup or None
    _memo: dict[Any, Any]

    if TYPE_CHECKING:  # what the parts call on each other (RealizedMesh's, _Queries's)
        def _check_alive(self, api: str) -> None: ...

        def _lend(self, key: str | tuple[str, ...], pg: Any) -> Any: ...


class _Queries(_RealizedFields):
    """A part of :class:`RealizedMesh`: what a handle answers about its axes and groups (sizes, this
    rank's indices and device, the group of an axis or product). No fields of its own: it reads
    those ``RealizedMesh`` sets, and communicates nothing."""

    __slots__ = ()

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axis names."""
        return self._mesh.axis_names

    def axis_size(self, axis: str) -> int:
        """Size of ``axis`` (no communication)."""
        size = self._sizes.get(axis) if isinstance(axis, str) else None
        if size is None:  # not an axis of the mesh: the error
            return self._mesh.axis_sizes[axis_position(self._mesh, axis, "RealizedMesh.axis_size")]
        return size

    def group(self, axis: str | Sequence[str]) -> Any:
        """This rank's ``ProcessGroup`` for ``axis`` (``None`` when this rank is outside the mesh).

        A tuple of axes gives the product group when it was realized (``products=``). A size-1
        axis has no group of its own: asked for one, the handle lends the one-rank group realize
        made (docs/design.md, "Size-1 axes"). Asking creates nothing.
        """
        api = "RealizedMesh.group"
        self._check_alive(api)
        if isinstance(axis, str):
            axis_position(self._mesh, axis, api)
            return self._lend(axis, self._group_of(axis, api))
        names = as_name_tuple(api, axis, "axis")
        if len(names) == 1:
            return self.group(names[0])
        return self._lend(names, self._product_of(names, api))

    def _product_of(self, names: tuple[str, ...], api: str) -> Any:
        select(self._mesh, names, api)  # known, distinct axes
        if names not in self._groups:
            raise MeshError(requires(api, "a product of axes that was realized", "axis", names,
                                     tuple(k for k in self._groups if isinstance(k, tuple)))
                            + f"; pass products=[{names!r}] to realize", mesh=self._mesh)
        return self._groups[names]

    def _lend(self, key: str | tuple[str, ...], pg: Any) -> Any:
        """``pg``, or for a size-1 axis of a member rank the one-rank group lent to torch."""
        if pg is None and self._coordinate is not None and self._hops[key].size == 1:
            return self._self_group
        return pg

    def _group_of(self, axis: str, api: str) -> Any:
        if axis not in self._groups:
            realized = tuple(k for k in self._groups if isinstance(k, str))
            raise MeshError(requires(api, "an axis whose groups were realized", "axis", axis, realized)
                            + "; realize(mesh, axes=...) left it out: realize it before using its group",
                            mesh=self._mesh)
        return self._groups[axis]

    def replica_groups(self, axis: str | Sequence[str]) -> list[list[int]]:
        """The global ranks of every group of ``axis`` (a tuple: its product, first axis major), one
        list per group in torch's order: what a static-IR compiler needs (docs/compile.md). Pure.

        Examples:
            >>> rm.replica_groups("tp"), rm.replica_groups("dp")
            ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]])
        """
        rows = select(self._mesh, as_name_tuple("RealizedMesh.replica_groups", axis, "axis"),
                      "RealizedMesh.replica_groups").groups()
        return rows.reshape(rows.shape[0], -1).tolist()

    def has_group(self, axes: tuple[str, ...]) -> bool:
        """True when the product group of ``axes`` was realized with this mesh."""
        return axes in self._groups

    @property
    def device(self) -> torch.device:
        """This rank's device: ``cuda:<current device>`` (realize set it from LOCAL_RANK) or ``cpu``."""
        if self._device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self._device_type)

    def local_rank(self, axis: str) -> int:
        """This rank's index along ``axis`` (its coordinate; also its group rank)."""
        index = self._index.get(axis) if isinstance(axis, str) else None
        if index is not None:
            return index
        i = axis_position(self._mesh, axis, "RealizedMesh.local_rank")
        if self._coordinate is None:
            raise MeshError(requires("RealizedMesh.local_rank", "a rank that belongs to the mesh", "rank",
                                     self._rank, f"devices {self._mesh.device_list.describe()}"), mesh=self._mesh)
        return self._coordinate[i]



class _TorchMesh(_RealizedFields):
    """A part of :class:`RealizedMesh`: the torch ``DeviceMesh`` over the handle's groups, built once
    on first use and kept in its ``_device_mesh`` slot."""

    __slots__ = ()

    @property
    def device_mesh(self) -> Any:
        """A torch ``DeviceMesh`` over the same groups (``None`` on ranks outside the mesh).

        Built once, lazily, with ``DeviceMesh.from_group`` (no new groups). A selection whose
        axes keep the root's order is a slice of the root's ``device_mesh``, so FSDP2 and
        tensor parallel can share one torch root. A size-1 dim holds the lent group of
        :meth:`group`; an axis left out by ``realize(axes=...)`` is a dim without a group.
        """
        self._check_alive("RealizedMesh.device_mesh")
        if self._coordinate is None:
            return None
        if self._device_mesh is None:
            with CACHE.lock:  # one torch mesh per realized mesh, even when threads ask at once
                if self._device_mesh is None:
                    object.__setattr__(self, "_device_mesh", self._build_device_mesh())
        return self._device_mesh

    def _build_device_mesh(self) -> Any:
        mesh = self._mesh
        if mesh.ndim == 0:
            raise MeshError(f"`RealizedMesh.device_mesh` requires a mesh with at least one axis, but got {mesh!r}",
                            mesh=mesh)
        root = self._root
        if root is not None and _in_order(mesh.axis_names, root.mesh.axis_names):
            return root.device_mesh[mesh.axis_names if mesh.ndim > 1 else mesh.axis_names[0]]
        submesh, coordinate = mesh.group_of(self._rank), self._coordinate
        assert submesh is not None and coordinate is not None  # device_mesh answered None outside the mesh
        groups: list[Any] = []
        for i, name in enumerate(mesh.axis_names):
            if name not in self._groups:  # left out by realize(axes=...): a dim without a group
                groups.append(None)
                continue
            pg = self._lend(name, self._groups[name])
            index = tuple(slice(None) if j == i else c for j, c in enumerate(coordinate))
            row = submesh[index].reshape(-1).tolist()
            members = _torch.group_members(pg)
            if members != row:
                raise MeshError(
                    f"`RealizedMesh.device_mesh` requires each axis group to hold its mesh row in mesh order, "
                    f"but axis {name!r} has group ranks {members} for row {row}", mesh=mesh)
            groups.append(pg)
        dm = _torch.device_mesh_from_groups(groups, self._device_type, submesh, mesh.axis_names, mesh.groups())
        for key, pg in self._groups.items():  # products realized with this mesh, in mesh order
            if isinstance(key, tuple) and _in_order(key, mesh.axis_names):
                _torch.register_flattened(dm, key, self._lend(key, pg))
                CACHE.keep_flattened(dm, key)  # released with the groups (a cycle of torch meshes)
        return dm


class RealizedMesh(Frozen, _Queries, _TorchMesh):
    """A mesh value with this rank's process groups. Made by :func:`realize`; read-only, not picklable.

    Selecting axes (``rm["tp"]``, ``rm["dp", "tp"]``) gives a realized mesh over the same groups
    (no communication, nothing created); ``with rm:`` makes it the mesh of every axis-name call
    with ``mesh=None`` (:func:`current_mesh`). After :func:`clear_cache` or :func:`abort` every
    use raises ``MeshError``: realize again.

    Attributes:
        mesh: the pure :class:`Mesh`.
        device_type: "cpu" or "cuda".
        backend: the groups' backend ("gloo", "nccl", or "fake" under torch's fake group).
        rank: this process's global rank.
        coordinate: this rank's coordinate in its submesh (mesh order), ``None`` if outside.

    Raises:
        AttributeError: on assigning any attribute: a handle whose mesh changed would no longer
            match its groups.
        TypeError: on pickling or copying: it holds live process groups (pickle ``rm.mesh``).

    Examples:
        >>> rm.mesh, rm.rank, rm.coordinate, rm.local_rank("tp"), rm.axis_size("tp")
        (Mesh(dp=2, tp=4), 5, (1, 1), 1, 4)
        >>> tp = rm["tp"]
        >>> tp.group("tp") is rm.group("tp"), tp.mesh.axis_names
        (True, ('tp',))
        >>> rm.device_mesh.mesh_dim_names
        ('dp', 'tp')
        >>> rm.rank = 0  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AttributeError: RealizedMesh is read-only: cannot set 'rank'...
    """

    __slots__ = ("_mesh", "_device_type", "_backend", "_rank", "_coordinate", "_groups", "_epoch", "_root",
                 "_device_mesh", "_sizes", "_index", "_hops", "_self_group", "_memo")

    def __init__(self, mesh: Mesh, device_type: str, backend: str, groups: dict[Any, Any], rank: int,
                 epoch: int, root: RealizedMesh | None, self_group: Any) -> None:
        fields = {"_mesh": mesh, "_device_type": device_type, "_backend": backend, "_rank": rank,
                  "_coordinate": mesh.coordinate(rank),
                  # axis name or product tuple -> ProcessGroup | None (None: outside the mesh, or size 1)
                  "_groups": groups,
                  "_epoch": epoch,  # the cache epoch the groups belong to
                  "_root": root,  # the realized mesh this one was selected from (None: it is a root)
                  "_device_mesh": None,  # built on first use
                  # the one-rank group lent to torch for size-1 axes, made by realize (None: no size-1
                  # axis realized, or this rank is outside the mesh)
                  "_self_group": self_group,
                  # what other modules keep per handle (recall/remember): the collectives' resolved
                  # axes by the ``axis`` argument, validated once per handle and axes, then a dict
                  # lookup per call; the region boundary's plans
                  "_memo": {}}
        # Plain dicts of ints and strings, computed once: what the collectives read per call, so
        # torch.compile traces dictionary lookups, not the mesh algebra.
        coordinate = fields["_coordinate"]
        fields["_sizes"] = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
        fields["_index"] = {} if coordinate is None else dict(zip(mesh.axis_names, coordinate, strict=True))
        fields["_hops"] = {key: _hop(key, pg, mesh, fields["_sizes"], fields["_index"]) for key, pg in groups.items()}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    mesh: Mesh = _read_only("_mesh", "The pure mesh value.")
    device_type: str = _read_only("_device_type", '"cpu" or "cuda".')
    backend: str = _read_only("_backend", 'The groups\' backend: "gloo", "nccl", or "fake" under torch\'s fake group.')
    rank: int = _read_only("_rank", "This process's global rank.")
    coordinate: tuple[int, ...] | None = _read_only(
        "_coordinate", "This rank's coordinate in its submesh (mesh order), ``None`` when outside the mesh.")

    def _check_alive(self, api: str) -> None:
        """Raise ``MeshError`` when this handle's groups were destroyed (clear_cache) or aborted (abort)."""
        ended = CACHE.ended_for(self._epoch)
        if ended:
            again = ("call realize(mesh) again (after re-forming the default group if a peer died)"
                     if ended.startswith("abort") else "call realize(mesh) again")
            raise MeshError(f"`{api}` requires a realized mesh whose groups still exist, but got {self!r}, "
                            f"whose groups {ended}; {again}")

    def abort(self) -> None:
        """Abort every process group realize made in this process; no collective call.

        The same as :func:`functional_mesh.abort`: groups are shared between every mesh realized
        from the cache, so abort is per cache, not per mesh. Afterwards every realized mesh
        raises ``MeshError``, the cache is empty and ``realize`` makes fresh groups.
        """
        abort()

    def __getitem__(self, names: str | Sequence[str]) -> RealizedMesh:
        """A realized selection, served from the cache (no communication, no new groups).

        It keeps the groups of its axes and the realized products whose axes all remain.
        """
        self._check_alive("RealizedMesh[...]")
        sub = select(self._mesh, names, "RealizedMesh[...]")
        kept = set(sub.axis_names)
        groups = {key: pg for key, pg in self._groups.items()
                  if (key in kept if isinstance(key, str) else kept.issuperset(key))}
        return RealizedMesh(sub, self._device_type, self._backend, groups, self._rank, self._epoch,
                            self._root or self, self._self_group)

    def __enter__(self) -> RealizedMesh:
        self._check_alive("with RealizedMesh")
        _CURRENT.push(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Nothing is kept on the shared handle: two threads may enter and leave it in any order.
        _CURRENT.pop(self, torch.compiler.is_compiling())

    def __reduce__(self):
        raise TypeError(
            "a RealizedMesh holds live process groups and cannot be pickled; pickle rm.mesh (a pure Mesh) "
            "and call realize() on it in the receiving job"
        )

    def __repr__(self) -> str:
        where = "outside the mesh" if self._coordinate is None else f"coordinate {self._coordinate}"
        return f"RealizedMesh({self._mesh!r}, {self._backend}, rank {self._rank}: {where})"


class Hop(NamedTuple):
    """A group a collective talks over: an axis's, or a product's (axes first-major)."""

    pg: Any  # the ProcessGroup (None on ranks outside the mesh, and for size 1: no group, no communication)
    name: str | None  # its group name, what torch's functional collectives take (None: no group)
    size: int
    axes: tuple[str, ...]
    # the ignore below: a field named as tuple.index, which it hides
    index: int | None  # type: ignore[assignment]  # this rank's index in it: its coordinate along ``axes``, first axis major


def _hop(key: str | tuple[str, ...], pg: Any, mesh: Mesh, sizes: dict[str, int], index: dict[str, int]) -> Hop:
    axes = (key,) if isinstance(key, str) else key
    size = axes_size(mesh, axes)
    at = _row_major(axes, sizes, index) if index else None
    return Hop(pg, None if pg is None else _torch.group_name(pg), size, axes, at)


def _row_major(axes: tuple[str, ...], sizes: dict[str, int], index: dict[str, int]) -> int:
    at = 0
    for a in axes:
        at = at * sizes[a] + index[a]
    return at


# -- what other modules read of a handle -------------------------------------------------------------


def check_alive(rm: RealizedMesh, api: str) -> None:
    """Raise ``MeshError`` (naming ``api``) when ``rm``'s groups were destroyed or aborted."""
    rm._check_alive(api)


def recall(rm: RealizedMesh, key: Any) -> Any:
    """What :func:`remember` kept on ``rm`` under ``key``, while its groups live; else ``None``.

    One dict lookup and one epoch comparison: the collectives call it on every call. An
    unhashable ``key`` (a list of axis names) is never kept.
    """
    try:
        found = rm._memo.get(key)
    except TypeError:
        return None
    return found if found is not None and rm._epoch == CACHE.epoch else None


def remember(rm: RealizedMesh, key: Any, value: Any) -> Any:
    """Keep ``value`` on ``rm`` under ``key`` (read back by :func:`recall`), and return it."""
    rm._memo[key] = value
    return value


def selected_from(rm: RealizedMesh) -> Mesh | None:
    """The mesh of the realized mesh ``rm`` was selected from (``rm[...]``), or ``None`` for a root."""
    return None if rm._root is None else rm._root.mesh


def index_along(rm: RealizedMesh, axes: tuple[str, ...]) -> int:
    """This rank's index along ``axes`` (row-major, first axis major); the rank must be in the mesh."""
    return _row_major(axes, rm._sizes, rm._index)


def hop_of(rm: RealizedMesh, key: str | tuple[str, ...], api: str) -> Hop:
    """The group of one axis (a name) or of a realized product (a tuple), as the collectives use it."""
    rm._check_alive(api)
    hop = rm._hops.get(key)
    if hop is None:  # not realized: the handle's own error, naming the caller's api
        rm._group_of(key, api) if isinstance(key, str) else rm._product_of(key, api)
        raise AssertionError(f"no hop for {key!r}")  # pragma: no cover - the handle raised
    return hop


class CollectiveError(MeshError, RuntimeError):
    """A collective whose communication failed on an fm group: the message names the axis, the
    group's ranks and its timeout; torch's error is its ``__cause__``. A ``MeshError``, and a
    ``RuntimeError`` as torch's own error was, so ``except RuntimeError`` still catches it."""


def comm_failure(api: str, hop: Hop, device_type: str, exc: BaseException) -> MeshError:
    """The error for a collective whose communication over ``hop`` failed (``exc``, torch's error).

    Names the axis (or product), the group's global ranks and its timeout, so a survivor can tell
    which axis lost a peer. Only built on failure: the success path pays for a ``try`` alone. The
    group leaves the cache (``_cache.retire_failed``): no later realize hands it out again.
    """
    label = hop.axes[0] if len(hop.axes) == 1 else hop.axes
    try:
        ranks: Any = _torch.group_members(hop.pg)
    except (RuntimeError, ValueError):  # a group torch forgot (aborted): its ranks are unknown
        ranks = "unknown"
    timeout = _torch.group_timeout(hop.pg, device_type) if hop.pg is not None else None
    if hop.pg is not None:
        retire_failed(hop.pg)
    waited = f"{timeout.total_seconds():g} s" if timeout is not None else "its timeout"
    return CollectiveError(f"`{api}` requires every member of axis {label!r} (group ranks {ranks}) to take part within "
                     f"the group's timeout ({waited}), but the communication failed on rank {_torch.global_rank()}: "
                     f"a member probably died or is stuck (docs/reliability.md: abort and re-form); torch said: "
                     f"{type(exc).__name__}: {exc}")


def _in_order(names: tuple[str, ...], root_names: tuple[str, ...]) -> bool:
    """True when ``names`` is a subsequence of ``root_names`` in the same order."""
    it = iter(root_names)
    return all(n in it for n in names)


def abort(rm: RealizedMesh | None = None, *, ranks: Iterable[int] | None = None) -> None:
    """Abort every process group realize made in this process (or those holding ``ranks``), without a collective call.

    It returns in bounded time, leaves the default group and adopted groups alone, and every
    realized mesh stale; with ``ranks=`` every other group stays cached (docs/reliability.md, "Abort").

    Args:
        rm: ``None``, or a realized mesh (``rm.abort()``): the same, since realized meshes share
            their groups through the cache, abort is per cache.
        ranks: ``None`` (every group), or global ranks: abort only the groups holding one of them.

    Raises:
        TypeError: ``rm`` is neither ``None`` nor a ``RealizedMesh``, or ``ranks`` is not an
            iterable of ints.
        MeshError: ``ranks`` is empty or holds a rank outside the world.

    Examples:
        >>> mesh = rm.mesh
        >>> fm.abort()  # rm is stale now: rm.group("tp") raises MeshError
        >>> tp = fm.realize(mesh).group("tp")  # fresh groups: [0..3] and [4..7]
        >>> fm.abort(ranks=[2])  # only what rank 2 was in goes: tp [0..3], dp [2, 6]
        >>> fm.realize(mesh).group("tp") is tp  # this rank's tp group survived: reused
        True
    """
    if rm is not None and not isinstance(rm, RealizedMesh):
        raise TypeError(requires("abort", "rm=None or a RealizedMesh", "rm", rm))
    if ranks is None:
        abort_all()
        return
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise TypeError(requires("abort", "ranks=None or an iterable of global ranks", "ranks", ranks))
    chosen = tuple(ranks)
    world = _torch.world_size()
    bad = [r for r in chosen if isinstance(r, bool) or not isinstance(r, int)]
    if bad:
        raise TypeError(requires("abort", "ranks that are ints", "ranks", chosen))
    if not chosen or any(not 0 <= r < world for r in chosen):
        raise MeshError(requires("abort", f"a non-empty set of ranks of the world (0..{world - 1})", "ranks",
                                 list(chosen)))
    abort_holding(frozenset(chosen))
