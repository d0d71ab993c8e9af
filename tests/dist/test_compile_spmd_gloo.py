"""Compiled programs are one program on every rank: every rank's graphs issue the same collectives in order.

A compiled function is traced on each rank by itself, with that rank's coordinate and split sizes
as constants of its graph, so the graphs may differ from rank to rank. What must not differ is the
communication: if one rank's compiled forward issues a collective that another rank issues only in
its backward (a partitioner may move a backward collective that does not depend on the incoming
gradient into the forward), the ranks pair the wrong calls and hang until the group's timeout
(issue 28: a two-stage pipeline of partial ``ppermute``\\ s on inductor).

The check, per program and backend (``aot_eager``, ``inductor``), on real gloo workers:

1. **The graphs.** Each rank compiles the program with a recording backend and runs nothing: the
   ``aot_eager`` backend with forward and backward compilers that record their graphs (the backward
   compiled at once, ``force_non_lazy_backward_lowering``); ``inductor`` with a partitioner that
   records the forward and backward graphs its own partitioner makes (``custom_partitioner_fn``,
   after inductor's joint-graph passes), and an inner compiler that records inference graphs.
   The record is the sequence of torch's functional collectives (``torch.ops._c10d_functional``)
   in each graph, in graph order: the op, the mesh axis its group serves (a group's name differs
   from one group of an axis to the next, so each rank names its groups by the axes they serve),
   reduction and group size. The parent asserts that every rank's sequence of graphs and
   collectives is the same, and that the calls pair: an ``all_to_all_single``'s split sizes
   agree between sender and receiver, an ``all_reduce``'s or gather's shapes agree across the
   group. Nothing communicates while this is checked, so a mismatch is a failure, never a hang.
2. **The run** (a few programs, on ``inductor``): compiled for real, forward and backward, with
   the collectives of each compiled graph's output code recorded, bounded by the groups' timeout;
   outputs and gradients equal eager mode's and the output code's sequences equal on every rank.

Programs: issue 28's reproduction (typed and untyped, with gradients and under ``no_grad``),
GPipe pipelines of 2 and 4 stages (partial shifts: the first stage receives nothing, the last
sends nothing, and the first drops what it receives), a per-coordinate program (``axis_index``
with a partial ``ppermute``), ragged exchanges with zero sizes that differ by rank, the MoE layer
of examples/moe_ep.py compiled with its per-rank plan, every collective of
tests/dist/test_compile_gloo.py (one axis, tuples, product groups, size-1 axes) and its shard_map programs, and
the DTensor boundaries of tests/dist/test_compile_dtensor_gloo.py. And torch's FSDP2 with tensor
parallel on the meshes of one realized family, compiled with FSDP2's graph breaks: trained two
steps against one process, its graphs recorded as they compile and compared across ranks.

Under torch's ``compile_on_one_rank`` (the ``one graph:`` programs: GPipe, a ring with coordinates
over a (2, 2) mesh, the DTensor MLP region) every rank's graph is the same, its coordinates computed
when it runs: the split sizes recorded are evaluated at each rank's coordinate (from the graph's
table of groups) before they are paired, and the groups are named by the axes the shared name
carries. Two of them also run under the flag against eager mode and one process.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import functional_mesh as fm
from functional_mesh import P, _torch
from tests._torch_features import needs_compiled_regions
from tests.dist._pool import WorkerFailed, pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

# where this torch's dynamo cannot trace a region (2.11, 2.12: shard_map's own probe says so), none compiles
pytestmark = needs_compiled_regions()
w2 = pool_fixture(2)
w4 = pool_fixture(4)

NAMESPACE = "_c10d_functional"
NOT_A_CALL = {"wait_tensor"}  # waits are not calls another rank must pair


# -- the recorder (on every rank) ------------------------------------------------------------------


class Stopped(Exception):  # noqa: N818 - not an error: the recorder's way out of a compile it does not run
    """Raised by the recording backend once the graphs are recorded: nothing is run."""


def groups_of(*meshes: Any) -> dict[str, tuple[str, Any]]:
    """This rank's groups by name, each with the axes it serves (``"a"``, ``"a+b"``, ``"size-1"``).

    A group's name differs from one group of an axis to the next (ranks 0, 2 and ranks 1, 3 of a
    (2, 2) mesh's first axis), so ranks compare the axes, not the names.
    """
    out: dict[str, tuple[str, Any]] = {}
    for rm in meshes:
        names = rm.axis_names
        keys = list(names) + [t for k in range(2, len(names) + 1) for t in itertools.permutations(names, k)
                              if rm.has_group(t)]
        for key in keys:
            pg = rm.group(key)
            if pg is None:
                continue
            if isinstance(key, str):
                label = "size-1" if rm.axis_size(key) == 1 else key
            else:
                label = "+".join(key)
            out.setdefault(pg.group_name, (label, pg))  # a group serving several: its first axis
    return out


def group_labels(*meshes: Any) -> dict[str, str]:
    return {name: label for name, (label, _) in groups_of(*meshes).items()}


def _label(group: object, labels: dict[str, str]) -> str:
    """The axes a group serves: from this rank's names, or from the name every group of the axes shares
    under ``compile_on_one_rank`` (``fm:<axes>:<key>``)."""
    if isinstance(group, str) and group.startswith("fm:") and group not in labels:
        return group.split(":")[1].replace(",", "+")
    return labels.get(group, f"group {group}")  # type: ignore[call-overload]


def _at_this_rank(gm: torch.fx.GraphModule) -> dict:
    """Each run-time coordinate of ``gm`` (``compile_on_one_rank``), by its symbol: its value on this rank."""
    import torch.distributed as dist

    values, rank = {}, dist.get_rank()
    for node in gm.graph.nodes:
        if str(node.target) == "device_mesh._runtime_compute_coordinate_on_dim.default":
            table = node.args[0]
            while isinstance(table, torch.fx.Node) and table.op != "get_attr":  # a copy of the constant
                table = table.args[0]
            table = getattr(gm, table.target) if isinstance(table, torch.fx.Node) else table
            with torch._subclasses.fake_tensor.unset_fake_temporarily():  # the recorder runs inside the tracer
                rows = [torch.as_tensor(row).reshape(-1).tolist() for row in table.tolist()]  # every group
            (index,) = [row.index(rank) for row in rows if rank in row]
            values[node.meta["val"].node.expr] = index
    return values


def _size(s: Any, coordinates: dict) -> Any:
    """A split size as this rank sends it: an int, or a graph value (an expression of the coordinates) evaluated."""
    if isinstance(s, int):
        return s
    value = s.meta.get("val") if isinstance(s, torch.fx.Node) else s
    if isinstance(value, torch.SymInt):
        return int(value.node.expr.xreplace(coordinates))
    return str(s)


def collectives_in(gm: torch.fx.GraphModule, labels: dict[str, str], coordinates: dict | None = None) -> list[dict]:
    """The functional collectives of ``gm`` in graph order, with what pairs them across ranks (``coordinates``:
    the run-time coordinates of the graphs of this compile so far, by symbol; this graph's are added)."""
    out = []
    coordinates = {} if coordinates is None else coordinates
    coordinates.update(_at_this_rank(gm))
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace != NAMESPACE or target._schema.name.split("::")[1] in NOT_A_CALL:
            continue
        names = [a.name for a in target._schema.arguments]
        args = dict(zip(names, node.args, strict=False)) | dict(node.kwargs)
        first = args.pop(names[0])
        value = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
        group = args.pop("group_name")
        call = {"op": target._schema.name.split("::")[1].rstrip("_"), "axis": _label(group, labels),
                "shape": [str(s) for s in value.shape] if value is not None else None,
                "dtype": str(value.dtype) if value is not None else None}
        for key, v in args.items():
            call[key] = [_size(s, coordinates) for s in v] if isinstance(v, list | tuple) else v
        out.append(call)
    return out


def call_codes(source: str) -> list[str]:
    """The functional collectives an inductor output code calls, in the order it calls them."""
    calls = re.findall(r"torch\.ops\.%s\.(\w+)\.default\(" % NAMESPACE, source)  # noqa: UP031
    return [c.rstrip("_") for c in calls if c not in NOT_A_CALL]


class Recorder:
    """A torch.compile backend: ``aot_eager`` or ``inductor``, recording each graph's collectives.

    ``run=False``: every graph is recorded (the backward compiled at once) and nothing runs; the
    compiled call raises :class:`Stopped`. ``run=True``: the backend compiles and runs as usual,
    and (inductor) the output code of each graph is recorded too.
    """

    def __init__(self, backend: str, labels: dict[str, str], run: bool) -> None:
        self.backend, self.labels, self.run = backend, labels, run
        self.graphs: list[dict] = []
        self.coordinates: dict = {}  # the run-time coordinates (compile_on_one_rank) of the forward, for the backward

    def _add(self, kind: str, gm: torch.fx.GraphModule, code: list[str] | None = None) -> None:
        self.graphs.append({"kind": kind, "calls": collectives_in(gm, self.labels, self.coordinates), "code": code})

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        if self.backend == "aot_eager":
            from torch._dynamo.backends.debugging import aot_eager, boxed_nop

            def compiler(kind: str) -> Callable[..., Any]:
                def compile_graph(g: torch.fx.GraphModule, inputs: list) -> Callable[..., Any]:
                    self._add(kind, g)
                    return boxed_nop(g, inputs)
                return compile_graph

            compiled = aot_eager(gm, example_inputs, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))
        else:
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner(g: torch.fx.GraphModule, inputs: list, **kwargs: Any) -> Any:
                kind = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") \
                    else "forward"
                if not self.run:
                    if kind == "inference":  # no partition for these: this is their only record
                        self._add(kind, g)
                        raise Stopped
                    raise AssertionError("the recording partitioner stops before inductor compiles")
                compiled = compile_fx_inner(g, inputs, **kwargs)
                self._add(kind, g, call_codes(getattr(compiled, "source_code", "") or ""))
                return compiled

            compiled = compile_fx(gm, example_inputs, inner_compile=inner)
        if self.run:
            return compiled

        def stop(*args: Any) -> Any:
            raise Stopped
        return stop


