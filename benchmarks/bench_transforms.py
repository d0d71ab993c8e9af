#!/usr/bin/env python
"""Pure mesh operations, ours vs torch ``DeviceMesh``, on a ``(W/64, 8, 8)`` mesh ``("dp", "cp", "tp")``.

Ours: ``functional_mesh`` values. Torch: ``DeviceMesh`` as rank 0 of torch's single-process
fake backend, so its process groups are as cheap as they get (torch's figures are lower
bounds). Each side and each W runs in a fresh interpreter. Times: ``torch.utils.benchmark.Timer``
on this process's CPU time (single-threaded work; other jobs on a shared machine move it far less
than wall time), its block size from ``blocked_autorange``, then ``--samples`` blocks of every
statement taken round-robin (a slow phase of the machine hits every row alike); the median per-call
time over the blocks, pooled over ``--rounds`` workers.
``--before ROOT`` also times the package found under ``ROOT`` (e.g. a git worktree of an older
commit), loaded beside ours in the same worker under another name: each of its statements takes
its turn in the same round-robin as ours, so the two columns share every phase of the machine.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_transforms.py --quick --before /tmp/fm_before
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import resource
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness as H  # this folder is sys.path[0] when a script here runs
import _report as R

BENCH = "bench_transforms"
NAMES = ("dp", "cp", "tp")
# row -> (our statement, torch's statement or None). torch's statements that make process groups
# (GROUPS) are timed after the others, as they fill the root's caches; every torch _flatten takes
# a fresh name (torch caches by name), so each call does the work of a first _flatten.
OPS: dict[str, tuple[str, str | None]] = {
    "make_mesh": ("fm.make_mesh(shape, NAMES)", None),
    "select 1 axis": ('mesh["tp"]', 'dm["tp"]'),
    "select 2 axes": ('mesh["dp", "tp"]', 'dm["dp", "tp"]'),
    "flatten contiguous (cp, tp)": ('cp_tp.flatten(name="cp_tp")', None),
    "flatten non-contiguous (dp, tp)": ('dp_tp.flatten(name="dp_tp")', None),
    "transpose": ('mesh.transpose("tp", "dp", "cp")', None),
    "rename": ('mesh.rename({"dp": "data"})', None),
    "group_of (tp)": ("tp.group_of(rank)", "tp.mesh"),
    "coordinate (tp)": ("tp.coordinate(rank)", "tp.get_coordinate()"),
    "== of equal slices": ("a == b", "a == b"),
    "select + flatten (cp, tp)": ('mesh["cp", "tp"].flatten(name="cp_tp")',
                                  'dm["cp", "tp"]._flatten(f"cp_tp_{next(fresh)}")'),
    "select + flatten (dp, tp)": ('mesh["dp", "tp"].flatten(name="dp_tp")',
                                  'dm["dp", "tp"]._flatten(f"dp_tp_{next(fresh)}")'),
    "unflatten dp": ('mesh.unflatten("dp", {"d0": W // 512, "d1": 8})',
                     'dm._unflatten(0, (W // 512, 8), ("d0", "d1"))'),
}


def figure(row: str, samples: list[float], unit: str = "ns") -> dict[str, Any]:
    return {"row": row, "unit": unit, "samples": samples}


GROUPS = ("select + flatten (cp, tp)", "select + flatten (dp, tp)", "unflatten dp")


def timed(stmts: dict[Any, tuple[str, dict[str, Any]]], samples: int, budget_s: float) -> dict[Any, list[float]]:
    """Per-call times of each ``key: (statement, globals)``, one ``Timer`` block per sample, the statements
    taken in turn; a slow statement stops at 3 samples once its blocks have used ``budget_s``."""
    from torch.utils.benchmark import Timer

    timers = {key: Timer(stmt, globals=env, timer=time.process_time) for key, (stmt, env) in stmts.items()}
    number = {key: t.blocked_autorange(min_run_time=0.05).number_per_run for key, t in timers.items()}  # + warm-up
    out: dict[Any, list[float]] = {key: [] for key in stmts}
    for i in range(samples):
        for key, timer in timers.items():
            if i < 3 or sum(out[key]) * number[key] < budget_s * 1e9:
                out[key].append(timer.timeit(number[key]).median * 1e9)
    return out


def load_before(root: str) -> Any:
    """The package under ``root``, imported as ``functional_mesh_before`` beside ours (its imports are relative)."""
    import importlib.util

    name, folder = "functional_mesh_before", os.path.join(root, "functional_mesh")
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its modules import each other through it
    spec.loader.exec_module(module)
    return module


def first_hash_ns(makes: dict[str, Callable[[], Any]], n: int, repeats: int = 9) -> dict[str, list[float]]:
    """Per side, the per-call time of ``hash`` on ``n`` fresh objects (a cached hash costs only on the first
    call); the sides take turns, in alternating order."""
    out: dict[str, list[float]] = {side: [] for side in makes}
    for r in range(repeats):
        for side in list(makes)[:: 1 if r % 2 == 0 else -1]:
            objs = [makes[side]() for _ in range(n)]
            t0 = time.process_time_ns()
            for obj in objs:
                hash(obj)
            out[side].append((time.process_time_ns() - t0) / n)
            del objs
    return out


def memory(row: str, make: Callable[[], Any]) -> list[dict[str, Any]]:
    """tracemalloc bytes that ``make()``'s result keeps alive, and the peak while it was built."""
    make()  # warm lazily filled caches and interned strings
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    obj = make()  # noqa: F841  (alive while measured)
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return [figure(f"{row}, retained", [retained - base], "B"), figure(f"{row}, peak", [peak - base], "B")]


