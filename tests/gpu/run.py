"""The GPU smoke run (``make gpu-smoke``): functional_mesh on CUDA, with only what the machine has.

    PYTHONPATH=. python3 tests/gpu/run.py            # what `make gpu-smoke` runs
    PYTHONPATH=. python3 tests/gpu/run.py --cpu      # the same checks on CPU tensors (a rehearsal)

Needs torch (2.11 or newer) and this repository on ``PYTHONPATH``; no pytest, no network, no
install. Without a GPU it prints why and exits 0. With one it runs, each as one torchrun job
under a time limit (:data:`LIMIT_S`; all together well under 5 minutes):

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


def run_case(case: str, nproc: int, checks: list[str], limit: float) -> tuple[list[tuple[str, str, str]], str, str]:
    """Run one torchrun job of ``checks``; ``([(check, verdict, line)], problem, stderr)`` from its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / "_checks.py"), case, ",".join(checks)]
    t0 = time.perf_counter()
    # its own session: past the limit, torchrun and its workers go together (no orphan keeps the GPU)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        problem = "" if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        problem = f"did not finish within {limit:.0f} s"
    took = time.perf_counter() - t0
    results = []
    for line in out.splitlines():
        if line.startswith("CHECK "):
            parts = line.split(" ", 3)
            results.append((parts[1].split("/", 1)[1], parts[2], line))
    label = case if checks == list(EXPECTED) else f"{case} ({','.join(checks)})"
    return results, f"{label}: {nproc} process(es), {took:.1f} s{', ' + problem if problem else ''}", problem, \
        err + "\n" + out


def first_failure(case: str, output: str) -> None:
    """Print the first rank's traceback of a failed check (each rank prints one to stderr)."""
    lines = output.splitlines()
    first = next((i for i, t in enumerate(lines) if " failed:" in t and t.startswith("rank ")), None)
    if first is not None:
        print(f"  --- {case}: the first failure ---\n" + "\n".join(lines[first:first + 30]) + "\n  ---", flush=True)


def cause(output: str, problem: str) -> str:
    """Why torchrun's job died: its root cause (rank, exit code, signal), else ``problem``."""
    root = output.find("Root Cause")
    if root < 0:
        return problem
    block = output[root:root + 800]
    rank = re.search(r"rank\s*:\s*(\d+)", block)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
    why = re.search(r"traceback\s*:\s*(.+)", block)
    return (f"rank {rank.group(1) if rank else '?'} died, exit code {code.group(1) if code else '?'}"
            f" ({why.group(1).strip() if why else 'no reason given'})")


def fatal_stack(output: str) -> str:
    """faulthandler's report of the first fatal signal (its first 40 lines), or ""."""
    lines = output.splitlines()
    first = next((i for i, t in enumerate(lines) if "Fatal Python error" in t), None)
    if first is None:
        return ""
    end = next((i for i in range(first, min(first + 40, len(lines))) if lines[i].startswith("Extension modules")),
               min(first + 40, len(lines)))
    return "\n".join(lines[first:end]).rstrip()


def run_job(case: str, nproc: int, only: str, deadline: float) -> tuple[int, int, int]:
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
        results, summary, problem, output = run_case(case, nproc, todo, min(LIMIT_S[case], left))
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
        p, f, s = run_job(case, nproc, only, t0 + BUDGET_S)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    print(f"gpu-smoke: {passed} passed, {failed} failed, {skipped} skipped in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
