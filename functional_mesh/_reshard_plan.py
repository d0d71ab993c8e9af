"""The pure plan of a reshard across two meshes: who sends which block of the global tensor to whom, and when.

:func:`plan_reshard` returns a :class:`ReshardPlan`, which answers for one rank what it receives and
sends (moves, :class:`Move`), computed from the two layouts (the block arithmetic: ``_reshard_blocks``),
never by listing the world. How (pieces, local copies, source replicas sharing the sending, relay
trees): docs/across_meshes.md, "The plan".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TypedDict

import numpy as np

from . import _reshard_blocks as B
from ._devices import DeviceList
from ._errors import MeshError, requires
from ._sharding import NamedSharding, global_shape_of, shape_of
from ._validate import Frozen, as_bool, as_int

__all__ = ["Move", "ReshardPlan", "ShapeDtypeStruct", "itemsize_of", "plan_reshard"]

# Bytes per element of the dtypes named by string (torch's names; "torch.float32" reads as "float32").
_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "int16": 2, "uint16": 2, "float16": 2, "half": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "float": 4, "int64": 8, "uint64": 8, "long": 8,
    "float64": 8, "double": 8, "complex64": 8, "complex128": 16,
}


def itemsize_of(api: str, dtype: object) -> int:
    """Bytes per element of ``dtype``: an object with an int ``.itemsize`` (a torch or numpy dtype) or a name."""
    if isinstance(dtype, str):
        size = _ITEMSIZE.get(dtype.removeprefix("torch."))
        if size is None:
            raise MeshError(requires(api, "a known dtype name", "dtype", dtype, ", ".join(_ITEMSIZE)))
        return size
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(requires(api, "a dtype with an int .itemsize (a torch dtype) or a dtype name such as "
                                      "'bfloat16'", "dtype", dtype))
    if size < 1:
        raise MeshError(requires(api, "a dtype of at least one byte per element", "dtype.itemsize", size))
    return size


class _PlanRanks:
    """One side's ranks: membership and length without listing them (iterating lists them)."""

    __slots__ = ("devices",)

    def __init__(self, devices: DeviceList) -> None:
        self.devices = devices

    def __contains__(self, rank: object) -> bool:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            return False
        return self.devices.index_of(int(rank)) is not None

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.devices.to_array().tolist())

    def __repr__(self) -> str:
        return f"ranks {self.devices.describe()}"


