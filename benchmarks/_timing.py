"""Small timing and reporting helpers shared by the benchmarks in this folder.

No dependencies beyond the standard library. The pieces:

- :func:`measure_many` / :func:`measure`: repeated runs of a batch of calls timed with
  ``time.perf_counter_ns``; each run's per-call time is the batch time divided by the batch
  size, and the :class:`Timing` returned reports the median (and min/max) over runs. The
  batch size is calibrated so that one run lasts about ``target_ms``; an operation slower
  than that runs one call per batch. Several cases are timed round-robin (run 1 of each,
  then run 2, ...) so drifting machine speed hits them alike. A :class:`Case` ``setup``
  builds fresh arguments outside the timed region (e.g. a fresh object per call, to time a
  first-call-only cost such as a lazily cached hash).
- :func:`loop_overhead_ns`: what the timing loop itself costs per call (not subtracted).
- :func:`traced_bytes`: ``tracemalloc``-measured memory that one object keeps alive.
- :func:`fmt_ns`, :func:`fmt_bytes`, :func:`fmt_ratio`, :func:`fmt_int`: fixed-style text.
- :func:`markdown_table`: a GitHub-flavoured markdown table (also readable on a terminal).
- :func:`machine_info`: date, CPU count and model, Python, numpy and torch versions.
- :func:`replace_section`: rewrite the text between two marker comments of a markdown file,
  so reruns refresh a benchmark's own section and leave the rest of the file alone.

Benchmarks report, they do not assert on timings.
"""

from __future__ import annotations

import argparse

import datetime as _dt
import gc
import math
import os
import platform
import re
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Case",
    "Timing",
    "fmt_bytes",
    "fmt_int",
    "fmt_ns",
    "fmt_ratio",
    "loop_overhead_ns",
    "machine_info",
    "markdown_table",
    "measure",
    "measure_many",
    "replace_section",
    "traced_bytes",
]

_clock = time.perf_counter_ns


@dataclass(frozen=True)
class Timing:
    """Per-call times (ns) of each run, and the batch size every run used."""

    per_call_ns: tuple[float, ...]
    batch: int

    @property
    def runs(self) -> int:
        return len(self.per_call_ns)

    @property
    def median_ns(self) -> float:
        return statistics.median(self.per_call_ns)

    @property
    def min_ns(self) -> float:
        return min(self.per_call_ns)

    @property
    def max_ns(self) -> float:
        return max(self.per_call_ns)

    def as_dict(self) -> dict[str, Any]:
        return {"per_call_ns": list(self.per_call_ns), "batch": self.batch, "median_ns": self.median_ns}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timing:
        return cls(tuple(d["per_call_ns"]), int(d["batch"]))


def _run(fn: Callable[..., Any], batch: int, setup: Callable[[int], Sequence[Any]] | None) -> int:
    """Time one batch of calls; returns the elapsed ns (setup excluded)."""
    if setup is None:
        rng = range(batch)
        t0 = _clock()
        for _ in rng:
            fn()
        return _clock() - t0
    args = setup(batch)
    t0 = _clock()
    for a in args:
        fn(a)
    elapsed = _clock() - t0
    del args
    return elapsed


@dataclass(frozen=True)
class Case:
    """One thing to time: ``fn()``, or ``fn(arg)`` for each ``arg`` of ``setup(batch)``.

    ``setup`` builds the arguments of one run outside the timed region (e.g. fresh objects,
    to time a first-call-only cost such as a lazily cached hash). ``batch=None`` calibrates
    the batch size; ``max_batch`` caps it (e.g. when each setup object is large).
    """

    fn: Callable[..., Any]
    setup: Callable[[int], Sequence[Any]] | None = None
    batch: int | None = None
    max_batch: int = 1_000_000


def _calibrate(case: Case, target_ns: float) -> int:
    """Batch size for a run of about ``target_ns``; the calls made here double as warm-up."""
    one = _run(case.fn, 1, case.setup)
    if case.batch is not None:
        return case.batch
    if one >= target_ns:
        return 1
    probe = max(1, min(case.max_batch, int(0.1 * target_ns / max(one, 1))))
    est = _run(case.fn, probe, case.setup) / probe
    return max(1, min(case.max_batch, int(target_ns / max(est, 1))))


