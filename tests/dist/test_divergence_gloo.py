"""Divergent ranks on real gloo workers (world 4): realize's check and the opt-in collective check.

What is expected comes from the pure meshes and from the documented rules of the check
(docs/realize.md): the first participant leads and waits ``wait`` seconds for the others; a
follower waits up to ``min(5, wait / 2)`` seconds longer for the leader's verdict; a request
that differs is reported at once, a missing rank after the wait; every rank that got there
raises. Each raising rank times its own call.

Call numbers are per process (per realize call; per group, or per mesh, for collectives), so a
rank that skipped a call lags one number behind until it makes the call it missed: that late
call meets the verdict the others reached and raises too. Every test leaves the world in step
again and proves it with a matching program that must succeed.

Tests already in test_realize_gloo.py (a rank asking for another mesh, a late rank, an absent
rank, an absent rank 0) are not repeated here.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import time

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import Mesh, make_mesh
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4, own=True)  # ranks skip realize calls on purpose: a pool of its own

ENV = "FUNCTIONAL_MESH_CHECK_COLLECTIVES"
TIMEOUT_ENV = "FUNCTIONAL_MESH_CHECK_TIMEOUT"
WAIT = 10.0  # s: the check's wait where a rank is missing (the test waits for it); above MARGIN, so an
# "at once" bound (< MARGIN) still fails a check that waited the wait
LONG_WAIT = 40.0  # s: the wait where every rank arrives: a divergence must be reported long before
FOLLOWER_WAIT = WAIT + min(5.0, WAIT / 2)  # the documented follower wait
# s: scheduling slack on two busy cores (3 s was exceeded at load ~30: 4.5 s). Every bound (at most
# FOLLOWER_WAIT + MARGIN) stays well under LONG_WAIT, what a missed divergence would cost.
MARGIN = 8.0
assert MARGIN < WAIT and FOLLOWER_WAIT + MARGIN < LONG_WAIT / 1.5

A = make_mesh((2, 2), ("dp", "tp"))
B = make_mesh((4,), ("w",))
M = A  # the mesh of the collective tests


def X(rank: int, shape=(4,), dtype=torch.float64) -> torch.Tensor:
    """Rank ``rank``'s input: distinct per rank and element, exact in float64."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 3 + 1000 * (rank + 1)).to(dtype)


def others(odd: int) -> str:
    return re.escape(str([r for r in range(4) if r != odd]))


def group_sum(mesh: Mesh, axis: str, rank: int, shape=(4,)) -> list:
    """The psum over ``axis`` that ``rank`` must get, from the pure mesh."""
    return sum(X(m, shape) for m in mesh[axis].group_of(rank).reshape(-1).tolist()).tolist()


# -- helpers run on every rank ----------------------------------------------------------------------


def timed(fn, *args, **kwargs) -> tuple:
    """``("ok", value, seconds)``, or ``("MeshError", message, seconds)``; anything else propagates."""
    t0 = time.monotonic()
    try:
        value = fn(*args, **kwargs)
    except fm.MeshError as e:
        return ("MeshError", str(e), time.monotonic() - t0)
    return ("ok", value, time.monotonic() - t0)


@contextlib.contextmanager
def env(mode: str | None, wait: float = CHECK_S):
    """The collective check mode (``None``: unset) and the check's wait, for the duration."""
    saved = {k: os.environ.get(k) for k in (ENV, TIMEOUT_ENV)}
    os.environ[TIMEOUT_ENV] = str(wait)
    if mode is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = mode
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def realize_mesh(mesh: Mesh, wait: float) -> str:
    return repr(fm.realize(mesh, timeout=GROUP_TIMEOUT, check=wait).mesh)


def realize_sequence(plans: dict[int, list[Mesh]], default: list[Mesh], wait: float) -> list[tuple]:
    return [timed(realize_mesh, mesh, wait) for mesh in plans.get(dist.get_rank(), default)]


def only_rank_realizes(rank: int, mesh: Mesh, wait: float) -> tuple | None:
    return timed(realize_mesh, mesh, wait) if dist.get_rank() == rank else None


def in_step(meshes: list[Mesh], mode: str | None = None) -> list[list]:
    """Realize each mesh (checked) and psum 10**rank over each of its axes (checked if ``mode``)."""
    out = []
    for mesh in meshes:
        rm = fm.realize(mesh, timeout=GROUP_TIMEOUT, check=CHECK_S)
        with env(mode):
            for axis in mesh.axis_names:
                out.append(fm.psum(X(rm.rank), axis, mesh=rm).tolist())
    return out


