"""Every torchrun example runs once, on 8 CPU workers (gloo), and prints its key line.

docs/design.md, "Tests": each example script runs once (one fresh world-8 launch each, ~10-25 s on 2
cores); the examples assert their own results on every rank, so exit code 0 means they held.
GPUs are hidden so the launch is the same gloo run on every machine.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NPROC = 8
RUN_TIMEOUT_S = 120

# (script, arguments, lines that must appear in rank 0's output)
CASES = [
    ("two_d_setup.py", [], ["groups and all-reduce results identical on every rank"]),
    ("hsdp.py", [], ["HSDP losses match the single-process run to 1e-05"]),
    ("slicing_3d.py", [], ["one torch root", "groups equal torch init_device_mesh's on every rank"]),
    ("parallel_dims.py", [], ["(cache hits only, no new groups)",
                              # 14: size-1 pp and cp make no group (was 22: + the 8 one-rank rows)
                              "11 axes ask for 46 group rows; realize created 14 distinct groups"]),
    ("train_3d.py", [], ["losses match to 1e-05 at every step; final weights match", "dp_replicate x dp_shard"]),
    ("tp_mlp.py", [], ["loss and gradients match to 1e-05 on every rank"]),
    ("ddp_axis.py", [], ["ddp over dp matches the single-process run to 1e-05"]),
    ("pipeline_ring.py", [], ["pipeline ring matches the single-process composition to 1e-05"]),
    ("shard_map_mlp.py", [], ["losses and final weights match a single process to 1e-05 on every rank"]),
    # typed, untyped, and compiled with the sizes as Python ints (one step: 8 workers compiling take 85 s at load 30)
    ("moe_ep.py", ["--steps", "2"], ["check_vma=True", "every gradient match a single process to 1e-05"]),
    ("moe_ep.py", ["--steps", "2", "--untyped"], ["check_vma=False", "every gradient match a single process to 1e-05"]),
    ("moe_ep.py", ["--steps", "1", "--compile"], ["compiled=True", "graphs compiled: 1 in 1 steps",
                                                  "every gradient match a single process to 1e-05"]),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: str, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={NPROC}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(EXAMPLES / script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    # A new session, so a timeout can end torchrun together with its workers.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script} did not finish within {RUN_TIMEOUT_S} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(("script", "args", "expected"), CASES, ids=[" ".join([c[0], *c[1]]) for c in CASES])
def test_example_runs_with_torchrun(script: str, args: list[str], expected: list[str]) -> None:
    result = _torchrun(script, args)
    assert result.returncode == 0, (
        f"{script} exited with {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n"
        f"stderr:\n{result.stderr[-5000:]}")
    for line in expected:
        assert line in result.stdout, f"{script}: {line!r} not in its output:\n{result.stdout}"
