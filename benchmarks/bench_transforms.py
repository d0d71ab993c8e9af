#!/usr/bin/env python
"""Pure mesh transformations vs torch ``DeviceMesh``, on a ``(W/64, 8, 8)`` mesh ``("dp", "cp", "tp")``.

Ours: ``functional_mesh`` values (no torch involved). Torch: ``DeviceMesh`` under torch's
single-process *fake* backend (``init_process_group("fake", rank=0, world_size=W)``), so
torch's process-group creation is as cheap as it can be: the torch figures are lower bounds
for a real job.

Each world size and each side runs in its own subprocess (a fresh interpreter, a fresh
world: torch's group registry and ``_flatten_mapping`` never carry over, and every worker's
peak RSS is its own). Times are medians over runs of a calibrated batch of calls
(``benchmarks/_timing.py``); per call = run time / batch size.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_transforms.py              # W = 4,096, 65,536, 1,048,576
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_transforms.py --quick      # W = 4,096 only, fewer runs
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_transforms.py --write-docs # also refresh docs/benchmarks.md

This is a benchmark: it reports, it asserts nothing about timings. (It does check that both
libraries compute the same groups and coordinates for what it times, and says so.)
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _timing as T  # noqa: E402

REPO = HERE.parent
DOCS = REPO / "docs" / "benchmarks.md"
SECTION = "bench_transforms"
HEADING = "## Pure transformations (bench_transforms.py)"
NAMES = ("dp", "cp", "tp")
WORLDS = (4_096, 65_536, 1_048_576)
TARGET_WORLD = 65_536  # where the speed-up targets are stated
TORCH_TIMEOUT_S = 600

# key, label (ours / torch), kind: "time" or "bytes"
OPS: tuple[tuple[str, str, str, str], ...] = (
    ("build", "`make_mesh(shape, names)`", "`init_device_mesh(\"cpu\", shape, ...)` (1 sample)", "time"),
    ("select1", "`mesh[\"tp\"]`", "`dm[\"tp\"]`", "time"),
    ("select2", "`mesh[\"dp\", \"tp\"]`", "`dm[\"dp\", \"tp\"]`", "time"),
    ("flatten_only_contig", "`sel.flatten(name=\"cp_tp\")`, `sel = mesh[\"cp\", \"tp\"]`",
     "n/a (torch only flattens a fresh slice: next row)", "time"),
    ("flatten_only_noncontig", "`sel.flatten(name=\"dp_tp\")`, `sel = mesh[\"dp\", \"tp\"]`",
     "n/a (torch only flattens a fresh slice: next rows)", "time"),
    ("flatten_contig", "`mesh[\"cp\", \"tp\"].flatten(name=\"cp_tp\")`",
     "`dm[\"cp\", \"tp\"]._flatten(\"cp_tp_<i>\")` †", "time"),
    ("flatten_noncontig", "`mesh[\"dp\", \"tp\"].flatten(name=\"dp_tp\")`",
     "`dm[\"dp\", \"tp\"]._flatten(\"dp_tp_<i>\")` †", "time"),
    ("unflatten", "`mesh.unflatten(\"dp\", {\"d0\": W/512, \"d1\": 8})`",
     "`dm._unflatten(0, (W/512, 8), (\"d0\", \"d1\"))`", "time"),
    ("transpose", "`mesh.transpose(\"tp\", \"dp\", \"cp\")`", "n/a (no transpose)", "time"),
    ("rename", "`mesh.rename({\"dp\": \"data\"})`", "n/a (no rename)", "time"),
    ("group_of", "`tp.group_of(rank)`", "`tp.mesh`", "time"),
    ("coordinate", "`tp.coordinate(rank)`", "`tp.get_coordinate()` ‡", "time"),
    ("hash", "`hash(m)`, first call on a fresh `[\"dp\", \"tp\"]`", "same on a fresh `dm[\"dp\", \"tp\"]`", "time"),
    ("eq", "`a == b`, two equal `[\"dp\", \"tp\"]` slices", "same", "time"),
    ("pickle", "`len(pickle.dumps(mesh[\"tp\"]))`", "`len(pickle.dumps(dm[\"tp\"]))`", "bytes"),
    ("mem_select", "memory of `mesh[\"tp\"]`", "memory of `dm[\"tp\"]` §", "bytes"),
    ("mem_flatten", "memory of `mesh[\"dp\", \"tp\"].flatten()`", "not measured", "bytes"),
    ("mem_unflatten", "memory of `mesh.unflatten(\"dp\", ...)`", "not measured", "bytes"),
)
# one transformation each (the select + flatten rows chain two, to compare with torch's slice + _flatten)
TRANSFORMS = ("select1", "select2", "flatten_only_contig", "flatten_only_noncontig", "unflatten", "transpose",
              "rename")
LABELS = {
    "build": "build the 3-D mesh", "select1": "select one axis", "select2": "select two axes",
    "flatten_only_contig": "flatten contiguous (cp, tp)", "flatten_only_noncontig": "flatten non-contiguous (dp, tp)",
    "flatten_contig": "select + flatten contiguous (cp, tp)",
    "flatten_noncontig": "select + flatten non-contiguous (dp, tp)",
    "unflatten": "unflatten dp", "transpose": "transpose", "rename": "rename",
    "group_of": "group of a rank (tp)", "coordinate": "coordinate of a rank (tp)",
    "hash": "hash, first call", "eq": "== of two equal slices", "pickle": "pickled size of a 1-axis slice",
    "mem_select": "memory of a 1-axis slice", "mem_flatten": "memory of a flattened mesh",
    "mem_unflatten": "memory of an unflattened mesh",
}


FOOTNOTES = """\
- Ours: `mesh = make_mesh((W/64, 8, 8), ("dp", "cp", "tp"))`, `tp = mesh["tp"]`, `rank = W - 1`.
  Torch: `dm = init_device_mesh("cpu", (W/64, 8, 8), mesh_dim_names=("dp", "cp", "tp"))` on the
  fake backend as rank 0, `tp = dm["tp"]`.
