"""Laws of the Mesh value: groups partition the devices, transformations invert, orders agree."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
from tests.strategies import derived_meshes, meshes, take_indexes


@given(derived_meshes())
def test_groups_partition_the_devices(mesh):
    table = mesh.groups()
    assert table.shape == (mesh.num_groups, *mesh.axis_sizes)
    assert sorted(table.reshape(-1).tolist()) == sorted(mesh.devices.tolist())


@given(derived_meshes())
def test_coordinate_and_group_of_agree_with_groups(mesh):
    table = mesh.groups()
    rows = {tuple(g.reshape(-1).tolist()) for g in table}
    for rank in mesh.devices.tolist():
        group = mesh.group_of(rank)
        coord = mesh.coordinate(rank)
        assert tuple(group.reshape(-1).tolist()) in rows
        assert group[coord] == rank if coord else group.item() == rank
    outside = int(mesh.devices.max()) + 1
    assert mesh.coordinate(outside) is None and mesh.group_of(outside) is None


@given(meshes(), st.data())
def test_flatten_then_unflatten_is_identity(mesh, data):
    if mesh.ndim == 0:
        return
    i = data.draw(st.integers(0, mesh.ndim - 1))
    j = data.draw(st.integers(i + 1, mesh.ndim))
    names = mesh.axis_names[i:j]
    flat = mesh.flatten(names, name="merged")
    assert flat.axis_size("merged") == int(np.prod([mesh.axis_size(n) for n in names]))
    assert flat.unflatten("merged", {n: mesh.axis_size(n) for n in names}) == mesh


@given(derived_meshes(), st.data())
def test_unflatten_then_flatten_is_identity(mesh, data):
    if mesh.ndim == 0:
        return
    axis = data.draw(st.sampled_from(mesh.axis_names))
    modes = mesh.axis_layout(axis).shape or (1,)
    new = {f"p{k}": s for k, s in enumerate(modes)}
    if set(new) & set(mesh.axis_names):
        return
    assert mesh.unflatten(axis, new).flatten(tuple(new), name=axis) == mesh


@given(derived_meshes(), st.data())
def test_transpose_then_inverse_is_identity(mesh, data):
    perm = data.draw(st.permutations(mesh.axis_names))
    there = mesh.transpose(*perm)
    assert there.transpose(*mesh.axis_names) == mesh
    # and the groups are the numpy transpose of the original ones
    axes = [0] + [1 + mesh.axis_names.index(n) for n in perm]
    assert np.array_equal(there.groups(), mesh.groups().transpose(axes))


@given(derived_meshes(), st.data())
def test_select_order_is_transpose_of_ascending_selection(mesh, data):
    if mesh.ndim == 0:
        return
    k = data.draw(st.integers(1, mesh.ndim))
    chosen = tuple(data.draw(st.permutations(mesh.axis_names))[:k])
    ascending = tuple(n for n in mesh.axis_names if n in chosen)
    assert mesh[chosen] == mesh[ascending].transpose(*chosen)


@given(derived_meshes(), st.data())
def test_flatten_groups_are_the_reshaped_selection(mesh, data):
    if mesh.ndim == 0:
        return
    k = data.draw(st.integers(1, mesh.ndim))
    chosen = tuple(data.draw(st.permutations(mesh.axis_names))[:k])
    sel = mesh[chosen]
    assert np.array_equal(sel.flatten(name="f").groups(), sel.groups().reshape(sel.num_groups, -1))


@given(derived_meshes())
def test_rename_round_trip_and_value_semantics(mesh):
    forward = {n: f"{n}_renamed" for n in mesh.axis_names}
    back = {v: k for k, v in forward.items()}
    assert mesh.rename(forward).rename(back) == mesh
    clone = pickle.loads(pickle.dumps(mesh))
    assert clone == mesh and hash(clone) == hash(mesh) and repr(clone) == repr(mesh)


@given(derived_meshes(), derived_meshes())
def test_equal_meshes_hash_equal(a, b):
    if a == b:
        assert hash(a) == hash(b)
    else:  # unequal values differ in something a user can observe
        assert (a.axis_names, a.axis_sizes, a.groups().tolist(), a.devices.tolist()) != (
            b.axis_names, b.axis_sizes, b.groups().tolist(), b.devices.tolist())


def test_explicit_iota_equals_symbolic_and_shares_no_array():
    a = fm.make_mesh((4, 2), ("x", "y"))
    b = fm.make_mesh((4, 2), ("x", "y"), devices=list(range(8)))
    assert a == b and hash(a) == hash(b) and b.device_list.is_symbolic


@given(derived_meshes())
def test_derived_mesh_equals_its_fresh_construction(mesh):
    # Transformations other than select reuse the parent's complement (the covered indices do
    # not change); rebuilding from the parts recomputes it, and every query must agree.
    fresh = fm.Mesh(mesh.axis_names, [mesh.axis_layout(n) for n in mesh.axis_names], mesh.device_list)
    assert fresh == mesh and fresh.num_groups == mesh.num_groups
    assert np.array_equal(fresh.groups(), mesh.groups())
    for rank in mesh.devices.tolist()[:: max(1, mesh.num_devices // 7)]:
        assert fresh.coordinate(rank) == mesh.coordinate(rank)
        assert np.array_equal(fresh.group_of(rank), mesh.group_of(rank))


@given(derived_meshes(max_size=32), st.data())
def test_axes_size_is_the_size_of_the_selection_and_of_its_flattened_axis(mesh, data):
    """The one product of axis sizes (_mesh.axes_size): 1 for no axes; for axes in any order, the
    size of their selection and of the one axis they flatten to."""
    from functional_mesh._mesh import axes_size

    axes = tuple(data.draw(st.permutations(mesh.axis_names)))[:data.draw(st.integers(0, mesh.ndim))]
    if not axes:
        assert axes_size(mesh, axes) == 1
        return
    assert axes_size(mesh, axes) == mesh[axes].size == mesh[axes].flatten(name="m").axis_size("m")
    assert axes_size(mesh, mesh.axis_names) == mesh.size


# -- take: numpy indexing of the grid of ranks -----------------------------------------------------


def numpy_take(mesh: fm.Mesh, index: dict) -> np.ndarray:
    """``mesh.groups()`` indexed along the named axes by numpy (``np.take``: an int drops the axis)."""
    table = mesh.groups()
    for k in reversed(range(mesh.ndim)):  # from the last axis, so the earlier axes keep their place
        name = mesh.axis_names[k]
        if name in index:
            picked = index[name]
            if isinstance(picked, slice):
                picked = np.arange(mesh.axis_size(name))[picked]
            table = np.take(table, picked, axis=k + 1)
    return table


@given(derived_meshes(), st.data())
def test_take_then_groups_equals_numpy_indexing(mesh, data):
    if mesh.ndim == 0:
        return
    index = data.draw(take_indexes(mesh))
    taken = mesh.take(**index)
    expected = numpy_take(mesh, index)
    assert taken.axis_names == tuple(n for n in mesh.axis_names if not isinstance(index.get(n), int))
    assert np.array_equal(taken.groups(), expected)
    assert taken.num_groups == mesh.num_groups
    for g, group in enumerate(expected):  # every kept rank: its coordinate and group are numpy's
        for coord in np.ndindex(group.shape):
            rank = int(group[coord])
            assert taken.coordinate(rank) == coord
            assert np.array_equal(taken.group_of(rank), group)
    assert sorted(taken.devices.tolist()) == sorted(expected.reshape(-1).tolist())


@given(derived_meshes(), st.data())
def test_a_taken_device_list_is_a_range_exactly_when_its_ranks_form_one(mesh, data):
    if mesh.ndim == 0:
        return
    ranks = mesh.take(**data.draw(take_indexes(mesh))).device_list
    steps = set(np.diff(ranks.to_array()).tolist())
    assert ranks.is_symbolic == (len(steps) <= 1)


@given(derived_meshes(), st.data())
def test_take_commutes_with_selection(mesh, data):
    if mesh.ndim == 0:
        return
    index = data.draw(take_indexes(mesh))
    others = [n for n in mesh.axis_names if n not in index]
    chosen = tuple(data.draw(st.permutations([*index, *others[:data.draw(st.integers(0, len(others)))]])))
    kept = tuple(n for n in chosen if not isinstance(index.get(n), int))
    first_take = mesh.take(**index)[kept] if kept else None
    first_select = mesh[chosen].take(**index)
    if first_take is None:  # every chosen axis dropped: each group of the selection keeps one rank
        assert first_select.ndim == 0
        return
    assert first_take.axis_names == first_select.axis_names
    # the same groups; the families may list them in another order (each over its own device list)
    assert sorted(map(tuple, first_take.groups().reshape(first_take.num_groups, -1).tolist())) == sorted(
        map(tuple, first_select.groups().reshape(first_select.num_groups, -1).tolist()))


@given(derived_meshes(), st.data())
def test_take_commutes_with_transpose(mesh, data):
    if mesh.ndim == 0:
        return
    index = data.draw(take_indexes(mesh))
    perm = tuple(data.draw(st.permutations(mesh.axis_names)))
    kept = tuple(n for n in perm if not isinstance(index.get(n), int))
    a = mesh.take(**index).transpose(*kept)
    b = mesh.transpose(*perm).take(**index)
    assert a.axis_names == b.axis_names and np.array_equal(a.groups(), b.groups())
    for rank in b.devices.tolist():
        assert a.coordinate(rank) == b.coordinate(rank)
