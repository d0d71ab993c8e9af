"""How a benchmark runs: its options and run record, workers in fresh interpreters, gloo pools, timing, group counting.

A worker (``python <script> --worker '<json spec>'``) prints its result as one JSON line: each side of a
comparison gets a fresh interpreter, so no import, cache or group carries over. Rendering is ``_report``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import _report as R  # this folder is sys.path[0] when a script here runs


def parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark has: ``--quick`` and ``--out``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, help="write the records here (JSON lines) for benchmarks/_report.py")
    return p


def mlp_parser(doc: str, default_reps: int) -> argparse.ArgumentParser:
    """The options of the MLP step benchmarks (bench_shard_map, bench_compile): world, sizes, repetitions."""
    p = parser(doc, "30 repetitions")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--reps", type=int, help=f"timed repetitions per series (default {default_reps}; quick 30)")
    p.set_defaults(default_reps=default_reps)
    return p


def mlp_row(args: argparse.Namespace) -> str:
    """An MLP step benchmark's configuration, as its table row names it."""
    return f"W={args.world}, hidden {args.hidden}, batch {args.batch}, float32"


def start_run(bench: str) -> R.Run:
    """A :class:`Run` for this process: its command line as typed, the machine, the load now."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "PYTHONPATH") if os.environ.get(k))
    python = os.path.relpath(sys.executable, R.REPO) if sys.executable.startswith(str(R.REPO)) else "python"
    script = os.path.relpath(os.path.abspath(sys.argv[0]), R.REPO)
    cmd = " ".join(x for x in (env, python, shlex.join([script, *sys.argv[1:]])) if x)
    machine = (f"{len(os.sched_getaffinity(0))} cores, {platform.system()} {platform.machine()}, "
               f"CPython {platform.python_version()}, torch {importlib.metadata.version('torch')}")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return R.Run(bench, cmd, now, machine, load=f"{os.getloadavg()[0]:.2f}")


def revision() -> str:
    """The tree measured (call it at the start): its commit, and whether ``functional_mesh/`` differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=R.REPO, capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "functional_mesh") and ", functional_mesh/ with uncommitted changes"
    return f"tree: commit {git('rev-parse', '--short', 'HEAD')}{dirty}"


def finish_run(run: R.Run, wall_s: float, notes: Sequence[str] = ()) -> R.Run:
    """``run`` with its wall time, the load now and ``notes``."""
    return dataclasses.replace(run, load=f"{run.load} / {os.getloadavg()[0]:.2f}", wall_s=wall_s, notes=tuple(notes))


def serve(workers: dict[str, Callable[..., Any]]) -> None:
    """When this process is a worker: run ``workers[spec["fn"]](**spec)``, print the result, exit."""
    if sys.argv[1:2] != ["--worker"]:
        return
    spec = json.loads(sys.argv[2])
    print(json.dumps(workers[spec.pop("fn")](**spec)), flush=True)
    os._exit(0)  # skip interpreter teardown: seconds with torch loaded, times W processes


def _start(script: str, spec: dict[str, Any], extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(extra or {})}
    return subprocess.Popen([sys.executable, script, "--worker", json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _collect(procs: Sequence[subprocess.Popen], timeout_s: float) -> list[Any]:
    """Each worker's last stdout line, parsed; kills the others (ours only) when one fails."""
    try:
        outs = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout_s)
            if p.returncode:
                raise RuntimeError(f"worker {p.args[-1]} exited with {p.returncode}:\n{stderr[-3000:]}")
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def run(script: str, spec: dict[str, Any], *, timeout_s: float = 900, env: dict[str, str] | None = None) -> Any:
    """One worker in a fresh interpreter (``env``: variables set for it alone)."""
    return _collect([_start(script, spec, env)], timeout_s)[0]


def run_pool(script: str, spec: dict[str, Any], world: int, timeout_s: float = 600) -> list[Any]:
    """``world`` workers on 127.0.0.1 sharing a free port; worker ``r`` gets ``rank=r, world, port``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return _collect([_start(script, {**spec, "rank": r, "world": world, "port": port}) for r in range(world)], timeout_s)


def alternate(sides: Sequence[str], rounds: int) -> Iterator[str]:
    """``sides`` in order, then reversed, then in order...: a slow phase of the machine hits all alike."""
    for r in range(rounds):
        yield from (sides if r % 2 == 0 else reversed(sides))


def rotated_samples(calls: dict[str, Callable[[], Any]], reps: int, warmup: int, *, number: int = 1,
                    barrier: bool = True, clock: Callable[[], int] | None = None) -> dict[str, list[float]]:
    """Per call, ``reps`` timings (ns per call) of ``number`` calls each, round-robin in a rotating order
    (each series first equally often), after ``warmup`` rounds, the cyclic GC off; ``dist.barrier()`` before
    each block unless ``barrier=False``. ``clock``: wall time, or e.g. ``time.process_time_ns`` (CPU time)."""
    import torch.distributed as dist

    clock = clock or time.perf_counter_ns
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + reps):
            for name in names[i % len(names):] + names[:i % len(names)]:
                call = calls[name]
                if barrier:
                    dist.barrier()
                t0 = clock()
                for _ in range(number):
                    call()
                if i >= warmup:
                    samples[name].append((clock() - t0) / number)
    finally:
        gc.enable()
    return samples


def init_gloo(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def init_fake(world: int, rank: int = 0) -> None:
    """Be ``rank`` of a ``world``-rank job under torch's single-process fake backend."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


class GroupCalls:
    """Counts ``new_group`` / ``split_group`` calls wherever torch and realize look them up: the ranks each
    call asked for, in order, and the groups returned (to destroy them). ``mark()`` closes a step."""

    def __init__(self) -> None:
        import torch.distributed as dist
        from torch.distributed import device_mesh
        from torch.distributed import distributed_c10d as c10d

        self.reset()
        for name in ("new_group", "split_group"):
            real = getattr(c10d, name)
            wrapped = self._wrap(real, name)
            for module in (c10d, dist, device_mesh):
                if getattr(module, name, None) is real:
                    setattr(module, name, wrapped)

    def _wrap(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if name == "new_group":
                asked = tuple(kwargs.get("ranks", args[0] if args else None) or ())
            else:  # split_group(parent_pg, split_ranks, ...)
                asked = tuple(map(tuple, kwargs.get("split_ranks", args[1] if len(args) > 1 else None) or ()))
            self.requested.append(asked)
            self.groups.append(group := real(*args, **kwargs))
            return group
        return counted

    def reset(self) -> None:
        self.requested: list[tuple] = []
        self.groups: list[Any] = []
        self.steps: list[int] = []

    def mark(self) -> None:
        self.steps.append(len(self.requested))

    def per_step(self) -> list[int]:
        return [b - a for a, b in zip([0, *self.steps], self.steps)]