class Move(Frozen):
    """One message of a plan: ``src_rank`` sends the block ``index`` of the global tensor to ``dst_rank``.

    ``stage`` > 0: a relay (docs/across_meshes.md, "The plan"); ``src_rank == dst_rank``: a local copy.

    Args:
        src_rank: the sending global rank.
        dst_rank: the receiving global rank.
        index: one ``slice(start, stop)`` of the global tensor per dim (step ``None``).
        stage: the stage it runs in, from 0.
        nbytes: its size in bytes.

    Raises:
        MeshError: a negative rank, stage or size, or a slice with a step or ``stop < start``.

    Examples:
        >>> m = Move(0, 4, (slice(0, 2), slice(0, 8)), 0, 64)
        >>> m, m.key
        (Move(0 -> 4, [0:2, 0:8], stage 0, 64 bytes), (0, 0, 4, (0, 0)))
    """

    __slots__ = ("src_rank", "dst_rank", "index", "stage", "nbytes", "key")
    src_rank: int
    dst_rank: int
    index: tuple[slice, ...]
    stage: int
    nbytes: int
    key: tuple[int, int, int, tuple[int, ...]]  # (stage, src_rank, dst_rank, index starts): the one order of receives, sends and moves

    def __init__(self, src_rank: int, dst_rank: int, index: Sequence[slice], stage: int, nbytes: int) -> None:
        api = "Move"
        values = [as_int(api, name, v) for name, v in
                  (("src_rank", src_rank), ("dst_rank", dst_rank), ("stage", stage), ("nbytes", nbytes))]
        for name, v in zip(("src_rank", "dst_rank", "stage", "nbytes"), values, strict=True):
            if v < 0:
                raise MeshError(requires(api, f"a non-negative {name}", name, v))
        if not isinstance(index, (tuple, list)) or not all(isinstance(s, slice) for s in index):
            raise TypeError(requires(api, "a tuple of slices for index", "index", index))
        for s in index:
            if s.step is not None or not isinstance(s.start, int) or not isinstance(s.stop, int) \
                    or not 0 <= s.start <= s.stop:
                raise MeshError(requires(api, "slices slice(start, stop) with 0 <= start <= stop", "index", index))
        self._set(values[0], values[1], tuple(index), values[2], values[3])

    @classmethod
    def _make(cls, src: int, dst: int, index: tuple[slice, ...], stage: int, nbytes: int) -> Move:
        self = object.__new__(cls)
        self._set(src, dst, index, stage, nbytes)
        return self

    def _set(self, src: int, dst: int, index: tuple[slice, ...], stage: int, nbytes: int) -> None:
        put = object.__setattr__
        put(self, "src_rank", src)
        put(self, "dst_rank", dst)
        put(self, "index", index)
        put(self, "stage", stage)
        put(self, "nbytes", nbytes)
        put(self, "key", (stage, src, dst, tuple([s.start for s in index])))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Move):
            return NotImplemented
        return self.key == other.key and self.index == other.index and self.nbytes == other.nbytes

    def __hash__(self) -> int:
        return hash((self.key, tuple(s.stop for s in self.index), self.nbytes))

    def __reduce__(self) -> tuple[type[Move], tuple[int, int, tuple[slice, ...], int, int]]:
        return (Move, (self.src_rank, self.dst_rank, self.index, self.stage, self.nbytes))

    def __repr__(self) -> str:
        where = ", ".join(f"{s.start}:{s.stop}" for s in self.index)
        return f"Move({self.src_rank} -> {self.dst_rank}, [{where}], stage {self.stage}, {self.nbytes} bytes)"


def _key(move: Move) -> tuple[int, int, int, tuple[int, ...]]:
    return move.key


class _Cache(TypedDict, total=False):
    moves: tuple[Move, ...]
    bytes_moved: int
    max_send_bytes: int


