#!/usr/bin/env python
"""realize(): process groups for a torchtitan-style mesh sequence, vs torch ``DeviceMesh``.

The sequence (torchtitan's legacy flatten design, reached from a 1-D world mesh as torchtitan
does today, plus the two extras of ``shared/notes/torch_anchor.md`` §2d):

1. the world mesh ``(W,)``;
2. unflatten it into ``(pp, dp_replicate, dp_shard, cp, tp)``;
3. flatten ``dp = (dp_replicate, dp_shard)``; 4. ``dp_shard_cp = (dp_shard, cp)``;
5. ``dp_cp = (dp_replicate, dp_shard, cp)``; 6. ``batch``: dp's layout again, under another name;
7. unflatten ``dp_cp`` into ``(2, |dp_cp| / 2)``.

Ours: ``fm.realize`` of each mesh value in turn. Torch: ``init_device_mesh`` (world) +
``_unflatten``, ``_flatten`` (x4, the 4th under a new name), ``_unflatten`` of ``dp_cp``.

Measured, per side, in subprocess workers (one per side and world; one per rank on gloo):

- every ``new_group`` / ``split_group`` call (wrapped in ``distributed_c10d``,
  ``torch.distributed`` and the names ``device_mesh.py`` imported), the member tuples
  requested (in order) and how many are distinct; for ours also ``fm.cache_info()``;
- the wall time of the whole sequence: medians over repetitions (fake: re-initialised world
  and ``clear_cache()`` between repetitions, in one worker; gloo: one pool of W processes,
  ``clear_cache()`` / destroying torch's groups between repetitions, the time of the slowest
  rank per repetition);
- on gloo, the cost of realize's divergence check on a cache hit (``check=True`` vs
  ``check=False``, interleaved), and under fake, the cost of a pure cache hit.

Worlds: torch's single-process *fake* backend (rank 0 of W = 32 and 4,096; torch's and our
groups are made for every rank, as in a real job, but carry no communicator) and real gloo
workers on 127.0.0.1 (W = 4 and 8).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_realize.py              # fake W=32, 4096; gloo W=4, 8
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_realize.py --quick      # fake W=32 + gloo W=4 (smoke)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_realize.py --write-docs # also refresh docs/benchmarks.md

A benchmark: it reports, it asserts nothing. (It does check our group counts against the
rank sets computed from the pure meshes, and says so.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _timing as T  # noqa: E402

REPO = HERE.parent
DOCS = REPO / "docs" / "benchmarks.md"
SECTION = "bench_realize"
HEADING = "## realize: process groups (bench_realize.py)"
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FAKE_WORLDS = (32, 4_096)
GLOO_WORLDS = (4, 8)
WORKER_TIMEOUT_S = 300
# shared/notes/torch_anchor.md §2d: the legacy sequence with the two extras, W = 32, all degrees 2
ANCHOR_W32 = {"calls": 132, "distinct": 100}

STEPS: tuple[tuple[str, str, str], ...] = (
    ("world", "`realize(make_mesh((W,), \"world\"))`", "`init_device_mesh(\"cpu\", (W,), (\"world\",))`"),
    ("unflatten5", "`realize(world.unflatten(\"world\", sizes))`", "`world._unflatten(0, sizes, names)`"),
    ("dp", "`realize(m.flatten((\"dp_replicate\", \"dp_shard\"), name=\"dp\"))`",
     "`m[\"dp_replicate\", \"dp_shard\"]._flatten(\"dp\")`"),
    ("dp_shard_cp", "`realize(m.flatten((\"dp_shard\", \"cp\"), name=\"dp_shard_cp\"))`",
     "`m[\"dp_shard\", \"cp\"]._flatten(\"dp_shard_cp\")`"),
    ("dp_cp", "`realize(m.flatten((\"dp_replicate\", \"dp_shard\", \"cp\"), name=\"dp_cp\"))`",
     "`m[\"dp_replicate\", \"dp_shard\", \"cp\"]._flatten(\"dp_cp\")`"),
    ("batch", "`realize(m.flatten((\"dp_replicate\", \"dp_shard\"), name=\"batch\"))`",
     "`m[\"dp_replicate\", \"dp_shard\"]._flatten(\"batch\")`"),
    ("unflatten_dp_cp", "`realize(dp_cp.unflatten(\"dp_cp\", {\"hsdp_rep\": 2, \"hsdp_shard\": n/2}))`",
     "`dp_cp._unflatten(0, (2, n/2), (\"hsdp_rep\", \"hsdp_shard\"))`"),
)
STEP_LABEL = {"world": "world mesh", "unflatten5": "unflatten into 5-D", "dp": "flatten dp",
              "dp_shard_cp": "flatten dp_shard_cp", "dp_cp": "flatten dp_cp",
              "batch": "flatten batch (= dp's layout)", "unflatten_dp_cp": "unflatten dp_cp into (2, n/2)"}


def sizes_of(backend: str, world: int) -> dict[str, int]:
    """The 5-D shape: fake: pp = dp_replicate = cp = tp = 2, dp_shard = W/16 (all 2 at W = 32);
    gloo: (1, 2, 2, 1, 2) at W = 8 and (1, 1, 2, 1, 2) at W = 4 (size-1 axes included, as torch's
    ``_unflatten`` of all five torchtitan names gets them)."""
    if backend == "fake":
        if world % 32:
            raise ValueError(f"fake worlds must be multiples of 32, got {world}")
        dims = (2, 2, world // 16, 2, 2)
    elif world == 8:
        dims = (1, 2, 2, 1, 2)
    elif world == 4:
        dims = (1, 1, 2, 1, 2)
    else:
        raise ValueError(f"gloo worlds are 4 or 8, got {world}")
    return dict(zip(NAMES, dims))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KB


# -- the two sequences -------------------------------------------------------------------------


def ours_plan(fm: Any, world: int, sizes: dict[str, int]) -> Iterator[tuple[str, Any]]:
    """The mesh values to realize, in order, built lazily (so timing includes building them)."""
    w = fm.make_mesh((world,), ("world",))
    yield "world", w
    m = w.unflatten("world", sizes)
    yield "unflatten5", m
    yield "dp", m.flatten(("dp_replicate", "dp_shard"), name="dp")
    yield "dp_shard_cp", m.flatten(("dp_shard", "cp"), name="dp_shard_cp")
    dp_cp = m.flatten(("dp_replicate", "dp_shard", "cp"), name="dp_cp")
    yield "dp_cp", dp_cp
    yield "batch", m.flatten(("dp_replicate", "dp_shard"), name="batch")
    n = dp_cp.axis_size("dp_cp")
    yield "unflatten_dp_cp", dp_cp.unflatten("dp_cp", {"hsdp_rep": 2, "hsdp_shard": n // 2})


def ours_sequence(fm: Any, world: int, sizes: dict[str, int], after: Callable[[str], None]) -> list[Any]:
    out = []
    for key, mesh in ours_plan(fm, world, sizes):
        out.append(fm.realize(mesh))
        after(key)
    return out


def torch_sequence(world: int, sizes: dict[str, int], after: Callable[[str], None]) -> list[Any]:
    from torch.distributed.device_mesh import init_device_mesh

    w = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    after("world")
    m = w._unflatten(0, tuple(sizes.values()), tuple(sizes))
    after("unflatten5")
    dp = m["dp_replicate", "dp_shard"]._flatten("dp")
    after("dp")
    dp_shard_cp = m["dp_shard", "cp"]._flatten("dp_shard_cp")
    after("dp_shard_cp")
    dp_cp = m["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    after("dp_cp")
    batch = m["dp_replicate", "dp_shard"]._flatten("batch")
    after("batch")
    n = dp_cp.size()
    hsdp = dp_cp._unflatten(0, (2, n // 2), ("hsdp_rep", "hsdp_shard"))
    after("unflatten_dp_cp")
    return [w, m, dp, dp_shard_cp, dp_cp, batch, hsdp]


def expected_rows(world: int, sizes: dict[str, int]) -> dict[str, Any]:
    """Rank sets the sequence needs, from the pure meshes: every group of every realized axis."""
    import functional_mesh as fm

    rows: set[tuple[int, ...]] = set()
    for _key, mesh in ours_plan(fm, world, sizes):
        for axis in mesh.axis_names:
            fam = mesh[axis]
            rows |= {tuple(r) for r in fam.groups().reshape(fam.num_groups, -1).tolist()}
    whole = tuple(range(world))
    reused = whole in rows
    rows.discard(whole)  # the default group
    singles = {r for r in rows if len(r) == 1}
    return {"rows": rows, "total": len(rows), "multi": len(rows) - len(singles), "singletons": len(singles),
            "world_reused": reused}


# -- counting process-group creation ------------------------------------------------------------


class GroupCounter:
    """Wraps ``new_group`` / ``split_group`` everywhere torch and realize look them up.

    Records every top-level call: its kind, the member tuple(s) requested (in the order passed)
    and whether it used local synchronisation; keeps the groups returned (to destroy them).
    Wrapper cost: ~1 µs per call, against ≥ 20 µs for a fake ``new_group``.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[tuple[int, ...], ...], bool]] = []
        self.groups: list[Any] = []
        self._depth = 0
        self.steps: dict[str, int] = {}
        self._mark = 0

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.device_mesh as dm_module
        from torch.distributed import distributed_c10d as c10d

        real_new, real_split = c10d.new_group, c10d.split_group

        def new_group(*args: Any, **kwargs: Any) -> Any:
            ranks = kwargs.get("ranks", args[0] if args else None)
            local = bool(kwargs.get("use_local_synchronization", args[4] if len(args) > 4 else False))
            return self._call("new_group", real_new, args, kwargs,
                              (tuple(ranks),) if ranks is not None else ((),), local)

        def split_group(*args: Any, **kwargs: Any) -> Any:
            split = kwargs.get("split_ranks", args[1] if len(args) > 1 else None) or []
            return self._call("split_group", real_split, args, kwargs, tuple(tuple(r) for r in split), False)

        for module in (c10d, dist, dm_module):
            if hasattr(module, "new_group"):
                module.new_group = new_group
            if hasattr(module, "split_group"):
                module.split_group = split_group

    def _call(self, kind: str, fn: Any, args: tuple, kwargs: dict, tuples: tuple, local: bool) -> Any:
        top = self._depth == 0
        self._depth += 1
        try:
            pg = fn(*args, **kwargs)
        finally:
            self._depth -= 1
        if top:
            self.calls.append((kind, tuples, local))
            if pg is not None and type(pg).__name__ == "ProcessGroup":
                self.groups.append(pg)
        return pg

    def reset(self) -> None:
        self.calls, self.groups, self.steps, self._mark = [], [], {}, 0

    def after(self, step: str) -> None:
        self.steps[step] = len(self.calls)

    def summary(self) -> dict[str, Any]:
        """Counts over the recorded calls, per step and in total."""
        def count(calls: list) -> dict[str, int]:
            return {"new_group": sum(1 for k, _, loc in calls if k == "new_group" and not loc),
                    "local": sum(1 for k, _, loc in calls if k == "new_group" and loc),
                    "split_group": sum(1 for k, _, _ in calls if k == "split_group")}

        per_step, start = {}, 0
        for step, end in self.steps.items():
            per_step[step] = count(self.calls[start:end])
            start = end
        requested = [t for _, ts, _ in self.calls for t in ts]
        return {"total": count(self.calls), "steps": per_step, "requested": len(requested),
                "distinct": len(set(requested)), "tuples": sorted(set(requested))}


