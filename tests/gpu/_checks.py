"""The GPU smoke's checks, run by every process of one torchrun job (``tests/gpu/run.py`` starts them).

    PYTHONPATH=. python3 -m torch.distributed.run --standalone --nproc_per_node=N tests/gpu/_checks.py CASE

    PYTHONPATH=. python3 -m torch.distributed.run --standalone --nproc_per_node=N tests/gpu/_checks.py CASE dtensor,abort

CASE is one of :data:`CASES`; the optional second argument names the checks to run (the mesh is
realized first in any case). Each check computes its expected values in this process, with plain
torch on full tensors (one process), and compares the distributed result with them. Before each
check every rank prints ``START <case>/<name> rank <r>`` (flushed: a process that dies in the
check, a segfault say, leaves that line as the last word about it), and rank 0 prints one line
per check, ``CHECK <case>/<name> PASS|FAIL|SKIP <what was measured>``, as soon as every rank has
finished it (the ranks agree on the outcome over the default group, so one failing rank fails the
check everywhere and the ranks stay in step). A fatal signal prints every thread's Python stack
(``faulthandler``). Needs only torch and this repository on ``PYTHONPATH``: no pytest, no network.

``FM_GPU_SMOKE_CRASH=<check>`` makes rank 1 kill itself with SIGSEGV as that check starts: how
``tests/gpu/test_gpu_smoke.py`` shows that a crash in one check hides none of the others.

``FM_GPU_SMOKE_NO_FUNCOL=<what happened>``, set by ``run.py`` when its torch-only probe
(``_funcol_probe.py``) found torch's functional collectives broken for this job's backend and
device, makes the checks that go through them a ``SKIP`` quoting it: ``dtensor`` after its part
without communication, ``fsdp_tp``, ``compile_collectives`` and ``compile``. ``shard_map`` runs
anyway: an eager region uses our collectives, which call the process group directly, and its
check compares without DTensor communication.

The case picks the backend and device: ``nccl-1`` (one process, NCCL, cuda:0), ``gloo-cuda`` (several
processes on gloo, CUDA tensors, all on the current GPU), ``nccl-multi`` (one process per GPU, NCCL),
and ``gloo-cpu`` (the same checks on CPU tensors: the rehearsal that runs without a GPU, in
``tests/gpu/test_gpu_smoke.py``).
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import P, _torch

CASES = ("nccl-1", "gloo-cuda", "nccl-multi", "gloo-cpu")
TIMEOUT = datetime.timedelta(seconds=60)  # every group's: a stuck collective fails its check within a minute


def setup(case: str) -> torch.device:
    """The default group and this process's device, for ``case``."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if case == "gloo-cpu":
        dist.init_process_group("gloo", timeout=TIMEOUT)
        return torch.device("cpu")
    if case == "gloo-cuda":  # every process on the one current GPU: gloo carries CUDA tensors
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", timeout=TIMEOUT)
        return torch.device("cuda", 0)
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=TIMEOUT, device_id=device)  # bound: realize may split_group
    return device