def _partitioner(recorder: Recorder) -> Any:
    """inductor's own partition (after its joint-graph passes), recorded, then :class:`Stopped`."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    class Recording(CustomPartitionerFn):
        def __call__(self, gm: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
            forward, backward = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
            recorder._add("forward", forward)
            recorder._add("backward", backward)
            raise Stopped

        def uuid(self) -> None:  # no caching of what this partitioner made
            return None

    return Recording()


def _stopped(e: BaseException | None) -> bool:
    while e is not None:
        if isinstance(e, Stopped):
            return True
        e = e.__cause__ or getattr(e, "inner_exception", None) or e.__context__
    return False


def one_graph(on: bool = True) -> Any:
    """torch's ``compile_on_one_rank`` set to ``on`` for the block (``torch.compiler.config`` where it has it)."""
    import torch.distributed.config

    config = torch.compiler.config if hasattr(torch.compiler.config, "compile_on_one_rank") else torch.distributed.config
    return config.patch(compile_on_one_rank=on)


ONE_GRAPH = "one graph: "  # a program compiled under compile_on_one_rank: the same graph on every rank


def record_graphs(fn: Callable[..., Any], args: tuple, backend: str, labels: dict[str, str], mesh: Any,
                  grad: bool = True, shared: bool = False) -> list[dict]:
    """Compile ``fn(*args)`` under ``with mesh:`` on ``backend`` with the recorder; its graphs. Nothing runs.
    ``shared``: under ``compile_on_one_rank``."""
    import torch._dynamo as dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    recorder = Recorder(backend, labels, run=False)
    dynamo.reset()
    patches = [functorch_config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False),
               one_graph(shared)]
    if backend == "inductor":
        patches.append(inductor_config.patch(custom_partitioner_fn=_partitioner(recorder), fx_graph_cache=False))
    with contextlib.ExitStack() as stack:
        stack.enter_context(mesh)  # for programs that use the current mesh (mesh=None)
        for p in patches:
            stack.enter_context(p)
        if not grad:
            stack.enter_context(torch.no_grad())
        try:
            torch.compile(fn, fullgraph=True, backend=recorder)(*args)
        except Exception as e:
            if not _stopped(e):
                raise
    dynamo.reset()
    return recorder.graphs


