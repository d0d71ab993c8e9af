"""Fuzz the torch-facing calls: realize, the realized mesh, the collectives and distribute.

Each example opens its own single-process world (tests/fuzz/_world.py: torch's ``fake``
backend, any rank of any size; or a real one-rank gloo world for the backend arguments that
the fake backend never reaches), makes the call inside it, and returns plain data that the
case's check compares with the pure Mesh's answer. Collectives' values are tested on gloo in
tests/dist/; here, under the fake backend, the result shapes are what a valid call must get.
"""

from __future__ import annotations

import contextlib
import datetime
import math

import numpy as np
import torch
import torch.distributed as dist
from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import Mesh, NamedSharding, P
from tests.fuzz._harness import (
    _OBJ,
    BAD_INTS,
    Registry,
    Shown,
    bad,
    bad_axis_name,
    is_open,
    misspell,
    pick,
    valid,
)
from tests.fuzz._world import fake_world
from tests.strategies import derived_meshes

REG = Registry()  # the test is made at the end of the module, after every entry point registered


def members(group) -> list[int] | None:
    return None if group is None else dist.get_process_group_ranks(group)


def expected_row(mesh: Mesh, rank: int) -> list[int] | None:
    group = mesh.group_of(rank)
    return None if group is None else group.reshape(-1).tolist()


def bad_axis(draw, names: tuple[str, ...]) -> tuple[str, object, dict]:
    """A refused axis argument of a collective: a bad name (as everywhere), ``()``, or one axis twice."""
    kind = pick(draw, ["name", "name", "name", "empty-tuple", "twice"])
    if kind == "empty-tuple":
        return "axis ()", (), {}
    if kind == "twice":
        a = pick(draw, names)
        return f"axis ({a!r}, {a!r})", (a, a), {}
    return bad_axis_name(draw, names)


# -- realize ---------------------------------------------------------------------------------------


@st.composite
def products_for(draw, mesh: Mesh) -> list[tuple[str, ...]]:
    if not mesh.ndim:
        return []
    out = []
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.integers(1, mesh.ndim))
        out.append(tuple(draw(st.permutations(mesh.axis_names))[:k]))
    return out


def realize_in_world(mesh: Mesh, rank: int, world: int, **kwargs):
    """Realize ``mesh`` as ``rank`` of a fake world; return what the groups hold (plain data)."""
    def call():
        with fake_world(rank, world):
            rm = fm.realize(mesh, **kwargs)
            groups = {a: members(rm.group(a)) for a in mesh.axis_names}
            prods = {tuple(p) if not isinstance(p, str) else (p,): members(rm.group(p))
                     for p in kwargs.get("products", ())}
            return rm.mesh, rm.coordinate, groups, prods
    return call