def assert_in_step(pool, meshes=(A, B), mode=None):
    want = [[group_sum(m, axis, r) for m in meshes for axis in m.axis_names] for r in range(4)]
    assert pool.run(in_step, list(meshes), mode) == want


def call_numbers(messages: list[str], pattern: str) -> set[str]:
    return {re.search(pattern, m).group(1) for m in messages}


# -- realize: another sequence of meshes -------------------------------------------------------------


@pytest.mark.parametrize("odd", [3, 0], ids=["rank3", "leader"])
def test_ranks_realizing_the_meshes_in_another_order_all_raise_at_once_at_each_call(w4, odd):
    results = w4.run(realize_sequence, {odd: [B, A]}, [A, B], LONG_WAIT)
    for i, (mine, theirs) in enumerate([(A, B), (B, A)]):
        calls = [res[i] for res in results]
        pattern = (rf"`realize` requires every rank to call it with an equal mesh, but realize call #(\d+) "
                   rf"differs across ranks: ranks {others(odd)} asked for {re.escape(repr(mine))} .*; "
                   rf"ranks \[{odd}\] asked for {re.escape(repr(theirs))} ")
        for rank, (kind, message, seconds) in enumerate(calls):
            assert kind == "MeshError", (rank, i, message)
            assert re.search(pattern, message), (rank, message)
            assert seconds < MARGIN, (rank, i, seconds)  # every rank arrived: no waiting for the wait
        assert len(call_numbers([c[1] for c in calls], pattern)) == 1  # one verdict, named alike everywhere
    assert_in_step(w4)


@pytest.mark.parametrize("skipper", [2, 0], ids=["rank2", "leader"])
def test_a_rank_that_skips_a_realize_call_fails_that_call_and_the_next_on_every_rank(w4, skipper):
    # ranks realize [A, B]; the skipper only [B]: its B meets the others' A, then it is absent
    results = w4.run(realize_sequence, {skipper: [B]}, [A, B], WAIT)
    first = [res[0] for res in results]
    differ = (rf"realize call #(\d+) differs across ranks: ranks {others(skipper)} asked for "
              rf"{re.escape(repr(A))} .*; ranks \[{skipper}\] asked for {re.escape(repr(B))} ")
    for rank, (kind, message, seconds) in enumerate(first):
        assert kind == "MeshError" and re.search(differ, message), (rank, message)
        assert seconds < WAIT + MARGIN, (rank, seconds)
    (first_call,) = call_numbers([c[1] for c in first], differ)
    skipped_call = int(first_call) + 1
    last = rf"realize call #{first_call}, asking for {re.escape(repr(B))}"
    if skipper == 0:  # no leader: each follower gives up after its longer wait
        absent = (rf"`realize` requires every rank to call it with an equal mesh, but realize call #{skipped_call} "
                  rf"got no verdict from rank 0 within {WAIT:g} s; ranks not arrived: \[0\]; rank \d asked for "
                  rf"{re.escape(repr(B))} .*; rank 0 was last at {last}")
        bound = FOLLOWER_WAIT + MARGIN
    else:
        absent = (rf"`realize` requires every rank to call it with an equal mesh, but ranks \[{skipper}\] did not "
                  rf"reach realize call #{skipped_call} within {WAIT:g} s \(the others asked for "
                  rf"{re.escape(repr(B))} .*\); rank {skipper} was last at {last}")
        bound = WAIT + MARGIN
    waited = []
    for rank, res in enumerate(results):
        if rank == skipper:
            assert len(res) == 1
            continue
        kind, message, seconds = res[1]
        assert kind == "MeshError" and re.search(absent, message), (rank, message)
        assert seconds <= bound, (rank, seconds)
        waited.append(seconds)
    assert max(waited) >= WAIT - 0.2  # the one who gave up first waited the whole wait
    # the skipper's late call takes the number the others abandoned: it raises with their verdict, at once
    outs = w4.run(only_rank_realizes, skipper, B, WAIT)
    kind, message, seconds = outs[skipper]
    assert kind == "MeshError" and re.search(absent, message), message
    assert seconds < MARGIN, seconds
    assert_in_step(w4)


# -- collectives: the opt-in check ---------------------------------------------------------------------


