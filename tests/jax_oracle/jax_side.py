"""The JAX side of the oracle: every program of ``programs.py`` under ``jax.shard_map`` (imports jax, never torch).

Run by ``test_vs_jax.py`` in the side venv, once per session::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv-jax-0.12.0.1/bin/python tests/jax_oracle/jax_side.py OUT.npz

It runs EVERY program in this one process (JAX's start-up is paid once) on 8 host CPU devices,
mesh axes ``AxisType.Auto``, float64, ``check_vma=True``, and saves into ``OUT.npz``:
``<name>/out/<i>`` (global results), ``<name>/grad/<j>`` (the gradient of
``sum_i sum(out_i * cot_i)`` with respect to input ``j``) and ``__meta__``, a JSON string with
``jax.__version__`` and, per program, the exception JAX raised (type, message, and the kind of
failure read from the message) or ``null``.

jax is imported lazily (in :func:`main`) so that pytest's ``--doctest-modules`` collection can
import this file from the torch venv, where jax is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `tests.jax_oracle` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.jax_oracle import programs
from tests.jax_oracle.programs import Program, ring

jax: Any = None
jnp: Any = None
lax: Any = None

BODIES: dict[str, Callable[..., Any]] = {}
PROGRAM = programs.BY_NAME


def body(fn: Callable[..., Any]) -> Callable[..., Any]:
    assert fn.__name__ in programs.BY_NAME, fn.__name__
    BODIES[fn.__name__] = fn
    return fn


# -- the programs (names and meanings in programs.py) ---------------------------------------------


@body
def row_parallel_matmul(x, w):
    return lax.psum(x @ w, "y")


@body
def mlp_column_row(x, w1, b1, w2, b2):
    h = jax.nn.relu(x @ w1 + b1)
    return lax.psum(h @ w2, "y") + b2


@body
def replicated_weight_dp(x, w):
    y = jnp.tanh(x @ w)
    return y, lax.pmean(jnp.sum(y * y), "x")


@body
def sequence_parallel(x, w1, w2):
    full = lax.all_gather(x, "y", axis=1, tiled=True)
    h = jax.nn.relu(full @ w1)
    return lax.psum_scatter(h @ w2, "y", scatter_dimension=1, tiled=True) + x


@body
def all_to_all_one_axis(x):
    a = lax.all_to_all(x, "y", 1, 0, tiled=True)
    return a * jnp.cos(a)


@body
def all_to_all_tuple(x):
    return (lax.all_to_all(x, ("x", "y"), 1, 0, tiled=True),
            lax.all_to_all(x, ("y", "x"), 1, 0, tiled=True) * 2.0)


@body
def ppermute_ring(x):
    return lax.ppermute(x, "y", ring(4)), lax.ppermute(x * x, "y", [(0, 1), (1, 2)])


@body
def ppermute_tuple(x):
    # JAX's ppermute reads its pairs in mesh order whatever the tuple's order; the ring over
    # ("y", "x") in the tuple's own order (axis_index's order, and ours) is translated.
    return (lax.ppermute(x, ("x", "y"), [(i, (3 * i + 1) % 8) for i in range(8)]),
            lax.ppermute(jnp.sin(x), *programs.in_mesh_order(PROGRAM["ppermute_tuple"], ("y", "x"), ring(8))))


@body
def axis_index_arithmetic(x):
    r1 = x * (lax.axis_index("y") + 1) * lax.axis_size("y") + lax.axis_index("x")
    r2 = x - lax.axis_index(("x", "y"))
    return r1, r2


@body
def axis_index_under_replicated_out(w):
    return w * lax.axis_index("y")


@body
def psum_of_invariant(w, v):
    return lax.psum(w, "x"), lax.pmean(w, "y"), lax.psum(w, ("x", "y")), lax.psum(v, "y")


@body
def out_specs_varying(x):
    return x * 2.0


@body
def out_specs_missing_axis(x):
    return x * 2.0


@body
def out_specs_second_result(x):
    return lax.psum(x, "y"), x + 1.0


@body
def out_specs_ok_after_psum(x):
    return lax.psum(x * x, "y")


@body
def invariant_out_named_axis(w, x):
    return w * 2.0, lax.psum(jnp.sin(x), "y")


@body
def all_gather_invariant(x, w):
    return (lax.all_gather(x, "y", axis=0, tiled=True, to="invarying"),
            lax.all_gather(w * w, "y", axis=0, tiled=True, to="invarying"))


@body
def all_gather_varying_under_replicated_out(x):
    return lax.all_gather(x, "y", axis=0, tiled=True)


@body
def invariant_into_collectives(w):
    return (lax.all_gather(w, "y", axis=0, tiled=True),
            lax.ppermute(w * w, "y", ring(4)),
            lax.psum_scatter(jnp.sin(w), "y", scatter_dimension=0, tiled=True),
            lax.all_to_all(jnp.cos(w), "y", 0, 0, tiled=True))


@body
def explicit_pcast(x, w):
    wv = lax.pcast(w, "x", to="varying")
    return x @ wv, jnp.tanh(x) @ lax.pcast(w, "x", to="varying")


@body
def pcast_of_varying(x):
    return lax.pcast(x, "y", to="varying")


@body
def psum_mixed_tuple(x):
    return lax.psum(x, ("x", "y"))


@body
def psum_scatter_mixed_tuple(x):
    return lax.psum_scatter(x, ("x", "y"), scatter_dimension=0, tiled=True)


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
    return x * (lax.axis_index("y") + 1) * lax.axis_size("y")


@body
def partial_gather_permute(x):
    return lax.all_gather(x, "y", axis=0, tiled=True, to="invarying"), lax.ppermute(jnp.sin(x), "y", ring(4))


@body
def partial_out_specs_varying(x):
    return x * 2.0


@body
def partial_psum_over_auto_axis(x):
    return lax.psum(x, "x")


@body
def partial_in_spec_auto_axis(x):
    return x


@body
def partial_out_spec_auto_axis(x):
    return x


@body
def nested_disjoint(x):
    from jax.sharding import PartitionSpec as P

    inner = jax.shard_map(lambda z: (lax.psum(z, "x"), lax.psum(z * z, "y")), in_specs=P("x"),
                          out_specs=(P(), P("x")), axis_names={"x"})
    a, b = inner(x)
    return a * 2.0, b


@body
def nested_inner_out_specs_varying(x):
    from jax.sharding import PartitionSpec as P

    return jax.shard_map(lambda z: z * 2.0, in_specs=P("x"), out_specs=P(), axis_names={"x"})(x)


@body
def nested_same_axis(x):
    from jax.sharding import PartitionSpec as P

    return jax.shard_map(lambda z: z, in_specs=P("y"), out_specs=P("y"), axis_names={"y"})(x)


def generated_body(program: Program) -> Callable[..., Any]:
    """The chain of ``program.steps`` (the same interpreter as ``fm_side.generated_body``)."""

    def run(x, w):
        for step in program.steps:
            op, args = step[0], step[1:]
            if op == "mul_w":
                x = x * w
            elif op == "sin":
                x = jnp.sin(x)
            elif op == "axis_index":
                x = x * (lax.axis_index(args[0]) + 1)
            elif op == "psum":
                x = lax.psum(x, args[0])
            elif op == "pmean":
                x = lax.pmean(x, args[0])
            elif op == "pcast":
                x = lax.pcast(x, args[0], to="varying")
            elif op == "ppermute":
                pairs = ring(programs.axis_size(program, args[0]), args[1])
                x = lax.ppermute(x, *programs.in_mesh_order(program, args[0], pairs))
            elif op == "all_gather":
                x = lax.all_gather(x, args[0], axis=args[1], tiled=True)
            elif op == "all_gather_invariant":
                x = lax.all_gather(x, args[0], axis=args[1], tiled=True, to="invarying")
            elif op == "psum_scatter":
                x = lax.psum_scatter(x, args[0], scatter_dimension=args[1], tiled=True)
            elif op == "all_to_all":
                x = lax.all_to_all(x, args[0], args[1], args[2], tiled=True)
            else:
                raise AssertionError(f"unknown step {step}")
        return x

    return run


# -- running ---------------------------------------------------------------------------------------


def failure_kind(message: str) -> str:
    """Which rule JAX's message is about: the divisibility of an argument, or a type (vma) check."""
    if "not evenly divisible" in message:
        return programs.DIVISIBILITY
    if ("require replication which can't be statically inferred" in message
            or "can only accept axis_name which corresponds to" in message
            or "Unsupported pcast" in message
            or "Found an unbound axis name" in message):  # a collective over an axis that is not manual
        return programs.VMA
    if "argument must refer to an axis marked as manual" in message:
        return programs.SPEC
    return "other"


