"""The device list a mesh lives on: global ranks, kept symbolic when they form a range.

:class:`DeviceRange` (a progression: three ints) or :class:`DeviceArray` (any other list), picked by
the constructors of ``DeviceList``, shared by every mesh derived from one: docs/design.md,
"Ranks and layouts".

Examples:
    >>> DeviceList.from_values("make_mesh", [8, 10, 12])
    DeviceList(8..12 step 2)
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from typing import Self

import attrs
import numpy as np

from . import _layout as L
from ._errors import MeshError, requires
from ._validate import MAX_RANK, Frozen, as_int, as_int_array

__all__ = ["DeviceArray", "DeviceList", "DeviceRange"]


class DeviceList(Frozen):
    """An immutable list of distinct non-negative global ranks: a :class:`DeviceRange` or a :class:`DeviceArray`.

    Shared by every mesh derived from one (so frozen); built with :meth:`iota`, :meth:`from_range`
    or :meth:`from_values`.

    Examples:
        >>> DeviceList.from_values("make_mesh", range(3, -1, -1)) == DeviceList.from_values("make_mesh", [3, 2, 1, 0])
        True
    """

    __slots__ = ()
    _n: int  # set by each kind
    _hash: int  # set by each kind

    def __init__(self) -> None:  # use the classmethods
        raise TypeError("use DeviceList.iota, DeviceList.from_range or DeviceList.from_values")

    @classmethod
    def iota(cls, n: int, api: str = "devices") -> DeviceRange:
        """The symbolic ranks ``0..n-1``."""
        if n < 0:
            raise MeshError(requires(api, "a non-negative number of devices", "n", n))
        if n > sys.maxsize:
            raise MeshError(requires(api, f"at most {sys.maxsize} devices", "n", n))
        return DeviceRange._make(n, 0, 1)

    @classmethod
    def from_range(cls, r: range, api: str = "devices") -> DeviceRange:
        """Any range of non-negative ranks (increasing or decreasing), kept symbolic."""
        n = _range_len(api, r)
        if n and min(r[0], r[-1]) < 0:
            raise MeshError(requires(api, "non-negative global ranks", "devices", r))
        if n and max(r[0], r[-1]) > MAX_RANK:
            raise MeshError(requires(api, f"global ranks up to {MAX_RANK}", "devices", r))
        return DeviceRange._make(n, r.start, r.step)

    @classmethod
    def from_values(cls, api: str, values: object) -> DeviceList:
        """Validate any iterable, numpy array or tensor of ints as a device list (a range when it is one)."""
        if isinstance(values, DeviceList):
            return values
        if isinstance(values, range):
            return cls.from_range(values, api)
        array = as_int_array(api, values).reshape(-1)
        n = array.size
        if n and array.min() < 0:
            bad = int(array[array < 0][0])
            raise MeshError(requires(api, "non-negative global ranks", "device", bad), mesh=None)
        if n <= 1:  # 0 or 1 devices: always a range
            return DeviceRange._make(n, int(array[0]) if n else 0, 1)
        steps = np.diff(array)
        if steps[0] != 0 and bool((steps == steps[0]).all()):
            return DeviceRange._make(n, int(array[0]), int(steps[0]))
        uniq, counts = np.unique(array, return_counts=True)
        if uniq.size != n:
            dup = int(uniq[counts > 1][0])
            raise MeshError(requires(api, "distinct devices", "duplicate device", dup))
        array = np.array(array, dtype=np.int64)  # own copy
        array.setflags(write=False)
        return DeviceArray._make(array)

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DeviceList):
            return NotImplemented
        # the kinds never hold the same ranks: from_values makes every progression a range
        return type(self) is type(other) and self._hash == other._hash and self._same(other)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"DeviceList({self.describe()})"

    # What each kind answers in its own way.

    @property
    def is_symbolic(self) -> bool:
        """True when the list is a range stored as three ints."""
        raise NotImplementedError

    @property
    def is_iota(self) -> bool:
        """True for ``0..n-1``."""
        raise NotImplementedError

    def __getitem__(self, i: int) -> int:
        raise NotImplementedError

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Global ranks at positions ``idx`` (any shape), as int64."""
        raise NotImplementedError

    def to_array(self) -> np.ndarray:
        """All ranks (materialised), read-only."""
        raise NotImplementedError

    def index_of(self, rank: int) -> int | None:
        """Position of global ``rank`` in the list, or ``None`` when it is not in the list."""
        raise NotImplementedError

    def max(self) -> int:
        """The largest rank (``-1`` for an empty list)."""
        raise NotImplementedError

    def digest(self) -> str:
        """A digest of the ranks that is the same in every process (unlike ``hash``)."""
        raise NotImplementedError

    def describe(self, limit: int = 6) -> str:
        """Short text: ``0..7``, ``8..15``, ``0..14 step 2`` or ``[7, 6, 5, …, 0] (8)``."""
        raise NotImplementedError

    def _same(self, other: Self) -> bool:
        """Whether ``other``, a list of the same kind and hash, holds the same ranks."""
        raise NotImplementedError

    def sublist(self, positions: np.ndarray) -> DeviceList:
        """The ranks at ``positions`` (distinct, in order) as a device list: a range when they form one."""
        return DeviceList.from_values("DeviceList.sublist", self.take(np.asarray(positions).reshape(-1)))

    def sublist_of_layout(self, offset: int, modes: L.Modes) -> DeviceList:
        """The ranks at positions ``offset + layout(i)`` for the (signed) ``modes``, ``i`` row-major.

        A range whose positions form a progression stays symbolic, in O(number of modes).
        """
        return self.sublist(offset + L.indices(L.canonical_layout(modes)))