# -- the programs ---------------------------------------------------------------------------------
#
# Each builder runs on every rank and returns (fn, args, meshes): a function to compile, its
# arguments (leaves that need gradients where the program trains) and the realized meshes whose
# groups it uses.


def _realize(sizes: tuple[int, ...], names: tuple[str, ...], **kwargs: Any) -> Any:
    return fm.realize(fm.make_mesh(sizes, names), timeout=GROUP_TIMEOUT, check=CHECK_S, **kwargs)


def _issue_28_body(w: torch.Tensor) -> torch.Tensor:
    a = fm.ppermute(torch.tanh(w), "pp", [(0, 1)])
    b = fm.ppermute(torch.tanh(a * w), "pp", [(0, 1)])
    return fm.psum(b.sum(), "pp")


def issue_28(check_vma: bool = True) -> tuple:
    """Issue 28's reproduction, as written there: a typed region of two partial ppermutes."""
    rm = _realize((2,), ("pp",))
    f = fm.shard_map(_issue_28_body, mesh=rm, in_specs=P("pp"), out_specs=P(), check_vma=check_vma)
    return f, (torch.tensor([0.5, 1.0], requires_grad=True),), [rm]


STAGES_M, WIDTH, ROWS = 3, 4, 2  # microbatches, layer width, rows per microbatch


