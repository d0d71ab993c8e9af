"""Fuzz the seeing and planning helpers: visualize, visualize_sharding, mesh_from_order,
order_axes and the command line (``python -m functional_mesh show``, run in-process).

The command line refuses bad arguments by exiting with status 2 and a message on stderr; the
harness turns that exit into a ``MeshError`` carrying the message, so the one fuzz rule applies:
the message must name the bad value, and nothing else (a traceback) may escape.
"""

from __future__ import annotations

import contextlib
import io

from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import Mesh, NamedSharding, P
from functional_mesh.__main__ import main as cli_main
from tests.fuzz._harness import (
    _OBJ,
    BAD_INTS,
    Registry,
    bad,
    fresh_name,
    int_like,
    is_open,
    misspell,
    pick,
    valid,
)
from tests.fuzz.test_fuzz_sharding import specs_for
from tests.strategies import derived_meshes, factorizations

REG = Registry()  # the test is made at the end of the module, after every entry point registered

TOKENS = ("tp", "cp", "ep", "dp", "pp", "etp", "dp_shard")


def _check(cond: bool, what: object) -> None:
    assert cond, what


def flags_case(draw, api: str, call, culprit_default=None):
    """A bad ``color=`` or ``max_side=`` (shared by both pictures)."""
    if draw(st.booleans()):
        v = pick(draw, ["yes", 1, 0, None, _OBJ, "always"])
        return bad(f"{api}(color={v!r})", call(color=v), v)
    v = draw(st.integers(-3, 1)) if draw(st.booleans()) else pick(draw, BAD_INTS)
    return bad(f"{api}(max_side={v!r})", call(max_side=v), v)


@REG.entry("visualize")
def visualize_case(draw):
    m = draw(derived_meshes(32))
    axis = pick(draw, (None,) + m.axis_names)
    max_side = draw(st.integers(2, 20))

    def call(mesh=m, axis=axis, color=False, max_side=max_side):
        return lambda: fm.visualize(mesh, axis, color=color, max_side=max_side)

    def check(text):
        assert isinstance(text, str) and text.startswith(repr(m)), text[:200]

    kind = pick(draw, ["valid"] * 2 + ["int-like", "color", "mesh-type", "axis", "flags"] + (
        [] if is_open("visualize-huge") else ["huge"]))
    if kind == "valid":
        return valid(f"visualize({m!r}, {axis!r}, max_side={max_side})", call(), check)
    if kind == "int-like":
        return valid("visualize with an int-like max_side", call(max_side=int_like(draw, max_side)), check)
    if kind == "color":
        return valid("visualize(color=True)", call(color=True), lambda text: _check(isinstance(text, str), text))
    if kind == "huge":  # pictures are elided: a symbolic mesh of any size draws in bounded time
        big = fm.make_mesh((2**30, 2**30, 4), ("a", "b", "c"))
        sub = big[pick(draw, [("c",), ("b", "c"), ("c", "a"), ("a", "b", "c")])]
        return valid(f"visualize({sub!r})", call(mesh=sub, axis=None),
                     lambda text: _check(text.startswith(repr(sub)) and len(text) < 100_000, text[:200]))
    if kind == "mesh-type":
        v = pick(draw, [None, (2, 2), "dp=2", NamedSharding(m, P()), _OBJ])
        return bad(f"visualize({v!r})", call(mesh=v), v)
    if kind == "axis":
        if m.ndim and draw(st.booleans()):
            v = misspell(pick(draw, m.axis_names), m.axis_names)
            return bad(f"visualize(axis={v!r})", call(axis=v), v, unknown_axis=v, suggest=True)
        v = pick(draw, [fresh_name(m.axis_names, "zz"), 3, "", ("dp",), ["dp"], 2.5])
        return bad(f"visualize(axis={v!r})", call(axis=v), v)
    return flags_case(draw, "visualize", call)