class ReshardPlan(Frozen):
    """Who sends which block to whom, in which stage, to turn sharding ``src`` into ``dst``; from :func:`plan_reshard`.

    Args:
        src: the source ``NamedSharding`` (kept as ``plan.src``).
        dst: the destination ``NamedSharding`` (``plan.dst``).
        shape: the global shape, a tuple of ints (``plan.shape``).
        dtype: the dtype as given (``plan.dtype``).
        itemsize: bytes per element (``plan.itemsize``).
        relays: whether destination replicas forward to each other, stages 1, 2, ... (``plan.relays``).

    Raises:
        MeshError: nothing of its own: build plans with :func:`plan_reshard`, which checks its arguments.

    Examples:
        >>> src = fm.NamedSharding(fm.make_mesh((2, 2), ("dp", "tp")), fm.P(None, "tp"))
        >>> dst = fm.NamedSharding(fm.make_mesh((4,), ("tp",), devices=range(4, 8)), fm.P(None, "tp"))
        >>> plan = fm.plan_reshard(src, dst, (8, 8), "float32")
        >>> plan.sends(0), plan.sends(2)  # the replicas of the tp=0 piece share its two receivers
        ((Move(0 -> 4, [0:8, 0:2], stage 0, 64 bytes),), (Move(2 -> 5, [0:8, 2:4], stage 0, 64 bytes),))
    """

    __slots__ = ("src", "dst", "shape", "dtype", "itemsize", "relays", "_s", "_d", "_levels", "_apart", "_cache")
    src: NamedSharding
    dst: NamedSharding
    shape: tuple[int, ...]
    dtype: object
    itemsize: int
    relays: bool
    _s: B.Side
    _d: B.Side
    _levels: int
    _apart: bool
    _cache: _Cache

    def __init__(self, src: NamedSharding, dst: NamedSharding, shape: tuple[int, ...], dtype: object,
                 itemsize: int, relays: bool) -> None:  # plan_reshard validates
        s, d = B.Side(src, len(shape)), B.Side(dst, len(shape))
        (alo, ahi), (blo, bhi) = B.bounds(s.devices), B.bounds(d.devices)
        for name, value in (("src", src), ("dst", dst), ("shape", shape), ("dtype", dtype), ("itemsize", itemsize),
                            ("relays", relays), ("_s", s), ("_d", d),
                            ("_levels", (d.replicas - 1).bit_length() if relays else 0),
                            ("_apart", ahi < blo or bhi < alo), ("_cache", {})):
            object.__setattr__(self, name, value)

    # -- the plan's size ---------------------------------------------------------------------------------

    @property
    def stages(self) -> int:
        """The number of stages: 1 + ceil(log2(destination replicas)) with relays, else 1; 0 for an empty tensor.

        A stage may carry no move (every replica of a block already holds a piece, say)."""
        return 0 if math.prod(self.shape) == 0 else 1 + self._levels

    @property
    def src_ranks(self) -> _PlanRanks:
        """The source's ranks: ``rank in plan.src_ranks`` and ``len`` in O(1) on a range, never listed unless iterated."""
        return _PlanRanks(self._s.devices)

    @property
    def dst_ranks(self) -> _PlanRanks:
        """The destination's ranks, as :attr:`src_ranks`."""
        return _PlanRanks(self._d.devices)

    def in_src(self, rank: int) -> bool:
        """Whether ``rank`` is a device of the source mesh: O(1) for a range of devices.

        Args:
            rank: a global rank.

        Returns:
            True when the source mesh holds ``rank``.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> sh = fm.NamedSharding(fm.make_mesh((2,), ("x",)), fm.P())
            >>> plan = fm.plan_reshard(sh, fm.NamedSharding(fm.make_mesh((2,), ("x",), devices=[5, 4]), fm.P()), (2,), "int8")
            >>> plan.in_src(1), plan.in_dst(1), plan.in_dst(5)
            (True, False, True)
        """
        return self._s.devices.index_of(self._rank("ReshardPlan.in_src", rank)) is not None

    def in_dst(self, rank: int) -> bool:
        """Whether ``rank`` is a device of the destination mesh: O(1) for a range of devices.

        Args:
            rank: a global rank.

        Returns:
            True when the destination mesh holds ``rank``.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> sh = fm.NamedSharding(fm.make_mesh((2,), ("x",)), fm.P())
            >>> fm.plan_reshard(sh, sh, (2,), "int8").in_dst(2)
            False
        """
        return self._d.devices.index_of(self._rank("ReshardPlan.in_dst", rank)) is not None

    @staticmethod
    def _rank(api: str, rank: object) -> int:
        rank = as_int(api, "rank", rank)
        if rank < 0:
            raise MeshError(requires(api, "a non-negative global rank", "rank", rank))
        return rank

    # -- arithmetic shared by both directions ------------------------------------------------------------

    def _held(self, rank: int) -> tuple[tuple[int, ...], ...] | None:
        """The source split coordinates of the piece ``rank`` holds, or None when it is no source rank."""
        if self._apart:  # asked of destination ranks only, none of which is then a source rank
            return None
        coord = self._s.mesh.coordinate(rank)
        return None if coord is None else self._s.split(coord)

    def _holds(self, rank: int, piece: tuple[tuple[int, ...], ...]) -> bool:
        return not self._apart and self._held(rank) == piece

    def _unit(self, block_split: tuple[tuple[int, ...], ...], block: list[tuple[int, int]],
              piece: list[tuple[int, int]]) -> int:
        """The destination block's rank among the blocks that meet the piece, summed over dims."""
        d = self._d
        return sum(B.count_before(n, sizes, b0) - B.count_before(n, sizes, p0)
                   for n, sizes, (b0, _), (p0, _) in zip(self.shape, d.sizes, block, piece, strict=True))

    def _tree_root(self, block: list[tuple[int, int]], piece: list[tuple[int, int]]) -> int:
        """The replica at the root of the piece's tree in the block: :func:`B.relay_root` of the piece's row-major rank
        among the source pieces that meet the block (the order of ``B.pieces``, counted here without listing them)."""
        k, count = 0, 1
        for n, sizes, (b0, b1), (p0, _) in zip(self.shape, self._s.sizes, block, piece, strict=True):
            first = B.count_before(n, sizes, b0)  # the leaves before the block; then the ones that meet it
            meet = B.count_before(n, sizes, b1 - 1) + 1 - first
            k, count = k * meet + B.count_before(n, sizes, p0) - first, count * meet
        return B.relay_root(k, count, self._d.replicas)

    def _source_holder(self, piece: tuple[tuple[int, ...], ...], unit: int) -> int:
        s = self._s
        return s.rank_of(piece, (unit + s.piece_offset(piece)) % s.replicas)

    def _move(self, src: int, dst: int, a: list[tuple[int, int]], b: list[tuple[int, int]], stage: int) -> Move:
        index = tuple(slice(max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
        return Move._make(src, dst, index, stage, math.prod(s.stop - s.start for s in index) * self.itemsize)

    # -- one rank's moves --------------------------------------------------------------------------------

    def receives(self, rank: int) -> tuple[Move, ...]:
        """What ``rank`` receives, local copies included, in the canonical order of :attr:`Move.key`.

        O(pieces received), whatever the world size.

        Args:
            rank: a global rank (one of neither mesh receives nothing).

        Returns:
            The moves whose ``dst_rank`` is ``rank``, sorted by ``(stage, src_rank, dst_rank, index starts)``.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> mesh = fm.make_mesh((2,), ("x",))
            >>> plan = fm.plan_reshard(fm.NamedSharding(mesh, fm.P("x")), fm.NamedSharding(mesh, fm.P()), (4,), "int8")
            >>> plan.receives(1)          # its own half is a local copy
            (Move(0 -> 1, [0:2], stage 0, 2 bytes), Move(1 -> 1, [2:4], stage 0, 2 bytes))
        """
        rank = self._rank("ReshardPlan.receives", rank)
        d, s, shape = self._d, self._s, self.shape
        coord = d.mesh.coordinate(rank)
        if coord is None:
            return ()
        b, j = d.split(coord), d.replica(coord)
        block = d.block(shape, b)
        if any(lo == hi for lo, hi in block):
            return ()
        held = self._held(rank)
        tree = self.relays and d.replicas > 1
        out = []
        base = d.split_position(b)
        lists = B.piece_lists(shape, s.sizes, block)
        count = math.prod(len(x) for x in lists)
        for k, combo in enumerate(itertools.product(*lists)):
            piece = tuple(leaf[0] for _, leaf in combo)
            bounds = [(lo, hi) for _, (_, lo, hi) in combo]
            if piece == held:
                out.append(self._move(rank, rank, block, bounds, 0))
                continue
            if tree:
                root = B.relay_root(k, count, d.replicas)  # k: the piece's row-major rank among those meeting the block
                at = (j - root) % d.replicas
                if at:
                    stage = at.bit_length()
                    parent = d.devices[base + d.replica_position((at - (1 << (stage - 1)) + root) % d.replicas)]
                    # a parent that holds the piece in the source sends it in stage 0
                    out.append(self._move(parent, rank, block, bounds, 0 if self._holds(parent, piece) else stage))
                    continue
                unit = self._unit(b, block, bounds)
            else:
                unit = self._unit(b, block, bounds) * d.replicas + j
            out.append(self._move(self._source_holder(piece, unit), rank, block, bounds, 0))
        out.sort(key=_key)
        return tuple(out)

    def sends(self, rank: int) -> tuple[Move, ...]:
        """What ``rank`` sends, local copies included, in the canonical order of :attr:`Move.key`.

        O(moves sent), whatever the world size.

        Args:
            rank: a global rank (one of neither mesh sends nothing).

        Returns:
            The moves whose ``src_rank`` is ``rank``: its source block (stage 0) and, with relays, what it
            forwards (stages 1, 2, ...), sorted by ``(stage, src_rank, dst_rank, index starts)``.

        Raises:
            MeshError: a negative rank.

        Examples:
            >>> src = fm.NamedSharding(fm.make_mesh((1,), ("x",)), fm.P())
            >>> dst = fm.NamedSharding(fm.make_mesh((4,), ("dp",), devices=range(1, 5)), fm.P())
            >>> plan = fm.plan_reshard(src, dst, (2,), "int8")
            >>> plan.sends(0), plan.sends(1)
            ((Move(0 -> 1, [0:2], stage 0, 2 bytes),), (Move(1 -> 2, [0:2], stage 1, 2 bytes), Move(1 -> 3, [0:2], stage 2, 2 bytes)))
        """
        rank = self._rank("ReshardPlan.sends", rank)
        out = self._sends_as_source(rank) + self._sends_as_relay(rank)
        out.sort(key=_key)
        return tuple(out)

    def _sends_as_source(self, rank: int) -> list[Move]:
        d, s, shape = self._d, self._s, self.shape
        coord = s.mesh.coordinate(rank)
        if coord is None:
            return []
        piece, r = s.split(coord), s.replica(coord)
        bounds = s.block(shape, piece)
        if any(lo == hi for lo, hi in bounds):
            return []
        out = []
        dcoord = None if self._apart else d.mesh.coordinate(rank)
        if dcoord is not None:  # the local copy of what this rank holds of its own destination block
            block = d.block(shape, d.split(dcoord))
            if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(block, bounds, strict=True)):
                out.append(self._move(rank, rank, block, bounds, 0))
        per_dim = [B.leaves(n, sizes, lo, hi) for n, sizes, (lo, hi) in zip(shape, d.sizes, bounds, strict=True)]
        target = (r - s.piece_offset(piece)) % s.replicas
        tree = self.relays
        for head in itertools.product(*[enumerate(x) for x in per_dim[:-1]]):
            base = sum(i for i, _ in head)
            last = per_dim[-1] if per_dim else [((), 0, 0)]
            if tree:  # units are blocks: unit = base + i of the last dim
                picks = [(i, 0) for i in range((target - base) % s.replicas, len(last), s.replicas)]
            else:  # units are (block, replica j): unit = (base + i) * R_d + j
                picks = [(i, j) for i in range(len(last))
                         for j in range((target - (base + i) * d.replicas) % s.replicas, d.replicas, s.replicas)]
            for i, j in picks:
                leaves = [leaf for _, leaf in head] + ([last[i]] if per_dim else [])
                b = tuple(leaf[0] for leaf in leaves)
                block = [(lo, hi) for _, lo, hi in leaves]
                if tree and d.replicas > 1:
                    j = self._tree_root(block, bounds)
                receiver = d.rank_of(b, j)
                if receiver != rank and not self._holds(receiver, piece):
                    out.append(self._move(rank, receiver, block, bounds, 0))
        return out

    def _sends_as_relay(self, rank: int) -> list[Move]:
        d, s, shape = self._d, self._s, self.shape
        if not self.relays or d.replicas == 1:
            return []
        coord = d.mesh.coordinate(rank)
        if coord is None:
            return []
        b, j = d.split(coord), d.replica(coord)
        block = d.block(shape, b)
        if any(lo == hi for lo, hi in block):
            return []
        out = []
        base = d.split_position(b)
        lists = B.piece_lists(shape, s.sizes, block)
        count = math.prod(len(x) for x in lists)
        for k, combo in enumerate(itertools.product(*lists)):
            piece = tuple(leaf[0] for _, leaf in combo)
            bounds = [(lo, hi) for _, (_, lo, hi) in combo]
            root = B.relay_root(k, count, d.replicas)
            at = (j - root) % d.replicas
            mine = self._holds(rank, piece)  # then it sends in stage 0, as a source holder
            for stage in range(at.bit_length() + 1, self._levels + 1):
                child = at + (1 << (stage - 1))
                if child >= d.replicas:
                    break
                receiver = d.devices[base + d.replica_position((child + root) % d.replicas)]
                if not self._holds(receiver, piece):
                    out.append(self._move(rank, receiver, block, bounds, 0 if mine else stage))
        return out

    # -- the whole plan ----------------------------------------------------------------------------------

    @property
    def moves(self) -> tuple[Move, ...]:
        """Every move, in execution order (sorted by :attr:`Move.key`: stage first). Lists every destination
        rank once; computed on first use and kept."""
        if "moves" not in self._cache:
            out = [m for rank in self._d.devices.to_array().tolist() for m in self.receives(rank)]
            out.sort(key=_key)
            self._cache["moves"] = tuple(out)
        return self._cache["moves"]

    @property
    def bytes_moved(self) -> int:
        """Bytes the destination ranks receive from other ranks: every destination block, minus what its rank
        holds in the source (the lower bound; relays do not change it).

        Arithmetic on the layouts; only the ranks of both meshes are visited (none when their devices are
        apart)."""
        if "bytes_moved" not in self._cache:
            total = self._d.replicas * math.prod(self.shape)  # the destination blocks tile the tensor
            common = B.common_ranks(self._s.devices, self._d.devices)
            local = np.ones(common.size, dtype=np.int64)
            if common.size:  # what each rank of both meshes holds of its own block, all at once
                mine, held = self._d.blocks_of(self.shape, common), self._s.blocks_of(self.shape, common)
                for (a0, a1), (b0, b1) in zip(mine, held, strict=True):
                    local *= np.maximum(0, np.minimum(a1, b1) - np.maximum(a0, b0))
            self._cache["bytes_moved"] = (total - int(local.sum())) * self.itemsize
        return self._cache["bytes_moved"]

    @property
    def max_send_bytes(self) -> int:
        """The busiest sender's bytes, local copies excluded (0 when nothing moves).

        When no rank is in both meshes, arithmetic per source piece and per destination block (no move is
        listed); otherwise read off :attr:`moves`."""
        if "max_send_bytes" not in self._cache:
            if self._apart or B.common_ranks(self._s.devices, self._d.devices).size == 0:
                self._cache["max_send_bytes"] = max(self._source_loads(), self._relay_loads()) * self.itemsize
            else:
                sent: dict[int, int] = {}
                for m in self.moves:
                    if m.src_rank != m.dst_rank:
                        sent[m.src_rank] = sent.get(m.src_rank, 0) + m.nbytes
                self._cache["max_send_bytes"] = max(sent.values(), default=0)
        return self._cache["max_send_bytes"]

    def _source_loads(self) -> int:
        """The most elements one source rank sends (meshes apart: no receiver holds anything)."""
        d, s, shape = self._d, self._s, self.shape
        best = 0
        for piece in B.pieces(shape, s.sizes, [(0, n) for n in shape]):
            split = tuple(leaf[0] for _, leaf in piece)
            bounds = [(lo, hi) for _, (_, lo, hi) in piece]
            units, sizes = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
            for n, dsizes, (lo, hi) in zip(shape, d.sizes, bounds, strict=True):
                leaves = B.leaves(n, dsizes, lo, hi)
                units = np.add.outer(units, np.arange(len(leaves), dtype=np.int64)).ravel()
                sizes = np.multiply.outer(sizes, np.array([min(hi, b) - max(lo, a) for _, a, b in leaves],
                                                          dtype=np.int64)).ravel()
            if self.relays:  # one unit per block, sent by replica (unit + piece offset) mod R_s
                load = np.bincount((units + s.piece_offset(split)) % s.replicas, weights=sizes,
                                   minlength=s.replicas)
            else:  # unit (block, j) = block * R_d + j: replica r sends the j = r - shift - block * R_d (mod R_s)
                load = np.zeros(s.replicas, dtype=np.int64)
                step = max(1, 2**22 // s.replicas)  # blocks at a time: the table below stays ~4M entries
                for at in range(0, units.size, step):
                    shift = (units[at:at + step] * d.replicas + s.piece_offset(split)) % s.replicas
                    first = (np.arange(s.replicas)[:, None] - shift[None, :]) % s.replicas
                    copies = np.where(first < d.replicas, (d.replicas - 1 - first) // s.replicas + 1, 0)
                    load += (copies * sizes[None, at:at + step]).sum(axis=1)
            best = max(best, int(load.max()))
        return best

    def _relay_loads(self) -> int:
        """The most elements one destination rank forwards (meshes apart: every replica needs every piece).

        Tree position ``a`` sends to ``a + 2**m`` for the ``2**m`` with ``a < 2**m < R - a``: one send per
        ``m`` with ``a < w_m = min(2**m, R - 2**m)``. Replica ``j`` is at ``(j - r) mod R`` in the tree rooted
        at ``r``, so its load is, summed over ``m``, the elements of the pieces rooted in the ``w_m`` positions
        up to ``j`` (cyclically): a window sum over the sorted roots. Going forward from a root to the next one
        every term only falls, so only the roots are evaluated: per block O(pieces + roots x levels x log roots),
        whatever ``R``."""
        d, s, shape = self._d, self._s, self.shape
        replicas = d.replicas
        if not self.relays or replicas == 1 or math.prod(shape) == 0:
            return 0
        widths = [min(1 << m, replicas - (1 << m)) for m in range(self._levels)]
        best = 0
        for block in B.pieces(shape, d.sizes, [(0, n) for n in shape]):
            bounds = [(lo, hi) for _, (_, lo, hi) in block]
            lists = B.piece_lists(shape, s.sizes, bounds)
            count = math.prod(len(x) for x in lists)
            per_root: dict[int, int] = {}  # elements of the pieces rooted at each replica
            for k, combo in enumerate(itertools.product(*lists)):
                r = B.relay_root(k, count, replicas)
                per_root[r] = per_root.get(r, 0) + math.prod(
                    min(hi, b) - max(lo, a) for (_, (_, a, b)), (lo, hi) in zip(combo, bounds, strict=True))
            if not per_root:
                continue
            roots = np.array(sorted(per_root), dtype=np.int64)
            elems = np.array([per_root[r] for r in roots.tolist()], dtype=np.int64)
            ext = np.concatenate([roots - replicas, roots])  # one turn back, for the windows that wrap
            cum = np.concatenate([[0], np.cumsum(np.concatenate([elems, elems]))])
            top = cum[np.searchsorted(ext, roots, side="right")]
            load = np.zeros(roots.size, dtype=np.int64)
            for w in widths:
                load += top - cum[np.searchsorted(ext, roots - (w - 1), side="left")]
            best = max(best, int(load.max()))
        return best

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReshardPlan):
            return NotImplemented
        return (self.src, self.dst, self.shape, self.itemsize, self.relays) == \
            (other.src, other.dst, other.shape, other.itemsize, other.relays)

    def __hash__(self) -> int:
        return hash((self.src, self.dst, self.shape, self.itemsize, self.relays))

    def __reduce__(self) -> tuple[Callable[[NamedSharding, NamedSharding, tuple[int, ...], object, bool], ReshardPlan],
                                  tuple[NamedSharding, NamedSharding, tuple[int, ...], object, bool]]:
        return (_rebuild_plan, (self.src, self.dst, self.shape, self.dtype, self.relays))

    def __repr__(self) -> str:
        return (f"ReshardPlan({self.shape} x {self.itemsize} bytes: {self.src.mesh!r} {self.src.spec!r} -> "
                f"{self.dst.mesh!r} {self.dst.spec!r}, {self.stages} stage{'s' if self.stages != 1 else ''})")


def _rebuild_plan(src: NamedSharding, dst: NamedSharding, shape: tuple[int, ...], dtype: object,
                  relays: bool) -> ReshardPlan:
    return plan_reshard(src, dst, shape, dtype, relays=relays)


def _check_sharding(api: str, name: str, sharding: object) -> NamedSharding:
    if not isinstance(sharding, NamedSharding):
        raise TypeError(requires(api, f"a functional_mesh.NamedSharding for {name}", name, sharding))
    if sharding.spec.unreduced:
        raise MeshError(requires(api, f"a {name} sharding with no pending sum (reduce first: psum over "
                                      f"{sorted(sharding.spec.unreduced)})", f"{name}.spec", sharding.spec),
                        mesh=sharding.mesh)
    if sharding.mesh.num_groups != 1:
        raise MeshError(requires(api, f"a {name} mesh of one group (a family such as mesh['tp'] holds one copy "
                                      "per group: plan each group's reshard on the group's own mesh)",
                                 f"{name}.mesh", sharding.mesh), mesh=sharding.mesh)
    return sharding


def plan_reshard(src: NamedSharding, dst: NamedSharding, shape: Sequence[int], dtype: object, *,
                 relays: bool = True) -> ReshardPlan:
    """The plan that turns a tensor sharded as ``src`` into one sharded as ``dst``, on any two meshes.

    Pure: no torch, no communication; how the moves are chosen: docs/across_meshes.md, "The plan".

    Args:
        src: the source sharding (on a mesh of one group; nothing unreduced).
        dst: the destination sharding (on a mesh of one group; nothing unreduced).
        shape: the global shape, with at least as many dims as each spec.
        dtype: a torch dtype, anything with an int ``.itemsize``, or a name such as ``"bfloat16"``.
        relays: forward among destination replicas (stages 1, 2, ...); ``False``: every move comes from a
            source holder in stage 0.

    Returns:
        A :class:`ReshardPlan`.

    Raises:
        MeshError: an unreduced sharding (reduce first), a family mesh, a shape the specs do not fit, an
            unknown dtype name.
        TypeError: a sharding that is not a ``NamedSharding``, a dtype without ``.itemsize``, a shape or
            ``relays`` of another type.

    Examples:
        >>> mesh = fm.make_mesh((2, 2), ("dp", "tp"))
        >>> plan = fm.plan_reshard(fm.NamedSharding(mesh, fm.P("dp", "tp")), fm.NamedSharding(mesh, fm.P("tp")),
        ...                        (4, 4), "float32")
        >>> plan.receives(1)          # rows 2:4; rank 1 holds none of them
        (Move(2 -> 1, [2:4, 0:2], stage 0, 16 bytes), Move(3 -> 1, [2:4, 2:4], stage 0, 16 bytes))
    """
    api = "plan_reshard"
    src = _check_sharding(api, "src", src)
    dst = _check_sharding(api, "dst", dst)
    shape = global_shape_of(src, api, shape)
    global_shape_of(dst, api, shape)
    itemsize = itemsize_of(api, dtype)
    return ReshardPlan(src, dst, shape, dtype, itemsize, as_bool(api, "relays", relays))


class ShapeDtypeStruct(Frozen):
    """A tensor's global shape, dtype and (optionally) sharding, without its data (JAX's name).

    What a rank that holds no part of the source passes to ``fm.reshard`` in place of a tensor.

    Args:
        shape: the global shape: non-negative ints.
        dtype: a torch dtype, anything with an int ``.itemsize``, or a dtype name such as ``"bfloat16"``.
        sharding: a ``NamedSharding`` the shape fits, or ``None``.

    Raises:
        MeshError: a negative size, a shape the sharding's spec does not fit, an unknown dtype name.

    Examples:
        >>> sds = fm.ShapeDtypeStruct((8, 4), "bfloat16")
        >>> sds, sds.itemsize, sds.nbytes
        (ShapeDtypeStruct(shape=(8, 4), dtype='bfloat16'), 2, 64)
    """

    __slots__ = ("shape", "dtype", "sharding", "itemsize")
    shape: tuple[int, ...]
    dtype: object
    sharding: NamedSharding | None
    itemsize: int

    def __init__(self, shape: Sequence[int], dtype: object, sharding: NamedSharding | None = None) -> None:
        api = "ShapeDtypeStruct"
        dims = shape_of(api, "shape", shape)
        itemsize = itemsize_of(api, dtype)
        if sharding is not None:
            if not isinstance(sharding, NamedSharding):
                raise TypeError(requires(api, "a NamedSharding or None for sharding", "sharding", sharding))
            global_shape_of(sharding, api, dims)
        for name, value in (("shape", dims), ("dtype", dtype), ("sharding", sharding), ("itemsize", itemsize)):
            object.__setattr__(self, name, value)

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """The global tensor's size in bytes."""
        return math.prod(self.shape) * self.itemsize

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShapeDtypeStruct):
            return NotImplemented
        return (self.shape, self.dtype, self.sharding) == (other.shape, other.dtype, other.sharding)

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.sharding))

    def __reduce__(self) -> tuple[type[ShapeDtypeStruct], tuple[tuple[int, ...], object, NamedSharding | None]]:
        return (ShapeDtypeStruct, (self.shape, self.dtype, self.sharding))

    def __repr__(self) -> str:
        tail = f", sharding={self.sharding!r}" if self.sharding is not None else ""
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype!r}{tail})"
