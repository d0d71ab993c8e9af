"""DTensor boundaries under torch.compile, on real gloo workers (world 2): we break no more than DTensor.

``fm.distribute`` and ``fm.reshard`` inside a compiled function, each against torch doing the same
thing: ``distribute_tensor(..., src_data_rank=None)`` (torch's own "slice the full tensor locally")
and ``DTensor.from_local`` of the local block (what ``fm.distribute`` calls) for distribute,
``DTensor.redistribute`` for reshard. Per case and side:

- graph breaks, as dynamo counts them: the sum of ``torch._dynamo.utils.counters["graph_break"]``
  after one call of ``torch.compile(fn, backend="eager")`` on a fresh dynamo. Not
  ``torch._dynamo.explain``: it counts graphs handed to the backend, so a break with no op before
  it is invisible (it reported 0 breaks for a distribute that broke twice and failed fullgraph);
- whether ``torch.compile(fn, fullgraph=True)`` compiles;
- on ``eager`` (graph breaks allowed) and ``aot_eager`` (``fullgraph=True`` where it compiles): the
  output (values and placements) and the input's gradient equal to the same function run eagerly.

The counts are the ones measured on torch 2.13.0 and 2.14.1 (identical, and the same on a 2x2 mesh
at world 4). Before the plans of ``_interop.py`` (docs/compile.md, "DTensor boundaries") ours broke
2 times in distribute of a sharded spec and 4 times in every reshard, where torch breaks 0 times.
Also here: a compiled call plans each mesh anew (fresh meshes, other meshes, symbolic sizes,
shardings built inside the compiled function), and the two models ``benchmarks/bench_compile.py``
times compute the same step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

# where this torch's dynamo cannot trace a region (2.11, 2.12: shard_map's own probe says so), none compiles
pytestmark = needs_compiled_regions()
w2 = pool_fixture(2)

DISTRIBUTE = {"Shard(0)": P("a"), "Shard(1)": P(None, "a"), "Replicate": P()}
RESHARD = {"Shard(0)->Replicate": (P("a"), P()), "Replicate->Shard(0)": (P(), P("a")),
           "Shard(0)->Shard(1)": (P("a"), P(None, "a"))}

# Graph breaks measured on torch 2.13.0 and 2.14.1, gloo, world 2. torch's distribute_tensor breaks
# where it builds its DTensorSpec and returns a new leaf (requires_grad_ on an intermediate).
BREAKS = {
    **{("distribute", name): {"ours": 0, "DTensor.from_local": 0, "distribute_tensor": 4} for name in DISTRIBUTE},
    **{("reshard", name): {"ours": 0, "DTensor.redistribute": 0} for name in RESHARD},
}


def _sides(rm, kind: str, name: str) -> tuple[dict, object]:
    """``{side: fn}`` for one case, and the maker of a fresh input (a leaf that requires grad)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    dm, x0 = rm.device_mesh, torch.arange(64.0, dtype=torch.float64).reshape(8, 8)
    if kind == "distribute":
        sharding = fm.NamedSharding(rm.mesh, DISTRIBUTE[name])
        placements, block = sharding.placements, sharding.local_slices((8, 8), rm.rank)
        return {"ours": lambda x: fm.distribute(x, sharding, mesh=rm),
                "DTensor.from_local": lambda x: DTensor.from_local(x[block].contiguous().clone(), dm, placements,
                                                                   run_check=False, shape=x.shape, stride=x.stride()),
                "distribute_tensor": lambda x: distribute_tensor(x, dm, placements, src_data_rank=None),
                }, lambda: x0.clone().requires_grad_()
    source, target = (fm.NamedSharding(rm.mesh, spec) for spec in RESHARD[name])
    placements = target.placements
    return {"ours": lambda d: fm.reshard(d, target),
            "DTensor.redistribute": lambda d: d.redistribute(dm, placements),
            }, lambda: fm.distribute(x0, source, mesh=rm).requires_grad_()


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _run(fn, make) -> tuple:
    """Output (full value, placements) and the input's gradient (``None``: the output is a new leaf)."""
    x = make()
    y = fn(x)
    full = _full(y)
    (full * (1 + torch.arange(full.numel(), dtype=full.dtype).reshape(full.shape))).sum().backward()
    return full.detach(), getattr(y, "placements", None), None if x.grad is None else _full(x.grad)


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and (a[2] is b[2] is None or (
        a[2] is not None and b[2] is not None and torch.equal(a[2], b[2])))


