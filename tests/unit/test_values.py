"""Values keep their word: immutable, and attrs only where attrs' promises hold (``evolve`` re-validates).

``Mesh``, ``DeviceRange`` and ``NamedSharding`` are frozen attrs classes; ``Layout``, ``DeviceArray``,
``MeshShape`` and ``PartitionSpec`` are hand-built on ``_validate.Frozen`` (docs/design.md, "House rules",
says why each).
"""

from __future__ import annotations

import pickle
import re

import attrs
import pytest

import functional_mesh as fm
from functional_mesh import Layout, MeshError, NamedSharding, P, PartitionSpec, UnknownAxisError
from functional_mesh._devices import DeviceList

MESH = fm.make_mesh((2, 4), ("dp", "tp"))
VALUES = {
    "DeviceArray": fm.make_mesh((2, 4), ("dp", "tp"), devices=[7, 6, 5, 0, 1, 2, 3, 4]).device_list,
    "Layout": Layout((2, 3), (6, 1)),
    "PartitionSpec": P(("dp", "tp"), None, "cp"),
}
ATTRS_VALUES = {
    "DeviceRange": MESH["tp", "dp"].device_list,
    "Mesh": MESH["tp", "dp"],
    "NamedSharding": NamedSharding(MESH, P("dp")),
}


@pytest.mark.parametrize("kind", sorted(VALUES))
@pytest.mark.parametrize("attribute", ["modes", "_axis_names", "_layouts", "_hash", "entries", "new_attribute",
                                       "_n", "_start", "_step", "_array", "_inverse", "_items"])
def test_hand_built_values_refuse_assignment_and_deletion(kind, attribute):
    value = VALUES[kind]
    copy = pickle.loads(pickle.dumps(value))
    with pytest.raises(AttributeError, match=f"{kind} is read-only"):
        setattr(value, attribute, ())
    with pytest.raises(AttributeError, match=f"{kind} is read-only"):
        delattr(value, attribute)
    assert value == copy and hash(value) == hash(copy)
    assert not hasattr(value, "__dict__")


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_hand_built_values_do_not_claim_to_be_attrs_classes(kind):
    # attrs.evolve would call the constructor by field name, which these constructors don't take
    assert not attrs.has(type(VALUES[kind]))


@pytest.mark.parametrize("kind", sorted(ATTRS_VALUES))
@pytest.mark.parametrize("attribute", ["_axis_names", "_layouts", "_devices", "_hash", "_n", "_start", "mesh", "spec",
                                       "new_attribute"])
def test_attrs_values_refuse_assignment_and_deletion(kind, attribute):
    value = ATTRS_VALUES[kind]
    copy = pickle.loads(pickle.dumps(value))
    assert attrs.has(type(value)) and type(value).__name__ == kind
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, attribute, ())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        delattr(value, attribute)
    assert value == copy and hash(value) == hash(copy)
    assert not hasattr(value, "__dict__")


def test_mesh_is_a_real_attrs_class_and_evolve_revalidates():
    mesh = MESH["tp", "dp"]
    assert attrs.evolve(mesh, axis_names=("a", "b")) == MESH.rename({"tp": "a", "dp": "b"})["a", "b"]
    renamed = attrs.evolve(mesh, axis_names=["x", "y"])  # the constructor's conversion: a list of names
    assert renamed.axis_names == ("x", "y") and renamed.groups().tolist() == mesh.groups().tolist()
    moved = attrs.evolve(MESH, devices=range(8, 16))
    assert moved == fm.make_mesh((2, 4), ("dp", "tp"), devices=range(8, 16))
    assert moved.ranks.tolist()[0] == [8, 9, 10, 11]
    with pytest.raises(MeshError, match=r"^`Mesh` requires distinct axis names, but got axis_names=\('a', 'a'\)"):
        attrs.evolve(mesh, axis_names=("a", "a"))
    with pytest.raises(MeshError, match=r"^`Mesh` requires axes that do not overlap and tile the 8 devices"):
        attrs.evolve(mesh, layouts=(Layout(4, 1), Layout(2, 1)))
    with pytest.raises(MeshError, match=r"tile the 6 devices"):
        attrs.evolve(mesh, devices=range(6))
    with pytest.raises(MeshError, match=r"^`Mesh` requires distinct devices, but got duplicate device=1$"):
        attrs.evolve(mesh, devices=[0, 1, 1, 2, 3, 4, 5, 6])
    with pytest.raises(TypeError, match=r"^`Mesh` requires a Layout per axis"):
        attrs.evolve(mesh, layouts=((4, 1), (2, 4)))


