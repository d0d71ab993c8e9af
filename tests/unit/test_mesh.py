"""Tables of examples for the pure ``Mesh`` value (functional_mesh/mesh.py), docs/design.md, "Mesh semantics", "The public contract", "Edge cases".

Expected values are written out by hand from the definitions (row-major ranks, torch's group
order) or computed by the small numpy reference ``ref_groups`` below, never by the code under test.
"""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
from collections.abc import Mapping

import numpy as np
import pytest

import functional_mesh as fm
from functional_mesh import Mesh, MeshError, UnknownAxisError, make_mesh

# -- reference -----------------------------------------------------------------------------------


def ref_groups(sizes, names, devices, selected):
    """Groups of ``mesh[selected]`` from first principles.

    The ranks form a row-major grid over ``sizes``; selecting axes keeps the unselected ones as a
    family, enumerated row-major in mesh order (torch's order), and each group is the subgrid with
    its axes in the selected order.
    """
    grid = np.asarray(devices, dtype=np.int64).reshape(sizes)
    sel = [names.index(n) for n in selected]
    rest = [i for i in range(len(names)) if i not in sel]
    moved = np.transpose(grid, rest + sel)
    return moved.reshape((-1, *(sizes[i] for i in sel)))


def ref_locate(groups: np.ndarray, rank: int):
    """(group row, coordinate) of ``rank`` in ``groups``, or None."""
    hits = np.argwhere(groups == rank)
    if len(hits) == 0:
        return None
    assert len(hits) == 1
    return int(hits[0][0]), tuple(int(c) for c in hits[0][1:])


DP_TP = make_mesh((2, 4), ("dp", "tp"))
ABC = make_mesh((2, 2, 2), ("a", "b", "c"))
ABC3 = make_mesh((2, 2, 3), ("a", "b", "c"))  # a=2:6, b=2:3, c=3:1


# -- construction and shape queries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "names", "ndim", "size"),
    [
        ((2, 4), ("dp", "tp"), 2, 8),
        ((2, 2, 2), ("dp", "cp", "tp"), 3, 8),
        ((8,), ("world",), 1, 8),
        ((3, 1, 5), ("a", "b", "c"), 3, 15),
        ((), (), 0, 1),
    ],
)
def test_shape_queries(sizes, names, ndim, size):
    mesh = make_mesh(sizes, names)
    assert mesh.axis_names == names
    assert mesh.axis_sizes == sizes
    assert mesh.ndim == ndim
    assert mesh.size == size
    assert isinstance(mesh.size, int)
    assert mesh.num_groups == 1
    assert mesh.shape == dict(zip(names, sizes))
    assert list(mesh.shape.items()) == list(zip(names, sizes))  # ordered
    for n, s in zip(names, sizes):
        assert mesh.axis_size(n) == s
        assert mesh.shape[n] == s


def test_axis_names_as_str_for_single_axis():
    assert make_mesh((4,), "tp").axis_names == ("tp",)
    assert make_mesh([2, 4], ["dp", "tp"]) == DP_TP


def test_shape_is_ordered_read_only_mapping():
    shape = DP_TP.shape
    assert isinstance(shape, Mapping)
    assert list(shape) == ["dp", "tp"]
    assert len(shape) == 2
    assert repr(shape) == "{'dp': 2, 'tp': 4}"
    assert dict(shape) == {"dp": 2, "tp": 4}
    assert DP_TP.transpose("tp", "dp").shape != {"tp": 4, "dp": 3}
    assert list(DP_TP.transpose("tp", "dp").shape) == ["tp", "dp"]
    with pytest.raises(TypeError):
        shape["dp"] = 3  # type: ignore[index]


class _DictMapping(Mapping):
    """The reference: collections.abc.Mapping's mixin methods over a plain dict's lookups."""

    def __init__(self, items):
        self._d = dict(items)

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


SHAPE_KEYS = ["dp", "tp", "cp", "tpp", "", 0, 1, -1, 2, True, None, 1.5, ("dp",), b"dp", frozenset({"dp"})]


@pytest.mark.parametrize("key", SHAPE_KEYS, ids=repr)
def test_shape_answers_in_and_get_as_a_mapping_does(key):
    # issue: ``0 in mesh.shape`` and ``mesh.shape.get(0)`` raised the by-position MeshError
    shape, ref = DP_TP.shape, _DictMapping({"dp": 2, "tp": 4})
    assert (key in shape) is (key in ref)
    assert shape.get(key) == ref.get(key) and shape.get(key, "default") == ref.get(key, "default")


def test_shape_answers_the_rest_of_the_mapping_protocol_as_a_mapping_does():
    shape, ref = DP_TP.transpose("tp", "dp").shape, _DictMapping({"tp": 4, "dp": 2})
    assert list(shape) == list(ref) == ["tp", "dp"] and len(shape) == len(ref) == 2
    assert list(shape.keys()) == list(ref.keys()) and list(shape.values()) == list(ref.values())
    assert list(shape.items()) == list(ref.items()) == [("tp", 4), ("dp", 2)]
    assert "dp" in shape.keys() and 0 not in shape.keys() and ("dp", 2) in shape.items()
    assert 4 in shape.values() and (0, 2) not in shape.items()
    # == as Mapping's: by items, whatever the order; a non-mapping is never equal
    assert shape == ref == {"dp": 2, "tp": 4} == DP_TP.shape and shape != {"dp": 2} and shape != [("tp", 4)]
    assert not (shape != {"dp": 2, "tp": 4})
    assert [] not in shape and shape.get([]) is None  # an unhashable key is not an axis name


def test_shape_by_position_is_mesh_error_with_hint():
    with pytest.raises(MeshError, match=r"`mesh.shape\[...\]` requires an axis name .*but got key=0; "
                                        r"valid: \('dp', 'tp'\); for sizes by position use mesh.axis_sizes\[0\]"):
        DP_TP.shape[0]


def test_shape_misspelt_axis_did_you_mean():
    # docs/design.md "Errors": an unknown axis names the valid choices and the closest name
    with pytest.raises(UnknownAxisError, match=r"tpp.*did you mean 'tp'\?"):
        DP_TP.shape["tpp"]


