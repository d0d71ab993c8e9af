"""What tests/torchtitan share: the loud skip without torchtitan, and counting torch's group creations."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

RUN_HINT = ("the torchtitan suite runs in a venv with torchtitan 0.3.0 (docs/torchtitan.md, 'Running the tests'): "
            ".venv-titan/bin/python -m pytest tests/torchtitan")


def require_torchtitan() -> str:
    """torchtitan's version, or skip the calling module with the reason (torchtitan not importable)."""
    try:
        import torchtitan
        import torchtitan.distributed.parallel_dims
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever a missing dependency of torchtitan raises
        pytest.skip(f"torchtitan is not importable in {sys.executable} ({type(exc).__name__}: {exc}); {RUN_HINT}",
                    allow_module_level=True)
    return torchtitan.__version__


@contextlib.contextmanager
def counting_groups() -> Iterator[list[dict[str, Any]]]:
    """Record every ``new_group``/``split_group`` call (all the names torch and we call them by)."""
    import torch.distributed as dist
    from torch.distributed import device_mesh
    from torch.distributed import distributed_c10d as c10d

    calls: list[dict[str, Any]] = []
    originals = {kind: getattr(c10d, kind) for kind in ("new_group", "split_group")}

    def wrap(kind: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            ranks = kwargs.get("split_ranks") if kind == "split_group" else kwargs.get("ranks", args[0] if args else None)
            calls.append({"kind": kind, "ranks": None if ranks is None else tuple(map(int, ranks))
                          if kind == "new_group" else [tuple(r) for r in ranks],
                          "backend": kwargs.get("backend"),
                          "local": bool(kwargs.get("use_local_synchronization", False))})
            return fn(*args, **kwargs)

        return counted

    patched = []
    for kind, fn in originals.items():
        wrapped = wrap(kind, fn)
        for module in (c10d, dist, device_mesh):
            if getattr(module, kind, None) is fn:
                setattr(module, kind, wrapped)
                patched.append((module, kind, fn))
    try:
        yield calls
    finally:
        for module, kind, fn in patched:
            setattr(module, kind, fn)