def test_device_range_is_a_real_attrs_class_and_evolve_revalidates():
    dl = fm.make_mesh((8,), ("w",), devices=range(14, -1, -2)).device_list
    assert attrs.evolve(dl, n=4).to_array().tolist() == [14, 12, 10, 8]
    assert attrs.evolve(dl, n=1, step=5) == fm.make_mesh((1,), ("w",), devices=[14]).device_list  # normal form
    assert hash(attrs.evolve(dl, step=-2)) == hash(dl)
    with pytest.raises(MeshError, match=r"^`DeviceRange` requires a non-zero step \(distinct ranks\), but got step=0"):
        attrs.evolve(dl, step=0)
    with pytest.raises(MeshError, match=r"^`DeviceRange` requires non-negative global ranks, but got devices='14..-4"):
        attrs.evolve(dl, n=10)
    with pytest.raises(MeshError, match=r"^`DeviceRange` requires a non-negative number of devices, but got n=-1$"):
        attrs.evolve(dl, n=-1)
    with pytest.raises(TypeError, match=r"^`DeviceRange` requires an int for start, but got start=1.5$"):
        attrs.evolve(dl, start=1.5)


def test_named_sharding_is_a_real_attrs_class_and_evolve_revalidates():
    sh = NamedSharding(MESH, P("dp"))
    assert attrs.has(NamedSharding)
    assert attrs.evolve(sh, spec=P("tp", "dp")) == NamedSharding(MESH, P("tp", "dp"))
    assert attrs.evolve(sh, spec=("tp",)) == NamedSharding(MESH, P("tp"))  # the constructor's conversion
    with pytest.raises(UnknownAxisError, match="did you mean 'tp'"):
        attrs.evolve(sh, spec=P("tpp"))
    with pytest.raises(MeshError, match="each mesh axis at most once"):
        attrs.evolve(sh, spec=P("dp", "dp"))
    with pytest.raises(UnknownAxisError, match="axis='dp'"):
        attrs.evolve(sh, mesh=MESH.rename({"dp": "data"}))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        sh.spec = P()


@pytest.mark.parametrize("devices", [None, [7, 6, 5, 0, 1, 2, 3, 4]], ids=["range", "array"])
def test_the_device_list_is_read_only_all_the_way_down(devices):
    # issue: ``mesh.device_list._n = 3`` silently changed every mesh derived from the list
    mesh = fm.make_mesh((2, 4), ("dp", "tp"), devices=devices)
    derived = [mesh, mesh["tp"], mesh.flatten(), mesh.transpose("tp", "dp"), mesh.unflatten("tp", {"a": 2, "b": 2})]
    before = [(m.groups().tolist(), m.num_devices, m.coordinate(5), hash(m), repr(m)) for m in derived]
    dl = mesh.device_list
    kind = "DeviceRange" if devices is None else "DeviceArray"
    assert type(dl).__name__ == kind and isinstance(dl, DeviceList)
    # a range is an attrs class (FrozenInstanceError, an AttributeError); an array list is hand-built
    setting, deleting = ("can't set attribute", "can't set attribute") if devices is None else (
        "DeviceArray is read-only: cannot set '", "DeviceArray is read-only: cannot delete '")
    for name, value in [("_n", 3), ("_start", 1), ("_step", 2), ("_array", None), ("_hash", 0), ("_inverse", None)]:
        with pytest.raises(AttributeError, match=re.escape(setting) + ("" if devices is None else name)):
            setattr(dl, name, value)
        with pytest.raises(AttributeError, match=re.escape(deleting) + ("" if devices is None else name)):
            delattr(dl, name)
    for array in (mesh.devices, dl.to_array()):  # the list's own ranks (groups() is a fresh array)
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 3
    assert dl.index_of(5) is not None  # fills the lazy inverse of an array list: no assignment from outside
    assert [(m.groups().tolist(), m.num_devices, m.coordinate(5), hash(m), repr(m)) for m in derived] == before
    assert mesh.device_list is dl and dl == pickle.loads(pickle.dumps(dl))


