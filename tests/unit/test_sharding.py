"""Sharding values: JAX's verified index maps, normalisation, and error messages."""

from __future__ import annotations

import pytest

import functional_mesh as fm
from functional_mesh import MeshError, NamedSharding, P

MESH = fm.make_mesh((4, 2), ("x", "y"))


def rows_cols(sl):
    return (sl[0].start, sl[0].stop, sl[1].start, sl[1].stop)


# verified with JAX 0.10.2 on a (4, 2) mesh, global shape (8, 4)
@pytest.mark.parametrize(
    ("spec", "shard_shape", "expected"),
    [
        (P("x", "y"), (2, 2), {0: (0, 2, 0, 2), 1: (0, 2, 2, 4), 2: (2, 4, 0, 2)}),
        (P("y", "x"), (4, 1), {0: (0, 4, 0, 1), 1: (4, 8, 0, 1), 2: (0, 4, 1, 2), 3: (4, 8, 1, 2)}),
        (P(("x", "y"), None), (1, 4), {k: (k, k + 1, 0, 4) for k in range(8)}),
        (P(("y", "x"), None), (1, 4), {0: (0, 1, 0, 4), 1: (4, 5, 0, 4), 2: (1, 2, 0, 4), 3: (5, 6, 0, 4),
                                        4: (2, 3, 0, 4), 5: (6, 7, 0, 4), 6: (3, 4, 0, 4), 7: (7, 8, 0, 4)}),
        (P("x", None), (2, 4), {0: (0, 2, 0, 4), 1: (0, 2, 0, 4), 2: (2, 4, 0, 4)}),
        (P(None, "y"), (8, 2), {0: (0, 8, 0, 2), 1: (0, 8, 2, 4), 2: (0, 8, 0, 2)}),
        (P(), (8, 4), {k: (0, 8, 0, 4) for k in range(8)}),
    ],
)
def test_index_maps_equal_jax(spec, shard_shape, expected):
    sh = NamedSharding(MESH, spec)
    assert sh.shard_shape((8, 4)) == shard_shape
    got = {r: rows_cols(s) for r, s in sh.devices_indices_map((8, 4)).items()}
    assert {r: got[r] for r in expected} == expected
    assert sh.is_fully_replicated == (spec == P())


def test_spec_normalisation():
    assert P("x", None, None) != P("x") and P("x", None, None).entries == P("x").entries == ("x",)
    assert P(("x",)) == P("x") and P(()) == P(None) != P() and hash(P(("x",), ())) == hash(P("x", None))
    assert P(["x", "y"]) == P(("x", "y"))
    assert repr(P(("dp", "cp"), "tp")) == "P(('dp', 'cp'), 'tp')"


def test_uneven_and_empty_shards_follow_torch_chunk():
    sh = NamedSharding(fm.make_mesh((4,), ("x",)), P("x"))
    # torch.chunk(arange(5), 4) -> sizes 2, 2, 1, 0 (the last chunk empty)
    assert [s[0] for s in sh.devices_indices_map((5,)).values()] == [slice(0, 2), slice(2, 4), slice(4, 5),
                                                                      slice(5, 5)]
    assert sh.shard_shape((5,)) == (2,) and sh.shard_shape((0,)) == (0,)


def test_family_mesh_maps_every_rank_and_outsiders_get_none():
    tp = fm.make_mesh((2, 4), ("dp", "tp"))["tp"]
    sh = NamedSharding(tp, P("tp"))
    m = sh.devices_indices_map((8,))
    assert sorted(m) == list(range(8)) and m[1] == m[5] == (slice(2, 4),)
    assert sh.local_slices((8,), 11) is None


