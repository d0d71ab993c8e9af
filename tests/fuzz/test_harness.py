"""The fuzz rule itself can fail: each way a library call can break it is caught."""

from __future__ import annotations

import pytest

import functional_mesh as fm
from tests.fuzz._harness import FuzzFailure, Shown, bad, mentions, run, valid


def raises(exc: BaseException):
    def call():
        raise exc
    return call


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        (valid("returns", lambda: 3, lambda out: None), None),
        (valid("rejected", raises(fm.MeshError("`f` requires x, but got n=3"))), "valid input rejected"),
        (valid("check fails", lambda: 3, lambda out: (_ for _ in ()).throw(AssertionError("no"))), "no"),
        (bad("named", raises(fm.MeshError("`f` requires x, but got n=-3")), -3), None),
        (bad("type error named", raises(TypeError("`f` requires an int, but got n=2.5")), 2.5), None),
        (bad("accepted", lambda: 1, 5), "accepted silently"),
        (bad("stray type", raises(IndexError("tuple index out of range")), 5), "IndexError escaped"),
        (bad("stray key error", raises(KeyError("tp")), "tp"), "KeyError escaped"),
        (bad("not named", raises(fm.MeshError("`f` requires x, but got n=6")), 5), "does not name"),
        (bad("named only in the rule", raises(fm.MeshError("`f` requires n != 5, but got n=6")), 5),
         "does not name"),
        (bad("unknown axis as plain MeshError", raises(fm.MeshError("`f` requires y, but got axis='tpp'")), "tpp",
             unknown_axis="tpp"), "not UnknownAxisError"),
        (bad("no suggestion", raises(fm.UnknownAxisError("`f` requires y, but got axis='tpp'")), "tpp",
             unknown_axis="tpp", suggest=True), "did you mean"),
    ],
    ids=lambda v: v.what if hasattr(v, "what") else str(v),
)
def test_rule(case, verdict):
    if verdict is None:
        run(case, count=False)
    else:
        with pytest.raises((FuzzFailure, AssertionError), match=verdict):
            run(case, count=False)


@pytest.mark.parametrize(
    ("text", "value", "named"),
    [
        ("`f` requires positive sizes, but got axis_sizes['b']=0", 0, True),
        ("`f` requires x, but got devices=0..7", 0, False),  # a digit inside a range is not the value
        ("`f` requires x, but got x=10", 0, False),
        ("`f` requires x, but got check=0.0", 0, True),  # an int shown as the float it became
        ("`f` requires x, but got n=3.5", 3, False),
        ("`f` requires x, but got axes=('a', 'a')", ("a", "a"), True),
        ("`f` requires x, but got axes=('a', 'a')", ["a", "a"], True),  # a list shown as a tuple
        ("`f` requires x, but got name=''", "", True),
        ("`f` requires x, but got name='ab'", "a", False),
        ("`f` requires x, but got device=np.float64(2.0)", 2.0, True),
        ("`f` requires timeout=None, but got timeout='x'", None, False),  # None only in the rule
        ("`f` requires x, but got layouts ('2:1', '2:1')", Shown("('2:1', '2:1')"), True),
    ],
)
def test_mentions(text, value, named):
    assert mentions(text, value) is named