def measure_many(
    cases: Mapping[str, Case | Callable[..., Any]],
    *,
    runs: int = 7,
    target_ms: float = 20.0,
    disable_gc: bool = True,
) -> dict[str, Timing]:
    """Time several cases with their runs interleaved: run 1 of every case, then run 2, ...

    On a shared or virtual machine, speed drifts over seconds (phases ~1.5x slower are
    common); interleaving spreads every case's runs over the whole measurement, so a slow
    phase shifts all cases alike instead of one case's median. Each run's per-call time is
    the run time divided by the batch size.

    Args:
        cases: name -> :class:`Case` (or a plain zero-argument callable).
        runs: timed runs per case (the median is over these).
        target_ms: calibrated length of one run; a case slower than that runs one call per run.
        disable_gc: switch the cyclic garbage collector off while timing (as ``timeit`` does);
            it is collected before each round and re-enabled at the end.
    """
    cases = {k: (c if isinstance(c, Case) else Case(c)) for k, c in cases.items()}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    if disable_gc:
        gc.disable()
    try:
        batches = {k: _calibrate(c, target_ms * 1e6) for k, c in cases.items()}
        for k, c in cases.items():  # one untimed round: a fresh worker starts in a slow phase
            _run(c.fn, batches[k], c.setup)
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(runs):
            gc.collect()
            for k, c in cases.items():
                samples[k].append(_run(c.fn, batches[k], c.setup) / batches[k])
    finally:
        if disable_gc and gc_was_enabled:
            gc.enable()
    return {k: Timing(tuple(samples[k]), batches[k]) for k in cases}


def measure(
    fn: Callable[..., Any],
    *,
    runs: int = 7,
    batch: int | None = None,
    target_ms: float = 20.0,
    max_batch: int = 1_000_000,
    setup: Callable[[int], Sequence[Any]] | None = None,
    disable_gc: bool = True,
) -> Timing:
    """Time one case: ``runs`` runs of ``batch`` calls each (see :class:`Case`, :func:`measure_many`)."""
    case = Case(fn, setup=setup, batch=batch, max_batch=max_batch)
    return measure_many({"_": case}, runs=runs, target_ms=target_ms, disable_gc=disable_gc)["_"]


def loop_overhead_ns(runs: int = 7) -> float:
    """Median per-call cost of the timing loop around a no-op function (not subtracted anywhere)."""

    def noop() -> None:
        return None

    return measure(noop, runs=runs).median_ns


def traced_bytes(make: Callable[[], Any], *, warmup: int = 1) -> tuple[int, int, Any]:
    """``(retained, peak, obj)``: tracemalloc bytes that ``make()``'s result keeps alive, and the
    peak extra bytes while it was built.

    ``make`` is called ``warmup`` times first (results dropped) so lazily filled caches,
    interned strings and imports are not counted. Only allocations through Python's
    allocators are seen: memory a C++ library allocates itself (e.g. torch tensor storage)
    is not.
    """
    for _ in range(warmup):
        make()
    gc.collect()
    already = tracemalloc.is_tracing()
    if not already:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        obj = make()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        if not already:
            tracemalloc.stop()
    return current - base, peak - base, obj


# -- formatting --------------------------------------------------------------------------------


