"""Collectives by axis name on real gloo workers (world 8): values, mesh order, tuples, autograd, errors.

The spec is the PURE mesh: for an axis (a name, or a tuple = the product, first name major)
the members of this rank's group, in mesh order, are ``mesh[axis].flatten().group_of(rank)``
and this rank's index is its coordinate there. Every rank's input is a known function of its
global rank, so each worker computes what every collective must return (and what every
gradient must be, from the autograd rules of docs/design.md, "Collectives and autograd") with plain torch from those members,
never from the code under test. Each check returns a list of mismatches; the parent asserts
it is empty on every rank.

Each mesh is realized twice: with ``products=`` for every tuple (the product-group path) and
without (the composed, axis-by-axis path).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import functional_mesh as fm
from functional_mesh import Mesh, P
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT, MESHES

w8 = pool_fixture(8)



TUPLES = [("dp", "cp"), ("tp", "dp"), ("cp", "tp"), ("dp", "cp", "tp"), ("tp", "cp", "dp")]
AXES = ["dp", "cp", "tp", *TUPLES]


def realize(mesh: Mesh, products: bool, tuples=TUPLES):
    return fm.realize(mesh, timeout=GROUP_TIMEOUT, check=CHECK_S, products=tuples if products else ())


# -- the pure spec -------------------------------------------------------------------------------


def members_of(mesh: Mesh, axis, rank: int) -> tuple[list[int], int]:
    """This rank's group of ``axis`` (global ranks, mesh order) and its index in it."""
    fam = mesh[axis] if isinstance(axis, str) else mesh[axis].flatten(name="product")
    members = fam.group_of(rank).reshape(-1).tolist()
    (index,) = fam.coordinate(rank)
    assert members[index] == rank
    return members, index


def X(rank: int, shape=(8, 8)) -> torch.Tensor:
    """Rank ``rank``'s input: distinct per rank and element, exact in float64."""
    n = int(np.prod(shape))
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 3 + 1000 * (rank + 1)).contiguous()


