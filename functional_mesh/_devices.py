"""The device list a mesh lives on: global ranks, kept symbolic when they form a range.

One ``DeviceList`` is shared by a mesh and every mesh derived from it, so derived meshes
cost O(ndim) whatever the world size, and comparing two of them is an identity check.
"""

from __future__ import annotations

import sys

import numpy as np

from ._errors import MeshError, requires
from ._validate import MAX_RANK, Frozen, as_int_array

__all__ = ["DeviceList"]



class DeviceList(Frozen):
    """An immutable list of distinct non-negative global ranks.

    A list that is an arithmetic progression (``range(start, stop, step)``, any step) is stored
    as three ints and never materialised; any other list is stored once as a read-only int64
    array. An explicit list equal to a range *is* that range (equal value, equal hash).

    A plain ``__slots__`` value on :class:`~functional_mesh._validate.Frozen`: every mesh derived
    from a list shares it, so an assignment would change them all; it raises instead. The one
    field set after construction is the lazy inverse index of an array list (a cache, not a part
    of the value).
    """

    __slots__ = ("_n", "_start", "_step", "_array", "_hash", "_inverse")

    def __init__(self) -> None:  # use the classmethods
        raise TypeError("use DeviceList.iota, DeviceList.from_range or DeviceList.from_values")

    @classmethod
    def _make(cls, n: int, start: int, step: int, array: np.ndarray | None) -> DeviceList:
        self = object.__new__(cls)
        if n <= 1:  # normal form: a range is determined by its elements
            step = 1
            start = start if n else 0
        key = ("range", n, start, step) if array is None else ("array", array.tobytes())
        for name, value in (("_n", n), ("_start", start), ("_step", step), ("_array", array),
                            ("_hash", hash(key)), ("_inverse", None)):
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def iota(cls, n: int, api: str = "devices") -> DeviceList:
        """The symbolic ranks ``0..n-1``."""
        if n < 0:
            raise MeshError(requires(api, "a non-negative number of devices", "n", n))
        if n > sys.maxsize:
            raise MeshError(requires(api, f"at most {sys.maxsize} devices", "n", n))
        return cls._make(n, 0, 1, None)

    @classmethod
    def from_range(cls, r: range, api: str = "devices") -> DeviceList:
        """Any range of non-negative ranks (increasing or decreasing), kept symbolic."""
        n = _range_len(api, r)
        if n and min(r[0], r[-1]) < 0:
            raise MeshError(requires(api, "non-negative global ranks", "devices", r))
        if n and max(r[0], r[-1]) > MAX_RANK:
            raise MeshError(requires(api, f"global ranks up to {MAX_RANK}", "devices", r))
        return cls._make(n, r.start, r.step, None)

    @classmethod
    def from_values(cls, api: str, values: object) -> DeviceList:
        """Validate any iterable, numpy array or tensor of ints as a device list."""
        if isinstance(values, DeviceList):
            return values
        if isinstance(values, range):
            return cls.from_range(values, api)
        array = as_int_array(api, values).reshape(-1)
        n = array.size
        if n and array.min() < 0:
            bad = int(array[array < 0][0])
            raise MeshError(requires(api, "non-negative global ranks", "device", bad), mesh=None)
        if n > 1:
            steps = np.diff(array)
            if steps[0] != 0 and bool((steps == steps[0]).all()):
                return cls._make(n, int(array[0]), int(steps[0]), None)
            uniq, counts = np.unique(array, return_counts=True)
            if uniq.size != n:
                dup = int(uniq[counts > 1][0])
                raise MeshError(requires(api, "distinct devices", "duplicate device", dup))
        else:  # 0 or 1 devices: always a range
            return cls._make(n, int(array[0]) if n else 0, 1, None)
        array = np.array(array, dtype=np.int64)  # own copy
        array.setflags(write=False)
        return cls._make(n, 0, 1, array)

    # -- queries ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def is_symbolic(self) -> bool:
        """True when the list is a range stored as three ints."""
        return self._array is None

    @property
    def is_iota(self) -> bool:
        """True for ``0..n-1``."""
        return self._array is None and self._start == 0 and self._step == 1

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Global ranks at positions ``idx`` (any shape), as int64."""
        if self._array is None:
            return self._start + self._step * np.asarray(idx, dtype=np.int64)
        return self._array[idx]

    def max(self) -> int:
        """The largest rank, in O(1) for a range (``-1`` for an empty list)."""
        if self._n == 0:
            return -1
        if self._array is None:
            return max(self._start, self._start + self._step * (self._n - 1))
        return int(self._array.max())

    def digest(self) -> str:
        """A digest of the ranks that is the same in every process (unlike ``hash``)."""
        import hashlib

        if self._array is None:
            text = f"range:{self._n}:{self._start}:{self._step}".encode()
        else:
            text = b"array:" + self._array.tobytes()
        return hashlib.sha1(text, usedforsecurity=False).hexdigest()[:16]

    def __getitem__(self, i: int) -> int:
        if self._array is None:
            return self._start + self._step * i
        return int(self._array[i])

    def to_array(self) -> np.ndarray:
        """All ranks (materialised), read-only."""
        if self._array is not None:
            return self._array
        out = self.take(np.arange(self._n, dtype=np.int64))
        out.setflags(write=False)
        return out

    def index_of(self, rank: int) -> int | None:
        """Position of global ``rank`` in the list, or ``None`` when it is not in the list."""
        if self._array is None:
            q, r = divmod(rank - self._start, self._step)  # also right for a negative step
            return q if r == 0 and 0 <= q < self._n else None
        if self._inverse is None:
            order = np.argsort(self._array, kind="stable")
            sorted_ranks = self._array[order]
            for a in (order, sorted_ranks):
                a.setflags(write=False)
            object.__setattr__(self, "_inverse", (sorted_ranks, order))
        ranks, order = self._inverse
        pos = int(np.searchsorted(ranks, rank))
        return int(order[pos]) if pos < self._n and ranks[pos] == rank else None

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DeviceList):
            return NotImplemented
        if self._hash != other._hash or self._n != other._n:
            return False
        if self._array is None or other._array is None:
            return (self._array is None and other._array is None
                    and (self._start, self._step) == (other._start, other._step))
        return bool(np.array_equal(self._array, other._array))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        if self._array is None:
            return (_rebuild_range, (self._n, self._start, self._step))
        return (_rebuild_array, (self._array.tobytes(),))

    def __repr__(self) -> str:
        return f"DeviceList({self.describe()})"

    def describe(self, limit: int = 6) -> str:
        """Short text: ``0..7``, ``8..15``, ``0..14 step 2`` or ``[7, 6, 5, …, 0] (8)``."""
        if self._array is None:
            if self._n == 0:
                return "[]"
            last = self._start + self._step * (self._n - 1)
            if self._n == 1:
                return f"[{self._start}]"
            return f"{self._start}..{last}" + (f" step {self._step}" if self._step != 1 else "")
        vals = self._array.tolist()
        if len(vals) <= limit:
            return str(vals)
        head = ", ".join(map(str, vals[: limit - 1]))
        return f"[{head}, …, {vals[-1]}] ({len(vals)})"


def _rebuild_range(n: int, start: int, step: int) -> DeviceList:
    return DeviceList._make(n, start, step, None)


def _rebuild_array(data: bytes) -> DeviceList:
    array = np.frombuffer(data, dtype=np.int64).copy()
    array.setflags(write=False)
    return DeviceList._make(array.size, 0, 1, array)


def _range_len(api: str, r: range) -> int:
    """``len(r)``, or a ``MeshError`` naming ``r`` when it has more elements than an index can count."""
    n = max(0, -(-(r.stop - r.start) // r.step))
    if n > sys.maxsize:  # len(r) would raise OverflowError
        raise MeshError(requires(api, f"at most {sys.maxsize} devices", "devices", r))
    return n
