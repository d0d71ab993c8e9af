"""Tables of examples for the device list (functional_mesh/_devices.py).

A device list is a list of distinct non-negative global ranks; a range is kept symbolic, and an
explicit list equal to a range *is* that range (equal value, equal hash). Expected values are
written out by hand.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from functional_mesh import MeshError
from functional_mesh._devices import DeviceList

API = "make_mesh"


def values(v):
    return DeviceList.from_values(API, v)


def test_constructor_is_not_public():
    with pytest.raises(TypeError, match=r"use DeviceList.iota, DeviceList.from_range or DeviceList.from_values"):
        DeviceList()


# -- symbolic lists ------------------------------------------------------------------------------

SYMBOLIC = [
    # (device list, expected elements, is_iota, describe)
    (DeviceList.iota(8), list(range(8)), True, "0..7"),
    (DeviceList.iota(1), [0], True, "[0]"),
    (DeviceList.iota(0), [], True, "[]"),
    (DeviceList.from_range(range(8, 16)), list(range(8, 16)), False, "8..15"),
    (DeviceList.from_range(range(0, 16, 2)), list(range(0, 16, 2)), False, "0..14 step 2"),
    (DeviceList.from_range(range(5, 6)), [5], False, "[5]"),
    (values([8, 9, 10, 11]), [8, 9, 10, 11], False, "8..11"),
    (values([1, 4, 7]), [1, 4, 7], False, "1..7 step 3"),
    (values([0, 1, 2, 3]), [0, 1, 2, 3], True, "0..3"),
    (values(np.arange(4)), [0, 1, 2, 3], True, "0..3"),
    (values([5]), [5], False, "[5]"),
    (values([]), [], True, "[]"),
    # a decreasing progression is a range too (stored symbolically, like range(7, -1, -1))
    (values([7, 6, 5, 4, 3, 2, 1, 0]), [7, 6, 5, 4, 3, 2, 1, 0], False, "7..0 step -1"),
    (DeviceList.from_range(range(7, -1, -1)), [7, 6, 5, 4, 3, 2, 1, 0], False, "7..0 step -1"),
]


@pytest.mark.parametrize(("dl", "elements", "is_iota", "text"), SYMBOLIC, ids=[s[3] for s in SYMBOLIC])
def test_symbolic_lists(dl, elements, is_iota, text):
    assert dl.is_symbolic
    assert dl.is_iota is is_iota
    assert len(dl) == len(elements)
    assert dl.to_array().tolist() == elements
    assert dl.to_array().dtype == np.int64
    assert [dl[i] for i in range(len(dl))] == elements
    assert dl.describe() == text
    assert repr(dl) == f"DeviceList({text})"


EXPLICIT = [
    ([3, 1, 2, 0], "[3, 1, 2, 0]"),
    ([7, 6, 5, 4, 3, 2, 1, 9], "[7, 6, 5, 4, 3, …, 9] (8)"),
    ([10, 3, 7, 1], "[10, 3, 7, 1]"),
    ([0, 1, 3], "[0, 1, 3]"),
    ([2, 2 + 1, 9, 4], "[2, 3, 9, 4]"),
]


@pytest.mark.parametrize(("elements", "text"), EXPLICIT)
def test_explicit_lists(elements, text):
    dl = values(elements)
    assert not dl.is_symbolic
    assert not dl.is_iota
    assert len(dl) == len(elements)
    assert dl.to_array().tolist() == elements
    assert [dl[i] for i in range(len(dl))] == elements
    assert all(type(dl[i]) is int for i in range(len(dl)))
    assert dl.describe() == text


def test_describe_limit():
    assert values([9, 8, 7, 5]).describe(limit=3) == "[9, 8, …, 5] (4)"


# -- index_of and take ---------------------------------------------------------------------------

INDEX_OF = [
    (DeviceList.iota(8), 5, 5),
    (DeviceList.iota(8), 8, None),
    (DeviceList.iota(8), 10**20, None),
    (DeviceList.from_range(range(8, 16)), 9, 1),
    (DeviceList.from_range(range(8, 16)), 7, None),
    (DeviceList.from_range(range(8, 16)), 16, None),
    (DeviceList.from_range(range(0, 16, 2)), 4, 2),
    (DeviceList.from_range(range(0, 16, 2)), 3, None),
    (DeviceList.from_range(range(0, 16, 2)), 16, None),
    (values([3, 1, 2, 0]), 2, 2),
    (values([3, 1, 2, 0]), 0, 3),
    (values([3, 1, 2, 0]), 3, 0),
    (values([3, 1, 2, 0]), 4, None),
    (values([10, 3, 7, 1]), 7, 2),
    (values([10, 3, 7, 1]), 5, None),
    (values([10, 3, 7, 1]), 11, None),
    (values([10, 3, 7, 1]), 2**63, None),
    (values([10, 3, 7, 1]), 2**70, None),
    (DeviceList.iota(0), 0, None),
]


@pytest.mark.parametrize(("dl", "rank", "expected"), INDEX_OF)
def test_index_of(dl, rank, expected):
    assert dl.index_of(rank) == expected


def test_index_of_inverts_getitem():
    dl = values([5, 11, 0, 3, 8, 1, 9, 2, 10, 7, 4, 6])
    assert [dl.index_of(dl[i]) for i in range(len(dl))] == list(range(12))


@pytest.mark.parametrize(
    ("dl", "idx", "expected"),
    [
        (DeviceList.iota(8), [[1, 2], [3, 4]], [[1, 2], [3, 4]]),
        (DeviceList.from_range(range(8, 24, 2)), [[0, 1], [7, 3]], [[8, 10], [22, 14]]),
        (values([3, 1, 2, 0]), [[0, 3], [1, 2]], [[3, 0], [1, 2]]),
    ],
)
def test_take(dl, idx, expected):
    out = dl.take(np.array(idx))
    assert out.dtype == np.int64
    assert out.tolist() == expected


def test_arrays_are_read_only_and_copied():
    src = np.array([3, 1, 2, 0])
    dl = values(src)
    src[0] = 9
    assert dl.to_array().tolist() == [3, 1, 2, 0]
    for arr in (dl.to_array(), DeviceList.iota(4).to_array()):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 7


def test_huge_symbolic_list_is_not_materialised():
    dl = DeviceList.iota(1 << 40)
    assert len(dl) == 1 << 40
    assert dl[(1 << 40) - 1] == (1 << 40) - 1
    assert dl.index_of(12345) == 12345
    assert dl.take(np.array([0, 7])).tolist() == [0, 7]
    assert len(pickle.dumps(dl)) < 200


# -- equality and hashing -------------------------------------------------------------------------

EQUAL = [
    (values([0, 1, 2, 3]), DeviceList.iota(4)),
    (values(range(4)), DeviceList.iota(4)),
    (values((8, 9, 10, 11)), DeviceList.from_range(range(8, 12))),
    (values([0, 2, 4, 6]), DeviceList.from_range(range(0, 8, 2))),
    (values([5]), DeviceList.from_range(range(5, 6))),
    (values([5]), DeviceList.from_range(range(5, 6, 3))),  # a one-element range is its element
    (values([]), DeviceList.iota(0)),
    (values(range(7, 7)), DeviceList.iota(0)),
    (values([3, 1, 2, 0]), values(np.array([3, 1, 2, 0], dtype=np.int32))),
    (values([3, 1, 2, 0]), values((3, 1, 2, 0))),
    (values([[0, 1], [2, 3]]), DeviceList.iota(4)),  # nesting is flattened, row-major
    (values([7, 5, 3, 1]), values(np.array([7, 5, 3, 1]))),
]


@pytest.mark.parametrize(("a", "b"), EQUAL)
def test_equal_lists_have_equal_hashes(a, b):
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_decreasing_range_equals_its_list():
    # docs/api.md, `fm.make_mesh`: devices may be any iterable of distinct non-negative ints; range(3, -1, -1) is one
    a, b = values([3, 2, 1, 0]), values(range(3, -1, -1))
    assert a == b
    assert hash(a) == hash(b)
    assert b.to_array().tolist() == [3, 2, 1, 0]


UNEQUAL = [
    (DeviceList.iota(4), DeviceList.iota(5)),
    (DeviceList.iota(4), DeviceList.from_range(range(1, 5))),
    (DeviceList.iota(4), DeviceList.from_range(range(0, 8, 2))),
    (DeviceList.iota(4), values([3, 2, 1, 0])),
    (values([3, 1, 2, 0]), values([3, 1, 0, 2])),
    (values([3, 1, 2, 0]), values([3, 1, 2, 4])),
]


@pytest.mark.parametrize(("a", "b"), UNEQUAL)
def test_unequal_lists(a, b):
    assert a != b


def test_not_equal_to_other_types():
    assert DeviceList.iota(4) != [0, 1, 2, 3]
    assert DeviceList.iota(4) != range(4)


def test_from_values_of_a_device_list_is_itself():
    dl = values([3, 1, 2, 0])
    assert DeviceList.from_values(API, dl) is dl


@pytest.mark.parametrize(
    "dl",
    [DeviceList.iota(8), DeviceList.from_range(range(8, 24, 2)), values([3, 1, 2, 0]), values([5]), values([])],
    ids=repr,
)
def test_pickle_round_trip(dl):
    back = pickle.loads(pickle.dumps(dl))
    assert back == dl
    assert hash(back) == hash(dl)
    assert back.is_symbolic == dl.is_symbolic
    assert back.to_array().tolist() == dl.to_array().tolist()
    assert not back.to_array().flags.writeable


# -- accepted containers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "container",
    [
        lambda: [3, 1, 2, 0],
        lambda: (3, 1, 2, 0),
        lambda: iter([3, 1, 2, 0]),
        lambda: np.array([3, 1, 2, 0], dtype=np.uint16),
        lambda: np.array([[3, 1], [2, 0]]),
        lambda: [np.int8(3), np.int64(1), 2, 0],
        lambda: __import__("torch").tensor([3, 1, 2, 0]),
        lambda: __import__("torch").tensor([3, 1, 2, 0], dtype=__import__("torch").int32),
    ],
    ids=["list", "tuple", "iter", "uint16", "2d", "npscalars", "torch", "torch32"],
)
def test_accepted_containers(container):
    assert values(container()).to_array().tolist() == [3, 1, 2, 0]


# -- errors ---------------------------------------------------------------------------------------

ERRORS = [
    ([0, 1, 1, 2], MeshError, r"^`make_mesh` requires distinct devices, but got duplicate device=1$"),
    ([4, 4], MeshError, r"^`make_mesh` requires distinct devices, but got duplicate device=4$"),
    ([0, 3, 1, 3, 1], MeshError, r"duplicate device=1"),  # the smallest duplicate
    ([0, -1, 2], MeshError, r"^`make_mesh` requires non-negative global ranks, but got device=-1$"),
    ([-3], MeshError, r"non-negative global ranks, but got device=-3"),
    (np.array([2, -5, -6]), MeshError, r"non-negative global ranks, but got device=-5"),
    (range(-2, 2), MeshError, r"^`make_mesh` requires .*non-negative.*but got devices=range\(-2, 2\)"),
    ([[0, 1], [2]], MeshError, r"^`make_mesh` requires a rectangular \(non-ragged\) nesting of ranks"),
    ([0.0, 1.0], TypeError, r"^`make_mesh` requires int devices, but got device=0.0$"),
    ([0, 1.5], TypeError, r"but got device=1.5$"),
    ([True, 1], TypeError, r"^`make_mesh` requires int devices, but got device=True$"),
    ([np.bool_(True)], TypeError, r"requires int devices, but got device="),
    ([0, None], TypeError, r"requires int devices, but got device=None$"),
    ([[0, "1"]], TypeError, r"requires int devices, but got device='1'$"),
    ("0123", TypeError, r"^`make_mesh` requires an iterable of int ranks for devices, but got devices='0123'$"),
    (b"\x00\x01", TypeError, r"requires an iterable of int ranks for devices"),
    (4, TypeError, r"^`make_mesh` requires an iterable of int ranks for devices, but got devices=4$"),
    (None, TypeError, r"requires an iterable of int ranks for devices, but got devices=None$"),
    (np.array([0.0, 1.0]), TypeError, r"^`make_mesh` requires integer devices, but got devices dtype='float64'$"),
    (np.array([True, False]), TypeError, r"requires integer devices, but got devices dtype='bool'$"),
]


@pytest.mark.parametrize(("devices", "exc", "pattern"), ERRORS)
def test_errors(devices, exc, pattern):
    with pytest.raises(exc, match=pattern):
        values(devices)


def test_torch_float_tensor_is_type_error():
    import torch

    with pytest.raises(TypeError, match=r"`make_mesh` requires integer devices, but got devices dtype='float32'"):
        values(torch.tensor([0.0, 1.0]))
