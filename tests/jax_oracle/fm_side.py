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

from torch.distributed.tensor import DTensor, Replicate

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


# the partial-manual twins of two programs above: the same bodies, over (x, y) manual over y only
BODIES["partial_row_parallel_matmul"] = row_parallel_matmul
BODIES["partial_mlp"] = mlp_column_row


@body
def partial_axis_index(x):
    return x * (fm.axis_index("y") + 1) * fm.axis_size("y")


@body
def partial_gather_permute(x):
    return fm.all_gather(x, "y", dim=0, tiled=True, to="invariant"), fm.ppermute(torch.sin(x), "y", ring(4))


@body
def partial_out_specs_varying(x):
    return x * 2.0


@body
def partial_psum_over_auto_axis(x):
    return fm.psum(x, "x")


@body
def partial_in_spec_auto_axis(x):
    return x


@body
def partial_out_spec_auto_axis(x):
    return x


@body
def nested_disjoint(x):
    # mesh=None inside a region: the enclosing region's mesh (JAX: the context mesh)
    inner = fm.shard_map(lambda z: (fm.psum(z, "x"), fm.psum(z * z, "y")), in_specs=fm.P("x"),
                         out_specs=(fm.P(), fm.P("x")), axis_names={"x"})
    a, b = inner(x)
    return a * 2.0, b


@body
def nested_inner_out_specs_varying(x):
    return fm.shard_map(lambda z: z * 2.0, in_specs=fm.P("x"), out_specs=fm.P(), axis_names={"x"})(x)


@body
def nested_same_axis(x):
    return fm.shard_map(lambda z: z, in_specs=fm.P("y"), out_specs=fm.P("y"), axis_names={"y"})(x)


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
                           out_specs=programs.out_tree(program, fm.P), mesh=rm,
                           axis_names=set(program.axis_names) or None)(*args)
    except fm.MeshError as e:
        result["error"] = (type(e).__name__, str(e), [k.__name__ for k in type(e).__mro__])
        return result
    outs = list(out) if isinstance(out, tuple) else [out]
    for o, spec in zip(outs, program.out_specs):
        want = fm.NamedSharding(rm.mesh, fm.P(*spec)).placements
        got = tuple(getattr(o, "placements", ()))
        if program.axis_names:  # manual over some axes: the others are placed as the body's DTensors were
            manual = [i for i, a in enumerate(program.axes) if a in program.axis_names]
            want, got = tuple(want[i] for i in manual), tuple(got[i] for i in manual) if got else got
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


# -- pending sums (unreduced): programs.UNREDUCED, run by test_unreduced_vs_jax.py ----------------------
#
# ``UR_BODIES``: each program's body for fm.shard_map (the JAX twins in jax_side.py, which cast an
# invariant factor to="reduced" where JAX asks for it; we multiply by it directly). ``UR_REFERENCES``:
# for the programs held to one process, the same program in plain torch on the full tensors, with
# every pending sum written out as the sum of its members' blocks. ``note`` records fm.typeof.

UR_BODIES: dict[str, Callable[..., Any]] = {}
UR_REFERENCES: dict[str, Callable[..., list[torch.Tensor]]] = {}
UR_TYPES: dict[str, tuple[list[str], list[str], list[str]]] = {}


def ur_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    assert fn.__name__ in programs.UNREDUCED_BY_NAME, fn.__name__
    UR_BODIES[fn.__name__] = fn
    return fn


def ur_reference(fn: Callable[..., list[torch.Tensor]]) -> Callable[..., list[torch.Tensor]]:
    name = fn.__name__.removeprefix("one_process_")
    assert programs.UNREDUCED_BY_NAME[name].one_process, name
    UR_REFERENCES[name] = fn
    return fn


def note(key: str, value: torch.Tensor) -> torch.Tensor:
    """Record ``fm.typeof(value)`` under ``key``; return ``value``."""
    t = fm.typeof(value)
    UR_TYPES[key] = (sorted(t.varying), sorted(t.unreduced), sorted(t.reduced))
    return value


def _pend(x: torch.Tensor, axis: Any = "tp") -> torch.Tensor:
    return fm.pcast(x, axis, to="unreduced")