@REG.entry("realize")
def realize_case(draw):
    m = draw(derived_meshes(32))
    top = int(m.devices.max())
    world = top + 1 + draw(st.integers(0, 3))
    rank = draw(st.integers(0, world - 1))
    products = draw(products_for(m))
    kwargs: dict[str, object] = {}
    for key, choices in {
        "device_type": [None, "cpu"],
        "backend": [None, "fake"],
        "timeout": [None, 30, 2.5, datetime.timedelta(seconds=20), np.float64(5.0)],
        "check": [True, False, 10, 0.5],
    }.items():
        if draw(st.booleans()):
            kwargs[key] = pick(draw, choices)
    if products or draw(st.booleans()):
        kwargs["products"] = [list(p) if draw(st.booleans()) else p for p in products]

    def check(out):
        mesh, coord, groups, prods = out
        assert mesh == m and coord == m.coordinate(rank), (coord, m.coordinate(rank))
        for a in m.axis_names:
            assert groups[a] == expected_row(m[a], rank), (a, groups[a])
        for p, got in prods.items():
            assert got == expected_row(m[p].flatten(), rank), (p, got)

    def with_(**more):
        return realize_in_world(m, rank, world, **{**kwargs, **more})

    kinds = ["valid"] * 3 + ["mesh-type", "check", "timeout", "products", "device_type", "backend"]
    if top >= 1:
        kinds.append("beyond-world")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"realize({m!r}, {kwargs}) as rank {rank} of {world}", with_(), check)
    if kind == "mesh-type":
        v = pick(draw, [None, (2, 2), "mesh", NamedSharding(m, P()), m.axis_names, "realized"])
        if v == "realized":
            def twice():
                with fake_world(0, world):
                    return fm.realize(fm.realize(m))
            return bad("realize(a RealizedMesh)", twice, Shown("RealizedMesh("))
        return bad(f"realize({v!r})", lambda: _realize_plain(v, world), v)
    if kind == "beyond-world":
        small = top  # the largest device is not a rank of a world of this size
        return bad(f"device {top} in a world of {small}", realize_in_world(m, 0, small), top)
    if kind == "check":
        v = pick(draw, [None, "yes", [1], 1 + 0j, 0, -1, -0.5] + ([] if is_open("realize-check-nan") else [
            float("nan")]))
        return bad(f"check={v!r}", with_(check=v), v)
    if kind == "timeout":
        choices: list[object] = [-1, 0, "10", True, [1], float("nan"), -0.5, _OBJ]
        if not is_open("realize-timeout-overflow"):
            choices += [float("inf"), 1e20]
        if not is_open("realize-timeout-timedelta"):
            choices += [datetime.timedelta(0), datetime.timedelta(seconds=-3)]
        v = pick(draw, choices)
        return bad(f"timeout={v!r}", with_(timeout=v), v)
    if kind == "products":  # (products=, the value the message names, extra expectations)
        choices: list[tuple[object, object, dict]] = [
            (None, None, {}), (5, 5, {}), (_OBJ, _OBJ, {}), ("dp", "dp", {}), ([5], 5, {}), ([()], (), {}),
            ([(3,)], 3, {})]
        if m.ndim:
            a = pick(draw, m.axis_names)
            wrong = misspell(a, m.axis_names)
            choices += [([(a, wrong)], wrong, {"unknown_axis": wrong, "suggest": True}), ([(a, a)], (a, a), {}),
                        ([[a, None]], None, {})]
        v, culprit, kw = pick(draw, choices)
        return bad(f"products={v!r}", with_(products=v), culprit, **kw)
    if kind == "device_type":
        v = pick(draw, ["tpu", "", "CPU", 5, "cuda:0"] + ([] if is_open("realize-device-type-unhashable") else [
            ["cpu"]]))
        return bad(f"device_type={v!r}", with_(device_type=v), v)
    v = pick(draw, ["gloo", "nccl", "mpi", 5, ["fake"], "FAKE!"])
    return bad(f"backend={v!r} under the fake group", with_(backend=v), v)


def _realize_plain(value: object, world: int):
    with fake_world(0, world):
        return fm.realize(value)


@contextlib.contextmanager
def gloo_world_of_one():
    """A real one-rank gloo world in this process (a HashStore: no sockets, no peers)."""
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        fm.clear_cache()
        dist.destroy_process_group()


@REG.entry("realize (gloo, backend arguments)")
def realize_gloo_case(draw):
    """device_type/backend against a real gloo default group, where they reach torch's new_group."""
    m = fm.make_mesh((1, 1), ("a", "b")) if draw(st.booleans()) else fm.make_mesh((1,), ("w",))

    def call(**kwargs):
        def run():
            with gloo_world_of_one():
                rm = fm.realize(m, check=False, **kwargs)
                return rm.backend, {a: members(rm.group(a)) for a in m.axis_names}
        return run

    def check(out):
        backend, groups = out
        assert backend == "gloo" and all(g == [0] for g in groups.values()), out

    kind = pick(draw, ["valid", "valid", "bad"])
    if kind == "valid":
        kw = pick(draw, [{}, {"device_type": "cpu"}, {"backend": "gloo"}, {"device_type": "cpu", "backend": "gloo"},
                         {"device_type": None, "backend": None}])
        return valid(f"realize({kw}) on gloo", call(**kw), check)
    choices: list[tuple[str, object]] = [("device_type", "tpu"), ("device_type", 3)]
    if not is_open("realize-backend-unchecked"):
        choices += [("backend", "bogus"), ("backend", "ucc"), ("backend", 5), ("backend", ["gloo"]),
                    ("device_type", "cuda") if not torch.cuda.is_available() else ("device_type", "xpu")]
    key, v = pick(draw, choices)
    return bad(f"realize({key}={v!r}) on gloo", call(**{key: v}), v)


