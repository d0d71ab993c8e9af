"""The programs of the JAX oracle, described once for both sides (numpy only: no torch, no jax).

Each :class:`Program` is written twice, as a body for ``jax.shard_map`` in ``jax_side.py`` and
as a body for ``fm.shard_map`` in ``fm_side.py``; what they share lives here: the mesh, the
inputs (global float64 arrays drawn from a seed derived from the name), the specs, the
cotangents of the gradient check, and what kind of failure is expected.

Specs are plain nested tuples, one per argument or result: ``("x", None)`` is ``P("x", None)``,
``(("x", "y"),)`` is ``P(("x", "y"))`` and ``()`` is ``P()``. A program with one result
returns it bare and its ``out_specs`` is passed bare (:func:`out_tree`); with several results
both are tuples. ``in_specs`` are always a tuple, one spec per argument.

The gradient of a program is that of ``loss = sum_i sum(out_i * cot_i)`` with respect to every
input, where ``cot_i = program.cotangent(i, out_i.shape)`` (a fixed pseudo-random array, so a
backward that sums the wrong copies cannot pass by symmetry).

Besides the hand-written programs there are :data:`GENERATED` ones: short chains of the same
pieces (elementwise ops, a replicated weight, every collective, ``axis_index``, ``pcast``)
drawn from a fixed seed, so both processes build the identical list. Their expected failure is
not predicted here: JAX's answer is the oracle.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Entry = Any  # None | str | tuple[str, ...]: one dim of a spec
Spec = tuple  # tuple[Entry, ...]

JAX_VERSION = "0.10.2"
TOLERANCE = 1e-5  # absolute and relative, on outputs and gradients (float64 on both sides)

# failure kinds
VMA = "vma"  # a type error: an op's check or the out_specs check (ours: VmaError)
DIVISIBILITY = "divisibility"  # an argument's dim not divisible by its spec's axis sizes (ours: MeshError)
KINDS = (VMA, DIVISIBILITY)


@dataclass(frozen=True)
class Program:
    name: str
    axes: tuple[str, ...]  # mesh axis names over 8 devices
    sizes: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]  # global shapes of the inputs
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    about: str
    grad: bool = True
    fails: str | None = None  # None or one of KINDS (hand-written programs only)
    message: tuple[str, ...] = ()  # regexes that our error message must each match
    steps: tuple[tuple[Any, ...], ...] = ()  # generated programs only: the chain of pieces
    generated: bool = False

    def __post_init__(self) -> None:
        assert len(self.axes) == len(self.sizes) and int(np.prod(self.sizes)) == 8, self.name
        assert len(self.shapes) == len(self.in_specs), self.name
        assert self.fails in (None, *KINDS), self.name
        assert not self.fails or self.message, f"{self.name}: a failing program pins its message"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def inputs(self) -> list[np.ndarray]:
        """The global inputs: standard normal float64, the same in every process."""
        rng = np.random.default_rng([self.seed, 0])
        return [np.asarray(rng.standard_normal(shape), dtype=np.float64) for shape in self.shapes]

    def cotangent(self, index: int, shape: Sequence[int]) -> np.ndarray:
        """The fixed cotangent of result ``index`` (global shape ``shape``)."""
        rng = np.random.default_rng([self.seed, 1, index])
        return np.asarray(rng.standard_normal(tuple(shape)), dtype=np.float64)

    def local_shape(self, i: int) -> tuple[int, ...]:
        """Input ``i``'s per-device shape (assumes the dims divide)."""
        mesh = dict(zip(self.axes, self.sizes))
        shape = list(self.shapes[i])
        for d, entry in enumerate(self.in_specs[i]):
            for axis in _names(entry):
                shape[d] //= mesh[axis]
        return tuple(shape)


