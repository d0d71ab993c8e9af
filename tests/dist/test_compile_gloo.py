"""Collectives under torch.compile(fullgraph=True), on real gloo workers: no graph break, eager's values.

Every collective, over one axis and over tuples (product group and per-axis composition), with
``mesh=rm`` and under an enclosing ``with rm:``: ``torch.compile(fn, fullgraph=True)`` must trace
whole (a graph break raises under ``fullgraph=True``) and give the outputs and input gradients of
the same function run eagerly. Backends ``eager`` and ``aot_eager`` for every case (world 4);
``inductor`` for a few (world 2: its compile time on two cores counts against the test budget).
"""

from __future__ import annotations

import os

import pytest
import torch

import functional_mesh as fm
from tests._torch_features import needs_compiled_regions
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

# where this torch's dynamo cannot trace a region (2.11, 2.12: shard_map's own probe says so), none compiles
pytestmark = needs_compiled_regions()
w2 = pool_fixture(2)
w4 = pool_fixture(4)

CASES = {
    "psum": lambda x, m: fm.psum(x, "a", mesh=m),
    "psum tuple": lambda x, m: fm.psum(x, ("a", "b"), mesh=m),
    "pmean": lambda x, m: fm.pmean(x, "b", mesh=m),
    "pvary": lambda x, m: fm.pvary(x, "a", mesh=m) * 3,
    "pmax": lambda x, m: fm.pmax(x, "a", mesh=m),
    "pmin tuple with ties": lambda x, m: fm.pmin(x % 3, ("a", "b"), mesh=m),  # ranks 0 and 3 tie
    "pcast tuple": lambda x, m: fm.pcast(x, ("a", "b"), to="varying", mesh=m),
    "all_gather dim 1": lambda x, m: fm.all_gather(x, "a", dim=1, mesh=m),
    "all_gather invariant tuple": lambda x, m: fm.all_gather(x, ("a", "b"), to="invariant", mesh=m),
    "all_gather untiled": lambda x, m: fm.all_gather(x, "a", tiled=False, mesh=m),
    "psum_scatter tuple": lambda x, m: fm.psum_scatter(x, ("a", "b"), dim=0, mesh=m),
    "all_to_all": lambda x, m: fm.all_to_all(x, "a", 0, 1, mesh=m),
    "all_to_all tuple": lambda x, m: fm.all_to_all(x, ("a", "b"), 0, 1, mesh=m),
    "ppermute ring": lambda x, m: fm.ppermute(x, "b", [(0, 1), (1, 0)], mesh=m),
    "ppermute partial": lambda x, m: fm.ppermute(x, "a", [(0, 1)], mesh=m),
    "axis_index and axis_size": lambda x, m: x * fm.axis_index(("a", "b"), mesh=m) + fm.axis_size("b", mesh=m),
    "current mesh": lambda x, m: fm.psum(x, "a") + fm.axis_index("b") + fm.all_gather(x, "b", dim=1).sum(1, True),
}
INDUCTOR = ["psum", "all_gather dim 1", "ppermute partial"]
# On a (4, 1) mesh "b" has size 1: no group, one local step (a constant tuple with no group name),
# alone and inside tuples; ppermute over ("a", "b") without its product group is one hop over "a"
# (was: point to point, eager only, since "b" had a group of its own).
SIZE1_CASES = {
    "psum size-1": lambda x, m: fm.psum(x, "b", mesh=m),
    "pvary size-1": lambda x, m: fm.pvary(x, "b", mesh=m) * 3,
    "pmean size-1 tuple": lambda x, m: fm.pmean(x, ("b", "a"), mesh=m),
    "all_gather size-1 untiled": lambda x, m: fm.all_gather(x, "b", dim=1, tiled=False, mesh=m),
    "all_gather tuple with size-1": lambda x, m: fm.all_gather(x, ("a", "b"), dim=1, mesh=m),
    "psum_scatter size-1": lambda x, m: fm.psum_scatter(x, "b", dim=1, mesh=m),
    "all_to_all size-1": lambda x, m: fm.all_to_all(x, "b", 0, 1, mesh=m),
    "ppermute size-1": lambda x, m: fm.ppermute(x, "b", [(0, 0)], mesh=m) + fm.ppermute(x, "b", [], mesh=m),
    "ppermute tuple with size-1": lambda x, m: fm.ppermute(x, ("a", "b"), [(k, (k + 1) % 4) for k in range(4)],
                                                          mesh=m),
}
CASES.update(SIZE1_CASES)