# -- the realized mesh's own queries -------------------------------------------------------------


@REG.entry("RealizedMesh.group/local_rank/[...]")
def realized_mesh_case(draw):
    m = draw(derived_meshes(32).filter(lambda x: x.ndim >= 1))
    world = int(m.devices.max()) + 1
    rank = draw(st.integers(0, world - 1))
    which = pick(draw, ["group", "local_rank", "select"])

    def call(arg):
        def run():
            with fake_world(rank, world):
                rm = fm.realize(m)
                if which == "group":
                    return members(rm.group(arg))
                if which == "local_rank":
                    return rm.local_rank(arg)
                sub = rm[arg]
                return sub.mesh, sub.coordinate
        return run

    if draw(st.booleans()):
        a = pick(draw, m.axis_names)
        coord = m.coordinate(rank)
        if which == "local_rank" and coord is None:
            return bad(f"local_rank({a!r}) on a non-member", call(a), rank)

        def check(out):
            if which == "group":
                assert out == expected_row(m[a], rank), out
            elif which == "local_rank":
                assert out == coord[m.axis_names.index(a)], out
            else:
                assert out == (m[a], m[a].coordinate(rank)), out

        return valid(f"rm.{which}({a!r})", call(a), check)
    label, v, kw = bad_axis(draw, m.axis_names)
    return bad(f"rm.{which}: {label}", call(v), v, **kw)


# -- collectives ------------------------------------------------------------------------------------

COLLECTIVES = ("psum", "pmean", "pvary", "all_gather", "psum_scatter", "all_to_all", "ppermute", "axis_index",
               "axis_size")


@st.composite
def shapes(draw, min_dims: int = 0, max_dims: int = 3) -> list[int]:
    return [draw(st.integers(0, 4)) for _ in range(draw(st.integers(min_dims, max_dims)))]


