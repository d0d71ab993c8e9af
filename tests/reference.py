"""Independent brute-force references shared by the test suites (never the code under test)."""

from __future__ import annotations

import itertools


def ref_indices(shape, stride) -> list[int]:
    """Row-major enumeration of raw ``shape:stride`` modes: the last mode varies fastest."""
    return [sum(c * d for c, d in zip(coord, stride)) for coord in itertools.product(*(range(s) for s in shape))]