def run_program(program: Program) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    from jax.sharding import AxisType, PartitionSpec

    mesh = jax.make_mesh(program.sizes, program.axes, axis_types=(AxisType.Auto,) * len(program.axes))
    fn = generated_body(program) if program.generated else BODIES[program.name]
    f = jax.shard_map(fn, mesh=mesh, in_specs=programs.in_tree(program, PartitionSpec),
                      out_specs=programs.out_tree(program, PartitionSpec), check_vma=True,
                      axis_names=frozenset(program.axis_names))
    args = [jnp.asarray(a) for a in program.inputs()]

    def as_list(out: Any) -> list[Any]:
        return list(out) if isinstance(out, tuple) else [out]

    try:
        shapes = [o.shape for o in as_list(jax.eval_shape(f, *args))]  # trace-time errors surface here
        cots = [jnp.asarray(program.cotangent(i, s)) for i, s in enumerate(shapes)]

        def forward_and_grads(*a):
            if not program.grad:
                return as_list(f(*a)), []
            out, vjp = jax.vjp(f, *a)
            return as_list(out), list(vjp(tuple(cots) if isinstance(out, tuple) else cots[0]))

        outs, grads = jax.jit(forward_and_grads)(*args)
    except Exception as e:  # noqa: BLE001 - recorded for the comparison
        msg = str(e)
        return [], [], {"error": [type(e).__name__, msg], "kind": failure_kind(msg)}
    return ([np.asarray(o) for o in outs], [np.asarray(g) for g in grads],
            {"error": None, "kind": None, "out_shapes": [list(s) for s in shapes]})


