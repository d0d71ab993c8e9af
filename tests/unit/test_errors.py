"""The error contract (docs/design.md, "Errors").

* ``MeshError`` is a ``ValueError``; ``UnknownAxisError`` is both a ``MeshError`` and a ``KeyError``
  and prints without the quotes ``KeyError`` would add.
* Messages follow "`<api>` requires <rule>, but got <name>=<value!r>; valid: <choices>", name the
  bad value, and for a misspelt axis add "did you mean 'tp'?".
* No public call on bad input surfaces ``AssertionError``, ``IndexError``, ``ZeroDivisionError``
  (or any other stray exception): only ``MeshError`` (bad values) or ``TypeError`` (wrong types).
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

import functional_mesh as fm
from functional_mesh import Layout, Mesh, MeshError, UnknownAxisError, make_mesh
from functional_mesh import _errors as E
from functional_mesh import _layout as L
from functional_mesh._validate import as_int

DP_TP = make_mesh((2, 4), ("dp", "tp"))
TEMPLATE = re.compile(r"^`[^`]+` requires .+, but got .+=.+")

# -- the exception classes -----------------------------------------------------------------------


def test_mesh_error_is_value_error():
    assert issubclass(MeshError, ValueError)
    assert fm.MeshError is E.MeshError
    with pytest.raises(ValueError):
        make_mesh((0,), ("a",))


def test_unknown_axis_error_is_mesh_error_and_key_error():
    assert issubclass(UnknownAxisError, MeshError)
    assert issubclass(UnknownAxisError, KeyError)
    assert issubclass(UnknownAxisError, ValueError)
    for exc in (KeyError, MeshError, ValueError, UnknownAxisError):
        with pytest.raises(exc):
            DP_TP["tpp"]


def test_unknown_axis_error_prints_without_quotes():
    with pytest.raises(UnknownAxisError) as info:
        DP_TP.axis_size("tpp")
    text = str(info.value)
    assert text == ("`Mesh.axis_size` requires an axis name of the mesh, but got axis='tpp'; "
                    "valid: ('dp', 'tp'); did you mean 'tp'?")
    assert not text.startswith(("'", '"'))
    # a plain KeyError would print repr(message)
    assert str(KeyError(text)) != text


def test_errors_carry_the_mesh():
    with pytest.raises(UnknownAxisError) as info:
        DP_TP.axis_size("tpp")
    assert info.value.mesh is DP_TP
    with pytest.raises(MeshError) as info2:
        DP_TP.unflatten("tp", {"x": 3})
    assert info2.value.mesh is DP_TP
    assert MeshError("x").mesh is None


def test_mesh_error_pickles():
    e = pickle.loads(pickle.dumps(MeshError("`x` requires y, but got z=1")))
    assert isinstance(e, MeshError)
    assert str(e) == "`x` requires y, but got z=1"
    u = pickle.loads(pickle.dumps(UnknownAxisError("`x` requires an axis, but got axis='q'")))
    assert isinstance(u, UnknownAxisError)
    assert str(u) == "`x` requires an axis, but got axis='q'"


# -- the message helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("make_mesh", "positive sizes", "size", 0), "`make_mesh` requires positive sizes, but got size=0"),
        (("Mesh[...]", "an axis name", "axis", "x", ("a", "b")),
         "`Mesh[...]` requires an axis name, but got axis='x'; valid: ('a', 'b')"),
        (("f", "r", "n", [1, 2], "ints"), "`f` requires r, but got n=[1, 2]; valid: ints"),
    ],
)
def test_requires(args, text):
    assert E.requires(*args) == text


DP_TP_CP = ("dp", "tp", "cp")


@pytest.mark.parametrize(
    ("name", "choices", "suggestion"),
    [
        # plausible typos of a short name: a change of case, a swap of adjacent letters, one letter
        # added or dropped
        ("TP", ("dp", "tp"), "tp"),
        ("Tp", ("dp", "tp"), "tp"),
        ("pt", ("dp", "tp"), "tp"),
        ("pd", DP_TP_CP, "dp"),
        ("tpp", ("dp", "tp"), "tp"),
        ("ttp", ("dp", "tp"), "tp"),
        ("tp_", ("dp", "tp"), "tp"),
        ("t", ("dp", "tp"), "tp"),
        ("TPP", ("dp", "tp"), "tp"),  # case and one letter added
        ("data", ("dp", "tp", "dat"), "dat"),
        ("fsd", ("fsdp", "tp"), "fsdp"),
        ("sfdp", ("fsdp", "tp"), "fsdp"),
        # never another short name one substituted letter away: following that advice would use the
        # wrong axis (a psum over 'tp' when the region lacks 'cp')
        ("cp", ("dp", "tp"), None),
        ("dq", ("dp", "tp"), None),
        ("ep", DP_TP_CP, None),
        ("hsdp", ("fsdp", "tp"), None),  # 4 letters: still a short name (hsdp and fsdp both exist)
        ("dp_cp", ("dp_tp", "pp"), None),  # a substitution inside a two-letter part
        # longer parts: one substituted letter is a plausible typo
        ("dp_shrad", ("dp_shard", "cp"), "dp_shard"),  # a swap
        ("dp_shart", ("dp_shard", "cp"), "dp_shard"),
        ("exbert", ("expert", "tp"), "expert"),
        ("modal", ("model", "data"), "model"),
        ("dp_replicat", ("dp_replicate", "dp_shard"), "dp_replicate"),
        # the best kind of typo wins; two names equally plausible: no suggestion
        ("dp", ("DP", "dpp"), "DP"),  # a change of case beats a letter added
        ("p", ("dp", "tp"), None),  # 'dp' or 'tp'?
        ("dtp", ("dp", "tp"), None),
        ("tp", ("tP", "Tp"), None),
        # nothing close, or nothing to suggest
        ("zzz", ("dp", "tp"), None),
        ("x", ("dp", "tp"), None),
        ("tpxx", ("dp", "tp"), None),
        (3, ("dp", "tp"), None),
        (None, ("dp", "tp"), None),
        ("tp", (), None),
        ("", ("dp", "tp"), None),
    ],
)
def test_did_you_mean_suggests_only_plausible_typos(name, choices, suggestion):
    assert E.did_you_mean(name, choices) == ("" if suggestion is None else f"; did you mean {suggestion!r}?")


def test_two_letter_names_get_no_substitution_hint_from_any_api():
    # issue: on ("dp", "tp"), mesh["cp"] suggested 'tp'
    for call in (lambda: DP_TP["cp"], lambda: DP_TP.axis_size("cp"), lambda: fm.NamedSharding(DP_TP, fm.P("cp")),
                 lambda: DP_TP.shape["cp"]):
        with pytest.raises(UnknownAxisError) as info:
            call()
        assert "did you mean" not in str(info.value) and "valid: ('dp', 'tp')" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), (np.int64(3), 3), (np.uint8(3), 3), (np.array(3), 3), (-2, -2), (10**30, 10**30)],
)
def test_as_int_accepts_integers(value, expected):
    out = as_int("api", "n", value)
    assert out == expected
    assert type(out) is int


@pytest.mark.parametrize("value", [3.0, True, False, np.bool_(True), "3", None, [3], np.float64(3.0), 1 + 0j])
def test_as_int_rejects_non_integers(value):
    with pytest.raises(TypeError, match=r"^`api` requires an int for n, but got n="):
        as_int("api", "n", value)


# -- "did you mean" in every API that takes an axis name -----------------------------------------

MISSPELT = [
    ("Mesh[...]", lambda: DP_TP["tpp"]),
    ("Mesh[...]", lambda: DP_TP["dp", "tpp"]),
    ("Mesh.axis_size", lambda: DP_TP.axis_size("tpp")),
    ("Mesh.axis_layout", lambda: DP_TP.axis_layout("tpp")),
    ("Mesh.flatten", lambda: DP_TP.flatten(("dp", "tpp"))),
    ("Mesh.unflatten", lambda: DP_TP.unflatten("tpp", {"x": 2, "y": 2})),
    ("Mesh.rename", lambda: DP_TP.rename({"tpp": "x"})),
    ("Mesh.transpose", lambda: DP_TP.transpose("dp", "tpp")),
    ("mesh.shape[...]", lambda: DP_TP.shape["tpp"]),
]


@pytest.mark.parametrize(("api", "call"), MISSPELT, ids=[f"{a}-{i}" for i, (a, _) in enumerate(MISSPELT)])
def test_misspelt_axis_did_you_mean(api, call):
    with pytest.raises(MeshError) as info:
        call()
    text = str(info.value)
    assert text.startswith(f"`{api}` requires"), text
    assert "'tpp'" in text, text  # names the bad value
    assert "('dp', 'tp')" in text, text  # and the valid choices
    assert text.endswith("did you mean 'tp'?"), text


def test_far_name_has_no_suggestion():
    with pytest.raises(UnknownAxisError) as info:
        DP_TP["zzz"]
    assert str(info.value) == (
        "`Mesh[...]` requires an axis name of the mesh, but got axis='zzz'; valid: ('dp', 'tp')"
    )


# -- every message follows the template ----------------------------------------------------------

BAD_CALLS = [
    # (id, call, exception type, regex naming the bad value)
    ("make_mesh-size0", lambda: make_mesh((2, 0), ("a", "b")), MeshError, r"axis_sizes\['b'\]=0"),
    ("make_mesh-float", lambda: make_mesh((2.5,), ("a",)), TypeError, r"axis size=2.5"),
    ("make_mesh-names", lambda: make_mesh((2, 2), ("a",)), MeshError, r"axis_names=\('a',\)"),
    ("make_mesh-dupname", lambda: make_mesh((2, 2), ("a", "a")), MeshError, r"'a' appears twice"),
    ("make_mesh-nonstr", lambda: make_mesh((2,), (b"a",)), TypeError, r"name=b'a'"),
    ("make_mesh-devlen", lambda: make_mesh((2, 2), ("a", "b"), devices=[0, 1]), MeshError, r"len\(devices\)=2"),
    ("make_mesh-dup", lambda: make_mesh((2,), ("a",), devices=[1, 1]), MeshError, r"duplicate device=1"),
    ("make_mesh-neg", lambda: make_mesh((2,), ("a",), devices=[1, -1]), MeshError, r"device=-1"),
    ("make_mesh-negrange", lambda: make_mesh((2,), ("a",), devices=range(-1, 1)), MeshError, r"range\(-1, 1\)"),
    ("make_mesh-floatdev", lambda: make_mesh((2,), ("a",), devices=[0.0, 1.0]), TypeError, r"device=0.0"),
    ("from_ranks-ragged", lambda: Mesh.from_ranks([[0], [1, 2]], ("a", "b")), MeshError, r"devices=\[\[0\], \[1, 2\]\]"),
    ("from_ranks-ndim", lambda: Mesh.from_ranks([0, 1], ("a", "b")), MeshError, r"axis_names=\('a', 'b'\)"),
    ("select-empty", lambda: DP_TP[()], MeshError, r"axes=\(\); valid: \('dp', 'tp'\)"),
    ("select-dup", lambda: DP_TP["tp", "tp"], MeshError, r"axes=\('tp', 'tp'\)"),
    ("select-int", lambda: DP_TP[0], TypeError, r"key=0; valid: \('dp', 'tp'\)"),
    ("select-int-out-of-range", lambda: DP_TP[2], TypeError, r"key=2; valid: \('dp', 'tp'\)"),
    ("select-float", lambda: DP_TP[0.5], TypeError, r"axes=0.5"),
    ("shape-int", lambda: DP_TP.shape[1], MeshError, r"key=1; valid: \('dp', 'tp'\)"),
    ("flatten-collide", lambda: make_mesh((2, 2, 2), ("a", "b", "c")).flatten(("a", "b"), name="c"),
     MeshError, r"name='c'"),
    ("flatten-empty", lambda: DP_TP.flatten(()), MeshError, r"axes=\(\)"),
    ("unflatten-product", lambda: DP_TP.unflatten("tp", {"x": 3}), MeshError, r"sizes=\{'x': 3\}"),
    ("unflatten-modes", lambda: make_mesh((2, 2, 3), ("a", "b", "c")).flatten(("a", "c"), name="ac")
     .unflatten("ac", {"x": 3, "y": 2}), MeshError, r"\(2,3\):\(6,1\).*sizes=\{'x': 3, 'y': 2\}; valid: "),
    ("unflatten-collide", lambda: DP_TP.unflatten("tp", {"dp": 4}), MeshError, r"\('dp', 'dp'\)"),
    ("unflatten-zero", lambda: DP_TP.unflatten("tp", {"x": 0}), MeshError, r"sizes\['x'\]=0"),
    ("unflatten-type", lambda: DP_TP.unflatten("tp", 4), TypeError, r"sizes=4"),
    ("transpose", lambda: DP_TP.transpose("tp"), MeshError, r"axes=\('tp',\); valid: \('dp', 'tp'\)"),
    ("rename-collide", lambda: DP_TP.rename({"dp": "tp"}), MeshError, r"\('tp', 'tp'\)"),
    ("rename-type", lambda: DP_TP.rename(["dp"]), TypeError, r"mapping=\['dp'\]"),
    ("coordinate-neg", lambda: DP_TP.coordinate(-3), MeshError, r"rank=-3"),
    ("group_of-neg", lambda: DP_TP.group_of(-3), MeshError, r"rank=-3"),
    ("coordinate-float", lambda: DP_TP.coordinate(2.0), TypeError, r"rank=2.0"),
    ("ranks-family", lambda: DP_TP["tp"].ranks, MeshError, r"num_groups=2"),
    ("Layout-shape", lambda: Layout((0,)), MeshError, r"shape=\(0,\)"),
    ("Layout-stride", lambda: Layout((2,), (-1,)), MeshError, r"stride=\(-1,\)"),
    ("Layout-call", lambda: Layout(4)(4), MeshError, r"coordinate=4"),
    ("complement", lambda: L.complement(Layout(4), 6), MeshError, r"n=6"),
    ("complement-overlap", lambda: L.complement(Layout(2, 0), 4), MeshError, r"layout=2:0"),
    ("composition", lambda: L.composition(Layout((2, 3), (6, 1)), Layout(3, 2)), MeshError, r"inner=3:2"),
    ("decompose", lambda: L.decompose(Layout(4), 8, 8), MeshError, r"index=8"),
    ("Mesh-overlap", lambda: Mesh(("a", "b"), (Layout(2, 1), Layout(2, 1)), 4), MeshError, r"layouts \('2:1', '2:1'\)"),
    ("Mesh-notile", lambda: Mesh(("a",), (Layout(3),), 4), MeshError, r"4 devices, but got layouts \('3:1',\)"),
    ("Mesh-layout-type", lambda: Mesh(("a",), ((2, 1),), 2), TypeError, r"layout=\(2, 1\)"),
    ("Mesh-layout-count", lambda: Mesh(("a", "b"), (Layout(2),), 2), MeshError, r"valid: \('a', 'b'\)"),
]


@pytest.mark.parametrize(("call", "exc", "pattern"), [b[1:] for b in BAD_CALLS], ids=[b[0] for b in BAD_CALLS])
def test_message_template(call, exc, pattern):
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) in (exc, UnknownAxisError) or isinstance(info.value, exc)
    text = str(info.value)
    assert TEMPLATE.match(text), f"not in the house template: {text!r}"
    assert re.search(pattern, text), f"{pattern!r} not in {text!r}"


# -- no stray exception types on bad input ---------------------------------------------------------

STRAY = [
    lambda: DP_TP[5],
    lambda: DP_TP[-3],
    lambda: DP_TP[True],
    lambda: DP_TP[{"dp": 1}],
    lambda: DP_TP[("dp", None)],
    lambda: DP_TP.shape[7],
    lambda: DP_TP.axis_size(None),
    lambda: DP_TP.coordinate(None),
    lambda: DP_TP.group_of("0"),
    lambda: DP_TP.flatten(5),
    lambda: DP_TP.flatten(("dp",), name=None).flatten(name=5),
    lambda: DP_TP.unflatten("tp", {"x": -1, "y": -4}),
    lambda: DP_TP.unflatten("tp", [("x",)]),
    lambda: DP_TP.unflatten("tp", [("x", 2, 2)]),
    lambda: DP_TP.unflatten(0, {"x": 4}),
    lambda: DP_TP.transpose(None),
    lambda: DP_TP.transpose(["dp", ["tp"]]),
    lambda: DP_TP.rename(None),
    lambda: DP_TP.rename({"dp": None}),
    lambda: make_mesh(None, ("a",)),
    lambda: make_mesh((2,), "a", devices=object()),
    lambda: make_mesh((2,), "a", devices=[[0], [1, 2]]),
    lambda: make_mesh((2,), "a", devices=[0, 1, 2]),
    lambda: Mesh.from_ranks(None, "a"),
    lambda: Mesh.from_ranks([], "a"),
    lambda: Mesh.from_ranks([[[]]], ("a", "b", "c")),
    lambda: Mesh(("a",), (Layout(2),), 0),
    lambda: Mesh(("a",), (Layout(2),), -2),
    lambda: Mesh(("a",), (Layout(2),), 3.0),
    lambda: Layout((2, 2), (1,)),
    lambda: Layout(None),
    lambda: Layout(4)(-1),
    lambda: L.complement(Layout(2), 0),
    lambda: L.composition(Layout(4), Layout(5)),
    lambda: L.decompose(Layout(4), 6, 0),
    lambda: L.decompose(Layout(4), 8, -1),
    lambda: L.groups(Layout(3), 4),
]


@pytest.mark.parametrize("call", STRAY, ids=[f"stray{i}" for i in range(len(STRAY))])
def test_bad_input_raises_only_mesh_error_or_type_error(call):
    try:
        call()
    except (MeshError, TypeError) as e:
        assert str(e), "error without a message"
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"bad input surfaced {type(e).__name__}: {e}")
    else:
        pytest.fail("bad input was accepted")
