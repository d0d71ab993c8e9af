"""Laws of sharding values: shards tile the tensor; tuple specs equal specs on the flatten."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
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
