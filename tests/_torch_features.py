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
