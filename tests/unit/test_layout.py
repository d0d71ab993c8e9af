"""Tables of examples for the pure layout algebra (functional_mesh/layout.py).

Every expected value is derived independently of the code under test: by hand from the
definition (a layout maps the row-major coordinate ``i`` of ``shape`` to ``sum(digit * stride)``)
or by the tiny brute-force references below, written with itertools.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from functional_mesh import MeshError
from functional_mesh._layout import (
    Layout,
    coalesce,
    complement,
    composition,
    concat,
    cosize,
    decompose,
    groups,
    indices,
    is_injective,
    row_major,
    row_major_strides,
    size,
)
from tests.reference import ref_indices

# -- independent references ---------------------------------------------------------------------


def ref_offsets(block: list[int], n: int) -> list[int] | None:
    """Offsets ``t`` (increasing) whose translates ``block + t`` tile ``[0, n)``, or ``None``.

    Greedy: the smallest uncovered index must be covered by the translate that starts there
    (``block`` contains 0), so a tiling, when it exists, is found this way.
    """
    if len(set(block)) != len(block) or 0 not in block:
        return None
    covered = [False] * n
    offsets = []
    for t in range(n):
        if covered[t]:
            continue
        for b in block:
            if t + b >= n or covered[t + b]:
                return None
            covered[t + b] = True
        offsets.append(t)
    return offsets


def L(shape=(), stride=None) -> Layout:
    return Layout(shape, stride)


# -- canonical form -----------------------------------------------------------------------------

CANONICAL = [
    # (shape, stride) given                 -> (shape, stride) canonical
    (((2, 2, 3), (6, 3, 1)), ((12,), (1,))),
    (((2, 4), (4, 1)), ((8,), (1,))),
    (((1, 4), (7, 1)), ((4,), (1,))),
    (((4, 1), (1, 5)), ((4,), (1,))),
    (((2, 3), (6, 1)), ((2, 3), (6, 1))),  # flattened non-adjacent pair: stays two modes
    (((3, 2), (1, 3)), ((3, 2), (1, 3))),  # column-major: not mergeable row-major
    (((), ()), ((), ())),
    (((1, 1), (3, 5)), ((), ())),
    (((2, 3, 4), (24, 4, 1)), ((2, 12), (24, 1))),
    (((2, 2, 2), (8, 4, 1)), ((4, 2), (4, 1))),
    (((3, 2), (0, 0)), ((6,), (0,))),
    (((2, 3), (0, 1)), ((2, 3), (0, 1))),
    (((2, 2), (1, 2)), ((2, 2), (1, 2))),
    (((6,), (2,)), ((6,), (2,))),
    (((2, 1, 2), (2, 7, 1)), ((4,), (1,))),  # a size-1 mode between mergeable modes
    (((2, 2), (4, 2)), ((4,), (2,))),
]


@pytest.mark.parametrize(("given", "canonical"), CANONICAL, ids=[str(g) for g, _ in CANONICAL])
def test_canonical_form(given, canonical):
    lay = Layout(*given)
    assert (lay.shape, lay.stride) == canonical
    assert lay.modes == tuple(zip(*canonical)) if canonical[0] else lay.modes == ()
    # canonicalisation preserves the function
    assert indices(lay).tolist() == ref_indices(*given)
    # and is idempotent
    assert Layout(lay.shape, lay.stride) == lay


def test_int_and_default_stride_arguments():
    assert (Layout(8).shape, Layout(8).stride) == ((8,), (1,))
    assert (Layout(3, 2).shape, Layout(3, 2).stride) == ((3,), (2,))
    assert Layout((2, 3)) == Layout(6)  # default stride is compact row-major
    assert Layout() == Layout(()) == Layout(1) == Layout((1, 1), (5, 9))
    assert Layout(np.int64(4), np.int32(2)) == Layout(4, 2)


def test_equal_functions_have_equal_values_and_hashes_exhaustively():
    """Every layout of up to 3 modes, sizes 1..3, strides 0..5: equal function <=> equal value."""
    by_function: dict[tuple[int, ...], set[Layout]] = defaultdict(set)
    for k in range(4):
        for shape in itertools.product(range(1, 4), repeat=k):
            for stride in itertools.product(range(6), repeat=k):
                by_function[tuple(ref_indices(shape, stride))].add(Layout(shape, stride))
    clashes = {f: v for f, v in by_function.items() if len(v) > 1}
    assert not clashes, f"equal functions with different canonical forms: {list(clashes.items())[:3]}"
    # distinct functions give distinct values (the sets above are disjoint)
    values = [next(iter(v)) for v in by_function.values()]
    assert len(set(values)) == len(values)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (L((2, 4), (4, 1)), L(8)),
        (L((2, 2, 3), (6, 3, 1)), L((3, 4), (4, 1))),
        (L((1, 2), (0, 3)), L(2, 3)),
        (L((2, 2), (0, 0)), L(4, 0)),
    ],
)
def test_equal_functions_equal_hash(a, b):
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (L((2, 3), (6, 1)), L((2, 3), (3, 1))),
        (L((3, 2), (1, 3)), L((2, 3), (1, 2))),
        (L(4, 1), L(4, 2)),
        (L(4, 0), L(2, 0)),
    ],
)
def test_different_functions_unequal(a, b):
    assert a != b


def test_layout_is_frozen():
    lay = Layout(4)
    with pytest.raises(AttributeError):
        lay.shape = (5,)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lay.stride = (2,)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("lay", "text"),
    [
        (L(12), "Layout(12:1)"),
        (L((2, 3), (6, 1)), "Layout((2,3):(6,1))"),
        (L(()), "Layout(1:0)"),
        (L(2, 0), "Layout(2:0)"),
    ],
)
def test_repr(lay, text):
    assert repr(lay) == text


# -- size / cosize --------------------------------------------------------------------------------

SIZES = [
    # layout, size, cosize (= 1 + sum((s - 1) * d))
    (L((2, 3), (6, 1)), 6, 9),
    (L(12), 12, 12),
    (L(()), 1, 1),
    (L(2, 0), 2, 1),
    (L((3, 2), (1, 3)), 6, 6),
    (L((2, 2), (2, 3)), 4, 6),
    (L(4, 5), 4, 16),
]


@pytest.mark.parametrize(("lay", "n", "co"), SIZES, ids=[str(s[0]) for s in SIZES])
def test_size_cosize(lay, n, co):
    assert lay.size == size(lay) == n
    assert lay.cosize == cosize(lay) == co
    assert co == max(ref_indices(lay.shape, lay.stride)) + 1


# -- __call__ and indices ------------------------------------------------------------------------

CALLS = [
    (L((2, 3), (6, 1)), 4, 7),  # digits (1, 1)
    (L((2, 3), (6, 1)), 5, 8),
    (L((2, 2), (1, 2)), 1, 2),  # digits (0, 1)
    (L((3, 2), (1, 3)), 3, 4),  # digits (1, 1)
    (L(4, 5), 3, 15),
    (L(()), 0, 0),
    (L(2, 0), 1, 0),
]


@pytest.mark.parametrize(("lay", "i", "expected"), CALLS)
def test_call(lay, i, expected):
    assert lay(i) == expected


@pytest.mark.parametrize(
    "lay", [L((2, 3), (6, 1)), L((3, 2), (1, 3)), L((2, 2, 2), (1, 4, 2)), L((2, 3), (0, 1)), L(()), L(7, 3)]
)
def test_call_matches_row_major_enumeration(lay):
    expected = ref_indices(lay.shape, lay.stride)
    assert [lay(i) for i in range(lay.size)] == expected
    assert lay(np.int64(lay.size - 1)) == expected[-1]


INDICES = [
    (L((2, 3), (6, 1)), [0, 1, 2, 6, 7, 8]),
    (L((3, 2), (1, 3)), [0, 3, 1, 4, 2, 5]),
    (L((2, 2), (1, 4)), [0, 4, 1, 5]),
    (L(()), [0]),
    (L(2, 0), [0, 0]),
    (L(5, 2), [0, 2, 4, 6, 8]),
]


@pytest.mark.parametrize(("lay", "expected"), INDICES, ids=[str(x[0]) for x in INDICES])
def test_indices(lay, expected):
    out = indices(lay)
    assert out.dtype == np.int64
    assert out.tolist() == expected


@pytest.mark.parametrize("coordinate", [-1, 6, 100])
def test_call_out_of_range_is_mesh_error(coordinate):
    with pytest.raises(MeshError, match=rf"`Layout.__call__` requires a coordinate in \[0, 6\), but got coordinate={coordinate}"):
        L((2, 3), (6, 1))(coordinate)


@pytest.mark.parametrize("coordinate", [1.0, True, "1", None])
def test_call_wrong_type_is_type_error(coordinate):
    with pytest.raises(TypeError, match=r"`Layout.__call__` requires an int for coordinate, but got coordinate="):
        L((2, 3), (6, 1))(coordinate)


# -- constructor errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "exc", "pattern"),
    [
        (((2, 0),), MeshError, r"`Layout` requires positive mode sizes, but got shape=\(2, 0\)"),
        ((-1,), MeshError, r"`Layout` requires positive mode sizes, but got shape=\(-1,\)"),
        (((2,), (1, 2)), MeshError, r"`Layout` requires one stride per mode, but got shape=\(2,\), stride=\(1, 2\)"),
        ((2, -1), MeshError, r"`Layout` requires non-negative strides, but got stride=\(-1,\)"),
        ((2.0,), TypeError, r"`Layout` requires an int for shape, but got shape=2.0"),
        ((True,), TypeError, r"`Layout` requires an int for shape, but got shape=True"),
        (("ab",), TypeError, r"`Layout` requires an int for shape, but got shape='ab'"),
        (((2,), (1.5,)), TypeError, r"`Layout` requires an int for stride, but got stride=1.5"),
    ],
)
def test_constructor_errors(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Layout(*args)


# -- row_major, coalesce, concat -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((2, 3, 4), (12, 4, 1)), ((), ()), ((5,), (1,)), ((2, 1, 3), (3, 3, 1)), ((4, 2), (2, 1))],
)
def test_row_major_strides(shape, strides):
    assert row_major_strides(shape) == strides


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (), (1,), (7,)])
def test_row_major_is_identity(shape):
    lay = row_major(shape)
    n = int(np.prod(shape, dtype=np.int64))
    assert indices(lay).tolist() == list(range(n))
    assert lay == Layout(n)


def test_coalesce_is_canonical_layout():
    assert coalesce((2, 2, 3), (6, 3, 1)) == Layout(12)
    assert coalesce((2, 3), (6, 1)).modes == ((2, 6), (3, 1))
    assert coalesce((), ()) == Layout()


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((L(2, 6), L(3, 1)), L((2, 3), (6, 1))),
        ((L(2, 4), L(4, 1)), L(8)),
        ((L(3, 1), L(2, 6)), L((3, 2), (1, 6))),
        ((), L()),
        ((L(), L(5, 2)), L(5, 2)),
    ],
)
def test_concat(parts, expected):
    out = concat(*parts)
    assert out == expected
    # law: coordinate (i_1, ..., i_k) row-major maps to the sum of the parts' indices
    sums = [sum(c) for c in itertools.product(*(ref_indices(p.shape, p.stride) for p in parts))]
    assert indices(out).tolist() == sums


# -- complement ----------------------------------------------------------------------------------

COMPLEMENTS = [
    # layout, n, complement (shape, stride)
    (L(4), 8, ((2,), (4,))),
    (L(2, 4), 8, ((4,), (1,))),
    (L((2, 2), (4, 1)), 8, ((2,), (2,))),
    (L(()), 6, ((6,), (1,))),
    (L(8), 8, ((), ())),
    (L(2, 1), 2, ((), ())),
    (L(2, 3), 12, ((2, 3), (6, 1))),
    (L((2, 3), (6, 1)), 12, ((2,), (3,))),
    (L((3, 2), (1, 3)), 12, ((2,), (6,))),
    (L((2, 2), (1, 4)), 16, ((2, 2), (8, 2))),
    (L((2, 2), (2, 8)), 32, ((2, 2, 2), (16, 4, 1))),
]


@pytest.mark.parametrize(("lay", "n", "expected"), COMPLEMENTS, ids=[f"{c[0]}@{c[1]}" for c in COMPLEMENTS])
def test_complement_examples(lay, n, expected):
    comp = complement(lay, n)
    assert (comp.shape, comp.stride) == expected
    # the offsets are exactly the translates that tile [0, n), in increasing order
    assert indices(comp).tolist() == ref_offsets(ref_indices(lay.shape, lay.stride), n)


def _axis_like_layouts():
    """Every ordered subset of the modes of a few row-major grids: the layouts a mesh axis can have."""
    for shape in [(2, 3, 2), (4, 2), (3, 4), (2, 2, 2, 2), (6,)]:
        n = int(np.prod(shape))
        modes = list(zip(shape, row_major_strides(shape)))
        for k in range(len(modes) + 1):
            for picked in itertools.permutations(modes, k):
                yield Layout(tuple(s for s, _ in picked), tuple(d for _, d in picked)), n


def test_complement_and_groups_match_brute_force_tiling():
    count = 0
    for lay, n in _axis_like_layouts():
        block = ref_indices(lay.shape, lay.stride)
        offsets = ref_offsets(block, n)
        assert offsets is not None
        assert indices(complement(lay, n)).tolist() == offsets, (lay, n)
        assert groups(lay, n).tolist() == [[t + b for b in block] for t in offsets], (lay, n)
        count += 1
    assert count > 50


COMPLEMENT_ERRORS = [
    (L(2, 0), 4, "do not overlap and are aligned"),
    (L((2, 2), (1, 1)), 4, "do not overlap and are aligned"),
    (L((2, 2), (3, 1)), 8, "do not overlap and are aligned"),  # {0,1,3,4}: misaligned
    (L(4), 6, r"multiple of the layout's span 4, but got n=6"),
    (L(4), 0, r"multiple of the layout's span 4, but got n=0"),
    (L(4), -4, r"multiple of the layout's span 4, but got n=-4"),
    (L(2, 3), 8, r"multiple of the layout's span 6, but got n=8"),
]


@pytest.mark.parametrize(("lay", "n", "pattern"), COMPLEMENT_ERRORS, ids=[f"{c[0]}@{c[1]}" for c in COMPLEMENT_ERRORS])
def test_complement_errors(lay, n, pattern):
    if n > 0:  # independently: no tiling of [0, n) by translates of the layout exists
        assert ref_offsets(ref_indices(lay.shape, lay.stride), n) is None
    with pytest.raises(MeshError, match=r"^`complement` requires .*" + pattern):
        complement(lay, n)


def test_complement_error_names_the_layout():
    with pytest.raises(MeshError, match=r"but got layout=\(2,2\):\(1,1\)"):
        complement(L((2, 2), (1, 1)), 4)


@pytest.mark.parametrize("n", [4.0, "4", None, True])
def test_complement_wrong_type(n):
    with pytest.raises(TypeError, match=r"`complement` requires an int for n, but got n="):
        complement(L(2), n)


# -- composition ---------------------------------------------------------------------------------

COMPOSITIONS = [
    # outer, inner, expected (shape, stride)
    (L((2, 3), (6, 1)), L(2, 3), ((2,), (6,))),  # unflatten part of sizes (2, 3): outer mode
    (L((2, 3), (6, 1)), L(3, 1), ((3,), (1,))),  # unflatten part of sizes (2, 3): inner mode
    (L((2, 3), (6, 1)), L(6, 1), ((2, 3), (6, 1))),  # unflatten as (6,)
    (L(8), L((2, 2), (1, 4)), ((2, 2), (1, 4))),  # identity outer
    (L(4, 2), L(2, 2), ((2,), (4,))),
    (L((4, 2), (1, 4)), L(4, 2), ((4,), (1,))),
    (L((4, 2), (1, 4)), L(2, 1), ((2,), (4,))),
    (L((2, 2, 2), (1, 2, 4)), L((2, 2), (2, 1)), ((2, 2), (2, 4))),
    (L((2, 3), (6, 1)), L(2, 0), ((2,), (0,))),
    (L((2, 3), (6, 1)), L(()), ((), ())),
    (L((2, 2, 3), (1, 12, 2)), L((2, 6), (6, 1)), ((2, 2, 3), (1, 12, 2))),
    (L((2, 2, 3), (1, 12, 2)), L(2, 6), ((2,), (1,))),
    (L((2, 2, 3), (1, 12, 2)), L(2, 3), ((2,), (12,))),
]


@pytest.mark.parametrize(
    ("outer", "inner", "expected"), COMPOSITIONS, ids=[f"{c[0]}o{c[1]}" for c in COMPOSITIONS]
)
def test_composition_examples(outer, inner, expected):
    out = composition(outer, inner)
    assert (out.shape, out.stride) == expected
    # law: composition(a, b)(i) == a(b(i)), checked against the brute-force enumerations
    a = ref_indices(outer.shape, outer.stride)
    assert indices(out).tolist() == [a[j] for j in ref_indices(inner.shape, inner.stride)]


COMPOSITION_ERRORS = [
    # (2,3):(6,1) split as (3, 2): the outer part 3:2 walks 0, 2, 4 -> 0, 2, 7: not a layout
    (L((2, 3), (6, 1)), L(3, 2), r"split the outer layout's modes evenly, but got mode 3:2 of inner=3:2 "
                                 r"against outer=\(2,3\):\(6,1\)"),
    (L((2, 3), (6, 1)), L(4, 1), r"split the outer layout's modes evenly, but got mode 4:1"),
    (L((2, 3), (6, 1)), L(7, 1), r"stay inside the outer layout's 6 coordinates, but got inner=7:1 \(cosize 7\)"),
    (L(4), L((2, 2), (1, 4)), r"stay inside the outer layout's 4 coordinates"),
]


@pytest.mark.parametrize(("outer", "inner", "pattern"), COMPOSITION_ERRORS)
def test_composition_errors(outer, inner, pattern):
    with pytest.raises(MeshError, match=r"^`composition` requires .*" + pattern):
        composition(outer, inner)


def test_composition_3_2_split_is_not_a_layout_by_brute_force():
    """Independent check that the (3, 2) split of (2,3):(6,1) has no layout: 0, 2, 7 is not arithmetic."""
    a = ref_indices((2, 3), (6, 1))
    walk = [a[j] for j in ref_indices((3,), (2,))]
    assert walk == [0, 2, 7]
    assert len({q - p for p, q in zip(walk, walk[1:])}) != 1


# -- is_injective ------------------------------------------------------------------------------

INJECTIVE = [
    L((2, 2), (2, 3)),  # not aligned (3 < span 4) but injective: 0, 3, 2, 5
    L((3, 2), (1, 3)),
    L((3, 3), (2, 3)),
    L((2, 3), (3, 2)),
    L((3, 2), (2, 3)),
    L((2, 2), (4, 1)),
    L((2, 3), (6, 1)),
    L(()),
    L(5, 7),
]
NOT_INJECTIVE = [
    L((2, 2), (1, 1)),
    L(2, 0),
    L((3, 2), (1, 2)),  # 0, 2, 1, 3, 2, 4
    L((4, 2), (1, 3)),  # 3 twice
    L((2, 3), (0, 1)),
]


@pytest.mark.parametrize("lay", INJECTIVE, ids=str)
def test_is_injective_true(lay):
    block = ref_indices(lay.shape, lay.stride)
    assert len(set(block)) == len(block)  # brute force agrees with the table
    assert is_injective(lay) is True


@pytest.mark.parametrize("lay", NOT_INJECTIVE, ids=str)
def test_is_injective_false(lay):
    block = ref_indices(lay.shape, lay.stride)
    assert len(set(block)) < len(block)
    assert is_injective(lay) is False


def test_is_injective_matches_brute_force_exhaustively():
    for k in range(4):
        for shape in itertools.product(range(1, 4), repeat=k):
            for stride in itertools.product(range(7), repeat=k):
                block = ref_indices(shape, stride)
                assert is_injective(Layout(shape, stride)) == (len(set(block)) == len(block)), (shape, stride)


# -- decompose -----------------------------------------------------------------------------------

DECOMPOSE = [
    # layout, n, index, (group j, coordinate i)
    (L((2, 3), (6, 1)), 12, 7, (0, 4)),  # row 0 = [0, 1, 2, 6, 7, 8]
    (L((2, 3), (6, 1)), 12, 10, (1, 4)),  # row 1 = [3, 4, 5, 9, 10, 11]
    (L((2, 3), (6, 1)), 12, 0, (0, 0)),
    (L(2, 4), 8, 6, (2, 1)),  # complement 4:1; 6 = 2 + 4
    (L(()), 6, 5, (5, 0)),
    (L(8), 8, 3, (0, 3)),
    (L((3, 2), (1, 3)), 12, 8, (1, 4)),  # complement 2:6; 8 - 6 = 2 = layout(4)
]


@pytest.mark.parametrize(("lay", "n", "index", "expected"), DECOMPOSE)
def test_decompose_examples(lay, n, index, expected):
    assert decompose(lay, n, index) == expected


@pytest.mark.parametrize(
    ("lay", "n"), [(L((2, 3), (6, 1)), 12), (L((2, 2), (1, 4)), 16), (L(3, 4), 12), (L((3, 2), (1, 3)), 12)]
)
def test_decompose_every_index_matches_brute_force(lay, n):
    block = ref_indices(lay.shape, lay.stride)
    offsets = ref_offsets(block, n)
    where = {t + b: (j, i) for j, t in enumerate(offsets) for i, b in enumerate(block)}
    assert [decompose(lay, n, x) for x in range(n)] == [where[x] for x in range(n)]


@pytest.mark.parametrize("index", [-1, 12, 99])
def test_decompose_out_of_range(index):
    with pytest.raises(MeshError, match=rf"`decompose` requires an index in \[0, 12\), but got index={index}"):
        decompose(L((2, 3), (6, 1)), 12, index)


def test_decompose_wrong_type():
    with pytest.raises(TypeError, match=r"`decompose` requires an int for index, but got index=1.0"):
        decompose(L(2), 4, 1.0)


# -- groups --------------------------------------------------------------------------------------

GROUPS = [
    (L((2, 3), (6, 1)), 12, [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]),
    (L(2, 4), 8, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (L(4), 8, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (L(()), 3, [[0], [1], [2]]),
    (L((2, 2), (1, 4)), 16, [[0, 4, 1, 5], [2, 6, 3, 7], [8, 12, 9, 13], [10, 14, 11, 15]]),
    (L(6), 6, [[0, 1, 2, 3, 4, 5]]),
]


@pytest.mark.parametrize(("lay", "n", "expected"), GROUPS, ids=[f"{g[0]}@{g[1]}" for g in GROUPS])
def test_groups(lay, n, expected):
    out = groups(lay, n)
    assert out.dtype == np.int64
    assert out.shape == (len(expected), len(expected[0]))
    assert out.tolist() == expected


def test_groups_error_is_complement_error():
    with pytest.raises(MeshError, match=r"`complement` requires a size that is a multiple"):
        groups(L(4), 6)
