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

# The JAX that judges a run is chosen in _jax_venv.py: JAX_NEW from a Python >= 3.12, else JAX_FALLBACK
# on the running Python. Where their answers differ, UNREDUCED's rows carry both (UnreducedProgram.jax_0_10).
JAX_NEW = "0.12.0.1"
JAX_FALLBACK = "0.10.2"
TOLERANCE = 1e-5  # absolute and relative, on outputs and gradients (float64 on both sides)

# failure kinds
VMA = "vma"  # a type error: an op's check or the out_specs check (ours: VmaError)
DIVISIBILITY = "divisibility"  # an argument's dim not divisible by its spec's axis sizes (ours: MeshError)
SPEC = "spec"  # a spec naming an axis the region is not manual over (axis_names=; ours: MeshError)
KINDS = (VMA, DIVISIBILITY, SPEC)


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
    axis_names: tuple[str, ...] = ()  # the region is manual over these axes only (() = every axis)

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
    ``axis_index``, ``all_gather``, ``psum_scatter`` and ``all_to_all`` mean in JAX 0.10.2 and 0.12, and
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


# -- regions manual over some axes (axis_names=) and nested ones: JAX 0.12's shard_map(..., axis_names=) --------
#
# Inside, JAX's values are global over the other axes; ours are DTensors there (replicated: the inputs are
# full tensors). Nested programs: an outer region manual over 'y', an inner one manual over 'x' (the inner
# region's collectives may name both).

