"""A single-process fake torch.distributed world (torch's ``fake`` backend), opened per call.

Cheap (about a millisecond with a realize), so every fuzz example can pick its own rank and
world size. Teardown destroys the groups realize made and the default group, whatever the
call under test raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """Be ``rank`` of a fake world of ``world_size`` for the duration of the block."""
    if dist.is_initialized():  # a previous test left one behind: start clean
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        fm.clear_cache()
        dist.destroy_process_group()