def run_op(op: str, x: torch.Tensor, axis, rm) -> list | str:
    if op.endswith("_async"):  # issued with async_op=True: a check's error comes at issue, not at wait()
        pending = getattr(fm, op.removesuffix("_async"))(x, axis, mesh=rm, async_op=True)
        try:
            return pending.wait().tolist()
        except fm.MeshError as e:
            return f"raised at wait(): {e}"
    if op == "psum":
        return fm.psum(x, axis, mesh=rm).tolist()
    if op == "all_gather":
        return fm.all_gather(x, axis, mesh=rm).tolist()
    if op == "grad_of_all_gather":  # forward all_gather, then its backward (a psum_scatter)
        x = x.clone().requires_grad_(True)
        y = fm.all_gather(x, axis, mesh=rm)
        y.backward(torch.ones_like(y))
        return x.grad.tolist()
    if op == "all_gather_then_psum_scatter":  # the same traffic as the line above, by hand
        y = fm.all_gather(x, axis, mesh=rm)
        return fm.psum_scatter(torch.ones_like(y), axis, mesh=rm).tolist()
    raise AssertionError(op)


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def warm_up_autograd() -> None:
    """A process's first backward through a custom Function imports ~500 modules (~1-4 s on busy
    cores, torch's own cost): pay it before timing anything."""
    x = torch.ones(1, requires_grad=True)
    _Double.apply(x).sum().backward()


def collective_variant(mode: str, wait: float, mesh: Mesh, calls: dict[int, tuple], default: tuple) -> tuple:
    rm = fm.realize(mesh, timeout=GROUP_TIMEOUT, check=CHECK_S)
    warm_up_autograd()
    op, axis, shape, dtype = calls.get(rm.rank, default)
    with env(mode, wait):
        return timed(run_op, op, X(rm.rank, shape, dtype), axis, rm)


def catch_up(mode: str, wait: float, mesh: Mesh, calls: dict[int, tuple]) -> tuple | None:
    rm = fm.realize(mesh, timeout=GROUP_TIMEOUT, check=CHECK_S)
    if rm.rank not in calls:
        return None
    op, axis = calls[rm.rank]
    with env(mode, wait):
        return timed(run_op, op, X(rm.rank), axis, rm)


F64 = torch.float64
PSUM_TP = ("psum", "tp", (4,), F64)
PSUM_DP = ("psum", "dp", (4,), F64)


def psum_request(axis: str) -> str:
    return re.escape(f"psum(axis=({axis!r},)) on {A!r} with float64[4]")


def test_group_mode_a_rank_psumming_over_another_axis_fails_its_groups_within_the_wait(w4):
    # rank 3 psums over dp (group [1, 3]) while 0, 1, 2 psum over tp (groups [0, 1] and [2, 3]).
    # Only the members of a group compare: [0, 1] agree and reduce correctly; rank 2 finds rank 3
    # missing from [2, 3]; rank 3 finds rank 1 (the leader of [1, 3]) missing. Both name where the
    # missing rank is instead.
    outs = w4.run(collective_variant, "1", WAIT, M, {3: PSUM_DP}, PSUM_TP)
    rule = r"`psum` requires every member of the group to make the same collective call \(" + ENV + r"=1\), but "
    assert outs[0] == ("ok", group_sum(M, "tp", 0), outs[0][2])
    assert outs[1] == ("ok", group_sum(M, "tp", 1), outs[1][2])
    leader_view = (rule + rf"ranks \[3\] did not reach collective call #\d+ of group \[2, 3\] within {WAIT:g} s "
                   rf"\(the others asked for {psum_request('tp')}\); rank 3 was last at collective call #\d+ of "
                   rf"group \[1, 3\], asking for {psum_request('dp')}$")
    follower_view = (rule + rf"collective call #\d+ of group \[1, 3\] got no verdict from rank 1 within {WAIT:g} s; "
                     rf"ranks not arrived: \[1\]; rank 3 asked for {psum_request('dp')}; rank 1 was last at "
                     rf"collective call #\d+ of group \[0, 1\], asking for {psum_request('tp')}$")
    for rank, pattern, bound in ((2, leader_view, WAIT + MARGIN), (3, follower_view, FOLLOWER_WAIT + MARGIN)):
        kind, message, seconds = outs[rank]
        assert kind == "MeshError" and re.search(pattern, message), (rank, message)
        assert WAIT - 0.2 <= seconds <= bound, (rank, seconds)
    # the calls each rank missed: rank 1 psums over dp, rank 3 over tp; each meets its group's verdict
    late = w4.run(catch_up, "1", WAIT, M, {1: ("psum", "dp"), 3: ("psum", "tp")})
    assert late[0] is None and late[2] is None
    for rank, pattern in ((1, follower_view), (3, leader_view)):
        kind, message, seconds = late[rank]
        assert kind == "MeshError" and re.search(pattern, message), (rank, message)
        assert seconds < MARGIN, (rank, seconds)
    assert_in_step(w4, [M], mode="1")