@REG.entry("visualize_sharding")
def visualize_sharding_case(draw):
    m = draw(derived_meshes(32))
    sh = NamedSharding(m, P(*draw(specs_for(m))))
    shape = tuple(draw(st.integers(0, 9)) for _ in range(len(sh.spec) + draw(st.integers(0, 2))))
    max_side = draw(st.integers(2, 20))

    def call(sharding=sh, shape=shape, color=False, max_side=max_side):
        return lambda: fm.visualize_sharding(sharding, shape, color=color, max_side=max_side)

    def check(text):
        assert isinstance(text, str) and text.startswith(repr(sh)), text[:200]

    kinds = ["valid"] * 2 + ["color", "sharding-type", "dim<0", "dim-type", "shape-type", "flags"]
    if len(sh.spec):
        kinds.append("short")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"visualize_sharding({sh!r}, {shape})", call(), check)
    if kind == "color":
        return valid("visualize_sharding(color=True)", call(color=True),
                     lambda text: _check(isinstance(text, str), text))
    if kind == "sharding-type":
        v = pick(draw, [m, P(), None, "dp", _OBJ])
        return bad(f"visualize_sharding({v!r})", call(sharding=v), v)
    if kind == "dim<0" and shape:
        i, v = draw(st.integers(0, len(shape) - 1)), draw(st.integers(-9, -1))
        return bad(f"dim {v}", call(shape=shape[:i] + (v,) + shape[i + 1:]), v)
    if kind == "dim-type" and shape:
        i, v = draw(st.integers(0, len(shape) - 1)), pick(draw, BAD_INTS)
        return bad(f"dim {v!r}", call(shape=shape[:i] + (v,) + shape[i + 1:]), v)
    if kind == "shape-type":
        v = pick(draw, [4, "ab", None, {0: 4}, {4}, _OBJ])
        return bad(f"global_shape={v!r}", call(shape=v), v)
    if kind == "short":
        s = shape[:len(sh.spec) - 1]
        return bad(f"shape {s} for {sh.spec}", call(shape=s), s)
    if kind == "flags":
        return flags_case(draw, "visualize_sharding", call)
    return valid(f"visualize_sharding({sh!r}, {shape}) (fallback)", call(), check)


@REG.entry("mesh_from_order")
def mesh_from_order_case(draw):
    tokens = tuple(draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=5, unique=True)))
    sizes = dict(zip(tokens, draw(factorizations(64, len(tokens)).filter(lambda f: len(f) == len(tokens)))))
    extra = [t for t in TOKENS if t not in tokens and draw(st.booleans())]
    sizes.update({t: 1 for t in extra})
    order = "-".join(tokens)
    devices = None if draw(st.booleans()) else range(8, 8 + fm.make_mesh(tuple(sizes.values()), tuple(sizes)).size)

    def call(order=order, sizes=sizes, devices=devices):
        return lambda: fm.mesh_from_order(order, devices=devices, **sizes)

    def check(mesh):
        names = tokens + tuple(extra)
        assert mesh.axis_names == tuple(reversed(names)), mesh
        assert dict(mesh.shape) == {n: sizes[n] for n in reversed(names)}, mesh
        assert mesh.devices[0] == (0 if devices is None else 8)

    kinds = ["valid"] * 2 + ["order-type", "empty-token", "missing-size", "size<1", "size-type", "extra-size"]
    if len(tokens) >= 2:
        kinds.append("repeated")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"mesh_from_order({order!r}, {sizes})", call(), check)
    if kind == "order-type":
        v = pick(draw, [None, tokens, list(tokens), 3, b"tp-dp"])
        return bad(f"order={v!r}", call(order=v), v)
    if kind == "empty-token":
        v = pick(draw, ["", order + "-", "-" + order, order.replace("-", "--", 1) if "-" in order else order + "--x"])
        return bad(f"order={v!r}", call(order=v), v)
    if kind == "repeated":
        v = order + "-" + tokens[0]
        return bad(f"order={v!r}", call(order=v), v)
    if kind == "missing-size":
        t = pick(draw, tokens)
        less = {k: s for k, s in sizes.items() if k != t}
        return bad(f"no size for {t!r}", call(sizes=less), order, [t])
    if kind == "size<1":
        t, v = pick(draw, tokens), draw(st.integers(-3, 0))
        return bad(f"{t}={v}", call(sizes={**sizes, t: v}), v)
    if kind == "size-type":
        t, v = pick(draw, tokens), pick(draw, BAD_INTS)
        return bad(f"{t}={v!r}", call(sizes={**sizes, t: v}), v)
    name = fresh_name(set(TOKENS), "x")
    v = pick(draw, [2, 3, 0, -1, 2.5, "1"])
    return bad(f"{name}={v!r} outside the order", call(sizes={**sizes, name: v}), v)