def main(argv: list[str]) -> int:
    return _run_suite(argv, programs.ALL, [p.name for p in programs.HAND_WRITTEN if p.name not in BODIES],
                      run_program, "programs")


def _run_suite(argv: list[str], listing: Any, missing: Any, run: Any, what: str) -> int:
    """Run ``listing`` on 8 host devices and save every output and gradient to ``argv[1]`` (an .npz).

    ``missing``: the programs that have no JAX body (computed once jax is imported, the bodies
    need it); ``run``: program -> (outputs, gradients, info)."""
    global jax, jnp, lax
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT.npz", file=sys.stderr)
        return 2
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count=8" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax as _jax
    import jax.numpy as _jnp
    from jax import lax as _lax

    jax, jnp, lax = _jax, _jnp, _lax
    jax.config.update("jax_enable_x64", True)
    if len(jax.devices()) != 8:
        print(f"expected 8 host devices, got {jax.devices()}", file=sys.stderr)
        return 3
    if missing:
        print(f"programs without a JAX body: {missing}", file=sys.stderr)
        return 4

    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"jax": jax.__version__, "jaxlib": _jaxlib_version(), "programs": {}}
    t0 = time.monotonic()
    for program in listing:
        t = time.monotonic()
        outs, grads, info = run(program)
        info["seconds"] = round(time.monotonic() - t, 3)
        info["n_out"], info["n_grad"] = len(outs), len(grads)
        meta["programs"][program.name] = info
        for i, o in enumerate(outs):
            arrays[f"{program.name}/out/{i}"] = o
        for j, g in enumerate(grads):
            arrays[f"{program.name}/grad/{j}"] = g
    meta["seconds"] = round(time.monotonic() - t0, 3)
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez(argv[1], **arrays)
    for name, info in meta["programs"].items():
        kind = f" ({info['kind']})" if info.get("kind") else ""
        status = "raises " + info["error"][0] + kind if info["error"] else "ok"
        print(f"{name:42s} {status:34s} {info['seconds']:.2f} s")
    print(f"jax {meta['jax']}: {len(listing)} {what} in {meta['seconds']:.1f} s")
    return 0