def test_size_is_property_not_method():
    assert DP_TP.size == 8
    assert DP_TP.size + 1 == 9
    assert DP_TP["tp"].size == 4
    with pytest.raises(TypeError, match=r"`Mesh.size` is a property .*not a method: write mesh.size"):
        DP_TP.size()
    assert type(pickle.loads(pickle.dumps(DP_TP.size))) is int


@pytest.mark.parametrize(
    ("mesh", "num_groups"),
    [
        (DP_TP, 1),
        (DP_TP["tp"], 2),
        (DP_TP["dp"], 4),
        (DP_TP["tp", "dp"], 1),
        (make_mesh((2, 2, 2), ("dp", "cp", "tp"))["cp"], 4),
        (make_mesh((2, 2, 2), ("dp", "cp", "tp"))["dp", "tp"], 2),
        (make_mesh((), ()), 1),
    ],
)
def test_num_groups(mesh, num_groups):
    assert mesh.num_groups == num_groups
    assert mesh.groups().shape == (num_groups, *mesh.axis_sizes)


def test_axis_size_unknown_and_wrong_type():
    with pytest.raises(UnknownAxisError, match=r"did you mean 'tp'\?"):
        DP_TP.axis_size("tpp")
    with pytest.raises(TypeError, match=r"`Mesh.axis_size` requires a str axis name, but got axis=0"):
        DP_TP.axis_size(0)  # type: ignore[arg-type]


# -- selection ------------------------------------------------------------------------------------

