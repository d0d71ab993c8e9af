"""The programs bench_compile.py compiles rank after rank into one FX graph cache (``--cache``).

Each is ``build(world) -> (fn, args)``: ``fn(*args)`` returns a scalar loss (the benchmark calls
``.backward()`` on it, so forward and backward are compiled), on a mesh realized on the current
(fake) world. The same programs, on gloo, are checked for their collectives by
``tests/dist/test_compile_spmd_gloo.py`` and for their values by ``tests/fake/test_one_compile_fake.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import functional_mesh as fm
from functional_mesh import P

Program = Callable[[int], tuple[Callable[..., Any], tuple[Any, ...]]]


def _tensor(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def psum_mlp(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``psum(relu(x @ w), "tp")`` over the world, plain tensors."""
    rm = fm.realize(fm.make_mesh((world,), ("tp",)))

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return fm.psum(torch.relu(x @ w), "tp", mesh=rm).sum()

    return fn, (_tensor(8, 16), _tensor(16, 16, seed=1))


def ppermute_ring(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A ring over the world, plain tensors: ``ppermute(tanh(x @ w))`` to the next rank, twice."""
    rm = fm.realize(fm.make_mesh((world,), ("tp",)))
    ring = [(i, (i + 1) % world) for i in range(world)]

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = fm.ppermute(torch.tanh(x @ w), "tp", ring, mesh=rm)
        return (fm.ppermute(h * h, "tp", ring, mesh=rm) * x).sum()

    return fn, (_tensor(8, 16), _tensor(16, 16, seed=1))


def _pipeline_body(w: torch.Tensor) -> torch.Tensor:
    n = fm.axis_size("pp")
    shift = [(s, s + 1) for s in range(n - 1)]
    a = fm.ppermute(torch.tanh(w), "pp", shift)
    b = fm.ppermute(torch.tanh(a * w), "pp", shift)
    return fm.psum(b.sum(), "pp")


def pipeline_region(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Issue 28's typed region over the world (two partial shifts, a full argument split by the boundary)."""
    rm = fm.realize(fm.make_mesh((world,), ("pp",)))
    f = fm.shard_map(_pipeline_body, mesh=rm, in_specs=P("pp"), out_specs=P())
    return (lambda w: f(w).to_local()), (_tensor(4 * world),)


def tp_mlp_region(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A typed tp MLP region over the world with DTensor weights (bench_compile's fm model)."""
    rm = fm.realize(fm.make_mesh((world,), ("tp",)))
    w1 = fm.distribute(_tensor(16, 8 * world, seed=1).detach(), fm.NamedSharding(rm.mesh, P(None, "tp")), mesh=rm)
    w2 = fm.distribute(_tensor(8 * world, 16, seed=2).detach(), fm.NamedSharding(rm.mesh, P("tp", None)), mesh=rm)

    def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return fm.psum(torch.relu(x @ w1) @ w2, "tp")

    f = fm.shard_map(mlp, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), mesh=rm)
    return (lambda x, a, b: (f(x, a, b).to_local() ** 2).mean()), (_tensor(8, 16), w1.requires_grad_(),
                                                                    w2.requires_grad_())


def _gpipe_body(ws: torch.Tensor, xs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    n, stage = fm.axis_size("pp"), fm.axis_index("pp")
    shift = [(s, s + 1) for s in range(n - 1)]
    h, outs, micro = torch.zeros_like(xs[0]), [], xs.shape[0]
    for tick in range(micro + n - 1):
        inject = xs[tick] if tick < micro else torch.zeros_like(xs[0])
        h = torch.tanh(torch.where(stage == 0, inject, h) @ ws[0])
        if tick >= n - 1:
            outs.append(h)
        if tick < micro + n - 2:
            h = fm.ppermute(h, "pp", shift)
    loss = ((torch.stack(outs) - targets) ** 2).sum() * (stage == n - 1)
    return fm.psum(loss, "pp")


def gpipe(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The 4-stage GPipe region of docs/recipes.md over (pp, dp) = (4, world // 4)."""
    rm = fm.realize(fm.make_mesh((4, world // 4), ("pp", "dp")))
    f = fm.shard_map(_gpipe_body, mesh=rm, in_specs=(P("pp"), P(), P()), out_specs=P())
    return (lambda ws, xs, t: f(ws, xs, t).to_local()), (_tensor(4, 4, 4), _tensor(3, 2, 4, seed=1),
                                                         _tensor(3, 2, 4, seed=2).detach())


def fsdp2_tp(world: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """torch's TP (colwise, rowwise) over tp = 2 and FSDP2 over dp = world // 2, meshes from ``rm``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rm = fm.realize(fm.make_mesh((world // 2, 2), ("dp", "tp")))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    parallelize_module(model, rm["tp"].device_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=rm["dp"].device_mesh)
    return (lambda x: (model(x) ** 2).mean()), (_tensor(8, 16).detach(),)


PROGRAMS: dict[str, Program] = {"psum MLP": psum_mlp, "ppermute ring": ppermute_ring,
                                "pipeline region": pipeline_region, "TP MLP region, DTensor weights": tp_mlp_region,
                                "GPipe, 4 stages": gpipe, "FSDP2 + TP": fsdp2_tp}