- Times are per call. "torch / ours" is the ratio of the medians (of the sizes, for byte rows).
  "new groups" counts torch's `new_group` calls during one call of the op (every rank makes
  all of them, member or not).
- † torch caches `_flatten` by name, so every call uses a fresh name (`cp_tp_0`, `cp_tp_1`, ...)
  and does the work of a first `_flatten`: a new mesh and its process groups. A repeated name is
  a cache hit that still pays for the O(W) slice `dm["cp", "tp"]`.
- ‡ torch computes a slice's coordinate once, while slicing (O(W), inside the slice time), and
  `get_coordinate()` reads the stored tuple. Ours computes it on every call, in O(ndim).
- § tracemalloc sees Python allocations only: it counts the W-tuple `_flatten_rank_map` that
  every torch mesh keeps, not tensor storage from torch's C++ allocator. "peak" is the extra
  memory at the high point while the object was built."""


def shape_of(world: int) -> tuple[int, int, int]:
    return (world // 64, 8, 8)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KB


# -- workers (each runs in its own subprocess) -------------------------------------------------


def worker_ours(world: int, runs: int, target_ms: float) -> dict[str, Any]:
    import functional_mesh as fm

    shape = shape_of(world)
    mesh = fm.make_mesh(shape, NAMES)
    rank = world - 1  # the last rank: nothing here may scan towards it
    tp = mesh["tp"]
    a, b = mesh["dp", "tp"], mesh["dp", "tp"]
    cp_tp, dp_tp = mesh["cp", "tp"], mesh["dp", "tp"]
    split = {"d0": world // 512, "d1": 8}
    out: dict[str, Any] = {"loop_overhead_ns": T.loop_overhead_ns(runs)}
    timings = T.measure_many({
        "build": lambda: fm.make_mesh(shape, NAMES),
        "select1": lambda: mesh["tp"],
        "select2": lambda: mesh["dp", "tp"],
        "flatten_only_contig": lambda: cp_tp.flatten(name="cp_tp"),
        "flatten_only_noncontig": lambda: dp_tp.flatten(name="dp_tp"),
        "flatten_contig": lambda: mesh["cp", "tp"].flatten(name="cp_tp"),
        "flatten_noncontig": lambda: mesh["dp", "tp"].flatten(name="dp_tp"),
        "unflatten": lambda: mesh.unflatten("dp", {"d0": world // 512, "d1": 8}),
        "transpose": lambda: mesh.transpose("tp", "dp", "cp"),
        "rename": lambda: mesh.rename({"dp": "data"}),
        "group_of": lambda: tp.group_of(rank),
        "coordinate": lambda: tp.coordinate(rank),
        "hash": T.Case(hash, setup=lambda n: [mesh["dp", "tp"] for _ in range(n)]),
        "eq": lambda: a == b,
    }, runs=runs, target_ms=target_ms)
    out.update({k: t.as_dict() for k, t in timings.items()})
    out["pickle"] = len(pickle.dumps(mesh["tp"]))
    for key, make in (("mem_select", lambda: mesh["tp"]),
                      ("mem_flatten", lambda: mesh["dp", "tp"].flatten()),
                      ("mem_unflatten", lambda: mesh.unflatten("dp", split))):
        retained, peak, _ = T.traced_bytes(make)
        out[key] = retained
        out[key + "_peak"] = peak
    out["torch_imported"] = "torch" in sys.modules
    out["peak_rss"] = _peak_rss_bytes()
    return out


def worker_torch(world: int, runs: int, target_ms: float) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm_module
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import functional_mesh as fm

    shape = shape_of(world)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    # Count the process groups torch creates (every rank calls new_group for every group,
    # member or not). The counting wrapper costs ~0.1 µs per call, <1% of a fake new_group.
    created = {"new_group": 0, "split_group": 0}

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            created[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in created:
        setattr(dm_module, name, counting(name, getattr(dm_module, name)))

    def n_created() -> int:
        return created["new_group"] + created["split_group"]

    out: dict[str, Any] = {"torch_version": torch.__version__}
    groups0 = n_created()
    t0 = time.perf_counter_ns()
    dm = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    out["build"] = T.Timing((float(time.perf_counter_ns() - t0),), 1).as_dict()
    out["build_groups"] = n_created() - groups0

    # Sizes first, while the root mesh is fresh: a pickled slice carries its root mesh, and
    # with it every mesh in the root's _flatten_mapping (which the _flatten timings fill).
    out["pickle"] = len(pickle.dumps(dm["tp"]))
    retained, peak, _ = T.traced_bytes(lambda: dm["tp"])
    out["mem_select"], out["mem_select_peak"] = retained, peak

    tp = dm["tp"]
    a, b = dm["dp", "tp"], dm["dp", "tp"]
    timings = T.measure_many({
        "select1": lambda: dm["tp"],
        "select2": lambda: dm["dp", "tp"],
        "group_of": lambda: tp.mesh,
        "coordinate": tp.get_coordinate,
        # Fresh slices per call (the hash is cached on the object); cap how many are alive at
        # once (each holds a W-tuple of ints: ~40 MB at W = 1M).
        "hash": T.Case(hash, setup=lambda n: [dm["dp", "tp"] for _ in range(n)],
                       max_batch=max(2, 8_000_000 // world)),
        "eq": lambda: a == b,
    }, runs=runs, target_ms=target_ms)
    out.update({k: t.as_dict() for k, t in timings.items()})

    # Same answers as ours? One call of each op (also counts the process groups it creates).
    mesh = fm.make_mesh(shape, NAMES)
    checks = {}
    checks["select"] = (tp.mesh.tolist() == mesh["tp"].group_of(0).tolist()
                        and dm["dp", "tp"].mesh.tolist() == mesh["dp", "tp"].group_of(0).tolist()
                        and dm["dp", "tp"].get_coordinate() == mesh["dp", "tp"].coordinate(0))
    for key, names, tag in (("flatten_contig", ("cp", "tp"), "check_cp_tp"),
                            ("flatten_noncontig", ("dp", "tp"), "check_dp_tp")):
        before = n_created()
        flat = dm[names]._flatten(tag)
        out[key + "_groups"] = n_created() - before
        ours = mesh[names].flatten(name=tag)
        checks[key] = flat.mesh.tolist() == ours.group_of(0).tolist() and flat.get_coordinate() == ours.coordinate(0)
    before = n_created()
    un = dm._unflatten(0, (world // 512, 8), ("d0", "d1"))
    out["unflatten_groups"] = n_created() - before
    ours_un = mesh.unflatten("dp", {"d0": world // 512, "d1": 8})
    checks["unflatten"] = (np.array_equal(un.mesh.numpy(), ours_un.ranks)
                           and un["d1"].mesh.tolist() == ours_un["d1"].group_of(0).tolist())
    del un, ours_un
    out["checks"] = checks

    # torch caches _flatten by name: a fresh name per call, so every call does the real work
    # (a new flattened mesh and its process groups, as a first _flatten does).
    counter = itertools.count()
    timings = T.measure_many({
        "flatten_contig": lambda: dm["cp", "tp"]._flatten(f"cp_tp_{next(counter)}"),
        "flatten_noncontig": lambda: dm["dp", "tp"]._flatten(f"dp_tp_{next(counter)}"),
        "unflatten": lambda: dm._unflatten(0, (world // 512, 8), ("d0", "d1")),
    }, runs=runs, target_ms=target_ms)
    out.update({k: t.as_dict() for k, t in timings.items()})
    out["groups_at_end"] = n_created()
    out["split_group_calls"] = created["split_group"]
    out["peak_rss"] = _peak_rss_bytes()
    return out


def run_worker(side: str, world: int, runs: int, target_ms: float, timeout: float) -> dict[str, Any]:
    """Run one worker in a fresh interpreter; ``{"error": reason, ...}`` when it fails."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", side, "--_world", str(world),
           "--runs", str(runs), "--target-ms", str(target_ms)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"not run: timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"not run: worker exited with {proc.returncode} ({tail[:200]})", "wall_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