def mesh_for(world: int) -> fm.Mesh:
    """(dp, tp): tp = 2 when the world is even, else 1."""
    tp = 2 if world % 2 == 0 else 1
    return fm.make_mesh((world // tp, tp), ("dp", "tp"))


class Ctx:
    """What every check needs: the case, the realized mesh, this rank's device."""

    def __init__(self, case: str, device: torch.device) -> None:
        self.case, self.device = case, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device_type = device.type
        self.backend = "gloo" if case.startswith("gloo") else "nccl"
        self.mesh = mesh_for(self.world)
        self.rm: fm.RealizedMesh | None = None

    def realize(self, mesh: fm.Mesh, **kwargs) -> fm.RealizedMesh:
        return fm.realize(mesh, self.device_type, backend=self.backend, timeout=TIMEOUT, **kwargs)


def inputs(ctx: Ctx, shape: tuple[int, ...], salt: int = 0) -> list[torch.Tensor]:
    """Every rank's input, made on every rank (exact small integers as float32: sums are exact)."""
    return [torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) + 100 * r + salt
            for r in range(ctx.world)]


def members(ctx: Ctx, axis: str) -> list[int]:
    return ctx.mesh[axis].group_of(ctx.rank).reshape(-1).tolist()


# -- the checks ---------------------------------------------------------------------------------


def check_realize(ctx: Ctx) -> str:
    split_calls = []
    real_split = dist.split_group

    def counting_split(*args, **kwargs):
        split_calls.append(1)
        return real_split(*args, **kwargs)

    dist.split_group = counting_split
    try:
        before = fm.cache_info()
        ctx.rm = ctx.realize(ctx.mesh, products=[("dp", "tp")])
        made = fm.cache_info().groups - before.groups
    finally:
        dist.split_group = real_split
    rm = ctx.rm
    for axis in ("dp", "tp", ("dp", "tp")):
        want = members(ctx, axis) if isinstance(axis, str) else ctx.mesh[axis].flatten(name="p").group_of(
            ctx.rank).reshape(-1).tolist()
        if len(want) == 1:
            continue  # a size-1 axis costs no group
        got = dist.get_process_group_ranks(rm.group(axis))
        assert got == want, f"axis {axis}: group ranks {got}, mesh row {want}"
    if ctx.case == "nccl-multi":
        assert split_calls, "NCCL bound to a device: realize should have used split_group"
    # the layout cache: the same axes reached another way (a flatten, renamed) make no group
    again = ctx.realize(ctx.mesh.flatten(("dp", "tp"), name="world2").unflatten("world2", {"a": ctx.mesh.axis_sizes[0],
                                                                                        "b": ctx.mesh.axis_sizes[1]}))
    assert fm.cache_info().groups - before.groups == made, "an equivalent mesh made new groups"
    if ctx.mesh.axis_sizes[1] > 1:
        assert dist.get_process_group_ranks(again.group("b")) == dist.get_process_group_ranks(rm.group("tp"))
    return (f"mesh {dict(zip(ctx.mesh.axis_names, ctx.mesh.axis_sizes))} on {rm.backend}/{rm.device_type}, "
            f"{made} groups made, {len(split_calls)} split_group calls, equivalent mesh: 0 new groups, "
            f"{fm.cache_info()}")


def _unsupported(exc: BaseException, ctx: Ctx) -> bool:
    """gloo refusing a collective for CUDA tensors (a torch limitation, not ours): the check says so."""
    text = str(exc).lower()
    return (ctx.backend == "gloo" and ctx.device.type == "cuda"
            and any(w in text for w in ("unsupported", "not supported", "no support", "not implemented")))


def check_collectives(ctx: Ctx) -> str:
    rm, dev = ctx.rm, ctx.device
    xs = inputs(ctx, (4, 3))
    x = xs[ctx.rank].to(dev)
    cases = []  # (label, call, expected value on this rank)
    for axis in ("dp", "tp"):
        group = members(ctx, axis)
        me, n = group.index(ctx.rank), len(group)
        cases.append((f"psum {axis}", lambda a=axis: fm.psum(x, a), sum(xs[r] for r in group)))
        cases.append((f"all_gather {axis}", lambda a=axis: fm.all_gather(x, a), torch.cat([xs[r] for r in group])))
        if 4 % n == 0:
            cases.append((f"psum_scatter {axis}", lambda a=axis: fm.psum_scatter(x, a),
                          sum(xs[r] for r in group).chunk(n)[me]))
            cases.append((f"all_to_all {axis}", lambda a=axis: fm.all_to_all(x, a, 0, 0),
                          torch.cat([xs[r].chunk(n)[me] for r in group])))
        perm = [(i, (i + 1) % n) for i in range(n)]
        cases.append((f"ppermute {axis}", lambda a=axis, p=perm: fm.ppermute(x, a, p), xs[group[(me - 1) % n]]))
        # ragged: member i sends (i + j) % 3 rows to member j, rows valued 10 i + j
        send = [(me + j) % 3 for j in range(n)]
        rx = torch.cat([torch.full((k, 2), 10.0 * me + j) for j, k in enumerate(send)]).to(dev)
        cases.append((f"ragged_all_to_all {axis}", lambda a=axis, r=rx, s=send: fm.ragged_all_to_all(r, a, s),
                      torch.cat([torch.full(((i + me) % 3, 2), 10.0 * i + me) for i in range(n)])))
    cases.append(("psum (dp, tp)", lambda: fm.psum(x, ("dp", "tp")), sum(xs)))
    passed, unsupported, failed = [], [], []
    with rm:
        assert fm.axis_index(("dp", "tp")) == ctx.rank
        for label, call, want in cases:  # every rank runs every case, in order, whatever failed before
            try:
                got = call()
            except Exception as exc:  # noqa: BLE001 - sorted below
                (unsupported if _unsupported(exc, ctx) else failed).append(f"{label}: {type(exc).__name__}: "
                                                                           f"{str(exc).splitlines()[0][:120]}")
                continue
            (passed if torch.equal(got.cpu(), want) else failed).append(label if torch.equal(got.cpu(), want)
                                                                        else f"{label}: wrong values")
    summary = f"{len(passed)} of {len(cases)} equal to one process on {x.device} tensors"
    assert not failed, f"{summary}; failed: {'; '.join(failed)}"
    if unsupported:
        raise Skip(f"{summary}; {ctx.backend} has no CUDA version of: {'; '.join(unsupported)}")
    return f"{summary}: {', '.join(passed)}"


def _problem(dev: torch.device):
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(8, 16, generator=g, dtype=torch.float64) / 8 ** 0.5
    w2 = torch.randn(16, 4, generator=g, dtype=torch.float64) / 4
    x = torch.randn(6 * 2, 8, generator=g, dtype=torch.float64)
    return w1, w2, x


def _mlp(x, w1, w2):
    return fm.psum(torch.relu(x @ w1) @ w2, "tp")


def _region_vs_one_process(ctx: Ctx, compiled: bool) -> tuple[float, str]:
    """A typed region's loss, output block and gradient blocks (float64) against one process.

    Compared with no DTensor communication (no ``full_tensor``), so that it needs only our eager
    collectives, which call the process group directly: this rank's block of the output and of
    each gradient, and the loss summed over dp by ``fm.psum``. torch's functional collectives,
    which DTensor's redistributions use, crash on gloo with CUDA tensors on some torch builds
    (``_funcol_probe.py``); an eager region does not go through them.
    """
    rm, dev = ctx.rm, ctx.device
    w1f, w2f, xf = _problem(dev)
    spec = fm.NamedSharding
    w1 = fm.distribute(w1f.to(dev), spec(rm.mesh, P(None, "tp")), mesh=rm).requires_grad_()
    w2 = fm.distribute(w2f.to(dev), spec(rm.mesh, P("tp", None)), mesh=rm).requires_grad_()
    step = fm.shard_map(_mlp, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None),
                        mesh=rm, check_vma=True)
    backend = "none"
    if compiled:
        backend = _compile_backend(ctx)
        step = torch.compile(step, backend=backend, fullgraph=True)
    y = step(xf.to(dev), w1, w2).to_local()  # this rank's dp block of rows (the same on every tp member)
    mine = (y ** 2).sum()  # the loss is the sum over dp of these (each tp member backpropagates its own copy)
    mine.backward()
    loss = fm.psum(mine.detach(), "dp", mesh=rm) if rm.axis_size("dp") > 1 else mine.detach()
    a, b = w1f.clone().requires_grad_(), w2f.clone().requires_grad_()
    full = torch.relu(xf @ a) @ b
    want = full.pow(2).sum()
    want.backward()
    d, rows = rm.local_rank("dp"), xf.shape[0] // rm.axis_size("dp")
    t, n = rm.local_rank("tp"), rm.axis_size("tp")
    err = max(abs(loss.item() - want.item()),
              (y.detach().cpu() - full.detach()[d * rows:(d + 1) * rows]).abs().max().item(),
              (w1.grad.to_local().cpu() - a.grad.chunk(n, dim=1)[t]).abs().max().item(),
              (w2.grad.to_local().cpu() - b.grad.chunk(n, dim=0)[t]).abs().max().item())
    assert err <= 1e-10, f"loss, output or gradients differ from one process by {err:.3g}"
    return err, backend