def _run(fn, x0: torch.Tensor, m) -> tuple[torch.Tensor, torch.Tensor]:
    x = x0.clone().requires_grad_()
    y = fn(x, m)
    (y * (1 + torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape))).sum().backward()  # rank-varying cotangent
    return y.detach(), x.grad


def compiled_vs_eager(names: list[str], backends: list[str], sizes: tuple[int, int]) -> dict:
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    meshes = {"per axis": fm.realize(fm.make_mesh(sizes, ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S),
              "products": fm.realize(fm.make_mesh(sizes, ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S,
                                     products=[("a", "b")])}
    x0 = torch.arange(16.0, dtype=torch.float64).reshape(4, 4) + 100 * torch.distributed.get_rank()
    out = {}
    for name in names:
        fn = CASES[name]
        for label, m in meshes.items():
            with m:  # "current mesh" finds it; the others pass mesh=m
                want = _run(fn, x0, m)
                for backend in backends:
                    dynamo.reset()
                    got = _run(torch.compile(fn, fullgraph=True, backend=backend), x0, m)
                    out[(name, label, backend)] = (torch.equal(got[0], want[0]),
                                                   torch.allclose(got[1], want[1], atol=1e-12, rtol=0))
    return out


@pytest.mark.timeout(600)
def test_every_collective_compiles_whole_on_eager_and_aot_eager(w4):
    names = [n for n in CASES if n not in SIZE1_CASES]
    for rank, res in enumerate(w4.run(compiled_vs_eager, names, ["eager", "aot_eager"], (2, 2), timeout=600)):
        bad = {k: v for k, v in res.items() if v != (True, True)}
        assert bad == {}, f"rank {rank}: (output equal, gradient equal) per case: {bad}"
        assert len(res) == len(names) * 2 * 2


@pytest.mark.timeout(600)
def test_collectives_over_size1_axes_compile_whole(w4):
    for rank, res in enumerate(w4.run(compiled_vs_eager, list(SIZE1_CASES), ["aot_eager"], (4, 1), timeout=600)):
        bad = {k: v for k, v in res.items() if v != (True, True)}
        assert bad == {}, f"rank {rank}: (output equal, gradient equal) per case: {bad}"
        assert len(res) == len(SIZE1_CASES) * 2


@pytest.mark.timeout(600)
def test_inductor_on_world_2(w2):
    for rank, res in enumerate(w2.run(compiled_vs_eager, INDUCTOR, ["inductor"], (2, 1), timeout=600)):
        bad = {k: v for k, v in res.items() if v != (True, True)}
        assert bad == {}, f"rank {rank}: {bad}"


def debug_check_under_compile() -> tuple[str, str]:
    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    os.environ["FUNCTIONAL_MESH_CHECK_COLLECTIVES"] = "1"
    try:
        eager = fm.psum(torch.ones(2), "a", mesh=rm).tolist()  # the check runs (and agrees) in eager mode
        torch._dynamo.reset()
        try:
            torch.compile(lambda x: fm.psum(x, "a", mesh=rm), fullgraph=True, backend="eager")(torch.ones(2))
        except Exception as e:  # noqa: BLE001
            return str(eager), str(e)
        return str(eager), "no error"
    finally:
        del os.environ["FUNCTIONAL_MESH_CHECK_COLLECTIVES"]


@pytest.mark.timeout(300)
def test_the_debug_check_is_eager_only_and_says_so_under_compile(w4):
    for eager, message in w4.run(debug_check_under_compile):
        assert eager == "[2.0, 2.0]"
        assert "FUNCTIONAL_MESH_CHECK_COLLECTIVES off under torch.compile (the collective check runs in eager " \
               "mode only)" in message, message


# -- shard_map regions under torch.compile ---------------------------------------------------------------
#
# A mesh (a, b) = (2, 2) on world 4 (inductor: (1, 2) on world 2). Each program is a per-shard function with
# its specs; the compiled call must trace whole (0 graph breaks, fullgraph=True) and give eager's outputs
# and the gradients of every input, typed (check_vma=True) and untyped. The MLP runs on eager and aot_eager,
# with mesh=rm and under `with rm:`; the others on aot_eager with mesh=rm (compile time counts on 2 cores).

P = fm.P


def _mlp(x, w1, w2):  # the example's step: one psum is all of tensor parallelism
    return fm.psum(torch.relu(x @ w1) @ w2, "b")


def _gathers(x, w):  # all_gather both ways, psum_scatter, a tuple psum, axis_index, a ring over b
    g = fm.all_gather(x, "a", dim=0) @ w
    s = fm.psum_scatter(g, "a", dim=0) + fm.all_gather(x, "a", dim=0, to="invariant").sum()
    r = fm.ppermute(s, "b", [(0, 1), (1, 0)]) * (1 + fm.axis_index("b"))
    return fm.psum(r, ("a", "b")) + fm.axis_size("a")


def _trees(inputs, scale):  # pytrees in and out, a full (non-DTensor) argument split by the boundary
    h = inputs["x"] * scale
    return {"sum": fm.psum(h.sum(0, keepdim=True), "a"), "rows": fm.all_to_all(fm.pvary(h, "b"), "b", 1, 0)}


def _in_place(x, w):  # in-place writes the types allow
    y = (x @ w).clone()  # varies over a and b
    y.mul_(2)
    y += 1.0
    y[0] = y[0] * 3
    return fm.psum(y, "b")


def _extrema(x):  # pmax and pmin: invariant over the axes they reduce, like psum
    return fm.pmax(x, "a") + fm.pmin(x, ("a", "b")).sum()


SHARD_MAP_PROGRAMS = {  # name: (per-shard function, in_specs, out_specs, argument shapes, arguments as)
    "mlp": (_mlp, (P("a", None), P(None, "b"), P("b", None)), P("a", None), [(4, 6), (6, 8), (8, 3)], "dtensor"),
    "gathers": (_gathers, (P("a", "b"), P("b", None)), P(None, None), [(4, 4), (4, 6)], "full"),
    "trees": (_trees, ({"x": P("a", None)}, P()), {"sum": P(), "rows": P("a", "b")}, [(4, 6), ()], "full"),
    "in place": (_in_place, (P("a", None), P(None, "b")), P("a", None), [(4, 6), (6, 4)], "full"),
    "extrema": (_extrema, (P("a", "b"),), P(None, "b"), [(4, 4)], "full"),
}
SHARD_MAP_INDUCTOR = ["mlp"]


def _shard_map_inputs(rm, specs, shapes, kind, seed=0):
    """Full tensors equal on every rank (seeded), as DTensors sharded by their specs or as they are."""
    g = torch.Generator().manual_seed(seed)
    flat_specs = list(specs) if isinstance(specs, tuple) else [specs]
    out = []
    for spec, shape in zip(flat_specs, shapes, strict=True):
        if isinstance(spec, dict):  # the "trees" program: {"x": spec}
            (key, _), = spec.items()
            out.append({key: torch.randn(shape, generator=g, dtype=torch.float64)})
            continue
        full = torch.randn(shape, generator=g, dtype=torch.float64)
        out.append(fm.distribute(full, fm.NamedSharding(rm.mesh, spec), mesh=rm) if kind == "dtensor" else full)
    return out


def _leaves_of(value):
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _local(t):
    return t.to_local() if isinstance(t, torch.distributed.tensor.DTensor) else t


def _shard_map_run(fn, inputs):
    """fn's outputs (local) and every input leaf's gradient (local), for a rank-varying cotangent."""
    leaves = [leaf.detach().clone().requires_grad_() for leaf in _leaves_of(inputs)]
    it = iter(leaves)
    args = torch.utils._pytree.tree_map(lambda v: next(it) if isinstance(v, torch.Tensor) else v, inputs)
    outs = [_local(o) for o in _leaves_of(fn(*args))]
    total = sum(((1 + torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape)) * o).sum() for o in outs)
    total.backward()
    return [o.detach() for o in outs], [_local(leaf.grad) if leaf.grad is not None else None for leaf in leaves]


def _same(a, b, atol):
    return len(a) == len(b) and all((x is None and y is None) or (x is not None and y is not None and
                                    x.shape == y.shape and torch.allclose(x, y, atol=atol, rtol=0))
                                    for x, y in zip(a, b, strict=True))


def shard_map_compiled_vs_eager(names: list[str], backends: list[str], sizes: tuple[int, int]) -> dict:
    """Per (program, check_vma, mesh passing, backend): (outputs equal, gradients equal), compiled whole."""
    import torch._dynamo as dynamo

    rm = fm.realize(fm.make_mesh(sizes, ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    result = {}
    for name in names:
        fn, in_specs, out_specs, shapes, kind = SHARD_MAP_PROGRAMS[name]
        for check_vma in (True, False):
            for passing in ("mesh=rm", "with rm") if name == "mlp" else ("mesh=rm",):
                mapped = fm.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                                      mesh=rm if passing == "mesh=rm" else None)
                inputs = _shard_map_inputs(rm, in_specs, shapes, kind)
                with rm:
                    want = _shard_map_run(mapped, inputs)
                    for backend in backends if name == "mlp" else backends[-1:]:  # the others: the last only
                        dynamo.reset()
                        got = _shard_map_run(torch.compile(mapped, fullgraph=True, backend=backend), inputs)
                        result[(name, check_vma, passing, backend)] = (_same(got[0], want[0], 1e-12),
                                                                       _same(got[1], want[1], 1e-12))
    return result


@pytest.mark.timeout(900)
def test_shard_map_regions_compile_whole_on_eager_and_aot_eager(w4):
    for rank, res in enumerate(w4.run(shard_map_compiled_vs_eager, list(SHARD_MAP_PROGRAMS), ["eager", "aot_eager"],
                                      (2, 2), timeout=900)):
        bad = {k: v for k, v in res.items() if v != (True, True)}
        assert bad == {}, f"rank {rank}: (outputs equal, gradients equal) per case: {bad}"
        assert len(res) == 2 * 2 * 2 + (len(SHARD_MAP_PROGRAMS) - 1) * 2  # mlp: 2 passings x 2 backends


@pytest.mark.timeout(900)
def test_shard_map_region_on_inductor_world_2(w2):
    for rank, res in enumerate(w2.run(shard_map_compiled_vs_eager, SHARD_MAP_INDUCTOR, ["inductor"], (1, 2),
                                      timeout=900)):
        bad = {k: v for k, v in res.items() if v != (True, True)}
        assert bad == {}, f"rank {rank}: {bad}"


def _mlp_by_hand(x, w1, w2, rm):
    """_mlp with every cast and boundary step written out: what the typed region should compile to."""
    from torch.distributed.tensor import DTensor

    xl, w1l, w2l = x.to_local(), w1.to_local(), w2.to_local()
    y = fm.psum(torch.relu(fm.pvary(xl, ("b",), mesh=rm) @ fm.pvary(w1l, ("a",), mesh=rm)) @
                fm.pvary(w2l, ("a",), mesh=rm), "b", mesh=rm)
    shape = torch.Size([y.shape[0] * 2, y.shape[1]])
    return DTensor.from_local(y, rm.device_mesh, (fm.NamedSharding(rm.mesh, P("a", None)).placements), run_check=False,
                              shape=shape, stride=(shape[1], 1))


def traced_graphs() -> tuple[list[str], list[str], int]:
    """The ops dynamo records for the typed region and for the same program written by hand."""
    import torch._dynamo as dynamo

    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    fn, in_specs, out_specs, shapes, kind = SHARD_MAP_PROGRAMS["mlp"]
    inputs = _shard_map_inputs(rm, in_specs, shapes, kind)
    graphs = []
    for program in (fm.shard_map(fn, in_specs=in_specs, out_specs=out_specs, mesh=rm),
                    lambda x, w1, w2: _mlp_by_hand(x, w1, w2, rm)):
        dynamo.reset()
        ops = []

        def record(gm, example_inputs, ops=ops):
            # the op's name: ``x @ w`` is recorded as a method where the region's mode sees Tensor.matmul
            ops.extend(str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes
                       if n.op in ("call_function", "call_method"))
            return gm.forward

        torch.compile(program, fullgraph=True, backend=record)(*inputs)
        graphs.append(ops)
    with rm:
        pass
    return graphs[0], graphs[1], len(graphs[0])


@pytest.mark.timeout(300)
def test_a_typed_region_compiles_to_the_program_written_by_hand(w4):
    # The types are decided while tracing: the compiled graph holds the ops the program needs
    # (the casts the rules insert, the collectives, the boundary), nothing for the typing itself.
    for typed, by_hand, n in w4.run(traced_graphs, timeout=300):
        assert n > 5
        assert typed == by_hand


def _bad_out(x, w):
    return x @ w  # varies over b; out_specs P("a", None) does not name it


def _bad_write(x, w):
    y = x * 1  # varies over a only
    y.add_((x @ w).sum())  # writes a value that varies over b into it
    return fm.psum(y, "a")


def type_errors_at_trace_time() -> dict:
    """Per (program, fullgraph): (is a VmaError, eager's message, compiled message starts with it)."""
    rm = fm.realize(fm.make_mesh((2, 2), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    x = torch.randn(4, 6, dtype=torch.float64)
    w = torch.randn(6, 4, dtype=torch.float64)
    out = {}
    for fn in (_bad_out, _bad_write):
        mapped = fm.shard_map(fn, in_specs=(P("a", None), P(None, "b")), out_specs=P("a", None), mesh=rm)
        try:
            mapped(x, w)
            eager = "no error"
        except fm.VmaError as e:
            eager = str(e)
        for fullgraph in (True, False):
            torch._dynamo.reset()
            try:
                torch.compile(mapped, fullgraph=fullgraph, backend="eager")(x, w)
                out[(fn.__name__, fullgraph)] = (False, eager, "no error")
            except Exception as e:  # noqa: BLE001 - the type is what is checked
                out[(fn.__name__, fullgraph)] = (isinstance(e, fm.VmaError), eager, str(e).startswith(eager))
    return out


@pytest.mark.timeout(300)
def test_type_errors_are_raised_while_tracing_with_eagers_message(w4):
    for res in w4.run(type_errors_at_trace_time, timeout=300):
        assert len(res) == 4
        for case, (is_vma, eager, same) in res.items():
            assert eager.startswith("`"), (case, eager)  # eager raised a VmaError
            assert is_vma and same is True, (case, eager, same)


def example_mlp_compiled_vs_eager(backend: str, steps: int) -> dict:
    """examples/shard_map_mlp.py's model on a (dp, tp) = (2, 2) mesh: per step, the loss and both weight
    gradients of the compiled mapped step against eager (SGD between steps, as the example trains)."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "shard_map_mlp.py"
    spec = importlib.util.spec_from_file_location("shard_map_mlp_example", path)
    ex = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ex  # torch.compile looks the example's globals up by module name
    spec.loader.exec_module(ex)
    rm = fm.realize(fm.make_mesh((2, 2), ("dp", "tp")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    w1_full, w2_full, x, target = ex.full_problem()
    runs = {}
    for compiled in (False, True):
        w1 = fm.distribute(w1_full, fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm).requires_grad_()
        w2 = fm.distribute(w2_full, fm.NamedSharding(rm.mesh, P("tp", None)), mesh=rm).requires_grad_()
        step = fm.shard_map(ex.mlp, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None),
                            mesh=rm)
        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True, backend=backend)
        trace = []
        for _ in range(steps):
            loss = ((step(x, w1, w2).full_tensor() - target) ** 2).mean()
            loss.backward()
            trace.append((loss.detach(), w1.grad.to_local().clone(), w2.grad.to_local().clone()))
            with torch.no_grad():
                w1 -= ex.LR * w1.grad
                w2 -= ex.LR * w2.grad
            w1.grad = w2.grad = None
        runs[compiled] = trace
    worst = max((a - b).abs().max().item() for e, c in zip(runs[False], runs[True], strict=True)
                for a, b in zip(e, c, strict=True))
    return {"steps": len(runs[True]), "worst": worst, "loss moved": (runs[False][0][0] - runs[False][-1][0]).item()}


@pytest.mark.timeout(300)
def test_the_shard_map_mlp_example_compiled_matches_eager(w4):
    for res in w4.run(example_mlp_compiled_vs_eager, "aot_eager", 3, timeout=300):
        assert res["steps"] == 3
        assert res["loss moved"] > 0  # it trains
        assert res["worst"] <= 1e-6, res  # every loss and every gradient, every step


def shard_map_made_inside_compiled() -> tuple[int, bool]:
    """A shard_map built inside the compiled function (its specs exist only while dynamo traces)."""
    rm = fm.realize(fm.make_mesh((2,), ("tp",)), timeout=GROUP_TIMEOUT, check=CHECK_S)

    def outer(x, w):
        f = fm.shard_map(lambda a, b: fm.psum(a @ b, "tp"), mesh=rm, in_specs=(P(), P(None, "tp")), out_specs=P())
        return f(x, w).to_local()

    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(outer)(x, w).graph_break_count
    torch._dynamo.reset()
    return breaks, torch.equal(torch.compile(outer, fullgraph=True, backend="eager")(x, w), outer(x, w))


@pytest.mark.timeout(300)
def test_a_shard_map_made_inside_the_compiled_function(w2):
    assert w2.run(shard_map_made_inside_compiled, timeout=300) == [(0, True), (0, True)]



# -- a compiled pipeline with gradients on inductor (issue 28) ----------------------------------------------
#
# Two partial ppermutes in a row: a member that receives nothing gets zeros, and the backward of
# the second sends nothing back to rank 1. Each rank traces its own graph; where a backward
# collective's input did not depend on the incoming gradient (zeros made from nothing), inductor's
# partitioner placed it in rank 1's compiled forward and not in rank 0's, and the ranks met
# different collectives until the group's timeout. Every step's result is now made from what it
# communicated. The program (its values are all zero) and one with a value that flows.


def _pipeline(w):  # the program
    a = fm.ppermute(torch.tanh(w), "pp", [(0, 1)])
    b = fm.ppermute(torch.tanh(a * w), "pp", [(0, 1)])
    return fm.psum(b.sum(), "pp")


def _pipeline_flowing(w):  # rank 0 sends w itself on: y = w[0], dy/dw = (1, 0)
    a = fm.ppermute(torch.tanh(w), "pp", [(0, 1)])
    b = fm.ppermute(torch.tanh(a * w) + w, "pp", [(0, 1)])
    return fm.psum(b.sum(), "pp")


PIPELINES = {"issue": (_pipeline, 0.0, [0.0, 0.0]), "flowing": (_pipeline_flowing, 0.5, [1.0, 0.0])}


def pipeline_compiled_vs_eager(name: str) -> dict:
    """A pipeline program on inductor with .backward(): output and gradient, eager and compiled."""
    rm = fm.realize(fm.make_mesh((2,), ("pp",)), timeout=GROUP_TIMEOUT, check=CHECK_S)
    f = fm.shard_map(PIPELINES[name][0], mesh=rm, in_specs=P("pp"), out_specs=P())
    runs = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        w = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
        y = (torch.compile(f, fullgraph=True) if compiled else f)(w).full_tensor()
        y.backward()
        runs[compiled] = (y.item(), w.grad.tolist())
    return runs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(PIPELINES))
def test_a_compiled_pipeline_backward_finishes_on_inductor_with_eagers_values(w2, name):
    _, y, grad = PIPELINES[name]  # one process: w = (0.5, 1.0) split over pp
    for rank, runs in enumerate(w2.run(pipeline_compiled_vs_eager, name, timeout=500)):
        assert runs[False] == (y, grad), (rank, runs)
        assert runs[True] == runs[False], (rank, runs)