# -- report -----------------------------------------------------------------------------------


def _median(res: dict[str, Any], key: str) -> float | None:
    v = res.get(key)
    if isinstance(v, dict):
        return float(v["median_ns"])
    return None


def _bytes(res: dict[str, Any], key: str) -> int | None:
    v = res.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def world_table(world: int, ours: dict[str, Any], torch_res: dict[str, Any]) -> str:
    rows = []
    terr = torch_res.get("error")
    for key, ours_label, torch_label, kind in OPS:
        spread = ""
        if kind == "time":
            o, t = _median(ours, key), _median(torch_res, key)
            o_txt, t_txt = T.fmt_ns(o), T.fmt_ns(t)
            runs_ns = ours[key]["per_call_ns"]
            spread = f"{T.fmt_ns(min(runs_ns))} – {T.fmt_ns(max(runs_ns))}"
        else:
            o, t = _bytes(ours, key), _bytes(torch_res, key)
            o_txt, t_txt = T.fmt_bytes(o), T.fmt_bytes(t)
            if key + "_peak" in ours and o is not None:
                o_txt += f" (peak {T.fmt_bytes(ours[key + '_peak'])})"
            if key + "_peak" in torch_res and t is not None:
                t_txt += f" (peak {T.fmt_bytes(torch_res[key + '_peak'])})"
        groups = torch_res.get(key + "_groups")
        if t is not None and groups is not None:
            t_txt += f", {T.fmt_int(groups)} new groups"
        if t is None:
            t_txt = "n/a" if torch_label.startswith(("n/a", "not")) else (terr or "n/a")
        rows.append([LABELS[key], ours_label, o_txt, spread, torch_label, t_txt, T.fmt_ratio(t, o)])
    headers = ["operation", "ours", "ours (median)", "ours (min – max)", "torch", "torch (median)", "torch / ours"]
    return T.markdown_table(headers, rows, "llrrlrr")