def _jaxlib_version() -> str:
    import jaxlib

    return getattr(jaxlib, "__version__", "?")


if __name__ == "__main__":
    sys.exit(main(sys.argv))


# -- pending sums (unreduced): programs.UNREDUCED, run by main_unreduced --------------------------------
#
# JAX (0.10.2 and 0.12) types unreduced values only on a mesh whose axes are all Explicit: there an argument
# must already have its in_spec's sharding (``reshard`` first, a slice with no communication), an
# argument unreduced over A is made by a first shard_map from its stacked members, and every result
# is ``reshard``-ed to ``P()`` (a result unreduced over A is reduced so). ``note`` records the type of a
# value in the body (read from ``jax.typeof``'s ``{V:..., U:...}``) for the comparison of types.

UR_BODIES: dict[str, Callable[..., Any]] = {}
UR_TYPES: dict[str, tuple[list[str], list[str]]] = {}


def ur_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    assert fn.__name__ in programs.UNREDUCED_BY_NAME, fn.__name__
    UR_BODIES[fn.__name__] = fn
    return fn


def note(key: str, value: Any) -> Any:
    """Record ``jax.typeof(value)``'s varying and unreduced axes under ``key``; return ``value``."""
    import re

    text = str(jax.typeof(value))
    found: dict[str, set[str]] = {"V": set(), "U": set()}  # (R: reduced, read below)
    braces = re.search(r"\{([^{}]*)\}$", text)
    for kind, group, name in re.findall(r"([VUR]):(?:\(([^)]*)\)|(\w+))", braces.group(1) if braces else ""):
        if kind in found:
            found[kind].update(n.strip() for n in (group.split(",") if group else [name]))
    found["R"] = set()
    for kind, group, name in re.findall(r"(R):(?:\(([^)]*)\)|(\w+))", braces.group(1) if braces else ""):
        found["R"].update(n.strip() for n in (group.split(",") if group else [name]))
    UR_TYPES[key] = (sorted(found["V"]), sorted(found["U"]), sorted(found["R"]))
    return value


def _pend(v: Any, axis: Any = "tp") -> Any:
    return lax.pcast(v, axis, to="unreduced")


def _reduced(v: Any, axis: Any = "tp") -> Any:
    return lax.pcast(v, axis, to="reduced")


@ur_body
def ur_pcast_psum(x):
    return note("psum", lax.psum(note("u", _pend(x)), "tp"))


@ur_body
def ur_psum_scatter(x):
    u = note("u", _pend(x))
    return (note("scatter", lax.psum_scatter(u, "tp", scatter_dimension=1, tiled=True)),
            lax.psum_scatter(u, "tp", scatter_dimension=0, tiled=True))


@ur_body
def ur_add(x, y):
    return lax.psum(note("sum", _pend(x) + _pend(jnp.sin(y))), "tp")


@ur_body
def ur_reshape_sum(x):
    u = note("u", _pend(x))
    return lax.psum(note("reshaped", u.reshape(2, 16)).sum(0), "tp"), lax.psum(u.T, "tp")


@ur_body
def ur_shape_ops(x, y):
    u, v = _pend(x), _pend(y * y)
    return (lax.psum(jnp.concatenate([u, v], 1), "tp"), lax.psum(jnp.stack([u, v]), "tp"),
            lax.psum(u[1:3], "tp"), lax.psum(jnp.broadcast_to(u[None], (2, 4, 4)).sum(0), "tp"),
            lax.psum(u[None].squeeze(0), "tp"))