def fmt_ns(ns: float | None) -> str:
    """``0.85 µs``, ``12.3 µs``, ``1.42 ms``, ``2.05 s`` (three significant digits)."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{_sig3(ns / scale)} {unit}"
    return f"{_sig3(ns)} ns"


def _sig3(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_bytes(n: int | None) -> str:
    """``744 B``, ``2.6 KB``, ``41.9 MB`` (1 KB = 1024 B)."""
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt_int(n: int) -> str:
    """``65,536``."""
    return f"{n:,}"


def fmt_ratio(slow: float | None, fast: float | None) -> str:
    """``slow / fast`` as ``1,234×`` / ``12.5×`` / ``0.80×``; ``n/a`` when either is missing."""
    if slow is None or fast is None or fast <= 0:
        return "n/a"
    r = slow / fast
    if r >= 100:
        return f"{r:,.0f}×"
    if r >= 10:
        return f"{r:.1f}×"
    return f"{r:.2f}×"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table; ``align`` has one letter per column: ``l``, ``r`` or ``c`` (default: first
    column left, the others right). Cells are padded so the text is readable as is."""
    rows = [[str(c) for c in r] for r in rows]
    n = len(headers)
    align = align or ("l" + "r" * (n - 1))
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(n)]
    widths = [max(w, 3) for w in widths]

    def cell(text: str, i: int) -> str:
        if align[i] == "l":
            return text.ljust(widths[i])
        return text.center(widths[i]) if align[i] == "c" else text.rjust(widths[i])

    def sep(i: int) -> str:
        w = widths[i]
        return {"l": ":" + "-" * (w - 1), "r": "-" * (w - 1) + ":", "c": ":" + "-" * (w - 2) + ":"}[align[i]]

    lines = ["| " + " | ".join(cell(h, i) for i, h in enumerate(headers)) + " |",
             "| " + " | ".join(sep(i) for i in range(n)) + " |"]
    lines += ["| " + " | ".join(cell(c, i) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


# -- environment and docs ----------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(*, torch_version: str | None = None) -> dict[str, str]:
    """Date, CPUs, Python, numpy and torch versions (torch read from the installed metadata,
    so asking does not import torch)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    if torch_version is None:
        try:
            from importlib.metadata import version

            torch_version = version("torch")
        except Exception:  # noqa: BLE001 - torch absent
            torch_version = "not installed"
    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = "not installed"
    return {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{cpus} cores ({_cpu_model()}), {platform.system()} {platform.machine()}",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "numpy": numpy_version,
        "torch": torch_version,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    }


def replace_section(path: str | Path, name: str, content: str, *, heading: str | None = None) -> None:
    """Replace the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` in ``path``.

    When the markers are missing, the block is appended under ``heading`` (if given) at the
    end of the file; the file is created when it does not exist.
    """
    path = Path(path)
    begin, end = f"<!-- BEGIN {name} (generated; do not edit by hand) -->", f"<!-- END {name} -->"
    block = f"{begin}\n{content.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    pattern = re.compile(re.escape(f"<!-- BEGIN {name}") + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        tail = (f"\n{heading}\n\n" if heading else "\n") + block + "\n"
        text = text.rstrip("\n") + "\n" + tail if text else tail.lstrip("\n")
    path.write_text(text, encoding="utf-8")


def bench_parser(doc: str, docs_path: str, quick_help: str, runs_help: str) -> argparse.ArgumentParser:
    """The command line every benchmark shares: --quick, --write-docs, --runs, --target-ms,
    --json, and the hidden --_worker/--_world a benchmark passes to its own subprocesses."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--write-docs", action="store_true", help=f"rewrite this benchmark's section of {docs_path}")
    p.add_argument("--runs", type=int, default=None, help=runs_help)
    p.add_argument("--target-ms", type=float, default=None, help="calibrated run length (default 20; quick: 5)")
    p.add_argument("--json", type=Path, default=None, help="also dump the raw results here")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    p.add_argument("--_world", type=int, help=argparse.SUPPRESS)
    return p


def int_tuple(text: str) -> tuple[int, ...]:
    """An argparse ``type`` for comma-separated ints: ``"32,4096"`` -> ``(32, 4096)``."""
    return tuple(int(x) for x in text.split(",") if x)


def run_settings(args: argparse.Namespace) -> tuple[int, float]:
    """``(runs, target_ms)`` from the shared options: 7 runs of ~20 ms, or 3 of ~5 ms with --quick."""
    return args.runs or (3 if args.quick else 7), args.target_ms or (5.0 if args.quick else 20.0)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a gloo pool's rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_json(text: str) -> dict[str, Any]:
    """The JSON object on the last line a worker printed."""
    import json

    return json.loads(text.strip().splitlines()[-1])


def run_gloo_pool(script: str | Path, world: int, worker_args: Sequence[str], timeout_s: float,
                  cwd: str | Path) -> dict[str, Any]:
    """Start ``world`` worker processes of ``script`` (``--_worker ... --_world W --_rank r
    --_port p`` plus ``worker_args``) on 127.0.0.1 and collect each rank's last-line JSON.

    Returns ``{"ranks": [...], "wall_s": ...}`` or ``{"error": ...}``; a pool that outlives
    ``timeout_s`` is killed (only our own workers, by handle).
    """
    import os
    import subprocess
    import sys

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(script), "--_world", str(world), "--_rank", str(rank),
                               "--_port", str(port), *worker_args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
             for rank in range(world)]
    results, errors = [], []
    deadline = time.monotonic() + timeout_s
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            return {"error": f"not run: gloo pool timed out after {timeout_s} s"}
        if p.returncode != 0:
            tail = (stderr.strip().splitlines() or ["?"])[-1]
            errors.append(f"rank {rank} exited with {p.returncode} ({tail[:200]})")
        else:
            results.append(last_json(stdout))
    if errors:
        return {"error": "not run: " + "; ".join(errors)}
    return {"ranks": results, "wall_s": time.perf_counter() - t0}