@REG.entry("order_axes")
def order_axes_case(draw):
    m = draw(derived_meshes(32).filter(lambda x: x.ndim >= 1))
    names = m.axis_names
    picked = tuple(draw(st.permutations(names))[:draw(st.integers(1, len(names)))])
    token = "-".join(picked)

    def call(mesh=m, token=token):
        return lambda: fm.order_axes(mesh, token)

    kind = pick(draw, ["valid"] * 2 + ["mesh-type", "token-type", "unknown", "empty", "repeated"])
    if kind == "valid":
        return valid(f"order_axes({m!r}, {token!r})", call(),
                     lambda out: _check(out == tuple(n for n in names if n in picked), out))
    if kind == "mesh-type":
        v = pick(draw, [None, "tp-dp", NamedSharding(m, P())])
        return bad(f"order_axes({v!r}, ...)", call(mesh=v), v)
    if kind == "token-type":
        v = pick(draw, [None, picked, 3, b"tp"])
        return bad(f"token={v!r}", call(token=v), v)
    if kind == "unknown":
        v = misspell(pick(draw, names), names)
        return bad(f"token with {v!r}", call(token=token + "-" + v), v, unknown_axis=v, suggest=True)
    if kind == "empty":
        v = pick(draw, ["", token + "-", "-" + token])
        return bad(f"token={v!r}", call(token=v), v)
    v = token + "-" + picked[0]
    return bad(f"token={v!r}", call(token=v), v)


# -- the command line -------------------------------------------------------------------------


