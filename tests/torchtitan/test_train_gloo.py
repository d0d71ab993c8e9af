"""torchtitan 0.3.0's llama3, trained on 8 gloo workers with torchtitan's meshes and with ours.

Each run is one ``torchrun --nproc_per_node=8`` of _worker.py: llama3 at dim 64, 2 layers, vocab
256, 4 AdamW steps from fixed seeds and batches; HSDP 2 x 2 x TP 2 (sequence 32) under
"partial_dtensor", "full_dtensor" and "spmd_types", and HSDP 2 x CP 2 x TP 2 (sequence 256) under
"partial_dtensor". Per case, the two runs must give bit-identical losses and gradient norms on
every rank, and ours must make fewer process groups: each distinct rank set once, never one during
training (torch finds ours), and no more than torchtitan's distinct real rank sets (the axes it
keeps on its fake backend get none).

~40-60 s per run on the two shared cores (most of it 8 processes importing torch and torchtitan);
8 runs in all; ``FM_TITAN_CASES=spmd_types`` runs only the cases it names. Not part of
``make test``: ``make test-torchtitan`` builds its venv and runs it (docs/torchtitan.md).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from ._titan import require_torchtitan

require_torchtitan()

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "_worker.py"
NPROC = 8
HSDP_TP = {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "seq": 32}
# context parallelism over flex attention needs a sequence divisible by cp * 128 (its block size)
HSDP_CP_TP = {"dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2, "seq": 256}
CASES = {  # id: (spmd_backend, degrees). full_dtensor + CP runs, but DTensor's redistribute planner
    # spends minutes per step on a 4-D mesh with 8 processes sharing 2 cores: not here.
    "partial_dtensor": ("partial_dtensor", HSDP_TP),
    "full_dtensor": ("full_dtensor", HSDP_TP),
    "partial_dtensor-cp": ("partial_dtensor", HSDP_CP_TP),
    "spmd_types": ("spmd_types", HSDP_TP),  # torchtitan's default backend
}
# FM_TITAN_CASES=spmd_types,full_dtensor runs only those (e.g. one case per torch venv)
SELECTED = [c for c in os.environ.get("FM_TITAN_CASES", ",".join(CASES)).split(",") if c]
UNKNOWN = sorted(set(SELECTED) - set(CASES))
STEPS = 4
LAUNCH_TIMEOUT_S = 420  # one torchrun: its workers give up (with stack dumps) after WORKER_DEADLINE_S
WORKER_DEADLINE_S = 360
GROUP_TIMEOUT_S = 120  # every process group's collectives


def launch(meshes: str, backend: str, degrees: dict[str, int], out: pathlib.Path) -> dict:
    """One torchrun of the worker; its result.json, or the test fails with the workers' output."""
    # --standalone: a c10d rendezvous on a free local port, so runs never collide
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
           "--max_restarts=0", str(WORKER), "--meshes", meshes, "--spmd-backend", backend, "--steps", str(STEPS),
           "--timeout", str(GROUP_TIMEOUT_S), "--deadline", str(WORKER_DEADLINE_S), "--out", str(out)]
    cmd += [arg for name, value in degrees.items() for arg in (f"--{name.replace('_', '-')}", str(value))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    # its own session, so a timeout ends torchrun together with its workers
    proc = subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{meshes}/{backend}: torchrun did not finish within {LAUNCH_TIMEOUT_S} s\n{output[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0 or not (out / "result.json").exists():
        pytest.fail(f"{meshes}/{backend}: torchrun exited {proc.returncode}\n{output[-6000:]}")
    result = json.loads((out / "result.json").read_text())
    result["wall_s"] = time.monotonic() - start
    return result


def _torch_at_least(major: int, minor: int) -> bool:
    import torch

    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (major, minor)


@pytest.fixture(scope="module", params=[c for c in CASES if c in SELECTED])
def runs(request, tmp_path_factory):
    """Both runs of one case: ``(case, {"torchtitan": result, "fm": result})``."""
    case = request.param
    backend, degrees = CASES[case]
    if backend == "spmd_types" and not _torch_at_least(2, 14):
        # torch 2.13's fully_shard with dp_mesh_dims requires DTensor parameters; torchtitan's
        # spmd_types backend hands it plain tensors with spmd_types annotations (torch 2.14 reads them)
        pytest.skip("torchtitan 0.3's spmd_types backend needs torch >= 2.14 (torch 2.13's fully_shard refuses its "
                    "plain-tensor parameters, whoever made the meshes); run this case in a torch 2.14.1 venv")
    base = tmp_path_factory.mktemp(f"titan-{case}")
    results = {m: launch(m, backend, degrees, base / m) for m in ("torchtitan", "fm")}
    for meshes, result in results.items():  # shown with -s; docs/torchtitan.md quotes them
        rank0 = result["ranks"][0]
        losses = [round(float.fromhex(s["loss"]), 6) for s in rank0["steps"]]
        print(f"\n{case} {meshes}: {len(rank0['groups'])} group creations on rank 0, losses {losses}, "
              f"build_mesh {rank0['timings']['build_mesh_s']:.2f} s, steps {rank0['timings']['steps_s']:.1f} s, "
              f"torchrun {result['wall_s']:.0f} s")
    return case, results


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)
def test_losses_and_grad_norms_are_bit_identical(runs):
    case, results = runs
    theirs, ours = results["torchtitan"]["ranks"], results["fm"]["ranks"]
    assert len(theirs) == len(ours) == NPROC
    for rank in range(NPROC):
        assert len(ours[rank]["steps"]) == STEPS
        for step, (a, b) in enumerate(zip(theirs[rank]["steps"], ours[rank]["steps"], strict=True)):
            assert a == b, f"{case} rank {rank} step {step}: torchtitan's meshes {a}, ours {b}"
    # the global loss is one value: every rank reports it
    assert len({tuple(s["loss"] for s in r["steps"]) for r in ours}) == 1


def test_selected_cases_exist():
    assert UNKNOWN == [], f"FM_TITAN_CASES names unknown cases {UNKNOWN}; valid: {list(CASES)}"


def _real_sets(groups: list[dict]) -> set[tuple[int, ...]]:
    return {tuple(c["ranks"]) for c in groups if c["kind"] == "new_group" and c["backend"] != "fake"}


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)
def test_each_group_once_and_none_behind_our_back(runs):
    _, results = runs
    for rank in range(NPROC):
        theirs = results["torchtitan"]["ranks"][rank]["groups"]
        ours = results["fm"]["ranks"][rank]["groups"]
        made = [tuple(c["ranks"]) for c in ours]
        assert all(c["kind"] == "new_group" for c in ours)
        assert len(made) == len(set(made)), f"rank {rank}: a rank set got two groups: {collections.Counter(made)}"
        assert [c for c in ours if c["phase"] != "build_mesh"] == [], "a group made after build_mesh (torch's own)"
        assert len(ours) < len(theirs), (len(ours), len(theirs))
        # every multi-rank group of ours is one torchtitan talks over, or of a fake axis given groups
        # only because this functional_mesh cannot leave it out of a torch mesh (mesh_efsdp)
        extra = {tuple(c["ranks"]) for c in ours if c["desc"] == "mesh_efsdp"}
        assert {m for m in made if len(m) > 1} <= _real_sets(theirs) | extra


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)
def test_no_more_groups_than_torchtitans_distinct_real_ones(runs):
    """The goal: ours <= torchtitan's distinct real rank sets (+ what the run itself needs, here none).

    The axes torchtitan keeps on its fake backend (size-1 axes, efsdp at ep = 1) get no group:
    ``rm.device_mesh`` keeps an axis left out by ``realize(axes=...)`` as a dim without a group.
    """
    case, results = runs
    for rank in range(NPROC):
        ours = results["fm"]["ranks"][rank]["groups"]
        bound = len(_real_sets(results["torchtitan"]["ranks"][rank]["groups"]))
        fake_axis_groups = [c for c in ours if c["local"] or c["desc"] == "mesh_efsdp"]
        assert len(ours) <= bound, (f"{case} rank {rank}: {len(ours)} groups against torchtitan's {bound} distinct "
                                    f"real ones; {len(fake_axis_groups)} of ours for axes torchtitan keeps on its "
                                    f"fake backend: {fake_axis_groups}")