@ur_body
def ur_reorder_ops(x):
    u = _pend(x)
    return (lax.psum(jnp.roll(u, 1, 0), "tp"), lax.psum(jnp.triu(u), "tp"), lax.psum(jnp.swapaxes(u, 0, 1), "tp"),
            lax.psum(jnp.einsum("ij->j", u), "tp"), lax.psum(u.astype(jnp.float32).astype(jnp.float64), "tp"),
            lax.psum(jnp.copy(u), "tp"))


@ur_body
def ur_scale_reduced(x, s, w):
    u = _pend(x)
    return lax.psum(u * _reduced(s), "tp"), lax.psum(u * _reduced(w), "tp"), lax.psum(_reduced(w) * u, "tp")


@ur_body
def ur_out_specs(x):
    return _pend(x), _pend(x.sum(0), ("dp", "tp")), note("dp summed", lax.psum(_pend(x), "dp"))


@ur_body
def ur_in_specs(u, w):
    note("u", u)
    return lax.psum_scatter(u * _reduced(w), "tp", scatter_dimension=0, tiled=True), u


@ur_body
def ur_in_specs_two_axes(u):
    note("u", u)
    return note("tp summed", lax.psum(u, "tp")), lax.psum(u, ("dp", "tp"))


@ur_body
def ur_two_axes(x):
    u = note("u", _pend(x, ("dp", "tp")))
    return lax.psum(u, "tp"), lax.psum(u, ("dp", "tp")), lax.psum(lax.psum(u, "dp"), "tp")


@ur_body
def ur_row_parallel_sp(x, w, r):
    y = note("y", _pend(x @ w))
    return lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True) + r


@ur_body
def ur_accumulate(x1, x2, y):
    return lax.psum(_pend(x1.T @ y, "dp") + _pend(x2.T @ y, "dp"), "dp")


@ur_body
def ur_pmean(x):
    return lax.pmean(_pend(x), "tp")


@ur_body
def ur_neg(x):
    u = _pend(x)
    return lax.psum(note("neg", -u), "tp"), lax.psum(jnp.negative(u), "tp")


@ur_body
def ur_sub(x, y):
    return lax.psum(_pend(x) - _pend(y * y), "tp")


@ur_body
def ur_matmul_invariant(x, w):
    u = _pend(x)
    return (lax.psum(note("u @ w", u @ w), "tp"), lax.psum(jnp.einsum("ij,jk->ik", u, w), "tp"),
            lax.psum(u @ w, "tp"))


@ur_body
def ur_mul_invariant(x, s, w):
    u = _pend(x)
    return lax.psum(u * s, "tp"), lax.psum(u * w, "tp"), lax.psum(u * 2.0, "tp"), lax.psum(3.0 * u, "tp")


@ur_body
def ur_div_mean(x, s):
    u = _pend(x)
    return lax.psum(u / s, "tp"), lax.psum(u / 2.0, "tp"), lax.psum(u.mean(0), "tp")


@ur_body
def ur_flip_cumsum(x):
    u = _pend(x)
    return lax.psum(jnp.flip(u, 0), "tp"), lax.psum(jnp.cumsum(u, 0), "tp")


@ur_body
def ur_matmul_out_unreduced(x, w):
    return _pend(x) @ w


@ur_body
def ur_in_specs_matmul(u, w):
    return lax.psum_scatter(-(u @ w), "tp", scatter_dimension=0, tiled=True)


@ur_body
def ur_all_gather(x):
    return lax.all_gather(_pend(x), "tp", axis=0, tiled=True)


@ur_body
def ur_all_gather_invariant(x):
    return lax.all_gather(_pend(x), "tp", axis=0, tiled=True, to="invarying")


@ur_body
def ur_ppermute(x):
    return lax.psum(lax.ppermute(_pend(x), "tp", ring(4)), "tp")


@ur_body
def ur_all_to_all(x):
    return lax.all_to_all(_pend(x), "tp", 0, 1, tiled=True)


@ur_body
def ur_pmax(x):
    return lax.pmax(_pend(x), "tp")


@ur_body
def ur_pmin(x):
    return lax.pmin(_pend(x), "tp")