def _names(entry: Entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def in_tree(program: Program, make: Callable[..., Any]) -> tuple[Any, ...]:
    """``in_specs`` for either library: ``make`` is its ``PartitionSpec`` constructor."""
    return tuple(make(*spec) for spec in program.in_specs)


def out_tree(program: Program, make: Callable[..., Any]) -> Any:
    """``out_specs``: bare for one result, a tuple for several (the body returns the same shape)."""
    specs = [make(*spec) for spec in program.out_specs]
    return specs[0] if len(specs) == 1 else tuple(specs)


def ring(n: int, shift: int = 1) -> list[tuple[int, int]]:
    """The ``ppermute`` pairs of a ring of ``n`` members shifted by ``shift``."""
    return [(i, (i + shift) % n) for i in range(n)]


def axis_size(program: Program, axis: str | Sequence[str]) -> int:
    mesh = dict(zip(program.axes, program.sizes))
    return int(np.prod([mesh[a] for a in _names(axis)]))


def in_mesh_order(program: Program, axis: str | Sequence[str],
                  perm: Sequence[tuple[int, int]]) -> tuple[tuple[str, ...], list[tuple[int, int]]]:
    """The same ``ppermute`` spelt over ``axis``'s names in mesh order: ``(axes, pairs)``.

    The index along a tuple of axes is linear with the tuple's first name major: that is what
    ``axis_index``, ``all_gather``, ``psum_scatter`` and ``all_to_all`` mean in JAX 0.10.2, and
    what we mean everywhere. JAX's ``ppermute`` alone reads the pairs in mesh order whatever the
    tuple's order (its lowering sorts each group's members), so the JAX side of a program that
    permutes over ``("y", "x")`` passes the translated pairs over ``("x", "y")``.
    """
    names = _names(axis)
    mesh = dict(zip(program.axes, program.sizes))
    ordered = tuple(a for a in program.axes if a in names)
    coords = list(np.ndindex(*[mesh[a] for a in names]))  # coords[i]: the tuple-order coordinate of index i

    def index(i: int) -> int:
        where = dict(zip(names, coords[i]))
        return int(np.ravel_multi_index([where[a] for a in ordered], [mesh[a] for a in ordered]))

    return ordered, [(index(s), index(d)) for s, d in perm]


XY24 = (("x", "y"), (2, 4))
XY42 = (("x", "y"), (4, 2))

# Pinned regexes on our messages: the out_specs check names the axis and the spec; the op
# check names the op and the axis; the divisibility check names the axis, the spec and sizes.
OUT_P_Y = (r"out_spec", r"'y'", r"P\(\)")


def _p(name: str, mesh: tuple[tuple[str, ...], tuple[int, ...]], shapes, in_specs, out_specs, about: str,
       **kw: Any) -> Program:
    return Program(name, mesh[0], mesh[1], tuple(map(tuple, shapes)), tuple(in_specs), tuple(out_specs),
                   about, **kw)


HAND_WRITTEN: list[Program] = [
    _p("row_parallel_matmul", XY24, [(6, 8), (8, 5)], [(None, "y"), ("y", None)], [()],
       "x P(None,'y') @ w P('y',None), psum over 'y', out P()"),
    _p("mlp_column_row", XY24, [(4, 6), (6, 8), (8,), (8, 6), (6,)],
       [("x", None), (None, "y"), ("y",), ("y", None), ()], [("x", None)],
       "batch over 'x'; relu(x @ w1 + b1) @ w2 with w1/b1 column- and w2 row-sharded over 'y', psum over "
       "'y', + replicated b2; no explicit pvary: the weights' grads are summed over 'x' by JAX's "
       "implicit pvary"),
    _p("replicated_weight_dp", XY24, [(16, 3), (3, 5)], [("x", None), ()], [("x", None), ()],
       "a replicated weight used with batch-sharded x (implicit pvary over 'x', grad summed); "
       "second result: pmean over 'x' of a 0-d loss"),
    _p("sequence_parallel", XY24, [(4, 8, 6), (6, 8), (8, 6)], [("x", "y", None), (None, "y"), ("y", None)],
       [("x", "y", None)],
       "Megatron sequence parallel: all_gather over 'y' along the sequence, column/row matmuls, "
       "psum_scatter back along the sequence, residual"),
    _p("all_to_all_one_axis", XY24, [(8, 12)], [("y", None)], [(None, "y")],
       "all_to_all over 'y' (split dim 1, concat dim 0): P('y',None) -> P(None,'y'), then a*cos(a)"),
    _p("all_to_all_tuple", XY24, [(16, 8)], [(("x", "y"), None)], [(None, ("x", "y")), (None, ("y", "x"))],
       "all_to_all over ('x','y') and over ('y','x') (tuple order is the linear order)"),
    _p("ppermute_ring", XY24, [(4, 8)], [("x", "y")], [("x", "y"), ("x", "y")],
       "ppermute ring over 'y', and a partial permutation (members that receive nothing get zeros)"),
    _p("ppermute_tuple", XY42, [(8, 3)], [(("x", "y"), None)], [(("x", "y"), None), (("x", "y"), None)],
       "ppermute over ('x','y') by i -> 3i+1 mod 8, and a ring over ('y','x') in y-major order "
       "(see in_mesh_order)"),
    _p("axis_index_arithmetic", XY24, [(8, 6)], [("y", None)], [("y", "x"), ("y", "x")],
       "x * (axis_index('y') + 1) * axis_size('y') + axis_index('x'), and x - axis_index(('x','y'))"),
    _p("axis_index_under_replicated_out", XY24, [(4,)], [()], [()],
       "w * axis_index('y') returned under P(): varies over 'y'", fails=VMA, message=OUT_P_Y),
    _p("psum_of_invariant", XY24, [(3, 4), (4,)], [(), ("x",)], [(), (), (), ("x",)],
       "psum of values invariant over the summed axis: psum(w,'x') = 2w, pmean(w,'y') = w, "
       "psum(w,('x','y')) = 8w, psum(v varying over 'x', 'y') = 4v"),
    _p("out_specs_varying", XY24, [(8,)], [("y",)], [()],
       "a value varying over 'y' returned under P()", fails=VMA, message=OUT_P_Y),
    _p("out_specs_missing_axis", XY24, [(8,)], [(("x", "y"),)], [("x",)],
       "a value varying over 'x' and 'y' returned under P('x')", fails=VMA,
       message=(r"out_spec", r"'y'", r"P\('x'\)")),
    _p("out_specs_second_result", XY24, [(8,)], [(("x", "y"),)], [("x",), ("x",)],
       "two results under P('x'): psum over 'y' (fine), then the raw value (varies over 'y')",
       fails=VMA, message=(r"out_spec", r"\[1\]", r"'y'")),
    _p("out_specs_ok_after_psum", XY24, [(8,)], [(("x", "y"),)], [("x",)],
       "psum over 'y' of a value varying over 'x' and 'y', returned under P('x')"),
    _p("invariant_out_named_axis", XY24, [(3,), (8,)], [(), (("x", "y"),)], [("y",), (("x", "y"),)],
       "results invariant over an axis their out_spec names (implicit pvary on the way out: "
       "the grad sums the cotangent's copies)"),
    _p("all_gather_invariant", XY24, [(8, 3), (2, 3)], [("y", None), ()], [(), ()],
       "all_gather over 'y' to='invariant' (JAX: 'invarying') of a varying and of an invariant value, "
       "returned under P()"),
    _p("all_gather_varying_under_replicated_out", XY24, [(8,)], [("y",)], [()],
       "all_gather over 'y' (to='varying', the default) returned under P()", fails=VMA, message=OUT_P_Y),
    _p("invariant_into_collectives", XY24, [(8,)], [()], [("y",), ("y",), ("y",), ("y",)],
       "all_gather, ppermute, psum_scatter and all_to_all over 'y' of an invariant value "
       "(implicitly pvary'd first: psum_scatter gives 4w)"),
    _p("explicit_pcast", XY24, [(4, 6), (6, 5)], [("x", None), ()], [("x", None), ("x", None)],
       "explicit pcast(w, 'x', to='varying') (and pvary on our side) before x @ w"),
    _p("pcast_of_varying", XY24, [(8,)], [("y",)], [("y",)],
       "pcast(x, 'y', to='varying') of a value already varying over 'y'", fails=VMA,
       message=(r"pcast|pvary", r"'y'")),
    _p("psum_mixed_tuple", XY24, [(8,)], [("x",)], [()],
       "psum over ('x','y') of a value varying over 'x' only: JAX rejects mixed varying/invariant "
       "axes in one psum", fails=VMA, message=(r"psum", r"'y'")),
    _p("psum_scatter_mixed_tuple", XY24, [(16,)], [("x",)], [(("x", "y"),)],
       "psum_scatter over ('x','y') of a value varying over 'x' only", fails=VMA,
       message=(r"psum_scatter", r"'y'")),
    _p("nondivisible_arg", XY24, [(6,)], [("y",)], [("y",)],
       "dim of size 6 under P('y') with |y| = 4", grad=False, fails=DIVISIBILITY,
       message=(r"'y'", r"\b6\b", r"\b4\b")),
    _p("nondivisible_tuple", XY24, [(12, 2)], [(("x", "y"), None)], [(("x", "y"), None)],
       "dim of size 12 under P(('x','y'), None) with |x|*|y| = 8", grad=False, fails=DIVISIBILITY,
       message=(r"'x'", r"'y'", r"\b12\b")),
]


# -- generated programs ------------------------------------------------------------------------------

GEN_AXES: list[Any] = ["x", "y", ("x", "y"), ("y", "x")]
GEN_IN_SPECS: list[Spec] = [(), ("x", None), (None, "y"), ("x", "y"), ("y", "x"), (("x", "y"), None)]
GEN_OUT_SPECS: list[Spec] = [(), ("x",), (None, "y"), ("x", "y"), ("y", "x"), (("x", "y"),), (None, ("y", "x"))]
GEN_LOCAL = (4, 4)  # the input's per-device shape
GEN_MAX_NUMEL = 512


def _generate(count: int, seed: int = 20261124) -> list[Program]:
    rng = np.random.default_rng(seed)
    names, sizes = XY24
    mesh = dict(zip(names, sizes))
    out: list[Program] = []
    for k in range(count):
        in_spec = GEN_IN_SPECS[rng.integers(len(GEN_IN_SPECS))]
        shape = [n * int(np.prod([mesh[a] for a in _names(e)])) for n, e in
                 zip(GEN_LOCAL, in_spec + (None,) * (2 - len(in_spec)))]
        local = list(GEN_LOCAL)
        steps: list[tuple[Any, ...]] = []
        for _ in range(int(rng.integers(2, 5))):
            axis = GEN_AXES[rng.integers(len(GEN_AXES))]
            n = int(np.prod([mesh[a] for a in _names(axis)]))
            d = int(rng.integers(2))
            choices = ["mul_w", "sin", "axis_index", "psum", "pmean", "ppermute", "pcast"]
            if np.prod(local) * n <= GEN_MAX_NUMEL:
                choices += ["all_gather", "all_gather_invariant"]
            if local[d] % n == 0:
                choices += ["psum_scatter", "all_to_all"]
            op = choices[rng.integers(len(choices))]
            if op in ("mul_w", "sin"):
                steps.append((op,))
            elif op == "ppermute":
                steps.append((op, axis, int(rng.integers(1, n))))
            elif op in ("all_gather", "all_gather_invariant"):
                steps.append((op, axis, d))
                local[d] *= n
            elif op == "psum_scatter":
                steps.append((op, axis, d))
                local[d] //= n
            elif op == "all_to_all":
                steps.append((op, axis, d, 1 - d))
                local[d] //= n
                local[1 - d] *= n
            else:  # axis_index, psum, pmean, pcast
                steps.append((op, axis))
        out_spec = GEN_OUT_SPECS[rng.integers(len(GEN_OUT_SPECS))]
        out.append(Program(
            f"gen_{k:02d}", names, sizes, (tuple(shape), (1,)), (in_spec, ()), (out_spec,),
            "generated: " + " -> ".join(":".join(map(str, s)) for s in steps),
            steps=tuple(steps), generated=True))
    return out


GENERATED: list[Program] = _generate(16)

ALL: list[Program] = HAND_WRITTEN + GENERATED
BY_NAME: dict[str, Program] = {p.name: p for p in ALL}
assert len(BY_NAME) == len(ALL), "program names must be unique"
