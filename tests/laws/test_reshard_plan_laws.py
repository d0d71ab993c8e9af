"""Laws of ``fm.plan_reshard``, checked against a reference in this file that lists every element.

The reference knows only torch.chunk's rule, written again here (pieces of ``ceil(n / k)``, the last
ones short or empty; a tuple of axes splits by its first axis, then each piece by the next), and
reads a ``make_mesh`` mesh's ranks row-major off its device list. It never calls the plan's helpers.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm

NAMES = ("a", "b", "c")


def ref_chunks(n: int, sizes: list[int], idx: list[int]) -> tuple[int, int]:
    lo, hi = 0, n
    for k, i in zip(sizes, idx):
        q = -(-(hi - lo) // k)
        lo, hi = min(lo + i * q, hi), min(lo + (i + 1) * q, hi)
    return lo, hi


def ref_blocks(mesh_sizes, names, devices, spec, shape) -> dict[int, tuple[tuple[int, int], ...]]:
    """``{rank: per-dim [lo, hi)}`` by the rule alone; ``devices`` row-major over ``mesh_sizes``."""
    out = {}
    for pos, coord in enumerate(itertools.product(*[range(s) for s in mesh_sizes])):
        at = dict(zip(names, coord))
        block = []
        for d, n in enumerate(shape):
            entry = spec[d] if d < len(spec) else None
            axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
            block.append(ref_chunks(n, [mesh_sizes[names.index(a)] for a in axes], [at[a] for a in axes]))
        out[devices[pos]] = tuple(block)
    return out


def elements(block) -> set[tuple[int, ...]]:
    return set(itertools.product(*[range(lo, hi) for lo, hi in block]))


def index_elements(index) -> list[tuple[int, ...]]:
    return list(itertools.product(*[range(s.start, s.stop) for s in index]))


@st.composite
def sides(draw, pool: list[int] | None = None):
    """(sizes, names, devices, spec) of a small make_mesh mesh and a spec with tuples in any order."""
    k = draw(st.integers(0, 3))
    sizes = []
    for _ in range(k):
        room = 8 // math.prod(sizes or [1])
        if room < 1:
            break
        sizes.append(draw(st.integers(1, min(room, 4))))
    names = list(NAMES[:len(sizes)])
    n = math.prod(sizes)
    if pool is None:
        start = draw(st.integers(0, 6))
        devices = list(range(start, start + n))
        if draw(st.booleans()):
            devices = draw(st.permutations(devices))
    else:
        devices = draw(st.permutations(pool))[:n] if len(pool) >= n else None
        if devices is None:
            devices = list(range(20, 20 + n))
    return sizes, names, list(devices), names


@st.composite
def specs(draw, names: list[str], ndim: int):
    free = list(draw(st.permutations(names)))
    entries = []
    for _ in range(ndim):
        take = draw(st.integers(0, min(2, len(free))))
        got, free = free[:take], free[take:]
        entries.append(None if not got else got[0] if take == 1 else tuple(got))
    return tuple(entries[:draw(st.integers(0, ndim))] if draw(st.booleans()) else entries)


@st.composite
def cases(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 7)) for _ in range(ndim))
    s_sizes, s_names, s_dev, _ = draw(sides())
    kind = draw(st.sampled_from(["disjoint", "overlap", "same"]))
    if kind == "same":
        d_sizes = list(draw(st.permutations(s_sizes)))
        d_dev = list(draw(st.permutations(s_dev)))
    else:
        k = draw(st.integers(0, 3))
        d_sizes = []
        for _ in range(k):
            room = 8 // math.prod(d_sizes or [1])
            if room < 1:
                break
            d_sizes.append(draw(st.integers(1, min(room, 4))))
        n = math.prod(d_sizes)
        if kind == "disjoint":
            start = max(s_dev) + 1 + draw(st.integers(0, 3))
            d_dev = list(draw(st.permutations(range(start, start + n))))
        else:
            pool = sorted(set(s_dev) | set(range(max(s_dev) + 1, max(s_dev) + 1 + n)))
            d_dev = list(draw(st.permutations(pool)))[:n]
    d_names = list(NAMES[:len(d_sizes)])
    s_spec = draw(specs(s_names, ndim))
    d_spec = draw(specs(d_names, ndim))
    itemsize = draw(st.sampled_from([1, 2, 4]))
    relays = draw(st.booleans())
    return (s_sizes, s_names, s_dev, s_spec), (d_sizes, d_names, d_dev, d_spec), shape, itemsize, relays, kind


def build(side):
    sizes, names, devices, spec = side
    return fm.NamedSharding(fm.make_mesh(tuple(sizes), tuple(names), devices=devices), fm.P(*spec))


def replicas(side) -> int:
    sizes, names, _, spec = side
    used = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
    return math.prod(s for n, s in zip(names, sizes) if n not in used)


class _Dtype:  # anything with an int .itemsize
    def __init__(self, itemsize):
        self.itemsize = itemsize


def check(case):
    s_side, d_side, shape, itemsize, relays, kind = case
    plan = fm.plan_reshard(build(s_side), build(d_side), shape, _Dtype(itemsize), relays=relays)
    src = ref_blocks(s_side[0], s_side[1], s_side[2], s_side[3], shape)
    dst = ref_blocks(d_side[0], d_side[1], d_side[2], d_side[3], shape)
    moves = plan.moves
    # execution order, the canonical key, the fields
    assert list(moves) == sorted(moves, key=lambda m: (m.stage, m.src_rank, m.dst_rank, tuple(s.start for s in m.index)))
    for m in moves:
        assert len(m.index) == len(shape) and all(s.step is None and s.start < s.stop for s in m.index)
        assert m.nbytes == math.prod(s.stop - s.start for s in m.index) * itemsize
        assert 0 <= m.stage < plan.stages
        assert m.dst_rank in dst and (m.src_rank in src or m.src_rank in dst)
        if not relays:
            assert m.stage == 0
    # coverage: every destination element exactly once; local copies are what the rank holds
    for rank, block in dst.items():
        got = [e for m in moves if m.dst_rank == rank for e in index_elements(m.index)]
        assert sorted(got) == sorted(elements(block)), rank
    # every sender holds what it sends: its source block at stage 0, or what it received before
    received: dict[int, list[tuple[int, set]]] = {}
    for m in moves:
        received.setdefault(m.dst_rank, []).append((m.stage, set(index_elements(m.index))))
    for m in moves:
        want = set(index_elements(m.index))
        if m.stage == 0:
            assert m.src_rank in src and want <= elements(src[m.src_rank]), m
        else:
            have = set().union(*[e for st_, e in received.get(m.src_rank, []) if st_ < m.stage])
            if m.src_rank in src:
                have |= elements(src[m.src_rank])
            assert want <= have, m
        if m.src_rank == m.dst_rank:
            assert m.stage == 0 and want <= elements(src[m.src_rank])
    # the lower bound, by brute force
    bound = sum(len(elements(block) - (elements(src[r]) if r in src else set())) for r, block in dst.items())
    assert plan.bytes_moved == bound * itemsize == sum(m.nbytes for m in moves if m.src_rank != m.dst_rank)
    sent: dict[int, int] = {}
    for m in moves:
        if m.src_rank != m.dst_rank:
            sent[m.src_rank] = sent.get(m.src_rank, 0) + m.nbytes
    assert plan.max_send_bytes == max(sent.values(), default=0)
    # receives and sends: the moves of one rank, in the one order, the same per pair
    everyone = sorted(set(src) | set(dst) | {max([*src, *dst]) + 1})
    for rank in everyone:
        assert plan.receives(rank) == tuple(m for m in moves if m.dst_rank == rank)
        assert plan.sends(rank) == tuple(m for m in moves if m.src_rank == rank)
        assert plan.in_src(rank) == (rank in src) and plan.in_dst(rank) == (rank in dst)
    return plan, sent


@given(cases())
def test_moves_cover_each_destination_once_from_holders_at_the_lower_bound(case):
    check(case)


@given(cases())
def test_source_replicas_share_the_sending(case):
    s_side, d_side, shape, itemsize, relays, kind = case
    plan, sent = check(case)
    receives = [m for m in plan.moves if m.src_rank != m.dst_rank]
    if kind == "disjoint" and replicas(s_side) >= 2 and len(receives) >= 2:
        assert plan.max_send_bytes < plan.bytes_moved


@given(cases())
def test_relays_send_each_byte_from_the_source_once_per_destination_block(case):
    s_side, d_side, shape, itemsize, relays, kind = case
    if kind != "disjoint":
        return
    on = fm.plan_reshard(build(s_side), build(d_side), shape, "int8", relays=True)
    off = fm.plan_reshard(build(s_side), build(d_side), shape, "int8", relays=False)
    r_d, r_s = replicas(d_side), replicas(s_side)

    def source_load(plan):
        load: dict[int, int] = {}
        for m in plan.moves:
            if m.stage == 0:
                load[m.src_rank] = load.get(m.src_rank, 0) + m.nbytes
        return load

    a, b = source_load(on), source_load(off)
    assert sum(a.values()) * r_d == sum(b.values()) == off.bytes_moved == on.bytes_moved
    if r_d >= r_s:  # every replica sends each block at least once without relays
        assert all(a.get(r, 0) <= b.get(r, 0) for r in set(a) | set(b))
    if r_d >= 2 * r_s and on.bytes_moved:
        assert max(a.values()) < max(b.values())


# -- the relay trees share the forwarding: no replica forwards much more than its own block -----------------

def relay_bound(src, dst, r_d, itemsize):
    """Per destination rank, by the reference alone: its block's bytes, the number of distinct source pieces
    that meet it, the largest part of one, and the bound 2 x block + ceil(log2 R) x that part."""
    pieces = set(src.values())
    out = {}
    for rank, block in dst.items():
        parts = [math.prod(max(0, min(b, q) - max(a, p)) for (a, b), (p, q) in zip(block, piece)) for piece in pieces]
        parts = [n for n in parts if n]
        size = math.prod(hi - lo for lo, hi in block)
        out[rank] = (size * itemsize, len(parts),
                     (2 * size + (r_d - 1).bit_length() * max(parts, default=0)) * itemsize)
    return out


@given(cases())
def test_each_relay_forwards_about_one_block(case):
    s_side, d_side, shape, itemsize, relays, kind = case
    if kind != "disjoint" or not relays:
        return
    plan, sent = check(case)
    src = ref_blocks(s_side[0], s_side[1], s_side[2], s_side[3], shape)
    dst = ref_blocks(d_side[0], d_side[1], d_side[2], d_side[3], shape)
    for rank, (block, count, bound) in relay_bound(src, dst, replicas(d_side), itemsize).items():
        assert sent.get(rank, 0) <= bound, (rank, sent.get(rank, 0), block, count)


# FSDP x TP onto DP replicas of TP, fewer pieces per block (a) than replicas (R): (a, tp, R, shape); the last is
# the 1,152-rank plan of docs/benchmarks.md (16 pieces of 4 MiB blocks, 128 replicas; 16,384 moves)
FAMILY = [(2, 1, 8, (8, 4)), (3, 2, 7, (9, 4)), (4, 2, 16, (16, 4)), (5, 1, 12, (10, 3)), (8, 2, 32, (64, 8)),
          (16, 8, 128, (4096, 4096))]


def test_each_relay_forwards_about_one_block_when_pieces_are_fewer_than_replicas():
    for a, tp, r_d, shape in FAMILY:
        s_side = ([a, tp], ["a", "b"], list(range(a * tp)), ("a", "b"))
        d_side = ([r_d, tp], ["a", "b"], list(range(a * tp, a * tp + r_d * tp)), (None, "b"))
        plan = fm.plan_reshard(build(s_side), build(d_side), shape, "bfloat16")
        sent: dict[int, int] = {}
        for m in plan.moves:
            sent[m.src_rank] = sent.get(m.src_rank, 0) + m.nbytes
        src = ref_blocks(s_side[0], s_side[1], s_side[2], s_side[3], shape)
        dst = ref_blocks(d_side[0], d_side[1], d_side[2], d_side[3], shape)
        bounds = relay_bound(src, dst, r_d, 2)
        assert all(count == a for _, count, _ in bounds.values())
        for rank, (block, count, bound) in bounds.items():
            assert sent.get(rank, 0) <= bound, (a, r_d, rank, sent.get(rank, 0), block)
        # the source sends each piece once per destination block (tp blocks of a pieces: one each)
        assert all(sent[r] == math.prod(hi - lo for lo, hi in src[r]) * 2 for r in src)
        assert plan.max_send_bytes == max(sent.values())