def test_mesh_mode_a_rank_psumming_over_another_axis_fails_every_rank_at_once(w4):
    outs = w4.run(collective_variant, "mesh", LONG_WAIT, M, {3: PSUM_DP}, PSUM_TP)
    pattern = (r"`psum` requires every device of the mesh to make the same sequence of collective calls \(" + ENV
               + r"=mesh\), but collective call #\d+ of mesh devices 0\.\.3 differs across ranks: "
               rf"ranks \[0, 1, 2\] asked for {psum_request('tp')}; ranks \[3\] asked for {psum_request('dp')}$")
    for rank, (kind, message, seconds) in enumerate(outs):
        assert kind == "MeshError" and re.search(pattern, message), (rank, message)
        assert seconds < MARGIN, (rank, seconds)
    assert_in_step(w4, [M], mode="mesh")


W = B  # a one-axis mesh whose group is the whole world: every rank is in the one group


def w_request(op: str, dtype: str = "float64", shape: str = "4", params: str = "") -> str:
    return re.escape(f"{op}(axis=('w',){params}) on {W!r} with {dtype}[{shape}]")


GATHER = ", dim=0, tiled=True"
GROUP_CASES = {
    # rank `odd` makes its call, the others theirs; the api each side's error names, and the two
    # requests the message must quote (the others' first)
    "all_gather_vs_psum": (3, ("all_gather", "w", (4,), F64), ("psum", "w", (4,), F64), ("psum", "all_gather"),
                           w_request("psum"), w_request("all_gather", params=GATHER)),
    "shape": (1, ("psum", "w", (3,), F64), ("psum", "w", (4,), F64), ("psum", "psum"),
              w_request("psum"), w_request("psum", shape="3")),
    "dtype": (2, ("psum", "w", (4,), torch.float32), ("psum", "w", (4,), F64), ("psum", "psum"),
              w_request("psum"), w_request("psum", dtype="float32")),
    # issued with async_op=True: the check runs before the communication starts, so the call raises
    # when it is issued, on every member (the message is the blocking call's)
    "async": (3, ("all_gather_async", "w", (4,), F64), ("psum_async", "w", (4,), F64), ("psum", "all_gather"),
              w_request("psum"), w_request("all_gather", params=GATHER)),
    # without the check both sides run a reduce-scatter of equal size: a silent mix-up
    "backward_vs_forward": (0, ("all_gather_then_psum_scatter", "w", (4,), F64), ("grad_of_all_gather", "w", (4,), F64),
                            ("all_gather", "psum_scatter"),
                            w_request("backward of all_gather", shape="16", params=GATHER),
                            w_request("psum_scatter", shape="16", params=GATHER)),
}


@pytest.mark.parametrize("case", list(GROUP_CASES))
def test_group_mode_members_asking_for_different_collectives_all_raise_at_once(w4, case):
    odd, theirs, default, (api, odd_api), most, odd_request = GROUP_CASES[case]
    outs = w4.run(collective_variant, "1", LONG_WAIT, W, {odd: theirs}, default)
    pattern = (rf"requires every member of the group to make the same collective call \({ENV}=1\), but "
               rf"collective call #\d+ of group \[0, 1, 2, 3\] differs across ranks: ranks {others(odd)} asked for "
               rf"{most}; ranks \[{odd}\] asked for {odd_request}$")
    for rank, (kind, message, seconds) in enumerate(outs):
        assert kind == "MeshError" and re.match(f"`{odd_api if rank == odd else api}` " + pattern, message), \
            (rank, message)
        assert seconds < MARGIN, (rank, seconds)
    assert_in_step(w4, [W], mode="1")


def test_group_mode_checks_matching_async_calls_and_gives_their_values(w4):
    for mode in ("1", "mesh"):
        outs = w4.run(collective_variant, mode, LONG_WAIT, M, {}, ("psum_async", "tp", (4,), F64))
        assert [out[:2] for out in outs] == [("ok", group_sum(M, "tp", r)) for r in range(4)], outs


# -- a matching program: the same results, and no store traffic when off ----------------------------------


class CountingStore:
    """The real default store, counting the calls made through it (instrumentation, not a mock)."""

    def __init__(self, store) -> None:
        self.store = store
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


@contextlib.contextmanager
def counting_store():
    c10d = dist.distributed_c10d
    real = c10d._get_default_store
    counter = CountingStore(real())
    c10d._get_default_store = lambda: counter
    try:
        yield counter
    finally:
        c10d._get_default_store = real