def check_shard_map(ctx: Ctx) -> str:
    types = {}

    def body(x, w1, w2):
        h = torch.relu(x @ w1)
        types["h"] = sorted(fm.typeof(h).varying)
        return fm.psum(h @ w2, "tp")

    rm, dev = ctx.rm, ctx.device
    w1f, w2f, xf = _problem(dev)
    fm.shard_map(body, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None),
                 mesh=rm)(xf.to(dev), fm.distribute(w1f.to(dev), fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm),
                          fm.distribute(w2f.to(dev), fm.NamedSharding(rm.mesh, P("tp", None)), mesh=rm))
    assert types["h"] == ["dp", "tp"], f"typeof(h).varying = {types['h']}"
    try:  # a typed region refuses a result that varies where out_specs says invariant
        fm.shard_map(lambda x, w1: torch.relu(x @ w1), in_specs=(P("dp", None), P(None, "tp")),
                     out_specs=P("dp", None), mesh=rm)(xf.to(dev), fm.distribute(
                         w1f.to(dev), fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm))
        refused = "no error"
    except (fm.VmaError, fm.MeshError) as exc:
        refused = type(exc).__name__
    assert refused != "no error", "a typed region accepted an output varying over tp with out_specs P('dp', None)"
    err, _ = _region_vs_one_process(ctx, compiled=False)
    return (f"typeof(h).varying={types['h']}, a wrong out_specs raised {refused}; loss, output and gradient "
            f"blocks (float64) vs one process: max diff {err:.2g} (no DTensor communication)")


