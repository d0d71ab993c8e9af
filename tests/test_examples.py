"""Every example script runs (each once, docs/design.md "Tests")."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_plan_meshes_runs_without_torch_distributed():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(EXAMPLES / "plan_meshes.py")],
        capture_output=True, text=True, timeout=60, check=True,
    )
    # The tutorial's groups are asserted inside the script. 100 distinct groups for this
    # sequence is what torch's DeviceMesh creates (counted with torch 2.13's DeviceMesh).
    assert "9 axis families, 108 group rows, 100 distinct rank groups" in out.stdout
    # Megatron's groups for rank 0 at tp=4, cp=2, dp=2, pp=2 (strides 1, 4, 8, 16), by hand
    assert "token 'tp-cp': 4 groups, rank 0's: [0, 1, 2, 3, 4, 5, 6, 7]" in out.stdout
    assert "token 'dp-cp': 8 groups, rank 0's: [0, 4, 8, 12]" in out.stdout
    assert "token 'tp-pp': 4 groups, rank 0's: [0, 1, 2, 3, 16, 17, 18, 19]" in out.stdout
    assert "'cp': 'intra-host', 'tp': 'intra-host'}" in out.stdout and "WARNING" not in out.stdout
    assert " torch" not in out.stderr  # -X importtime lists every imported module on stderr


# examples/torchtitan_llama3.py needs torchtitan 0.3.0, which lives in its own venv (.venv-titan): `make
# test-torchtitan` runs this file there, where the example trains; anywhere else it must stop with one line
# that says what it needs and how to run it.
TITAN_EXAMPLE = EXAMPLES / "torchtitan_llama3.py"
TITAN_RUN_TIMEOUT_S = 420  # 8 workers importing torch and torchtitan on 2 shared cores: ~40-100 s


def _torchtitan_importable() -> bool:
    return importlib.util.find_spec("torchtitan") is not None


def test_torchtitan_example_without_torchtitan_says_how_to_run_it():
    if _torchtitan_importable():
        pytest.skip("torchtitan is importable here: test_torchtitan_example_trains_llama3 runs the example")
    out = subprocess.run([sys.executable, str(TITAN_EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.startswith("torchtitan_llama3.py needs torchtitan 0.3.0"), out.stderr
    assert "No module named 'torchtitan'" in out.stderr and "make .venv-titan/.installed" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(TITAN_RUN_TIMEOUT_S + 30)
def test_torchtitan_example_trains_llama3():
    if not _torchtitan_importable():
        pytest.skip(f"torchtitan is not importable in {sys.executable}: `make test-torchtitan` runs this test in "
                    f"its venv")
    from tests._torch_features import fsdp_spmd_types_failure

    # torchtitan's default backend where this torch's FSDP2 takes it (2.14), the legacy one elsewhere
    backend = "partial_dtensor" if fsdp_spmd_types_failure() else "spmd_types"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "--max_restarts=0",
           str(TITAN_EXAMPLE), "--spmd-backend", backend]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(cmd, cwd=EXAMPLES.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # its own session: a timeout ends the workers too
    try:
        out, err = proc.communicate(timeout=TITAN_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"did not finish within {TITAN_RUN_TIMEOUT_S} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    assert proc.returncode == 0, f"exited {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-5000:]}"
    # rank 0's losses: the same seeds, batches and model as tests/torchtitan (where they are compared
    # bit for bit with torchtitan's own meshes), so the same values
    assert [line.split()[3] for line in out.splitlines() if line.startswith("step ")] == \
        ["5.948634", "5.966319", "5.962624", "6.008712"], out
    # HSDP 2 x 2 x TP 2: torchtitan talks over 14 distinct rank sets (docs/torchtitan.md, 'What it costs')
    assert "14 process groups per rank: one per distinct rank set, all made by build_mesh" in out, out
