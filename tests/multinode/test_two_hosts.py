"""Two torchrun agents on this machine, each a "host" of 4 ranks: realize, collectives, host_span.

The agents meet through torchrun's c10d rendezvous on loopback (``--nnodes=2
--nproc_per_node=4``), so the 8 workers see the environment a real two-host job sees:
``LOCAL_WORLD_SIZE=4``, ``GROUP_RANK`` 0 or 1, global ranks numbered host by host. The worker
(two_hosts_worker.py) checks groups, ``psum``/``all_gather``, ``Mesh.host_span`` and realize's
log lines against values it computes from rank numbers and from the gathered agent labels, and
raises on any mismatch. Here we check that both agents exit 0, that each agent's output holds
the report lines of exactly one block of 4 consecutive ranks, and that rank 0's realize log marks
dp cross-host on the well-placed mesh.

One launch of two agents: ~15 s on the two shared cores when quiet, ~29 s at load ~10. Nearly
all of it is starting ten processes that import torch; the checks themselves take ~1 s.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "two_hosts_worker.py"
NNODES, NPROC = 2, 4
WORLD = NNODES * NPROC
LAUNCH_TIMEOUT_S = 90  # both agents together, from the first start to the last exit
CASES = ("well-placed", "tp-across-hosts", "tp-interleaved")
SPANS = {  # as designed (the worker also measures them from the agents' identities)
    "well-placed": "dp=cross-host tp=intra-host",
    "tp-across-hosts": "dp=intra-host tp=cross-host",
    "tp-interleaved": "dp=cross-host tp=mixed",
}
REPORT = re.compile(r"^two-hosts rank (\d+) host (\S+) (\S+): (dp=\S+ tp=\S+) log_lines=(\d+)$", re.MULTILINE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two_agents() -> list[tuple[str, int, str, str]]:
    """Run both agents; ``[(label, returncode, stdout, stderr)]``. Fails the test after the timeout."""
    port, run_id = _free_port(), f"fm-two-hosts-{uuid.uuid4().hex[:12]}"
    procs = []
    for node in range(NNODES):
        label = f"agent{node}"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NNODES}", f"--nproc_per_node={NPROC}",
               f"--node_rank={node}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
               f"--rdzv_id={run_id}", "--rdzv_conf=join_timeout=60", "--max_restarts=0", str(WORKER)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "FM_TEST_AGENT": label}
        # Each agent in its own session, so a timeout ends it together with its workers.
        procs.append((label, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, start_new_session=True)))
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    results = []
    try:
        for label, proc in procs:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((label, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        dumps = []
        for label, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            dumps.append(f"== {label} (rc={proc.returncode})\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}")
        pytest.fail(f"two agents did not finish within {LAUNCH_TIMEOUT_S} s\n" + "\n".join(dumps))
    finally:
        for _, proc in procs:  # a failure above must not leave workers behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 20)
def test_two_agents_realize_collectives_and_host_span() -> None:
    results = _launch_two_agents()
    for label, rc, out, err in results:
        assert rc == 0, f"{label} exited with {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}"

    ranks_of_agent = {}
    for label, _, out, _ in results:
        reports = REPORT.findall(out)
        ranks = sorted({int(r) for r, *_ in reports})
        # The agent this output came from holds exactly one block of NPROC consecutive ranks...
        assert len(ranks) == NPROC and ranks == list(range(ranks[0], ranks[0] + NPROC)), (label, ranks, out)
        assert ranks[0] % NPROC == 0, (label, ranks)
        ranks_of_agent[label] = ranks
        for rank, host, case, spans, log_lines in reports:
            # ...and its workers learned that same host from the all-gathered labels.
            assert host == label, (rank, host, label)
            assert spans == SPANS[case], (rank, case, spans)
            # rank 0 logs one INFO line per axis (2 axes); no other rank logs at INFO.
            assert int(log_lines) == (2 if rank == "0" else 0), (rank, case, log_lines)
        for rank in ranks:
            assert sorted(case for r, _, case, _, _ in reports if int(r) == rank) == sorted(CASES), (label, rank)
            assert f"two-hosts rank {rank} ok" in out, (label, rank)
    assert sorted(r for ranks in ranks_of_agent.values() for r in ranks) == list(range(WORLD))

    # realize's own log line (stderr of rank 0's agent) marks the cross-host axis.
    (rank0_err,) = [err for label, _, _, err in results if 0 in ranks_of_agent[label]]
    lines = [line for line in rank0_err.splitlines() if "functional_mesh.realize" in line]
    assert any(line.endswith("axis dp size=2 groups=4 new_groups=4 cross-host (4 ranks per host)")
               and "Mesh(dp=2, tp=4)" in line for line in lines), "\n".join(lines)
    assert any(line.endswith("axis tp size=4 groups=2 new_groups=2 intra-host (4 ranks per host)")
               for line in lines), "\n".join(lines)
    other_err = [err for label, _, _, err in results if 0 not in ranks_of_agent[label]]
    assert not any("functional_mesh.realize" in err for err in other_err), other_err
