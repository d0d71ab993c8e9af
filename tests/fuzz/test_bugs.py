"""Every library bug the fuzz found, as its minimal reproduction (tests/fuzz/_harness.py).

Fixed ones must obey the fuzz rule now (bad input: MeshError/TypeError naming the value; valid
input: accepted). Open ones, if any, must still break it: when one starts passing, move it to
FIXED_BUGS so its mutation is drawn again. With no open bug, the open-bug test reports a skip
(an empty parameter set), not a pass; the tests below check the mechanism itself on stand-ins.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.fuzz import _harness
from tests.fuzz._harness import FIXED_BUGS, OPEN_BUGS, FuzzFailure, bad, check_still_open, is_open, run, valid


@pytest.mark.parametrize("key", sorted(FIXED_BUGS))
def test_fixed_bug_stays_fixed(key):
    run(FIXED_BUGS[key], count=False)


@pytest.mark.parametrize("key", sorted(OPEN_BUGS))
def test_open_bug_still_reproduces(key):
    check_still_open(key, OPEN_BUGS[key])


def test_a_fixed_open_bug_fails_the_open_bug_check_and_a_live_one_passes():
    def accepts():
        return None

    def raises_index_error():
        raise IndexError("tuple index out of range")

    with pytest.raises(AssertionError, match=r"open bug 'stand-in' no longer reproduces: move it to FIXED_BUGS"):
        check_still_open("stand-in", valid("a call that works now", accepts))
    check_still_open("stand-in", bad("a stray IndexError", raises_index_error, 5))
    with pytest.raises(FuzzFailure):  # what the open-bug check relies on
        run(bad("a stray IndexError", raises_index_error, 5), count=False)


def test_is_open_knows_every_key_it_is_asked_about():
    assert not is_open(next(iter(FIXED_BUGS)))
    with pytest.raises(KeyError, match=r"no bug 'realize-chek-nan' in FIXED_BUGS or OPEN_BUGS"):
        is_open("realize-chek-nan")  # a misspelt key would silently keep a mutation out, or in


def test_every_bug_key_a_generator_asks_about_exists_and_no_bug_is_both_fixed_and_open():
    assert not set(FIXED_BUGS) & set(OPEN_BUGS)
    asked = {key for path in pathlib.Path(_harness.__file__).parent.glob("test_fuzz_*.py")
             for key in re.findall(r"is_open\(\s*\"([^\"]+)\"", path.read_text())}
    assert asked, "the generators ask is_open about no bug: is the pattern stale?"
    assert sorted(asked - set(FIXED_BUGS) - set(OPEN_BUGS)) == []