def test_mesh_shape_is_read_only():
    shape = MESH.shape
    with pytest.raises(AttributeError, match="MeshShape is read-only"):
        shape._items = {"dp": 3}  # type: ignore[misc]
    with pytest.raises(TypeError):
        shape._items["dp"] = 3  # type: ignore[index]
    with pytest.raises(TypeError):
        shape["dp"] = 3  # type: ignore[index]
    assert MESH.shape == {"dp": 2, "tp": 4} and pickle.loads(pickle.dumps(shape)) == shape
    assert list(pickle.loads(pickle.dumps(MESH.transpose("tp", "dp").shape))) == ["tp", "dp"]


def test_partition_spec_equality_and_hash_follow_the_entries_as_written():
    # JAX: P("x") != P("x", None). A trailing None asks for one more dim (P(None) does not fit a
    # 0-d tensor, P() does), so specs that differ in trailing Nones are different values.
    assert P("dp", None) == PartitionSpec(("dp",), ()) and hash(P("dp", None)) == hash(P(("dp",), None))
    assert P("dp") == P(("dp",)) and P(None) == P(()) and P(["dp", "tp"]) == P(("dp", "tp"))
    assert P("dp", None) != P("dp") and P(None) != P() and P(None, None) != P(None)
    assert hash(P(None)) != hash(P()) and hash(P("dp", None)) != hash(P("dp"))
    assert P("dp") != P("tp") and P("dp") != ("dp",)
    assert pickle.loads(pickle.dumps(P(("dp", "tp"), None, "cp"))) == P(("dp", "tp"), None, "cp")
    assert pickle.loads(pickle.dumps(P("dp", None))) == P("dp", None) != P("dp")
    assert NamedSharding(MESH, P(None)) != NamedSharding(MESH, P())
    assert NamedSharding(MESH, P("dp", None)) == NamedSharding(MESH, P(("dp",), ()))


SPECS = [P(), P(None), P(()), P(None, None), P("dp"), P(("dp",)), P("dp", None), P(("dp",), ()), P(None, "tp"),
         P((), "tp"), P(("dp", "tp")), P(["dp", "tp"]), P(("dp", "tp"), None), P("tp", "dp"), P("tp", "dp", None)]


@pytest.mark.parametrize("a", SPECS, ids=repr)
@pytest.mark.parametrize("b", SPECS, ids=repr)
def test_equal_specs_are_interchangeable(a, b):
    """Equal specs, and equal shardings, answer every question the same way (and only they are equal)."""
    assert (a == b) == (tuple(a) == tuple(b))
    if a != b:
        return
    assert hash(a) == hash(b) and len(a) == len(b) and repr(a) == repr(b) and a.entries == b.entries
    sa, sb = NamedSharding(MESH, a), NamedSharding(MESH, b)
    assert sa == sb and hash(sa) == hash(sb) and repr(sa) == repr(sb)
    for shape in [(), (8,), (8, 4), (8, 4, 2)]:
        outcomes = []
        for sh in (sa, sb):
            try:
                outcomes.append((sh.shard_shape(shape), sh.local_slices(shape, 5), sh.devices_indices_map(shape)))
            except MeshError as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1], (a, b, shape)