@ur_body
def ur_add_invariant(x, w):
    return lax.psum(_pend(x) + w, "tp")


@ur_body
def ur_add_number(x):
    return lax.psum(_pend(x) + 1.0, "tp")


@ur_body
def ur_add_other_axes(x, y):
    return lax.psum(lax.psum(_pend(x, "tp") + _pend(y, "dp"), "tp"), "dp")


@ur_body
def ur_tanh(x):
    return lax.psum(jnp.tanh(_pend(x)), "tp")


@ur_body
def ur_relu(x):
    return lax.psum(jax.nn.relu(_pend(x)), "tp")


@ur_body
def ur_exp(x):
    return lax.psum(jnp.exp(_pend(x)), "tp")


@ur_body
def ur_div_by_pending(x, s):
    return lax.psum(s / _pend(x), "tp")


@ur_body
def ur_product_of_two(x, y):
    return lax.psum(_pend(x) * _pend(y), "tp")


@ur_body
def ur_matmul_of_two(x, y):
    return lax.psum(_pend(x) @ _pend(y).T, "tp")


@ur_body
def ur_pcast_invariant(w):
    return lax.psum(_pend(w), "tp")


@ur_body
def ur_pcast_twice(x):
    return lax.psum(_pend(_pend(x)), "tp")


@ur_body
def ur_psum_mixed_tuple(x):
    return lax.psum(_pend(x), ("dp", "tp"))


@ur_body
def ur_out_replicated(x):
    return _pend(x)


@ur_body
def ur_out_varying(x):
    return x


@ur_body
def rd_pcast_reduced(x, w):
    u, r = _pend(x), note("r", _reduced(w))
    return lax.psum(note("u * r", u * r), "tp"), lax.psum(r * u, "tp")


@ur_body
def rd_ops_of_reduced(x, w):
    r = _reduced(w)
    t = note("sin r", jnp.sin(r))
    rr = note("r * r", r * r)
    note("sum", rr.sum())  # (JAX drops reduced where a reduced scalar is broadcast: the sum is not used)
    return lax.psum(_pend(x) * (t * rr), "tp")


@ur_body
def rd_in_specs(x, w):
    note("w", w)
    return note("y", jnp.tanh(x @ w))


@ur_body
def rd_out_specs(w):
    return _reduced(w)


@ur_body
def rd_relabel(x, w):
    return note("x * r", x * _reduced(w))


@ur_body
def rd_relabel_and_pvary(x, w):
    return x * _reduced(w)


@ur_body
def rd_times_number(x, w):
    return lax.psum(_pend(x) * (2.0 * _reduced(w) + 1.0), "tp")


@ur_body
def rd_matmul(x, w):
    return lax.psum(_pend(x) @ _reduced(w), "tp")


@ur_body
def rd_tanh(x, w):
    return lax.psum(_pend(x) * jnp.tanh(_reduced(w)), "tp")


@ur_body
def rd_div(x, s):
    return lax.psum(_pend(x) / _reduced(s), "tp")


@ur_body
def rd_plus_invariant(w):
    return _reduced(w) + w


@ur_body
def rd_psum(w):
    return lax.psum(_reduced(w), "tp")


@ur_body
def rd_all_gather(w):
    return lax.all_gather(_reduced(w), "tp", axis=0, tiled=True)


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
    return lax.pmax(m, "tp"), lax.pmax(note("amax", jnp.max(m, axis=1)), "tp"), lax.pmax(m.T, "tp")


@ur_body
def mn_pmin(m):
    return lax.pmin(m.reshape(-1), "tp"), lax.pmin(jnp.concatenate([m, m]), "tp")


@ur_body
def mx_out(m):
    return m.T


@ur_body
def mx_psum(m):
    return lax.psum(m, "tp")


@ur_body
def mx_pmin(m):
    return lax.pmin(m, "tp")


@ur_body
def mx_add(m):
    return lax.pmax(m + m, "tp")


@ur_body
def mx_scale(m):
    return lax.pmax(m * 2.0, "tp")


@ur_body
def mx_sum(m):
    return lax.pmax(m.sum(1), "tp")