def collective_case(draw, fn: str):
    """One call of the collective ``fn`` (one entry point each, registered below)."""
    m = draw(derived_meshes(32).filter(lambda x: x.ndim >= 1))
    names = m.axis_names
    world = int(m.devices.max()) + 1
    rank = pick(draw, m.devices.tolist())
    product = tuple(draw(st.permutations(names))[:2]) if len(names) >= 2 and draw(st.booleans()) else None
    k = draw(st.integers(1, len(names)))
    axes = tuple(draw(st.permutations(names))[:k])
    if fn == "all_to_all" and len(axes) > 1 and axes != product:
        axes = axes[:1] if draw(st.booleans()) or product is None else product
    n = math.prod(m.axis_size(a) for a in axes)
    axis_arg: object = pick(draw, [axes, list(axes)] + ([axes[0]] if k == 1 else []))
    tiled = draw(st.booleans())
    shape = draw(shapes(min_dims=1 if fn in ("all_gather", "psum_scatter", "all_to_all") else 0))
    args: list[object] = []
    kwargs: dict[str, object] = {}
    expected = list(shape)
    nd = len(shape)
    if fn in ("all_gather", "psum_scatter"):
        d = draw(st.integers(-nd, nd - 1)) if (tiled or fn == "psum_scatter") else draw(st.integers(-nd - 1, nd))
        kwargs.update(dim=d, tiled=tiled)
        if fn == "all_gather":
            if tiled:
                expected[d % nd] *= n
            else:
                expected.insert(d % (nd + 1), n)
        else:
            dd = d % nd
            shape[dd] = n * draw(st.integers(0, 3)) if tiled else n
            expected = list(shape)
            if tiled:
                expected[dd] //= n
            else:
                del expected[dd]
    elif fn == "all_to_all":
        s, c = draw(st.integers(-nd, nd - 1)), draw(st.integers(-nd, nd - 1))
        shape[s % nd] = n * draw(st.integers(0, 3)) if tiled else n
        expected = list(shape)
        if tiled:
            expected[s % nd] //= n
            expected[c % nd] *= n
        else:
            del expected[s % nd]
            expected.insert(c % nd, n)
        args += [s, c]
        kwargs["tiled"] = tiled
    elif fn == "ppermute":
        sources = draw(st.permutations(range(n)))[:draw(st.integers(0, n))]
        dests = draw(st.permutations(range(n)))[:len(sources)]
        args.append([tuple(p) if draw(st.booleans()) else list(p) for p in zip(sources, dests)])
    x = torch.randn(shape)
    coord = m.coordinate(rank)
    index = 0
    for a in axes:
        index = index * m.axis_size(a) + coord[names.index(a)]

    def call(fn=fn, x=x, axis=axis_arg, args=tuple(args), kwargs=kwargs, mesh="realized", at=rank):
        def run():
            with fake_world(at, world):
                rm = fm.realize(m, products=[product] if product else [])
                target = {"realized": rm, "pure": m, "none": None}.get(mesh, mesh) if isinstance(mesh, str) else mesh
                out = getattr(fm, fn)(*([x] if fn not in ("axis_index", "axis_size") else []), axis, *args,
                                      mesh=target, **kwargs)
                return tuple(out.shape) if isinstance(out, torch.Tensor) else out
        return run

    def check(out):
        if fn == "axis_index":
            assert type(out) is int and out == index, (out, index)
        elif fn == "axis_size":
            assert type(out) is int and out == n, (out, n)
        else:
            assert out == tuple(expected), (fn, out, expected)

    kinds = ["valid"] * 2 + ["pure-mesh", "no-mesh", "mesh-type", "axis"]
    if fn not in ("axis_index", "axis_size"):
        kinds.append("x-type")
    if fn in ("all_gather", "psum_scatter", "all_to_all"):
        kinds += ["dim-range", "dim-type"]
        if not is_open("collective-tiled-not-bool"):
            kinds.append("tiled-type")
    if fn == "psum_scatter" and n >= 2:
        kinds.append("indivisible")
    if fn == "ppermute":
        kinds += ["perm-range", "perm-twice", "perm-pair", "perm-index-type"]
        if not is_open("ppermute-perm-not-iterable"):
            kinds.append("perm-container")
    if fn != "axis_size":
        kinds.append("outside")
    kind = pick(draw, kinds)
    if kind == "valid":
        return valid(f"{fn}({list(x.shape)}, {axis_arg!r}, {args}, {kwargs}) on {m!r}", call(), check)
    if kind == "pure-mesh":
        return bad(f"{fn} on the pure mesh", call(mesh="pure"), m)
    if kind == "no-mesh":
        return bad(f"{fn} without a mesh", call(mesh="none"), Shown("neither"))
    if kind == "mesh-type":
        v = pick(draw, [3, "tp", _OBJ, NamedSharding(m, P())])
        return bad(f"{fn}(mesh={v!r})", call(mesh=v), v)
    if kind == "axis":
        label, v, kw = bad_axis(draw, names)
        return bad(f"{fn}: {label}", call(axis=v), v, **kw)
    if kind == "x-type":
        v = pick(draw, [[1.0], 3.0, np.ones(2), None, "x"])
        return bad(f"{fn}(x={v!r})", call(x=v), v)
    if kind == "dim-range":
        bound = nd + (0 if tiled or fn != "all_gather" else 1)
        v = pick(draw, [bound, bound + 2, -bound - 1, -bound - 4])
        if fn == "all_to_all":
            which = draw(st.integers(0, 1))
            return bad(f"all_to_all {'split' if which == 0 else 'concat'}_dim={v}",
                       call(args=tuple(v if i == which else a for i, a in enumerate(args))), v)
        return bad(f"{fn}(dim={v})", call(kwargs={**kwargs, "dim": v}), v)
    if kind == "dim-type":
        v = pick(draw, BAD_INTS)
        if fn == "all_to_all":
            which = draw(st.integers(0, 1))
            return bad(f"all_to_all dim {v!r}", call(args=tuple(v if i == which else a for i, a in enumerate(args))), v)
        return bad(f"{fn}(dim={v!r})", call(kwargs={**kwargs, "dim": v}), v)
    if kind == "tiled-type":
        v = pick(draw, ["no", None, 1, _OBJ])
        return bad(f"{fn}(tiled={v!r})", call(kwargs={**kwargs, "tiled": v}), v)
    if kind == "indivisible":
        d = kwargs["dim"] % nd
        bad_shape = list(shape)
        bad_shape[d] = n * draw(st.integers(0, 2)) + draw(st.integers(1, n - 1)) if tiled else n + draw(
            st.integers(1, 3))
        return bad(f"psum_scatter of dim {bad_shape[d]} over {n}", call(x=torch.zeros(bad_shape)), bad_shape[d])
    if kind == "perm-range":
        bad_pair = pick(draw, [(0, n), (n, 0), (-1, 0), (0, -1), (n + 3, 1)])
        return bad(f"ppermute pair {bad_pair}", call(args=([bad_pair],)), bad_pair)
    if kind == "perm-twice":
        if n >= 2:
            pairs = pick(draw, [[(0, 1), (0, 0)], [(0, 1), (1, 1)]])
        else:
            pairs = [(0, 0), (0, 0)]
        return bad(f"ppermute perm {pairs}", call(args=(pairs,)), tuple(pairs))
    if kind == "perm-pair":
        v = pick(draw, [3, (0,), (0, 0, 0), "01", None, {0: 0}])
        return bad(f"ppermute perm element {v!r}", call(args=([v],)), v)
    if kind == "perm-index-type":
        v = pick(draw, BAD_INTS)
        return bad(f"ppermute index {v!r}", call(args=([(v, 0)],)), v)
    if kind == "perm-container":
        v = pick(draw, [5, None, 2.5])
        return bad(f"ppermute perm={v!r}", call(args=(v,)), v)
    assert kind == "outside", kind  # a rank of the world that is not a device of the mesh
    outside = draw(st.integers(0, world).filter(lambda r: r not in set(m.devices.tolist())))
    return bad(f"{fn} on rank {outside} outside the mesh",
               _outside(m, fn, x, axis_arg, args, kwargs, outside, world + 1), outside)