def _compile_backend(ctx: Ctx) -> str:
    return "inductor" if ctx.device.type == "cuda" else "aot_eager"  # inductor on CPU would compile C++: slow


def check_compile_collectives(ctx: Ctx) -> str:
    """Our collectives inside a compiled function (no region): functional collectives by group name."""
    _needs_funcol(ctx, "a compiled collective (the compiled code calls torch's functional collective ops)")
    rm, dev = ctx.rm, ctx.device
    xs = inputs(ctx, (4, 3))
    group = members(ctx, "tp")
    me, n = group.index(ctx.rank), len(group)

    def f(x):
        y = fm.psum(x * 2, "tp")
        z = fm.all_gather(torch.sin(y), "tp")
        return fm.ppermute(z, "tp", [(i, (i + 1) % n) for i in range(n)])

    t0 = time.perf_counter()
    x = xs[ctx.rank].to(dev).requires_grad_()
    with rm:  # the mesh of the collectives: the one entered (a RealizedMesh is no constant of a trace)
        out = torch.compile(f, backend=_compile_backend(ctx), fullgraph=True)(x)
    out.sum().backward()
    first = time.perf_counter() - t0
    ref = [t.detach().clone().requires_grad_() for t in xs]
    want = torch.cat([torch.sin(sum(ref[r] for r in group) * 2)] * n)  # every member's z (and out) is this
    want.sum().backward()
    assert torch.allclose(out.detach().cpu(), want.detach(), atol=1e-5), "compiled forward"
    # the program's loss sums every member's out: all_gather's transpose sums the n members' cotangents of
    # my block (n ones), psum's is the identity: d/dx = 2 n cos(y), which is the one-process gradient
    assert torch.allclose(x.grad.cpu(), ref[ctx.rank].grad, atol=1e-4), "compiled backward"
    return (f"torch.compile(psum -> all_gather -> ppermute, backend={_compile_backend(ctx)}, fullgraph=True) "
            f"forward and backward equal one process; first call {first:.1f} s")


def check_compile(ctx: Ctx) -> str:
    regions = _torch.region_trace_failure()  # shard_map's own feature probe (None: this dynamo traces a region)
    no_region = (f"; and shard_map compiles no region on torch {torch.__version__} (its dynamo cannot trace one: "
                 f"{regions})") if regions is not None else ""
    _needs_funcol(ctx, "a compiled region (its collectives are torch's functional collective ops)", no_region)
    t0 = time.perf_counter()
    try:
        err, backend = _region_vs_one_process(ctx, compiled=True)
    except fm.MeshError as exc:  # shard_map refuses a compiled region where its probe says dynamo cannot trace one
        if regions is not None and regions in str(exc):
            raise Skip(f"as documented for torch {torch.__version__}: MeshError: {str(exc)[:300]}...") from exc
        raise
    return (f"torch.compile(shard_map region, backend={backend}, fullgraph=True), forward and backward: "
            f"max diff vs one process {err:.2g}, first call {time.perf_counter() - t0:.1f} s")


