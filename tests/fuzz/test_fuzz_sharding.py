"""Fuzz the layout and sharding values: Layout, P, NamedSharding and its shard queries.

Valid results are checked against independent oracles: a layout against the brute-force
row-major dot product, local slices against ``torch.chunk`` applied axis by axis (DTensor's
rule, docs/design.md "Sharding"), ``shard_shape`` against the largest local shard.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from hypothesis import strategies as st

from functional_mesh import Layout, Mesh, NamedSharding, P, PartitionSpec
from functional_mesh import _layout as L
from tests.fuzz._harness import (
    _OBJ,
    BAD_INTS,
    BAD_NAMES,
    Registry,
    bad,
    fresh_name,
    misspell,
    pick,
    valid,
)
from tests.strategies import derived_meshes

REG = Registry()  # the test is made at the end of the module, after every entry point registered


def _check(cond: bool, what: object) -> None:
    assert cond, what


# -- Layout ---------------------------------------------------------------------------------------


def brute_indices(shape: tuple[int, ...], stride: tuple[int, ...]) -> list[int]:
    """Row-major over ``shape`` (last mode fastest), dotted with ``stride``."""
    return [sum(c * d for c, d in zip(coord, stride)) for coord in itertools.product(*map(range, shape))]


@REG.entry("Layout")
def layout_case(draw):
    k = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(k))
    stride = tuple(draw(st.integers(0, 12)) for _ in range(k)) if draw(st.booleans()) else None
    form = pick(draw, ["tuple", "list", "numpy"] + (["int", "0-d"] if k == 1 else []))

    def as_form(t):
        if form in ("int", "0-d") and len(t) == 1:  # one mode: a plain int or a 0-d integer array
            return t[0] if form == "int" else np.array(t[0])
        return {"list": list(t), "numpy": np.array(t, dtype=np.int64)}.get(form, t)

    def call(shape=shape, stride=stride, wrap=True):
        s = as_form(shape) if wrap else shape
        d = (as_form(stride) if wrap else stride) if stride is not None else None
        return lambda: Layout(s, d)

    effective = stride if stride is not None else L.row_major_strides(shape)

    def check(lay):
        assert L.indices(lay).tolist() == brute_indices(shape, effective), (lay, shape, effective)
        assert lay.size == math.prod(shape)

    kinds = ["valid"] * 2 + ["shape<1", "shape-type", "container", "call"]
    if k:
        kinds += ["stride<0", "stride-len", "stride-type"]
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"Layout({shape}, {stride})", call(), check)
    if kind == "shape<1" and k:
        i, v = draw(st.integers(0, k - 1)), draw(st.integers(-3, 0))
        s = shape[:i] + (v,) + shape[i + 1:]
        return bad(f"mode size {v}", call(shape=s, wrap=False), s)
    if kind == "shape-type" and k:
        i, v = draw(st.integers(0, k - 1)), pick(draw, BAD_INTS)
        return bad(f"mode size {v!r}", call(shape=shape[:i] + (v,) + shape[i + 1:], wrap=False), v)
    if kind == "stride<0":
        i, v = draw(st.integers(0, k - 1)), draw(st.integers(-5, -1))
        d = effective[:i] + (v,) + effective[i + 1:]
        return bad(f"stride {v}", call(stride=d, wrap=False), d)
    if kind == "stride-len":
        d = effective[:-1] if draw(st.booleans()) else effective + (1,)
        return bad(f"{len(d)} strides for {k} modes", call(stride=d, wrap=False), d, shape)
    if kind == "stride-type":
        i, v = draw(st.integers(0, k - 1)), pick(draw, BAD_INTS)
        return bad(f"stride {v!r}", call(stride=effective[:i] + (v,) + effective[i + 1:], wrap=False), v)
    if kind == "container":
        v = pick(draw, ["ab", 2.5, {2: 1}, {2, 3}, _OBJ, True])
        if draw(st.booleans()):
            v = None if draw(st.booleans()) else v  # shape=None is no shape; stride=None is row-major
            return bad(f"shape={v!r}", lambda: Layout(v), v)
        return bad(f"stride={v!r}", lambda: Layout(shape or 1, v), v)
    if kind == "call":  # the layout as a function of a flat coordinate
        lay = Layout(shape, stride)
        kind2 = pick(draw, ["in", "in", "out", "type"])
        if kind2 == "in":
            i = draw(st.integers(0, lay.size - 1))
            return valid(f"{lay}({i})", lambda: lay(i), lambda out: _check(out == brute_indices(shape, effective)[i], out))
        if kind2 == "out":
            i = pick(draw, [-1, -7, lay.size, lay.size + 3])
            return bad(f"{lay}({i})", lambda: lay(i), i)
        v = pick(draw, BAD_INTS)
        return bad(f"{lay}({v!r})", lambda: lay(v), v)
    return valid(f"Layout({shape}, {stride}) (fallback)", call(), check)


# -- PartitionSpec --------------------------------------------------------------------------------

SPEC_NAMES = ("dp", "tp", "cp", "a", "b")


@REG.entry("P")
def partition_spec_case(draw):
    entries: list[object] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = pick(draw, ["none", "str", "tuple", "list"])
        if kind == "none":
            entries.append(None)
        elif kind == "str":
            entries.append(pick(draw, SPEC_NAMES))
        else:
            names = draw(st.lists(st.sampled_from(SPEC_NAMES), max_size=3))
            entries.append(tuple(names) if kind == "tuple" else names)

    def normal(e):
        if isinstance(e, (tuple, list)):
            return None if not e else e[0] if len(e) == 1 else tuple(e)
        return e

    written = [normal(e) for e in entries]
    expected = list(written)
    while expected and expected[-1] is None:
        expected.pop()

    def check(spec):
        # trailing Nones count, in len(spec) (the rank a value needs) and in equality, as in JAX
        assert spec == P(*written) and tuple(spec) == tuple(written), (spec, written)
        assert spec.entries == tuple(expected) and (spec == P(*expected)) == (written == expected)
        assert isinstance(spec, PartitionSpec) and len(spec) == len(entries)

    kind = pick(draw, ["valid"] * 2 + ["unreduced"] * 2 + ["unreduced-split", "unreduced-type", "empty-name",
                                                             "entry-type", "name-type-in-tuple", "empty-name-in-tuple"])
    if kind == "valid":
        return valid(f"P{tuple(entries)}", lambda: P(*entries), check)
    used = {a for e in written if e is not None for a in ((e,) if isinstance(e, str) else e)}
    if kind == "unreduced":  # a pending sum over axes that split no dim: equal however the names are given
        free = [n for n in SPEC_NAMES if n not in used]
        names = draw(st.lists(st.sampled_from(free), max_size=3)) if free else []
        form = pick(draw, [set, list, tuple, frozenset] + ([lambda ns: ns[0]] if len(names) == 1 else []))

        def check_unreduced(spec):
            assert tuple(spec) == tuple(written) and spec.entries == tuple(expected) and len(spec) == len(entries)
            assert spec.unreduced == frozenset(names) and spec == P(*written, unreduced=sorted(names))
            assert P.from_key(spec.key) == spec and (spec == P(*written)) == (not names)

        return valid(f"P{tuple(entries)}, unreduced={names}", lambda: P(*entries, unreduced=form(names)),
                     check_unreduced)
    if kind == "unreduced-split" and used:  # an axis both splitting a dim and pending: refused, naming it
        name = pick(draw, sorted(used))
        return bad(f"P{tuple(entries)}, unreduced={{{name!r}}}", lambda: P(*entries, unreduced={name}), name)
    if kind == "unreduced-type":
        v = pick(draw, [3, 2.5, None, b"dp", _OBJ])
        return bad(f"unreduced={v!r}", lambda: P(*entries, unreduced=v if v is None else [v]), v)
    i = draw(st.integers(0, len(entries)))
    if kind == "empty-name":
        return bad("entry ''", lambda: P(*entries[:i], "", *entries[i:]), "")
    if kind == "entry-type":
        v = pick(draw, [3, 2.5, True, b"dp", {"dp"}, {"dp": 0}, _OBJ, np.int64(0)])
        return bad(f"entry {v!r}", lambda: P(*entries[:i], v, *entries[i:]), v)
    if kind == "name-type-in-tuple":
        v = pick(draw, BAD_NAMES + (("dp",),))
        t = ("dp", v) if draw(st.booleans()) else (v,)
        return bad(f"name {v!r} inside {t!r}", lambda: P(*entries[:i], t, *entries[i:]), v)
    t = ("dp", "") if draw(st.booleans()) else ("",)
    return bad(f"name '' inside {t!r}", lambda: P(*entries[:i], t, *entries[i:]), t, "")


# -- NamedSharding ----------------------------------------------------------------------------------


@st.composite
def specs_for(draw, mesh: Mesh) -> list[tuple[str, ...]]:
    """Per tensor dim, the axes that split it (each mesh axis at most once), in random order."""
    ndims = draw(st.integers(0, 3))
    dims: list[list[str]] = [[] for _ in range(ndims)]
    if ndims:
        for name in draw(st.permutations(mesh.axis_names)):
            d = draw(st.integers(-1, ndims - 1))
            if d >= 0:
                dims[d].append(name)
    return [tuple(d) for d in dims]


def entries_of(dims: list[tuple[str, ...]], draw) -> list[object]:
    out: list[object] = []
    for axes in dims:
        if not axes:
            out.append(pick(draw, [None, ()]))
        elif len(axes) == 1:
            out.append(pick(draw, [axes[0], axes, list(axes)]))
        else:
            out.append(pick(draw, [axes, list(axes)]))
    return out


@REG.entry("NamedSharding")
def named_sharding_case(draw):
    m = draw(derived_meshes(32))
    dims = draw(specs_for(m))
    entries = entries_of(dims, draw)
    form = pick(draw, ["P", "tuple", "list"])

    def call(mesh=m, entries=entries, form=form):
        spec = {"P": lambda: P(*entries), "tuple": lambda: tuple(entries), "list": lambda: list(entries)}[form]()
        return lambda: NamedSharding(mesh, spec)

    def check(sh):
        assert sh.mesh is m and sh.spec == P(*entries), sh
        for d, axes in enumerate(dims):
            assert sh.spec.axes_of(d) == axes

    kinds = ["valid"] * 2 + ["mesh-type", "spec-type"]
    if m.ndim:
        kinds += ["bad-axis", "twice"]
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"NamedSharding({m!r}, P{tuple(entries)})", call(), check)
    if kind == "mesh-type":
        v = pick(draw, [None, (2, 2), "mesh", _OBJ, P("dp")])
        return bad(f"mesh={v!r}", call(mesh=v), v)
    if kind == "spec-type":
        v = pick(draw, ["dp", 5, None, {"dp": 0}, {"dp"}, 2.5])
        return bad(f"spec={v!r}", lambda: NamedSharding(m, v), v)
    if kind == "bad-axis":
        names = m.axis_names
        if draw(st.booleans()):
            v = misspell(pick(draw, names), names)
            kw = {"unknown_axis": v, "suggest": True}
        else:
            v = fresh_name(names, "zz")
            kw = {"unknown_axis": v}
        d = draw(st.integers(0, len(dims)))
        spec = list(dims[:d]) + [(v,) + (dims[d] if d < len(dims) else ())] + list(dims[d + 1:])
        return bad(f"unknown axis {v!r}", call(entries=spec, form="P"), v, **kw)
    # one axis twice: in another dim, or twice in the same tuple
    name = pick(draw, m.axis_names)
    used = [d for d, axes in enumerate(dims) if name in axes]
    extra = draw(st.integers(0, len(dims)))
    spec = [list(a) for a in dims] + [[] for _ in range(extra + 1 - len(dims))]
    if not used:
        spec[extra].append(name)
    spec[extra].append(name)
    return bad(f"axis {name!r} twice", call(entries=[tuple(a) for a in spec], form="P"), name)


# -- shard queries ------------------------------------------------------------------------------


def chunk_oracle(n: int, splits: list[tuple[int, int]]) -> tuple[int, int | None]:
    """``(length, start or None)`` of the piece of ``range(n)`` that ``torch.chunk`` gives, axis by axis.

    ``splits``: ``(axis size, coordinate)`` pairs, major axis first.
    """
    idx = torch.arange(n)
    for k, c in splits:
        parts = torch.chunk(idx, k) if idx.numel() else ()
        idx = parts[c] if c < len(parts) else idx[:0]
    if idx.numel():
        assert torch.equal(idx, torch.arange(int(idx[0]), int(idx[0]) + idx.numel()))
        return idx.numel(), int(idx[0])
    return 0, None


def expected_slices(sh: NamedSharding, shape: tuple[int, ...], rank: int) -> list[tuple[int, int | None]]:
    coord = dict(zip(sh.mesh.axis_names, sh.mesh.coordinate(rank)))
    return [chunk_oracle(n, [(sh.mesh.axis_size(a), coord[a]) for a in sh.spec.axes_of(d)])
            for d, n in enumerate(shape)]


def same_as_oracle(got: tuple[slice, ...], want: list[tuple[int, int | None]]) -> bool:
    return len(got) == len(want) and all(
        s.stop - s.start == length and (start is None or s.start == start) and s.step is None
        for s, (length, start) in zip(got, want))


_SAME = object()


@REG.entry("NamedSharding.shard_shape/local_slices/devices_indices_map")
def shard_query_case(draw):
    m = draw(derived_meshes(32))
    sh = NamedSharding(m, P(*draw(specs_for(m))))
    rank_of_spec = len(sh.spec)
    shape = tuple(draw(st.integers(0, 13)) for _ in range(rank_of_spec + draw(st.integers(0, 2))))
    which = pick(draw, ["shard_shape", "local_slices", "devices_indices_map"])
    devices = m.devices.tolist()
    rank = pick(draw, devices)

    def call(shape_arg=_SAME, rank_arg=rank):
        s = shape if shape_arg is _SAME else shape_arg
        if which == "local_slices":
            return lambda: sh.local_slices(s, rank_arg)
        return lambda: getattr(sh, which)(s)

    def check(out):
        if which == "local_slices":
            assert same_as_oracle(out, expected_slices(sh, shape, rank)), (out, expected_slices(sh, shape, rank))
        elif which == "devices_indices_map":
            assert sorted(out) == sorted(devices)
            for r, slices in out.items():
                assert same_as_oracle(slices, expected_slices(sh, shape, r)), (r, slices)
        else:
            largest = [max((length for length, _ in col), default=0) for col in
                       zip(*(expected_slices(sh, shape, r) for r in devices))] if shape else []
            assert out == tuple(largest), (out, largest)

    kinds = ["valid"] * 2 + ["dim<0", "dim-type", "container"]
    if rank_of_spec:
        kinds.append("short")
    if which == "local_slices":
        kinds += ["rank<0", "rank-type", "outside"]
    kind = pick(draw, kinds)
    if kind == "valid":
        form = pick(draw, ["tuple", "list", "size"])
        arg = {"tuple": shape, "list": list(shape), "size": torch.Size(shape)}[form]
        return valid(f"{which}({arg!r}) of {sh!r}", call(shape_arg=arg), check)
    if kind == "dim<0" and shape:
        i, v = draw(st.integers(0, len(shape) - 1)), draw(st.integers(-9, -1))
        return bad(f"dim {v}", call(shape_arg=shape[:i] + (v,) + shape[i + 1:]), v)
    if kind == "dim-type" and shape:
        i, v = draw(st.integers(0, len(shape) - 1)), pick(draw, BAD_INTS)
        return bad(f"dim {v!r}", call(shape_arg=shape[:i] + (v,) + shape[i + 1:]), v)
    if kind == "short":
        s = shape[:rank_of_spec - 1]
        return bad(f"shape {s} for spec {sh.spec}", call(shape_arg=s), s)
    if kind == "container":
        v = pick(draw, [4, "ab", None, {0: 4}, {4}, np.array([4, 4]), _OBJ, 2.5])
        return bad(f"global_shape={v!r}", call(shape_arg=v), v)
    if kind == "rank<0":
        v = draw(st.integers(-99, -1))
        return bad(f"rank {v}", call(rank_arg=v), v)
    if kind == "rank-type":
        v = pick(draw, BAD_INTS)
        return bad(f"rank {v!r}", call(rank_arg=v), v)
    if kind == "outside":
        r = max(devices) + draw(st.integers(1, 5))
        return valid(f"local_slices of non-device {r}", call(rank_arg=r), lambda out: _check(out is None, out))
    return valid(f"{which}({shape}) (fallback)", call(), check)


@REG.entry("NamedSharding.placements")
def placements_case(draw):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    m = draw(derived_meshes(32))
    dims = draw(specs_for(m))
    sh = NamedSharding(m, P(*dims))
    order = {n: i for i, n in enumerate(m.axis_names)}

    def check(placements):
        assert len(placements) == m.ndim, placements
        for name, p in zip(m.axis_names, placements):
            where = [(d, axes) for d, axes in enumerate(dims) if name in axes]
            if not where:
                assert isinstance(p, Replicate), (name, p)
                continue
            (d, axes), = where
            major_later = [a for a in axes[:axes.index(name)] if order[a] > order[name]]
            if major_later:  # listed against mesh order: split inside pieces DTensor makes later
                factor = math.prod(m.axis_size(a) for a in major_later)
                assert p == _StridedShard(d, split_factor=factor), (name, p, sh)
            else:
                assert type(p) is Shard and p.dim == d, (name, p, sh)

    return valid(f"{sh!r}.placements", lambda: sh.placements, check)


# -- plan_reshard ----------------------------------------------------------------------------------


@REG.entry("plan_reshard")
def plan_reshard_case(draw):
    from functional_mesh import plan_reshard

    a, b = draw(derived_meshes(16)), draw(derived_meshes(16))
    src, dst = NamedSharding(a, P(*draw(specs_for(a)))), NamedSharding(b, P(*draw(specs_for(b))))
    ndim = max(len(src.spec), len(dst.spec)) + draw(st.integers(0, 1))
    shape = tuple(draw(st.integers(0, 7)) for _ in range(ndim))
    dtype = pick(draw, ["float32", "bfloat16", "torch.int64", torch.float16, np.dtype("int8")])
    relays = draw(st.booleans())
    for name, sh in (("src", src), ("dst", dst)):
        if sh.mesh.num_groups != 1:  # a family: plan each group on its own mesh
            return bad(f"{name} mesh {sh.mesh!r} is a family", lambda: plan_reshard(src, dst, shape, dtype), sh.mesh)

    def check(plan):  # every destination rank receives its block once (local copies included), never more
        itemsize = plan.itemsize
        for rank in b.devices.tolist()[:8]:
            block = dst.local_slices(shape, rank)
            want = math.prod(s.stop - s.start for s in block) * itemsize
            assert sum(m.nbytes for m in plan.receives(rank)) == want, (rank, plan)
        assert 0 <= plan.bytes_moved <= b.num_devices * math.prod(shape) * itemsize

    kind = pick(draw, ["valid", "valid", "dtype", "shape", "unreduced", "relays"])
    if kind == "valid":
        return valid(f"plan_reshard({src!r}, {dst!r}, {shape}, {dtype!r})",
                     lambda: plan_reshard(src, dst, shape, dtype, relays=relays), check)
    if kind == "dtype":
        v = pick(draw, ["float33", "", _OBJ, 4, None])
        return bad(f"dtype={v!r}", lambda: plan_reshard(src, dst, shape, v), v)
    if kind == "relays":
        v = pick(draw, [1, 0, "yes", None])
        return bad(f"relays={v!r}", lambda: plan_reshard(src, dst, shape, dtype, relays=v), v)
    if kind == "shape" and len(src.spec):
        v = shape[:len(src.spec) - 1]
        return bad(f"shape={v!r} for {src.spec}", lambda: plan_reshard(src, dst, v, dtype), v)
    spare = [n for n in a.axis_names if not any(n in src.spec.axes_of(d) for d in range(len(src.spec)))]
    if not spare:
        return valid(f"plan_reshard({src!r}, {dst!r}, {shape}, {dtype!r})",
                     lambda: plan_reshard(src, dst, shape, dtype, relays=relays), check)
    pending = NamedSharding(a, P(*src.spec, unreduced=spare[:1]))
    return bad(f"unreduced {spare[0]!r}", lambda: plan_reshard(pending, dst, shape, dtype), pending.spec)


test_entry_point = REG.test()