def gpipe_problem(stages: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every stage's weight (stages, W, W), the microbatches (M, R, W) and targets, the same on every rank."""
    g = torch.Generator().manual_seed(stages)
    ws = torch.randn(stages, WIDTH, WIDTH, generator=g, dtype=torch.float64) / WIDTH ** 0.5
    xs = torch.randn(STAGES_M, ROWS, WIDTH, generator=g, dtype=torch.float64)
    return ws, xs, torch.randn(STAGES_M, ROWS, WIDTH, generator=g, dtype=torch.float64)


def gpipe_body(ws: torch.Tensor, xs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One stage of a GPipe schedule over "pp": microbatch m is at stage s on tick m + s.

    Activations move one stage down each tick by a partial shift (stage s sends to s + 1): the
    first stage receives nothing and drops what arrives (it takes the next microbatch instead),
    the last stage sends nothing. The loss is the last stage's, summed over pp.
    """
    n = fm.axis_size("pp")
    stage = fm.axis_index("pp")
    shift = [(s, s + 1) for s in range(n - 1)]
    h = torch.zeros_like(xs[0])
    outs = []
    for tick in range(STAGES_M + n - 1):
        inject = xs[tick] if tick < STAGES_M else torch.zeros_like(xs[0])
        h = torch.tanh(torch.where(stage == 0, inject, h) @ ws[0])
        if tick >= n - 1:
            outs.append(h)  # on the last stage: microbatch tick - n + 1, done
        if tick < STAGES_M + n - 2:
            h = fm.ppermute(h, "pp", shift)
    loss = ((torch.stack(outs) - targets) ** 2).sum() * (stage == n - 1)
    return fm.psum(loss, "pp")


def gpipe(stages: int, dp: int = 1, check_vma: bool = True) -> tuple:
    """GPipe over "pp" (and "dp" replicas running the same schedule on the same data)."""
    rm = _realize((stages, dp), ("pp", "dp"))
    f = fm.shard_map(gpipe_body, mesh=rm, in_specs=(P("pp"), P(), P()), out_specs=P(), check_vma=check_vma)
    ws, xs, targets = gpipe_problem(stages)
    return f, (ws.requires_grad_(), xs.requires_grad_(), targets), [rm]


def gpipe_reference(stages: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One process: each microbatch through every stage in order; the loss and both gradients."""
    ws, xs, targets = (t.requires_grad_() for t in gpipe_problem(stages))
    loss = 0
    for m in range(STAGES_M):
        h = xs[m]
        for s in range(stages):
            h = torch.tanh(h @ ws[s])
        loss = loss + ((h - targets[m]) ** 2).sum()
    loss.backward()
    return loss.item(), ws.grad, xs.grad


def by_coordinate() -> tuple:
    """Values that depend on the coordinate: axis_index scales, a partial ppermute, plain collectives."""
    rm = _realize((2,), ("a",))

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * (1 + fm.axis_index("a", mesh=rm))
        z = fm.ppermute(y, "a", [(1, 0)], mesh=rm)  # rank 1 sends, rank 0 receives
        return fm.psum(z * x, "a", mesh=rm)

    return fn, (torch.arange(4.0, dtype=torch.float64).requires_grad_(),), [rm]


def ring_and_coordinates() -> tuple:
    """On (a, b) = (2, 2): a ring and a partial shift over b, all_gather(to="invariant") over a, axis_index,
    a psum over both: coordinates, split sizes and groups that differ between the groups of an axis."""
    rm = _realize((2, 2), ("a", "b"))

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = fm.ppermute(x * (1 + fm.axis_index("b", mesh=rm)), "b", [(0, 1), (1, 0)], mesh=rm)
        z = fm.ppermute(torch.tanh(y), "b", [(0, 1)], mesh=rm)
        g = fm.all_gather(z * (2 + fm.axis_index(("a", "b"), mesh=rm)), "a", to="invariant", mesh=rm)
        return fm.psum((g * g).sum(), ("a", "b"), mesh=rm)

    return fn, (torch.arange(4.0, dtype=torch.float64).requires_grad_(),), [rm]


def ragged_sizes(rank: int, n: int) -> list[int]:
    """Rows rank ``rank`` sends to each member: uneven, some zero, differ by rank."""
    return [(rank * 3 + j * 2) % 3 for j in range(n)]


def ragged(world: int) -> tuple:
    """Two ragged exchanges (dispatch, combine) with per-rank sizes, some zero, as Python ints."""
    import torch.distributed as dist

    rm = _realize((world,), ("ep",))
    rank = dist.get_rank()
    sent = ragged_sizes(rank, world)
    got = [ragged_sizes(src, world)[rank] for src in range(world)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        rows = fm.ragged_all_to_all(x * 2, "ep", sent, got, mesh=rm)
        return fm.ragged_all_to_all(torch.tanh(rows), "ep", got, sent, mesh=rm)

    x = torch.arange(sum(sent) * 3, dtype=torch.float64).reshape(sum(sent), 3) / 10
    return fn, (x.requires_grad_(),), [rm]


def moe_layer() -> tuple:
    """examples/moe_ep.py's layer, compiled with this step's per-rank plan as Python ints ((dp, ep) = (1, 4))."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe_ep.py"
    spec = importlib.util.spec_from_file_location("moe_ep_example", path)
    ex = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ex  # torch.compile looks the example's globals up by module name
    spec.loader.exec_module(ex)
    rm = _realize((1, ex.EP), ("dp", "ep"), products=[("dp", "ep")])
    tokens, experts_spec = P(("dp", "ep"), None), P("ep", None, None)
    x, r, w1, w2, _ = ex.full_problem()
    planner = fm.shard_map(ex.plan_of, in_specs=(tokens, P()), out_specs=P(("dp", "ep")), mesh=rm)
    block = planner(x, r).to_local()[0].tolist()
    plan = ([row[0] for row in block], [row[1:] for row in block])
    f = fm.shard_map(lambda *a: ex.moe(*a, plan=plan), in_specs=(tokens, P(), experts_spec, experts_spec),
                     out_specs=tokens, mesh=rm)
    return f, tuple(t.requires_grad_() for t in (x, r, w1, w2)), [rm]


def collective_case(name: str, products: bool, sizes: tuple[int, int] = (2, 2)) -> tuple:
    """One collective of tests/dist/test_compile_gloo.py on a (2, 2) mesh (or ``sizes``), per axis or with
    its product."""
    from tests.dist.test_compile_gloo import CASES

    rm = _realize(sizes, ("a", "b"), **({"products": [("a", "b")]} if products else {}))
    x = torch.arange(16.0, dtype=torch.float64).reshape(4, 4).requires_grad_()
    fn = CASES[name]
    return (lambda t: _under(rm, fn, t)), (x,), [rm]


def _under(rm: Any, fn: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    return fn(x, rm)


def shard_map_program(name: str, check_vma: bool) -> tuple:
    """One shard_map program of tests/dist/test_compile_gloo.py on a (2, 2) mesh."""
    from tests.dist.test_compile_gloo import SHARD_MAP_PROGRAMS, _shard_map_inputs

    rm = _realize((2, 2), ("a", "b"))
    fn, in_specs, out_specs, shapes, kind = SHARD_MAP_PROGRAMS[name]
    inputs = _shard_map_inputs(rm, in_specs, shapes, kind)
    leaves = torch.utils._pytree.tree_map(lambda v: v.detach().clone().requires_grad_()
                                          if isinstance(v, torch.Tensor) and v.is_floating_point() else v, inputs)
    return fm.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, mesh=rm), tuple(leaves), [rm]


def dtensor_boundary(kind: str, name: str) -> tuple:
    """fm.distribute and fm.reshard of tests/dist/test_compile_dtensor_gloo.py (world 2)."""
    from tests.dist.test_compile_dtensor_gloo import _sides

    rm = _realize((2,), ("a",))
    sides, make = _sides(rm, kind, name)
    return sides["ours"], (make(),), [rm]


PROGRAMS_2: dict[str, Callable[[], tuple]] = {
    "issue 28": issue_28,
    "issue 28 untyped": lambda: issue_28(check_vma=False),
    "gpipe 2 stages": lambda: gpipe(2),
    "gpipe 2 stages untyped": lambda: gpipe(2, check_vma=False),
    "by coordinate": by_coordinate,
    "ragged zero sizes": lambda: ragged(2),
    **{f"distribute {n}": (lambda n=n: dtensor_boundary("distribute", n)) for n in ("Shard(0)", "Shard(1)")},
    **{f"reshard {n}": (lambda n=n: dtensor_boundary("reshard", n))
       for n in ("Shard(0)->Replicate", "Replicate->Shard(0)", "Shard(0)->Shard(1)")},
}
NO_GRAD_2 = {"issue 28 under no_grad": issue_28}  # inference graphs: no partition


def _programs_4() -> dict[str, Callable[[], tuple]]:
    from tests.dist.test_compile_gloo import CASES, SHARD_MAP_PROGRAMS, SIZE1_CASES

    programs: dict[str, Callable[[], tuple]] = {
        "gpipe 4 stages": lambda: gpipe(4),
        "gpipe 2 stages x dp 2": lambda: gpipe(2, dp=2),
        "ragged zero sizes": lambda: ragged(4),
        "moe_ep layer": moe_layer,
        f"{ONE_GRAPH}gpipe 4 stages": lambda: gpipe(4),
        f"{ONE_GRAPH}ring and coordinates": ring_and_coordinates,
        f"{ONE_GRAPH}shard_map mlp, DTensor weights": lambda: shard_map_program("mlp", True),
    }
    for name in CASES:  # with its product group where it has a tuple of axes
        if name in SIZE1_CASES:  # on the (4, 1) mesh those cases are written for
            programs[f"collective {name}"] = lambda n=name: collective_case(n, False, (4, 1))
            continue
        programs[f"collective {name}"] = lambda n=name: collective_case(n, False)
        if "tuple" in name or name == "axis_index and axis_size":
            programs[f"collective {name}, products"] = lambda n=name: collective_case(n, True)
    for name in SHARD_MAP_PROGRAMS:
        for check_vma in (True, False):
            programs[f"shard_map {name}{'' if check_vma else ' untyped'}"] = \
                lambda n=name, c=check_vma: shard_map_program(n, c)
    return programs


def graphs_of(world: int, names: list[str], backends: list[str]) -> dict:
    """This rank's record per (program, backend): ``{"graphs": ..., "members": ...}`` or the error."""
    import torch.distributed as dist

    programs = {**PROGRAMS_2, **NO_GRAD_2} if world == 2 else _programs_4()
    # Every program is built (meshes realized, plans exchanged) before any is compiled: building
    # communicates, compiling does not, and ranks drift apart while they compile.
    built = {name: programs[name]() for name in names}
    out = {}
    for name in names:
        fn, args, meshes = built[name]
        groups = groups_of(*meshes)
        labels = {name: label for name, (label, _) in groups.items()}
        members = {label: dist.get_process_group_ranks(pg) for label, pg in groups.values() if label != "size-1"}
        for backend in backends:
            try:
                graphs = record_graphs(fn, args, backend, labels, meshes[0], grad=name not in NO_GRAD_2,
                                       shared=name.startswith(ONE_GRAPH))
                out[(name, backend)] = {"graphs": graphs, "members": members}
            except Exception as e:  # noqa: BLE001 - reported per program
                out[(name, backend)] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
    return out


# -- the comparison (in the parent) ---------------------------------------------------------------


def _key(call: dict) -> tuple:
    """What every rank's call must share: the op, its axis, its reduction and group size."""
    return tuple((k, str(v)) for k, v in sorted(call.items()) if k in ("op", "axis", "reduce_op", "group_size"))


def _sequence(graphs: list[dict]) -> list[tuple]:
    return [(g["kind"], [_key(c) for c in g["calls"]]) for g in graphs]


def _describe(graphs: list[dict]) -> str:
    return "; ".join(f"{g['kind']}: " + ", ".join(f"{c['op']}({c['axis']})" for c in g["calls"]) for g in graphs)


def mismatches(per_rank: list[dict]) -> list[str]:
    """What breaks the one-program invariant across ranks, for one (program, backend); [] if nothing."""
    errors = [f"rank {r}: {rec['error']}" for r, rec in enumerate(per_rank) if "error" in rec]
    if errors:
        return errors
    sequences = [_sequence(rec["graphs"]) for rec in per_rank]
    if any(s != sequences[0] for s in sequences[1:]):
        return ["the ranks' compiled graphs issue different collectives:"] + [
            f"  rank {r}: {_describe(rec['graphs'])}" for r, rec in enumerate(per_rank)]
    if not per_rank[0]["graphs"]:
        return ["no graph was recorded"]
    problems = []
    for g, graph in enumerate(per_rank[0]["graphs"]):
        for i, call in enumerate(graph["calls"]):
            calls = [rec["graphs"][g]["calls"][i] for rec in per_rank]
            problems += _pairing(calls, [rec["members"] for rec in per_rank], f"{graph['kind']} graph {g}, call {i}")
    return problems


def _pairing(calls: list[dict], members: list[dict], where: str) -> list[str]:
    """Across each group's members: all_to_all split sizes match sender to receiver, other shapes agree."""
    problems = []
    for rank, call in enumerate(calls):
        group = members[rank].get(call["axis"])
        if group is None:
            continue
        me = group.index(rank)
        for j, other in enumerate(group):
            peer = calls[other]
            if call["op"] == "all_to_all_single":
                if call["output_split_sizes"][j] != peer["input_split_sizes"][me]:
                    problems.append(f"{where}: rank {rank} expects {call['output_split_sizes'][j]} rows from rank "
                                    f"{other}, which sends it {peer['input_split_sizes'][me]}")
                if call["shape"][1:] != peer["shape"][1:]:
                    problems.append(f"{where}: rows of shape {call['shape'][1:]} on rank {rank}, "
                                    f"{peer['shape'][1:]} on rank {other}")
            elif call["shape"] != peer["shape"] or call["dtype"] != peer["dtype"]:
                problems.append(f"{where}: {call['op']} of {call['dtype']}{call['shape']} on rank {rank}, "
                                f"{peer['dtype']}{peer['shape']} on rank {other}")
    return problems


def _check_all(results: list[dict], names: list[str], backends: list[str]) -> None:
    report = []
    for name in names:
        for backend in backends:
            bad = mismatches([res[(name, backend)] for res in results])
            if bad:
                report.append(f"{name} on {backend}:\n" + "\n".join(bad))
    assert not report, "\n\n".join(report)


BACKENDS = ["aot_eager", "inductor"]


# -- the tests ---------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_issue_28_every_rank_compiles_the_same_collectives(w2):
    # Before the fix, inductor moved rank 1's backward ppermute (it sends rank 1's gradient, which
    # does not depend on the incoming one there: zeros) and the gather of w's gradient into rank 1's
    # compiled forward, where rank 0 has neither: the ranks paired the wrong calls and hung.
    names = ["issue 28", "issue 28 untyped", "issue 28 under no_grad"]
    _check_all(w2.run(graphs_of, 2, names, BACKENDS, timeout=300), names, BACKENDS)


@pytest.mark.timeout(600)
def test_programs_on_world_2_compile_the_same_collectives_on_every_rank(w2):
    names = [n for n in PROGRAMS_2 if not n.startswith("issue 28")]
    _check_all(w2.run(graphs_of, 2, names, BACKENDS, timeout=600), names, BACKENDS)


@pytest.mark.timeout(900)
def test_pipelines_moe_and_ragged_on_world_4(w4):
    names = ["gpipe 4 stages", "gpipe 2 stages x dp 2", "ragged zero sizes", "moe_ep layer",
             *(n for n in _programs_4() if n.startswith(ONE_GRAPH))]
    _check_all(w4.run(graphs_of, 4, names, BACKENDS, timeout=900), names, BACKENDS)


@pytest.mark.timeout(900)
def test_every_collective_of_the_compile_tests(w4):
    names = [n for n in _programs_4() if n.startswith("collective ")]
    _check_all(w4.run(graphs_of, 4, names, BACKENDS, timeout=900), names, BACKENDS)


@pytest.mark.timeout(900)
def test_every_shard_map_program_of_the_compile_tests(w4):
    names = [n for n in _programs_4() if n.startswith("shard_map ")]
    _check_all(w4.run(graphs_of, 4, names, BACKENDS, timeout=900), names, BACKENDS)


# -- run for real on inductor -------------------------------------------------------------------------


def _leaves_grads(fn: Callable[..., Any], args: tuple) -> tuple[list[torch.Tensor], list]:
    """``fn``'s output (full) and the gradients of the arguments that need them, on fresh copies."""
    from torch.distributed.tensor import DTensor

    fresh = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                  for a in args)
    out = fn(*fresh)
    full = out.full_tensor() if isinstance(out, DTensor) else out
    full.sum().backward()
    return [full.detach()], [a.grad for a in fresh if isinstance(a, torch.Tensor) and a.requires_grad]


def run_compiled(name: str, backend: str) -> dict:
    """Compile and run ``name`` (world 2) forward and backward: equal to eager? and each graph's collectives."""
    import torch._dynamo as dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    fn, args, meshes = PROGRAMS_2[name]()
    want = _leaves_grads(fn, args)
    recorder = Recorder(backend, group_labels(*meshes), run=True)
    dynamo.reset()
    with functorch_config.patch(enable_autograd_cache=False), inductor_config.patch(fx_graph_cache=False):
        got = _leaves_grads(torch.compile(fn, fullgraph=True, backend=recorder), args)
    dynamo.reset()
    same = all(torch.allclose(a, b, atol=1e-12, rtol=1e-12) for a, b in zip(got[0] + got[1], want[0] + want[1],
                                                                            strict=True))
    return {"same": same, "code": [(g["kind"], g["code"]) for g in recorder.graphs],
            "graphs": recorder.graphs, "n": len(got[1])}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["issue 28", "gpipe 2 stages"])
def test_compiled_on_inductor_runs_and_equals_eager(w2, name):
    # Bounded by the groups' timeout (20 s): a rank that waits for a call its peer never makes
    # raises there, and the pool's bound below catches anything longer.
    try:
        results = w2.run(run_compiled, name, "inductor", timeout=400)
    except WorkerFailed:
        w2.kill()  # its groups timed out: the next check gets a fresh world
        raise
    for rank, res in enumerate(results):
        assert res["same"], f"rank {rank}: compiled outputs or gradients differ from eager"
        assert res["n"] >= 1
    codes = [res["code"] for res in results]
    assert all(c == codes[0] for c in codes), f"the output code calls different collectives: {codes}"
    assert any(calls for _, calls in codes[0]), codes[0]


def gpipe_vs_one_process(stages: int, dp: int, backend: str | None, shared: bool = False) -> dict:
    """The GPipe region's loss and gradients (eager or compiled; ``shared``: under ``compile_on_one_rank``)
    against one process."""
    import torch.distributed as dist

    fn, (ws, xs, targets), meshes = gpipe(stages, dp)
    f = torch.compile(fn, fullgraph=True, backend=backend) if backend else fn
    if backend:
        torch._dynamo.reset()
    with one_graph(shared):
        loss = f(ws, xs, targets)
        loss.full_tensor().backward()
    want_loss, want_gw, want_gx = gpipe_reference(stages)
    stage = meshes[0].local_rank("pp")
    return {"rank": dist.get_rank(), "loss": abs(loss.full_tensor().item() - want_loss),
            "ws": (ws.grad - want_gw).abs().max().item(),
            "xs": (xs.grad - want_gx).abs().max().item(), "stage": stage}


@pytest.mark.timeout(300)
def test_gpipe_region_equals_one_process(w4):
    for res in w4.run(gpipe_vs_one_process, 4, 1, None, timeout=120) + \
            w4.run(gpipe_vs_one_process, 4, 1, "aot_eager", timeout=300) + \
            w4.run(gpipe_vs_one_process, 4, 1, "aot_eager", True, timeout=300):
        assert max(res["loss"], res["ws"], res["xs"]) < 1e-10, res


def shared_cache_vs_eager(names: list[str], cache: str) -> dict:
    """Each program of ``names`` compiled on inductor under ``compile_on_one_rank`` into the cache directory
    ``cache``, rank 0 first: the other ranks wait for rank 0's graph before compiling each of theirs, so
    they load it. Per program: whether each of this rank's graphs hit the FX graph cache, and the largest
    difference of its outputs and gradients from eager mode's (what rank 0's code computes here)."""
    import datetime
    import os

    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    store, rank, old = _torch.default_store(), dist.get_rank(), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    out = {}
    try:
        for name in names:
            fn, args, _ = _programs_4()[name]()
            want, hits, order = _leaves_grads(fn, args), [], itertools.count()

            def inner(gm: Any, inputs: list, **kwargs: Any) -> Any:  # used within this iteration only
                key = f"{cache} {name} {next(order)}"
                if rank:
                    store.wait([key], datetime.timedelta(seconds=600))  # rank 0 compiling, at any load
                before = counters["inductor"]["fxgraph_cache_hit"]
                compiled = compile_fx_inner(gm, inputs, **kwargs)
                hits.append(counters["inductor"]["fxgraph_cache_hit"] > before)
                if rank == 0:
                    store.set(key, "compiled")
                return compiled

            torch._dynamo.reset()
            with one_graph(), torch._inductor.config.patch(fx_graph_cache=True):
                backend = lambda gm, inputs: compile_fx(gm, inputs, inner_compile=inner)  # noqa: E731
                got = _leaves_grads(torch.compile(fn, fullgraph=True, backend=backend), args)
            torch._dynamo.reset()
            diff = max((a - b).abs().max().item() for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True))
            out[name] = {"hits": hits, "diff": diff}
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    return out


