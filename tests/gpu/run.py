"""The GPU smoke run (``make gpu-smoke``): functional_mesh on CUDA, with only what the machine has.

    PYTHONPATH=. python3 tests/gpu/run.py            # what `make gpu-smoke` runs
    PYTHONPATH=. python3 tests/gpu/run.py --cpu      # the same checks on CPU tensors (a rehearsal)

Needs torch (2.11 or newer) and this repository on ``PYTHONPATH``; no pytest, no network, no
install. Without a GPU it prints why and exits 0. With one it runs, each as one torchrun job
under a time limit (:data:`LIMIT_S`; all together, probes and restarts included, at most
:data:`BUDGET_S`, 7 minutes):

- ``nccl-1``: one process, NCCL on cuda:0 (a world of 1);
- ``gloo-cuda``: 4 processes sharing the current GPU on gloo, CUDA tensors;
- ``nccl-multi``: one process per GPU on NCCL (2, 4 or 8 of them), only with 2 GPUs or more.

Each job runs the checks of ``tests/gpu/_checks.py`` (realize, every collective, DTensor
interop, a typed ``shard_map`` region, ``torch.compile`` of a region with backward, FSDP2 + TP,
abort), each against values computed in one process, and prints one ``CHECK`` line per check.
The last line is the summary, ``gpu-smoke: N passed, N failed, N skipped``; the exit code is 1
when a check failed or a job did not finish.

A job whose processes die (a segfault, a hang past its limit) before reporting every check does
not hide the rest: the check that was running (the first one not reported; each rank prints
``START <job>/<check> rank <r>`` before it) is a ``FAIL`` naming the rank, its signal or exit code
and its Python stack (faulthandler), and the job is started again with only the checks after it.

Before a gloo job, a torch-only probe (``_funcol_probe.py``, its own torchrun job, at most
:data:`PROBE_LIMIT_S`) asks whether torch's functional collectives work on gloo with that job's
tensors: on the first GPU run (torch 2.11.0+cu130) they segfaulted with CUDA tensors, and
everything that goes through them with them. The ``PROBE`` line says what it found; where they
crash, hang or compute wrongly, the checks that need them (``dtensor`` after its part without
communication, ``fsdp_tp``, ``compile_collectives``, ``compile``) are a ``SKIP`` that quotes it,
and the rest run (an eager ``shard_map`` region needs only our collectives, which call the
process group directly).
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIMIT_S = {"nccl-1": 150, "gloo-cuda": 180, "nccl-multi": 180, "gloo-cpu": 240}  # per torchrun job
PROBE_LIMIT_S = 180  # the torch-only probe of functional collectives before a gloo job (_funcol_probe.py); 90 s
# was too short for 4 processes to import torch at load 30 (a slow start read as a hang, and the checks skipped)
PROBE_STEPS = ("all_reduce", "all_gather_tensor")  # _funcol_probe.STEPS (tests/gpu/test_gpu_smoke.py checks it)
BUDGET_S = 420  # all jobs, restarts included: a restart gets what is left, at most its job's limit
# the checks, in the order _checks.py runs them (tests/gpu/test_gpu_smoke.py checks it is _checks.CHECKS')
EXPECTED = ("realize", "collectives", "dtensor", "shard_map", "fsdp_tp", "compile_collectives", "compile", "abort")


def environment() -> tuple[bool, int, str]:
    """``(has a GPU, GPU count, one line about torch and the devices)``; never raises."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - no torch at all: nothing to run
        return False, 0, f"torch does not import ({type(exc).__name__}: {exc})"
    line = f"python {sys.version.split()[0]}, torch {torch.__version__}"
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - a broken driver counts as no GPU
        return False, 0, f"{line}, CUDA unusable ({type(exc).__name__}: {exc})"
    if count == 0:
        return False, 0, f"{line}, CUDA available: False"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
    nccl = ""
    try:
        nccl = ", NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - informational only
        pass
    return True, count, f"{line}, CUDA {torch.version.cuda}{nccl}, {count} GPU(s): {names}"