class Skip(Exception):
    """A check that cannot run here, with the reason."""


# Set by run.py when its torch-only probe (_funcol_probe.py) found torch's functional collectives broken on
# this job's backend and device: what happened there. The checks that go through them then skip, saying so.
NO_FUNCOL = os.environ.get("FM_GPU_SMOKE_NO_FUNCOL", "")


def _needs_funcol(ctx: Ctx, what: str, more: str = "") -> None:
    """Skip, naming the torch bug, when run.py's probe found torch's functional collectives broken here."""
    if NO_FUNCOL:
        raise Skip(f"{what}: it uses torch's functional collectives, and {NO_FUNCOL}: a torch bug with "
                   f"{ctx.backend} and {ctx.device.type} tensors (torch {torch.__version__}), not ours{more}")


def check_dtensor(ctx: Ctx) -> str:
    rm, dev = ctx.rm, ctx.device
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6).to(dev)
    sharding = fm.NamedSharding(rm.mesh, P("dp", "tp"))
    d = fm.distribute(full, sharding, mesh=rm)
    i, j = rm.local_rank("dp"), rm.local_rank("tp")
    rows, cols = 8 // rm.axis_size("dp"), 6 // rm.axis_size("tp")
    assert torch.equal(d.to_local(), full[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]), "local shard"
    assert fm.sharding_of(d) == sharding, f"sharding_of: {fm.sharding_of(d)}"
    _needs_funcol(ctx, "reshard, full_tensor and a DTensor reduction (DTensor's redistribute)",
                  f" (distribute P('dp','tp') -> {tuple(d.placements)} and sharding_of passed: no communication)")
    r = fm.reshard(d, fm.NamedSharding(rm.mesh, P(None, "tp")))
    assert torch.equal(r.to_local(), full[:, j * cols:(j + 1) * cols]), "reshard"
    assert torch.equal(r.full_tensor(), full), "full_tensor"
    s = (d * 2).sum()  # a DTensor op with a reduction over both dims
    assert s.full_tensor().item() == 2 * full.sum().item(), "DTensor sum"
    return f"distribute P('dp','tp') -> {tuple(d.placements)}, sharding_of, reshard to P(None,'tp'), DTensor sum: exact"


def check_fsdp_tp(ctx: Ctx) -> str:
    import copy

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _needs_funcol(ctx, "FSDP2 + TP (TP's DTensor redistributions, full_tensor)")
    rm, dev = ctx.rm, ctx.device
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dev)
    ref = copy.deepcopy(model)
    parallelize_module(model, rm["tp"].device_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=rm["dp"].device_mesh)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    dp, me = rm.axis_size("dp"), rm.local_rank("dp")
    x, y = torch.randn(4 * dp, 8, generator=g).to(dev), torch.randn(4 * dp, 4, generator=g).to(dev)
    worst = 0.0
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[4 * me:4 * me + 4]), y[4 * me:4 * me + 4])
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        want = torch.nn.functional.mse_loss(ref(x), y)
        want.backward()
        ref_opt.step()
        total = fm.pmean(loss.detach(), "dp", mesh=rm) if dp > 1 else loss.detach()
        worst = max(worst, abs(total.item() - want.item()))
    weight = model[0].weight.full_tensor()
    worst = max(worst, (weight - ref[0].weight).abs().max().item())
    assert worst <= 1e-5, f"FSDP2 + TP differs from one process by {worst:.3g}"
    return (f"FSDP2 over dp x TP over tp on {rm.device_type}, 3 SGD steps: losses and weights vs one process "
            f"max diff {worst:.2g}; fc1 placements {tuple(model[0].weight.placements)}")


def check_abort(ctx: Ctx) -> str:
    dist.barrier()
    t0 = time.perf_counter()
    fm.abort()
    took = time.perf_counter() - t0
    try:
        ctx.rm.group("tp")
        stale = "no error"
    except fm.MeshError:
        stale = "MeshError"
    assert stale == "MeshError", "a realized mesh still answered after abort"
    rm = ctx.rm = ctx.realize(ctx.mesh)
    x = torch.full((2,), float(ctx.rank), device=ctx.device)
    got = fm.psum(x, ("dp", "tp"), mesh=rm) if ctx.world > 1 else x
    assert got.cpu().tolist() == [float(sum(range(ctx.world)))] * 2, f"psum after re-realize: {got}"
    return f"abort returned in {took * 1e3:.1f} ms, old handle raises MeshError, realize again + psum: exact"


