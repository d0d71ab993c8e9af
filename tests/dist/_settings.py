"""Settings and meshes shared by the gloo suites (kept out of _pool.py, which stays torch-generic)."""

from __future__ import annotations

import numpy as np

from functional_mesh import Mesh, make_mesh

GROUP_TIMEOUT = 20  # seconds: the timeout of every group realize creates here (≤ 30 s, docs/design.md "Tests")
CHECK_S = 10  # seconds: the divergence check's wait where no divergence is expected

NAMES = ("dp", "cp", "tp")
MESHES = {  # world 8: the plain 3-D mesh and a permuted device list
    "iota": make_mesh((2, 2, 2), NAMES),
    "permuted": Mesh.from_ranks(np.array([5, 1, 7, 3, 4, 0, 6, 2]).reshape(2, 2, 2), NAMES),
}