def torchrun(script: str, args: list[str], nproc: int, limit: float,
             extra_env: dict[str, str] | None = None) -> tuple[str, str, str, float]:
    """Run ``script`` under torchrun on ``nproc`` processes: ``(stdout, stderr, problem, seconds)``.

    ``problem`` is "" when it exited 0, else its exit code or that it ran past ``limit`` (then its
    whole session is killed: torchrun and its workers go together, no orphan keeps the GPU).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / script), *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        problem = "" if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        problem = f"did not finish within {limit:.0f} s"
    return out, err, problem, time.perf_counter() - t0


def run_case(case: str, nproc: int, checks: list[str], limit: float,
             extra_env: dict[str, str] | None = None) -> tuple[list[tuple[str, str, str]], str, str, str]:
    """Run one torchrun job of ``checks``; ``([(check, verdict, line)], summary, problem, output)``."""
    out, err, problem, took = torchrun("_checks.py", [case, ",".join(checks)], nproc, limit, extra_env)
    results = []
    for line in out.splitlines():
        if line.startswith("CHECK "):
            parts = line.split(" ", 3)
            results.append((parts[1].split("/", 1)[1], parts[2], line))
    label = case if checks == list(EXPECTED) else f"{case} ({','.join(checks)})"
    return results, f"{label}: {nproc} process(es), {took:.1f} s{', ' + problem if problem else ''}", problem, \
        err + "\n" + out


def probe_funcol(case: str, device_type: str, nproc: int, limit: float) -> str:
    """Whether torch's functional collectives work on gloo with ``device_type`` tensors: "" if so, else why not.

    A torch-only job (``_funcol_probe.py``) in its own processes, so that a crash there costs
    nothing but the probe: on the first GPU run (torch 2.11.0+cu130) ``funcol`` on gloo with CUDA
    tensors segfaulted, and everything that goes through it with it (DTensor's redistributions,
    TP, compiled collectives). Prints one ``PROBE`` line, and the Python stack when a process died.
    """
    out, err, problem, took = torchrun("_funcol_probe.py", [device_type], nproc, limit)
    output = err + "\n" + out
    steps = PROBE_STEPS
    ok = [s for s in steps if len(re.findall(rf"^OK {s} rank \d+$", out, re.M)) == nproc]
    if len(ok) == len(steps) and not problem.startswith("did not finish"):
        # every rank got every step right: that answers the question, even if a process died later
        # (torch's gloo threads can abort one in interpreter finalization, after the group is destroyed)
        after = f" (then {cause(output, problem)}, after every step had passed)" if problem else ""
        print(f"PROBE {case}/funcol OK [{took:.1f} s] torch's functional {' and '.join(steps)} on gloo with "
              f"{device_type} tensors, {nproc} processes, equal to one process: the checks that need them run"
              f"{after}", flush=True)
        return ""
    # the last step any rank started (the ranks run them in step; a rank's death ends the others as
    # they finish the step before, whose OK they may not have printed yet)
    started = [s for s in steps if re.search(rf"^START {s} rank \d+$", out, re.M)]
    step = started[-1] if started else "init_process_group"
    wrong = re.search(r"^WRONG (\S+) rank \d+: .*$", out, re.M)
    if wrong:
        step = wrong.group(1)
        what = f"gave wrong values ({wrong.group(0)})"
    elif problem.startswith("did not finish"):
        what = f"hung ({problem})"
    else:
        what = f"crashed ({cause(output, problem) or 'not every rank reported OK'})"
    reason = (f"torch's own functional {step} on gloo with {device_type} tensors {what} in a torch-only probe "
              f"(tests/gpu/_funcol_probe.py, {nproc} processes)")
    print(f"PROBE {case}/funcol BROKEN [{took:.1f} s] {reason}: the checks that go through torch's functional "
          f"collectives skip", flush=True)
    stack = fatal_stack(output)
    if stack:
        print(f"  --- {case}/funcol probe: the Python stack at the fatal signal ---\n{stack}\n  ---", flush=True)
    return reason


def first_failure(case: str, output: str) -> None:
    """Print the first rank's traceback of a failed check (each rank prints one to stderr)."""
    lines = output.splitlines()
    first = next((i for i, t in enumerate(lines) if " failed:" in t and t.startswith("rank ")), None)
    if first is not None:
        print(f"  --- {case}: the first failure ---\n" + "\n".join(lines[first:first + 30]) + "\n  ---", flush=True)


def cause(output: str, problem: str) -> str:
    """Why torchrun's job died (rank, exit code, signal), else ``problem``.

    The rank that a signal killed (not torchrun's own SIGTERM to the rest) before torchrun's "root
    cause", which is only the first exit it observed: a rank that lost its peer can exit before the
    dead one is noticed.
    """
    start = min((i for i in (output.find("Failures:"), output.find("Root Cause")) if i >= 0), default=-1)
    if start < 0:
        return problem
    root = output.find("Root Cause")
    everyone = _failures(output[start:])
    first = _failures(output[root:])[:1] if root >= 0 else []
    killed = [f for f in first + everyone if f[1].startswith("-") and f[1] != f"-{int(signal.SIGTERM)}"]
    picked = (killed or first or everyone or [("?", "?", problem)])[0]
    return f"rank {picked[0]} died, exit code {picked[1]} ({picked[2]})"


def _failures(report: str) -> list[tuple[str, str, str]]:
    """``(rank, exit code, reason)`` of each ``[i]:`` entry of torchrun's failure report, in its order."""
    out = []
    for entry in re.split(r"\n\s*\[\d+\]:", report)[1:]:
        rank = re.search(r"rank\s*:\s*(\d+)", entry)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", entry)
        why = re.search(r"traceback\s*:\s*(.+)", entry)
        if code:
            out.append((rank.group(1) if rank else "?", code.group(1),
                        why.group(1).strip() if why else "no reason given"))
    return out


