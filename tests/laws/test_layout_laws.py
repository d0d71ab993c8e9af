"""Laws of the layout algebra (docs/design.md, "House rules": each algebra docstring's law is a hypothesis test).

Expected values come from brute-force enumeration of the raw modes, never from the code
under test.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from functional_mesh import MeshError
from functional_mesh._layout import (
    Layout,
    complement,
    composition,
    concat,
    decompose,
    groups,
    indices,
    is_injective,
)
from tests.reference import ref_indices as brute
from tests.strategies import any_layouts, factorizations, tiling_layouts


@st.composite
def raw_modes(draw):
    k = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(k))
    stride = tuple(draw(st.integers(0, 15)) for _ in range(k))
    return shape, stride


@given(raw_modes())
def test_coalesce_preserves_the_function(modes):
    shape, stride = modes
    assert indices(Layout(shape, stride)).tolist() == brute(shape, stride)


@given(raw_modes())
def test_canonical_form_is_idempotent_and_has_no_size_one_modes(modes):
    lay = Layout(*modes)
    again = Layout(lay.shape, lay.stride)
    assert again == lay and hash(again) == hash(lay)
    assert 1 not in lay.shape


@given(tiling_layouts(), tiling_layouts())
def test_equal_functions_have_equal_values(a, b):
    # Among tiling layouts (the ones meshes use) the canonical form is unique.
    (la, _), (lb, _) = a, b
    same = indices(la).tolist() == indices(lb).tolist()
    assert (la == lb) == same
    if same:
        assert hash(la) == hash(lb)


@given(tiling_layouts())
def test_complement_is_disjoint_and_covering(case):
    lay, n = case
    comp = complement(lay, n)
    assert lay.size * comp.size == n
    table = groups(lay, n)
    assert sorted(table.reshape(-1).tolist()) == list(range(n))
    # rows in increasing order of their first index (torch's group order)
    firsts = table[:, 0].tolist()
    assert firsts == sorted(firsts)
    # each row is a translate of the layout
    assert all((row - row[0] == indices(lay) - indices(lay)[0]).all() for row in table)


@given(tiling_layouts())
def test_decompose_inverts_the_tiling(case):
    lay, n = case
    comp = complement(lay, n)
    for index in range(n):
        j, i = decompose(lay, n, index)
        assert comp(j) + lay(i) == index


@given(tiling_layouts(), st.data())
def test_composition_law(case, data):
    outer, _ = case
    m = outer.size
    # an inner layout selecting coordinates of `outer`: a subset of a row-major grid over m
    grid = data.draw(factorizations(m, 4).filter(lambda f: math.prod(f) == m) if m > 1 else st.just(()))
    strides = [math.prod(grid[i + 1:]) for i in range(len(grid))]
    picked = data.draw(st.lists(st.sampled_from(range(len(grid))), unique=True)) if grid else []
    inner = Layout(tuple(grid[i] for i in picked), tuple(strides[i] for i in picked))
    try:
        comp = composition(outer, inner)
    except MeshError:
        assume(False)  # not expressible as a layout; the split law below covers existence
    assert [comp(i) for i in range(inner.size)] == [outer(inner(i)) for i in range(inner.size)]


@given(tiling_layouts(), st.data())
def test_composition_with_a_split_of_the_modes_always_exists(case, data):
    outer, _ = case
    # split every mode of `outer` into two factors: the row-major layout over the pieces
    pieces: list[int] = []
    for s in outer.shape:
        d = data.draw(st.sampled_from([k for k in range(1, s + 1) if s % k == 0]))
        pieces += [d, s // d]
    strides = [math.prod(pieces[i + 1:]) for i in range(len(pieces))]
    for s, d in zip(pieces, strides):
        part = composition(outer, Layout((s,), (d,)))
        assert [part(i) for i in range(s)] == [outer(i * d) for i in range(s)]


@given(raw_modes())
def test_is_injective_agrees_with_brute_force(modes):
    values = brute(*modes)
    assert is_injective(Layout(*modes)) == (len(set(values)) == len(values))


@given(st.lists(any_layouts(2), min_size=0, max_size=3))
def test_concat_adds_the_parts(parts):
    whole = concat(*parts)
    sizes = [p.size for p in parts]
    got = indices(whole).tolist()
    expect = [sum(p(c) for p, c in zip(parts, coord)) for coord in itertools.product(*(range(s) for s in sizes))]
    assert got == expect


def test_indices_builds_nothing_larger_than_the_answer():
    lay = Layout((64, 8, 8), (64, 8, 1))
    table = groups(Layout((8,), (8,)), 4096)
    assert indices(lay).shape == (4096,) and table.shape == (512, 8)
    assert np.array_equal(np.sort(table.reshape(-1)), np.arange(4096))
