"""Every library bug the fuzz found, as its minimal reproduction (tests/fuzz/_harness.py).

Fixed ones must obey the fuzz rule now (bad input: MeshError/TypeError naming the value; valid
input: accepted). Open ones, if any, must still break it: when one starts passing, move it to
FIXED_BUGS so its mutation is drawn again.
"""

from __future__ import annotations

import pytest

from tests.fuzz._harness import FIXED_BUGS, OPEN_BUGS, FuzzFailure, run


@pytest.mark.parametrize("key", sorted(FIXED_BUGS))
def test_fixed_bug_stays_fixed(key):
    run(FIXED_BUGS[key], count=False)


def test_open_bugs_still_reproduce():
    for case in OPEN_BUGS.values():
        with pytest.raises(FuzzFailure):
            run(case, count=False)