SELECTIONS = [
    # (sizes, names, devices, key, expected groups) -- by hand
    ((2, 4), ("dp", "tp"), None, "tp", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ((2, 4), ("dp", "tp"), None, "dp", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ((2, 4), ("dp", "tp"), None, ("tp", "dp"), [[[0, 4], [1, 5], [2, 6], [3, 7]]]),
    ((2, 4), ("dp", "tp"), None, ("dp", "tp"), [[[0, 1, 2, 3], [4, 5, 6, 7]]]),
    ((2, 4), ("dp", "tp"), None, ["tp", "dp"], [[[0, 4], [1, 5], [2, 6], [3, 7]]]),
    ((2, 4), ("dp", "tp"), None, ("tp",), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ((2, 4), ("dp", "tp"), None, ["dp"], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ((2, 2, 2), ("dp", "cp", "tp"), None, "cp", [[0, 2], [1, 3], [4, 6], [5, 7]]),
    ((2, 2, 2), ("dp", "cp", "tp"), None, ("dp", "tp"), [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]),
    ((2, 2, 2), ("dp", "cp", "tp"), None, ("tp", "dp"), [[[0, 4], [1, 5]], [[2, 6], [3, 7]]]),
    ((2, 4), ("dp", "tp"), range(8, 16), "dp", [[8, 12], [9, 13], [10, 14], [11, 15]]),
    ((2, 4), ("dp", "tp"), [7, 6, 5, 4, 3, 2, 1, 0], "tp", [[7, 6, 5, 4], [3, 2, 1, 0]]),
    ((2, 4), ("dp", "tp"), [7, 6, 5, 4, 3, 2, 1, 0], "dp", [[7, 3], [6, 2], [5, 1], [4, 0]]),
    ((2, 2), ("a", "b"), [10, 3, 7, 1], "a", [[10, 7], [3, 1]]),
    ((2, 2), ("a", "b"), [10, 3, 7, 1], ("b", "a"), [[[10, 7], [3, 1]]]),
]


@pytest.mark.parametrize(("sizes", "names", "devices", "key", "expected"), SELECTIONS)
def test_selection_examples(sizes, names, devices, key, expected):
    sub = make_mesh(sizes, names, devices=devices)[key]
    key_t = (key,) if isinstance(key, str) else tuple(key)
    assert sub.axis_names == key_t
    out = sub.groups()
    assert out.dtype == np.int64
    assert out.tolist() == expected
    dev = range(int(np.prod(sizes))) if devices is None else devices
    assert out.tolist() == ref_groups(sizes, names, list(dev), key_t).tolist()


_PERM_DEVICES = [5, 11, 0, 3, 8, 1, 9, 2, 10, 7, 4, 6]


@pytest.mark.parametrize(
    "key", [p for k in (1, 2, 3) for p in itertools.permutations(("a", "b", "c"), k)], ids=lambda k: "".join(k)
)
@pytest.mark.parametrize("devices", [None, _PERM_DEVICES, range(20, 32)], ids=["iota", "perm", "offset"])
def test_every_selection_against_reference(key, devices):
    sizes, names = (2, 3, 2), ("a", "b", "c")
    mesh = make_mesh(sizes, names, devices=devices)
    dev = list(range(12)) if devices is None else list(devices)
    expected = ref_groups(sizes, names, dev, key)
    sub = mesh[key]
    assert sub.groups().tolist() == expected.tolist()
    assert sub.num_groups == expected.shape[0]
    for rank in dev:
        j, coord = ref_locate(expected, rank)
        assert sub.coordinate(rank) == coord
        assert sub.group_of(rank).tolist() == expected[j].tolist()


def test_selection_same_as_tuple_list_and_one_tuple():
    assert DP_TP["tp"] == DP_TP[("tp",)] == DP_TP[["tp"]]
    assert DP_TP["tp", "dp"] == DP_TP[["tp", "dp"]] == DP_TP[("tp", "dp")]
    assert DP_TP["dp", "tp"] == DP_TP
    assert DP_TP["tp", "dp"] != DP_TP


@pytest.mark.parametrize(
    ("key", "exc", "pattern"),
    [
        ((), MeshError, r"`Mesh\[...\]` requires at least one axis, but got axes=\(\); valid: \('dp', 'tp'\)"),
        ([], MeshError, r"`Mesh\[...\]` requires at least one axis"),
        (("dp", "dp"), MeshError, r"`Mesh\[...\]` requires distinct axis names, but got axes=\('dp', 'dp'\); "
                                  r"'dp' appears twice"),
        ("tpp", UnknownAxisError, r"`Mesh\[...\]` requires an axis name of the mesh, but got axis='tpp'; "
                                  r"valid: \('dp', 'tp'\); did you mean 'tp'\?"),
        (("dp", "x"), UnknownAxisError, r"but got axis='x'; valid: \('dp', 'tp'\)$"),
        (0, TypeError, r"`Mesh\[...\]` requires axis names, not positions, but got key=0; valid: \('dp', 'tp'\); "
                       r"write mesh\['dp'\]"),
        (1, TypeError, r"write mesh\['tp'\]"),
        (5, TypeError, r"requires axis names, not positions, but got key=5"),
        (-1, TypeError, r"requires axis names, not positions, but got key=-1"),
        (1.5, TypeError, r"`Mesh\[...\]` requires a str or a tuple of str for axes, but got axes=1.5"),
        (None, TypeError, r"`Mesh\[...\]` requires a str or a tuple of str"),
        (("dp", 1), TypeError, r"`Mesh\[...\]` requires str axis names in axes, but got name=1"),
    ],
)
def test_selection_errors(key, exc, pattern):
    with pytest.raises(exc, match=pattern):
        DP_TP[key]


# -- flatten ------------------------------------------------------------------------------------

FLATTENS = [
    # (axes, name) on ABC = (a=2, b=2, c=2) over 0..7 (rank = 4a + 2b + c)
    #   -> names, full rank grid (one group)
    (("a", "b"), None, ("a_b", "c"), [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (("b", "c"), None, ("a", "b_c"), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (("a", "c"), None, ("a_c", "b"), [[0, 2], [1, 3], [4, 6], [5, 7]]),
    (("c", "a"), None, ("b", "c_a"), [[0, 4, 1, 5], [2, 6, 3, 7]]),  # docs/design.md "Edge cases"
    (("b", "a"), "x", ("x", "c"), [[0, 1], [4, 5], [2, 3], [6, 7]]),
    (None, None, ("a_b_c",), [0, 1, 2, 3, 4, 5, 6, 7]),
    (("c", "b", "a"), None, ("c_b_a",), [0, 4, 2, 6, 1, 5, 3, 7]),
    (("a", "b"), "a", ("a", "c"), [[0, 1], [2, 3], [4, 5], [6, 7]]),  # named after a part
    (("a", "b"), "b", ("b", "c"), [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("b", None, ("a", "b", "c"), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),  # one axis: unchanged
    (("b",), "bb", ("a", "bb", "c"), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
    (["c", "a"], "ca", ("b", "ca"), [[0, 4, 1, 5], [2, 6, 3, 7]]),
]


@pytest.mark.parametrize(("axes", "name", "names", "ranks"), FLATTENS)
def test_flatten_examples(axes, name, names, ranks):
    flat = ABC.flatten(axes, name=name) if axes is not None else ABC.flatten(name=name)
    assert flat.axis_names == names
    assert flat.num_groups == 1
    assert flat.ranks.tolist() == ranks
    assert flat.size == 8


def test_flatten_non_contiguous_axis_family():
    # ABC3: rank = 6a + 3b + c; (a, c) merged: one group per b
    flat = ABC3.flatten(("a", "c"), name="ac")
    assert flat.axis_names == ("ac", "b")
    assert flat.axis_sizes == (6, 2)
    assert flat["ac"].groups().tolist() == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    assert flat.axis_layout("ac") == fm.Layout((2, 3), (6, 1))


def test_flatten_of_selection_is_one_dim_and_matches_in_place_flatten():
    sub = ABC["c", "a"].flatten()
    assert sub.axis_names == ("c_a",)
    assert sub.groups().tolist() == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert sub == ABC.flatten(("c", "a"))["c_a"]
    assert ABC["a", "c"].flatten(name="ac").groups().tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize(
    ("call", "exc", "pattern"),
    [
        (lambda: ABC.flatten(("a", "b"), name="c"), MeshError,
         r"`Mesh.flatten` requires a merged name distinct from the remaining axes, but got name='c'; "
         r"remaining axes: \('c',\)"),  # the message must show which remaining axis it collides with
        (lambda: ABC.flatten(("a", "a")), MeshError, r"`Mesh.flatten` requires distinct axis names, .*'a' appears twice"),
        (lambda: ABC.flatten(()), MeshError, r"`Mesh.flatten` requires at least one axis, but got axes=\(\)"),
        (lambda: ABC.flatten(("a", "cc")), UnknownAxisError, r"`Mesh.flatten` requires an axis name of the mesh, "
                                                            r"but got axis='cc'.*did you mean 'c'\?"),
        (lambda: make_mesh((), ()).flatten(), MeshError, r"`Mesh.flatten` requires a mesh with at least one axis"),
        (lambda: ABC.flatten(("a", "b"), name=3), TypeError, r"`Mesh.flatten` requires one str for name, but got "
                                                            r"name=3"),
        (lambda: ABC.flatten(("a", "b"), name=("x", "y")), TypeError, r"`Mesh.flatten` requires one str for name"),
        (lambda: ABC.flatten(("a", "b"), name=""), MeshError, r"requires non-empty axis names"),
    ],
)
def test_flatten_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# -- unflatten ---------------------------------------------------------------------------------


def test_unflatten_world():
    m = make_mesh((8,), ("world",)).unflatten("world", {"dp": 2, "tp": 4})
    assert m == DP_TP
    assert m["dp"].groups().tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(
    ("mesh", "axis", "sizes", "names", "groups"),
    [
        # inner axis of DP_TP split: (dp, x, y) over 0..7
        (DP_TP, "tp", {"x": 2, "y": 2}, ("dp", "x", "y"), [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]),
        (DP_TP, "tp", [("x", 2), ("y", 2)], ("dp", "x", "y"), [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]),
        (DP_TP, "tp", {"tp": 2, "y": 2}, ("dp", "tp", "y"), [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]),  # reuse
        (DP_TP, "tp", {"y": 2, "tp": 2}, ("dp", "y", "tp"), [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]),
        (DP_TP, "tp", {"x": 1, "tp": 4}, ("dp", "x", "tp"), [[[[0, 1, 2, 3]], [[4, 5, 6, 7]]]]),
        # a family (tp over each dp) split: still one group per dp
        (DP_TP["tp"], "tp", {"x": 2, "y": 2}, ("x", "y"), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
        # the non-contiguous c_a = (2,2):(1,4) split back along its modes
        (ABC.flatten(("c", "a")), "c_a", {"c": 2, "a": 2}, ("b", "c", "a"),
         [[[[0, 4], [1, 5]], [[2, 6], [3, 7]]]]),
        (ABC.flatten(("c", "a")), "c_a", {"w": 4}, ("b", "w"), [[[0, 4, 1, 5], [2, 6, 3, 7]]]),
        # (2,3):(6,1) splits as (2, 3) or (6,), with size-1 axes anywhere
        (ABC3.flatten(("a", "c"), name="ac"), "ac", {"x": 2, "y": 3}, ("x", "y", "b"),
         [[[[0, 3], [1, 4], [2, 5]], [[6, 9], [7, 10], [8, 11]]]]),
        (ABC3.flatten(("a", "c"), name="ac"), "ac", {"x": 6}, ("x", "b"),
         [[[0, 3], [1, 4], [2, 5], [6, 9], [7, 10], [8, 11]]]),
        (ABC3.flatten(("a", "c"), name="ac"), "ac", {"x": 2, "o": 1, "y": 3}, ("x", "o", "y", "b"),
         [[[[[0, 3], [1, 4], [2, 5]]], [[[6, 9], [7, 10], [8, 11]]]]]),
    ],
)
def test_unflatten_examples(mesh, axis, sizes, names, groups):
    out = mesh.unflatten(axis, sizes)
    assert out.axis_names == names
    assert out.groups().tolist() == groups


def test_unflatten_inverts_flatten():
    assert ABC.flatten(("a", "b"), name="ab").unflatten("ab", {"a": 2, "b": 2}) == ABC
    assert ABC3.flatten(("a", "c"), name="ac").unflatten("ac", {"a": 2, "c": 3}) == ABC3.transpose("a", "c", "b")
    assert ABC.flatten(("c", "a")).unflatten("c_a", {"c": 2, "a": 2}) == ABC.transpose("b", "c", "a")


@pytest.mark.parametrize(
    ("call", "exc", "pattern"),
    [
        (lambda: DP_TP.unflatten("tp", {"x": 3, "y": 2}), MeshError,
         r"`Mesh.unflatten` requires sizes whose product equals the size of axis 'tp' \(4\), "
         r"but got sizes=\{'x': 3, 'y': 2\}"),
        (lambda: DP_TP.unflatten("tp", {"x": 8}), MeshError, r"product equals the size of axis 'tp' \(4\)"),
        (lambda: ABC3.flatten(("a", "c"), name="ac").unflatten("ac", {"x": 3, "y": 2}), MeshError,
         r"`Mesh.unflatten` requires sizes that split axis 'ac' along its modes \(2,3\):\(6,1\) .*"
         r"but got sizes=\{'x': 3, 'y': 2\}; valid: .*\(2, 3\) or \(6,\)"),
        (lambda: DP_TP.unflatten("tp", {"dp": 2, "y": 2}), MeshError,
         r"`Mesh.unflatten` requires distinct axis names, but got resulting axis names=\('dp', 'dp', 'y'\); "
         r"'dp' appears twice"),
        (lambda: DP_TP.unflatten("tpp", {"x": 4}), UnknownAxisError,
         r"`Mesh.unflatten` requires an axis name of the mesh, but got axis='tpp'.*did you mean 'tp'\?"),
        (lambda: DP_TP.unflatten("tp", {}), MeshError, r"`Mesh.unflatten` requires at least one new axis"),
        (lambda: DP_TP.unflatten("tp", {"x": 0, "y": 4}), MeshError,
         r"`Mesh.unflatten` requires positive sizes, but got sizes\['x'\]=0"),
        (lambda: DP_TP.unflatten("tp", {"x": 4.0}), TypeError, r"`Mesh.unflatten` requires an int for size"),
        (lambda: DP_TP.unflatten("tp", {"x": True, "y": 4}), TypeError, r"requires an int for size"),
        (lambda: DP_TP.unflatten("tp", 4), TypeError, r"`Mesh.unflatten` requires a mapping \{name: size\}"),
        (lambda: DP_TP.unflatten("tp", [("x", 2), ("x", 2)]), MeshError, r"'x' appears twice"),
        (lambda: DP_TP.unflatten("tp", {1: 4}), TypeError, r"requires str axis names in sizes, but got name=1"),
    ],
)
def test_unflatten_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# -- transpose and rename ----------------------------------------------------------------------


@pytest.mark.parametrize("args", [("tp", "dp"), (("tp", "dp"),), (["tp", "dp"],)])
def test_transpose(args):
    t = DP_TP.transpose(*args)
    assert t.axis_names == ("tp", "dp")
    assert t.axis_sizes == (4, 2)
    assert t.ranks.tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert t == DP_TP["tp", "dp"]
    assert t.transpose("dp", "tp") == DP_TP


def test_transpose_identity_and_three_axes():
    assert DP_TP.transpose("dp", "tp") == DP_TP
    t = ABC.transpose("c", "a", "b")
    assert t.ranks.tolist() == ref_groups((2, 2, 2), ("a", "b", "c"), range(8), ("c", "a", "b"))[0].tolist()
    assert make_mesh((), ()).transpose() == make_mesh((), ())


@pytest.mark.parametrize(
    ("axes", "pattern"),
    [
        (("tp",), r"`Mesh.transpose` requires a permutation of all axis names, but got axes=\('tp',\); "
                  r"valid: \('dp', 'tp'\)"),
        (("tp", "tp"), r"a permutation of all axis names, but got axes=\('tp', 'tp'\)"),
        (("tp", "dp", "x"), r"`Mesh.transpose` requires an axis name of the mesh, but got axis='x'; valid: \('dp', 'tp'\)"),
        ((), r"a permutation of all axis names, but got axes=\(\)"),
    ],
)
def test_transpose_errors(axes, pattern):
    with pytest.raises(MeshError, match=pattern):
        DP_TP.transpose(*axes)


def test_transpose_misspelt_axis_did_you_mean():
    # docs/design.md "Errors": a misspelt axis gets the closest name, in every API
    with pytest.raises(MeshError, match=r"tpp.*did you mean 'tp'\?"):
        DP_TP.transpose("dp", "tpp")


def test_transpose_wrong_type():
    with pytest.raises(TypeError, match=r"`Mesh.transpose` requires str axis names in axes, but got name=1"):
        DP_TP.transpose("dp", 1)


@pytest.mark.parametrize(
    ("mapping", "names"),
    [
        ({"dp": "data"}, ("data", "tp")),
        ({"dp": "tp", "tp": "dp"}, ("tp", "dp")),  # simultaneous: a swap
        ({"dp": "dp"}, ("dp", "tp")),  # identity
        ({}, ("dp", "tp")),
        ({"dp": "x", "tp": "y"}, ("x", "y")),
        ({"tp": "dp", "dp": "z"}, ("z", "dp")),  # chain, simultaneous
    ],
)
def test_rename(mapping, names):
    r = DP_TP.rename(mapping)
    assert r.axis_names == names
    assert r.axis_sizes == (2, 4)  # sizes stay in place, only names change
    assert r.ranks.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (r == DP_TP) == (names == ("dp", "tp"))


def test_rename_swap_differs_from_transpose():
    swapped = DP_TP.rename({"dp": "tp", "tp": "dp"})
    assert swapped.shape == {"tp": 2, "dp": 4}
    assert swapped["dp"].groups().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert swapped != DP_TP.transpose("tp", "dp")


@pytest.mark.parametrize(
    ("mapping", "exc", "pattern"),
    [
        ({"dpp": "x"}, UnknownAxisError, r"`Mesh.rename` requires an axis name of the mesh, but got axis='dpp'; "
                                         r"valid: \('dp', 'tp'\); did you mean 'dp'\?"),
        ({"dp": "tp"}, MeshError, r"`Mesh.rename` requires distinct axis names, but got resulting axis names="
                                  r"\('tp', 'tp'\); 'tp' appears twice"),
        ({"dp": ""}, MeshError, r"`Mesh.rename` requires non-empty axis names"),
        ({"dp": 1}, TypeError, r"`Mesh.rename` requires str axis names in new name, but got name=1"),
        ({1: "x"}, TypeError, r"`Mesh.rename` requires a str axis name, but got axis=1"),
        ("dp", TypeError, r"`Mesh.rename` requires a mapping \{old: new\}, but got mapping='dp'"),
    ],
)
def test_rename_errors(mapping, exc, pattern):
    with pytest.raises(exc, match=pattern):
        DP_TP.rename(mapping)


# -- groups, group_of, coordinate, ranks ---------------------------------------------------------

COORDINATES = [
    # (mesh, rank, coordinate, group)
    (DP_TP, 6, (1, 2), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (DP_TP, 0, (0, 0), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (DP_TP["tp"], 6, (2,), [4, 5, 6, 7]),
    (DP_TP["dp"], 6, (1,), [2, 6]),
    (DP_TP["tp", "dp"], 6, (2, 1), [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (DP_TP, 8, None, None),
    (DP_TP, 10**6, None, None),
    (DP_TP, 2**64, None, None),
    (make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0]), 7, (0, 0), [[7, 6, 5, 4], [3, 2, 1, 0]]),
    (make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0]), 0, (1, 3), [[7, 6, 5, 4], [3, 2, 1, 0]]),
    (make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0]), 8, None, None),
    (make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16)), 3, None, None),
    (make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16)), 9, (0, 1), [[8, 9, 10, 11], [12, 13, 14, 15]]),
    (make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))["dp"], 13, (1,), [9, 13]),
    (make_mesh((2, 2), ("a", "b"), devices=range(0, 8, 2)), 4, (1, 0), [[0, 2], [4, 6]]),
    (make_mesh((2, 2), ("a", "b"), devices=range(0, 8, 2)), 3, None, None),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1]), 3, (0, 1), [[10, 3], [7, 1]]),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1]), 1, (1, 1), [[10, 3], [7, 1]]),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1]), 4, None, None),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1]), 100, None, None),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1]), 2**64, None, None),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1])["a"], 1, (1,), [3, 1]),
    (make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1])["b", "a"], 7, (0, 1), [[10, 7], [3, 1]]),
    (ABC.flatten(("c", "a")), 5, (0, 3), [[0, 4, 1, 5], [2, 6, 3, 7]]),
    (ABC.flatten(("c", "a"))["c_a"], 6, (1,), [2, 6, 3, 7]),
    (ABC3.flatten(("a", "c"), name="ac")["ac"], 9, (3,), [3, 4, 5, 9, 10, 11]),
]


