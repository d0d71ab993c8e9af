"""Laws of sharding values: shards tile the tensor; tuple specs equal specs on the flatten."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh._sharding import placement_plan
from tests.strategies import derived_meshes


@st.composite
def shardings(draw):
    mesh = draw(derived_meshes(max_size=32))
    rank = draw(st.integers(1, 3))
    names = list(draw(st.permutations(mesh.axis_names)))
    entries: list[object] = []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(names))))
        taken, names = names[:k], names[k:]
        entries.append(None if not taken else taken[0] if k == 1 and draw(st.booleans()) else tuple(taken))
    shape = tuple(draw(st.integers(0, 9)) for _ in range(rank))
    return fm.NamedSharding(mesh, fm.P(*entries)), shape


@given(shardings())
def test_local_slices_tile_the_tensor_replication_factor_times(case):
    sh, shape = case
    used = {n for d in range(len(sh.spec)) for n in sh.spec.axes_of(d)}
    replication = math.prod(s for n, s in sh.mesh.shape.items() if n not in used) * sh.mesh.num_groups
    count = np.zeros(shape, dtype=np.int64)
    for rank, slices in sh.devices_indices_map(shape).items():
        assert slices == sh.local_slices(shape, rank)
        count[slices] += 1
        assert all(sl.stop - sl.start <= m for sl, m in zip(slices, sh.shard_shape(shape)))
    assert (count == replication).all()


@given(derived_meshes(max_size=32), st.data())
def test_tuple_spec_equals_the_flattened_axis_on_divisible_dims(mesh, data):
    if mesh.ndim < 2:
        return
    axes = tuple(data.draw(st.permutations(mesh.axis_names))[:2])
    size = math.prod(mesh.axis_size(a) for a in axes)
    n = size * data.draw(st.integers(0, 3))
    flat = mesh.flatten(axes, name="merged")
    a = fm.NamedSharding(mesh, fm.P(None, axes))
    b = fm.NamedSharding(flat, fm.P(None, "merged"))
    assert a.devices_indices_map((3, n)) == b.devices_indices_map((3, n))


def test_uneven_tuple_splits_nested_like_dtensor():
    # docs/design.md "Sharding": 5 over (2, 2) gives 2, 1, 1, 1 (the flattened axis of 4 would give 2, 2, 1, 0)
    mesh = fm.make_mesh((2, 2), ("a", "b"))
    sizes = [sl[0].stop - sl[0].start for sl in fm.NamedSharding(mesh, fm.P(("a", "b"))).devices_indices_map((5,)).values()]
    assert sizes == [2, 1, 1, 1]


# -- equal specs are interchangeable ---------------------------------------------------------------


def _spell(draw, entry: object) -> object:
    """Another way to write the same entry: None as (), a name as a 1-tuple, a tuple as a list."""
    if entry is None:
        return draw(st.sampled_from([None, ()]))
    if isinstance(entry, str):
        return draw(st.sampled_from([entry, (entry,), [entry]]))
    return draw(st.sampled_from([entry, list(entry)]))


@st.composite
def spec_pairs(draw):
    """A sharding's mesh and two specs: the same entries spelt two ways, each with 0-2 trailing Nones."""
    sh, _ = draw(shardings())
    entries = list(sh.spec)
    a = fm.P(*[_spell(draw, e) for e in entries], *[None] * draw(st.integers(0, 2)))
    b = fm.P(*[_spell(draw, e) for e in entries], *[None] * draw(st.integers(0, 2)))
    return sh.mesh, a, b


def _answers(sh: fm.NamedSharding, shape: tuple[int, ...]) -> object:
    try:
        return sh.shard_shape(shape), sh.devices_indices_map(shape), placement_plan(sh)
    except fm.MeshError as e:
        return str(e)


@given(spec_pairs(), st.integers(0, 9))
def test_equal_specs_are_interchangeable(case, n):
    """a == b exactly when they are written alike, trailing Nones included (as in JAX); equal specs
    answer every question alike; specs that differ only in trailing Nones split every tensor that
    both fit alike, and only the longer one refuses a tensor of lower rank."""
    mesh, a, b = case
    assert (a == b) == (len(a) == len(b))
    assert a.entries == b.entries
    sa, sb = fm.NamedSharding(mesh, a), fm.NamedSharding(mesh, b)
    assert (sa == sb) == (a == b)
    for rank in range(max(len(a), len(b)) + 2):
        shape = (n,) * rank
        ans_a, ans_b = _answers(sa, shape), _answers(sb, shape)
        if a == b or rank >= max(len(a), len(b)):
            assert ans_a == ans_b, (a, b, shape)
        else:  # only the longer spec asks for more dims than the tensor has
            assert isinstance(ans_a if len(a) > len(b) else ans_b, str)
    if a == b:
        assert hash(a) == hash(b) and tuple(a) == tuple(b) and repr(a) == repr(b)
        assert hash(sa) == hash(sb) and repr(sa) == repr(sb)