@pytest.mark.timeout(1500)
def test_later_ranks_load_rank_0s_graphs_and_compute_their_own_values(w4, tmp_path):
    # the same graph on every rank (coordinates and split sizes computed when it runs, shared group names), so
    # with one cache directory ranks 1-3 hit every graph rank 0 compiled (forward and backward; the DTensor
    # MLP's graphs take a DeviceMesh), and rank 0's code run on them gives their own eager values
    names = [f"{ONE_GRAPH}ring and coordinates", f"{ONE_GRAPH}shard_map mlp, DTensor weights"]
    for rank, res in enumerate(w4.run(shared_cache_vs_eager, names, str(tmp_path), timeout=1200)):
        for name, got in res.items():
            assert got["hits"] == [rank > 0] * 2, (rank, name, got)  # forward and backward
            assert got["diff"] < 1e-5, (rank, name, got)


# -- FSDP2 + tensor parallel, compiled ------------------------------------------------------------------
#
# torch's own FSDP2 and TP on meshes of one realized family, the model compiled (FSDP2's hooks break the
# graph: no fullgraph): two SGD steps equal one process, and every rank's graphs make the same calls.

FSDP_BATCH, FSDP_LR, FSDP_STEPS = 8, 0.1, 2


def _fsdp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


def _fsdp_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(FSDP_BATCH, 4, generator=g), torch.randn(FSDP_BATCH, 4, generator=g)


