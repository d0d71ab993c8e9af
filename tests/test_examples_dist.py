"""Every torchrun example runs once, on 8 CPU workers (gloo), and prints its key line.

The examples assert their own results on every rank, so a run without an exception means they
held. They run inside the session's world-8 worker pool (tests/dist/_pool.py), through
:func:`run_example`: ``runpy`` runs the script as ``__main__`` on every rank, as torchrun would,
since a pool worker already is such a rank (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``MASTER_ADDR`` set, the default gloo group up). That saves a fresh world-8 launch per example
(~10-25 s on 2 cores). Two things differ from a fresh process, and the runner undoes them: an
example ends with ``dist.destroy_process_group()``, which would end the pool's world (here it
clears realize's cache and destroys every group but the default one, which is all an example's
teardown needs), and torch's caches (dynamo's, DTensor's sharding propagation) start empty, as in a
new process.

``two_d_setup.py`` starts its own world (the tutorial's ``init_process_group`` from torchrun's
environment), so it runs under a real ``torchrun`` launch: the one test of the launcher itself.
``moe_ep.py`` runs beside the docs page that excerpts it (tests/dist/test_docs_moe_gloo.py).
GPUs are hidden so the launch is the same gloo run on every machine.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import runpy
import signal
import socket
import subprocess
import sys
import warnings

import pytest

from tests.dist._pool import drop_groups, fresh_caches, pool_fixture

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NPROC = 8
RUN_TIMEOUT_S = 120

w8 = pool_fixture(NPROC)

# (script, arguments, lines that must appear in rank 0's output)
CASES = [
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
    ("ep_in_fsdp_tp.py", [], ["loss and every gradient match a single process to 1e-05 on every rank"]),
    ("rl_disjoint.py", [], ["realized members-only; generator's copy equals the trainer's weights"]),
    ("refit.py", [], ["ranks 4-7: 30 tensors (23 bf16, 7 fp32), 621568 bytes between ranks in 3 stages: bit for bit",
                      "on ranks 0-7: 30 tensors (23 bf16, 7 fp32), 548352 bytes between ranks in 4 stages: bit for bit"]),
]
LAUNCHED = ("two_d_setup.py", [], ["groups and all-reduce results identical on every rank"])


def run_example(script: str, args: list[str]) -> str:
    """On one pool rank: run ``examples/<script> <args>`` as ``__main__``; what it printed."""
    import torch.distributed as dist

    path = EXAMPLES / script
    destroy = dist.destroy_process_group

    def keep_the_world(group=None):
        if group is not None and group is not dist.group.WORLD:
            return destroy(group)
        return drop_groups()

    fresh_caches()
    out, argv = io.StringIO(), sys.argv
    sys.argv = [str(path), *args]
    dist.destroy_process_group = keep_the_world
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            runpy.run_path(str(path), run_name="__main__")
    finally:
        dist.destroy_process_group = destroy
        sys.argv = argv
    return out.getvalue()


def check_output(script: str, outputs: list[str], expected: list[str]) -> None:
    for line in expected:
        assert line in outputs[0], f"{script}: {line!r} not in rank 0's output:\n{outputs[0]}"


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(("script", "args", "expected"), CASES, ids=[" ".join([c[0], *c[1]]) for c in CASES])
def test_example_runs_on_8_gloo_workers(w8, script: str, args: list[str], expected: list[str]) -> None:
    check_output(script, w8.run(run_example, script, args, timeout=RUN_TIMEOUT_S), expected)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_example_that_starts_its_own_world_runs_under_torchrun() -> None:
    script, args, expected = LAUNCHED
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
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-5000:]}"
    for line in expected:
        assert line in out, f"{script}: {line!r} not in its output:\n{out}"
