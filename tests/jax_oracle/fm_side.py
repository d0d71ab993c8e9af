"""The functional_mesh side of the oracle: the programs of ``programs.py`` under ``fm.shard_map`` (docs/design.md, "Typed regions (shard_map)").

Each program has a body here, written as a user would (``torch`` ops and ``fm`` collectives
by axis name, no explicit ``pvary`` unless the program is about it), and a module-level
``run_<name>(rank=None)`` that the gloo world-8 pool of ``test_vs_jax.py`` calls on every rank.
It realizes the program's mesh, passes the FULL inputs as plain tensors (the same on every
rank), applies ``fm.shard_map(body, in_specs=..., out_specs=..., mesh=rm)``, and returns a
picklable dict:

- ``outputs``: ``out.full_tensor()`` of every result, as numpy;
- ``grads``: the full gradient of every input (plain tensors: the same on every rank) of
  ``loss = sum_i sum(out_i.full_tensor() * cot_i)``, or ``[]`` when the program checks none;
- ``placements``: per result, whether it is a ``DTensor`` whose placements are those of its
  out_spec on ``rm.device_mesh``;
- ``error``: ``None``, or ``(type name, message, names of the type's classes)`` for a
  ``fm.MeshError`` raised by the call (type errors are ``VmaError``, a ``MeshError``).

Anything that is not a ``MeshError`` propagates, so the pool reports its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import functional_mesh as fm
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT
from tests.jax_oracle import programs
from tests.jax_oracle.programs import Program, ring

BODIES: dict[str, Callable[..., Any]] = {}


def body(fn: Callable[..., Any]) -> Callable[..., Any]:
    assert fn.__name__ in programs.BY_NAME, fn.__name__
    BODIES[fn.__name__] = fn
    return fn


# -- the programs (names and meanings in programs.py; the JAX twins in jax_side.py) ---------------


@body
def row_parallel_matmul(x, w):
    return fm.psum(x @ w, "y")


@body
def mlp_column_row(x, w1, b1, w2, b2):
    h = torch.relu(x @ w1 + b1)
    return fm.psum(h @ w2, "y") + b2


@body
def replicated_weight_dp(x, w):
    y = torch.tanh(x @ w)
    return y, fm.pmean((y * y).sum(), "x")


@body
def sequence_parallel(x, w1, w2):
    full = fm.all_gather(x, "y", dim=1, tiled=True)
    h = torch.relu(full @ w1)
    return fm.psum_scatter(h @ w2, "y", dim=1, tiled=True) + x


@body
def all_to_all_one_axis(x):
    a = fm.all_to_all(x, "y", 1, 0, tiled=True)
    return a * torch.cos(a)


@body
def all_to_all_tuple(x):
    return (fm.all_to_all(x, ("x", "y"), 1, 0, tiled=True),
            fm.all_to_all(x, ("y", "x"), 1, 0, tiled=True) * 2.0)


@body
def ppermute_ring(x):
    return fm.ppermute(x, "y", ring(4)), fm.ppermute(x * x, "y", [(0, 1), (1, 2)])


@body
def ppermute_tuple(x):
    return (fm.ppermute(x, ("x", "y"), [(i, (3 * i + 1) % 8) for i in range(8)]),
            fm.ppermute(torch.sin(x), ("y", "x"), ring(8)))


@body
def axis_index_arithmetic(x):
    r1 = x * (fm.axis_index("y") + 1) * fm.axis_size("y") + fm.axis_index("x")
    r2 = x - fm.axis_index(("x", "y"))
    return r1, r2


@body
def axis_index_under_replicated_out(w):
    return w * fm.axis_index("y")


@body
def psum_of_invariant(w, v):
    return fm.psum(w, "x"), fm.pmean(w, "y"), fm.psum(w, ("x", "y")), fm.psum(v, "y")


@body
def out_specs_varying(x):
    return x * 2.0


@body
def out_specs_missing_axis(x):
    return x * 2.0


@body
def out_specs_second_result(x):
    return fm.psum(x, "y"), x + 1.0


@body
def out_specs_ok_after_psum(x):
    return fm.psum(x * x, "y")


@body
def invariant_out_named_axis(w, x):
    return w * 2.0, fm.psum(torch.sin(x), "y")


@body
def all_gather_invariant(x, w):
    # both spellings: ours ("invariant") and JAX's ("invarying"), docs/design.md "Type rules"
    return (fm.all_gather(x, "y", dim=0, tiled=True, to="invariant"),
            fm.all_gather(w * w, "y", dim=0, tiled=True, to="invarying"))


@body
def all_gather_varying_under_replicated_out(x):
    return fm.all_gather(x, "y", dim=0, tiled=True)


@body
def invariant_into_collectives(w):
    return (fm.all_gather(w, "y", dim=0, tiled=True),
            fm.ppermute(w * w, "y", ring(4)),
            fm.psum_scatter(torch.sin(w), "y", dim=0, tiled=True),
            fm.all_to_all(torch.cos(w), "y", 0, 0, tiled=True))


@body
def explicit_pcast(x, w):
    return x @ fm.pcast(w, "x", to="varying"), torch.tanh(x) @ fm.pvary(w, "x")


@body
def pcast_of_varying(x):
    return fm.pcast(x, "y", to="varying")


@body
def psum_mixed_tuple(x):
    return fm.psum(x, ("x", "y"))


@body
def psum_scatter_mixed_tuple(x):
    return fm.psum_scatter(x, ("x", "y"), dim=0, tiled=True)


@body
def nondivisible_arg(x):
    return x


@body
def nondivisible_tuple(x):
    return x


def generated_body(program: Program) -> Callable[..., Any]:
    """The chain of ``program.steps`` (the same interpreter as ``jax_side.generated_body``)."""

    def run(x, w):
        for step in program.steps:
            op, args = step[0], step[1:]
            if op == "mul_w":
                x = x * w
            elif op == "sin":
                x = torch.sin(x)
            elif op == "axis_index":
                x = x * (fm.axis_index(args[0]) + 1)
            elif op == "psum":
                x = fm.psum(x, args[0])
            elif op == "pmean":
                x = fm.pmean(x, args[0])
            elif op == "pcast":
                x = fm.pcast(x, args[0], to="varying")
            elif op == "ppermute":
                x = fm.ppermute(x, args[0], ring(programs.axis_size(program, args[0]), args[1]))
            elif op == "all_gather":
                x = fm.all_gather(x, args[0], dim=args[1], tiled=True)
            elif op == "all_gather_invariant":
                x = fm.all_gather(x, args[0], dim=args[1], tiled=True, to="invariant")
            elif op == "psum_scatter":
                x = fm.psum_scatter(x, args[0], dim=args[1], tiled=True)
            elif op == "all_to_all":
                x = fm.all_to_all(x, args[0], args[1], args[2], tiled=True)
            else:
                raise AssertionError(f"unknown step {step}")
        return x

    return run


# -- running ---------------------------------------------------------------------------------------


def execute(program: Program, fn: Callable[..., Any], rank: int | None = None) -> dict[str, Any]:
    """Run ``program`` with body ``fn`` on this rank; the picklable result described above."""
    if rank is not None and rank != dist.get_rank():
        raise AssertionError(f"run on rank {dist.get_rank()} but asked for rank {rank}")
    rm = fm.realize(fm.make_mesh(program.sizes, program.axes), timeout=GROUP_TIMEOUT, check=CHECK_S)
    args = [torch.tensor(a, dtype=torch.float64, requires_grad=program.grad) for a in program.inputs()]
    result: dict[str, Any] = {"rank": dist.get_rank(), "outputs": [], "grads": [], "placements": [],
                              "error": None}
    try:
        out = fm.shard_map(fn, in_specs=programs.in_tree(program, fm.P),
                           out_specs=programs.out_tree(program, fm.P), mesh=rm)(*args)
    except fm.MeshError as e:
        result["error"] = (type(e).__name__, str(e), [k.__name__ for k in type(e).__mro__])
        return result
    outs = list(out) if isinstance(out, tuple) else [out]
    for o, spec in zip(outs, program.out_specs):
        want = fm.NamedSharding(rm.mesh, fm.P(*spec)).placements
        got = tuple(getattr(o, "placements", ()))
        result["placements"].append((type(o).__name__, repr(got), repr(tuple(want)), got == tuple(want)))
    fulls = [o.full_tensor() for o in outs]
    result["outputs"] = [f.detach().numpy().copy() for f in fulls]
    if program.grad:
        cots = [torch.tensor(program.cotangent(i, f.shape)) for i, f in enumerate(fulls)]
        loss = sum((f * c).sum() for f, c in zip(fulls, cots))
        loss.backward()
        result["grads"] = [a.grad.detach().numpy().copy() if a.grad is not None else np.zeros(a.shape)
                           for a in args]
    return result


def run_program(name: str, rank: int | None = None) -> dict[str, Any]:
    """Any program by name (the generated ones have no ``run_<name>`` of their own)."""
    program = programs.BY_NAME[name]
    return execute(program, generated_body(program) if program.generated else BODIES[name], rank)


def _runner(name: str) -> Callable[..., dict[str, Any]]:
    def run(rank: int | None = None) -> dict[str, Any]:
        return execute(programs.BY_NAME[name], BODIES[name], rank)

    run.__name__ = run.__qualname__ = f"run_{name}"
    run.__module__ = __name__
    return run


# run_<name>(rank=None) for every hand-written program: module attributes, so the pool's
# workers resolve them by module and qualified name like any check.
for _name in BODIES:
    globals()[f"run_{_name}"] = _runner(_name)
del _name

_missing = [p.name for p in programs.HAND_WRITTEN if p.name not in BODIES]
assert not _missing, f"programs without an fm body: {_missing}"
