"""mesh_from_order / order_axes against an independent re-derivation of Megatron's rule.

``megatron_groups`` below re-derives, from the rule Megatron-core documents for
``RankGenerator.get_ranks`` (``generate_masked_orthogonal_rank_groups``), the rank groups of a
token with plain integer loops: no numpy, no layouts, nothing from functional_mesh. The rule:
dimensions are listed in order-string order, the leftmost varies fastest, so dimension ``i``
has stride ``prod(sizes[:i])``; a token masks some dimensions; groups are enumerated by an
index over the *unmasked* dimensions (first fastest), and inside a group ranks are enumerated
over the *masked* dimensions (first fastest).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import MeshError, UnknownAxisError


def _digits_first_fastest(index: int, sizes: list[int]) -> list[int]:
    out = []
    for s in sizes:
        out.append(index % s)
        index //= s
    return out


def megatron_groups(order: list[str], sizes: dict[str, int], token: list[str], offset: int = 0) -> list[list[int]]:
    ordered = [sizes[t] for t in order]
    strides = []
    acc = 1
    for s in ordered:
        strides.append(acc)
        acc *= s
    world = acc
    masked = [i for i, t in enumerate(order) if t in token]
    unmasked = [i for i, t in enumerate(order) if t not in token]
    group_size = 1
    for i in masked:
        group_size *= ordered[i]
    groups = []
    for g in range(world // group_size):
        base_digits = _digits_first_fastest(g, [ordered[i] for i in unmasked])
        base = sum(d * strides[i] for d, i in zip(base_digits, unmasked))
        group = []
        for r in range(group_size):
            digits = _digits_first_fastest(r, [ordered[i] for i in masked])
            group.append(offset + base + sum(d * strides[i] for d, i in zip(digits, masked)))
        groups.append(group)
    return groups


def ours(mesh: fm.Mesh, token: list[str]) -> list[list[int]]:
    axes = fm.order_axes(mesh, "-".join(token))
    family = mesh.flatten(axes, name="token")["token"]
    return family.groups().reshape(family.num_groups, -1).tolist()


def test_the_rule_itself_on_the_megatron_docstring_example():
    # Megatron's own docstring case: tp=2, dp=4 (order tp-dp) on 8 ranks, tp groups are
    # consecutive pairs and dp groups stride 2. A check that the re-derivation is the rule.
    assert megatron_groups(["tp", "dp"], {"tp": 2, "dp": 4}, ["tp"]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert megatron_groups(["tp", "dp"], {"tp": 2, "dp": 4}, ["dp"]) == [[0, 2, 4, 6], [1, 3, 5, 7]]


DEFAULT = "tp-cp-ep-dp-pp"
TOKENS = ["tp", "cp", "dp", "pp", "ep", "dp-cp", "tp-cp", "tp-pp", "tp-dp-cp", "tp-dp", "cp-pp", "tp-ep-pp",
          "tp-cp-ep-dp-pp"]


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize("sizes", [dict(tp=2, cp=2, ep=1, dp=2, pp=2), dict(tp=4, cp=1, ep=2, dp=2, pp=2),
                                   dict(tp=2, cp=3, ep=1, dp=2, pp=1)])
def test_groups_of_every_token_equal_megatron_for_the_default_order(sizes, token):
    mesh = fm.mesh_from_order(DEFAULT, **sizes)
    assert ours(mesh, token.split("-")) == megatron_groups(DEFAULT.split("-"), sizes, token.split("-"))


def test_single_axis_groups_are_the_plain_axis_groups():
    sizes = dict(tp=2, cp=2, ep=1, dp=2, pp=2)
    mesh = fm.mesh_from_order(DEFAULT, **sizes)
    for name in sizes:
        assert mesh[name].groups().reshape(-1, sizes[name]).tolist() == megatron_groups(
            DEFAULT.split("-"), sizes, [name])


@st.composite
def orders_and_tokens(draw):
    names = draw(st.permutations(["tp", "cp", "ep", "dp", "pp"]))
    n = draw(st.integers(2, 5))
    order = list(names[:n])
    sizes = {t: draw(st.integers(1, 3)) for t in order}
    token = draw(st.lists(st.sampled_from(order), min_size=1, max_size=n, unique=True))
    offset = draw(st.integers(0, 5))
    return order, sizes, token, offset


@given(orders_and_tokens())
def test_any_order_any_token_any_offset_equals_megatron(case):
    order, sizes, token, offset = case
    world = 1
    for s in sizes.values():
        world *= s
    mesh = fm.mesh_from_order("-".join(order), devices=range(offset, offset + world), **sizes)
    assert ours(mesh, token) == megatron_groups(order, sizes, token, offset)


def test_token_order_does_not_matter():
    mesh = fm.mesh_from_order(DEFAULT, tp=2, cp=2, ep=1, dp=2, pp=2)
    for perm in itertools.permutations(["tp", "dp", "cp"]):
        assert fm.order_axes(mesh, "-".join(perm)) == ("dp", "cp", "tp")


def test_axes_left_out_of_the_order_must_have_size_one_and_become_outermost():
    mesh = fm.mesh_from_order("tp-dp", tp=2, dp=2, ep=1)
    assert mesh.axis_names == ("ep", "dp", "tp")
    with pytest.raises(MeshError, match=r"`mesh_from_order` requires size 1 for an axis not in the order "
                                        r"\('tp-dp'\), but got ep=2; add 'ep' to the order"):
        fm.mesh_from_order("tp-dp", tp=2, dp=2, ep=2)


@pytest.mark.parametrize("order, sizes, message", [
    ("tp-dp", dict(tp=2), r"no size for \['dp'\]"),
    ("tp--dp", dict(tp=2, dp=2), r"non-empty tokens.*order='tp--dp'"),
    ("", dict(tp=2), r"non-empty tokens.*order=''"),
    ("tp-dp-tp", dict(tp=2, dp=2), r"each token once.*repeated: \['tp'\]"),
    ("tp-dp", dict(tp=0, dp=2), r"positive axis sizes.*axis_sizes\['tp'\]=0"),
])
def test_bad_orders_raise_mesh_error_naming_the_value(order, sizes, message):
    with pytest.raises(MeshError, match=message):
        fm.mesh_from_order(order, **sizes)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match=r"order=\['tp'\]"):
        fm.mesh_from_order(["tp"], tp=2)
    with pytest.raises(TypeError, match=r"axis size"):
        fm.mesh_from_order("tp", tp=2.0)
    with pytest.raises(TypeError, match=r"mesh='tp'"):
        fm.order_axes("tp", "tp")


def test_an_unknown_token_names_the_mesh_axes():
    mesh = fm.mesh_from_order("tp-dp", tp=2, dp=2)
    with pytest.raises(UnknownAxisError, match=r"axis='tpp'; valid: \('dp', 'tp'\); did you mean 'tp'\?"):
        fm.order_axes(mesh, "tpp-dp")
