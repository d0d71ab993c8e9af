"""torchtitan's ``ParallelDims`` over one functional_mesh family (torchtitan 0.3.0).

Every torchtitan view is a pure :class:`~functional_mesh.Mesh` derived from one world mesh
(:func:`mesh_family`), realized through the group cache, so each distinct group is made once;
:func:`adopt` (in ``Trainer.init_distributed``) or :func:`parallel_dims` hands torchtitan their torch
meshes through a ``ParallelDims`` subclass whose ``build_mesh`` alone is ours. Which value is which
view, the override and what it saves: docs/torchtitan.md. torchtitan is imported only when one of
these runs, and only a version in :data:`TESTED_VERSIONS` is accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import functional_mesh as fm
from functional_mesh import Mesh, MeshError

__all__ = ["SPMD_BACKENDS", "TESTED_VERSIONS", "Family", "View", "adopt", "check_version", "mesh_family",
           "parallel_dims"]

TESTED_VERSIONS: tuple[str, ...] = ("0.3.0",)
"""torchtitan releases this module was run against (tests/torchtitan): the ``torchtitan`` extra pins them."""

SPMD_BACKENDS: tuple[str, ...] = ("partial_dtensor", "full_dtensor", "spmd_types")
"""torchtitan 0.3's ``ParallelismConfig.spmd_backend`` values; "spmd_types" is its default."""

_API = "functional_mesh.integrations.torchtitan"


@dataclasses.dataclass(frozen=True)
class View:
    """One of torchtitan's meshes as a functional_mesh value.

    Attributes:
        mesh: the mesh value, with torchtitan's axis names in torchtitan's order.
        real: the axes that get process groups: those torchtitan backs with a real backend
            (``ParallelDims._mesh_exist``); the others it keeps on its fake backend.
        products: products realized with the view for torch's flatten cache (FSDP2's ``dp_shard`` x
            ``cp``, "loss_mesh"): groups of other views, never new ones (docs/torchtitan.md).
    """

    mesh: Mesh
    real: tuple[str, ...]
    products: tuple[tuple[str, ...], ...] = ()


@dataclasses.dataclass(frozen=True)
class Family:
    """All of torchtitan's meshes for one parallelism, derived from one world mesh.

    Attributes:
        world: the 1-D world mesh ``("world",)``; its one group is the default group.
        base: the world unflattened into (pp, dp_replicate, dp_shard, cp, tp), the axes every view
            flattens or splits.
        views: "dataloading", "loss", "dense", "sparse", and "fwdbwd" (the (pp, dp, cp, tp) view
            of the "spmd_types" backend), in the order torchtitan builds them.
        sizes: the degrees, with ``dp_shard=-1`` resolved.
    """

    world: Mesh
    base: Mesh
    views: Mapping[str, View]
    sizes: Mapping[str, int]


def _exists_0_3_0(spmd_backend: str, ep: int) -> Callable[[str, int], bool]:
    """torchtitan 0.3.0's ``ParallelDims._mesh_exist``: which axes get a real backend."""

    def exists(name: str, degree: int) -> bool:
        if name == "fsdp":  # kept real at degree 1: fully_shard installs its mixed precision over it
            return True
        if name == "dp_shard" and spmd_backend in ("full_dtensor", "spmd_types"):
            return True
        if name == "efsdp":
            return ep > 1
        return degree > 1

    return exists


