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
from run import EXPECTED, PROBE_STEPS  # noqa: E402

from functional_mesh import _torch  # noqa: E402


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 470) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, str(RUN), *args], env=full, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_without_a_gpu_it_says_so_and_exits_0():
    proc = run(env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu-smoke: no GPU here: skipped" in proc.stdout, proc.stdout
    assert f"torch {torch.__version__}" in proc.stdout


@pytest.mark.timeout(480)
def test_the_checks_pass_on_cpu_tensors():
    proc = run("--cpu")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHECK ")]
    verdicts = {line.split()[1].split("/", 1)[1]: line.split()[2] for line in lines}
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert set(verdicts) == set(EXPECTED), proc.stdout
    # only the compiled region may be a skip, and only where shard_map's own probe says this torch's dynamo
    # cannot trace one (2.11, 2.12); torch's functional collectives work on gloo with CPU tensors
    no_regions = _torch.region_trace_failure() is not None
    assert {name for name, v in verdicts.items() if v != "PASS"} <= ({"compile"} if no_regions else set()), proc.stdout
    assert {v for v in verdicts.values()} <= {"PASS", "SKIP"}, proc.stdout
    assert "PROBE gloo-cpu/funcol OK" in proc.stdout, proc.stdout
    if no_regions:
        assert "MeshError: `shard_map` requires torch >= 2.13" in proc.stdout, proc.stdout
    passed = sum(v == "PASS" for v in verdicts.values())
    assert proc.stdout.splitlines()[-1].startswith(f"gpu-smoke: {passed} passed, 0 failed, {len(verdicts) - passed} "
                                                   f"skipped"), proc.stdout


def test_the_runner_knows_the_checks_in_their_order():
    import _checks
    import _funcol_probe

    assert tuple(name for name, _ in _checks.CHECKS) == EXPECTED
    assert _funcol_probe.STEPS == PROBE_STEPS


@pytest.mark.timeout(480)
def test_where_torchs_functional_collectives_crash_their_checks_skip_saying_so_and_the_rest_run():
    # the first GPU run (torch 2.11.0+cu130): gloo with CUDA tensors segfaulted inside torch's functional
    # collectives. Here rank 1 of the torch-only probe kills itself at all_gather_tensor, as that did.
    proc = run("--cpu", env={"FM_GPU_SMOKE_PROBE_CRASH": "all_gather_tensor"})
    lines = {line.split()[1].split("/", 1)[1]: line for line in proc.stdout.splitlines() if line.startswith("CHECK ")}
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert ("PROBE gloo-cpu/funcol BROKEN" in proc.stdout and "functional all_gather_tensor on gloo with cpu tensors "
            "crashed (rank 1 died, exit code -11 (Signal 11 (SIGSEGV)" in proc.stdout), proc.stdout
    assert "Fatal Python error: Segmentation fault" in proc.stdout, proc.stdout  # the probe's stack
    needs_funcol = {"dtensor", "fsdp_tp", "compile_collectives", "compile"}
    assert {name for name, line in lines.items() if line.split()[2] == "SKIP"} == needs_funcol, proc.stdout
    assert {name for name, line in lines.items() if line.split()[2] == "PASS"} == set(EXPECTED) - needs_funcol
    for name in needs_funcol:  # each names the torch bug and the probe that showed it
        assert "it uses torch's functional collectives" in lines[name], lines[name]
        assert "tests/gpu/_funcol_probe.py" in lines[name] and "a torch bug" in lines[name], lines[name]
    # the eager typed region needs none of them: it ran, and compared without DTensor communication
    assert "(no DTensor communication)" in lines["shard_map"], lines["shard_map"]
    assert "sharding_of passed: no communication" in lines["dtensor"], lines["dtensor"]
    assert proc.stdout.splitlines()[-1].startswith("gpu-smoke: 4 passed, 0 failed, 4 skipped"), proc.stdout


@pytest.mark.timeout(480)
def test_a_probe_process_that_dies_after_every_step_passed_does_not_turn_the_checks_off():
    # CI, torch 2.13 CPU: every rank printed OK for both steps, then one aborted in interpreter
    # finalization ("terminate called without an active exception"), and the dtensor check skipped
    proc = run("--cpu", "--only=dtensor", env={"FM_GPU_SMOKE_PROBE_CRASH": "exit"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    probe = next(line for line in proc.stdout.splitlines() if line.startswith("PROBE "))
    assert probe.startswith("PROBE gloo-cpu/funcol OK"), proc.stdout
    assert "(then rank 1 died, exit code -6 (Signal 6 (SIGABRT)" in probe and "after every step had passed)" in probe
    assert [line.split()[:3] for line in proc.stdout.splitlines() if line.startswith("CHECK ")] == \
        [["CHECK", "gloo-cpu/dtensor", "PASS"]], proc.stdout


@pytest.mark.timeout(480)
def test_a_process_that_dies_in_a_check_hides_none_of_the_others():
    # rank 1 kills itself with SIGSEGV as shard_map starts (the first GPU run lost 6 checks to one segfault)
    proc = run("--cpu", "--only=dtensor,shard_map,abort", env={"FM_GPU_SMOKE_CRASH": "shard_map"})
    lines = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("CHECK ")}
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert list(lines) == ["gloo-cpu/dtensor", "gloo-cpu/shard_map", "gloo-cpu/abort"], proc.stdout
    assert lines["gloo-cpu/dtensor"].split()[2] == "PASS", proc.stdout
    assert lines["gloo-cpu/shard_map"].startswith("CHECK gloo-cpu/shard_map FAIL crashed: rank 1 died, exit code -11 "
                                                  "(Signal 11 (SIGSEGV)"), proc.stdout
    assert "ranks that had started it: [0, 1, 2, 3]" in lines["gloo-cpu/shard_map"], proc.stdout
    assert "Fatal Python error: Segmentation fault" in proc.stdout, proc.stdout  # its stack (faulthandler)
    assert "[gloo-cpu: started again for abort]" in proc.stdout, proc.stdout
    assert lines["gloo-cpu/abort"].split()[2] == "PASS", proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("gpu-smoke: 2 passed, 1 failed, 0 skipped"), proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: `make gpu-smoke` needs CUDA")
@pytest.mark.timeout(600)
def test_the_gpu_smoke_run_passes():
    proc = run(timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