def slice_sizes(root: Any) -> list[dict[str, Any]]:
    """Pickled size and memory of the 1-axis slice ``root["tp"]`` (ours or torch's)."""
    return [figure('pickled size of ["tp"]', [len(pickle.dumps(root["tp"]))], "B"),
            *memory('memory of ["tp"]', lambda: root["tp"])]


def rss() -> dict[str, Any]:
    return figure("worker peak RSS", [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], "B")


def ours_worker(world: int, samples: int, budget_s: float, before: str | None = None) -> dict[str, Any]:
    import functional_mesh

    sides = {"ours": functional_mesh} | ({"before": load_before(before)} if before else {})
    shape, envs = (world // 64, 8, 8), {}
    for side, fm in sides.items():
        mesh = fm.make_mesh(shape, NAMES)
        envs[side] = {"fm": fm, "mesh": mesh, "shape": shape, "NAMES": NAMES, "W": world, "rank": world - 1,
                      "tp": mesh["tp"], "a": mesh["dp", "tp"], "b": mesh["dp", "tp"], "cp_tp": mesh["cp", "tp"],
                      "dp_tp": mesh["dp", "tp"]}
    times = timed({(row, side): (ours, envs[side]) for row, (ours, _) in OPS.items() for side in sides},
                  samples, budget_s)
    out = [{**figure(row, xs), "column": side} for (row, side), xs in times.items()]
    hashes = first_hash_ns({side: lambda m=envs[side]["mesh"]: m["dp", "tp"] for side in sides}, 1000)
    for side in sides:
        mesh = envs[side]["mesh"]
        got = [figure("hash, first call", hashes[side]), *slice_sizes(mesh)]
        if side == "before":  # a pickle names its classes' modules: functional_mesh_before's are longer
            got = [f for f in got if not f["row"].startswith("pickled")]
        got += memory('memory of ["dp", "tp"].flatten()', lambda: mesh["dp", "tp"].flatten())
        got += memory('memory of unflatten("dp")', lambda: mesh.unflatten("dp", {"d0": world // 512, "d1": 8}))
        out += [{**f, "column": side} for f in got]
    packages = {side: os.path.dirname(fm.__file__) for side, fm in sides.items()}
    return {"packages": packages, "figures": [*out, {**rss(), "column": "ours"}]}


def torch_worker(world: int, samples: int, budget_s: float, before: None = None) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    H.init_fake(world)
    calls = H.GroupCalls()
    t0 = time.perf_counter_ns()
    dm = init_device_mesh("cpu", (world // 64, 8, 8), mesh_dim_names=NAMES)
    out = [figure("make_mesh", [time.perf_counter_ns() - t0])]  # one sample: it makes W/4 + 64 groups
    made = {"make_mesh": len(calls.requested)}
    out += slice_sizes(dm)  # before any _flatten: a pickled slice carries the root's caches
    # fresh slices, at most ~2M ranks' worth alive at once (each holds a W-tuple)
    hashes = first_hash_ns({"torch": lambda: dm["dp", "tp"]}, max(3, min(200, 2**21 // world)), repeats=5)
    out.append(figure("hash, first call", hashes["torch"]))
    env = {"dm": dm, "tp": dm["tp"], "a": dm["dp", "tp"], "b": dm["dp", "tp"], "W": world,
           "fresh": itertools.count()}
    out += [figure(row, xs) for row, xs in timed({row: (stmt, env) for row, (_, stmt) in OPS.items()
                                                  if stmt and row not in GROUPS}, samples, budget_s).items()]
    for row in GROUPS:
        before = len(calls.requested)
        eval(OPS[row][1], env)  # one call, to count the groups it makes
        made[row] = len(calls.requested) - before
    group_stmts = {row: (OPS[row][1], env) for row in GROUPS}
    out += [figure(row, xs) for row, xs in timed(group_stmts, samples, budget_s).items()]
    out += [{**figure(row, [n], "n"), "column": "torch: new groups per call"} for row, n in made.items() if n]
    return {"figures": [*out, rss()]}


def main() -> int:
    H.serve({"ours": ours_worker, "torch": torch_worker})
    p = H.parser(__doc__, "W = 4,096 only, shorter timings (< 60 s)")
    p.add_argument("--worlds", default=None, help="comma-separated multiples of 512 (default 4096,65536,1048576)")
    p.add_argument("--before", type=Path, help="also time the package under this root, in the same workers")
    p.add_argument("--rounds", type=int, default=1, help="workers per W, their samples pooled (default 1)")
    p.add_argument("--samples", type=int, help="Timer blocks per statement and worker (default 9; quick 5)")
    p.add_argument("--budget", type=float, default=2.0, help="seconds after which a slow statement stops at 3 blocks")
    p.add_argument("--no-torch", action="store_true", help="time our side only")
    args = p.parse_args()
    worlds = [int(w) for w in (args.worlds or ("4096" if args.quick else "4096,65536,1048576")).split(",")]
    spec = {"samples": args.samples or (5 if args.quick else 9), "budget_s": args.budget,
            "before": str(args.before.resolve()) if args.before else None}
    run, t0, notes = H.start_run(BENCH), time.perf_counter(), [H.revision()]
    records: list[Any] = []
    ratios = (("torch", "ours", "torch / ours"),) + ((("before", "ours", "before / ours"),) if args.before else ())
    for world in worlds:
        key = f"W={world}"
        records.append(R.Table(BENCH, key, f"W = {world:,}, mesh ({world // 64}, 8, 8)", "operation", ratios))
        figures: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in range(args.rounds):
            print(f"W={world:,}: ours{' and before' if args.before else ''}, worker {r + 1} ...", file=sys.stderr,
                  flush=True)
            out = H.run(__file__, {"fn": "ours", "world": world, **spec})
            notes += [f"{side}: `{package}`" for side, package in out["packages"].items()]
            for f in out["figures"]:
                figures[f.pop("column"), f["row"]].append(f)
        if not args.no_torch:
            print(f"W={world:,}: torch ...", file=sys.stderr, flush=True)
            try:
                for f in H.run(__file__, {"fn": "torch", "world": world, **spec, "before": None})["figures"]:
                    figures[f.pop("column", "torch"), f["row"]].append(f)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory at a large W: report, go on
                notes.append(f"torch at W={world:,}: not measured ({str(exc).splitlines()[0]})")
        for (column, row), fs in figures.items():  # pooled over rounds
            records.append(R.measured(BENCH, key, row, column, [x for f in fs for x in f["samples"]], fs[0]["unit"]))
    R.write(args.out, [H.finish_run(run, time.perf_counter() - t0, list(dict.fromkeys(notes))), *records])
    return 0


if __name__ == "__main__":
    sys.exit(main())
