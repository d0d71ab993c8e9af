"""torchtitan 0.3.0's models, trained on 8 gloo workers with torchtitan's meshes and with ours.

Each run is one ``torchrun --nproc_per_node=8`` of _worker.py, 4 AdamW steps from fixed seeds and
batches, with torchtitan's own parallelize functions and training step:

- llama3 at dim 64, 2 layers, vocab 256: HSDP 2 x 2 x TP 2 (sequence 32) under "partial_dtensor",
  "full_dtensor" and "spmd_types"; HSDP 2 x CP 2 x TP 2 (sequence 256) under "partial_dtensor";
  PP 2 (its 1F1B schedule, 2 microbatches) x FSDP 2 x TP 2 under "full_dtensor";
- deepseek_v3, its "debugmodel" at CPU widths (8 routed + 2 shared experts, top-3): EP 2 with HSDP
  2 x 4 under "partial_dtensor", tokens exchanged by torchtitan's all-to-all dispatcher over "ep".

Per case, the two runs must give bit-identical losses and gradient norms on every rank, and ours
must make fewer process groups: each distinct rank set once, never one during training (torch
finds ours), and no more than torchtitan's distinct real rank sets (the axes it keeps on its fake
backend get none).

~45-65 s per run on the two shared cores (most of it 8 processes importing torch and torchtitan);
``FM_TITAN_CASES=partial_dtensor-ep,full_dtensor-pp`` runs only the cases it names. Not part of
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

from tests._torch_features import fsdp_spmd_types_failure

from ._titan import require_torchtitan

require_torchtitan()

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "_worker.py"
NPROC = 8
HSDP_TP = {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "seq": 32}
# context parallelism over flex attention needs a sequence divisible by cp * 128 (its block size)
HSDP_CP_TP = {"dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2, "seq": 256}
# expert parallelism: the sparse view is (dp_replicate 2, efsdp 2, ep 2), the dense one HSDP 2 x 4
HSDP_EP = {"model": "deepseek_v3", "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 1, "ep": 2, "seq": 32}
# pipeline parallelism: 2 stages (tok_embeddings + layer 0 | layer 1 + norm + lm_head), 1F1B over
# 2 microbatches of one row each, FSDP 2 x TP 2 inside each stage
PP_FSDP_TP = {"pp": 2, "pp_schedule": "1F1B", "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2, "seq": 32}
CASES = {  # id: (spmd_backend, degrees). full_dtensor + CP runs, but DTensor's redistribute planner
    # spends minutes per step on a 4-D mesh with 8 processes sharing 2 cores: not here.
    "partial_dtensor": ("partial_dtensor", HSDP_TP),
    "full_dtensor": ("full_dtensor", HSDP_TP),
    "partial_dtensor-cp": ("partial_dtensor", HSDP_CP_TP),
    "spmd_types": ("spmd_types", HSDP_TP),  # torchtitan's default backend
    # deepseek_v3's MoE. Not spmd_types: its uneven all_to_all is a list all-to-all of unequal chunks,
    # which gloo refuses (on torchtitan's meshes too; docs/torchtitan.md)
    "partial_dtensor-ep": ("partial_dtensor", HSDP_EP),
    # PP under full_dtensor, where stages send DTensors and rebuild their meshes by name and layout
    "full_dtensor-pp": ("full_dtensor", PP_FSDP_TP),
}
# FM_TITAN_CASES=spmd_types,full_dtensor runs only those (e.g. one case per torch venv)
SELECTED = [c for c in os.environ.get("FM_TITAN_CASES", ",".join(CASES)).split(",") if c]
UNKNOWN = sorted(set(SELECTED) - set(CASES))
STEPS = 4
LAUNCH_TIMEOUT_S = 420  # one torchrun: its workers give up (with stack dumps) after WORKER_DEADLINE_S
WORKER_DEADLINE_S = 360
GROUP_TIMEOUT_S = 120  # every process group's collectives


def launch(meshes: str, backend: str, degrees: dict[str, int | str], out: pathlib.Path) -> dict:
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


@pytest.fixture(scope="module", params=[c for c in CASES if c in SELECTED])
def runs(request, tmp_path_factory):
    """Both runs of one case: ``(case, {"torchtitan": result, "fm": result})``."""
    case = request.param
    backend, degrees = CASES[case]
    failure = fsdp_spmd_types_failure() if backend == "spmd_types" else None
    if failure:
        pytest.skip(f"torchtitan 0.3's spmd_types backend: {failure}; run this case in a torch 2.14.1 venv "
                    "(`make test-torchtitan TORCH=2.14.1`)")
    base = tmp_path_factory.mktemp(f"titan-{case}")
    results = {m: launch(m, backend, degrees, base / m) for m in ("torchtitan", "fm")}
    for meshes, result in results.items():  # shown with -s; docs/torchtitan.md quotes them
        rank0 = result["ranks"][0]
        # the last rank's global losses: with PP, the first stage's ranks hold a placeholder
        losses = [round(float.fromhex(s["loss"]), 6) for s in result["ranks"][-1]["steps"]]
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
    # the global loss is one value: every rank reports it (with PP, every rank of the last stage)
    if CASES[case][1].get("pp", 1) == 1:
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


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)
def test_moe_tokens_cross_our_ep_group_in_uneven_all_to_alls(runs):
    """deepseek_v3 with EP: torchtitan's dispatcher ran its all-to-all with splits over "ep" of our
    sparse view, with uneven splits (no capacity, nothing dropped), the same splits as on its meshes."""
    case, results = runs
    if CASES[case][1].get("ep", 1) == 1:
        pytest.skip(f"{case} has no expert parallelism")
    ep = CASES[case][1]["ep"]
    for rank in range(NPROC):
        theirs = results["torchtitan"]["ranks"][rank]["token_exchanges"]
        ours = results["fm"]["ranks"][rank]["token_exchanges"]
        # one dispatch per MoE layer (2) per step
        assert len(ours) == 2 * STEPS, ours
        assert [(e["ranks"], e["input_splits"], e["output_splits"]) for e in ours] == \
            [(e["ranks"], e["input_splits"], e["output_splits"]) for e in theirs]
        assert all(e["ours"] is True for e in ours), "the dispatcher's group is not the sparse view's 'ep' group"
        # ep is the innermost axis of the sparse view: rank r exchanges with its ep neighbours
        assert all(e["ranks"] == list(range(rank - rank % ep, rank - rank % ep + ep)) for e in ours)
    splits = [tuple(e["input_splits"]) for r in results["fm"]["ranks"] for e in r["token_exchanges"]]
    assert any(len(set(s)) > 1 for s in splits), f"every exchange was even: {splits}"


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 60)
def test_pipeline_stages_split_over_pp(runs):
    """PP 2: the first stage's ranks (pp coordinate 0) report torchtitan's placeholder loss, -1 per
    batch rank; the last stage's ranks the real one, equal on all of them."""
    case, results = runs
    degrees = CASES[case][1]
    if degrees.get("pp", 1) == 1:
        pytest.skip(f"{case} has no pipeline parallelism")
    stage_size = NPROC // degrees["pp"]
    batch = degrees["dp_replicate"] * degrees["dp_shard"]
    ours = results["fm"]["ranks"]
    first = {tuple(s["loss"] for s in r["steps"]) for r in ours[:stage_size]}
    last = {tuple(s["loss"] for s in r["steps"]) for r in ours[stage_size:]}
    assert first == {(float(-batch).hex(),) * STEPS}
    assert len(last) == 1 and all(float.fromhex(v) > 0 for v in next(iter(last)))
    # full_dtensor: each stage rebuilt the received DTensors' meshes by dim names, and our meshes passed
    # the layout check (a None would have failed the step), as torchtitan's did
    if CASES[case][0] == "full_dtensor":
        for rank in range(NPROC):
            asked = results["fm"]["ranks"][rank]["stage_meshes"]
            assert asked and all(m["found"] for m in asked), asked
            assert asked == results["torchtitan"]["ranks"][rank]["stage_meshes"]
