"""The process-wide group cache: realize's one piece of global mutable state, behind a lock.

Two levels (see ``_realize.py``): an *axis key* (canonical layout, device list, device type,
backend, options) maps to this rank's group of that axis; each group is held under its
*ordered* member tuple (+ backend + options), so axes reached by different paths share groups.
Size-1 axes have no group; the one-rank group torch is lent for them is made by the first
realize call that needs it (``self_group``). ``epoch`` counts :func:`clear_cache` and
:func:`abort_all` calls: a realized mesh from an older epoch refuses to be used, and ``ended``
says how its groups ended.
Inspect it with :func:`cache_info`. Creates no process group; :func:`clear_cache` destroys those
realize created.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import torch.distributed as dist

from . import _torch

__all__ = ["CACHE", "CacheInfo", "GroupCache", "abort_all", "cache_info", "clear_cache"]

_ABORT_LOCK_WAIT_S = 1.0  # abort waits this long for a realize call in progress, then goes ahead


class CacheInfo(NamedTuple):
    """``hits``/``misses``: axis lookups; ``groups``: distinct member tuples groups were made for."""

    hits: int
    misses: int
    groups: int


class GroupCache:
    """Every group realize made, by axis key and by ordered member tuple; one per process (``CACHE``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.axes: dict[tuple, Any] = {}  # axis key -> this rank's group of that axis (None: not a member)
        self.groups: dict[tuple, Any] = {}  # (members, backend, options) -> ProcessGroup | None
        self.created: list[Any] = []  # ProcessGroups this process made (destroyed by clear_cache)
        self.labels: dict[Any, list[str]] = {}  # made group -> the axes it serves (its group_desc)
        self.self_group: Any = None  # this rank's one-rank fake-backend group, lent to torch for size-1 axes
        self.made = 0  # distinct member tuples made (members or not; equal on every rank)
        self.hits = 0
        self.misses = 0
        # The generation of the cache: a handle made at another epoch is stale (its groups were
        # destroyed or aborted). A memo kept on a handle may be trusted while
        # ``rm._epoch == CACHE.epoch``; otherwise ``rm._check_alive(api)`` raises MeshError.
        self.epoch = 0
        self.ended = ""  # how the last epoch's groups ended, for the stale handle's message


CACHE = GroupCache()


def cache_info() -> CacheInfo:
    """Hits and misses of axis lookups, and how many distinct groups were created."""
    with CACHE.lock:
        return CacheInfo(CACHE.hits, CACHE.misses, CACHE.made)


def clear_cache() -> None:
    """Destroy every process group realize created (and no other), and forget all keys.

    Realized meshes from before the call raise ``MeshError`` when used. A group torch no longer
    knows (``dist.destroy_process_group()`` without a group already destroyed every group) is
    only forgotten.
    """
    with CACHE.lock:
        created = _forget("clear_cache() destroyed")
        if dist.is_initialized():
            live = _torch.known_groups()
            for pg in created:
                if pg in live:
                    dist.destroy_process_group(pg)


def abort_all() -> list[Any]:
    """Forget every group realize made and return them, for the caller to abort (``fm.abort``).

    Waits at most ``_ABORT_LOCK_WAIT_S`` for a realize call in progress (which may be stuck
    creating groups with a dead peer), then goes ahead without the lock: abort must end.
    """
    locked = CACHE.lock.acquire(timeout=_ABORT_LOCK_WAIT_S)
    try:
        return _forget("abort() aborted")
    finally:
        if locked:
            CACHE.lock.release()


def _forget(ended: str) -> list[Any]:
    """Empty the cache, start a new epoch, and return the groups realize made."""
    created, CACHE.created = CACHE.created, []
    CACHE.axes, CACHE.groups, CACHE.labels = {}, {}, {}
    CACHE.self_group = None
    CACHE.made = CACHE.hits = CACHE.misses = 0
    CACHE.ended = ended
    CACHE.epoch += 1
    return created
