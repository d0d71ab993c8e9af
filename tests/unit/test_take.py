"""Tables of examples for ``Mesh.take`` (functional_mesh/_mesh_transforms.py): positions along axes.

An int removes its axis, keeping that position; a slice or a sequence of distinct ints keeps the
axis with those positions, in that order; over a family every group is indexed alike. Expected
values are written out by hand from the grid of ranks (``tests/laws`` holds ``take`` to numpy on
random meshes).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import functional_mesh as fm
from functional_mesh import MeshError, UnknownAxisError

PP_TP = fm.make_mesh((4, 2), ("pp", "tp"))  # ranks [[0, 1], [2, 3], [4, 5], [6, 7]]
CUBE = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))  # dp: +4, cp: +2, tp: +1

EXAMPLES = [
    # (mesh, index, repr, groups as nested lists)
    (PP_TP, {"pp": 0}, "Mesh(tp=2)", [[0, 1]]),
    (PP_TP, {"pp": -1}, "Mesh(tp=2; devices 6..7)", [[6, 7]]),
    (PP_TP, {"pp": [0, 3]}, "Mesh(pp=2, tp=2; devices [0, 1, 6, 7])", [[[0, 1], [6, 7]]]),
    (PP_TP, {"pp": [3, 0]}, "Mesh(pp=2, tp=2; devices [6, 7, 0, 1])", [[[6, 7], [0, 1]]]),
    (PP_TP, {"pp": [-4, -1]}, "Mesh(pp=2, tp=2; devices [0, 1, 6, 7])", [[[0, 1], [6, 7]]]),
    (PP_TP, {"pp": slice(1, 3)}, "Mesh(pp=2, tp=2; devices 2..5)", [[[2, 3], [4, 5]]]),
    (PP_TP, {"pp": slice(None, None, 2)}, "Mesh(pp=2, tp=2; devices [0, 1, 4, 5])", [[[0, 1], [4, 5]]]),
    (PP_TP, {"pp": slice(None, None, -1), "tp": 1}, "Mesh(pp=4; devices 7..1 step -2)", [[7, 5, 3, 1]]),
    (PP_TP, {"pp": [2], "tp": [1, 0]}, "Mesh(pp=1, tp=2; devices 5..4 step -1)", [[[5, 4]]]),
    (PP_TP, {"pp": 1, "tp": 0}, "Mesh((); devices [2])", [2]),
    (PP_TP, {"tp": slice(0, 2)}, "Mesh(pp=4, tp=2)", [[[0, 1], [2, 3], [4, 5], [6, 7]]]),
    # a family: every group indexed alike, the groups stay in torch's order
    (CUBE["tp"], {"tp": 1}, "Mesh((); 4 groups over devices 1..7 step 2)", [1, 3, 5, 7]),
    (CUBE["cp", "tp"], {"cp": [1]}, "Mesh(cp=1, tp=2; 2 groups over devices [2, 3, 6, 7])", [[[2, 3]], [[6, 7]]]),
    (CUBE["dp"], {"dp": [1, 0]}, "Mesh(dp=2; 4 groups over devices [4, 0, 5, 1, 6, …, 3] (8))",
     [[4, 0], [5, 1], [6, 2], [7, 3]]),
    # a flattened axis over two modes (dt = dp, tp: ranks 0, 1, 4, 5), in dp's place before cp
    (CUBE.flatten(("dp", "tp"), name="dt"), {"dt": [0, 3]}, "Mesh(dt=2, cp=2; devices [0, 2, 5, 7])",
     [[[0, 2], [5, 7]]]),
    (CUBE.flatten(("dp", "tp"), name="dt"), {"dt": slice(1, 3)}, "Mesh(dt=2, cp=2; devices [1, 3, 4, 6])",
     [[[1, 3], [4, 6]]]),
    # an explicit device list
    (fm.make_mesh((2, 2), ("dp", "tp"), devices=[7, 3, 5, 1]), {"dp": 1}, "Mesh(tp=2; devices 5..1 step -4)",
     [[5, 1]]),
    (fm.make_mesh((2, 2), ("dp", "tp"), devices=[7, 3, 5, 1]), {"tp": 0}, "Mesh(dp=2; devices 7..5 step -2)",
     [[7, 5]]),
]


@pytest.mark.parametrize(("mesh", "index", "text", "groups"), EXAMPLES, ids=[repr(e[1]) for e in EXAMPLES])
def test_take_examples(mesh, index, text, groups):
    taken = mesh.take(**index)
    assert repr(taken) == text
    assert taken.groups().tolist() == groups
    assert pickle.loads(pickle.dumps(taken)) == taken


def test_a_taken_mesh_coordinates_count_from_zero():
    taken = PP_TP.take(pp=[3, 1])
    assert [taken.coordinate(r) for r in (6, 7, 2, 3)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert taken.coordinate(0) is None and taken.group_of(4) is None


def test_a_range_stays_symbolic_at_any_world_size():
    # 2**40 devices: the take is computed on the layouts (O(ndim)); enumerating them would not finish
    mesh = fm.make_mesh((4, 2**38), ("dp", "tp"))
    taken = mesh.take(dp=[1, 2], tp=slice(0, None, 2))
    assert taken.device_list.is_symbolic and taken.axis_sizes == (2, 2**37)
    assert repr(taken) == "Mesh(dp=2, tp=137438953472; devices 274877906944..824633720830 step 2)"
    assert taken.coordinate(2**38 + 6) == (0, 3) and taken.coordinate(2**38 + 7) is None
    assert len(pickle.dumps(taken)) < 400


def test_the_surviving_replica_keeps_its_groups():
    # the shrink of docs/reliability.md: (dp_replicate, dp_shard, tp) = (2, 2, 2) keeps replica 0;
    # every group of the survivors' other axes is a group the full mesh had (so realize reuses it)
    mesh = fm.make_mesh((2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
    survivors = mesh.take(dp_replicate=[0])
    assert repr(survivors) == "Mesh(dp_replicate=1, dp_shard=2, tp=2)" and survivors.devices.tolist() == [0, 1, 2, 3]
    for axis in ("dp_shard", "tp"):
        before = {tuple(g) for g in mesh[axis].groups().tolist()}
        assert {tuple(g) for g in survivors[axis].groups().tolist()} <= before
    assert survivors["dp_replicate"].groups().tolist() == [[0], [1], [2], [3]]


def test_take_is_numpy_indexing_of_the_grid():
    grid = np.arange(24).reshape(2, 3, 4)
    mesh = fm.make_mesh((2, 3, 4), ("a", "b", "c"))
    assert np.array_equal(mesh.take(a=1, c=[3, 0]).ranks, grid[1][:, [3, 0]])
    assert np.array_equal(mesh.take(b=slice(None, None, -2)).ranks, grid[:, ::-2])


ERRORS = [
    ({}, MeshError, r"^`Mesh.take` requires at least one axis=index, but got positions=\{\}; valid: \('pp', 'tp'\)$"),
    ({"PP": 0}, UnknownAxisError, r"^`Mesh.take` requires an axis name of the mesh, but got axis='PP'; "
                                  r"valid: \('pp', 'tp'\); did you mean 'pp'\?$"),
    ({"pp": 4}, MeshError, r"^`Mesh.take` requires a position of axis 'pp' \(size 4\), but got pp=4; valid: -4..3$"),
    ({"pp": -5}, MeshError, r"but got pp=-5; valid: -4..3$"),
    ({"pp": [0, 4]}, MeshError, r"^`Mesh.take` requires positions of axis 'pp' \(size 4\), but got pp=\[0, 4\]; "
                                r"valid: -4..3$"),
    ({"pp": [1, 1]}, MeshError, r"^`Mesh.take` requires distinct positions of axis 'pp', but got pp=\[1, 1\]; "
                                r"valid: -4..3; position 1 appears twice$"),
    ({"pp": [3, -1]}, MeshError, r"but got pp=\[3, -1\]; valid: -4..3; position 3 appears twice$"),
    ({"pp": []}, MeshError, r"^`Mesh.take` requires a non-empty selection of axis 'pp' \(size 4\), but got pp=\[\]"),
    ({"pp": slice(2, 2)}, MeshError, r"non-empty selection of axis 'pp' \(size 4\), but got pp=slice\(2, 2, None\)"),
    ({"pp": slice(None, None, 0)}, TypeError, r"^`Mesh.take` requires a slice of int positions with a non-zero "
                                              r"step, but got pp=slice\(None, None, 0\)$"),
    ({"pp": slice(0.5, 2)}, TypeError, r"a slice of int positions"),
    ({"pp": 1.0}, TypeError, r"^`Mesh.take` requires an int for pp, but got pp=1.0$"),
    ({"pp": True}, TypeError, r"requires an int for pp, but got pp=True$"),
    ({"pp": "0"}, TypeError, r"^`Mesh.take` requires an int, a slice or a sequence of int positions, but got pp='0'$"),
    ({"pp": {0, 1}}, TypeError, r"a sequence of int positions, but got pp=\{0, 1\}$"),
    ({"pp": [0, 1.5]}, TypeError, r"^`Mesh.take` requires an int for position, but got position=1.5$"),
    ({"pp": None}, TypeError, r"requires an int for pp, but got pp=None$"),
]


@pytest.mark.parametrize(("index", "exc", "pattern"), ERRORS, ids=[repr(e[0]) for e in ERRORS])
def test_take_errors(index, exc, pattern):
    with pytest.raises(exc, match=pattern) as info:
        PP_TP.take(**index)
    if isinstance(info.value, MeshError):
        assert info.value.mesh in (PP_TP, None)


def test_numpy_positions_are_accepted():
    assert PP_TP.take(pp=np.int64(2)) == PP_TP.take(pp=2)
    assert PP_TP.take(pp=np.array([0, 3])) == PP_TP.take(pp=[0, 3])
    assert PP_TP.take(pp=range(1, 3)) == PP_TP.take(pp=slice(1, 3))