def tp_sum(x: torch.Tensor) -> torch.Tensor:
    """The value of ``pcast(x, 'tp', to='unreduced')`` for x (8, 16) under P('dp', 'tp'), as a full
    (8, 4) array under P('dp'): the sum of the four tp members' column blocks."""
    return sum(x[:, 4 * k:4 * k + 4] for k in range(4))


def per_dp(s: torch.Tensor, op: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``op`` on each dp member's rows of ``s`` (8, ...) (an op along dim 0 of a local block), concatenated."""
    return torch.cat([op(s[:4]), op(s[4:])])


@ur_body
def ur_pcast_psum(x):
    return note("psum", fm.psum(note("u", _pend(x)), "tp"))


@ur_reference
def one_process_ur_pcast_psum(x):
    return [tp_sum(x)]


@ur_body
def ur_psum_scatter(x):
    u = note("u", _pend(x))
    return (note("scatter", fm.psum_scatter(u, "tp", dim=1, tiled=True)),
            fm.psum_scatter(u, "tp", dim=0, tiled=True))


@ur_body
def ur_add(x, y):
    return fm.psum(note("sum", _pend(x) + _pend(torch.sin(y))), "tp")


@ur_body
def ur_reshape_sum(x):
    u = note("u", _pend(x))
    return fm.psum(note("reshaped", u.reshape(2, 16)).sum(0), "tp"), fm.psum(u.T, "tp")


@ur_body
def ur_shape_ops(x, y):
    u, v = _pend(x), _pend(y * y)
    return (fm.psum(torch.cat([u, v], 1), "tp"), fm.psum(torch.stack([u, v]), "tp"), fm.psum(u[1:3], "tp"),
            fm.psum(u.unsqueeze(0).expand(2, 4, 4).sum(0), "tp"), fm.psum(u.unsqueeze(0).squeeze(0), "tp"))


@ur_body
def ur_reorder_ops(x):
    u = _pend(x)
    return (fm.psum(torch.roll(u, 1, 0), "tp"), fm.psum(torch.triu(u), "tp"), fm.psum(u.transpose(0, 1), "tp"),
            fm.psum(torch.einsum("ij->j", u), "tp"), fm.psum(u.float().double(), "tp"), fm.psum(u.clone(), "tp"))


@ur_body
def ur_scale_reduced(x, s, w):
    u = _pend(x)
    return fm.psum(u * s, "tp"), fm.psum(u * w, "tp"), fm.psum(w * u, "tp")


@ur_body
def ur_out_specs(x):
    return _pend(x), _pend(x.sum(0), ("dp", "tp")), note("dp summed", fm.psum(_pend(x), "dp"))


@ur_reference
def one_process_ur_out_specs(x):
    s = tp_sum(x)
    return [s, s.sum(0), s[:4] + s[4:]]


@ur_body
def ur_in_specs(u, w):
    note("u", u)
    return fm.psum_scatter(u * w, "tp", dim=0, tiled=True), u


@ur_reference
def one_process_ur_in_specs(members, w):
    value = members.sum(0)  # (8, 3) under P('dp'); the scatter along dim 0 keeps the rows' order
    return [value * w, value]


@ur_body
def ur_in_specs_two_axes(u):
    note("u", u)
    return note("tp summed", fm.psum(u, "tp")), fm.psum(u, ("dp", "tp"))


@ur_body
def ur_two_axes(x):
    u = note("u", _pend(x, ("dp", "tp")))
    return fm.psum(u, "tp"), fm.psum(u, ("dp", "tp")), fm.psum(fm.psum(u, "dp"), "tp")


@ur_body
def ur_row_parallel_sp(x, w, r):
    y = note("y", _pend(x @ w))
    return fm.psum_scatter(y, "tp", dim=0, tiled=True) + r


@ur_reference
def one_process_ur_row_parallel_sp(x, w, r):
    return [sum(x[:, 4 * k:4 * k + 4] @ w[4 * k:4 * k + 4] for k in range(4)) + r]


@ur_body
def ur_accumulate(x1, x2, y):
    return fm.psum(_pend(x1.T @ y, "dp") + _pend(x2.T @ y, "dp"), "dp")


@ur_reference
def one_process_ur_accumulate(x1, x2, y):
    return [sum(a[4 * d:4 * d + 4].T @ y[4 * d:4 * d + 4] for a in (x1, x2) for d in range(2))]


@ur_body
def ur_pmean(x):
    return fm.pmean(_pend(x), "tp")


@ur_body
def ur_neg(x):
    u = _pend(x)
    return fm.psum(note("neg", -u), "tp"), fm.psum(torch.neg(u), "tp")


@ur_reference
def one_process_ur_neg(x):
    return [-tp_sum(x), -tp_sum(x)]


@ur_body
def ur_sub(x, y):
    return fm.psum(_pend(x) - _pend(y * y), "tp")


@ur_reference
def one_process_ur_sub(x, y):
    return [tp_sum(x) - tp_sum(y * y)]


@ur_body
def ur_matmul_invariant(x, w):
    u = _pend(x)
    return (fm.psum(note("u @ w", u @ w), "tp"), fm.psum(torch.einsum("ij,jk->ik", u, w), "tp"),
            fm.psum(torch.nn.functional.linear(u, w.T), "tp"))


@ur_reference
def one_process_ur_matmul_invariant(x, w):
    s = tp_sum(x)
    return [s @ w, s @ w, s @ w]


@ur_body
def ur_mul_invariant(x, s, w):
    u = _pend(x)
    return fm.psum(u * s, "tp"), fm.psum(u * w, "tp"), fm.psum(u * 2.0, "tp"), fm.psum(3.0 * u, "tp")


@ur_reference
def one_process_ur_mul_invariant(x, s, w):
    t = tp_sum(x)
    return [t * s, t * w, t * 2.0, 3.0 * t]


@ur_body
def ur_div_mean(x, s):
    u = _pend(x)
    return fm.psum(u / s, "tp"), fm.psum(u / 2.0, "tp"), fm.psum(u.mean(0), "tp")


@ur_reference
def one_process_ur_div_mean(x, s):
    t = tp_sum(x)
    return [t / s, t / 2.0, per_dp(t, lambda b: b.mean(0))]


@ur_body
def ur_flip_cumsum(x):
    u = _pend(x)
    return fm.psum(torch.flip(u, (0,)), "tp"), fm.psum(torch.cumsum(u, 0), "tp")


@ur_reference
def one_process_ur_flip_cumsum(x):
    t = tp_sum(x)
    return [per_dp(t, lambda b: torch.flip(b, (0,))), per_dp(t, lambda b: torch.cumsum(b, 0))]


@ur_body
def ur_matmul_out_unreduced(x, w):
    return _pend(x) @ w


@ur_reference
def one_process_ur_matmul_out_unreduced(x, w):
    return [tp_sum(x) @ w]


@ur_body
def ur_in_specs_matmul(u, w):
    return fm.psum_scatter(-(u @ w), "tp", dim=0, tiled=True)


@ur_reference
def one_process_ur_in_specs_matmul(members, w):
    return [-(members.sum(0) @ w)]


@ur_body
def ur_all_gather(x):
    return fm.all_gather(_pend(x), "tp", dim=0, tiled=True)


@ur_body
def ur_all_gather_invariant(x):
    return fm.all_gather(_pend(x), "tp", dim=0, tiled=True, to="invariant")


@ur_body
def ur_ppermute(x):
    return fm.psum(fm.ppermute(_pend(x), "tp", ring(4)), "tp")


@ur_body
def ur_all_to_all(x):
    return fm.all_to_all(_pend(x), "tp", 0, 1, tiled=True)


@ur_body
def ur_pmax(x):
    return fm.pmax(_pend(x), "tp")


@ur_body
def ur_pmin(x):
    return fm.pmin(_pend(x), "tp")


@ur_body
def ur_add_invariant(x, w):
    return fm.psum(_pend(x) + w, "tp")


@ur_body
def ur_add_number(x):
    return fm.psum(_pend(x) + 1.0, "tp")


@ur_body
def ur_add_other_axes(x, y):
    return fm.psum(fm.psum(_pend(x, "tp") + _pend(y, "dp"), "tp"), "dp")


@ur_body
def ur_tanh(x):
    return fm.psum(torch.tanh(_pend(x)), "tp")


@ur_body
def ur_relu(x):
    return fm.psum(torch.relu(_pend(x)), "tp")


@ur_body
def ur_exp(x):
    return fm.psum(torch.exp(_pend(x)), "tp")


@ur_body
def ur_div_by_pending(x, s):
    return fm.psum(s / _pend(x), "tp")


@ur_body
def ur_product_of_two(x, y):
    return fm.psum(_pend(x) * _pend(y), "tp")


@ur_body
def ur_matmul_of_two(x, y):
    return fm.psum(_pend(x) @ _pend(y).T, "tp")


@ur_body
def ur_pcast_invariant(w):
    return fm.psum(_pend(w), "tp")


@ur_body
def ur_pcast_twice(x):
    return fm.psum(_pend(_pend(x)), "tp")


@ur_body
def ur_psum_mixed_tuple(x):
    return fm.psum(_pend(x), ("dp", "tp"))


@ur_body
def ur_out_replicated(x):
    return _pend(x)


@ur_body
def ur_out_varying(x):
    return x


def _reduced(x: torch.Tensor, axis: Any = "tp") -> torch.Tensor:
    return fm.pcast(x, axis, to="reduced")


@ur_body
def rd_pcast_reduced(x, w):
    u, r = _pend(x), note("r", _reduced(w))
    return fm.psum(note("u * r", u * r), "tp"), fm.psum(r * u, "tp")


@ur_reference
def one_process_rd_pcast_reduced(x, w):
    return [tp_sum(x) * w, w * tp_sum(x)]


@ur_body
def rd_ops_of_reduced(x, w):
    r = _reduced(w)
    t = note("sin r", torch.sin(r))
    rr = note("r * r", r * r)
    note("sum", rr.sum())  # (JAX drops reduced where a reduced scalar is broadcast: the sum is not used)
    return fm.psum(_pend(x) * (t * rr), "tp")


@ur_reference
def one_process_rd_ops_of_reduced(x, w):
    return [tp_sum(x) * (torch.sin(w) * (w * w))]


@ur_body
def rd_in_specs(x, w):
    note("w", w)
    return note("y", torch.tanh(x @ w))


@ur_reference
def one_process_rd_in_specs(x, w):
    return [torch.tanh(x @ w)]


@ur_body
def rd_out_specs(w):
    return _reduced(w)


@ur_reference
def one_process_rd_out_specs(w):
    return [w * 1]


@ur_body
def rd_relabel(x, w):
    return note("x * r", x * _reduced(w))


@ur_reference
def one_process_rd_relabel(x, w):
    return [x * torch.cat([w] * 4)]


@ur_body
def rd_relabel_and_pvary(x, w):
    return x * _reduced(w)


@ur_reference
def one_process_rd_relabel_and_pvary(x, w):
    return [x * torch.cat([w] * 4)]


@ur_body
def rd_times_number(x, w):
    return fm.psum(_pend(x) * (2.0 * _reduced(w) + 1.0), "tp")


@ur_reference
def one_process_rd_times_number(x, w):
    return [tp_sum(x) * (2.0 * w + 1.0)]


@ur_body
def rd_matmul(x, w):
    return fm.psum(_pend(x) @ _reduced(w), "tp")


@ur_reference
def one_process_rd_matmul(x, w):
    return [tp_sum(x) @ w]


@ur_body
def rd_tanh(x, w):
    return fm.psum(_pend(x) * torch.tanh(_reduced(w)), "tp")


@ur_reference
def one_process_rd_tanh(x, w):
    return [tp_sum(x) * torch.tanh(w)]


@ur_body
def rd_div(x, s):
    return fm.psum(_pend(x) / _reduced(s), "tp")


@ur_reference
def one_process_rd_div(x, s):
    return [tp_sum(x) / s]


@ur_body
def rd_plus_invariant(w):
    return _reduced(w) + w


@ur_body
def rd_psum(w):
    return fm.psum(_reduced(w), "tp")


@ur_body
def rd_all_gather(w):
    return fm.all_gather(_reduced(w), "tp", dim=0, tiled=True)


@ur_body
def rd_pcast_varying(x):
    return _reduced(x)


@ur_body
def rd_pcast_twice(w):
    return _reduced(_reduced(w))


@ur_body
def rd_out_mismatch(w):
    return w


@ur_body
def rd_out_unnamed(w):
    return _reduced(w)


@ur_body
def mx_pmax(m):
    note("m", m)
    return fm.pmax(m, "tp"), fm.pmax(note("amax", torch.amax(m, 1)), "tp"), fm.pmax(m.T, "tp")


@ur_reference
def one_process_mx_pmax(m):
    value = m.amax(0)  # the members' max
    return [value, value.amax(1), value.T]


@ur_body
def mn_pmin(m):
    return fm.pmin(m.reshape(-1), "tp"), fm.pmin(torch.cat([m, m]), "tp")


@ur_reference
def one_process_mn_pmin(m):
    value = m.amin(0)
    return [per_dp(value, lambda b: b.reshape(-1)), per_dp(value, lambda b: torch.cat([b, b]))]


@ur_body
def mx_out(m):
    return m.T


@ur_reference
def one_process_mx_out(m):
    return [m.amax(0).T]


@ur_body
def mx_psum(m):
    return fm.psum(m, "tp")


@ur_body
def mx_pmin(m):
    return fm.pmin(m, "tp")


@ur_body
def mx_add(m):
    return fm.pmax(m + m, "tp")


@ur_body
def mx_scale(m):
    return fm.pmax(m * 2.0, "tp")


@ur_body
def mx_sum(m):
    return fm.pmax(m.sum(1), "tp")


@ur_body
def mx_amin(m):
    return fm.pmax(m.amin(1), "tp")


def _members_to_pending(rm: Any, program: programs.UnreducedProgram, i: int, members: torch.Tensor) -> Any:
    """Input ``i`` given as its stacked members: a DTensor with ``Partial("sum")`` on its pending axes,
    made by a first region that takes member ``k`` on index ``k`` of those axes and pcasts it. A pending
    max (min): the same first region untyped, trusting an out_spec of that kind (a ``Partial("max")``)."""
    pending, spec, kind = program.pending_in(i), program.in_specs[i], program.kind_in(i)
    axis = programs.axis_entry(pending)
    if kind != "sum":  # no pcast makes a pending max: an untyped region's out_specs are trusted
        return fm.shard_map(lambda m: m[0], mesh=rm, in_specs=(fm.P(axis, *spec),), check_vma=False,
                            out_specs=fm.P(*spec, unreduced=set(pending), unreduced_kind=kind))(members)
    return fm.shard_map(lambda m: fm.pcast(m[0], axis, to="unreduced"), mesh=rm,
                        in_specs=(fm.P(axis, *spec),), out_specs=fm.P(*spec, unreduced=set(pending)))(members)


def _enter(rm: Any, program: programs.UnreducedProgram, i: int, a: torch.Tensor) -> Any:
    """Input ``i`` as the region takes it: pending (:func:`_members_to_pending`), reduced (a Replicate
    DTensor of the full value, whose gradient DTensor's own backward sums), or the full tensor."""
    if program.pending_in(i):
        return _members_to_pending(rm, program, i, a)
    if program.reduced_in(i):
        assert not any(program.in_specs[i]), "a reduced input of the oracle is replicated otherwise"
        return DTensor.from_local(a, rm.device_mesh, [Replicate()] * rm.mesh.ndim)
    return a


def execute_unreduced(program: programs.UnreducedProgram, rank: int | None = None) -> dict[str, Any]:
    """Like :func:`execute`, for ``programs.UNREDUCED``; ``types``: what ``note`` recorded, and per result
    ``shardings``: (``fm.sharding_of(result)``, the out_spec's sharding, whether they are equal), as reprs."""
    if rank is not None and rank != dist.get_rank():
        raise AssertionError(f"run on rank {dist.get_rank()} but asked for rank {rank}")
    rm = fm.realize(fm.make_mesh(program.sizes, program.axes), timeout=GROUP_TIMEOUT, check=CHECK_S)
    args = [torch.tensor(a, dtype=torch.float64, requires_grad=program.grad) for a in program.inputs()]
    result: dict[str, Any] = {"rank": dist.get_rank(), "outputs": [], "grads": [], "placements": [],
                              "shardings": [], "types": {}, "error": None}
    UR_TYPES.clear()
    entered = [_enter(rm, program, i, a) for i, a in enumerate(args)]
    in_specs, out_specs = programs.spec_trees(program, fm.P, lambda kind: kind)
    try:
        out = fm.shard_map(UR_BODIES[program.name], mesh=rm, in_specs=in_specs, out_specs=out_specs)(*entered)
    except fm.MeshError as e:
        result["error"] = (type(e).__name__, str(e), [k.__name__ for k in type(e).__mro__])
        return result
    result["types"] = dict(UR_TYPES)
    outs = list(out) if isinstance(out, tuple) else [out]
    for i, o in enumerate(outs):
        spec = program.out_specs[i]
        kind = program.kind_out(i) if program.pending_out(i) else None
        want = fm.NamedSharding(rm.mesh, fm.P(*spec, unreduced=set(program.pending_out(i)), unreduced_kind=kind,
                                              reduced=set(program.reduced_out(i))))
        got = tuple(getattr(o, "placements", ()))
        result["placements"].append((type(o).__name__, repr(got), repr(want.placements), got == want.placements))
        described = fm.sharding_of(o) if type(o).__name__ == "DTensor" else None
        trimmed = list(spec)  # sharding_of writes no trailing None, and specs compare as written
        while trimmed and trimmed[-1] is None:
            trimmed.pop()
        # (a DTensor has no reduced: a reduced result is Replicate there, and sharding_of says no reduced=)
        said = fm.NamedSharding(rm.mesh, fm.P(*trimmed, unreduced=set(program.pending_out(i)), unreduced_kind=kind))
        result["shardings"].append((repr(described), repr(said), described == said))
    fulls = [o.full_tensor() for o in outs]
    result["outputs"] = [f.detach().numpy().copy() for f in fulls]
    if program.grad:
        cots = [torch.tensor(program.cotangent(i, f.shape)) for i, f in enumerate(fulls)]
        sum((f * c).sum() for f, c in zip(fulls, cots)).backward()
        result["grads"] = [a.grad.detach().numpy().copy() if a.grad is not None else np.zeros(a.shape)
                           for a in args]
    return result


def run_unreduced(name: str, rank: int | None = None) -> dict[str, Any]:
    """One program of ``programs.UNREDUCED`` on this rank (the pool calls it on every rank)."""
    return execute_unreduced(programs.UNREDUCED_BY_NAME[name], rank)


def one_process_unreduced(name: str) -> dict[str, Any]:
    """The program's reference in one process (no mesh): its full results and the full gradients of
    the same loss as :func:`execute_unreduced`."""
    program = programs.UNREDUCED_BY_NAME[name]
    args = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in program.inputs()]
    fulls = UR_REFERENCES[name](*args)
    if not program.grad:
        return {"outputs": [f.detach().numpy().copy() for f in fulls], "grads": []}
    cots = [torch.tensor(program.cotangent(i, f.shape)) for i, f in enumerate(fulls)]
    sum((f * c).sum() for f, c in zip(fulls, cots)).backward()
    return {"outputs": [f.detach().numpy().copy() for f in fulls],
            "grads": [a.grad.detach().numpy().copy() if a.grad is not None else np.zeros(a.shape) for a in args]}


_missing = [p.name for p in programs.UNREDUCED if p.name not in UR_BODIES]
assert not _missing, f"unreduced programs without an fm body: {_missing}"
_missing = [p.name for p in programs.UNREDUCED if p.one_process and p.name not in UR_REFERENCES]
assert not _missing, f"unreduced programs held to one process without a reference: {_missing}"
del _missing