@pytest.mark.parametrize(("mesh", "rank", "coordinate", "group"), COORDINATES)
def test_coordinate_and_group_of(mesh, rank, coordinate, group):
    assert mesh.coordinate(rank) == coordinate
    got = mesh.group_of(rank)
    if group is None:
        assert got is None
    else:
        assert got.dtype == np.int64
        assert got.shape == mesh.axis_sizes
        assert got.tolist() == group
        # the coordinate indexes the rank inside its group
        assert got[coordinate] == rank
        assert all(type(c) is int for c in mesh.coordinate(rank))


def test_coordinate_accepts_integer_like():
    assert DP_TP.coordinate(np.int64(6)) == (1, 2)
    assert DP_TP.group_of(np.int32(6)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("method", ["coordinate", "group_of"])
@pytest.mark.parametrize("mesh", [DP_TP, DP_TP["tp"], make_mesh((2, 2), ("a", "b"), devices=[10, 3, 7, 1])])
def test_negative_rank_is_mesh_error(method, mesh):
    with pytest.raises(MeshError, match=rf"`Mesh.{method}` requires a non-negative global rank, but got rank=-1"):
        getattr(mesh, method)(-1)


@pytest.mark.parametrize("method", ["coordinate", "group_of"])
@pytest.mark.parametrize("rank", [1.0, True, "1", None])
def test_rank_wrong_type(method, rank):
    with pytest.raises(TypeError, match=rf"`Mesh.{method}` requires an int for rank, but got rank="):
        getattr(DP_TP, method)(rank)


def test_ranks_single_group():
    r = DP_TP.ranks
    assert r.dtype == np.int64
    assert r.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert DP_TP["tp", "dp"].ranks.tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert make_mesh((4,), "x", devices=[9, 2, 4, 0]).ranks.tolist() == [9, 2, 4, 0]


def test_ranks_of_family_is_mesh_error():
    with pytest.raises(MeshError, match=r"`Mesh.ranks` requires a mesh with one group, but got num_groups=2 .*"
                                        r"use mesh.groups\(\) or mesh.group_of\(rank\)") as info:
        DP_TP["tp"].ranks
    assert info.value.mesh == DP_TP["tp"]


def test_groups_of_family_in_torch_order():
    g = make_mesh((2, 2, 2), ("dp", "cp", "tp"))["cp"].groups()
    assert g.dtype == np.int64
    assert g.shape == (4, 2)
    assert g.tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]