@attrs.frozen(weakref_slot=False, eq=False, repr=False)  # DeviceList's equality, hash and text
class DeviceRange(DeviceList):
    """The ranks ``start, start + step, ...`` (``n`` of them), any non-zero step: three ints, never materialised.

    In normal form (docs/design.md, "Ranks and layouts"); every answer is O(1) or O(size of the answer).

    Args:
        n: the number of ranks, non-negative.
        start: the first rank.
        step: the difference of consecutive ranks; any int but 0 (when ``n > 1``).

    Raises:
        MeshError: a negative ``n``, a step of 0, or a rank below 0 or above ``2**63 - 1``.

    Examples:
        >>> r = DeviceRange(8, 14, -2)
        >>> r, r[1], r.index_of(4), r.max(), r == DeviceList.from_values("make_mesh", range(14, -1, -2))
        (DeviceList(14..0 step -2), 12, 5, 14, True)
    """

    _n: int
    _start: int
    _step: int
    _hash: int = attrs.field(init=False, eq=False, repr=False)

    def __init__(self, n: int, start: int, step: int) -> None:
        api = "DeviceRange"
        n, start, step = as_int(api, "n", n), as_int(api, "start", start), as_int(api, "step", step)
        if n < 0:
            raise MeshError(requires(api, "a non-negative number of devices", "n", n))
        if n > 1 and step == 0:
            raise MeshError(requires(api, "a non-zero step (distinct ranks)", "step", step))
        last = start + step * (n - 1)
        if n and min(start, last) < 0:
            raise MeshError(requires(api, "non-negative global ranks", "devices", f"{start}..{last} step {step}"))
        if n and max(start, last) > MAX_RANK:
            raise MeshError(requires(api, f"global ranks up to {MAX_RANK}", "devices", f"{start}..{last} step {step}"))
        self._set(n, start, step)

    @classmethod
    def _make(cls, n: int, start: int, step: int) -> DeviceRange:
        """A range whose parts are known to be valid ints (the constructors' fast path)."""
        self = object.__new__(cls)
        self._set(n, start, step)
        return self

    def _set(self, n: int, start: int, step: int) -> None:
        if n <= 1:  # normal form: a range is determined by its elements
            step = 1
            start = start if n else 0
        for name, value in (("_n", n), ("_start", start), ("_step", step), ("_hash", hash(("range", n, start, step)))):
            object.__setattr__(self, name, value)

    @property
    def is_symbolic(self) -> bool:
        return True

    @property
    def is_iota(self) -> bool:
        return self._start == 0 and self._step == 1

    def __getitem__(self, i: int) -> int:
        return self._start + self._step * i

    def take(self, idx: np.ndarray) -> np.ndarray:
        return self._start + self._step * np.asarray(idx, dtype=np.int64)

    def to_array(self) -> np.ndarray:
        out = self.take(np.arange(self._n, dtype=np.int64))
        out.setflags(write=False)
        return out

    def index_of(self, rank: int) -> int | None:
        q, r = divmod(rank - self._start, self._step)  # also right for a negative step
        return q if r == 0 and 0 <= q < self._n else None

    def max(self) -> int:
        if self._n == 0:
            return -1
        return max(self._start, self._start + self._step * (self._n - 1))

    def digest(self) -> str:
        return _sha(f"range:{self._n}:{self._start}:{self._step}".encode())

    def describe(self, limit: int = 6) -> str:
        if self._n == 0:
            return "[]"
        if self._n == 1:
            return f"[{self._start}]"
        last = self._start + self._step * (self._n - 1)
        return f"{self._start}..{last}" + (f" step {self._step}" if self._step != 1 else "")

    def _same(self, other: Self) -> bool:
        return self._n == other._n and self._start == other._start and self._step == other._step

    def sublist_of_layout(self, offset: int, modes: L.Modes) -> DeviceList:
        walk = L.canonical_modes(modes)
        if len(walk) > 1:  # no progression: the ranks themselves
            return super().sublist_of_layout(offset, modes)
        n, stride = walk[0] if walk else (1, 1)
        return DeviceRange._make(n, self._start + self._step * offset, self._step * stride)

    def __reduce__(self) -> tuple[Callable[[int, int, int], DeviceRange], tuple[int, int, int]]:
        return (_rebuild_range, (self._n, self._start, self._step))


