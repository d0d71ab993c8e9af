"""A brute-force reference for cross-mesh reshard tests: every destination block from the source blocks it meets.

Stage 0 only (no relays): for each destination rank and each distinct source block it meets, one
move from a holder of that block (the destination itself when it holds it, else the holders in turn).
Slow and obvious on purpose: the tests check the transport's values and byte counts against the
package's plan, and the plan's total bytes against this one (a relay never lowers what a
destination must receive).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class RefMove(NamedTuple):
    src_rank: int
    dst_rank: int
    index: tuple[slice, ...]
    stage: int
    nbytes: int


def _meet(a: tuple[slice, ...], b: tuple[slice, ...]) -> tuple[slice, ...] | None:
    out = []
    for x, y in zip(a, b, strict=True):
        lo, hi = max(x.start, y.start), min(x.stop, y.stop)
        if hi <= lo:
            return None
        out.append(slice(lo, hi))
    return tuple(out)


def reference_moves(src: Any, dst: Any, shape: tuple[int, ...], itemsize: int) -> list[RefMove]:
    """The moves of the reference plan, non-empty ones only, sorted by (stage, src, dst, starts)."""
    src_blocks = src.devices_indices_map(shape)
    holders: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for rank, block in sorted(src_blocks.items()):
        holders.setdefault(tuple((s.start, s.stop) for s in block), []).append(rank)
    moves = []
    for d, want in sorted(dst.devices_indices_map(shape).items()):
        for key, ranks in holders.items():
            piece = _meet(want, tuple(slice(a, b) for a, b in key))
            if piece is None:
                continue
            sender = d if d in ranks else ranks[d % len(ranks)]
            n = math.prod(s.stop - s.start for s in piece) * itemsize
            moves.append(RefMove(sender, d, piece, 0, n))
    return sorted(moves, key=lambda m: (m.stage, m.src_rank, m.dst_rank, tuple(s.start for s in m.index)))


def bytes_between_ranks(moves: Any) -> int:
    """What crosses between two ranks (local copies are not sent)."""
    return sum(m.nbytes for m in moves if m.src_rank != m.dst_rank)