# -- 0-axis mesh ---------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [None, [5]])
def test_zero_axis_mesh_over_one_device(devices):
    m = make_mesh((), (), devices=devices)
    dev = 0 if devices is None else devices[0]
    assert m.ndim == 0
    assert m.axis_names == ()
    assert m.axis_sizes == ()
    assert m.shape == {}
    assert m.size == 1
    assert m.num_groups == 1
    assert m.ranks.shape == ()
    assert int(m.ranks) == dev
    assert m.groups().tolist() == [dev]
    assert m.coordinate(dev) == ()
    assert m.group_of(dev).tolist() == dev
    assert m.coordinate(dev + 1) is None
    assert m == make_mesh((), (), devices=devices)
    assert pickle.loads(pickle.dumps(m)) == m


def test_zero_axis_mesh_from_ranks():
    assert Mesh.from_ranks(np.array(3), ()) == make_mesh((), (), devices=[3])


# -- explicit devices ----------------------------------------------------------------------------


def _torch_tensor(values):
    import torch

    return torch.tensor(values)


@pytest.mark.parametrize(
    "devices",
    [
        [3, 1, 2, 0],
        (3, 1, 2, 0),
        np.array([3, 1, 2, 0]),
        np.array([3, 1, 2, 0], dtype=np.int32),
        np.array([3, 1, 2, 0], dtype=np.uint8),
        [np.int64(3), np.int64(1), 2, 0],
        iter([3, 1, 2, 0]),
        "torch",
    ],
    ids=["list", "tuple", "np", "np32", "npu8", "npscalars", "iter", "torch"],
)
def test_explicit_devices_all_containers(devices):
    if isinstance(devices, str):
        devices = _torch_tensor([3, 1, 2, 0])
    m = make_mesh((2, 2), ("a", "b"), devices=devices)
    ref = make_mesh((2, 2), ("a", "b"), devices=[3, 1, 2, 0])
    assert m.ranks.tolist() == [[3, 1], [2, 0]]
    assert m.devices.tolist() == [3, 1, 2, 0]
    assert m == ref
    assert hash(m) == hash(ref)


