"""Fixtures of the fake-backend tests."""

from __future__ import annotations

import sys

import pytest
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm


@pytest.fixture
def fake_world():
    """``start(world, rank)``: be ``rank`` of a fresh fake world; nothing is left behind after the test."""
    hook = sys.excepthook  # init_process_group wraps it on every call

    def stop() -> None:
        fm.clear_cache()
        if dist.is_initialized():
            dist.destroy_process_group()

    def start(world: int, rank: int = 0) -> None:
        stop()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        sys.excepthook = hook

    yield start
    stop()
    sys.excepthook = hook