@ur_body
def mx_amin(m):
    return lax.pmax(jnp.min(m, axis=1), "tp")


def run_unreduced_program(program: programs.UnreducedProgram
                          ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """One program of ``programs.UNREDUCED`` on an Explicit mesh: its global results and gradients, or its error."""
    from jax.sharding import AxisType, PartitionSpec, reshard

    mesh = jax.make_mesh(program.sizes, program.axes, axis_types=(AxisType.Explicit,) * len(program.axes))

    def kind_of(name: str) -> Any:
        from jax.sharding import UnreducedKind  # JAX 0.12 (0.10.2 has none: its programs record the error)

        return getattr(UnreducedKind, name)

    def enter(i: int, a: Any) -> Any:
        pending, reduced = program.pending_in(i), program.reduced_in(i)
        if reduced:
            return reshard(a, PartitionSpec(*program.in_specs[i], reduced=set(reduced)))
        if not pending:
            return reshard(a, PartitionSpec(*program.in_specs[i]))
        members = PartitionSpec(programs.axis_entry(pending), *program.in_specs[i])
        if program.kind_in(i) != "sum":  # the members' max (min) left pending: a reduce to an out_sharding of it
            from jax.sharding import NamedSharding

            kind = kind_of(program.kind_in(i))
            prim = lax.reduce_max_p if program.kind_in(i) == "max" else lax.reduce_min_p
            out = NamedSharding(mesh.abstract_mesh, PartitionSpec(*program.in_specs[i], unreduced=set(pending),
                                                                  unreduced_kind=kind))
            return prim.bind(reshard(a, members), axes=(0,), out_sharding=out)
        make = jax.shard_map(lambda m: lax.pcast(m[0], programs.axis_entry(pending), to="unreduced"), mesh=mesh,
                             in_specs=members, out_specs=PartitionSpec(*program.in_specs[i], unreduced=set(pending)),
                             check_vma=True)
        return make(reshard(a, members))

    def whole(*args: Any) -> list[Any]:
        in_specs, out_specs = programs.spec_trees(program, PartitionSpec, kind_of)
        main_map = jax.shard_map(UR_BODIES[program.name], mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=True)
        out = main_map(*(enter(i, a) for i, a in enumerate(args)))
        outs = list(out) if isinstance(out, tuple) else [out]
        # every result replicated (reduced first where it is pending), so the cotangents need no sharding
        return [reshard(o, PartitionSpec()) for o in outs]

    args = [jnp.asarray(a) for a in program.inputs()]
    UR_TYPES.clear()
    try:
        with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(mesh):
            shapes = [o.shape for o in jax.eval_shape(whole, *args)]
            cots = [jnp.asarray(program.cotangent(i, s)) for i, s in enumerate(shapes)]

            def forward_and_grads(*a: Any) -> tuple[list[Any], list[Any]]:
                if not program.jax_grad or not program.grad:  # a pending max has no gradient in JAX
                    return whole(*a), []
                outs, vjp = jax.vjp(whole, *a)
                # a reduced argument's cotangent is unreduced: reduced here (replicated ones are unchanged)
                return outs, [reshard(g, PartitionSpec()) for g in vjp(cots)]

            outs, grads = jax.jit(forward_and_grads)(*args)
            outs, grads = [np.asarray(o) for o in outs], [np.asarray(g) for g in grads]
    except Exception as e:  # noqa: BLE001 - recorded for the comparison
        return [], [], {"error": [type(e).__name__, str(e)], "types": dict(UR_TYPES)}
    return outs, grads, {"error": None, "types": dict(UR_TYPES), "out_shapes": [list(s) for s in shapes]}


def main_unreduced(argv: list[str]) -> int:
    """Like :func:`main`, for ``programs.UNREDUCED``: ``python -c '...main_unreduced(sys.argv)' OUT.npz``."""
    return _run_suite(argv, programs.UNREDUCED, [p.name for p in programs.UNREDUCED if p.name not in UR_BODIES],
                      run_unreduced_program, "unreduced programs")