def fatal_stack(output: str) -> str:
    """faulthandler's report of the first fatal signal (its first 40 lines), or ""."""
    lines = output.splitlines()
    first = next((i for i, t in enumerate(lines) if "Fatal Python error" in t), None)
    if first is None:
        return ""
    end = next((i for i in range(first, min(first + 40, len(lines))) if lines[i].startswith("Extension modules")),
               min(first + 40, len(lines)))
    return "\n".join(lines[first:end]).rstrip()


def run_job(case: str, nproc: int, only: str, deadline: float,
            extra_env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """Every check of ``case`` (or of ``only``), restarting the job after a death; ``(passed, failed, skipped)``.

    A job that ends before reporting all its checks died in the last check any rank started (the
    ranks run the checks in step): that check is a ``FAIL`` with the cause (what it reported
    itself, if anything, is the other ranks losing their peer), and the checks after it run in a
    new job. A job that died before starting any check is not started again.
    """
    todo = [c for c in EXPECTED if not only or c in only.split(",")]
    passed = failed = skipped = 0
    while todo:
        left = deadline - time.perf_counter()
        if left < 20:
            failed += len(todo)
            print(f"CHECK {case}/{','.join(todo)} FAIL not run: the smoke's {BUDGET_S} s were spent", flush=True)
            break
        results, summary, problem, output = run_case(case, nproc, todo, min(LIMIT_S[case], left), extra_env)
        reported = {name for name, _, _ in results}
        started = [c for c in todo if re.search(rf"^START {re.escape(case)}/{re.escape(c)} rank \d+$", output, re.M)]
        died = problem and any(c not in reported for c in todo)
        dead = started[-1] if died and started else None
        for name, verdict, line in results:
            if name != dead:
                print(line, flush=True)
                passed, failed, skipped = passed + (verdict == "PASS"), failed + (verdict == "FAIL"), \
                    skipped + (verdict == "SKIP")
        print(f"  [{summary}]", flush=True)
        if any(v == "FAIL" and name != dead for name, v, _ in results):
            first_failure(case, output)
        if not died:
            break
        if dead is None:
            failed += len(todo) - len(reported)
            print(f"CHECK {case}/{','.join(c for c in todo if c not in reported)} FAIL not run: the job died before "
                  f"its first check ({problem})\n  --- {case}: the last lines ---\n"
                  + "\n".join(output.splitlines()[-30:]) + "\n  ---", flush=True)
            break
        failed += 1
        ranks = sorted(int(r) for r in re.findall(rf"^START {re.escape(case)}/{re.escape(dead)} rank (\d+)$",
                                                  output, re.M))
        print(f"CHECK {case}/{dead} FAIL crashed: {cause(output, problem)}; ranks that had started it: {ranks}",
              flush=True)
        stack = fatal_stack(output)
        print(f"  --- {case}/{dead}: " + (f"the Python stack at the fatal signal ---\n{stack}" if stack else
                                          "the last lines ---\n" + "\n".join(output.splitlines()[-30:]))
              + "\n  ---", flush=True)
        todo = [c for c in todo[todo.index(dead) + 1:] if c not in reported]
        if todo:
            print(f"  [{case}: started again for {','.join(todo)}]", flush=True)
    return passed, failed, skipped


def main(argv: list[str]) -> int:
    cpu = "--cpu" in argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), "")
    has_gpu, count, line = environment()
    print(f"gpu-smoke: {line}", flush=True)
    if cpu:
        plan = [("gloo-cpu", 4)]
    elif not has_gpu:
        print("gpu-smoke: no GPU here: skipped (0 passed, 0 failed, 1 skipped)", flush=True)
        return 0
    else:
        plan = [("nccl-1", 1), ("gloo-cuda", 4)]
        multi = max(n for n in (1, 2, 4, 8) if n <= count)
        if multi >= 2:
            plan.append(("nccl-multi", multi))
        else:
            print("CHECK nccl-multi/* SKIP only 1 GPU: NCCL across GPUs, split_group and the layout cache on "
                  "several GPUs need 2 or more", flush=True)
    t0 = time.perf_counter()
    passed = failed = 0
    skipped = int(not cpu and len(plan) == 2)
    for case, nproc in plan:
        extra_env = {}
        if case.startswith("gloo"):  # torch's functional collectives on gloo with this job's tensors: do they work?
            left = t0 + BUDGET_S - time.perf_counter()
            broken = probe_funcol(case, case.split("-")[1], nproc, min(PROBE_LIMIT_S, left))
            if broken:
                extra_env["FM_GPU_SMOKE_NO_FUNCOL"] = broken
        p, f, s = run_job(case, nproc, only, t0 + BUDGET_S, extra_env)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    print(f"gpu-smoke: {passed} passed, {failed} failed, {skipped} skipped in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