def _degree(api: str, name: str, value: object, *, allow_auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{api}` requires an int for {name}, but got {name}={value!r}")
    if value < 1 and not (allow_auto and value == -1):
        rule = "a degree >= 1, or -1 (whatever the other degrees leave)" if allow_auto else "a degree >= 1"
        raise MeshError(f"`{api}` requires {rule} for {name}, but got {name}={value!r}")
    return value


def mesh_family(*, world_size: int, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1, tp: int = 1,
                pp: int = 1, ep: int = 1, spmd_backend: str = "spmd_types",
                exists: Callable[[str, int], bool] | None = None) -> Family:
    """The functional_mesh values of torchtitan 0.3's meshes (pure: no torch, no torchtitan).

    Each view is the world unflattened, pp outermost, exactly as torchtitan unflattens its world
    ``DeviceMesh``: same groups, same order inside each group, same coordinates.

    Args:
        world_size, dp_replicate, dp_shard, cp, tp, pp, ep, spmd_backend: ``ParallelDims``'s
            fields (``dp_shard=-1``: whatever the other degrees leave).
        exists: ``(axis name, degree) -> bool``, whether torchtitan gives the axis a real backend;
            default: torchtitan 0.3.0's rule (``ParallelDims._mesh_exist``).

    Returns:
        The :class:`Family`.

    Raises:
        MeshError: a degree below 1, degrees whose product is not ``world_size``, an ``ep`` that
            does not divide ``dp_shard * cp * tp``, or an unknown ``spmd_backend``.

    Examples:
        >>> family = mesh_family(world_size=8, dp_replicate=2, dp_shard=2, tp=2, spmd_backend="full_dtensor")
        >>> family.views["dense"].mesh, family.views["dense"].real
        (Mesh(pp=1, dp_replicate=2, dp_shard=2, cp=1, tp=2), ('dp_replicate', 'dp_shard', 'tp'))
    """
    api = f"{_API}.mesh_family"
    world_size = _degree(api, "world_size", world_size)
    sizes = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
    for name, value in sizes.items():
        _degree(api, name, value, allow_auto=name == "dp_shard")
    ep = _degree(api, "ep", ep)
    if spmd_backend not in SPMD_BACKENDS:
        raise MeshError(f"`{api}` requires a torchtitan 0.3 spmd_backend, but got spmd_backend={spmd_backend!r}; "
                        f"valid: {list(SPMD_BACKENDS)}")
    if dp_shard == -1:
        rest = math.prod(v for k, v in sizes.items() if k != "dp_shard")
        if world_size % rest:
            raise MeshError(f"`{api}` requires world_size divisible by pp * dp_replicate * cp * tp when "
                            f"dp_shard=-1, but got world_size={world_size} and {rest}")
        sizes["dp_shard"] = world_size // rest
    if math.prod(sizes.values()) != world_size:
        product = " * ".join(f"{k}={v}" for k, v in sizes.items())
        raise MeshError(f"`{api}` requires degrees whose product is world_size={world_size}, but got {product} = "
                        f"{math.prod(sizes.values())}")
    expert_block = sizes["dp_shard"] * sizes["cp"] * sizes["tp"]
    if expert_block % ep:
        raise MeshError(f"`{api}` requires ep to divide dp_shard * cp * tp = {expert_block} (torchtitan's efsdp is "
                        f"their quotient), but got ep={ep}")
    exists = exists or _exists_0_3_0(spmd_backend, ep)

    world = fm.make_mesh((world_size,), ("world",))
    base = world.unflatten("world", sizes)
    dp = ("dp_replicate", "dp_shard")
    # torchtitan's views share one torch root, the world mesh, whose flatten cache holds "loss_mesh"
    # (and "dp_shard_cp" once FSDP2 made it): DTensor looks there, by layout, for one group over
    # several dims of any view (a Partial over dp_replicate x dp_shard becomes one all-reduce).
    # Each of our views is its own root, so each gets those products, realized with it (cache hits).
    flattened = [base.flatten((*dp, "cp"), name="loss_mesh").axis_layout("loss_mesh")]
    fsdp_product = spmd_backend != "partial_dtensor" and sizes["cp"] > 1
    if fsdp_product:
        flattened.append(base.flatten(("dp_shard", "cp"), name="dp_shard_cp").axis_layout("dp_shard_cp"))

    def view(mesh: Mesh, products: tuple[tuple[str, ...], ...] = ()) -> View:
        # torchtitan asks _mesh_exist about "loss", the key of the axis it names "loss_mesh"
        real = tuple(n for n in mesh.axis_names if exists("loss" if n == "loss_mesh" else n, mesh.axis_size(n)))
        found = list(products)
        for combo in _combinations([n for n in mesh.axis_names if mesh.axis_size(n) > 1]):
            name = "_".join(combo)
            if combo not in found and mesh.flatten(combo, name=name).axis_layout(name) in flattened:
                found.append(combo)
        return View(mesh, real, tuple(found))

    views = {
        "dataloading": view(base.flatten(dp, name="batch")),
        "loss": view(base.flatten((*dp, "cp"), name="loss_mesh")["loss_mesh"]),
    }
    if spmd_backend == "partial_dtensor":  # the legacy path folds dp_shard and cp into fsdp
        views["dense"] = view(base.flatten(("dp_shard", "cp"), name="fsdp"))
    else:  # fully_shard flattens mesh["dp_shard", "cp"] itself, by that name, when cp > 1
        views["dense"] = view(base, products=(("dp_shard", "cp"),) if fsdp_product else ())
    if spmd_backend == "spmd_types":  # the view the SPMD type system checks forward/backward on
        views["fwdbwd"] = view(base.flatten(dp, name="dp"))
    views["sparse"] = view(base.flatten(("dp_shard", "cp", "tp"), name="efsdp")
                           .unflatten("efsdp", {"efsdp": expert_block // ep, "ep": ep}))
    return Family(world, base, views, {**sizes, "ep": ep})


def _combinations(names: list[str]) -> list[tuple[str, ...]]:
    """Every choice of two or more of ``names``, in their order (views have at most 5 axes)."""
    return [combo for k in range(2, len(names) + 1) for combo in itertools.combinations(names, k)]


# -- torchtitan, imported on use ------------------------------------------------------------------


def check_version() -> str:
    """Import torchtitan and return its version; ``MeshError`` unless it is in :data:`TESTED_VERSIONS`.

    Raises:
        ModuleNotFoundError: torchtitan is not installed.
        MeshError: an installed torchtitan we have not tested (its internals change between releases).
    """
    try:
        import torchtitan
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"`{_API}` requires torchtitan: pip install 'functional_mesh[torchtitan]' "
                                  f"(torchtitan {' or '.join(TESTED_VERSIONS)})") from exc
    version = str(getattr(torchtitan, "__version__", "unknown"))
    if version.split("+")[0] not in TESTED_VERSIONS:
        raise MeshError(f"`{_API}` requires a torchtitan release it was tested with, but got "
                        f"torchtitan.__version__={version!r}; valid: {list(TESTED_VERSIONS)} (ParallelDims' "
                        f"internals change between releases: pip install 'functional_mesh[torchtitan]')")
    return version


@functools.cache
def _parallel_dims_class() -> type:
    """torchtitan's ``ParallelDims`` with our ``build_mesh`` (made on first use, after the version check)."""
    check_version()
    from torchtitan.distributed.parallel_dims import ParallelDims

    @dataclasses.dataclass
    class FmParallelDims(ParallelDims):
        """torchtitan's ``ParallelDims`` whose meshes are one functional_mesh family.

        Everything but ``build_mesh`` is torchtitan's (:func:`parallel_dims`). Once built, ``realized``
        holds each view's ``RealizedMesh``, and ``extra_axes`` per view the fake-backend axes that got
        groups anyway (:func:`_realize_view`).
        """

        realize_options: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
        realized: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
        extra_axes: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, repr=False,
                                                                   compare=False)

        def build_mesh(self) -> Any:
            return _build_mesh(self)

    FmParallelDims.__module__ = __name__
    return FmParallelDims


def _public_fields(pd: Any) -> dict[str, Any]:
    """``ParallelDims``'s constructor arguments (its degrees), without its private mesh caches."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    return {f.name: getattr(pd, f.name) for f in dataclasses.fields(ParallelDims)
            if f.init and not f.name.startswith("_")}


def parallel_dims(*, world_size: int, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1, tp: int = 1,
                  pp: int = 1, ep: int = 1, spmd_backend: str = "spmd_types", **realize_options: Any) -> Any:
    """A torchtitan ``ParallelDims`` whose meshes (built on first use, collectively) are ours.

    Args:
        world_size, dp_replicate, dp_shard, cp, tp, pp, ep, spmd_backend: ``ParallelDims``'s fields.
        **realize_options: passed to every ``fm.realize`` (``device_type``, ``backend``,
            ``timeout``, ``check``).

    Returns:
        An instance of a subclass of ``torchtitan.distributed.ParallelDims``; its meshes are built
        by the first call that needs them (``get_mesh``, ``world_mesh``, ...), on every rank.

    Raises:
        MeshError: degrees torchtitan would reject (see :func:`mesh_family`), or an untested
            torchtitan (:func:`check_version`).
    """
    mesh_family(world_size=world_size, dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep,
                spmd_backend=spmd_backend)  # our messages before torchtitan's asserts
    cls = _parallel_dims_class()
    return cls(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep, world_size=world_size,
               spmd_backend=spmd_backend, realize_options=dict(realize_options))


def adopt(pd: Any, **realize_options: Any) -> Any:
    """The same parallelism as torchtitan's ``ParallelDims`` ``pd``, with our meshes.

    For ``Trainer.init_distributed`` overrides (``return adopt(super().init_distributed())``).
    ``pd`` must not have built its meshes yet (they would be torchtitan's own groups).
    """
    cls = _parallel_dims_class()
    from torchtitan.distributed.parallel_dims import ParallelDims

    if isinstance(pd, cls) and not realize_options:
        return pd
    if not isinstance(pd, ParallelDims):
        raise TypeError(f"`{_API}.adopt` requires a torchtitan ParallelDims, but got pd={pd!r}")
    if pd._single_axis_meshes or pd._world_mesh is not None:
        raise MeshError(f"`{_API}.adopt` requires a ParallelDims whose meshes were not built yet (they hold "
                        f"torchtitan's own process groups), but got pd={pd!r} after build_mesh(); adopt it "
                        f"before the first get_mesh/world_mesh call")
    return parallel_dims(**_public_fields(pd), **realize_options)


def _realize_view(view: View, options: Mapping[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
    """``(realized view, its torch DeviceMesh, fake axes that got groups)``.

    Groups for the real axes and products only (and the size-1 axes, which cost none), when this
    functional_mesh can build a torch ``DeviceMesh`` over a mesh realized with ``axes=``. Otherwise
    the axes torchtitan keeps on its fake backend get groups too: a larger fake axis (``efsdp``
    when ep = 1) then costs real groups, never used.
    """
    # a size-1 axis costs no group (realize makes none) yet answers torch's get_group (the lent
    # group, docs/design.md "Size-1 axes"): spmd_types asks every dim of a view for its group
    axes = tuple(n for n in view.mesh.axis_names if n in view.real or view.mesh.axis_size(n) == 1)
    rm = fm.realize(view.mesh, axes=axes, products=view.products, **options)
    try:
        return rm, rm.device_mesh, ()
    except MeshError:
        rm = fm.realize(view.mesh, products=view.products, **options)
        return rm, rm.device_mesh, tuple(n for n in view.mesh.axis_names if n not in view.real)


def _build_mesh(pd: Any) -> Any:
    """``ParallelDims.build_mesh`` over one functional_mesh family: fills what torchtitan 0.3.0's fills."""
    import torch.distributed as dist

    family = mesh_family(world_size=pd.world_size, dp_replicate=pd.dp_replicate, dp_shard=pd.dp_shard, cp=pd.cp,
                         tp=pd.tp, pp=pd.pp, ep=pd.ep, spmd_backend=pd.spmd_backend, exists=pd._mesh_exist)
    options = dict(pd.realize_options)
    world = fm.realize(family.world, **options)  # the default group: no new group
    if dist.get_world_size() != pd.world_size:
        raise MeshError(f"`{_API}` requires ParallelDims.world_size to be the job's world size "
                        f"{dist.get_world_size()}, but got world_size={pd.world_size}")
    realized, dms, extra = {"world": world}, {"world": world.device_mesh}, {}
    for name, view in family.views.items():
        realized[name], dms[name], extra[name] = _realize_view(view, options)
    dataloading, dense, sparse = dms["dataloading"], dms["dense"], dms["sparse"]

    global_meshes = {"dataloading": dataloading, "loss": dms["loss"], "dense": dense, "sparse": sparse}
    single = {"pp": dataloading["pp"], "batch": dataloading["batch"], "loss": dms["loss"],
              "dp_replicate": dense["dp_replicate"], "cp": dataloading["cp"], "tp": dataloading["tp"],
              "ep": sparse["ep"], "efsdp": sparse["efsdp"]}
    if pd.spmd_backend == "full_dtensor":
        single["dp_shard"] = dense["dp_shard"]
        dense_axes = ["dp_replicate", "dp_shard", "cp", "tp"]
    elif pd.spmd_backend == "spmd_types":
        fwdbwd = dms["fwdbwd"]["dp", "cp", "tp"]
        global_meshes["spmd_dense_for_fwdbwd"] = fwdbwd
        if pd.ep > 1:
            global_meshes["spmd_sparse_for_fwdbwd"] = sparse["dp_replicate", "efsdp", "ep"]
        single["dp"] = fwdbwd["dp"]
        single["dp_shard"] = dense["dp_shard"]
        dense_axes = ["dp", "cp", "tp"]
    else:
        single["fsdp"] = dense["fsdp"]
        dense_axes = ["dp_replicate", "fsdp", "tp"]

    pd.realized, pd.extra_axes = realized, {name: axes for name, axes in extra.items() if axes}
    pd._world_mesh = dms["world"]
    pd._global_meshes = global_meshes
    pd._single_axis_meshes = single
    pd._multi_axis_meshes = {}
    pd._validate_meshes()  # torchtitan's own size checks
    activated = (pd.get_activated_mesh(dense_axes), pd.get_activated_mesh(["dp_replicate", "efsdp", "ep"]))
    pd._spmd_meshes = [m for m in activated if m is not None]
    return pd._world_mesh