HAND_WRITTEN += [
    _p("partial_row_parallel_matmul", XY24, [(6, 8), (8, 5)], [(None, "y"), ("y", None)], [()],
       "manual over 'y' only: x @ w row-parallel, psum over 'y'", axis_names=("y",)),
    _p("partial_mlp", XY24, [(4, 6), (6, 8), (8,), (8, 6), (6,)],
       [(), (None, "y"), ("y",), ("y", None), ()], [()],
       "manual over 'y' only: relu(x @ w1 + b1) @ w2 (column/row over 'y'), psum, + b2", axis_names=("y",)),
    _p("partial_axis_index", XY24, [(8, 6)], [("y", None)], [("y",)],
       "manual over 'y' only: x * (axis_index('y') + 1) * axis_size('y')", axis_names=("y",)),
    _p("partial_gather_permute", XY24, [(8, 4)], [("y", None)], [(), ("y",)],
       "manual over 'y' only: all_gather to='invariant' and a ppermute ring over 'y'", axis_names=("y",)),
    _p("partial_out_specs_varying", XY24, [(8,)], [("y",)], [()],
       "manual over 'y' only: a value varying over 'y' returned under P()", fails=VMA, message=OUT_P_Y,
       axis_names=("y",)),
    _p("partial_psum_over_auto_axis", XY24, [(8,)], [("y",)], [("y",)],
       "manual over 'y' only: psum over 'x', an axis the region is not manual over", fails=VMA,
       message=(r"psum", r"'x'", r"not manual"), axis_names=("y",)),
    _p("partial_in_spec_auto_axis", XY24, [(8, 4)], [("x", None)], [("x", None)],
       "manual over 'y' only: an in_spec that names 'x'", fails=SPEC,
       message=(r"in_specs", r"'x'", r"not manual", r"axis_names"), axis_names=("y",)),
    _p("partial_out_spec_auto_axis", XY24, [(8,)], [("y",)], [("x",)],
       "manual over 'y' only: an out_spec that names 'x'", fails=SPEC,
       message=(r"out_specs", r"'x'", r"not manual"), axis_names=("y",)),
    _p("nested_disjoint", XY24, [(16, 4)], [("y", None)], [("y", None), ("y", None)],
       "outer manual over 'y', inner over 'x': psum over 'x' and over 'y' (the outer axis) inside the inner "
       "region, inner out_specs P() and P('x')", axis_names=("y",)),
    _p("nested_inner_out_specs_varying", XY24, [(16, 4)], [("y", None)], [("y", None)],
       "outer manual over 'y', inner over 'x': a value varying over 'x' returned by the inner region under P()",
       fails=VMA, message=(r"out_spec", r"'x'", r"P\(\)"), axis_names=("y",)),
    _p("nested_same_axis", XY24, [(8, 4)], [("y", None)], [("y", None)],
       "outer and inner both manual over 'y'", fails=SPEC, message=(r"disjoint", r"'y'"), axis_names=("y",)),
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


# -- pending sums (unreduced): the programs of test_unreduced_vs_jax.py --------------------------------
#
# Kept apart from ALL (test_vs_jax.py's list): JAX (0.10.2 and 0.12) types unreduced values only on a mesh
# whose axes are all Explicit, so its side runs them with another driver (jax_side.main_unreduced).
#
# Each program says what JAX does with it and what we do. ``jax_refuses`` is JAX 0.12.0.1's answer;
# ``jax_0_10`` is JAX 0.10.2's where it differs (None: the same), so the fallback oracle still holds;
# ``refuses(version)`` gives the one that judges a run:
# - ``""``: JAX runs it; our values, gradients and types must equal JAX's;
# - ``jax_refuses`` a regex of JAX's message and ``fails == VMA``: both refuse; ours is a VmaError
#   whose message matches ``message``;
# - ``jax_refuses`` a regex and ``fails is None``: we go past JAX (a linear op JAX does not
#   implement or refuses); our values and gradients must equal one process (fm_side's reference:
#   plain torch on the full tensors, the sum written out). ``one_process`` is then True.
# - ``""`` and ``fails == VMA``: only under the fallback, where JAX 0.10.2 ran what 0.12 and we refuse
#   (a documented difference with 0.10.2): JAX's answer is checked, and our VmaError.
# ``one_process`` may also be set where JAX runs the program: both oracles are checked.
#
# An input whose in_spec is unreduced over axes A is given as its members stacked on a leading dim
# of size |A| (first name major); the value meant is their sum. Both sides make the pending value
# with a first shard_map that takes member ``i`` on A's index ``i`` and pcasts it to unreduced, and
# returns it under ``P(*spec, unreduced=A)``: so every such program crosses both boundaries. A
# result whose out_spec is unreduced is reduced outside the region (JAX: ``reshard`` to the spec
# without it; ours: ``full_tensor()`` of the Partial DTensor).

DT24 = (("dp", "tp"), (2, 4))

# JAX's refusals, read from its messages (the same in 0.10.2 and 0.12 unless named for one)
JAX_PVARY_UNREDUCED = r"pvary cannot accept args which are unreduced"  # all_gather, ppermute, all_to_all
JAX_IMPLICIT_ADD = r"lhs is unreduced while rhs is not"
JAX_DOT_GENERAL = r"dot_general cannot be unreduced"
JAX_NEEDS_REDUCED = r"should be reduced along the same axes"  # a factor not cast to="reduced"
JAX12_DENOMINATOR = r"Denominator should be reduced along the same axes numerator is unreduced on"
JAX12_DIV_BY_PENDING = r"The denominator cannot be unreduced"
JAX12_OUT_UNREDUCED = r"should be equal to the unreduced present on the out_aval"  # no implicit cast at out_specs


def jax_not_implemented(op: str) -> str:
    """JAX 0.10.2's answer to an op with no unreduced rule."""
    return rf"unreduced rule for {op} is not implemented"


def jax12_not_linear(op: str) -> str:
    """JAX 0.12's answer to a non-linear op of an unreduced value (a ShardingTypeError)."""
    return rf"{op} is a non-linear operation and cannot accept inputs? that (is|are) unreduced"


def jax12_wrong_kind(op: str) -> str:
    """JAX 0.12's answer to pmax/pmin of a pending sum: they end pending maxima/minima, not sums."""
    return rf"unreduced_{op} cannot accept args with unreduced_kind=UnreducedKind\.sum"


@dataclass(frozen=True)
class UnreducedProgram(Program):
    in_unreduced: tuple[tuple[str, ...], ...] = ()  # per input: the axes its in_spec is unreduced over
    out_unreduced: tuple[tuple[str, ...], ...] = ()  # per result
    jax_refuses: str = ""  # JAX 0.12.0.1: "" it runs it, else a regex its message matches
    jax_0_10: str | None = None  # JAX 0.10.2's answer, the same way, where it differs (None: the same)
    one_process: bool = False  # also (or, where JAX refuses, only) compared with one process
    # (noted value, varying, unreduced[, reduced]): a missing reduced is none
    types: tuple[tuple[Any, ...], ...] = ()
    in_reduced: tuple[tuple[str, ...], ...] = ()  # per input: the axes its in_spec is reduced over
    out_reduced: tuple[tuple[str, ...], ...] = ()  # per result
    in_kind: tuple[str, ...] = ()  # per input: its unreduced_kind ("" or "sum": a pending sum)
    out_kind: tuple[str, ...] = ()  # per result
    jax_grad: bool = True  # False: JAX has no gradient of the program (a pending max/min); one process has

    def __post_init__(self) -> None:
        super().__post_init__()
        assert not self.fails or self.jax_refuses, f"{self.name}: we refuse only what JAX {JAX_NEW} refuses"
        for version in (JAX_NEW, JAX_FALLBACK):
            refuses = self.refuses(version)
            assert self.fails or not refuses or self.one_process, (
                f"{self.name}: past JAX {version}, the oracle is one process")

    def refuses(self, version: str) -> str:
        """JAX ``version``'s answer: "" where it runs the program, else a regex of its message."""
        if version == JAX_NEW or self.jax_0_10 is None:
            return self.jax_refuses
        assert version == JAX_FALLBACK, version
        return self.jax_0_10

    def pending_in(self, i: int) -> tuple[str, ...]:
        return self.in_unreduced[i] if i < len(self.in_unreduced) else ()

    def pending_out(self, i: int) -> tuple[str, ...]:
        return self.out_unreduced[i] if i < len(self.out_unreduced) else ()

    def reduced_in(self, i: int) -> tuple[str, ...]:
        return self.in_reduced[i] if i < len(self.in_reduced) else ()

    def reduced_out(self, i: int) -> tuple[str, ...]:
        return self.out_reduced[i] if i < len(self.out_reduced) else ()

    def kind_in(self, i: int) -> str:
        return (self.in_kind[i] if i < len(self.in_kind) else "") or "sum"

    def kind_out(self, i: int) -> str:
        return (self.out_kind[i] if i < len(self.out_kind) else "") or "sum"

    def noted(self) -> dict[str, tuple[list[str], list[str], list[str]]]:
        """The noted types as ``{key: (varying, unreduced, reduced)}``."""
        return {t[0]: (list(t[1]), list(t[2]), list(t[3]) if len(t) > 3 else []) for t in self.types}

    def oracle(self, version: str) -> str:
        """Which answer our run is held to under JAX ``version``: "jax", "one process", "jax and one
        process", "both refuse", or (under 0.10.2 only) "we refuse, JAX 0.10.2 runs it"."""
        if self.fails:
            return "both refuse" if self.refuses(version) else f"we refuse, JAX {version} runs it"
        if self.refuses(version):
            return "one process"
        return "jax and one process" if self.one_process else "jax"


def axis_entry(axes: Sequence[str]) -> Entry:
    """The spec entry or axis argument of ``axes``: a name alone, or a tuple (first name major)."""
    return axes[0] if len(axes) == 1 else tuple(axes)


def unreduced_tree(specs: Sequence[Spec], pending: Callable[[int], tuple[str, ...]], make: Callable[..., Any],
                   bare: bool, reduced: Callable[[int], tuple[str, ...]] = lambda i: (),
                   kind: Callable[[int], Any] = lambda i: None) -> Any:
    """Specs with their unreduced (of ``kind``, where not None) and reduced sets, for either library
    (``make``: its ``PartitionSpec``)."""
    out = []
    for i, spec in enumerate(specs):
        extra: dict[str, Any] = {}
        if pending(i):
            extra["unreduced"] = set(pending(i))
            if kind(i) is not None:
                extra["unreduced_kind"] = kind(i)
        if reduced(i):
            extra["reduced"] = set(reduced(i))
        out.append(make(*spec, **extra))
    return out[0] if bare and len(out) == 1 else tuple(out)


def spec_trees(program: UnreducedProgram, make: Callable[..., Any], kind: Callable[[str], Any]) -> tuple[Any, Any]:
    """``(in_specs, out_specs)`` of ``program`` for either library; ``kind`` maps "max" to its kind value
    (None: the default sum, which needs no keyword)."""
    def kinds(of: Callable[[int], str]) -> Callable[[int], Any]:
        return lambda i: None if of(i) == "sum" else kind(of(i))
    return (unreduced_tree(program.in_specs, program.pending_in, make, False, program.reduced_in,
                           kinds(program.kind_in)),
            unreduced_tree(program.out_specs, program.pending_out, make, True, program.reduced_out,
                           kinds(program.kind_out)))


def _u(name: str, shapes, in_specs, out_specs, about: str, **kw: Any) -> UnreducedProgram:
    return UnreducedProgram(name, DT24[0], DT24[1], tuple(map(tuple, shapes)), tuple(in_specs), tuple(out_specs),
                            about, **kw)


VDP_UTP = ("dp",), ("tp",)


def _ours(op: str) -> tuple[str, ...]:
    """Our refusal's message: it names the op (a regex), the axis and the fix."""
    return (op, r"unreduced over \('tp',\)", r"fm\.psum\(x, 'tp'\)")


X816 = [(8, 16)]
DPTP = [("dp", "tp")]

UNREDUCED: list[UnreducedProgram] = [
    # -- JAX runs these: values, gradients and types equal JAX's --
    _u("ur_pcast_psum", X816, DPTP, [("dp", None)],
       "pcast(x, 'tp', to='unreduced') of x varying over dp and tp, then psum over 'tp'",
       types=(("u", *VDP_UTP), ("psum", ("dp",), ())), one_process=True),
    _u("ur_psum_scatter", X816, DPTP, [("dp", "tp"), (("dp", "tp"), None)],
       "psum_scatter over 'tp' of a pending sum, along dim 1 and along dim 0",
       types=(("u", *VDP_UTP), ("scatter", ("dp", "tp"), ()))),
    _u("ur_add", X816 * 2, DPTP * 2, [("dp", None)],
       "the sum of two values unreduced over 'tp' (one made from sin(y)), then psum",
       types=(("sum", *VDP_UTP),)),
    _u("ur_reshape_sum", [(4, 32)], [(None, "tp")], [(), ()],
       "a pending sum invariant over dp: reshape then sum(0), and the transpose, each psum'd",
       types=(("u", (), ("tp",)), ("reshaped", (), ("tp",)))),
    _u("ur_shape_ops", X816 * 2, DPTP * 2, [("dp", None), (None, "dp", None), ("dp", None), ("dp", None),
                                          ("dp", None)],
       "cat, stack, a slice, a broadcast then sum, unsqueeze/squeeze of pending sums, each psum'd"),
    _u("ur_reorder_ops", X816, DPTP, [("dp", None), ("dp", None), ("dp", None), ("dp",), ("dp", None),
                                    ("dp", None)],
       "roll, triu, transpose, einsum 'ij->j', a float32 round trip and a copy of a pending sum, each psum'd"),
    _u("ur_scale_reduced", [(8, 16), (), (4,)], [("dp", "tp"), (), ()], [("dp", None)] * 3,
       "a pending sum times an invariant scalar and vector (JAX: cast to='reduced' first; ours: directly), "
       "on either side; the factors' gradients are summed over 'tp' (and 'dp')"),
    _u("ur_out_specs", X816, DPTP, [("dp", None), (), (None, None)],
       "pending sums returned under unreduced out_specs: over 'tp', over ('dp','tp'), and psum over 'dp' "
       "of one unreduced over 'tp'; reduced outside (JAX reshard, ours full_tensor())",
       out_unreduced=(("tp",), ("dp", "tp"), ("tp",)), types=(("dp summed", (), ("tp",)),), one_process=True),
    _u("ur_in_specs", [(4, 8, 3), (3,)], [("dp", None), ()], [(("dp", "tp"), None), ("dp", None)],
       "an argument unreduced over 'tp' (DTensor Partial on our side): psum_scatter of it times a factor "
       "(JAX to='reduced'), and the argument itself returned unreduced",
       in_unreduced=(("tp",), ()), out_unreduced=((), ("tp",)), types=(("u", *VDP_UTP),), one_process=True),
    _u("ur_in_specs_two_axes", [(8, 4, 3)], [(None, None)], [(None, None), ()],
       "an argument unreduced over ('dp','tp'): psum over 'tp' returned unreduced over 'dp', and psum over "
       "('dp','tp')", in_unreduced=(("dp", "tp"),), out_unreduced=(("dp",), ()),
       types=(("u", (), ("dp", "tp")), ("tp summed", (), ("dp",)))),
    _u("ur_two_axes", [(8, 4)], [(("dp", "tp"), None)], [(), (), ()],
       "pcast over ('dp','tp'), then psum over 'tp' (unreduced over 'dp' out), over ('dp','tp'), and over "
       "'dp' then 'tp'", out_unreduced=(("dp",), (), ()), types=(("u", (), ("dp", "tp")),)),
    _u("ur_row_parallel_sp", [(8, 16), (16, 6), (8, 6)], [(None, "tp"), ("tp", None), ("tp", None)],
       [("tp", None)],
       "row-parallel x @ w kept pending (pcast), then the sequence-parallel psum_scatter along dim 0, "
       "plus a residual", types=(("y", (), ("tp",)),), one_process=True),
    _u("ur_accumulate", [(8, 3), (8, 3), (8, 5)], [("dp", None)] * 3, [()],
       "gradient accumulation: two micro-batches' x.T @ y kept pending over 'dp', summed, one psum",
       one_process=True),
    _u("ur_pmean", X816, DPTP, [("dp", None)], "pmean over 'tp' of a pending sum (its sum over n)"),
    # JAX 0.12 runs these, as we do; JAX 0.10.2 refused them (not implemented): under it, one process
    _u("ur_neg", X816, DPTP, [("dp", None), ("dp", None)], "-u and torch.neg(u), psum'd",
       jax_0_10=jax_not_implemented("neg"), one_process=True, types=(("neg", *VDP_UTP),)),
    _u("ur_sub", X816 * 2, DPTP * 2, [("dp", None)], "u - v of two pending sums, psum'd",
       jax_0_10=jax_not_implemented("sub"), one_process=True),
    # -- JAX refuses these and we allow them (linear): values and gradients equal one process --
    _u("ur_matmul_invariant", [(8, 16), (4, 3)], [("dp", "tp"), ()], [("dp", None)] * 3,
       "u @ w, einsum('ij,jk->ik', u, w) and F.linear(u, w.T) with w invariant, psum'd; w's gradient is "
       "summed over 'tp' (and 'dp')", jax_refuses=JAX_DOT_GENERAL, one_process=True,
       types=(("u @ w", *VDP_UTP),)),
    _u("ur_mul_invariant", [(8, 16), (), (4,)], [("dp", "tp"), (), ()], [("dp", None)] * 4,
       "u * s, u * w, u * 2.0 and 3.0 * u with no cast to='reduced', psum'd",
       jax_refuses=JAX_NEEDS_REDUCED, one_process=True),
    _u("ur_div_mean", [(8, 16), ()], [("dp", "tp"), ()], [("dp", None), ("dp", None), ("dp",)],
       "u / s, u / 2.0 and u.mean(0), psum'd (JAX 0.12 runs u / s with s cast to='reduced' first, which we "
       "do not have; ours: directly)", jax_refuses=JAX12_DENOMINATOR, jax_0_10=jax_not_implemented("div"),
       one_process=True),
    _u("ur_flip_cumsum", X816, DPTP, [("dp", None), ("dp", None)],
       "flip and cumsum of a pending sum, psum'd (JAX 0.10.2 and 0.12 run the forward, the gradient fails)",
       jax_refuses=r"Expected cotangent type", one_process=True),
    _u("ur_matmul_out_unreduced", [(8, 16), (4, 3)], [("dp", "tp"), ()], [("dp", None)],
       "u @ w returned under an out_spec unreduced over 'tp'", out_unreduced=(("tp",),),
       jax_refuses=JAX_DOT_GENERAL, one_process=True),
    _u("ur_in_specs_matmul", [(4, 8, 4), (4, 3)], [("dp", None), ()], [(("dp", "tp"), None)],
       "an argument unreduced over 'tp' through -(u @ w), then psum_scatter along dim 0",
       in_unreduced=(("tp",), ()), jax_refuses=JAX_DOT_GENERAL, one_process=True),
    _u("ur_psum_mixed_tuple", X816, DPTP, [()],
       "psum over ('dp','tp') of a value varying over 'dp' and unreduced over 'tp': a tuple in two states, "
       "refused as JAX does (and as a tuple mixing varying with invariant)",
       jax_refuses=r"can only accept axis_name which corresponds to", fails=VMA,
       message=(r"`psum` over \('dp', 'tp'\) requires a value in one state", r"unreduced over \['tp'\] and not "
                r"over \['dp'\]", r"reduce over \('tp',\) first")),
    # -- both refuse: ours is a VmaError --
    _u("ur_all_gather", X816, DPTP, [("dp", None)], "all_gather over 'tp' of a pending sum",
       jax_refuses=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`all_gather`")),
    _u("ur_all_gather_invariant", X816, DPTP, [("dp", None)],
       "all_gather over 'tp' to='invariant' of a pending sum",
       jax_refuses=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`all_gather`")),
    _u("ur_ppermute", X816, DPTP, [("dp", None)], "ppermute over 'tp' of a pending sum",
       jax_refuses=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`ppermute`")),
    _u("ur_all_to_all", X816, DPTP, [("dp", "tp")], "all_to_all over 'tp' of a pending sum",
       jax_refuses=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`all_to_all`")),
    _u("ur_pmax", X816, DPTP, [("dp", None)], "pmax over 'tp' of a pending sum",
       jax_refuses=jax12_wrong_kind("pmax"), jax_0_10=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`pmax`")),
    _u("ur_pmin", X816, DPTP, [("dp", None)], "pmin over 'tp' of a pending sum",
       jax_refuses=jax12_wrong_kind("pmin"), jax_0_10=JAX_PVARY_UNREDUCED, fails=VMA, message=_ours("`pmin`")),
    _u("ur_add_invariant", [(8, 16), (4,)], [("dp", "tp"), ()], [("dp", None)],
       "a pending sum plus an invariant value", jax_refuses=JAX_IMPLICIT_ADD, fails=VMA,
       message=_ours(r"`Tensor\.add` combines")),
    _u("ur_add_number", X816, DPTP, [("dp", None)], "a pending sum plus a Python number",
       jax_refuses=JAX_IMPLICIT_ADD, fails=VMA,
       message=_ours(r"`Tensor\.add` adds a number")),
    _u("ur_add_other_axes", [(8, 16), (8, 16)], [("dp", "tp")] * 2, [()],
       "a value unreduced over 'tp' plus one unreduced over 'dp'", jax_refuses=JAX_PVARY_UNREDUCED,
       fails=VMA, message=(r"`Tensor\.add`", r"'dp'", r"'tp'", r"psum")),
    _u("ur_tanh", X816, DPTP, [("dp", None)], "tanh of a pending sum",
       jax_refuses=jax12_not_linear("tanh"),
       jax_0_10=jax_not_implemented("tanh"), fails=VMA, message=_ours("`tanh` is not linear")),
    _u("ur_relu", X816, DPTP, [("dp", None)], "relu of a pending sum",
       jax_refuses=jax12_not_linear("max"),
       jax_0_10=jax_not_implemented("max"), fails=VMA, message=_ours("`relu` is not linear")),
    _u("ur_exp", X816, DPTP, [("dp", None)], "exp of a pending sum",
       jax_refuses=jax12_not_linear("exp"),
       jax_0_10=jax_not_implemented("exp"), fails=VMA, message=_ours("`exp` is not linear")),
    _u("ur_div_by_pending", [(8, 16), ()], [("dp", "tp"), ()], [("dp", None)],
       "an invariant scalar divided by a pending sum", jax_refuses=JAX12_DIV_BY_PENDING,
       jax_0_10=jax_not_implemented("div"), fails=VMA,
       message=_ours(r"`Tensor\.div` divides by")),
    _u("ur_product_of_two", X816 * 2, DPTP * 2, [("dp", None)], "u * v of two pending sums",
       jax_refuses=r"cannot be unreduced since mul is bilinear", fails=VMA,
       message=(r"`Tensor\.mul` multiplies two values unreduced over \('tp',\)", r"psum")),
    _u("ur_matmul_of_two", X816 * 2, DPTP * 2, [("dp", None)], "u @ v.T of two pending sums",
       jax_refuses=JAX_DOT_GENERAL, fails=VMA,
       message=(r"`Tensor\.matmul` multiplies two values unreduced over \('tp',\)", r"psum")),
    _u("ur_pcast_invariant", [(4,)], [()], [()], "pcast(w, 'tp', to='unreduced') of an invariant w",
       jax_refuses=r"Unsupported pcast from=invarying, to='unreduced'", fails=VMA,
       message=(r"`pcast`", r"invariant over \['tp'\]", r"to='varying'")),
    _u("ur_pcast_twice", X816, DPTP, [("dp", None)], "pcast to='unreduced' of a value already unreduced",
       jax_refuses=r"Unsupported pcast from=unreduced", fails=VMA,
       message=(r"`pcast`", r"already unreduced over \['tp'\]")),
    _u("ur_out_replicated", X816, DPTP, [("dp", None)],
       "a pending sum over 'tp' returned under P('dp') (no unreduced)",
       jax_refuses=r"require replication which can't be statically inferred", fails=VMA,
       message=(r"out_spec P\('dp', None\)", r"unreduced over \['tp'\]", r"fm\.psum\(x, 'tp'\)")),
    _u("ur_out_varying", X816, DPTP, [("dp", None)],
       "a value varying over 'tp' (no pcast) returned under an out_spec unreduced over 'tp': JAX 0.12 and we "
       "want the explicit pcast; JAX 0.10.2 cast it implicitly", out_unreduced=(("tp",),),
       jax_refuses=JAX12_OUT_UNREDUCED, jax_0_10="", fails=VMA,
       message=(r"out_spec", r"pending sum over \('tp',\)", r"fm\.pcast\(x, 'tp', to='unreduced'\)")),
]

# -- JAX 0.12's reduced and pending max/min (JAX 0.10.2 has neither: under the fallback, one process) --------
#
# ``rd_*``: reduced values (pcast to="reduced", P(reduced=)); ``mx_*``/``mn_*``: pending max/min, entering as
# their members (JAX: a reduce_max to an out_sharding of that kind; ours: a DTensor Partial("max")), ended by
# pmax/pmin. JAX has no gradient of a pending max (``jax_grad=False``): gradients against one process.

JAX10_NO_REDUCED = r"reduced|UnreducedKind|unreduced_kind"  # JAX 0.10.2: neither the keyword nor the kinds
JAX12_REPLICATED = r"Inputs cannot be replicated on the same axes that another input is reduced on"
JAX12_REDUCED_ARG = r"cannot accept args which are reduced"
JAX12_WANTS_SUM = r"Expected unreduced_kind=UnreducedKind\.sum but got UnreducedKind\.max"
R_TP = ((), (), ("tp",))  # varying, unreduced, reduced: reduced over tp


def _r(name: str, shapes, in_specs, out_specs, about: str, **kw: Any) -> UnreducedProgram:
    kw.setdefault("jax_0_10", JAX10_NO_REDUCED)
    kw.setdefault("one_process", not kw.get("fails"))
    return _u(name, shapes, in_specs, out_specs, about, **kw)


def _mx(name: str, about: str, out_specs, kind: str = "max", **kw: Any) -> UnreducedProgram:
    """A program of one argument pending a ``kind`` over 'tp': 4 members (8, 6), its value split over dp."""
    kw.setdefault("jax_grad", False)
    return _r(name, [(4, 8, 6)], [("dp", None)], out_specs, about, in_unreduced=(("tp",),), in_kind=(kind,), **kw)


UNREDUCED += [
    # JAX runs these: values, gradients and types equal JAX's (and one process)
    _r("rd_pcast_reduced", X816 + [(4,)], DPTP + [()], [("dp", None), ("dp", None)],
       "a pending sum times pcast(w, 'tp', to='reduced') on either side, psum'd; w's gradient is summed by the "
       "cast's backward", types=(("r", *R_TP), ("u * r", *VDP_UTP))),
    _r("rd_ops_of_reduced", X816 + [(4,)], DPTP + [()], [("dp", None)],
       "sin, a product and a sum of reduced values stay reduced; the product times a pending sum, psum'd (JAX "
       "cannot differentiate tanh of a reduced value: its JVP multiplies by a replicated constant)",
       types=(("sin r", *R_TP), ("r * r", *R_TP), ("sum", *R_TP))),
    _r("rd_in_specs", [(8, 4), (4, 3)], [("dp", None), (None, None)], [("dp", None)],
       "a weight entering P(reduced={'dp'}) (ours: a Replicate DTensor), tanh(x @ w); its gradient leaves "
       "unreduced over dp (ours: Partial('sum'))", in_reduced=((), ("dp",)),
       types=(("w", (), (), ("dp",)), ("y", ("dp",), ()))),
    _r("rd_out_specs", [(4,)], [()], [()], "pcast(w, 'tp', to='reduced') returned under P(reduced={'tp'})",
       out_reduced=(("tp",),)),
    _r("rd_relabel", [(8, 16), (4,)], [(None, "tp"), ()], [(None, "tp")],
       "x * r with x varying over tp and r reduced over tp: r is cast to varying (JAX's reduced_vary_cast)",
       types=(("x * r", ("tp",), ()),)),
    # JAX refuses these and we allow them: values and gradients equal one process
    _r("rd_relabel_and_pvary", X816 + [(4,)], DPTP + [()], [("dp", "tp")],
       "x * r with x varying over dp and tp, r reduced over tp only: ours relabels tp and pvarys dp (JAX "
       "pvarys both and refuses)", jax_refuses=JAX12_REDUCED_ARG),
    _r("rd_times_number", X816 + [(4,)], DPTP + [()], [("dp", None)],
       "a pending sum times (2 * r + 1) with r reduced (JAX refuses a number beside a reduced value)",
       jax_refuses=JAX12_REPLICATED),
    _r("rd_matmul", X816 + [(4, 3)], DPTP + [()], [("dp", None)],
       "a pending sum @ a reduced weight, psum'd (JAX refuses dot_general of an unreduced operand)",
       jax_refuses=JAX_DOT_GENERAL),
    _r("rd_tanh", X816 + [(4,)], DPTP + [()], [("dp", None)],
       "a pending sum times tanh(r), psum'd, with its gradient (tanh's derivative multiplies by a replicated "
       "constant, which JAX refuses beside a reduced value)", jax_refuses=JAX12_REPLICATED),
    _r("rd_div", X816 + [()], DPTP + [()], [("dp", None)],
       "a pending sum divided by a reduced scalar, psum'd (JAX runs the forward, not the gradient)",
       jax_refuses=r"RHS should be reduced along the same axes LHS is unreduced on"),
    # both refuse
    _r("rd_plus_invariant", [(4,)], [()], [()], "a reduced value plus an invariant one",
       jax_refuses=JAX12_REPLICATED, fails=VMA,
       message=(r"`Tensor\.add` combines a value reduced over 'tp'", r"fm\.pcast\(y, 'tp', to='reduced'\)")),
    _r("rd_psum", [(4,)], [()], [()], "psum over 'tp' of a value reduced over 'tp'",
       jax_refuses=JAX12_REDUCED_ARG, fails=VMA,
       message=(r"`psum` over \('tp',\) requires a value that is not reduced", r"to='varying'")),
    _r("rd_all_gather", [(4,)], [()], [()], "all_gather over 'tp' of a value reduced over 'tp'",
       jax_refuses=JAX12_REDUCED_ARG, fails=VMA, message=(r"`all_gather` over \('tp',\) requires a value that is "
                                                          r"not reduced",)),
    _r("rd_pcast_varying", X816, DPTP, [("dp", "tp")], "pcast(x, 'tp', to='reduced') of a varying x",
       jax_refuses=r"Unsupported pcast from=varying, to='reduced'", fails=VMA,
       message=(r"`pcast` requires a value invariant over the axes it casts to reduced", r"varies over \['tp'\]")),
    _r("rd_pcast_twice", [(4,)], [()], [()], "pcast to='reduced' of a reduced value", out_reduced=(("tp",),),
       jax_refuses=r"Unsupported pcast from=reduced, to='reduced'", fails=VMA,
       message=(r"is already reduced over \['tp'\]",)),
    _r("rd_out_mismatch", [(4,)], [()], [()], "an invariant value under P(reduced={'tp'})", out_reduced=(("tp",),),
       jax_refuses=r"should be equal to the reduced present on the out_aval", fails=VMA,
       message=(r"reduced over \[\], but its out_spec P\(reduced=\{'tp'\}\)", r"to='reduced'")),
    _r("rd_out_unnamed", [(4,)], [()], [()], "a reduced value under P() (no reduced=)",
       jax_refuses=r"require replication which can't be statically inferred", fails=VMA,
       message=(r"reduced over \['tp'\], but its out_spec P\(\) says reduced over \[\]",)),
    # pending max and min: JAX runs the forward (values, types), one process the gradients
    _mx("mx_pmax", "pmax over 'tp' of a pending max, of its amax over dim 1 and of its transpose",
        [("dp", None), ("dp",), (None, "dp")], types=(("m", ("dp",), ("tp",)), ("amax", ("dp",), ("tp",)))),
    _mx("mn_pmin", "pmin over 'tp' of a pending min, of a reshape and a cat of it", [("dp",), ("dp", None)],
        kind="min"),
    _mx("mx_out", "a pending max returned under its out_spec (ours: a Partial('max') DTensor); no gradient (JAX "
        "has none; ours: DTensor's, each member the whole cotangent)", [(None, "dp")], out_unreduced=(("tp",),),
        out_kind=("max",), grad=False),
    # both refuse
    _mx("mx_psum", "psum over 'tp' of a pending max", [("dp", None)], fails=VMA,
        jax_refuses=r"unreduced_psum cannot accept args with unreduced_kind=UnreducedKind\.max",
        message=(r"`psum` requires a value whose pending reduction is of kind 'sum'", r"kind 'max'",
                 r"fm\.pmax\(x, 'tp'\)")),
    _mx("mx_pmin", "pmin over 'tp' of a pending max", [("dp", None)], fails=VMA,
        jax_refuses=r"unreduced_pmin cannot accept args with unreduced_kind=UnreducedKind\.max",
        message=(r"`pmin` requires a value whose pending reduction is of kind 'min'", r"kind 'max'")),
    _mx("mx_add", "a pending max plus itself", [("dp", None)], fails=VMA, jax_refuses=JAX12_WANTS_SUM,
        message=(r"`Tensor\.add` requires a pending sum", r"kind 'max'", r"fm\.pmax\(x, 'tp'\)")),
    _mx("mx_scale", "a pending max times 2", [("dp", None)], fails=VMA, jax_refuses=JAX12_WANTS_SUM,
        message=(r"`Tensor\.mul` requires a pending sum",)),
    _mx("mx_sum", "the sum of a pending max", [("dp",)], fails=VMA, jax_refuses=JAX12_WANTS_SUM,
        message=(r"`Tensor\.sum` requires a pending sum",)),
    _mx("mx_amin", "amin of a pending max", [("dp",)], fails=VMA,
        jax_refuses=r"Expected unreduced_kind=UnreducedKind\.min but got UnreducedKind\.max",
        message=(r"`Tensor\.amin` is a min reduction", r"kind 'max'")),
]

UNREDUCED_BY_NAME: dict[str, UnreducedProgram] = {p.name: p for p in UNREDUCED}
assert len(UNREDUCED_BY_NAME) == len(UNREDUCED), "program names must be unique"
assert not set(UNREDUCED_BY_NAME) & set(BY_NAME), "unreduced programs are kept apart from ALL"
