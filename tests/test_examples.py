"""Every example script runs (each once, DESIGN.md §9)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_plan_meshes_runs_without_torch_distributed():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(EXAMPLES / "plan_meshes.py")],
        capture_output=True, text=True, timeout=60, check=True,
    )
    # The tutorial's groups are asserted inside the script. 100 distinct groups for this
    # sequence is what torch's DeviceMesh creates (notes/torch_anchor.md §2d, legacy row).
    assert "9 axis families, 108 group rows, 100 distinct rank groups" in out.stdout
    # Megatron's groups for rank 0 at tp=4, cp=2, dp=2, pp=2 (strides 1, 4, 8, 16), by hand
    assert "token 'tp-cp': 4 groups, rank 0's: [0, 1, 2, 3, 4, 5, 6, 7]" in out.stdout
    assert "token 'dp-cp': 8 groups, rank 0's: [0, 4, 8, 12]" in out.stdout
    assert "token 'tp-pp': 4 groups, rank 0's: [0, 1, 2, 3, 16, 17, 18, 19]" in out.stdout
    assert "'cp': 'intra-host', 'tp': 'intra-host'}" in out.stdout and "WARNING" not in out.stdout
    assert " torch" not in out.stderr  # -X importtime lists every imported module on stderr
