"""The process-wide group cache: realize's one piece of global mutable state, behind a lock.

Two levels (see ``_realize.py``): an *axis key* (canonical layout, device list, device type,
backend, options) maps to this rank's group of that axis; each group is held under its
*ordered* member tuple (+ backend + options), so axes reached by different paths share groups.
Size-1 axes have no group; the one-rank group torch is lent for them is made by the first
realize call that needs it (``self_group``). ``epoch`` counts :func:`clear_cache` calls: a
realized mesh from an older epoch refuses to be used.
Inspect it with :func:`cache_info`. Creates no process group; :func:`clear_cache` destroys those
realize created.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import torch.distributed as dist

__all__ = ["CACHE", "CacheInfo", "GroupCache", "cache_info", "clear_cache"]


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
        self.epoch = 0


CACHE = GroupCache()


def cache_info() -> CacheInfo:
    """Hits and misses of axis lookups, and how many distinct groups were created."""
    with CACHE.lock:
        return CacheInfo(CACHE.hits, CACHE.misses, CACHE.made)


def clear_cache() -> None:
    """Destroy every process group realize created (and no other), and forget all keys.

    Realized meshes from before the call raise ``MeshError`` when used.
    """
    with CACHE.lock:
        created, CACHE.created = CACHE.created, []
        CACHE.axes.clear()
        CACHE.groups.clear()
        CACHE.labels.clear()
        CACHE.self_group = None
        CACHE.made = CACHE.hits = CACHE.misses = 0
        CACHE.epoch += 1
        if dist.is_initialized():
            for pg in created:
                dist.destroy_process_group(pg)
