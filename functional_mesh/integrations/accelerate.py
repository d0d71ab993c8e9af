"""accelerate's ``ParallelismConfig`` meshes over functional_mesh (accelerate 1.15.0).

:func:`build_device_mesh` returns the torch ``DeviceMesh`` accelerate's ``build_device_mesh`` makes
(the same dims, flattened dims, groups and coordinates) from one :func:`functional_mesh.realize`, one
group per distinct rank set; :func:`adopt` sets it on the config before the ``Accelerator`` is made;
:func:`mesh_plan` is the pure part. What accelerate builds and what we build: docs/accelerate.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import functional_mesh as fm
from functional_mesh import Mesh, MeshError

__all__ = ["FLATTENED", "ORDER", "TESTED_VERSIONS", "Plan", "adopt", "build_device_mesh", "check_version",
           "mesh_plan"]

TESTED_VERSIONS: tuple[str, ...] = ("1.15.0",)
"""accelerate releases this module was run against (tests/accelerate): the ``accelerate`` extra pins them."""

ORDER: tuple[str, ...] = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
"""accelerate 1.15's order of the mesh dims (``ParallelismConfig._get_mesh``)."""

FLATTENED: dict[str, tuple[str, ...]] = {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp"),
                                         "dp_cp": ("dp_replicate", "dp_shard", "cp")}
"""accelerate 1.15's flattened dims: each name over the enabled dims of its tuple, made when one is enabled."""