class DeviceArray(DeviceList):
    """Ranks that form no progression, held once as a read-only int64 array.

    The one field set after construction is the lazy inverse index behind :meth:`index_of`
    (a cache, not a part of the value).

    Examples:
        >>> a = DeviceList.from_values("make_mesh", [7, 6, 5, 4, 3, 2, 1, 9])
        >>> a, a.index_of(9), a.max()
        (DeviceList([7, 6, 5, 4, 3, …, 9] (8)), 7, 9)
    """

    __slots__ = ("_n", "_hash", "_array", "_inverse")
    _array: np.ndarray
    _inverse: tuple[np.ndarray, np.ndarray] | None

    @classmethod
    def _make(cls, array: np.ndarray) -> DeviceArray:
        """``array``: a read-only int64 array of distinct ranks that is no progression (not checked)."""
        self = object.__new__(cls)
        for name, value in (("_n", array.size), ("_array", array), ("_hash", hash(("array", array.tobytes()))),
                            ("_inverse", None)):
            object.__setattr__(self, name, value)
        return self

    @property
    def is_symbolic(self) -> bool:
        return False

    @property
    def is_iota(self) -> bool:
        return False

    def __getitem__(self, i: int) -> int:
        return int(self._array[i])

    def take(self, idx: np.ndarray) -> np.ndarray:
        return self._array[idx]

    def to_array(self) -> np.ndarray:
        return self._array

    def index_of(self, rank: int) -> int | None:
        inverse = self._inverse
        if inverse is None:
            order = np.argsort(self._array, kind="stable")
            sorted_ranks = self._array[order]
            for a in (order, sorted_ranks):
                a.setflags(write=False)
            inverse = (sorted_ranks, order)
            object.__setattr__(self, "_inverse", inverse)
        ranks, order = inverse
        pos = int(np.searchsorted(ranks, rank))
        return int(order[pos]) if pos < self._n and ranks[pos] == rank else None

    def max(self) -> int:
        return int(self._array.max())

    def digest(self) -> str:
        return _sha(b"array:" + self._array.tobytes())

    def describe(self, limit: int = 6) -> str:
        vals = self._array.tolist()
        if len(vals) <= limit:
            return str(vals)
        head = ", ".join(map(str, vals[: limit - 1]))
        return f"[{head}, …, {vals[-1]}] ({len(vals)})"

    def _same(self, other: Self) -> bool:
        return bool(np.array_equal(self._array, other._array))

    def __reduce__(self) -> tuple[Callable[[bytes], DeviceArray], tuple[bytes]]:
        return (_rebuild_array, (self._array.tobytes(),))


def _sha(text: bytes) -> str:
    return hashlib.sha1(text, usedforsecurity=False).hexdigest()[:16]


def _rebuild_range(n: int, start: int, step: int) -> DeviceRange:
    return DeviceRange._make(n, start, step)


def _rebuild_array(data: bytes) -> DeviceArray:
    array = np.frombuffer(data, dtype=np.int64).copy()
    array.setflags(write=False)
    return DeviceArray._make(array)


def _range_len(api: str, r: range) -> int:
    """``len(r)``, or a ``MeshError`` naming ``r`` when it has more elements than an index can count."""
    n = max(0, -(-(r.stop - r.start) // r.step))
    if n > sys.maxsize:  # len(r) would raise OverflowError
        raise MeshError(requires(api, f"at most {sys.maxsize} devices", "devices", r))
    return n