def _verdict(ok: bool | None) -> str:
    return "not evaluated" if ok is None else ("**met**" if ok else "**not met**")


def targets_table(results: dict[int, dict[str, dict[str, Any]]]) -> str:
    rows = []
    # 1. every pure transformation <= 10 us median at every W
    worst = max(((_median(r["ours"], k), k, w) for w, r in results.items() for k in TRANSFORMS
                 if _median(r["ours"], k) is not None), default=None)
    def slowest(r: dict[str, Any]) -> str:
        k = max(TRANSFORMS, key=lambda k: _median(r["ours"], k))
        best = min(r["ours"][k]["per_call_ns"])
        return f"{LABELS[k]} {T.fmt_ns(_median(r['ours'], k))} (best run {T.fmt_ns(best)})"

    per_w = "; ".join(f"W={T.fmt_int(w)}: slowest {slowest(r)}" for w, r in results.items())
    rows.append(["every pure transformation (select, flatten, unflatten, transpose, rename) ≤ 10 µs median, every W",
                 per_w, _verdict(None if worst is None else worst[0] <= 10_000)])
    # 2./3. speed-ups at W = 65,536
    for keys, factor, what in ((("select1", "select2"), 100, "≥ 100× faster than torch's slice"),
                               (("flatten_contig", "flatten_noncontig", "unflatten"), 1000,
                                "≥ 1000× faster than `_flatten` / `_unflatten`")):
        r = results.get(TARGET_WORLD)
        if r is None or r["torch"].get("error"):
            reason = "W=65,536 not run" if r is None else r["torch"]["error"]
            rows.append([f"{what} at W=65,536", reason, _verdict(None)])
            continue
        ratios = {k: _median(r["torch"], k) / _median(r["ours"], k) for k in keys}
        txt = "; ".join(f"{LABELS[k]}: {T.fmt_ratio(_median(r['torch'], k), _median(r['ours'], k))}" for k in keys)
        rows.append([f"{what} at W=65,536", txt, _verdict(min(ratios.values()) >= factor)])
    # 4. derived mesh <= 4 KB
    mem_keys = ("mem_select", "mem_flatten", "mem_unflatten")
    mems = [(r["ours"][k], k, w) for w, r in results.items() for k in mem_keys]
    big = max(mems)
    rows.append(["a derived mesh ≤ 4 KB (tracemalloc, retained), any W",
                 f"largest: {LABELS[big[1]]} {T.fmt_bytes(big[0])} at W={T.fmt_int(big[2])}; "
                 + ", ".join(f"W={T.fmt_int(w)}: {T.fmt_bytes(max(r['ours'][k] for k in mem_keys))}"
                             for w, r in results.items()),
                 _verdict(big[0] <= 4096)])
    # 5. coordinate O(ndim), group_of O(group size): flat in W
    for key, what in (("coordinate", "`coordinate` O(ndim): flat in W"),
                      ("group_of", "`group_of` O(size of the group) = O(8) here: flat in W")):
        vals = [_median(r["ours"], key) for r in results.values()]
        txt = " → ".join(T.fmt_ns(v) for v in vals) + f" (W = {', '.join(T.fmt_int(w) for w in results)})"
        rows.append([what, txt, _verdict(max(vals) <= 2 * min(vals)) if len(vals) > 1 else _verdict(None)])
    return T.markdown_table(["target", "measured", "verdict"], rows, "llc")


