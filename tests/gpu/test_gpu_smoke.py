"""The GPU smoke run (``make gpu-smoke``, tests/gpu/run.py) under pytest.

On a machine without a GPU: the run says so and exits 0, and its checks run once on CPU tensors
(4 gloo processes), so the GPU run cannot rot unseen. With a GPU: the run itself must pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RUN = Path(__file__).resolve().parent / "run.py"
ROOT = RUN.parent.parent.parent
sys.path.insert(0, str(RUN.parent))
from run import EXPECTED  # noqa: E402


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, str(RUN), *args], env=full, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_without_a_gpu_it_says_so_and_exits_0():
    proc = run(env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu-smoke: no GPU here: skipped" in proc.stdout, proc.stdout
    assert f"torch {torch.__version__}" in proc.stdout


@pytest.mark.timeout(400)
def test_the_checks_pass_on_cpu_tensors():
    proc = run("--cpu")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHECK ")]
    verdicts = {line.split()[1].split("/", 1)[1]: line.split()[2] for line in lines}
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert set(verdicts) == set(EXPECTED), proc.stdout
    # only the compiled checks may be skips (a torch whose dynamo cannot trace them says why)
    assert {name for name, v in verdicts.items() if v != "PASS"} <= {"compile", "compile_collectives"}, proc.stdout
    assert {v for v in verdicts.values()} <= {"PASS", "SKIP"}, proc.stdout
    passed = sum(v == "PASS" for v in verdicts.values())
    assert proc.stdout.splitlines()[-1].startswith(f"gpu-smoke: {passed} passed, 0 failed, {len(verdicts) - passed} "
                                                   f"skipped"), proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: `make gpu-smoke` needs CUDA")
@pytest.mark.timeout(600)
def test_the_gpu_smoke_run_passes():
    proc = run(timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
