"""Skip marks for what this torch can do, asked of the library's own feature probes, never of its release."""

from __future__ import annotations

import pytest
import torch

from functional_mesh import _torch


def needs_compiled_regions() -> pytest.MarkDecorator:
    """Skip where this torch's dynamo cannot trace a ``shard_map`` region (``_torch.region_trace_failure``).

    There (torch 2.11 and 2.12) ``shard_map`` raises a ``MeshError`` at a compiled region's entry,
    quoting the probe. Asking costs one small compile in the collecting process, once.
    """
    failure = _torch.region_trace_failure()
    return pytest.mark.skipif(
        failure is not None,
        reason=f"torch {torch.__version__}: its dynamo cannot trace a shard_map region ({failure}), so shard_map "
               "raises MeshError at a compiled region's entry; run the region eagerly, or compile the body's parts")


def skip_unless_compiled_regions() -> None:
    """In a test: skip it where :func:`needs_compiled_regions` would (one case of a parametrized test)."""
    failure = _torch.region_trace_failure()
    if failure is not None:
        pytest.skip(f"torch {torch.__version__}: its dynamo cannot trace a shard_map region ({failure}), so "
                    "shard_map raises MeshError at a compiled region's entry")


def fsdp_spmd_types_failure() -> str | None:
    """Why this torch's FSDP2 cannot take torchtitan's ``spmd_types`` backend, or ``None`` if it can.

    That backend hands ``fully_shard`` plain-tensor parameters annotated with ``spmd_types`` types;
    an FSDP2 that reads the annotations imports ``spmd_types`` in ``_fsdp_param`` (torch 2.14),
    one that does not (2.13) requires DTensor parameters and refuses them, whoever made the meshes.
    """
    import importlib.util

    if importlib.util.find_spec("spmd_types") is None:
        return "spmd_types is not installed here"
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param
    except ImportError as exc:
        return f"torch {torch.__version__} has no FSDP2 ({exc})"
    if getattr(_fsdp_param, "spmd", None) is None:
        return (f"torch {torch.__version__}'s FSDP2 does not read spmd_types annotations (its _fsdp_param imports "
                "no spmd_types), so fully_shard refuses the spmd_types backend's plain-tensor parameters")
    return None


def needs_one_graph() -> pytest.MarkDecorator:
    """Skip where this torch cannot share one graph between ranks (``_torch._RUN_TIME_GROUPS``: no
    ``_dtensor.mesh_get_process_group``, torch 2.11 and 2.12); there ``compile_on_one_rank`` changes
    nothing of ours and each rank keeps its own constants, as without the flag."""
    return pytest.mark.skipif(
        not _torch._RUN_TIME_GROUPS,
        reason=f"torch {torch.__version__} resolves no mesh's groups when a graph runs (no "
               "_dtensor.mesh_get_process_group): compile_on_one_rank changes nothing of ours here")