def G(rank: int, shape) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient (differs per rank and element)."""
    n = int(np.prod(shape))
    return torch.arange(n, dtype=torch.float64).reshape(shape) % 7 + 10 * (rank + 1)


def chunk(t: torch.Tensor, n: int, dim: int, i: int) -> torch.Tensor:
    return t.chunk(n, dim)[i]


class Mismatches(list):
    def eq(self, what, got, want):
        if not isinstance(got, torch.Tensor):
            if got != want:
                self.append(f"{what}: got {got!r}, want {want!r}")
        elif got.shape != want.shape or not torch.equal(got.to(want.dtype), want):
            self.append(f"{what}: got shape {tuple(got.shape)} {got.flatten()[:6].tolist()}, "
                        f"want shape {tuple(want.shape)} {want.flatten()[:6].tolist()}")


def grad_of(fn, x: torch.Tensor, upstream) -> tuple[torch.Tensor, torch.Tensor]:
    """(fn(x), d sum(fn(x) * upstream(out.shape)) / dx)."""
    x = x.clone().requires_grad_(True)
    y = fn(x)
    (y * upstream(tuple(y.shape))).sum().backward()
    return y.detach(), x.grad


# -- forward values ------------------------------------------------------------------------------


def forward_values(mesh: Mesh, products: bool, axes=AXES, tuples=TUPLES) -> list[str]:
    rm = realize(mesh, products, tuples)
    r = rm.rank
    bad = Mismatches()
    for axis in axes:
        mem, i = members_of(mesh, axis, r)
        n = len(mem)
        if isinstance(axis, tuple):
            bad.eq(f"{axis} product path", rm.has_group(axis), products)
        bad.eq(f"axis_index {axis}", fm.axis_index(axis, mesh=rm), i)
        bad.eq(f"axis_size {axis}", fm.axis_size(axis, mesh=rm), n)
        x = X(r)
        total = sum(X(m) for m in mem)
        bad.eq(f"psum {axis}", fm.psum(x, axis, mesh=rm), total)
        bad.eq(f"pmean {axis}", fm.pmean(x, axis, mesh=rm), total / n)
        bad.eq(f"pvary {axis}", fm.pvary(x, axis, mesh=rm), x)
        x3 = X(r, (2, 3, 4))
        for d in (0, 1, 2, -1):
            bad.eq(f"all_gather {axis} dim={d}", fm.all_gather(x3, axis, dim=d, mesh=rm),
                   torch.cat([X(m, (2, 3, 4)) for m in mem], d))
            bad.eq(f"all_gather untiled {axis} dim={d}", fm.all_gather(x3, axis, dim=d, tiled=False, mesh=rm),
                   torch.stack([X(m, (2, 3, 4)) for m in mem], d))
        for d in (0, 1):
            shape = (8, 16) if d == 0 else (3, 16)
            tot = sum(X(m, shape) for m in mem)
            bad.eq(f"psum_scatter {axis} dim={d}", fm.psum_scatter(X(r, shape), axis, dim=d, mesh=rm),
                   chunk(tot, n, d, i))
            ushape = (n, 5) if d == 0 else (3, n)
            utot = sum(X(m, ushape) for m in mem)
            bad.eq(f"psum_scatter untiled {axis} dim={d}",
                   fm.psum_scatter(X(r, ushape), axis, dim=d, tiled=False, mesh=rm), utot.select(d, i))
        ring = [(k, (k + 1) % n) for k in range(n)]
        bad.eq(f"ppermute ring {axis}", fm.ppermute(x, axis, ring, mesh=rm), X(mem[(i - 1) % n]))
        shift = [(k, k + 1) for k in range(n - 1)]  # no wrap: index 0 receives nothing
        bad.eq(f"ppermute shift {axis}", fm.ppermute(x, axis, shift, mesh=rm),
               torch.zeros_like(x) if i == 0 else X(mem[i - 1]))
        back = [(n - 1, 0)]  # only index 0 receives
        bad.eq(f"ppermute one pair {axis}", fm.ppermute(x, axis, back, mesh=rm),
               X(mem[n - 1]) if i == 0 else torch.zeros_like(x))
        for s, c in ((0, 1), (1, 0), (0, 0), (2, 1)):  # a tuple: its product group, or composed per axis
            shape = (8, 8, 8)
            want = torch.cat([chunk(X(m, shape), n, s, i) for m in mem], c)
            bad.eq(f"all_to_all {axis} split={s} concat={c}",
                   fm.all_to_all(X(r, shape), axis, s, c, mesh=rm), want)
    return bad


def all_to_all_untiled(mesh: Mesh, products: bool) -> list[str]:
    """JAX's untiled all_to_all: split_dim (size n) removed, arrivals stacked as a new concat_dim
    (shape ``np.insert(np.delete(x.shape, split), concat, n)``); arrival ``j`` is member ``j``'s
    slice ``i`` of split_dim."""
    rm = realize(mesh, products)
    r = rm.rank
    bad = Mismatches()
    for axis in ["tp", "cp", ("dp", "cp"), ("tp", "dp")]:
        mem, i = members_of(mesh, axis, r)
        n = len(mem)
        for s, c in ((2, 0), (0, 1), (1, 2), (0, 2)):
            shape = [3, 5, 6]
            shape[s] = n
            xs = [X(m, tuple(shape)) for m in mem]
            want = torch.stack([t.select(s, i) for t in xs], c)
            try:
                got = fm.all_to_all(X(r, tuple(shape)), axis, s, c, tiled=False, mesh=rm)
            except Exception as e:  # noqa: BLE001
                bad.append(f"all_to_all untiled {axis} split={s} concat={c}: raised {e!r}")
                continue
            bad.eq(f"all_to_all untiled {axis} split={s} concat={c}", got, want)
    return bad


# -- autograd --------------------------------------------------------------------------------------


def gradients(mesh: Mesh, products: bool, axes=AXES, tuples=TUPLES) -> list[str]:
    rm = realize(mesh, products, tuples)
    r = rm.rank
    bad = Mismatches()
    for axis in axes:
        mem, i = members_of(mesh, axis, r)
        n = len(mem)

        def up(shape, rank=r):
            return G(rank, shape)

        x = X(r, (4, 8))
        _, g = grad_of(lambda t, axis=axis: fm.psum(t, axis, mesh=rm), x, up)
        bad.eq(f"psum grad {axis}", g, G(r, (4, 8)))  # identity
        _, g = grad_of(lambda t, axis=axis: fm.pmean(t, axis, mesh=rm), x, up)
        bad.eq(f"pmean grad {axis}", g, G(r, (4, 8)) / n)
        _, g = grad_of(lambda t, axis=axis: fm.pvary(t, axis, mesh=rm), x, up)
        bad.eq(f"pvary grad {axis}", g, sum(G(m, (4, 8)) for m in mem))  # psum of upstream
        for d in (0, 1):
            gshape = (4 * n, 8) if d == 0 else (4, 8 * n)
            _, g = grad_of(lambda t, axis=axis, d=d: fm.all_gather(t, axis, dim=d, mesh=rm), x, up)
            bad.eq(f"all_gather grad {axis} dim={d}", g,  # psum_scatter of upstream
                   sum(chunk(G(m, gshape), n, d, i) for m in mem))
            ushape = (n, 4, 8) if d == 0 else (4, n, 8)
            _, g = grad_of(lambda t, axis=axis, d=d: fm.all_gather(t, axis, dim=d, tiled=False, mesh=rm), x, up)
            bad.eq(f"all_gather untiled grad {axis} dim={d}", g, sum(G(m, ushape).select(d, i) for m in mem))
            shape = (8, 16)
            oshape = (8 // n, 16) if d == 0 else (8, 16 // n)
            _, g = grad_of(lambda t, axis=axis, d=d: fm.psum_scatter(t, axis, dim=d, mesh=rm), X(r, shape), up)
            bad.eq(f"psum_scatter grad {axis} dim={d}", g,  # all_gather of upstream
                   torch.cat([G(m, oshape) for m in mem], d))
        pairs = {"ring": [(k, (k + 1) % n) for k in range(n)], "shift": [(k, k + 1) for k in range(n - 1)]}
        for name, perm in pairs.items():
            dest = dict(perm)
            _, g = grad_of(lambda t, axis=axis, perm=perm: fm.ppermute(t, axis, perm, mesh=rm), x, up)
            bad.eq(f"ppermute {name} grad {axis}", g,  # inverse permutation; a non-source gets zeros
                   G(mem[dest[i]], (4, 8)) if i in dest else torch.zeros(4, 8, dtype=torch.float64))
        for s, c in ((0, 1), (1, 0), (0, 0)):  # a tuple: its product group, or composed per axis
            shape = (8, 8)
            y, g = grad_of(lambda t, axis=axis, s=s, c=c: fm.all_to_all(t, axis, s, c, mesh=rm), X(r, shape), up)
            yshape = tuple(y.shape)
            # x's s-chunk k went to member k, landing as its c-chunk i: the inverse all_to_all
            bad.eq(f"all_to_all grad {axis} split={s} concat={c}", g,
                   torch.cat([chunk(G(m, yshape), n, c, i) for m in mem], s))
    return bad


def composed_chain(mesh: Mesh) -> list[str]:
    """pvary -> all_gather -> psum_scatter -> psum over different axes, one backward pass."""
    rm = realize(mesh, False)
    r = rm.rank
    bad = Mismatches()
    tp, _ = members_of(mesh, "tp", r)
    n = len(tp)
    dc, _ = members_of(mesh, ("dp", "cp"), r)
    x = X(r, (2, 4)).requires_grad_(True)
    y = fm.pvary(x, ("dp", "cp"), mesh=rm)
    z = fm.all_gather(y, "tp", mesh=rm)  # (2n, 4), the same on every tp member
    w = fm.psum_scatter(z, "tp", mesh=rm)  # the sum of n equal copies, my tp-chunk: n * x
    (w * G(r, (2, 4))).sum().backward()
    bad.eq("chain value", w.detach(), n * X(r, (2, 4)))
    # backward: psum_scatter^T = all_gather over tp gives cat(G(m) for m in tp) on every member;
    # all_gather^T = psum_scatter over tp of those n equal tensors: n * G(q) on rank q;
    # pvary^T = psum over (dp, cp).
    bad.eq("chain grad", x.grad, sum(n * G(q, (2, 4)) for q in dc))
    return bad


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_forward_values(w8, mesh_name, products):
    results = w8.run(forward_values, MESHES[mesh_name], products)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_gradients_follow_the_autograd_rules(w8, mesh_name, products):
    results = w8.run(gradients, MESHES[mesh_name], products)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_a_chain_of_collectives_backpropagates(w8, mesh_name):
    results = w8.run(composed_chain, MESHES[mesh_name])
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_all_to_all_untiled_follows_jax(w8, products):
    results = w8.run(all_to_all_untiled, MESHES["permuted"], products)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


# -- size-1 axes: no group, no communication, the values and gradients of the spec ----------------------
#
# The spec above does not care about sizes: over a size-1 axis a rank's group is itself, so psum is
# the identity, ppermute [(0, 0)] too, a shift sends nothing (zeros), and a tuple with size-1 axes
# is the tuple of the others. The same checks run on meshes with two size-1 axes, alone, together
# (a size-1 product) and inside tuples, with and without product groups.

SIZE1_NAMES = ("dp", "one", "tp", "unit")
SIZE1_TUPLES = [("one", "unit"), ("dp", "one"), ("one", "tp"), ("tp", "one", "dp"), ("unit", "dp", "one", "tp")]
SIZE1_AXES = ["one", "unit", "dp", "tp", *SIZE1_TUPLES]
SIZE1_MESHES = {
    "size-1": fm.make_mesh((2, 1, 4, 1), SIZE1_NAMES),
    "size-1-permuted": Mesh.from_ranks(np.array([5, 1, 7, 3, 4, 0, 6, 2]).reshape(2, 1, 4, 1), SIZE1_NAMES),
}


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("mesh_name", list(SIZE1_MESHES))
def test_size1_axes_give_the_values_of_the_spec(w8, mesh_name, products):
    results = w8.run(forward_values, SIZE1_MESHES[mesh_name], products, SIZE1_AXES, SIZE1_TUPLES)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("mesh_name", list(SIZE1_MESHES))
def test_size1_axes_give_the_gradients_of_the_spec(w8, mesh_name, products):
    results = w8.run(gradients, SIZE1_MESHES[mesh_name], products, SIZE1_AXES, SIZE1_TUPLES)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


def _counts() -> tuple[int, int, int]:
    from functional_mesh._cache import CACHE

    world = torch.distributed.distributed_c10d._world
    return world.group_count, len(world.pg_map), len(CACHE.created)


def size1_costs(mesh: Mesh) -> dict:
    """What realize creates for a mesh with size-1 axes, and what the collectives over them create."""
    from functional_mesh._cache import CACHE

    fm.clear_cache()
    start = _counts()
    rm = realize(mesh, True, SIZE1_TUPLES)
    realized = _counts()
    x = X(rm.rank, (4, 8)).requires_grad_(True)
    outs = []
    for axis in ["one", "unit", ("one", "unit"), ("dp", "one"), ("unit", "tp")]:
        n = fm.axis_size(axis, mesh=rm)
        outs += [fm.psum(x, axis, mesh=rm), fm.pvary(x, axis, mesh=rm), fm.pmean(x, axis, mesh=rm),
                 fm.all_gather(x, axis, dim=1, mesh=rm), fm.psum_scatter(x, axis, dim=0, mesh=rm),
                 fm.all_to_all(x, axis, 0, 1, mesh=rm), fm.ppermute(x, axis, [(k, (k + 1) % n) for k in range(n)],
                                                                    mesh=rm)]
    sum(o.sum() for o in outs).backward()
    after = _counts()
    return {"made": tuple(b - a for a, b in zip(start, realized)), "groups": fm.cache_info().groups,
            "collectives_made": tuple(b - a for a, b in zip(realized, after)), "lent": CACHE.self_group is not None}


def pure_new_rows(mesh: Mesh, axes: list) -> set[tuple[int, ...]]:
    """The member tuples realize must create: every group of more than one rank. The ascending world
    too: realize here asks for a timeout (GROUP_TIMEOUT) other than the default group's (the pool's
    30 s), so a whole-world axis cannot borrow the default group."""
    rows = set()
    for axis in axes:
        fam = mesh[axis] if isinstance(axis, str) else mesh[axis].flatten(name="product")
        rows |= {tuple(r) for r in fam.groups().reshape(fam.num_groups, -1).tolist() if len(r) > 1}
    return rows


@pytest.mark.parametrize("mesh_name", list(SIZE1_MESHES))
def test_size1_axes_cost_no_group_and_their_collectives_create_none(w8, mesh_name):
    mesh = SIZE1_MESHES[mesh_name]
    rows = pure_new_rows(mesh, [*mesh.axis_names, *SIZE1_TUPLES])
    for rank, res in enumerate(w8.run(size1_costs, mesh)):
        mine = sum(rank in r for r in rows)
        # the groups of dp, tp and the products of more than one rank (group_count on every rank,
        # pg_map and CACHE.created for this rank's), plus this rank's one-rank group for the size-1
        # axes, which realize makes (outside torch's counter) so that the handle makes none later
        assert res["made"] == (len(rows), mine + 1, mine + 1), (rank, res)
        assert res["groups"] == len(rows) and res["lent"] is True
        # psum, pvary, pmean, all_gather, psum_scatter, all_to_all, ppermute over size-1 axes, alone
        # and in tuples, forward and backward: no group made
        assert res["collectives_made"] == (0, 0, 0), (rank, res)


# -- the current mesh and errors ----------------------------------------------------------------------


def with_current(mesh: Mesh) -> list[str]:
    rm = realize(mesh, False)
    bad = Mismatches()
    mem, i = members_of(mesh, ("tp", "dp"), rm.rank)
    with rm:
        bad.eq("psum in with", fm.psum(X(rm.rank), ("tp", "dp")), sum(X(m) for m in mem))
        bad.eq("axis_index in with", fm.axis_index(("tp", "dp")), i)
        with rm["cp"]:  # the innermost `with` wins
            cmem, ci = members_of(mesh, "cp", rm.rank)
            bad.eq("nested with", fm.all_gather(X(rm.rank), "cp"), torch.cat([X(m) for m in cmem]))
            bad.eq("nested axis_index", fm.axis_index("cp"), ci)
    return bad


def test_the_current_mesh_serves_axis_names(w8):
    results = w8.run(with_current, MESHES["permuted"])
    assert results == [[]] * 8


def error_cases(mesh: Mesh) -> dict:
    rm = realize(mesh, False)
    x = X(rm.rank)
    calls = {
        "pure": lambda: fm.psum(x, "tp", mesh=mesh),
        "pure_all_gather": lambda: fm.all_gather(x, "tp", mesh=mesh),
        "pure_axis_index": lambda: fm.axis_index("tp", mesh=mesh),
        "none": lambda: fm.psum(x, "tp"),
        "none_ppermute": lambda: fm.ppermute(x, "tp", [(0, 1)]),
        "none_axis_size": lambda: fm.axis_size("tp"),
        "unknown": lambda: fm.psum(x, "tpp", mesh=rm),
        "unknown_in_tuple": lambda: fm.all_gather(x, ("dp", "TP"), mesh=rm),
        "unknown_axis_index": lambda: fm.axis_index("cpp", mesh=rm),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = (type(e).__name__, isinstance(e, fm.MeshError), str(e))
    # the world is still in step: a collective works after the errors
    out["after"] = fm.psum(torch.ones(1), "tp", mesh=rm).item()
    return out


def test_errors(w8):
    for rank, res in enumerate(w8.run(error_cases, MESHES["permuted"])):
        for name in ("pure", "pure_all_gather", "pure_axis_index"):
            assert res[name] is not None and res[name][0] == "TypeError", (rank, name, res[name])
            assert re.search(r"realize", res[name][2]), res[name]
        for name in ("none", "none_ppermute", "none_axis_size"):
            assert res[name] is not None and res[name][1], (rank, name, res[name])
            assert re.search(r"with rm", res[name][2]), res[name]
        for name, guess in (("unknown", "tp"), ("unknown_in_tuple", "tp"), ("unknown_axis_index", "cp")):
            assert res[name] is not None and res[name][1], (rank, name, res[name])
            assert re.search(rf"did you mean '{guess}'", res[name][2]), res[name]
        assert res["after"] == 2.0


# -- pmax / pmin: the extreme over the members; the gradient to the members holding it ------------------
#
# The spec is one process: the members' inputs stacked (mesh order), torch.amax / torch.amin over
# them, and autograd through that; ties split the gradient evenly, as torch's own backward does.
# Inputs take few distinct values, so that most elements tie between 2 or more members (unequal
# counts across a tuple's rows too). Outside a region the result's cotangent is this rank's own
# (taken as replicated, as psum's); in regions the one-process program is the whole mapped function.

EXTREMA = {"pmax": torch.amax, "pmin": torch.amin}


def T(rank: int, shape=(4, 6)) -> torch.Tensor:
    """Rank ``rank``'s input with many ties across ranks (values 0..3, exact in float64)."""
    n = int(np.prod(shape))
    return ((torch.arange(n) * (1 + rank % 3) + rank // 3) % 4).to(torch.float64).reshape(shape)


def one_process(op: str, inputs: list[torch.Tensor], cotangent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the extreme over the stacked inputs, each input's gradient, stacked) with plain torch."""
    stacked = torch.stack(inputs).requires_grad_(True)
    y = EXTREMA[op](stacked, 0)
    (y * cotangent).sum().backward()
    return y.detach(), stacked.grad


def extrema_eager(mesh: Mesh, products: bool, axes=AXES, tuples=TUPLES) -> list[str]:
    rm = realize(mesh, products, tuples)
    r = rm.rank
    bad = Mismatches()
    ties = 0
    for axis in axes:
        mem, i = members_of(mesh, axis, r)
        for op in EXTREMA:
            fn = getattr(fm, op)
            for cotangent in ("replicated", "this rank's"):
                up = G(0, (4, 6)) if cotangent == "replicated" else G(r, (4, 6))
                want_y, want_grads = one_process(op, [T(m) for m in mem], up)
                y, g = grad_of(lambda t, axis=axis, fn=fn: fn(t, axis, mesh=rm), T(r), lambda shape, up=up: up)
                bad.eq(f"{op} {axis}", y, want_y)
                bad.eq(f"{op} grad {axis}, {cotangent} cotangent", g, want_grads[i])
            ties += int(((want_grads[i] != 0) & (want_grads[i] != up)).sum())  # shared gradients
            bad.eq(f"{op} {axis} without a gradient", fn(T(r), axis, mesh=rm), want_y)
            bad.eq(f"{op} {axis} integers", fn(T(r).long(), axis, mesh=rm), want_y.long())
    if ties == 0:
        bad.append("the inputs hold no ties: the test would not see how ties share the gradient")
    return bad


def extrema_in_regions(mesh: Mesh, products: bool) -> list[str]:
    """pmax/pmin inside shard_map, typed and untyped: every rank's block is T(rank); the result's
    out_spec names the axes not reduced. Output and the full input's gradient against one process."""
    rm = realize(mesh, products)
    bad = Mismatches()
    order = mesh.flatten(name="all").group_of(rm.rank).reshape(-1).tolist()  # every device, mesh order
    full = torch.cat([T(d) for d in order])
    for axis in ["tp", ("dp", "cp"), ("tp", "cp", "dp")]:
        names = (axis,) if isinstance(axis, str) else axis
        other = tuple(a for a in mesh.axis_names if a not in names)
        rows = mesh[other].flatten(name="o") if other else None
        n_other = rows.size if rows is not None else 1

        def row_of(d, rows=rows):
            return rows.coordinate(d)[0] if rows is not None else 0

        cotangent = torch.cat([G(k, (4, 6)) for k in range(n_other)])  # the result's, full
        for op in EXTREMA:
            want_y, want_grad = [None] * n_other, [None] * len(order)
            for d in order:
                mem, i = members_of(mesh, axis, d)
                y, grads = one_process(op, [T(m) for m in mem], G(row_of(d), (4, 6)))
                want_y[row_of(d)], want_grad[order.index(d)] = y, grads[i]
            for check_vma in (True, False):
                seen = {}

                def body(x, axis=axis, op=op, seen=seen):
                    y = getattr(fm, op)(x, axis)
                    seen["type"] = fm.typeof(y).varying if check_vma else None
                    return y

                f = fm.shard_map(body, mesh=rm, in_specs=P(mesh.axis_names), out_specs=P(other) if other else P(),
                                 check_vma=check_vma)
                x = full.clone().requires_grad_(True)
                y = f(x).full_tensor()
                (y * cotangent).sum().backward()
                label = f"{op} {axis} {'typed' if check_vma else 'untyped'}"
                bad.eq(label, y.detach(), torch.cat(want_y))
                bad.eq(f"{label} grad", x.grad, torch.cat(want_grad))
                if check_vma:  # invariant over the axes reduced, like psum
                    bad.eq(f"{label} type", seen["type"], frozenset(other))
    return bad


def extrema_errors(mesh: Mesh) -> dict:
    rm = realize(mesh, False)
    x = T(rm.rank)
    calls = {
        "unknown": lambda: fm.pmax(x, "tpp", mesh=rm),
        "unknown_in_tuple": lambda: fm.pmin(x, ("dp", "TP"), mesh=rm),
        "repeated": lambda: fm.pmax(x, ("tp", "tp"), mesh=rm),
        "complex": lambda: fm.pmax(x.to(torch.complex128), "tp", mesh=rm),
        "not a tensor": lambda: fm.pmin([1.0], "tp", mesh=rm),
        "pure mesh": lambda: fm.pmax(x, "tp", mesh=mesh),
        "mixed in a region": lambda: fm.shard_map(lambda v: fm.pmax(v, ("dp", "tp")), mesh=rm,
                                                  in_specs=P("dp"), out_specs=P())(torch.ones(2, 3)),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = (type(e).__name__, str(e))
    out["after"] = fm.pmax(torch.tensor([float(rm.rank)]), "tp", mesh=rm).item()  # the world is still in step
    return out



@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_pmax_and_pmin_give_one_process_values_and_gradients(w8, mesh_name, products):
    results = w8.run(extrema_eager, MESHES[mesh_name], products)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_pmax_and_pmin_over_size1_axes(w8, products):
    results = w8.run(extrema_eager, SIZE1_MESHES["size-1-permuted"], products, SIZE1_AXES, SIZE1_TUPLES)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_pmax_and_pmin_in_typed_and_untyped_regions(w8, products):
    results = w8.run(extrema_in_regions, MESHES["permuted"], products, timeout=120)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


def test_pmax_and_pmin_errors(w8):
    mesh = MESHES["permuted"]
    for rank, res in enumerate(w8.run(extrema_errors, mesh)):
        assert res["unknown"][0] == "UnknownAxisError" and "did you mean 'tp'" in res["unknown"][1], res
        assert res["unknown_in_tuple"][0] == "UnknownAxisError" and "did you mean 'tp'" in res["unknown_in_tuple"][1]
        assert res["repeated"][0] == "MeshError" and "distinct axis names" in res["repeated"][1], res
        assert res["complex"] == ("TypeError", "`pmax` requires a real tensor (complex numbers have no order), but "
                                  "got x.dtype=torch.complex128"), res
        assert res["not a tensor"] == ("TypeError", "`pmin` requires a torch.Tensor, but got x=[1.0]"), res
        assert res["pure mesh"][0] == "TypeError" and "realize" in res["pure mesh"][1], res
        assert res["mixed in a region"][0] == "VmaError", res
        assert "`pmax` over ('dp', 'tp') requires a value that varies over all of these axes or over none" in \
            res["mixed in a region"][1], res
        tp, _ = members_of(mesh, "tp", rank)
        assert res["after"] == max(tp)
