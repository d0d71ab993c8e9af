"""Fixtures of the fake-backend tests."""

from __future__ import annotations

import contextlib
import sys

import pytest

from tests.fuzz import _world


@pytest.fixture
def fake_world():
    """``start(world, rank)``: be ``rank`` of a fresh fake world (``tests.fuzz._world``); nothing is left
    behind after the test."""
    hook = sys.excepthook  # init_process_group wraps it on every call
    with contextlib.ExitStack() as worlds:
        def start(world: int, rank: int = 0) -> None:
            worlds.close()  # the world before, if any
            worlds.enter_context(_world.fake_world(rank, world))
            sys.excepthook = hook

        yield start
    sys.excepthook = hook