# -- fake-backend worker (one process per side and world) ----------------------------------------


def worker_fake(side: str, world: int, reps: int, runs: int, target_ms: float, extra: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import functional_mesh as fm

    sizes = sizes_of("fake", world)
    counter = GroupCounter()
    counter.install()
    seq_ns: list[int] = []
    cpu_ns: list[int] = []  # process CPU time: less sensitive than wall time to other load on the machine
    summaries = []
    out: dict[str, Any] = {"torch_version": torch.__version__}
    for rep in range(reps + 1):  # rep 0: warm-up (imports, first-call caches), not reported
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        counter.reset()
        c0 = time.process_time_ns()
        t0 = time.perf_counter_ns()
        if side == "ours":
            kept = ours_sequence(fm, world, sizes, counter.after)
        else:
            kept = torch_sequence(world, sizes, counter.after)
        elapsed = time.perf_counter_ns() - t0
        cpu = time.process_time_ns() - c0
        if rep:
            seq_ns.append(elapsed)
            cpu_ns.append(cpu)
        s = counter.summary()
        summaries.append((s["total"], s["distinct"]))
        if side == "ours":
            s["cache_info"] = list(fm.cache_info())
        if rep == reps:
            out["summary"] = {k: v for k, v in s.items() if k != "tuples"}
            exp = expected_rows(world, sizes)
            got = set(s["tuples"])
            if side == "ours":
                mine = {r for r in exp["rows"] if len(r) > 1 or r == (0,)}  # rank 0 makes only its own singleton
                out["same_rank_sets"] = got == mine
            else:
                out["same_rank_sets"] = got == exp["rows"]
            if side == "ours" and extra:  # a pure cache hit of the 5-D mesh
                m5 = kept[1].mesh
                hit = T.measure_many({"hit": lambda: fm.realize(m5, check=False)}, runs=runs,
                                     target_ms=target_ms)["hit"]
                out["hit"] = hit.as_dict()
            out["expected"] = {k: v for k, v in exp.items() if k != "rows"}
        del kept
        if side == "ours":
            fm.clear_cache()
        dist.destroy_process_group()
    out["counts_stable"] = len(set(json.dumps(x) for x in summaries)) == 1
    out["seq_ns"] = seq_ns
    out["cpu_ns"] = cpu_ns
    out["peak_rss"] = _peak_rss_bytes()
    return out


# -- gloo worker (one process per rank) ----------------------------------------------------------


def worker_gloo(side: str, world: int, rank: int, port: int, reps: int, check_calls: int, extra: bool
                ) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    sizes = sizes_of("gloo", world)
    counter = GroupCounter()
    counter.install()
    seq_ns: list[int] = []
    out: dict[str, Any] = {"rank": rank, "torch_version": torch.__version__}
    for rep in range(reps + 1):  # rep 0: warm-up
        counter.reset()
        dist.barrier()
        t0 = time.perf_counter_ns()
        if side == "ours":
            kept = ours_sequence(fm, world, sizes, counter.after)  # check=True: the default
        else:
            kept = torch_sequence(world, sizes, counter.after)
        elapsed = time.perf_counter_ns() - t0
        if rep:
            seq_ns.append(elapsed)
        s = counter.summary()
        if side == "ours":
            s["cache_info"] = list(fm.cache_info())
        del kept
        dist.barrier()
        if side == "ours":
            fm.clear_cache()
        else:
            for pg in counter.groups:
                dist.destroy_process_group(pg)
        dist.barrier()
    out["summary"] = s
    out["seq_ns"] = seq_ns
    if side == "ours":
        exp = expected_rows(world, sizes)
        out["expected"] = {k: v for k, v in exp.items() if k != "rows"}
        out["expected_rows"] = sorted(exp["rows"])
    if side == "ours" and extra:
        # divergence check on a cache hit: check=True vs check=False, interleaved, alternating order
        m = fm.make_mesh((world,), ("world",)).unflatten("world", sizes)
        fm.realize(m)
        samples: dict[str, list[int]] = {"check": [], "nocheck": []}
        for i in range(check_calls + 2):
            for mode in ((True, False) if i % 2 == 0 else (False, True)):
                dist.barrier()
                t0 = time.perf_counter_ns()
                fm.realize(m, check=mode)
                dt = time.perf_counter_ns() - t0
                if i >= 2:  # two warm-up rounds
                    samples["check" if mode else "nocheck"].append(dt)
        out["check_ns"] = samples
        fm.clear_cache()
    dist.barrier()
    dist.destroy_process_group()
    return out


def run_fake(side: str, world: int, reps: int, runs: int, target_ms: float, extra: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", f"fake-{side}", "--_world", str(world),
           "--reps", str(reps), "--runs", str(runs), "--target-ms", str(target_ms)] + (["--_extra"] if extra else [])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"not run: timed out after {WORKER_TIMEOUT_S} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"not run: worker exited with {proc.returncode} ({tail[:200]})"}
    out = T.last_json(proc.stdout)
    out["wall_s"] = time.perf_counter() - t0
    return out


def run_gloo(side: str, world: int, reps: int, check_calls: int, extra: bool) -> dict[str, Any]:
    """A pool of ``world`` gloo processes on 127.0.0.1; the per-rank results, merged."""
    args = ["--_worker", f"gloo-{side}", "--reps", str(reps), "--check-calls", str(check_calls)]
    return T.run_gloo_pool(Path(__file__).resolve(), world, args + (["--_extra"] if extra else []),
                           WORKER_TIMEOUT_S, REPO)


def run_rounds(kind: str, world: int, rounds: int, run: Callable[[str, bool], dict[str, Any]]) -> dict[str, Any]:
    """``rounds`` workers per side, the sides alternating (ours, torch, torch, ours, ...) so that a
    slow phase of a shared machine hits both; repetitions pooled. Counts, the cache-hit and the
    check figures come from the last round (``extra``); counts must agree across rounds."""
    res: dict[str, list[dict[str, Any]]] = {"ours": [], "torch": []}
    for r in range(rounds):
        order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
        for side in order:
            print(f"  {kind} W={world:,} round {r + 1}/{rounds}: {side} ...", end="", flush=True, file=sys.stderr)
            out = run(side, r == rounds - 1)
            print(f" {out.get('wall_s', 0):.1f} s" + (f" ({out['error']})" if out.get("error") else ""),
                  file=sys.stderr)
            res[side].append(out)
    merged = {}
    for side, outs in res.items():
        bad = next((o for o in outs if o.get("error")), None)
        if bad:
            merged[side] = bad
            continue
        last = dict(outs[-1])
        last["wall_s"] = sum(o["wall_s"] for o in outs)
        last["rounds"] = len(outs)
        if kind == "fake":
            last["seq_ns"] = [x for o in outs for x in o["seq_ns"]]
            last["cpu_ns"] = [x for o in outs for x in o["cpu_ns"]]
            last["counts_stable"] = all(o.get("counts_stable") for o in outs) and \
                len({json.dumps(o["summary"]["total"]) for o in outs}) == 1
        else:
            n_ranks = len(last["ranks"])
            ranks = []
            for i in range(n_ranks):
                rank_res = dict(last["ranks"][i])
                rank_res["seq_ns"] = [x for o in outs for x in o["ranks"][i]["seq_ns"]]
                ranks.append(rank_res)
            last["ranks"] = ranks
            last["counts_stable"] = len({json.dumps([rr["summary"]["total"] for rr in o["ranks"]])
                                         for o in outs}) == 1
        merged[side] = last
    return merged


# -- report -----------------------------------------------------------------------------------


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def fake_config(world: int, ours: dict[str, Any], torch_res: dict[str, Any]) -> dict[str, Any]:
    """Normalised figures of one fake world (rank 0 stands for every rank)."""
    c: dict[str, Any] = {"backend": "fake", "world": world, "sizes": sizes_of("fake", world)}
    o, t = ours.get("summary"), torch_res.get("summary")
    c["ours_calls"] = o["total"] if o else None
    c["ours_distinct"] = ours.get("summary", {}).get("distinct")
    c["ours_requested"] = ours.get("summary", {}).get("requested")
    c["cache_info"] = ours.get("summary", {}).get("cache_info")
    c["expected"] = ours.get("expected") or torch_res.get("expected")
    c["ours_steps"] = o["steps"] if o else None
    c["torch_calls"] = t["total"] if t else None
    c["torch_distinct"] = t["distinct"] if t else None
    c["torch_requested"] = t["requested"] if t else None
    c["torch_steps"] = t["steps"] if t else None
    c["ours_same_sets"] = ours.get("same_rank_sets")
    c["torch_same_sets"] = torch_res.get("same_rank_sets")
    c["ours_seq"] = ours.get("seq_ns")
    c["torch_seq"] = torch_res.get("seq_ns")
    c["ours_cpu"] = ours.get("cpu_ns")
    c["torch_cpu"] = torch_res.get("cpu_ns")
    c["ours_error"], c["torch_error"] = ours.get("error"), torch_res.get("error")
    c["hit"] = ours.get("hit")
    c["stable"] = bool(ours.get("counts_stable")) and bool(torch_res.get("counts_stable"))
    c["notes"] = (f"worker peak RSS ours {T.fmt_bytes(ours.get('peak_rss'))}, torch "
                  f"{T.fmt_bytes(torch_res.get('peak_rss'))}")
    return c


def gloo_config(world: int, ours: dict[str, Any], torch_res: dict[str, Any]) -> dict[str, Any]:
    """Normalised figures of one gloo pool: calls per rank (max over ranks), distinct over all ranks."""
    c: dict[str, Any] = {"backend": "gloo", "world": world, "sizes": sizes_of("gloo", world)}
    c["ours_error"], c["torch_error"] = ours.get("error"), torch_res.get("error")
    for side, res in (("ours", ours), ("torch", torch_res)):
        ranks = res.get("ranks")
        if not ranks:
            for k in ("calls", "distinct", "requested", "steps", "seq", "same_sets"):
                c[f"{side}_{k}"] = None
            continue
        sums = [r["summary"] for r in ranks]
        c[f"{side}_calls"] = {k: max(s["total"][k] for s in sums) for k in ("new_group", "local", "split_group")}
        c[f"{side}_calls_min"] = {k: min(s["total"][k] for s in sums) for k in ("new_group", "local",
                                                                                "split_group")}
        union = set()
        for s in sums:
            union |= {tuple(t) for t in s["tuples"]}
        c[f"{side}_distinct"] = len(union)
        c[f"{side}_union"] = union
        c[f"{side}_requested"] = max(s["requested"] for s in sums)
        c[f"{side}_rank_distinct_eq_requested"] = all(s["requested"] == s["distinct"] for s in sums)
        c[f"{side}_steps"] = sums[0]["steps"]  # rank 0's
        n = len(ranks[0]["seq_ns"])
        c[f"{side}_seq"] = [max(r["seq_ns"][i] for r in ranks) for i in range(n)]  # slowest rank per rep
    if ours.get("ranks"):
        r0 = ours["ranks"][0]
        c["expected"] = r0["expected"]
        exp_rows = {tuple(t) for t in r0["expected_rows"]}
        c["cache_info"] = r0["summary"]["cache_info"]
        c["cache_info_same"] = len({tuple(r["summary"]["cache_info"]) for r in ours["ranks"]}) == 1
        c["ours_same_sets"] = c["ours_union"] == exp_rows
        if torch_res.get("ranks"):
            c["torch_same_sets"] = c["torch_union"] == exp_rows
        else:
            c["torch_same_sets"] = None
        per_rank = {k: [_med(r["check_ns"][k]) for r in ours["ranks"]] for k in ("check", "nocheck")}
        c["check"] = {k: {"rank_max": max(v), "rank_min": min(v), "n": len(ours["ranks"][0]["check_ns"][k])}
                      for k, v in per_rank.items()}
    else:
        c["expected"] = c["cache_info"] = c["check"] = None
    c["stable"] = bool(ours.get("counts_stable")) and bool(torch_res.get("counts_stable"))
    c["notes"] = (f"pools' wall time ours {ours.get('wall_s', 0):.1f} s, torch {torch_res.get('wall_s', 0):.1f} s "
                  f"(torch imports in W processes included)")
    return c


def _shape(sizes: dict[str, int]) -> str:
    return "(" + ", ".join(str(v) for v in sizes.values()) + ")"


def _calls_txt(calls: dict[str, int] | None, local_label: bool = True) -> str:
    if calls is None:
        return "n/a"
    txt = T.fmt_int(calls["new_group"])
    if calls.get("local"):
        txt += f" + {T.fmt_int(calls['local'])} local"
    if calls.get("split_group"):
        txt += f" + {T.fmt_int(calls['split_group'])} split"
    return txt


def _seq_txt(ns: list[int] | None) -> str:
    if not ns:
        return "n/a"
    return f"{T.fmt_ns(_med(ns))} ({T.fmt_ns(min(ns))} – {T.fmt_ns(max(ns))})"


def ours_target(c: dict[str, Any]) -> tuple[bool | None, str]:
    """One group per distinct rank set: collective calls = distinct multi-rank sets, at most one
    local singleton per rank, no tuple asked twice, cache_info().groups = all distinct sets."""
    exp, calls = c.get("expected"), c.get("ours_calls")
    if not exp or not calls:
        return None, c.get("ours_error") or "not run"
    want_local = 1 if exp["singletons"] else 0
    ok = (calls["new_group"] == exp["multi"] and calls["local"] == want_local and calls["split_group"] == 0
          and c["cache_info"][2] == exp["total"] and bool(c.get("ours_same_sets")))
    if c["backend"] == "gloo":
        ok = ok and c["ours_calls_min"]["new_group"] == exp["multi"] and c["ours_rank_distinct_eq_requested"] \
            and c["cache_info_same"]
    else:
        ok = ok and c["ours_requested"] == c["ours_distinct"]
    txt = (f"{T.fmt_int(calls['new_group'])} `new_group` per rank for {T.fmt_int(exp['multi'])} distinct multi-rank "
           f"sets, {calls['local']} local singleton per rank for {T.fmt_int(exp['singletons'])} singleton sets, "
           f"`cache_info().groups` = {T.fmt_int(c['cache_info'][2])} of {T.fmt_int(exp['total'])}")
    return ok, txt


def summary_table(configs: list[dict[str, Any]]) -> str:
    rows = []
    for c in configs:
        exp = c.get("expected") or {}
        ci = c.get("cache_info")
        ci_txt = f"hits {ci[0]}, misses {ci[1]}, groups {T.fmt_int(ci[2])}" if ci else "n/a"
        t_calls, t_dist = c.get("torch_calls"), c.get("torch_distinct")
        redundant = (t_calls["new_group"] + t_calls["local"] - t_dist) if (t_calls and t_dist is not None
                                                                           and c["backend"] == "fake") else None
        torch_txt = c.get("torch_error") or _calls_txt(t_calls)
        if t_dist is not None and c["backend"] == "fake":
            torch_txt += f"; {T.fmt_int(t_dist)} distinct ({T.fmt_int(redundant)} repeats)"
        elif t_dist is not None:
            torch_txt += f"; {T.fmt_int(t_dist)} distinct over all ranks"
        ours_txt = c.get("ours_error") or _calls_txt(c.get("ours_calls"))
        if c.get("ours_distinct") is not None:
            ours_txt += f"; {T.fmt_int(c['ours_distinct'])} distinct" + (" over all ranks" if c["backend"] == "gloo"
                                                                           else "")
        ours_med = _med(c["ours_seq"]) if c.get("ours_seq") else None
        torch_med = _med(c["torch_seq"]) if c.get("torch_seq") else None
        ours_cpu = _med(c["ours_cpu"]) if c.get("ours_cpu") else None
        torch_cpu = _med(c["torch_cpu"]) if c.get("torch_cpu") else None
        rows.append([
            f"{c['backend']} W={T.fmt_int(c['world'])}", _shape(c["sizes"]),
            f"{T.fmt_int(exp['total'])} ({T.fmt_int(exp['singletons'])} singletons)" if exp else "n/a",
            ours_txt, ci_txt, torch_txt,
            _seq_txt(c.get("ours_seq")), _seq_txt(c.get("torch_seq")), T.fmt_ratio(torch_med, ours_med),
            f"{T.fmt_ns(ours_cpu)} / {T.fmt_ns(torch_cpu)} = {T.fmt_ratio(torch_cpu, ours_cpu)}"
            if ours_cpu and torch_cpu else "n/a",
        ])
    headers = ["world", "(pp, dp_rep, dp_shard, cp, tp)", "distinct rank sets needed", "ours: group calls per rank",
               "ours: `cache_info()`", "torch: group calls per rank", "ours: sequence (median, min – max)",
               "torch: sequence (median, min – max)", "torch / ours", "CPU time ours / torch (median): torch / ours"]
    return T.markdown_table(headers, rows, "llrlllrrrr")


def steps_table(c: dict[str, Any]) -> str:
    rows = []
    for key, ours_label, torch_label in STEPS:
        o = c["ours_steps"][key] if c.get("ours_steps") else None
        t = c["torch_steps"][key] if c.get("torch_steps") else None
        rows.append([STEP_LABEL[key], ours_label, _calls_txt(o), torch_label, _calls_txt(t)])
    tot_o, tot_t = c.get("ours_calls"), c.get("torch_calls")
    rows.append(["**total**", "", _calls_txt(tot_o), "", _calls_txt(tot_t)])
    headers = ["step", "ours", "ours: calls", "torch", "torch: calls"]
    return T.markdown_table(headers, rows, "llrlr")


def check_table(configs: list[dict[str, Any]]) -> str:
    rows = []
    for c in configs:
        if c["backend"] != "gloo":
            continue
        ch = c.get("check")
        if not ch:
            rows.append([f"gloo W={c['world']}", c.get("ours_error") or "n/a", "", "", ""])
            continue
        on, off = ch["check"], ch["nocheck"]
        rows.append([
            f"gloo W={c['world']}", f"{T.fmt_ns(on['rank_max'])} ({T.fmt_ns(on['rank_min'])})",
            f"{T.fmt_ns(off['rank_max'])} ({T.fmt_ns(off['rank_min'])})",
            T.fmt_ns(on["rank_max"] - off["rank_max"]), f"{on['n']} + {off['n']}",
        ])
    headers = ["world", "`check=True` hit: rank-max median (rank-min)", "`check=False` hit: rank-max (rank-min)",
               "cost of the check", "calls per mode per rank"]
    return T.markdown_table(headers, rows, "lrrrr")


def hit_table(configs: list[dict[str, Any]]) -> str:
    rows = []
    for c in configs:
        if c["backend"] != "fake" or not c.get("hit"):
            continue
        h = c["hit"]
        rows.append([f"fake W={T.fmt_int(c['world'])}", _shape(c["sizes"]),
                     "`realize(m, check=False)`, all 5 axes cached", T.fmt_ns(h["median_ns"]),
                     f"{T.fmt_ns(min(h['per_call_ns']))} – {T.fmt_ns(max(h['per_call_ns']))}", "0"])
    headers = ["world", "mesh", "call", "median", "min – max", "groups created"]
    return T.markdown_table(headers, rows, "llllrr")


def targets_table(configs: list[dict[str, Any]]) -> str:
    rows = []
    for c in configs:
        ok, txt = ours_target(c)
        verdict = "not evaluated" if ok is None else ("**met**" if ok else "**not met**")
        rows.append([f"ours: exactly one group per distinct rank set ({c['backend']} W={T.fmt_int(c['world'])})",
                     txt, verdict])
    w32 = next((c for c in configs if c["backend"] == "fake" and c["world"] == 32), None)
    if w32 and w32.get("torch_calls"):
        calls = w32["torch_calls"]["new_group"] + w32["torch_calls"]["local"]
        same = calls == ANCHOR_W32["calls"] and w32["torch_distinct"] == ANCHOR_W32["distinct"]
        rows.append(["torch's counts reproduce `shared/notes/torch_anchor.md` §2d (legacy + 2 extras, W=32: "
                     f"{ANCHOR_W32['calls']} calls, {ANCHOR_W32['distinct']} distinct)",
                     f"{calls} calls, {w32['torch_distinct']} distinct, {w32['torch_calls']['split_group']} split",
                     "**reproduced**" if same else "**differs**"])
    for c in configs:
        if c.get("ours_same_sets") is not None and c.get("torch_same_sets") is not None:
            rows.append([f"same rank sets as the pure meshes ({c['backend']} W={T.fmt_int(c['world'])})",
                         f"ours: {'yes' if c['ours_same_sets'] else 'NO'}; torch: "
                         f"{'yes' if c['torch_same_sets'] else 'NO'}",
                         "**met**" if c["ours_same_sets"] and c["torch_same_sets"] else "**not met**"])
    return T.markdown_table(["target", "measured", "verdict"], rows, "llc")


FOOTNOTES = """\
- "group calls per rank": `new_group` calls (every rank makes every one, member or not) +
  "local" = `new_group([rank], use_local_synchronization=True)` (this rank's singleton, no
  communication) + `split_group` calls; on gloo the maximum over ranks. Torch's "distinct" counts
  the distinct member tuples it requested; "repeats" = calls − distinct.
- "distinct rank sets needed": every group of every axis of every mesh of the sequence, from the
  pure meshes, minus the whole world (the default group, reused by both sides at 0 cost).
  Ours should make one collective `new_group` per multi-rank set and, when a size-1 axis
  exists, one local singleton per rank; `cache_info().groups` counts every set (each rank's
  singleton included) and is the same on every rank.
- Sequence times: median (min – max) over repetitions pooled from several workers per side,
  started alternately (ours, torch, torch, ours, ...) so a slow phase of the machine hits both.
  Fake: rank 0 of the fake world (which still makes every rank's `new_group` call); the world
  is re-initialised (and `fm.clear_cache()` called) between repetitions; one warm-up repetition
  per worker is dropped. Gloo: per repetition the time of the slowest rank (a barrier before),
  then the median; `fm.clear_cache()` / destroying torch's groups between repetitions; ours
  includes realize's divergence check (`check=True`, the default) on each of its 7 calls. The
  counting wrapper (~1 µs per call) is included on both sides. The machine is shared: wall times
  drift with other load (see the load average), so the fake rows also give the worker's CPU
  time for the sequence (`time.process_time`), which other processes disturb much less.
- Fake `new_group` builds no communicator, so fake times are the bookkeeping cost only; gloo
  times include real rendezvous (every `new_group` synchronises all ranks through the store).
- Check cost: on a cache hit of the 5-D mesh, `realize(m, check=True)` and
  `realize(m, check=False)` alternate (order swapped every round, a barrier before each call,
  two warm-up rounds dropped); per rank the median, then the maximum (and minimum) over ranks."""


def report(configs: list[dict[str, Any]], meta: dict[str, str], wall_s: float, quick: bool, reps: dict[str, int],
           rounds: dict[str, int]) -> str:
    lines = []
    cmd = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_realize.py" + (" --quick" if quick else "")
    lines.append(f"Run of `{cmd}`{' (quick: a smoke run)' if quick else ''}: {reps['fake']} timed repetitions of "
                 f"each fake sequence ({rounds['fake']} workers per side), {reps['gloo']} of each gloo sequence "
                 f"({rounds['gloo']} pools per side), {wall_s:.0f} s of wall time for the whole run.")
    lines.append("")
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines.append("")
    lines.append("The sequence (torchtitan's legacy flatten design, from a 1-D world mesh, plus a second "
                 "flatten of dp's layout under another name and an unflatten of dp_cp; "
                 "`shared/notes/torch_anchor.md` §2c–d): "
                 "world → unflatten `(pp, dp_replicate, dp_shard, cp, tp)` → flatten `dp`, `dp_shard_cp`, `dp_cp` → "
                 "flatten `batch` (= dp) → unflatten `dp_cp` into `(2, n/2)`. Fake: rank 0 of W, "
                 "`dp_shard` = W/16, every other degree 2. Gloo: W real processes on 127.0.0.1, "
                 "`OMP_NUM_THREADS=1`, shapes with size-1 axes (torch's `_unflatten` with all five names "
                 "makes W singleton groups for each of them).")
    lines.append("")
    lines.append("How to read the tables:")
    lines.append("")
    lines.append(FOOTNOTES)
    lines.append("")
    lines.append("### Group creation and sequence time")
    lines.append("")
    lines.append(summary_table(configs))
    lines.append("")
    lines.append("; ".join(f"{c['backend']} W={T.fmt_int(c['world'])}: {c['notes']}" for c in configs) + ". "
                 "Group counts identical in every repetition and worker: "
                 + ("yes" if all(c.get("stable") for c in configs) else
                    "**NO** (" + ", ".join(f"{c['backend']} W={c['world']}" for c in configs if not c.get("stable"))
                    + ")") + ".")
    lines.append("")
    for c in configs:
        lines.append(f"### Calls per step: {c['backend']} W = {T.fmt_int(c['world'])}, "
                     f"(pp, dp_replicate, dp_shard, cp, tp) = {_shape(c['sizes'])}")
        lines.append("")
        lines.append(steps_table(c))
        lines.append("")
    if any(c["backend"] == "gloo" for c in configs):
        lines.append("### Divergence check on a cache hit (gloo, default TCPStore)")
        lines.append("")
        lines.append(check_table(configs))
        lines.append("")
    if any(c.get("hit") for c in configs):
        lines.append("### A pure cache hit (fake, `check=False`)")
        lines.append("")
        lines.append(hit_table(configs))
        lines.append("")
    lines.append("### Targets")
    lines.append("")
    lines.append(targets_table(configs))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = T.bench_parser(__doc__, str(DOCS.relative_to(REPO)), "fake W=32 and gloo W=4 only, fewer repetitions (smoke)",
                       "timed runs of the cache-hit figure (default 7; quick 3)")
    p.add_argument("--fake-worlds", type=T.int_tuple, default=None,
                   help="comma-separated fake world sizes (multiples of 32); default 32,4096")
    p.add_argument("--gloo-worlds", type=T.int_tuple, default=None,
                   help="comma-separated gloo world sizes (4 and/or 8); default 4,8; empty: none")
    p.add_argument("--reps", type=int, default=None,
                   help="sequence repetitions per worker, after one warm-up (default 3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="workers per side, alternating sides (default fake 3, gloo 2; quick 1)")
    p.add_argument("--check-calls", type=int, default=30, help="check=True/False calls per mode per rank (≥ 20)")
    p.add_argument("--_rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_extra", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    runs, target_ms = T.run_settings(args)

    if args._worker:
        kind, side = args._worker.split("-")
        if kind == "fake":
            res = worker_fake(side, args._world, args.reps, runs, target_ms, args._extra)
        else:
            res = worker_gloo(side, args._world, args._rank, args._port, args.reps, args.check_calls, args._extra)
        print(json.dumps(res), flush=True)
        sys.stderr.flush()
        os._exit(0)  # skip interpreter teardown (seconds with torch loaded, x W processes); groups are destroyed

    fake_worlds = args.fake_worlds if args.fake_worlds is not None else ((32,) if args.quick else FAKE_WORLDS)
    gloo_worlds = args.gloo_worlds if args.gloo_worlds is not None else ((4,) if args.quick else GLOO_WORLDS)
    reps_n = args.reps or 3
    rounds = {"fake": args.rounds or (1 if args.quick else 3), "gloo": args.rounds or (1 if args.quick else 2)}
    reps = {k: reps_n * n for k, n in rounds.items()}
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    configs: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for w in fake_worlds:
        merged = run_rounds("fake", w, rounds["fake"],
                            lambda side, extra: run_fake(side, w, reps_n, runs, target_ms, extra))
        raw[f"fake-{w}"] = merged
        configs.append(fake_config(w, merged["ours"], merged["torch"]))
    for w in gloo_worlds:
        merged = run_rounds("gloo", w, rounds["gloo"],
                            lambda side, extra: run_gloo(side, w, reps_n, args.check_calls, extra))
        raw[f"gloo-{w}"] = merged
        configs.append(gloo_config(w, merged["ours"], merged["torch"]))
    wall = time.perf_counter() - t0
    load_end = os.getloadavg()[0]
    torch_version = next((r[s].get("torch_version") or (r[s].get("ranks") or [{}])[0].get("torch_version")
                          for r in raw.values() for s in ("ours", "torch")
                          if r[s].get("torch_version") or r[s].get("ranks")), None)
    meta = T.machine_info(torch_version=torch_version)
    meta["load average (1 min) at start / end"] = f"{load_start:.2f} / {load_end:.2f}"
    text = report(configs, meta, wall, args.quick, reps, rounds)
    print(text)
    print(f"\nwall time of the whole run: {wall:.1f} s", file=sys.stderr)
    if args.json:
        def default(o: Any) -> Any:
            return sorted(o) if isinstance(o, set) else str(o)
        args.json.write_text(json.dumps({"meta": meta, "wall_s": wall, "raw": raw}, indent=1, default=default))
    if args.write_docs:
        T.replace_section(DOCS, SECTION, text, heading=HEADING)
        print(f"wrote {DOCS.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