@pytest.mark.parametrize(
    "devices",
    [list(range(8)), tuple(range(8)), range(8), np.arange(8), "torch"],
    ids=["list", "tuple", "range", "np", "torch"],
)
def test_explicit_iota_equals_symbolic(devices):
    if isinstance(devices, str):
        devices = _torch_tensor(list(range(8)))
    m = make_mesh((2, 4), ("dp", "tp"), devices=devices)
    assert m == DP_TP
    assert hash(m) == hash(DP_TP)
    assert m.device_list.is_symbolic
    assert repr(m) == "Mesh(dp=2, tp=4)"


@pytest.mark.parametrize(
    ("explicit", "rng"),
    [
        ([8, 9, 10, 11], range(8, 12)),
        ([0, 2, 4, 6], range(0, 8, 2)),
        ([5, 8, 11, 14], range(5, 17, 3)),
        ([3, 2, 1, 0], range(3, -1, -1)),  # a decreasing range is a valid device list too
    ],
)
def test_explicit_range_equals_range(explicit, rng):
    a = make_mesh((2, 2), ("a", "b"), devices=explicit)
    b = make_mesh((2, 2), ("a", "b"), devices=rng)
    assert a == b
    assert hash(a) == hash(b)
    assert b.ranks.tolist() == [explicit[:2], explicit[2:]]