for _fn in COLLECTIVES:
    REG.entry(f"collectives.{_fn}")(lambda draw, fn=_fn: collective_case(draw, fn))


def _outside(m, fn, x, axis, args, kwargs, rank, world):
    def run():
        with fake_world(rank, world):
            rm = fm.realize(m)
            out = getattr(fm, fn)(*([x] if fn not in ("axis_index", "axis_size") else []), axis, *args, mesh=rm,
                                  **kwargs)
            return tuple(out.shape) if isinstance(out, torch.Tensor) else out
    return run


@REG.entry("collectives (0-d tensors)")
def scalar_case(draw):
    """A 0-d tensor: fine for psum/pmean/pvary/ppermute and untiled all_gather; tiled gathers, scatters
    and all_to_all need a dim (a MeshError naming it)."""
    fn = pick(draw, ["psum", "pmean", "pvary", "ppermute", "all_gather"] + (
        [] if is_open("collective-0d-tensor") else ["all_gather", "psum_scatter", "all_to_all"]))
    tiled = draw(st.booleans()) if fn == "all_gather" and not is_open("collective-0d-tensor") else fn != "all_gather"
    m = fm.make_mesh((2, 2), ("dp", "tp"))
    draw_rank = draw(st.integers(0, 3))

    def run():
        with fake_world(draw_rank, 4):
            rm = fm.realize(m)
            x = torch.ones(())
            if fn == "ppermute":
                return tuple(fm.ppermute(x, "tp", [(0, 1), (1, 0)], mesh=rm).shape)
            if fn == "all_to_all":
                return fm.all_to_all(x, "tp", 0, 0, mesh=rm)
            if fn in ("all_gather", "psum_scatter"):
                return tuple(getattr(fm, fn)(x, "tp", tiled=tiled, mesh=rm).shape)
            return tuple(getattr(fm, fn)(x, "tp", mesh=rm).shape)

    if fn == "all_gather" and not tiled:
        return valid("untiled all_gather of a 0-d tensor", run, lambda out: _check(out == (2,), out))
    if fn in ("all_gather", "psum_scatter", "all_to_all"):
        return bad(f"tiled {fn} of a 0-d tensor", run, 0, Shown("0-d"))
    return valid(f"{fn} of a 0-d tensor", run, lambda out: _check(out == (), out))


