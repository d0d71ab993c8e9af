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
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIMIT_S = {"nccl-1": 150, "gloo-cuda": 180, "nccl-multi": 180, "gloo-cpu": 240}
EXPECTED = ("realize", "collectives", "compile_collectives", "dtensor", "shard_map", "compile", "fsdp_tp", "abort")


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


def run_case(case: str, nproc: int, only: str = "") -> tuple[list[tuple[str, str, str]], str]:
    """Run one torchrun job; ``([(check, verdict, line)], problem)`` from its ``CHECK`` lines."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / "_checks.py"), case, only]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S[case])
        out, err, problem = proc.stdout, proc.stderr, "" if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        problem = f"did not finish within {LIMIT_S[case]} s"
    took = time.perf_counter() - t0
    results = []
    for line in out.splitlines():
        if line.startswith("CHECK "):
            print(line, flush=True)
            parts = line.split(" ", 3)
            results.append((parts[1], parts[2], line))
    print(f"  [{case}: {nproc} process(es), {took:.1f} s{', ' + problem if problem else ''}]", flush=True)
    if problem or any(v == "FAIL" for _, v, _ in results):
        lines = (err + "\n" + out).splitlines()
        first = next((i for i, t in enumerate(lines) if " failed:" in t and t.startswith("rank ")), None)
        shown = lines[first:first + 30] if first is not None else lines[-30:]
        print(f"  --- {case}: {'the first failure' if first is not None else 'the last lines'} ---\n"
              + "\n".join(shown) + "\n  ---", flush=True)
    return results, problem


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
    passed = failed = skipped = 0
    skipped += not cpu and len(plan) == 2
    for case, nproc in plan:
        results, problem = run_case(case, nproc, only)
        passed += sum(v == "PASS" for _, v, _ in results)
        failed += sum(v == "FAIL" for _, v, _ in results)
        skipped += sum(v == "SKIP" for _, v, _ in results)
        seen = {name.split("/", 1)[1] for name, _, _ in results}
        missing = [c for c in EXPECTED if c not in seen and (not only or c in only.split(","))]
        if missing:  # a job that died or hung before reporting them
            failed += len(missing)
            print(f"CHECK {case}/{','.join(missing)} FAIL not reported ({problem or 'the job ended early'})",
                  flush=True)
    print(f"gpu-smoke: {passed} passed, {failed} failed, {skipped} skipped in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