@pytest.mark.parametrize(
    ("devices", "exc", "pattern"),
    [
        ([0, 1, 1, 2], MeshError, r"`make_mesh` requires distinct devices, but got duplicate device=1"),
        ([2, 2, 0, 1], MeshError, r"`make_mesh` requires distinct devices, but got duplicate device=2"),
        ([3, 0, 1, 3], MeshError, r"duplicate device=3"),
        (np.array([5, 5, 5, 5]), MeshError, r"duplicate device=5"),
        ([0, -1, 2, 3], MeshError, r"`make_mesh` requires non-negative global ranks, but got device=-1"),
        (np.array([0, 1, 2, -7]), MeshError, r"non-negative global ranks, but got device=-7"),
        (range(-1, 3), MeshError, r"`make_mesh` requires .*non-negative.*range\(-1, 3\)"),
        ([0.0, 1.0, 2.0, 3.0], TypeError, r"`make_mesh` requires int devices, but got device=0.0"),
        ([0, 1, 2, 3.5], TypeError, r"requires int devices, but got device=3.5"),
        ([True, False, 2, 3], TypeError, r"requires int devices, but got device=True"),
        (["0", "1", "2", "3"], TypeError, r"requires int devices, but got device='0'"),
        ("0123", TypeError, r"`make_mesh` requires an iterable of int ranks for devices, but got devices='0123'"),
        (4, TypeError, r"`make_mesh` requires an iterable of int ranks for devices, but got devices=4"),
        ([0, 1, None, 3], TypeError, r"requires int devices, but got device=None"),
        (np.array([0.0, 1.0, 2.0, 3.0]), TypeError, r"`make_mesh` requires integer devices, .*float64"),
        (np.array([True, False, True, False]), TypeError, r"`make_mesh` requires integer devices, .*bool"),
        (range(3), MeshError, r"`make_mesh` requires one device per mesh position \(4 for axis_sizes=\(2, 2\)\), "
                              r"but got len\(devices\)=3"),
        ([0, 1, 2, 3, 4], MeshError, r"but got len\(devices\)=5"),
    ],
)
def test_explicit_device_errors(devices, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_mesh((2, 2), ("a", "b"), devices=devices)


def test_torch_float_and_bool_devices_are_type_errors():
    import torch

    with pytest.raises(TypeError, match=r"`make_mesh` requires integer devices"):
        make_mesh((2,), ("a",), devices=torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match=r"`make_mesh` requires integer devices"):
        make_mesh((2,), ("a",), devices=torch.tensor([True, False]))
    with pytest.raises(MeshError, match=r"duplicate device=4"):
        make_mesh((2,), ("a",), devices=torch.tensor([4, 4]))


def test_explicit_devices_are_copied():
    values = np.array([3, 1, 2, 0])
    m = make_mesh((2, 2), ("a", "b"), devices=values)
    values[0] = 9
    assert m.devices.tolist() == [3, 1, 2, 0]
    with pytest.raises(ValueError):
        m.devices[0] = 5


# -- Mesh.from_ranks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "names", "selections"),
    [
        ([[0, 2], [1, 3]], ("dp", "tp"), {"tp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]]}),
        (np.array([[0, 2], [1, 3]]), ("dp", "tp"), {"tp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]]}),
        ([[7, 6, 5, 4], [3, 2, 1, 0]], ("dp", "tp"), {"tp": [[7, 6, 5, 4], [3, 2, 1, 0]],
                                                      "dp": [[7, 3], [6, 2], [5, 1], [4, 0]]}),
        ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("a", "b", "c"), {"b": [[0, 2], [1, 3], [4, 6], [5, 7]]}),
        ([4, 9, 2], "x", {"x": [[4, 9, 2]]}),
    ],
)
def test_from_ranks(ranks, names, selections):
    m = Mesh.from_ranks(ranks, names)
    assert m.ranks.tolist() == np.asarray(ranks).tolist()
    for axis, groups in selections.items():
        assert m[axis].groups().tolist() == groups


def test_from_ranks_equals_make_mesh():
    assert Mesh.from_ranks([[0, 1], [2, 3]], ("a", "b")) == make_mesh((2, 2), ("a", "b"))
    assert Mesh.from_ranks([[8, 9], [10, 11]], ("a", "b")) == make_mesh((2, 2), ("a", "b"), devices=range(8, 12))
    assert Mesh.from_ranks([[0, 2], [1, 3]], ("a", "b")) == make_mesh((2, 2), ("a", "b"), devices=[0, 2, 1, 3])
    assert hash(Mesh.from_ranks([[0, 1], [2, 3]], ("a", "b"))) == hash(make_mesh((2, 2), ("a", "b")))


@pytest.mark.parametrize(
    ("ranks", "names", "exc", "pattern"),
    [
        ([[0, 1], [2]], ("a", "b"), MeshError, r"`Mesh.from_ranks` requires a rectangular \(non-ragged\) nesting"),
        ([[0, 1], [2, 3]], ("a",), MeshError,
         r"`Mesh.from_ranks` requires one axis name per dimension of ranks, but got axis_names=\('a',\) "
         r"for ranks of shape \(2, 2\)"),
        ([[0, 1], [1, 3]], ("a", "b"), MeshError, r"`Mesh.from_ranks` requires distinct devices, .*device=1"),
        ([[0, -1]], ("a", "b"), MeshError, r"`Mesh.from_ranks` requires non-negative global ranks, .*device=-1"),
        ([[]], ("a", "b"), MeshError, r"`Mesh.from_ranks` requires a non-empty rank array"),
        ([[0.0, 1.0]], ("a", "b"), TypeError, r"`Mesh.from_ranks` requires int devices, but got device=0.0"),
        ([[0, 1]], ("a", "a"), MeshError, r"`Mesh` requires distinct axis names|'a' appears twice"),
        ([[0, 1]], ("a", 1), TypeError, r"`Mesh.from_ranks` requires str axis names"),
    ],
)
def test_from_ranks_errors(ranks, names, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Mesh.from_ranks(ranks, names)


# -- make_mesh argument errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "names", "exc", "pattern"),
    [
        ((2, 0), ("a", "b"), MeshError, r"`make_mesh` requires positive axis sizes, but got axis_sizes\['b'\]=0"),
        ((-2,), ("a",), MeshError, r"`make_mesh` requires positive axis sizes, but got axis_sizes\['a'\]=-2"),
        ((2.0,), ("a",), TypeError, r"`make_mesh` requires an int for axis size, but got axis size=2.0"),
        ((True,), ("a",), TypeError, r"`make_mesh` requires an int for axis size, but got axis size=True"),
        ((2,), (1,), TypeError, r"`make_mesh` requires str axis names in axis_names, but got name=1"),
        ((2,), None, TypeError, r"`make_mesh` requires a str or a tuple of str for axis_names"),
        ((2, 2), ("a",), MeshError, r"`make_mesh` requires one axis name per size, but got axis_names=\('a',\) "
                                    r"for axis_sizes=\(2, 2\)"),
        ((2, 2), ("a", "a"), MeshError, r"`make_mesh` requires distinct axis names, but got axis_names="
                                        r"\('a', 'a'\); 'a' appears twice"),
        ((2,), ("",), MeshError, r"requires non-empty axis names"),
        ((2,), "", MeshError, r"requires non-empty axis names"),
        ("ab", ("a", "b"), TypeError, r"`make_mesh` requires a tuple of int axis sizes, but got axis_sizes='ab'"),
        (4, ("a",), TypeError, r"`make_mesh` requires a tuple of int axis sizes, but got axis_sizes=4"),
    ],
)
def test_make_mesh_errors(sizes, names, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_mesh(sizes, names)


# -- equality, hashing, sharing, pickling ----------------------------------------------------------

EQUAL = [
    (ABC.flatten(("a", "b")), make_mesh((4, 2), ("a_b", "c"))),
    (DP_TP["dp", "tp"], DP_TP),
    (DP_TP.transpose("tp", "dp").transpose("dp", "tp"), DP_TP),
    (DP_TP.rename({"dp": "x"}).rename({"x": "dp"}), DP_TP),
    (make_mesh((8,), ("w",)).unflatten("w", {"dp": 2, "tp": 4}), DP_TP),
    (make_mesh((2, 1, 2), ("a", "b", "c")).flatten(("a", "c")), make_mesh((4, 1), ("a_c", "b"))),
    (make_mesh((2, 4), ("dp", "tp"), devices=range(8)), DP_TP),
    (ABC["c", "a"].flatten(), ABC.flatten(("c", "a"))["c_a"]),
    (DP_TP.flatten().unflatten("dp_tp", {"dp": 2, "tp": 4}), DP_TP),
]


@pytest.mark.parametrize(("a", "b"), EQUAL)
def test_equal_meshes_equal_hashes(a, b):
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


UNEQUAL = [
    (DP_TP, DP_TP.transpose("tp", "dp")),
    (DP_TP, DP_TP.rename({"dp": "tp", "tp": "dp"})),
    (DP_TP, make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0])),
    (DP_TP, make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))),
    (DP_TP, make_mesh((4, 2), ("dp", "tp"))),
    (DP_TP["tp"], make_mesh((4,), ("tp",))),  # a family is not the single group
    (DP_TP["tp"], DP_TP["dp"].rename({"dp": "tp"})),
]


