"""Fuzz the Mesh value's entry points with bad values and types, valid inputs mixed in.

Each entry point draws one call with at most one thing wrong (see tests/fuzz/_harness.py for
the rule). The expected verdict comes from the contract (docs/design.md: "The public contract", "Errors", "Edge cases"), computed here
independently of the library: e.g. whether an unflatten splits an axis along its modes, or
whether a layout tuple tiles a device count.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

from functional_mesh import Layout, Mesh, make_mesh
from tests.fuzz._harness import (
    _OBJ,
    BAD_INTS,
    BAD_NAMES,
    Registry,
    Shown,
    bad,
    bad_axis_name,
    fresh_name,
    fresh_names,
    int_like,
    is_open,
    misspell,
    pick,
    valid,
)
from tests.strategies import derived_meshes, factorizations

REG = Registry()  # the test is made at the end of the module, after every entry point registered

POOL = ("dp", "cp", "tp", "pp", "ep", "a", "b", "dp_shard")
RANK_POOL_MAX = 200


def axis_meshes(min_axes: int = 1) -> st.SearchStrategy[Mesh]:
    """Derived meshes (select / flatten / unflatten / transpose / rename chains) with >= min_axes axes."""
    return derived_meshes(32).filter(lambda m: m.ndim >= min_axes)


# -- make_mesh -------------------------------------------------------------------------------


@st.composite
def device_arguments(draw, sizes: tuple[int, ...]) -> tuple[object, list[int]]:
    """A valid ``devices=`` for ``sizes`` in one of the accepted containers, and the flat ranks."""
    n = math.prod(sizes)
    kind = pick(draw, ["none", "range", "reversed", "perm", "sparse", "tuple", "numpy", "torch", "nested", "iter"])
    if kind == "none":
        return None, list(range(n))
    start = draw(st.integers(0, 20))
    if kind == "range":
        return range(start, start + n), list(range(start, start + n))
    if kind == "reversed":
        return range(start + n - 1, start - 1, -1), list(range(start + n - 1, start - 1, -1))
    if kind == "sparse":
        flat = draw(st.lists(st.integers(0, RANK_POOL_MAX), min_size=n, max_size=n, unique=True))
    else:
        flat = list(draw(st.permutations(range(start, start + n))))
    if kind == "tuple":
        return tuple(flat), flat
    if kind == "numpy":
        return np.array(flat, dtype=pick(draw, [np.int64, np.int32, np.uint16])), flat
    if kind == "torch":
        return torch.tensor(flat, dtype=pick(draw, [torch.int64, torch.int32])), flat
    if kind == "nested" and sizes:  # rectangular nesting is flattened row-major (tests/unit/test_devices.py)
        return np.array(flat, dtype=np.int64).reshape(sizes).tolist(), flat
    if kind == "iter":
        return iter(flat), flat
    return flat, flat


@REG.entry("make_mesh")
def make_mesh_case(draw):
    sizes = list(draw(factorizations(48, 4)))
    names = list(draw(st.lists(st.sampled_from(POOL), min_size=len(sizes), max_size=len(sizes), unique=True)))
    devices, flat = draw(device_arguments(tuple(sizes)))
    n = math.prod(sizes)

    def call(sizes=sizes, names=names, devices=devices):
        return lambda: make_mesh(sizes, names, devices=devices)

    def check(m):
        assert m.axis_names == tuple(names) and m.axis_sizes == tuple(sizes), m
        assert m.devices.tolist() == flat and m.num_groups == 1

    kinds = ["valid"] * 3 + ["sizes-like", "size<1", "size-type", "sizes-container", "names-count",
                             "name-type", "name-empty", "names-container", "devices-len", "device-neg",
                             "device-type", "devices-container", "huge"]
    if len(names) >= 2:
        kinds.append("name-dup")
    if n >= 2:
        kinds.append("device-dup")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid("make_mesh", call(), check)
    if kind == "sizes-like":  # ints as numpy scalars / 0-d arrays, names as a str for one axis
        like = [int_like(draw, s) for s in sizes]
        nm = names[0] if len(names) == 1 and draw(st.booleans()) else tuple(names)
        return valid("make_mesh with int-like sizes", call(sizes=like, names=nm), check)
    if kind == "size<1" and sizes:
        i, v = draw(st.integers(0, len(sizes) - 1)), draw(st.integers(-4, 0))
        return bad(f"size {v}", call(sizes=sizes[:i] + [v] + sizes[i + 1:]), v)
    if kind == "size-type" and sizes:
        i, v = draw(st.integers(0, len(sizes) - 1)), pick(draw, BAD_INTS)
        return bad(f"size {v!r}", call(sizes=sizes[:i] + [v] + sizes[i + 1:]), v)
    if kind == "sizes-container":
        choices = [None, 4, 4.5, "24", _OBJ]
        if not is_open("make_mesh-unordered-sizes"):
            choices += [{2, 3}, {4: "x"}, frozenset({2})]
        v = pick(draw, choices)
        return bad(f"axis_sizes={v!r}", call(sizes=v), v)
    if kind == "names-count":
        other = names[:-1] if names and draw(st.booleans()) else names + [fresh_name(set(names), "x")]
        return bad("one name too many or too few", call(names=other), tuple(other), tuple(sizes))
    if kind == "name-dup":
        i, j = draw(st.permutations(range(len(names))))[:2]
        dup = list(names)
        dup[j] = names[i]
        return bad("duplicate axis name", call(names=dup), tuple(dup), names[i])
    if kind == "name-type" and names:
        i, v = draw(st.integers(0, len(names) - 1)), pick(draw, BAD_NAMES + (("a",), ["a"]))
        return bad(f"axis name {v!r}", call(names=names[:i] + [v] + names[i + 1:]), v)
    if kind == "name-empty" and names:
        i = draw(st.integers(0, len(names) - 1))
        other = names[:i] + [""] + names[i + 1:]
        return bad("empty axis name", call(names=other), tuple(other), "")
    if kind == "names-container":
        v = pick(draw, [None, 3, {"a": 1}, {"a"}, _OBJ, b"ab", 2.5])
        return bad(f"axis_names={v!r}", call(names=v), v)
    if kind == "devices-len":
        m = draw(st.sampled_from([k for k in (n - 1, n + 1, n + 2) if k >= 0]))
        devs = list(range(m))
        return bad(f"{m} devices for {n} positions", call(devices=devs), m)
    if kind == "device-neg" and n >= 1:
        v = draw(st.integers(-9, -1))
        if draw(st.booleans()):
            r = range(v, v + n)
            return bad(f"devices={r!r}", call(devices=r), r, v)
        devs = list(range(n))
        devs[draw(st.integers(0, n - 1))] = v
        return bad(f"device {v}", call(devices=devs), v)
    if kind == "device-type" and n >= 1:
        # one device nested in a list is legal nesting (flattened); in a longer list it is ragged
        v = pick(draw, [x for x in BAD_INTS if n >= 2 or not isinstance(x, (list, tuple))])
        devs: list[object] = list(range(n))
        devs[draw(st.integers(0, n - 1))] = v
        return bad(f"device {v!r}", call(devices=devs), v, devs)  # a nested one is a ragged list
    if kind == "device-dup":
        devs = list(range(n))
        i, j = draw(st.permutations(range(n)))[:2]
        devs[j] = devs[i]
        return bad(f"duplicate device {devs[i]}", call(devices=devs), devs[i])
    if kind == "devices-container":
        v = pick(draw, ["0123", 4, 3.5, _OBJ, np.zeros(n), np.ones(n, dtype=bool), {0: 1}, {0, 1}])
        if isinstance(v, np.ndarray):
            return bad(f"devices of dtype {v.dtype}", call(devices=v), Shown(repr(str(v.dtype))))
        return bad(f"devices={v!r}", call(devices=v), v)
    if kind == "huge":  # more devices than an index can count (ranks are int64)
        big = [2**40, 2**40] if draw(st.booleans()) else [2**62, 2]
        if draw(st.booleans()):
            devs = list(range(n))
            if n:
                devs[-1] = 2**63 + draw(st.integers(0, 5))
                return bad(f"device {devs[-1]}", call(devices=devs), devs[-1])
        return bad(f"axis_sizes={big}", call(sizes=big, names=["a", "b"], devices=None), math.prod(big))
    return valid("make_mesh (fallback)", call(), check)


# -- Mesh(...) ------------------------------------------------------------------------------------


def span(layouts) -> int:
    """One past the largest index the axes can reach together (1 for no modes)."""
    return max([s * d for lay in layouts for s, d in lay.modes], default=1)


@REG.entry("Mesh")
def mesh_constructor_case(draw):
    m = draw(derived_meshes(32))
    names = m.axis_names
    layouts = tuple(m.axis_layout(a) for a in names)
    n = m.num_devices
    dev = pick(draw, ["list", "devicelist", "array"] + (["int"] if m.device_list.is_iota else []))
    devices = {"list": m.devices.tolist(), "devicelist": m.device_list, "array": m.devices, "int": n}[dev]

    def call(names=names, layouts=layouts, devices=devices):
        return lambda: Mesh(names, layouts, devices)

    kinds = ["valid"] * 2 + ["transposed", "count", "layout-type", "names-type", "names-container", "n",
                             "devices-type", "layouts-container"]
    if any(lay.size > 1 for lay in layouts) and m.ndim >= 2:
        kinds.append("overlap")
    if m.ndim >= 2:
        kinds.append("names-dup")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid("Mesh from a mesh's parts", call(), lambda out: _eq(out, m))
    if kind == "transposed" and m.ndim:
        perm = draw(st.permutations(range(m.ndim)))
        return valid("Mesh from permuted parts", call(names=[names[i] for i in perm],
                                                      layouts=[layouts[i] for i in perm]),
                     lambda out: _eq(out, m.transpose(*[names[i] for i in perm])))
    if kind == "n":  # an int device count: valid iff the axes' translates tile it
        k = draw(st.integers(-3, 3 * n + 3))
        if k >= 1 and k % span(layouts) == 0:
            return valid(f"Mesh over {k} devices", call(devices=k),
                         lambda out: _check(out.num_groups * out.size == k, out))
        return bad(f"Mesh over {k} devices", call(devices=k), k)
    if kind == "overlap":
        i = draw(st.sampled_from([i for i, lay in enumerate(layouts) if lay.size > 1]))
        j = draw(st.sampled_from([j for j in range(m.ndim) if j != i]))
        lays = list(layouts)
        lays[j] = layouts[i]
        return bad("two axes with one layout", call(layouts=lays), Shown(str(tuple(str(x) for x in lays))))
    if kind == "count" and m.ndim:
        return bad("one layout too few", call(layouts=layouts[:-1]), layouts[:-1], names)
    if kind == "layout-type" and m.ndim:
        i, v = draw(st.integers(0, m.ndim - 1)), pick(draw, [(2, 1), 4, "2:1", None, m, [layouts[0]]])
        return bad(f"layout {v!r}", call(layouts=layouts[:i] + (v,) + layouts[i + 1:]), v)
    if kind == "layouts-container":
        choices = ["ab"] + ([] if is_open("Mesh-layouts-not-iterable") else [5, None, 2.5])
        v = pick(draw, choices)
        return bad(f"layouts={v!r}", call(layouts=v), v, "a")
    if kind == "names-dup":
        i, j = draw(st.permutations(range(m.ndim)))[:2]
        dup = list(names)
        dup[j] = names[i]
        return bad("duplicate axis names", call(names=dup), tuple(dup), names[i])
    if kind == "names-type" and m.ndim:
        i, v = draw(st.integers(0, m.ndim - 1)), pick(draw, BAD_NAMES)
        return bad(f"axis name {v!r}", call(names=names[:i] + (v,) + names[i + 1:]), v)
    if kind == "names-container":
        v = pick(draw, [5, None, {"a": 1}, 2.5])
        return bad(f"axis_names={v!r}", call(names=v), v)
    if kind == "devices-type":
        v = pick(draw, [2.0, True, "4", None, _OBJ, [0.0], [True], ["0"], {0: 0}, {0}])
        culprit = v[0] if isinstance(v, list) else v
        return bad(f"devices={v!r}", call(devices=v), culprit)
    return valid("Mesh (fallback)", call(), lambda out: _eq(out, m))


def _eq(out, expected) -> None:
    assert out == expected and hash(out) == hash(expected), (out, expected)


def _check(cond: bool, what: object) -> None:
    assert cond, what


# -- Mesh.from_ranks --------------------------------------------------------------------------------


@REG.entry("Mesh.from_ranks")
def from_ranks_case(draw):
    sizes = draw(factorizations(36, 3).filter(bool))
    n = math.prod(sizes)
    flat = draw(st.lists(st.integers(0, RANK_POOL_MAX), min_size=n, max_size=n, unique=True))
    arr = np.array(flat, dtype=np.int64).reshape(sizes)
    names = tuple(draw(st.lists(st.sampled_from(POOL), min_size=len(sizes), max_size=len(sizes), unique=True)))
    container = pick(draw, ["list", "numpy", "torch", "tuple"])
    ranks = {"list": arr.tolist(), "numpy": arr, "torch": torch.from_numpy(arr),
             "tuple": tuple(map(tuple, arr.reshape(sizes[0], -1).tolist())) if len(sizes) == 2 else arr.tolist()}[
        container]

    def call(ranks=ranks, names=names):
        return lambda: Mesh.from_ranks(ranks, names)

    def check(m):
        assert m.ranks.tolist() == arr.tolist() and m.axis_names == names, m

    kinds = ["valid"] * 2 + ["names-list", "names-count", "neg", "type", "empty", "container", "names-type"]
    if len(sizes) >= 2 and sizes[0] >= 2:
        kinds.append("ragged")
    if len(sizes) >= 2:
        kinds.append("names-dup")
    if n >= 2:
        kinds.append("dup")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"from_ranks ({container})", call(), check)
    if kind == "names-list":
        return valid("from_ranks with a list of names", call(names=list(names)), check)
    if kind == "ragged":
        nested = arr.tolist()
        leaf = nested
        for _ in range(len(sizes) - 1):
            leaf = leaf[-1]
        leaf.pop()
        return bad("ragged ranks", call(ranks=nested), nested)
    if kind == "names-count":
        other = names[:-1] if draw(st.booleans()) else names + (fresh_name(set(names), "x"),)
        return bad("one name too many or too few", call(names=other), other)
    if kind == "dup":
        i, j = draw(st.permutations(range(n)))[:2]
        f = list(flat)
        f[j] = f[i]
        return bad(f"duplicate rank {f[i]}", call(ranks=np.array(f).reshape(sizes).tolist()), f[i])
    if kind == "neg":
        f = list(flat)
        v = draw(st.integers(-9, -1))
        f[draw(st.integers(0, n - 1))] = v
        return bad(f"rank {v}", call(ranks=np.array(f).reshape(sizes).tolist()), v)
    if kind == "type":
        f: list[object] = list(flat)
        # a rank nested in a list of one rank is one more (legal) level of nesting, not a ragged array
        v = pick(draw, [x for x in BAD_INTS if n >= 2 or not isinstance(x, (list, tuple))])
        f[draw(st.integers(0, n - 1))] = v
        nested = _nest(f, sizes)
        return bad(f"rank {v!r}", call(ranks=nested), v, nested)
    if kind == "empty":
        shape = (0,) if len(names) == 1 else (1,) * (len(names) - 1) + (0,)
        empty = np.zeros(shape, dtype=np.int64).tolist()
        return bad("no ranks", call(ranks=empty), shape)
    if kind == "container":
        v = pick(draw, [3, None, "01", _OBJ, {0: 1}, {0, 1}, np.zeros(sizes)])
        if isinstance(v, np.ndarray):
            return bad("float ranks", call(ranks=v), Shown("'float64'"))
        return bad(f"ranks={v!r}", call(ranks=v, names=names[:1]), v)
    if kind == "names-type":
        v = pick(draw, BAD_NAMES)
        return bad(f"axis name {v!r}", call(names=(v,) + names[1:]), v)
    if kind == "names-dup":
        dup = (names[-1],) + names[1:]
        return bad(f"axis name {names[-1]!r} twice", call(names=dup), dup, names[-1])
    return valid("from_ranks (fallback)", call(), check)


def _nest(flat: list, sizes: tuple[int, ...]) -> list:
    """``flat`` nested row-major into ``sizes`` (any element types)."""
    if len(sizes) == 1:
        return list(flat)
    step = len(flat) // sizes[0]
    return [_nest(flat[i * step:(i + 1) * step], sizes[1:]) for i in range(sizes[0])]


# -- selection ------------------------------------------------------------------------------------


@REG.entry("Mesh[...]")
def select_case(draw):
    m = draw(axis_meshes())
    names = m.axis_names
    k = draw(st.integers(1, len(names)))
    key = tuple(draw(st.permutations(names))[:k])
    form = pick(draw, ["tuple", "list", "str"] if k == 1 else ["tuple", "list"])
    arg = {"tuple": key, "list": list(key), "str": key[0]}[form]

    def check(out):
        assert out.axis_names == key and out.axis_sizes == tuple(m.axis_size(a) for a in key), out
        assert out.num_devices == m.num_devices and out.size * out.num_groups == m.num_devices

    kinds = ["valid"] * 2 + ["bad-name", "bad-name-in-tuple", "empty", "int", "key-type"]
    if len(names) >= 1:
        kinds.append("dup")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"mesh[{arg!r}]", lambda: m[arg], check)
    if kind == "bad-name":
        label, v, kw = bad_axis_name(draw, names)
        return bad(label, lambda: m[v], v, **kw)
    if kind == "bad-name-in-tuple":
        label, v, kw = bad_axis_name(draw, names, extra_types=(("a",), ["a"]))
        i = draw(st.integers(0, len(key)))
        sel = key[:i] + (v,) + key[i:]
        return bad(label, lambda: m[sel], v, sel, **kw)
    if kind == "empty":
        e = pick(draw, [(), []])
        return bad("no axes", lambda: m[e], e)
    if kind == "dup":
        a = pick(draw, names)
        sel = key + (a,) if a in key else (a, a)
        return bad("an axis twice", lambda: m[sel], sel, a)
    if kind == "int":
        i = draw(st.integers(-5, 5))
        return bad(f"mesh[{i}]", lambda: m[i], i)
    v = pick(draw, [None, 2.5, True, {names[0]: 1}, {names[0]}, b"dp", _OBJ])
    return bad(f"mesh[{v!r}]", lambda: m[v], v)


# -- flatten ----------------------------------------------------------------------------------


@REG.entry("Mesh.flatten")
def flatten_case(draw):
    m = draw(axis_meshes())
    names = m.axis_names
    k = draw(st.integers(1, len(names)))
    axes = tuple(draw(st.permutations(names))[:k])
    remaining = tuple(a for a in names if a not in axes)
    name = pick(draw, [None, "_".join(axes), axes[0], fresh_name(set(names), "f")])
    form = pick(draw, ["tuple", "list", "none"] + (["str"] if k == 1 else []))
    if form == "none":
        axes, remaining = names, ()
        arg = None
    else:
        arg = {"tuple": axes, "list": list(axes), "str": axes[0]}[form]
    merged = name or "_".join(axes)

    def call(arg=arg, name=name):
        return lambda: m.flatten(arg, name=name)

    def check(out):
        expected = tuple(merged if a == axes[0] else a for a in names if a == axes[0] or a not in axes)
        assert out.axis_names == expected, (out, expected)
        g = m.num_groups * math.prod(m.axis_size(a) for a in remaining)
        assert np.array_equal(out[merged].groups().reshape(g, -1), m[axes].groups().reshape(g, -1))

    kinds = ["valid"] * 2 + ["bad-axis", "empty", "axes-type", "name-empty", "name-type", "zero-axes"]
    if remaining:
        kinds.append("name-collides")
    if len(axes) >= 1:
        kinds.append("dup")
    if not is_open("flatten-name-sequence"):
        kinds.append("name-sequence1")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"flatten({arg!r}, name={name!r})", call(), check)
    if kind == "bad-axis":
        label, v, kw = bad_axis_name(draw, names)
        sel = axes + (v,)
        return bad(label, call(arg=sel), v, sel, **kw)
    if kind == "empty":
        e = pick(draw, [(), []])
        return bad("no axes", call(arg=e), e)
    if kind == "dup":
        sel = axes + (axes[0],)
        return bad("an axis twice", call(arg=sel), sel, axes[0])
    if kind == "axes-type":
        v = pick(draw, [5, 2.5, True, {names[0]: 1}, {names[0]}, b"dp", _OBJ])
        return bad(f"axes={v!r}", call(arg=v), v)
    if kind == "name-collides":
        v = pick(draw, remaining)
        return bad(f"name={v!r} of a remaining axis", call(name=v), v)
    if kind == "name-empty":
        return bad("empty name", call(name=""), "")
    if kind == "name-type":
        v = pick(draw, [3, 2.5, True, b"x", {"x": 1}, {"x"}, _OBJ, ("x", "y"), ["x", "y"]])
        return bad(f"name={v!r}", call(name=v), v)
    if kind == "name-sequence1":
        v = pick(draw, [("x",), ["x"]])
        return bad(f"name={v!r}", call(name=v), v)
    if kind == "zero-axes":
        z = make_mesh((), ())
        return bad("flatten of a 0-axis mesh", lambda: z.flatten(), Shown("0-axis"), z)
    return valid("flatten (fallback)", call(), check)


# -- unflatten ------------------------------------------------------------------------------------


def splits_along_modes(modes: tuple[tuple[int, int], ...], sizes: tuple[int, ...]) -> bool:
    """docs/design.md "Edge cases": a split exists iff every inner cumulative product of ``sizes`` falls inside one mode
    and divides it evenly: ``Q[i-1] | P`` and ``P | Q[i]`` for the inner cumulative products ``Q`` of
    the mode sizes. (``(2,3):(6,1)`` splits as ``(2, 3)`` or ``(6,)``, not ``(3, 2)``.)"""
    q = [1]
    for s, _ in reversed(modes):
        q.append(q[-1] * s)
    p = 1
    for t in reversed(sizes[1:]):
        p *= t
        if p != 1 and not any(p % q[i - 1] == 0 and q[i] % p == 0 for i in range(1, len(q))):
            return False
    return True


@st.composite
def ordered_factorization(draw, n: int, k: int) -> tuple[int, ...]:
    """``k`` positive ints (some may be 1) whose product is ``n``, in random order."""
    out = []
    rest = n
    for _ in range(k - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = pick(draw, divisors)
        out.append(d)
        rest //= d
    out.append(rest)
    return tuple(draw(st.permutations(out)))


_SAME = object()


@REG.entry("Mesh.unflatten")
def unflatten_case(draw):
    m = draw(axis_meshes())
    names = m.axis_names
    axis = pick(draw, names)
    lay = m.axis_layout(axis)
    sizes = draw(ordered_factorization(lay.size, draw(st.integers(1, 4))))
    others = tuple(a for a in names if a != axis)
    new = fresh_names(set(names), "u", len(sizes))
    if draw(st.booleans()):  # unflatten may reuse the old axis name
        new[draw(st.integers(0, len(new) - 1))] = axis
    new = tuple(new)
    form = pick(draw, ["dict", "pairs", "tuple-of-lists"])

    def pack(names_, sizes_, form=form):
        pairs = list(zip(names_, sizes_))
        if form == "dict" and all(_hashable(x) for x in names_) and len(set(names_)) == len(names_):
            return dict(pairs)
        if form == "tuple-of-lists":
            return tuple([a, b] for a, b in pairs)
        return pairs

    def call(ax=axis, sizes_arg=_SAME):
        arg = pack(new, sizes) if sizes_arg is _SAME else sizes_arg
        return lambda: m.unflatten(ax, arg)

    def check(out):
        i = names.index(axis)
        assert out.axis_names == names[:i] + new + names[i + 1:], out
        assert out.flatten(new, name=axis) == m  # flatten undoes unflatten (the law), as a value

    kinds = ["valid"] * 2 + ["product", "size<1", "size-type", "name-type", "name-empty", "container",
                             "bad-axis", "axis-type", "axis-1tuple"]
    if others:
        kinds.append("name-collides")
    if len(sizes) >= 2:
        kinds.append("name-dup")
    if not is_open("unflatten-axis-tuple") and len(names) >= 2:
        kinds.append("axis-2tuple")
    kind = pick(draw, kinds)
    along = splits_along_modes(lay.modes, sizes)
    if kind == "valid" or (kind in ("axis-1tuple", "name-collides", "name-dup") and not along):
        if along:
            return valid(f"unflatten {axis!r} of {lay} into {sizes}", call(), check)
        return bad(f"unflatten {axis!r} of {lay} into {sizes} (not along the modes)", call(),
                   dict(zip(new, sizes)))
    if kind == "axis-1tuple":
        return valid(f"unflatten(({axis!r},), ...)", call(ax=(axis,)), check)
    if kind == "product":
        f = draw(st.integers(2, 3))
        i = draw(st.integers(0, len(sizes) - 1))
        wrong = sizes[:i] + (sizes[i] * f,) + sizes[i + 1:]
        return bad(f"sizes {wrong} for an axis of {lay.size}", call(sizes_arg=pack(new, wrong)),
                   dict(zip(new, wrong)))
    if kind == "size<1":
        i, v = draw(st.integers(0, len(sizes) - 1)), draw(st.integers(-4, 0))
        wrong = sizes[:i] + (v,) + sizes[i + 1:]
        return bad(f"size {v}", call(sizes_arg=pack(new, wrong)), v)
    if kind == "size-type":
        i, v = draw(st.integers(0, len(sizes) - 1)), pick(draw, BAD_INTS)
        wrong = sizes[:i] + (v,) + sizes[i + 1:]
        return bad(f"size {v!r}", call(sizes_arg=pack(new, wrong)), v)
    if kind == "name-type":
        i, v = draw(st.integers(0, len(sizes) - 1)), pick(draw, BAD_NAMES + (("x",),))
        wrong = new[:i] + (v,) + new[i + 1:]
        return bad(f"new name {v!r}", call(sizes_arg=pack(wrong, sizes)), v)
    if kind == "name-empty":
        i = draw(st.integers(0, len(sizes) - 1))
        wrong = new[:i] + ("",) + new[i + 1:]
        return bad("empty new name", call(sizes_arg=pack(wrong, sizes)), "", wrong)
    if kind == "name-collides":
        i, v = draw(st.integers(0, len(sizes) - 1)), pick(draw, others)
        wrong = new[:i] + (v,) + new[i + 1:]
        return bad(f"new name {v!r} of another axis", call(sizes_arg=pack(wrong, sizes)), v)
    if kind == "name-dup":
        wrong = (new[0],) * len(sizes)
        return bad(f"new name {new[0]!r} twice", call(sizes_arg=pack(wrong, sizes, "pairs")), new[0])
    if kind == "container":
        v = pick(draw, [4, "x", None, [("x",)], [("x", 2, 2)], {("x", lay.size)}, [], {}, _OBJ, [["x"]]])
        return bad(f"sizes={v!r}", call(sizes_arg=v), v)
    if kind == "bad-axis":
        label, v, kw = bad_axis_name(draw, names)
        return bad(label, call(ax=v), v, **kw)
    if kind == "axis-type":
        v = pick(draw, [0, None, 2.5, b"tp", ()])
        return bad(f"axis={v!r}", call(ax=v), v)
    assert kind == "axis-2tuple", kind
    v = tuple(draw(st.permutations(names))[:2])
    return bad(f"axis={v!r}", call(ax=v), v)


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


# -- transpose / rename ----------------------------------------------------------------------------


@REG.entry("Mesh.transpose")
def transpose_case(draw):
    m = draw(derived_meshes(32))
    names = m.axis_names
    perm = tuple(draw(st.permutations(names)))
    form = pick(draw, ["varargs", "tuple", "list"])

    def call(p=perm, form=form):
        if form == "varargs":
            return lambda: m.transpose(*p)
        return lambda: m.transpose(tuple(p) if form == "tuple" else list(p))

    def check(out):
        assert out.axis_names == perm and out.transpose(*names) == m, out
        if m.ndim:
            assert out == m[perm]

    kinds = ["valid"] * 2 + ["container"]
    if names:
        kinds += ["bad-name", "missing", "extra-known"] + (["dup"] if len(names) >= 2 else [])
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"transpose{perm}", call(), check)
    if kind == "missing":
        p = perm[:-1]
        return bad("an axis left out", call(p), p)
    if kind == "dup":
        p = perm[:-1] + (perm[0],)
        return bad("an axis twice", call(p), p)
    if kind == "extra-known":
        p = perm + (perm[0],)
        return bad("an axis listed twice", call(p), p)
    if kind == "bad-name":
        label, v, kw = bad_axis_name(draw, names, extra_types=(("a",), ["a"]))
        i = draw(st.integers(0, len(perm)))
        p = perm[:i] + (v,) + perm[i:]
        return bad(label, call(p), v, p, **kw)
    v = pick(draw, [5, None, 2.5, {"a": 1}, {"a"}, _OBJ])
    return bad(f"transpose({v!r})", lambda: m.transpose(v), v)


@REG.entry("Mesh.rename")
def rename_case(draw):
    m = draw(axis_meshes())
    names = m.axis_names
    old = tuple(draw(st.permutations(names))[:draw(st.integers(0, len(names)))])
    fresh = tuple(fresh_names(set(names), "r", 2))
    mapping = {a: pick(draw, names + fresh) for a in old}
    result = tuple(mapping.get(a, a) for a in names)

    def check(out):
        assert out.axis_names == result, out
        assert all(out.axis_layout(b) == m.axis_layout(a) for a, b in zip(names, result))

    kinds = ["valid"] * 2 + ["bad-key", "key-type", "new-type", "new-empty", "container"]
    kind = pick(draw, kinds)
    if kind == "valid":
        if len(set(result)) == len(result):
            return valid(f"rename({mapping})", lambda: m.rename(mapping), check)
        dup = next(a for a in result if result.count(a) > 1)
        return bad(f"rename({mapping}) makes {dup!r} twice", lambda: m.rename(mapping), result, dup)
    if kind == "bad-key":
        label, v, kw = bad_axis_name(draw, names)
        if not _hashable(v):
            v = misspell(names[0], names)
            kw = {"unknown_axis": v, "suggest": True}
        bad_map = {**mapping, v: "q"}
        return bad(label, lambda: m.rename(bad_map), v, **kw)
    if kind == "key-type":
        v = pick(draw, [3, None, (names[0],), 2.5, b"dp"])
        return bad(f"key {v!r}", lambda: m.rename({v: "q"}), v)
    if kind == "new-type":
        v = pick(draw, BAD_NAMES + (("x",),))
        return bad(f"new name {v!r}", lambda: m.rename({names[0]: v}), v)
    if kind == "new-empty":
        return bad("empty new name", lambda: m.rename({names[0]: ""}), "")
    v = pick(draw, [[(names[0], "x")], None, "ab", {names[0]}, 5])
    return bad(f"rename({v!r})", lambda: m.rename(v), v)


# -- queries --------------------------------------------------------------------------------------


@REG.entry("Mesh.coordinate/group_of")
def rank_query_case(draw):
    m = draw(derived_meshes(32))
    which = pick(draw, ["coordinate", "group_of"])
    devices = m.devices.tolist()
    call_on = getattr(m, which)

    def check_member(rank):
        def check(out):
            coord, group = m.coordinate(rank), m.group_of(rank)
            assert len(coord) == m.ndim and all(0 <= c < s for c, s in zip(coord, m.axis_sizes)), coord
            assert group.shape == m.axis_sizes and group[coord] == rank
            assert any(np.array_equal(group, g) for g in m.groups())
        return check

    kind = pick(draw, ["device"] * 2 + ["outside", "huge", "negative", "type"])
    if kind == "device":
        rank = pick(draw, devices)
        arg = int_like(draw, rank)
        return valid(f"{which}({arg!r})", lambda: call_on(arg), check_member(rank))
    if kind in ("outside", "huge"):
        rank = 10**30 if kind == "huge" else draw(st.integers(0, max(devices) + 5).filter(lambda r: r not in devices))
        return valid(f"{which}({rank}) of a non-device", lambda: call_on(rank), lambda out: _check(out is None, out))
    if kind == "negative":
        v = draw(st.integers(-10**6, -1))
        return bad(f"{which}({v})", lambda: call_on(v), v)
    v = pick(draw, BAD_INTS)
    return bad(f"{which}({v!r})", lambda: call_on(v), v)


@REG.entry("Mesh.groups/ranks")
def groups_case(draw):
    m = draw(derived_meshes(32))
    if draw(st.booleans()):
        def check(table):
            assert table.shape == (m.num_groups, *m.axis_sizes)
            assert sorted(table.reshape(-1).tolist()) == sorted(m.devices.tolist())
        return valid("groups()", m.groups, check)
    if m.size == m.num_devices:  # one group
        return valid("ranks", lambda: m.ranks,
                     lambda r: _check(r.shape == m.axis_sizes and sorted(np.ravel(r).tolist()) == sorted(
                         m.devices.tolist()), r))
    return bad("ranks of a family", lambda: m.ranks, m, Shown(f"num_groups={m.num_devices // m.size}"))


@REG.entry("Mesh.axis_size/axis_layout/shape")
def axis_query_case(draw):
    m = draw(axis_meshes())
    names = m.axis_names
    which = pick(draw, ["axis_size", "axis_layout", "shape"])

    def call(name):
        if which == "shape":
            return lambda: m.shape[name]
        return lambda: getattr(m, which)(name)

    if draw(st.booleans()):
        name = pick(draw, names)
        expected = m.axis_layout(name).size
        return valid(f"{which}({name!r})", call(name),
                     lambda out: _check((out.size if isinstance(out, Layout) else out) == expected, out))
    label, v, kw = bad_axis_name(draw, names, extra_types=((names[0],), [names[0]]))
    if which == "shape" and not _hashable(v) and is_open("shape-unhashable-key"):
        v = names[0] + "?"
        label, kw = f"unknown axis {v!r}", {"unknown_axis": v}
    # a str is an unknown axis (with "did you mean" when close); other types: a TypeError from the
    # methods, and from the mapping mesh.shape an unknown key (an int: a MeshError on positions)
    return bad(f"{which}: {label}", call(v), v, **kw)


@REG.entry("Mesh.host_span")
def host_span_case(draw):
    m = draw(derived_meshes(32))
    kind = pick(draw, ["valid"] * 2 + ["zero-or-negative", "type"] + ([] if is_open("host_span-huge") else ["huge"]))
    if kind == "valid":
        k = draw(st.integers(1, int(m.devices.max()) + 3))

        def check(out):
            assert list(out) == list(m.axis_names), out
            for name, size in zip(m.axis_names, m.axis_sizes):
                hosts = [{r // k for r in g} for g in m[name].groups().reshape(-1, size).tolist()]
                expected = ("intra-host" if all(len(h) == 1 for h in hosts)
                            else "cross-host" if all(len(h) == size for h in hosts) else "mixed")
                assert out[name] == expected, (name, out, k)

        arg = int_like(draw, k)
        return valid(f"host_span({arg!r})", lambda: m.host_span(arg), check)
    if kind == "huge":
        return valid("host_span(10**30)", lambda: m.host_span(10**30),
                     lambda out: _check(set(out.values()) <= {"intra-host"}, out))
    if kind == "zero-or-negative":
        v = draw(st.integers(-5, 0))
        return bad(f"host_span({v})", lambda: m.host_span(v), v)
    v = pick(draw, BAD_INTS)
    return bad(f"host_span({v!r})", lambda: m.host_span(v), v)


test_entry_point = REG.test()
