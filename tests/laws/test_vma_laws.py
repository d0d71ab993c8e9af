"""Laws of the varying-axes types (functional_mesh._vma): the join, the casts, the collectives' rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functional_mesh import VmaError
from functional_mesh import _vma as V

AXES = ["a", "b", "c", "d"]
types = st.frozensets(st.sampled_from(AXES))


def join(*ts):
    return V.default_rule(list(ts)).result


@given(types, types)
def test_join_is_commutative(s, t):
    assert join(s, t) == join(t, s)


@given(types, types, types)
def test_join_is_associative(s, t, u):
    assert join(join(s, t), u) == join(s, join(t, u)) == join(s, t, u)


@given(types)
def test_join_is_idempotent_and_has_the_invariant_type_as_unit(s):
    assert join(s, s) == s
    assert join(s, frozenset()) == s
    assert join() == frozenset()  # a factory: invariant


@given(st.lists(types, max_size=5))
def test_casts_equalise_the_operands_and_only_add_axes(operands):
    rule = V.default_rule(operands)
    assert len(rule.casts) == len(operands)
    for t, cast in zip(operands, rule.casts, strict=True):
        assert t | cast == rule.result  # after its cast, every operand has the result's type
        assert not (t & cast)  # a cast never names an axis the operand already varies over


@given(types, types.filter(bool))
def test_psum_removes_exactly_its_axes_and_casts_the_invariant_ones(t, axes):
    if (t & axes) and (axes - t):  # varying over some of the axes, invariant over others: JAX refuses
        for rule in (V.psum_rule, V.psum_scatter_rule, V.pmax_rule):
            with pytest.raises(VmaError, match="varies over all of these axes or over none"):
                rule("psum", V.AxisTypes(t), axes, {})
        return
    rule = V.psum_rule("psum", V.AxisTypes(t), axes, {})
    assert rule.result == t - axes and not rule.unreduced
    assert rule.casts == (axes - t,)  # psum of an invariant value is n * x: cast first
    assert V.pmax_rule("pmax", V.AxisTypes(t), axes, {}) == rule  # pmax/pmin are typed as psum
    scatter = V.psum_scatter_rule("psum_scatter", V.AxisTypes(t), axes, {})
    assert scatter.result == t | axes and scatter.casts == (axes - t,)


@given(types, types.filter(bool))
def test_spreading_collectives_make_the_result_vary_over_their_axes(t, axes):
    types = V.AxisTypes(t)
    for rule in (V.spread_rule("ppermute", types, axes, {}), V.gather_rule("all_gather", types, axes, {"to": "varying"})):
        assert rule.result == t | axes and rule.casts == (axes - t,)
    inv = V.gather_rule("all_gather", types, axes, {"to": "invariant"})
    assert inv.result == t - axes and inv.casts == (axes - t,)


@given(types, types.filter(bool))
def test_pvary_needs_an_invariant_operand(t, axes):
    if t & axes:
        with pytest.raises(VmaError, match="already varies over"):
            V.pvary_rule("pvary", V.AxisTypes(t), axes, {})
    else:
        rule = V.pvary_rule("pvary", V.AxisTypes(t), axes, {})
        assert rule.result == t | axes and rule.casts == (frozenset(),)


@given(st.lists(types, max_size=4), types)
def test_random_ops_vary_over_the_whole_mesh(operands, mesh_axes):
    mesh_axes = mesh_axes | frozenset().union(*operands)
    rule = V.random_rule(operands, mesh_axes)
    assert rule.result == mesh_axes
    assert all(t | c == mesh_axes for t, c in zip(operands, rule.casts, strict=True))


@given(types, types)
def test_a_write_is_legal_exactly_when_the_written_tensor_covers_the_result(written, result):
    if result <= written:
        V.check_write("add_", written, result)
    else:
        with pytest.raises(VmaError, match="write `x = x \\+ y`"):
            V.check_write("add_", written, result)


def test_axis_index_varies_over_exactly_its_axes():
    assert V.axis_index_rule("axis_index", V.INVARIANT, frozenset({"a", "b"}), {}).result == {"a", "b"}


# -- pending sums: the same rules, the same one type value --------------------------------------------------

pending_types = st.builds(lambda v, u: V.AxisTypes(v - u, u), types, types)


@given(pending_types, types.filter(bool))
def test_psum_ends_a_pending_sum_over_its_axes_and_keeps_the_others(t, axes):
    mixed = (axes & t.unreduced) and (axes - t.unreduced)
    if mixed or ((t.varying | t.unreduced) & axes and axes - t.varying - t.unreduced):
        for rule in (V.psum_rule, V.psum_scatter_rule):
            with pytest.raises(VmaError, match="one state over all of these axes|varies over all of these axes"):
                rule("psum", t, axes, {})
        return
    rule = V.psum_rule("psum", t, axes, {})
    assert rule.result == t.varying - axes and rule.unreduced == t.unreduced - axes
    scatter = V.psum_scatter_rule("psum_scatter", t, axes, {})
    assert scatter.result == t.varying | axes and scatter.unreduced == t.unreduced - axes


@given(pending_types.filter(lambda t: bool(t.unreduced)), types.filter(bool))
def test_the_collectives_that_move_or_compare_terms_refuse_a_pending_sum(t, axes):
    for rule, params in ((V.spread_rule, {}), (V.gather_rule, {"to": "varying"}), (V.gather_rule, {"to": "invariant"}),
                         (V.pmax_rule, {})):
        with pytest.raises(VmaError, match="requires a value that is not unreduced"):
            rule("op", t, axes, params)


def test_pmax_of_a_pending_sum_names_the_api_the_axes_and_the_valid_choices():
    with pytest.raises(VmaError, match=r"`pmin` over \('tp',\) requires a value that is not unreduced \(valid: "
                                       r"varying or invariant over every axis\), but got one unreduced over \('tp',\) "
                                       r".*no min of their sum\); reduce first: psum .* then `pmin`"):
        V.pmax_rule("pmin", V.AxisTypes(frozenset(), frozenset({"tp"})), frozenset({"tp"}), {})


def test_the_type_error_is_a_mesh_error_never_a_type_error():
    assert issubclass(VmaError, ValueError) and not issubclass(VmaError, TypeError)


def test_the_out_specs_error_lists_every_failure_with_its_fix():
    err = V.out_specs_error([("out_specs[0]", frozenset({"y"}), frozenset(), "P()"),
                             ("out_specs[1]['w']", frozenset({"x", "y"}), frozenset({"x"}), "P('x')")], ("x", "y"))
    text = str(err)
    assert "2 results still vary (mesh axes ('x', 'y'))" in text
    assert "out_specs[0]: varies over frozenset({'y'}), but its out_spec P() does not name 'y'; psum or " \
           "all_gather over 'y', or name 'y' in out_specs" in text
    assert "out_specs[1]['w']: varies over frozenset({'x', 'y'}), but its out_spec P('x') does not name 'y'" in text