@pytest.mark.parametrize(("a", "b"), UNEQUAL)
def test_unequal_meshes(a, b):
    assert a != b


def test_mesh_not_equal_to_other_types():
    assert DP_TP != "Mesh(dp=2, tp=4)"
    assert DP_TP != (2, 4)
    assert not (DP_TP == None)  # noqa: E711


@pytest.mark.parametrize("devices", [None, [7, 6, 5, 4, 3, 2, 1, 0], range(8, 16)])
def test_derived_meshes_share_the_device_list(devices):
    m = make_mesh((2, 4), ("dp", "tp"), devices=devices)
    dl = m.device_list
    derived = [
        m["tp"], m["tp", "dp"], m[["dp"]], m.flatten(), m.flatten(("tp", "dp"), name="w"),
        m.unflatten("tp", {"x": 2, "y": 2}), m.transpose("tp", "dp"), m.rename({"dp": "data"}),
        m["tp"].unflatten("tp", {"x": 2, "y": 2})["y"],
    ]
    for d in derived:
        assert d.device_list is dl


PICKLE_CASES = [
    DP_TP,
    DP_TP["tp"],
    ABC.flatten(("c", "a")),
    ABC3.flatten(("a", "c"), name="ac")["ac"],
    make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0]),
    make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))["dp"],
    make_mesh((), ()),
]


@pytest.mark.parametrize("mesh", PICKLE_CASES, ids=repr)
def test_pickle_round_trip(mesh):
    back = pickle.loads(pickle.dumps(mesh))
    assert back == mesh
    assert hash(back) == hash(mesh)
    assert back.axis_names == mesh.axis_names
    assert back.groups().tolist() == mesh.groups().tolist()


def test_pickled_derived_mesh_on_symbolic_devices_is_small():
    big = make_mesh((1024, 1024, 1024), ("dp", "cp", "tp"))  # 2**30 devices, never materialised
    derived = big.flatten(("tp", "dp"), name="w")["w", "cp"].unflatten("cp", {"x": 32, "y": 32})
    data = pickle.dumps(derived)
    assert len(data) < 600, len(data)
    assert pickle.loads(data) == derived


def test_pickle_in_fresh_process_keeps_equality_and_hash():
    # str hashes differ between processes; the hash must be recomputed on load
    mesh = make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 4, 3, 2, 1, 0])["tp"]
    code = (
        "import pickle, sys\n"
        "import functional_mesh as fm\n"
        "m = pickle.loads(sys.stdin.buffer.read())\n"
        "ref = fm.make_mesh((2, 4), ('dp', 'tp'), devices=[7, 6, 5, 4, 3, 2, 1, 0])['tp']\n"
        "print(m == ref, hash(m) == hash(ref), len({m, ref}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(mesh), capture_output=True, check=True)
    assert out.stdout.decode().split() == ["True", "True", "1"]


# -- repr ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mesh", "text"),
    [
        (DP_TP, "Mesh(dp=2, tp=4)"),
        (make_mesh((2, 2, 2), ("dp", "cp", "tp")), "Mesh(dp=2, cp=2, tp=2)"),
        (DP_TP.transpose("tp", "dp"), "Mesh(tp=4, dp=2)"),
        (ABC.flatten(("c", "a")), "Mesh(b=2, c_a=4)"),
        (make_mesh((8,), ("world",)), "Mesh(world=8)"),
    ],
)
def test_repr_exact(mesh, text):
    assert repr(mesh) == text


@pytest.mark.parametrize(
    ("mesh", "pattern"),
    [
        (DP_TP["tp"], r"^Mesh\(tp=4\b.*\b2 groups\b"),
        (DP_TP["dp"], r"^Mesh\(dp=2\b.*\b4 groups\b"),
        (make_mesh((2, 2), ("dp", "tp"), devices=[3, 1, 2, 0]), r"^Mesh\(dp=2, tp=2\b.*\[3, 1, 2, 0\]"),
        (make_mesh((2, 2), ("dp", "tp"), devices=[3, 2, 1, 0]), r"^Mesh\(dp=2, tp=2\b.*3\.\.0 step -1"),
        (make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16)), r"^Mesh\(dp=2, tp=4\b.*8\.\.15"),
    ],
)
def test_repr_mentions_groups_and_devices(mesh, pattern):
    import re

    assert re.search(pattern, repr(mesh)), repr(mesh)
    assert len(repr(mesh)) < 80


def test_repr_of_huge_explicit_mesh_is_short():
    perm = np.random.default_rng(0).permutation(1 << 16)
    m = make_mesh((256, 256), ("dp", "tp"), devices=perm)
    assert repr(m).startswith("Mesh(dp=256, tp=256")
    assert len(repr(m)) < 120
    assert len(repr(m["tp"])) < 120


# -- immutability ----------------------------------------------------------------------------------


@pytest.mark.parametrize("attr", ["axis_names", "axis_sizes", "shape", "size", "ndim", "_axis_names", "_layouts",
                                  "_devices", "_hash", "new_attribute"])
def test_mesh_is_immutable(attr):
    m = make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(AttributeError):
        setattr(m, attr, ("x", "y"))
    assert m == DP_TP
    assert hash(m) == hash(DP_TP)


def test_mesh_attribute_delete_fails():
    m = make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(AttributeError):
        del m._layouts


def test_groups_are_fresh_arrays():
    m = make_mesh((2, 4), ("dp", "tp"))
    g = m.groups()
    if g.flags.writeable:
        g[0, 0, 0] = 99
    assert m.groups()[0, 0, 0] == 0