# The compiled checks come after the eager ones: torch's compilers are what is most likely to crash a
# process, and run.py restarts a job that died with the checks after the one that was running. (On the
# first GPU run, torch 2.11.0, gloo-cuda processes died with SIGSEGV inside torch's functional
# collectives; run.py now probes those first, and the checks that need them skip where they crash.)
# compile_collectives runs after eager regions on purpose: a compiled collective must work in a process
# that ran one. abort is last: it destroys the mesh the others use.
CHECKS = [("realize", check_realize), ("collectives", check_collectives), ("dtensor", check_dtensor),
          ("shard_map", check_shard_map), ("fsdp_tp", check_fsdp_tp), ("compile_collectives", check_compile_collectives),
          ("compile", check_compile), ("abort", check_abort)]


def say(line: str, fd: int = 1) -> None:
    """One line in one write (the processes share the pipe: a print's text and newline go separately)."""
    os.write(fd, (line[:3500] + "\n").encode())


def agree(ok: bool, device: torch.device) -> bool:
    """True when every rank says ``ok`` (a MIN over the default group)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def main(argv: list[str]) -> int:
    case = argv[0] if argv else ""
    if case not in CASES:
        print(f"usage: _checks.py CASE, CASE in {CASES}; got {argv}", file=sys.stderr)
        return 2
    only = set(argv[1].split(",")) if len(argv) > 1 and argv[1] else None
    unknown = sorted((only or set()) - {name for name, _ in CHECKS})
    if unknown:
        print(f"usage: _checks.py CASE [CHECK,...], CHECK in {[name for name, _ in CHECKS]}; got {unknown}",
              file=sys.stderr)
        return 2
    faulthandler.enable(all_threads=True)  # a fatal signal prints the Python stack of every thread
    warnings.filterwarnings("ignore")
    device = setup(case)
    ctx = Ctx(case, device)
    if only is not None and "realize" not in only:  # a restarted job: the mesh the later checks need
        ctx.rm = ctx.realize(ctx.mesh, products=[("dp", "tp")])
    crash = os.environ.get("FM_GPU_SMOKE_CRASH", "")
    failed = 0
    for name, check in CHECKS:
        if only is not None and name not in only:
            continue
        say(f"START {case}/{name} rank {ctx.rank}")
        if name == crash and ctx.rank == min(1, ctx.world - 1):
            os.kill(os.getpid(), signal.SIGSEGV)  # the test of a crash (see the module's docstring)
        t0 = time.perf_counter()
        skip = False
        try:
            what, ok = check(ctx), True
        except Skip as exc:
            what, ok, skip = str(exc), True, True
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the next check still runs
            if _unsupported(exc, ctx):  # e.g. FSDP2's reduce-scatter of CUDA tensors on gloo
                what, ok, skip = (f"{ctx.backend} has no CUDA version of a collective it needs: "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"), True, True
            else:
                what, ok = f"{type(exc).__name__}: {exc}", False
            print(f"rank {ctx.rank} {case}/{name} {'skipped' if skip else 'failed'}:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
        try:
            everywhere = agree(ok, device)
        except Exception as exc:  # noqa: BLE001 - the default group itself is gone: stop here
            say(f"CHECK {case}/{name} FAIL the ranks could not agree on the outcome: {exc}")
            return 1
        if ctx.rank == 0:
            verdict = ("SKIP" if skip else "PASS") if everywhere else "FAIL"
            if ok and not everywhere:
                what = "failed on another rank (its traceback is above)"
            say(f"CHECK {case}/{name} {verdict} [{time.perf_counter() - t0:.1f} s] {' '.join(what.split())}")
        failed += not everywhere
        if name == "realize" and not everywhere:
            break  # nothing else can run without the mesh
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    from tests._exit import exit_now  # the repository is on PYTHONPATH (run.py sets it)

    exit_now(main(sys.argv[1:]))