def fsdp_tp_compiled(backend: str) -> dict:
    """(dp, tp) = (2, 2): TP (colwise, rowwise) over tp, FSDP2 over dp, compiled; against one process."""
    import warnings

    import torch._dynamo as dynamo
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    rm = _realize((2, 2), ("dp", "tp"))
    model = _fsdp_model()
    parallelize_module(model, rm["tp"].device_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=rm["dp"].device_mesh)
    recorder = Recorder(backend, group_labels(rm, rm["tp"], rm["dp"]), run=True)
    dynamo.reset()
    compiled = torch.compile(model, backend=recorder)
    opt = torch.optim.SGD(model.parameters(), lr=FSDP_LR)
    x, y = _fsdp_batch()
    i, n = rm.local_rank("dp"), 2
    rows = slice(i * FSDP_BATCH // n, (i + 1) * FSDP_BATCH // n)
    for _ in range(FSDP_STEPS):
        torch.nn.functional.mse_loss(compiled(x[rows]), y[rows]).backward()
        opt.step()
        opt.zero_grad()
    params = [p.full_tensor() for p in model.parameters()]
    dynamo.reset()
    ref = _fsdp_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=FSDP_LR)
    for _ in range(FSDP_STEPS):
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(params, ref.parameters(), strict=True)),
            "graphs": recorder.graphs, "members": {}}


@pytest.mark.timeout(600)
def test_fsdp2_and_tp_compiled_train_like_one_process_with_the_same_calls_on_every_rank(w4):
    results = w4.run(fsdp_tp_compiled, "aot_eager", timeout=500)
    for rank, res in enumerate(results):
        assert res["max_diff"] < 1e-5, (rank, res["max_diff"])
    assert results[0]["graphs"], "no graph was compiled"
    assert mismatches(results) == []