def program(rm, rmp) -> list:
    """Every collective, forward and backward, on one axis, a composed tuple and a product group."""
    r = rm.rank
    x = X(r, (4, 4))
    ring = [(k, (k + 1) % 4) for k in range(4)]
    out = [
        fm.psum(x, "tp", mesh=rm),
        fm.pmean(x, ("dp", "tp"), mesh=rm),  # composed: psum over dp, then over tp
        fm.all_gather(x, ("tp", "dp"), dim=1, mesh=rmp),  # the product group (not ascending)
        fm.all_gather(x, ("dp", "tp"), dim=0, tiled=False, mesh=rm),  # composed, innermost first
        fm.psum_scatter(x, ("dp", "tp"), dim=1, mesh=rm),  # composed, outermost first
        fm.all_to_all(x, ("tp", "dp"), 0, 1, mesh=rmp),
        fm.all_to_all(x[:2], "dp", 0, 1, tiled=False, mesh=rm),
        fm.ppermute(x, ("tp", "dp"), ring, mesh=rm),
        fm.ppermute(x, "dp", [(0, 1)], mesh=rm),
    ]
    xg = x.clone().requires_grad_(True)
    y = fm.pvary(xg, "dp", mesh=rm)  # backward: psum over dp
    y = fm.all_gather(y, "tp", dim=0, mesh=rm)  # (8, 4); backward: psum_scatter
    y = fm.psum_scatter(y, ("dp", "tp"), dim=1, mesh=rm)  # (8, 1); backward: all_gathers
    y = fm.all_to_all(y, ("tp", "dp"), 0, 1, mesh=rmp)  # (2, 4); backward: the inverse all_to_all
    y = fm.ppermute(y, ("tp", "dp"), ring, mesh=rm)  # backward: the inverse ring
    y = fm.pmean(y, "tp", mesh=rm)
    (y * X(r, tuple(y.shape))).sum().backward()
    out += [y.detach(), xg.grad]
    return [t.tolist() for t in out]


def matching_program(mode: str | None) -> dict:
    rm = fm.realize(M, timeout=GROUP_TIMEOUT, check=CHECK_S)
    rmp = fm.realize(M, timeout=GROUP_TIMEOUT, check=CHECK_S, products=[("tp", "dp")])
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()  # every rank's realize check has cleaned up its keys
    keys_before = store.num_keys()
    dist.barrier()  # nobody sets a key before every rank has counted
    with env(mode), counting_store() as counter:
        values = program(rm, rmp)
    dist.barrier()  # every rank's last check has cleaned up
    return {"values": values, "store_calls": dict(counter.calls), "new_keys": store.num_keys() - keys_before}


def test_a_matching_program_gives_the_same_results_with_the_check_on_and_off(w4):
    off = w4.run(matching_program, None)
    off_zero = w4.run(matching_program, "0")
    group = w4.run(matching_program, "1")
    mesh = w4.run(matching_program, "mesh")
    for rank in range(4):
        # off: not one store call, not one key
        assert off[rank]["store_calls"] == {} and off_zero[rank]["store_calls"] == {}, rank
        assert off[rank]["new_keys"] == 0
        # on: the same values, bit for bit, through the store ...
        for res in (off_zero, group, mesh):
            assert res[rank]["values"] == off[rank]["values"], rank
        for res in (group, mesh):
            assert res[rank]["store_calls"].get("set", 0) > 0, res[rank]["store_calls"]
            # ... and every key of every call deleted once read
            assert res[rank]["new_keys"] == 0, res[rank]
        # mesh mode checks every step on the whole mesh; group mode skips nothing here either,
        # so both make the same number of checks (two sets each: the request and "last seen")
        assert group[rank]["store_calls"]["set"] == mesh[rank]["store_calls"]["set"]


def bad_setting() -> tuple:
    rm = fm.realize(M, timeout=GROUP_TIMEOUT, check=CHECK_S)
    with env("yes"):
        return timed(fm.psum, X(rm.rank), "tp", mesh=rm)


def test_an_unknown_mode_is_an_error_that_lists_the_modes(w4):
    for kind, message, _ in w4.run(bad_setting):
        assert kind == "MeshError"
        assert re.fullmatch(rf"`psum` requires \${ENV} to be a known mode, but got {ENV}='yes'; valid: '0' \(off\), "
                            r"'1' or 'group' \(each group's members agree\), 'mesh' \(the whole mesh agrees\)",
                            message), message
