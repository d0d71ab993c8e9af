"""Values keep their word: immutable, and attrs only where attrs' promises hold (``evolve`` re-validates)."""

from __future__ import annotations

import pickle

import attrs
import pytest

import functional_mesh as fm
from functional_mesh import Layout, MeshError, NamedSharding, P, PartitionSpec, UnknownAxisError

MESH = fm.make_mesh((2, 4), ("dp", "tp"))
VALUES = {
    "Layout": Layout((2, 3), (6, 1)),
    "Mesh": MESH["tp", "dp"],
    "PartitionSpec": P(("dp", "tp"), None, "cp"),
}


@pytest.mark.parametrize("kind", sorted(VALUES))
@pytest.mark.parametrize("attribute", ["modes", "_axis_names", "_layouts", "_hash", "entries", "new_attribute"])
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


def test_partition_spec_equality_and_hash_follow_the_normal_form():
    assert P("dp", None) == P("dp") == P(("dp",)) == PartitionSpec("dp", ())
    assert hash(P("dp", None)) == hash(P(("dp",)))
    assert P("dp") != P("tp") and P("dp") != ("dp",)
    assert pickle.loads(pickle.dumps(P(("dp", "tp"), None, "cp"))) == P(("dp", "tp"), None, "cp")