def boundaries() -> dict:
    """Per (kind, case, side): (graph breaks, fullgraph compiles, {backend: output and gradient equal eager's})."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    rm = fm.realize(fm.make_mesh((2,), ("a",)), timeout=GROUP_TIMEOUT, check=CHECK_S)
    out = {}
    for kind, names in (("distribute", DISTRIBUTE), ("reshard", RESHARD)):
        for name in names:
            sides, make = _sides(rm, kind, name)
            for side, fn in sides.items():
                want = _run(fn, make)
                dynamo.reset()
                counters.clear()
                got = {"eager": _run(torch.compile(fn, backend="eager"), make)}  # graph breaks allowed: count them
                breaks = sum(counters["graph_break"].values())
                dynamo.reset()
                try:
                    got["aot_eager"] = _run(torch.compile(fn, backend="aot_eager", fullgraph=True), make)
                    whole = True
                except Exception:  # noqa: BLE001 - torch._dynamo's Unsupported (or its internal errors)
                    whole = False
                    dynamo.reset()
                    got["aot_eager"] = _run(torch.compile(fn, backend="aot_eager"), make)
                out[(kind, name, side)] = (breaks, whole, {b: _same(g, want) for b, g in got.items()})
    return out


@pytest.fixture(scope="module")
def measured(w2):
    return w2.run(boundaries, timeout=600)


@pytest.mark.timeout(600)
def test_graph_breaks_are_the_measured_ones_and_ours_no_more_than_torchs(measured):
    for rank, res in enumerate(measured):
        breaks = {(kind, name): {} for kind, name, _ in res}
        for (kind, name, side), (n, whole, _) in res.items():
            breaks[kind, name][side] = n
            assert whole is (n == 0), f"rank {rank}: {kind} {name} {side}: {n} breaks, fullgraph compiles: {whole}"
        assert breaks == BREAKS, f"rank {rank}"
        for (kind, name), sides in breaks.items():
            assert sides["ours"] <= min(n for side, n in sides.items() if side != "ours"), (rank, kind, name, sides)


def test_compiled_outputs_and_gradients_equal_eager(measured):
    for rank, res in enumerate(measured):
        bad = {key: same for key, (_, _, same) in res.items() if not all(same.values())}
        assert bad == {}, f"rank {rank}: (kind, case, side) -> output and gradient equal eager's, per backend"


def each_call_on_its_own_mesh() -> dict:
    """One compiled ``distribute(x, s, mesh=m)`` and one compiled ``reshard(d, s)``, called on two fresh
    realized meshes (their torch meshes not built yet) and with shardings on other meshes: what is a
    constant of the trace (the plan: checks, placements, coordinate, torch mesh) must be made anew
    for each. A compiled distribute of tensors of three sizes: the third call sees symbolic sizes.
    And shardings built inside the compiled function, on a mesh made outside it or inside."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    ordered = fm.realize(fm.make_mesh((2,), ("c",)), timeout=GROUP_TIMEOUT, check=CHECK_S)
    flipped = fm.realize(fm.Mesh.from_ranks(np.array([1, 0]), ("c",)), timeout=GROUP_TIMEOUT, check=CHECK_S)
    x = torch.arange(16.0).reshape(4, 4)
    dynamo.reset()
    distribute = torch.compile(lambda x, s, m: fm.distribute(x, s, mesh=m), backend="eager", fullgraph=True)
    made = [distribute(x, fm.NamedSharding(m.mesh, P("c")), m) for m in (ordered, flipped)]
    res = {"distribute": [(d.device_mesh is m.device_mesh, torch.equal(d.full_tensor(), x),
                           torch.equal(d.to_local(), x[2 * m.local_rank("c"):][:2]))
                          for d, m in zip(made, (ordered, flipped), strict=True)]}
    dynamo.reset()
    counters.clear()
    rows = torch.compile(lambda x: fm.distribute(x, fm.NamedSharding(ordered.mesh, P("c")), mesh=ordered),
                         backend="eager")
    blocks = [rows(torch.arange(4.0 * n).reshape(n, 4)).to_local() for n in (4, 6, 5)]  # sizes turn symbolic
    res["symbolic sizes"] = ([b.shape[0] for b in blocks], sum(counters["graph_break"].values()))
    d, d_flipped = (fm.distribute(x, fm.NamedSharding(m.mesh, P("c")), mesh=m) for m in (ordered, flipped))
    here, renamed = fm.NamedSharding(ordered.mesh, P()), fm.NamedSharding(fm.make_mesh((2,), ("b",)), P())
    dynamo.reset()
    reshard = torch.compile(lambda d, s: fm.reshard(d, s), backend="eager")
    res["reshard"] = []
    for dt, sharding in ((d, here), (d, renamed), (d, here), (d_flipped, here),
                         (d_flipped, fm.NamedSharding(flipped.mesh, P()))):
        try:
            res["reshard"].append(torch.equal(reshard(dt, sharding).full_tensor(), x))
        except fm.MeshError as e:
            res["reshard"].append(str(e))
    dynamo.reset()  # shardings built inside the compiled function
    both = torch.compile(lambda x: fm.reshard(fm.distribute(x, fm.NamedSharding(ordered.mesh, P("c")), mesh=ordered),
                                              fm.NamedSharding(ordered.mesh, P(None, "c"))), fullgraph=True,
                         backend="eager")
    y = both(x)
    res["built inside"] = (tuple(y.placements), torch.equal(y.full_tensor(), x))
    made_inside = lambda x: fm.distribute(x, fm.NamedSharding(fm.make_mesh((2,), ("c",)), P("c")), mesh=ordered)
    dynamo.reset()
    res["mesh made inside"] = torch.equal(torch.compile(made_inside, backend="eager")(x).full_tensor(), x)
    dynamo.reset()
    try:
        torch.compile(made_inside, backend="eager", fullgraph=True)(x)
        res["mesh made inside, fullgraph"] = "compiled"
    except Exception as e:  # noqa: BLE001 - dynamo's Unsupported, our message in its text
        res["mesh made inside, fullgraph"] = str(e)
    return res


