"""A torch-only probe: do torch's functional collectives work on gloo with this device's tensors?

    PYTHONPATH=. python3 -m torch.distributed.run --standalone --nproc_per_node=4 tests/gpu/_funcol_probe.py cuda

``tests/gpu/run.py`` starts it before the ``gloo-cuda`` job, in its own processes and under a
time limit, because on the first GPU run (an H200, torch 2.11.0+cu130) every process that reached
``torch.distributed._functional_collectives`` on gloo with CUDA tensors died with SIGSEGV: DTensor's
``redistribute`` and ``full_tensor`` (``all_gather_single``), FSDP2 + TP (TP's redistributions),
and inductor's call of a compiled collective. This script reproduces that with torch alone: no
functional_mesh, one tensor per step, the value checked against what one process computes.

Each step prints ``START <step> rank <r>`` before it and ``OK <step> rank <r>`` after it (one write
each, flushed: a process that dies leaves its last ``START`` as the last word). Steps, in order:
``all_reduce`` (``funcol.all_reduce``, a sum) and ``all_gather_tensor`` (``funcol.all_gather_tensor``,
dim 0), each waited for (``funcol.wait_tensor``). Exit code 0 when both are right on every rank.

``FM_GPU_SMOKE_PROBE_CRASH=<step>`` makes rank 1 kill itself with SIGSEGV as that step starts, and
``FM_GPU_SMOKE_PROBE_CRASH=exit`` with SIGABRT after every step passed and the group was destroyed:
how ``tests/gpu/test_gpu_smoke.py`` shows, without a GPU, what the runner does with a crashing probe.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

STEPS = ("all_reduce", "all_gather_tensor")


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: list[str]) -> int:
    device_type = argv[0] if argv else "cuda"
    if device_type not in ("cuda", "cpu"):
        print(f"usage: _funcol_probe.py cuda|cpu; got {argv}", file=sys.stderr)
        return 2
    faulthandler.enable(all_threads=True)
    if device_type == "cuda":
        torch.cuda.set_device(0)  # every process on the one current GPU, as the gloo-cuda job runs
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    group = dist.group.WORLD
    crash = os.environ.get("FM_GPU_SMOKE_PROBE_CRASH", "")
    x = torch.arange(4, dtype=torch.float32, device=device) + 10 * rank
    want = {"all_reduce": sum(torch.arange(4, dtype=torch.float32) + 10 * r for r in range(world)),
            "all_gather_tensor": torch.cat([torch.arange(4, dtype=torch.float32) + 10 * r for r in range(world)])}
    wrong = []
    for step in STEPS:
        say(f"START {step} rank {rank}")
        if step == crash and rank == min(1, world - 1):
            os.kill(os.getpid(), signal.SIGSEGV)
        if step == "all_reduce":
            got = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
        else:
            got = funcol.wait_tensor(funcol.all_gather_tensor(x, 0, group))
        if torch.equal(got.cpu(), want[step]):
            say(f"OK {step} rank {rank}")
        else:
            wrong.append(step)
            say(f"WRONG {step} rank {rank}: {got.cpu().tolist()} != {want[step].tolist()}")
    dist.barrier()
    dist.destroy_process_group()
    if crash == "exit" and rank == min(1, world - 1):
        os.kill(os.getpid(), signal.SIGABRT)  # as torch's gloo threads did in interpreter finalization
    return 1 if wrong else 0


if __name__ == "__main__":
    from tests._exit import exit_now  # the repository is on PYTHONPATH (run.py sets it)

    exit_now(main(sys.argv[1:]))