_API = "functional_mesh.integrations.accelerate"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The functional_mesh value of one accelerate config.

    Attributes:
        mesh: the mesh: the dims of size above 1, in accelerate's order; ``None`` where accelerate
            builds no mesh (every size 1, or ``sp_size > 1``, whose DeepSpeed backend makes its own
            groups).
        flattened: accelerate's flattened dims that exist for this config, by name: the dims each
            flattens, in mesh order.
        products: the flattened dims of two or more dims, each once: realized as products.
    """

    mesh: Mesh | None
    flattened: dict[str, tuple[str, ...]]
    products: tuple[tuple[str, ...], ...]


def _size(api: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{api}` requires an int for {name}, but got {name}={value!r}")
    if value < 1:
        raise MeshError(f"`{api}` requires a size >= 1 for {name}, but got {name}={value!r}")
    return value


def mesh_plan(*, dp_replicate: int = 1, dp_shard: int = 1, cp: int = 1, sp: int = 1, tp: int = 1,
              sp_backend: str = "deepspeed") -> Plan:
    """The mesh value and flattened dims of accelerate 1.15's ``build_device_mesh`` (pure).

    Args:
        dp_replicate, dp_shard, cp, sp, tp: ``ParallelismConfig``'s sizes (``*_size``).
        sp_backend: ``ParallelismConfig.sp_backend``; accelerate 1.15 knows "deepspeed" only.

    Returns:
        The :class:`Plan`.

    Raises:
        MeshError: a size below 1.
        TypeError: a size that is not an int.

    Examples:
        >>> mesh_plan(dp_shard=4, cp=2).flattened
        {'dp': ('dp_shard',), 'dp_shard_cp': ('dp_shard', 'cp'), 'dp_cp': ('dp_shard', 'cp')}
        >>> mesh_plan(sp=2, dp_shard=4).mesh is None        # DeepSpeed's sequence parallelism: no mesh
        True
        >>> mesh_plan(tp=0)
        Traceback (most recent call last):
        ...
        functional_mesh.MeshError: `functional_mesh.integrations.accelerate.mesh_plan` requires a size >= 1 for tp, but got tp=0
    """
    api = f"{_API}.mesh_plan"
    sizes = {name: _size(api, name, value) for name, value in
             (("dp_replicate", dp_replicate), ("dp_shard", dp_shard), ("cp", cp), ("sp", sp), ("tp", tp))}
    enabled = [name for name in ORDER if sizes[name] > 1]
    if (sp_backend == "deepspeed" and sizes["sp"] > 1) or not enabled:
        return Plan(None, {}, ())
    mesh = fm.make_mesh(tuple(sizes[name] for name in enabled), tuple(enabled))
    flattened = {name: tuple(d for d in dims if d in enabled) for name, dims in FLATTENED.items()}
    flattened = {name: dims for name, dims in flattened.items() if dims}
    products = tuple(dict.fromkeys(dims for dims in flattened.values() if len(dims) > 1))
    return Plan(mesh, flattened, products)


def check_version() -> str:
    """Import accelerate and return its version; ``MeshError`` unless it is in :data:`TESTED_VERSIONS`.

    Raises:
        ModuleNotFoundError: accelerate is not installed.
        MeshError: an installed accelerate we have not tested (its mesh layout may change between releases).
    """
    try:
        import accelerate
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"`{_API}` requires accelerate: pip install 'functional_mesh[accelerate]' "
                                  f"(accelerate {' or '.join(TESTED_VERSIONS)})") from exc
    version = str(getattr(accelerate, "__version__", "unknown"))
    if version.split("+")[0] not in TESTED_VERSIONS:
        raise MeshError(f"`{_API}` requires an accelerate release it was tested with, but got "
                        f"accelerate.__version__={version!r}; valid: {list(TESTED_VERSIONS)} "
                        f"(pip install 'functional_mesh[accelerate]')")
    return version


def _plan_of(config: Any, api: str) -> Plan:
    names = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
    missing = [f"{n}_size" for n in names if not hasattr(config, f"{n}_size")]
    if missing:
        raise TypeError(f"`{api}` requires an accelerate ParallelismConfig, but got parallelism_config={config!r} "
                        f"(no {', '.join(missing)})")
    return mesh_plan(**{n: getattr(config, f"{n}_size") for n in names},
                     sp_backend=getattr(config, "sp_backend", "deepspeed"))


def build_device_mesh(parallelism_config: Any, device_type: str | None = None, **realize_options: Any) -> Any:
    """The torch ``DeviceMesh`` accelerate 1.15's ``build_device_mesh`` returns, over functional_mesh's groups.

    A collective call, like accelerate's: every rank of the job calls it, in the same order.

    Args:
        parallelism_config: an ``accelerate.ParallelismConfig`` (its sizes and ``sp_backend`` are read).
        device_type: "cpu" or "cuda"; ``None`` follows the default group's backend (``fm.realize``).
        **realize_options: passed to ``fm.realize`` (``backend``, ``timeout``, ``check``).

    Returns:
        The torch ``DeviceMesh``, or ``None`` where accelerate returns ``None`` (every size 1, or
        ``sp_size > 1``).

    Raises:
        MeshError: sizes whose product is not the world size, or an untested accelerate (:func:`check_version`).
        TypeError: not a ``ParallelismConfig``.
    """
    api = f"{_API}.build_device_mesh"
    check_version()
    plan = _plan_of(parallelism_config, api)
    if plan.mesh is None:
        return None
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() != plan.mesh.size:
        sizes = " * ".join(f"{n}={s}" for n, s in zip(plan.mesh.axis_names, plan.mesh.axis_sizes, strict=True))
        raise MeshError(f"`{api}` requires sizes whose product is the world size {dist.get_world_size()}, but got "
                        f"{sizes} = {math.prod(plan.mesh.axis_sizes)}")
    from functional_mesh import _torch  # the one home of torch's privates; it needs torch, mesh_plan does not

    rm = fm.realize(plan.mesh, device_type, products=plan.products, **realize_options)
    dm = rm.device_mesh
    # rm.device_mesh holds each product under its dims joined by "_" ("dp_replicate_dp_shard"); accelerate's
    # cache holds its own names, a single dim's too ("dp_shard_cp" of dp_shard alone), and no other
    _torch.rename_flattened(dm, plan.flattened)
    return dm


def adopt(parallelism_config: Any, device_type: str | None = None, **realize_options: Any) -> Any:
    """Give ``parallelism_config`` our mesh, so that ``Accelerator`` uses it; returns the config.

    On every rank, before the ``Accelerator`` is made (docs/accelerate.md, "Using it"); a collective
    call. ``device_type=None``: "cuda" when CUDA is available, else "cpu", as accelerate picks.
    """
    if getattr(parallelism_config, "device_mesh", None) is not None:
        raise MeshError(f"`{_API}.adopt` requires a ParallelismConfig whose mesh was not built yet (it holds "
                        f"accelerate's own process groups), but got one with device_mesh set")
    if device_type is None:
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    parallelism_config.device_mesh = build_device_mesh(parallelism_config, device_type, **realize_options)
    return parallelism_config