@pytest.mark.timeout(300)
def test_compiled_calls_make_and_check_each_mesh_anew(w2):
    from torch.distributed.tensor import Shard

    for rank, res in enumerate(w2.run(each_call_on_its_own_mesh, timeout=300)):
        assert res["distribute"] == [(True, True, True), (True, True, True)]
        assert res["symbolic sizes"] == ([2, 3, 3 - rank], 0)  # 5 rows: torch.chunk's 3 and 2
        assert res["built inside"] == ((Shard(1),), True)
        assert res["mesh made inside"] is True  # dynamo breaks the graph at our MeshError; eager mode does it
        assert "a sharding whose Mesh was made outside the compiled function" in res["mesh made inside, fullgraph"]
        got = res["reshard"]
        assert [r is True for r in got] == [True, False, True, False, True], got
        # a sharding on another mesh is a reshard across meshes (eagerly, where dynamo hands the frame back):
        # without the destination's mesh= it is refused, naming both meshes
        assert "requires mesh=<the destination's RealizedMesh>" in got[1] and "sharding.mesh=Mesh(b=2)" in got[1]
        assert "sharding.mesh=Mesh(c=2)" in got[3] and "the source is on Mesh(c=2; devices 1..0 step -1)" in got[3]


def bench_compile_models(backend: str) -> dict:
    """The two models benchmarks/bench_compile.py times (hidden 16 here): loss and both weights' gradients,
    eager and compiled whole, fm's against DTensor TP's (whose ``nn.Linear`` weights are transposed)."""
    import importlib.util
    import pathlib
    import sys

    import torch._dynamo as dynamo

    folder = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(folder))  # the script imports its neighbours (_harness, _report) by name
    try:
        spec = importlib.util.spec_from_file_location("bench_compile", folder / "bench_compile.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(folder))
    rm = fm.realize(fm.make_mesh((2,), ("tp",)), timeout=GROUP_TIMEOUT, check=CHECK_S)
    out = {}
    for compiled in (False, True):
        got = {}
        for name, (loss_fn, weights) in bench.models(rm, 16, 4).items():
            if compiled:
                dynamo.reset()
                loss_fn = torch.compile(loss_fn, backend=backend, fullgraph=True)
            loss = loss_fn()
            loss.backward()
            grads = [w.grad.full_tensor() for w in weights]
            got[name] = (loss.detach(), grads if name == "fm" else [g.T for g in grads])
        (a, ga), (b, gb) = got["fm"], got["DTensor TP"]
        out[compiled] = bool(torch.allclose(a, b, rtol=1e-5, atol=0)) and all(
            torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(ga, gb, strict=True))
    return out


@pytest.mark.timeout(300)
def test_the_models_bench_compile_times_compute_the_same_step(w2):
    for res in w2.run(bench_compile_models, "aot_eager", timeout=300):
        assert res == {False: True, True: True}, "fm's loss and gradients equal DTensor TP's (eager, compiled)"