def _check(cond: bool, what: object) -> None:
    assert cond, what


# -- distribute -------------------------------------------------------------------------------------


@REG.entry("distribute")
def distribute_case(draw):
    m = draw(derived_meshes(16).filter(lambda x: x.ndim >= 1))
    world = int(m.devices.max()) + 1
    rank = draw(st.integers(0, world - 1))
    dims = []
    for name in draw(st.permutations(m.axis_names)):
        if draw(st.booleans()):
            dims.append(name)
    spec = P(*dims[:2]) if len(dims) <= 2 else P(dims[0], tuple(dims[1:]))
    sh = NamedSharding(m, spec)
    shape = tuple(draw(st.integers(0, 6)) for _ in range(len(spec) + draw(st.integers(0, 1))))
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)

    def call(tensor=t, sharding=sh, other=None):
        def run():
            with fake_world(rank, world):
                rm = fm.realize(m)
                target = rm if other is None else fm.realize(other)
                out = fm.distribute(tensor, sharding, mesh=target)
                return None if out is None else (tuple(out.to_local().shape), tuple(out.shape))
        return run

    def check(out):
        slices = sh.local_slices(shape, rank)
        if slices is None:
            assert out is None, out
        else:
            assert out == (tuple(s.stop - s.start for s in slices), shape), (out, slices)

    kind = pick(draw, ["valid"] * 2 + ["sharding-type", "tensor-type", "other-mesh"] + (["short"] if len(spec) else []))
    if kind == "valid":
        return valid(f"distribute({shape}, {sh!r}) as rank {rank}", call(), check)
    if kind == "sharding-type":
        v = pick(draw, [spec, m, None, "dp"])
        return bad(f"distribute(sharding={v!r})", call(sharding=v), v)
    if kind == "tensor-type":
        v = pick(draw, [np.zeros(shape).tolist(), None, 3.0])
        return bad(f"distribute({v!r})", call(tensor=v), v)
    if kind == "other-mesh":
        other = fm.make_mesh((world,), ("w",))
        if other == m:
            other = fm.make_mesh((1,), ("w",))
        return bad(f"distribute on {other!r} of a sharding on {m!r}", call(other=other), m, other)
    short = torch.zeros(shape[:len(spec) - 1])
    return bad(f"distribute of a {short.dim()}-d tensor for {spec}", call(tensor=short), tuple(short.shape))


@REG.entry("from_device_mesh/sharding_of")
def interop_case(draw):
    """The pure mesh of a torch DeviceMesh, and the sharding of a DTensor; anything else is a TypeError."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 3))))
    names = ("dp", "cp", "tp")[:len(sizes)]
    world = math.prod(sizes)
    rank = draw(st.integers(0, world - 1))
    which = pick(draw, ["from_device_mesh", "sharding_of"])
    if which == "from_device_mesh":
        def call_dm():
            with fake_world(rank, world):
                return fm.from_device_mesh(init_device_mesh("cpu", sizes, mesh_dim_names=names))

        if draw(st.booleans()):
            return valid(f"from_device_mesh of {sizes}", call_dm,
                         lambda out: _check(out == fm.make_mesh(sizes, names), out))
        v = pick(draw, [fm.make_mesh(sizes, names), None, "dm", _OBJ])
        return bad(f"from_device_mesh({v!r})", lambda: fm.from_device_mesh(v), v)
    m = fm.make_mesh(sizes, names)
    spec = P(*[n for n in names if draw(st.booleans())])
    shape = tuple(draw(st.integers(0, 5)) for _ in range(len(spec)))

    def call_sh():
        with fake_world(rank, world):
            rm = fm.realize(m)
            return fm.sharding_of(fm.distribute(torch.zeros(shape), NamedSharding(m, spec), mesh=rm))

    if draw(st.booleans()):
        return valid(f"sharding_of(distribute(..., {spec}))", call_sh,
                     lambda out: _check(out == NamedSharding(m, spec), out))
    v = pick(draw, [torch.zeros(2), None, NamedSharding(m, spec), m])
    return bad(f"sharding_of({v!r})", lambda: fm.sharding_of(v), v)


test_entry_point = REG.test()