def run_cli(argv: list[str]):
    """``functional-mesh`` in this process: ``(status, stdout)``; a refusal (exit 2) becomes a
    ``MeshError`` carrying its stderr message, so the fuzz rule applies to it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli_main(argv)
        except SystemExit as e:
            if e.code == 2:
                raise fm.MeshError(err.getvalue()) from None
            raise
    return status, out.getvalue()


@REG.entry("CLI show")
def cli_case(draw):
    sizes = draw(factorizations(32, 3).filter(bool))
    names = tuple(draw(st.lists(st.sampled_from(TOKENS), min_size=len(sizes), max_size=len(sizes), unique=True)))
    spec = ",".join(f"{n}={s}" for n, s in zip(names, sizes))
    mesh = fm.make_mesh(sizes, names)
    argv = ["show", spec]
    options: list[str] = []
    kind = pick(draw, ["valid"] * 2 + ["mesh-spec", "devices", "axis", "select", "ranks-per-host", "spec", "shape",
                                       "max-side", "spec-alone"])
    if kind == "valid":
        expected: Mesh = mesh
        if draw(st.booleans()):
            start = draw(st.integers(0, 9))
            options += ["--devices", f"{start}-{start + mesh.size - 1}"]
            expected = fm.make_mesh(sizes, names, devices=range(start, start + mesh.size))
        if draw(st.booleans()):
            sel = tuple(draw(st.permutations(names))[:draw(st.integers(1, len(names)))])
            options += ["--select", ",".join(sel)]
            expected = expected[sel]
        axis = pick(draw, (None,) + expected.axis_names)
        if axis:
            options += ["--axis", axis]
        if draw(st.booleans()):
            options += ["--ranks-per-host", str(draw(st.integers(1, 8)))]
        sharding_text = None
        if draw(st.booleans()):
            dims = draw(specs_for(expected))
            # every name quoted: once a quote appears the CLI reads the spec as a Python literal
            entries = ["None" if not d else f"'{d[0]}'" if len(d) == 1 else "(" + ",".join(f"'{a}'" for a in d) + ")"
                       for d in dims]
            shape = [draw(st.integers(0, 9)) for _ in range(len(dims) + draw(st.integers(0, 1)))]
            if entries:
                options += ["--spec", ",".join(entries), "--shape", ",".join(map(str, shape))]
                sharding_text = repr(NamedSharding(expected, P(*[() if not d else d for d in dims])))
        picture = fm.visualize(expected, axis)

        def check(result):
            status, text = result
            assert status == 0 and text.startswith(picture), text[:300]
            assert sharding_text is None or sharding_text in text, (sharding_text, text[-300:])

        return valid(f"functional-mesh {' '.join(argv + options)}", lambda: run_cli(argv + options), check)
    if kind == "mesh-spec":
        v = pick(draw, [f"{names[0]}=x", names[0], f"{names[0]}=2,{names[0]}=2", f"{names[0]}=0",
                        f"{names[0]}=-1", "=2", f"{names[0]}=2.5"])
        culprits = {f"{names[0]}=x": "x", names[0]: names[0], f"{names[0]}=2,{names[0]}=2": names[0],
                    f"{names[0]}=0": 0, f"{names[0]}=-1": -1, "=2": "=2", f"{names[0]}=2.5": "2.5"}
        return bad(f"MESH {v!r}", lambda: run_cli(["show", v]), v, culprits[v])
    if kind == "devices":
        choices = {"8-3": "8-3", "a": "a", "-1": "-1", "0,0,1": 0, f"0-{mesh.size}": mesh.size + 1, "1.5": "1.5"}
        v = pick(draw, sorted(choices))
        return bad(f"--devices {v!r}", lambda: run_cli(argv + ["--devices", v]), v, choices[v])
    if kind == "axis":
        v = misspell(pick(draw, names), names)
        return bad(f"--axis {v!r}", lambda: run_cli(argv + ["--axis", v]), v)
    if kind == "select":
        v = pick(draw, [misspell(names[0], names), f"{names[0]},{names[0]}", ",", ""])
        return bad(f"--select {v!r}", lambda: run_cli(argv + ["--select", v]), v, v.split(",")[0] or v)
    if kind == "ranks-per-host":
        v = pick(draw, ["0", "-2", "x", "1.5"])
        return bad(f"--ranks-per-host {v!r}", lambda: run_cli(argv + ["--ranks-per-host", v]), v)
    if kind == "max-side":
        v = pick(draw, ["0", "-2", "x", "1"])  # 1 passes the parser and visualize refuses it
        return bad(f"--max-side {v!r}", lambda: run_cli(argv + ["--max-side", v]), v, 1 if v == "1" else v)
    if kind == "spec":
        v = pick(draw, [misspell(names[0], names), f"{names[0]},{names[0]}", "(", "3"])
        return bad(f"--spec {v!r}", lambda: run_cli(argv + ["--spec", v, "--shape", "4,4,4,4"]), v,
                   v.split(",")[0], 3)
    if kind == "shape":
        v = pick(draw, ["a,b", "-1,4", "4.5"])
        # "--shape=-1,4": written apart, argparse takes "-1,4" for an option and says only "expected one argument"
        return bad(f"--shape {v!r}", lambda: run_cli(argv + ["--spec", names[0], f"--shape={v}"]), v, -1)
    v = pick(draw, [["--spec", names[0]], ["--shape", "4"]])
    return bad(f"{v[0]} without its partner", lambda: run_cli(argv + v), v[1])


test_entry_point = REG.test()