def test_errors_name_the_bad_value():
    with pytest.raises(KeyError, match=r"`NamedSharding` requires an axis name of the mesh, but got axis='xx'.*did you mean 'x'"):
        NamedSharding(MESH, P("xx"))
    with pytest.raises(MeshError, match=r"each mesh axis at most once in the spec.*axis 'x' splits dims 0 and 1"):
        NamedSharding(MESH, P("x", ("y", "x")))
    with pytest.raises(MeshError, match=r"at least as many dims as the spec \(2\), but got global_shape=\(8,\)"):
        NamedSharding(MESH, P("x", "y")).shard_shape((8,))
    with pytest.raises(MeshError, match=r"non-negative dim sizes, but got global_shape\[0\]=-1"):
        NamedSharding(MESH, P("x")).local_slices((-1,), 0)
    with pytest.raises(MeshError, match=r"a non-negative global rank, but got rank=-1"):
        NamedSharding(MESH, P("x")).local_slices((8,), -1)
    with pytest.raises(TypeError, match=r"None, an axis name or a tuple of axis names per dim, but got entry=3"):
        P(3)
    with pytest.raises(TypeError, match=r"a PartitionSpec, but got spec='x'"):
        NamedSharding(MESH, "x")
    with pytest.raises(TypeError, match=r"an int for dim size"):
        NamedSharding(MESH, P("x")).shard_shape((8.0,))


def test_jax_012_keywords_reduced_and_unreduced_kind():
    # JAX 0.12's P(reduced=, unreduced_kind=): values, equality, repr, keys and JAX's errors
    assert P("dp", reduced={"tp"}).reduced == {"tp"} and P("dp").reduced == frozenset()
    assert P(unreduced="tp").unreduced_kind == "sum" and P("dp").unreduced_kind is None
    assert P(unreduced="tp") == P(unreduced="tp", unreduced_kind="sum") != P(unreduced="tp", unreduced_kind="max")
    assert P(reduced="tp") != P() and hash(P(reduced="tp")) != hash(P())
    spec = P("dp", unreduced={"tp"}, reduced={"cp"}, unreduced_kind="min")
    assert repr(spec) == "P('dp', unreduced={'tp'}, reduced={'cp'}, unreduced_kind='min')"  # JAX's order
    assert P.from_key(spec.key) == spec and P.from_key(P(reduced="tp").key) == P(reduced="tp")

    class Kind:  # what jax.sharding.UnreducedKind.max looks like: a member named "max"
        name = "max"

    assert P(unreduced="tp", unreduced_kind=Kind()).unreduced_kind == "max"
    with pytest.raises(MeshError, match=r"unreduced_kind= only with unreduced axes \(as in JAX\), but got "
                                        r"unreduced_kind='max'"):
        P("dp", unreduced_kind="max")
    with pytest.raises(MeshError, match=r"a reduction kind, but got unreduced_kind='avg'; valid: 'sum', 'max', 'min'"):
        P(unreduced="tp", unreduced_kind="avg")
    with pytest.raises(MeshError, match=r"unreduced= and reduced= without common axes \(as in JAX\)"):
        P(unreduced="tp", reduced="tp")
    with pytest.raises(MeshError, match=r"each axis either splitting a dim or in reduced=, not both"):
        P("tp", reduced="tp")
    with pytest.raises(TypeError, match=r"^`PartitionSpec` requires axis entries and the keywords unreduced=, reduced=, "
                                        r"unreduced_kind= only, but got unreduce=\('tp',\); valid: unreduced=, "
                                        r"reduced=, unreduced_kind=$"):
        P("dp", unreduce=("tp",))
    assert P("dp", unreduced={"tp"}).unreduced == {"tp"}  # the keyword we took before still works
    mesh = fm.make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(fm.UnknownAxisError):
        NamedSharding(mesh, P(reduced="cp"))
    assert NamedSharding(mesh, P(reduced="tp")).is_fully_replicated  # a reduced value is the same everywhere


def test_trailing_nones_count_in_the_rank_a_spec_needs():
    # JAX: P(None) is "only valid for values of rank at least 1", so P(None) != P() (equal specs are
    # interchangeable); on a tensor both fit, they split it the same way
    with pytest.raises(MeshError, match=r"at least as many dims as the spec \(1\), but got global_shape=\(\)"):
        NamedSharding(MESH, P(None)).shard_shape(())
    with pytest.raises(MeshError, match=r"at least as many dims as the spec \(3\), but got global_shape=\(8, 4\)"):
        NamedSharding(MESH, P("x", None, None)).local_slices((8, 4), 0)
    assert NamedSharding(MESH, P("x", None)).shard_shape((8, 4)) == NamedSharding(MESH, P("x")).shard_shape((8, 4))
    assert P("x", None) != P("x") and len(P("x", None)) == 2 and len(P("x")) == 1
    assert NamedSharding(MESH, P()).shard_shape(()) == ()