def report(results: dict[int, dict[str, dict[str, Any]]], meta: dict[str, str], wall_s: float, quick: bool) -> str:
    lines = []
    cmd = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_transforms.py" + (" --quick" if quick else "")
    first = next(iter(results.values()))
    n_runs = len(first["ours"]["select1"]["per_call_ns"])
    lines.append(f"Run of `{cmd}`{' (quick: a smoke run)' if quick else ''}: {n_runs} runs per timing, "
                 f"{wall_s:.0f} s of wall time for the whole run.")
    lines.append("")
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines.append("")
    lines.append("How to read the tables:")
    lines.append("")
    lines.append(FOOTNOTES)
    lines.append("")
    for world, r in results.items():
        o, t = r["ours"], r["torch"]
        lines.append(f"### W = {T.fmt_int(world)}, mesh {shape_of(world)}")
        lines.append("")
        lines.append(world_table(world, o, t))
        lines.append("")
        notes = [f"ours: worker peak RSS {T.fmt_bytes(o['peak_rss'])}, torch imported: "
                 f"{'yes' if o['torch_imported'] else 'no'}, timing-loop overhead "
                 f"{T.fmt_ns(o['loop_overhead_ns'])} per call (included, not subtracted)"]
        if t.get("error"):
            notes.append(f"torch: {t['error']}")
        else:
            chk = t["checks"]
            same = all(chk.values())
            notes.append(
                f"torch: `init_device_mesh` made {T.fmt_int(t['build_groups'])} `new_group` calls, the whole "
                f"worker {T.fmt_int(t['groups_at_end'])} ({T.fmt_int(t['split_group_calls'])} `split_group`); "
                f"worker peak RSS "
                f"{T.fmt_bytes(t['peak_rss'])}; worker wall time {t['wall_s']:.1f} s")
            notes.append("same groups and coordinates as ours for every timed op (rank 0): "
                         + ("yes" if same else "**NO** — " + ", ".join(k for k, v in chk.items() if not v)))
        lines.append("; ".join(notes) + ".")
        lines.append("")
    lines.append("### Targets")
    lines.append("")
    lines.append(targets_table(results))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = T.bench_parser(__doc__, str(DOCS.relative_to(REPO)), "W = 4,096 only, 3 runs of ~5 ms (smoke test)",
                       "timed runs per figure (default 7; quick: 3)")
    p.add_argument("--worlds", type=T.int_tuple, default=None,
                   help="comma-separated world sizes (multiples of 512); default 4096,65536,1048576")
    p.add_argument("--no-torch", action="store_true", help="measure ours only")
    args = p.parse_args(argv)
    runs, target_ms = T.run_settings(args)

    if args._worker:
        fn = worker_ours if args._worker == "ours" else worker_torch
        print(json.dumps(fn(args._world, runs, target_ms)))
        return 0

    worlds = args.worlds or ((4_096,) if args.quick else WORLDS)
    for w in worlds:
        if w % 512:
            p.error(f"world sizes must be multiples of 512 (unflatten splits W/64 into (W/512, 8)), got {w}")
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    results: dict[int, dict[str, dict[str, Any]]] = {}
    for w in worlds:
        print(f"W = {w:,}: ours ...", end="", flush=True, file=sys.stderr)
        ours = run_worker("ours", w, runs, target_ms, TORCH_TIMEOUT_S)
        if ours.get("error"):
            print(f"\nours failed at W={w}: {ours['error']}", file=sys.stderr)
            return 1
        print(f" {ours['wall_s']:.1f} s; torch ...", end="", flush=True, file=sys.stderr)
        if args.no_torch:
            torch_res = {"error": "not run (--no-torch)"}
        else:
            torch_res = run_worker("torch", w, runs, target_ms, TORCH_TIMEOUT_S)
        print(f" {torch_res.get('wall_s', 0):.1f} s" + (f" ({torch_res['error']})" if torch_res.get("error") else ""),
              file=sys.stderr)
        results[w] = {"ours": ours, "torch": torch_res}
    wall = time.perf_counter() - t0
    load_end = os.getloadavg()[0]
    torch_version = next((r["torch"]["torch_version"] for r in results.values() if "torch_version" in r["torch"]), None)
    meta = T.machine_info(torch_version=torch_version)
    meta["load average (1 min) at start / end"] = f"{load_start:.2f} / {load_end:.2f}"
    text = report(results, meta, wall, args.quick)
    print(text)
    print(f"\nwall time of the whole run: {wall:.1f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "wall_s": wall, "results": results}, indent=1))
    if args.write_docs:
        T.replace_section(DOCS, SECTION, text, heading=HEADING)
        print(f"wrote {DOCS.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
