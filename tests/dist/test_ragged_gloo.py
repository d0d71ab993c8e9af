"""``fm.ragged_all_to_all`` on real gloo workers (world 4, mesh ("x", "y") = (2, 2)).

Every rank's rows are a known function of (sending rank, destination member, row number), so
each worker computes what it must receive from the test's own model of the exchange, never from
the code under test. Covered: one axis and a tuple (its product group; without it an error),
uneven and zero counts, sizes as lists, as tensors and exchanged (``recv_sizes=None``),
gradients (backward is the exchange with the sizes swapped), typing inside ``shard_map``
(typed and untyped), errors raised alike on every rank before anything is sent, and
``torch.compile`` with Python-int sizes (no graph break, eager's values and gradients).
"""

from __future__ import annotations

import torch

import functional_mesh as fm
from functional_mesh import P, _torch
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT

w4 = pool_fixture(4)

MESH = fm.make_mesh((2, 2), ("x", "y"))


def members(axis: str | tuple[str, ...], rank: int) -> list[int]:
    """The global ranks of ``rank``'s group along ``axis``, in member order (the test's own model)."""
    x, y = divmod(rank, 2)
    if axis == "y":
        return [2 * x, 2 * x + 1]
    if axis == "x":
        return [y, 2 + y]
    return [0, 1, 2, 3]  # ("x", "y"): x major


def send_sizes(rank: int, n: int, zeros: bool) -> list[int]:
    """Uneven counts; with ``zeros`` some are 0 (to a member, and everything from rank 3)."""
    if zeros and rank == 3:
        return [0] * n
    return [((rank * 3 + j * 2 + 1) % 4) if zeros else (rank + 2 * j + 1) for j in range(n)]


def rows(src: int, dst: int, count: int) -> torch.Tensor:
    """The rows rank ``src`` sends to member ``dst``: (src, dst, k) and a fourth value, float64."""
    k = torch.arange(count, dtype=torch.float64)
    return torch.stack([torch.full_like(k, src), torch.full_like(k, dst), k, k * 0.5 + src], dim=1)


def inputs(rank: int, axis, zeros: bool) -> tuple[torch.Tensor, list[int]]:
    n = len(members(axis, rank))
    sizes = send_sizes(rank, n, zeros)
    return torch.cat([rows(rank, j, c) for j, c in enumerate(sizes)]), sizes


def expected(rank: int, axis, zeros: bool) -> tuple[torch.Tensor, list[int]]:
    group = members(axis, rank)
    me = group.index(rank)
    got = [send_sizes(src, len(group), zeros)[me] for src in group]
    return torch.cat([rows(src, me, c) for src, c in zip(group, got, strict=True)]), got


def realize(products=()):
    return fm.realize(MESH, products=list(products), timeout=GROUP_TIMEOUT, check=CHECK_S)


def outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))


def exchanges() -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    rm = realize(products=[("x", "y")])
    res = {}
    for axis in ("y", "x", ("x", "y")):
        for zeros in (False, True):
            x, sizes = inputs(rank, axis, zeros)
            want, got = expected(rank, axis, zeros)
            for how in ("list", "tensor", "exchanged"):
                if how == "list":
                    out = fm.ragged_all_to_all(x, axis, sizes, got, mesh=rm)
                elif how == "tensor":
                    out = fm.ragged_all_to_all(x, axis, torch.tensor(sizes), torch.tensor(got, dtype=torch.int32),
                                               mesh=rm)
                else:
                    with rm:
                        out = fm.ragged_all_to_all(x, axis, sizes)
                res[(axis, zeros, how)] = torch.equal(out, want)
            # gradients: d(loss)/d(out) = out + 1, a function of each row: routed back, it must be x + 1
            leaf = x.clone().requires_grad_(True)
            out = fm.ragged_all_to_all(leaf, axis, sizes, mesh=rm)
            (out * out.detach() + out).sum().backward()
            res[(axis, zeros, "grad")] = torch.equal(leaf.grad, x + 1)
    # size-1 axes: no group, nothing sent; a tuple with one is the exchange over the other axis
    tall = fm.realize(fm.make_mesh((4, 1), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S)
    x = rows(rank, 0, 3)
    res["size-1"] = torch.equal(fm.ragged_all_to_all(x, "b", [3], mesh=tall), x)
    x, sizes = inputs(rank, ("x", "y"), True)
    res["tuple with size-1"] = torch.equal(fm.ragged_all_to_all(x, ("a", "b"), sizes, mesh=tall),
                                           expected(rank, ("x", "y"), True)[0])
    return res


def test_uneven_and_zero_counts_every_way_of_giving_sizes_and_gradients(w4):
    for rank, res in enumerate(w4.run(exchanges)):
        assert len(res) == 3 * 2 * 4 + 2
        assert all(res.values()), (rank, [k for k, ok in res.items() if not ok])


def in_regions() -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    rm = realize()
    res = {}
    x, sizes = inputs(rank, "y", True)
    want, got = expected(rank, "y", True)

    def body(v):
        out = fm.ragged_all_to_all(v, "y", sizes, got)
        res["type"] = fm.typeof(out).varying
        return out

    def invariant_body(v):  # an invariant operand is cast to vary over y first (like all_to_all)
        return fm.ragged_all_to_all(v, "y", sizes, got)

    # x's rows enter replicated (P()), so its local value is x itself on every rank
    typed = fm.shard_map(body, in_specs=P(), out_specs=P("y"), mesh=rm)
    res["typed"] = torch.equal(typed(x).to_local(), want)
    res["invariant out_specs"] = outcome(lambda: fm.shard_map(invariant_body, in_specs=P(), out_specs=P(),
                                                              mesh=rm)(x))
    untyped = fm.shard_map(invariant_body, in_specs=P(), out_specs=P("y"), mesh=rm, check_vma=False)
    res["untyped"] = torch.equal(untyped(x).to_local(), want)
    return res


def test_in_shard_map_the_result_varies_over_the_axis(w4):
    for res in w4.run(in_regions):
        assert res["type"] == frozenset({"y"})
        assert res["typed"] and res["untyped"]
        kind, message = res["invariant out_specs"]
        assert kind == "VmaError" and "varies over frozenset({'y'})" in message, message


BAD = {
    "length": (lambda x, rm: fm.ragged_all_to_all(x, "y", [1, 1, 1], mesh=rm), "MeshError",
               r"one size per member of \('y',\) \(2\), but got send_sizes=\(1, 1, 1\)"),
    "negative": (lambda x, rm: fm.ragged_all_to_all(x, "y", [3, -1], mesh=rm), "MeshError",
                 r"sizes >= 0, but got send_sizes=\(3, -1\)"),
    "sum": (lambda x, rm: fm.ragged_all_to_all(x, "y", [1, 0], mesh=rm), "MeshError",
            r"send_sizes summing to x.shape\[0\] \(2\), but got send_sizes=\(1, 0\)"),
    "recv length": (lambda x, rm: fm.ragged_all_to_all(x, "y", [1, 1], [2], mesh=rm), "MeshError",
                    r"one size per member of \('y',\) \(2\), but got recv_sizes=\(2,\)"),
    "float tensor": (lambda x, rm: fm.ragged_all_to_all(x, "y", torch.tensor([1.0, 1.0]), mesh=rm), "TypeError",
                     r"a 1-D integer tensor or a sequence of ints for send_sizes"),
    "not a sequence": (lambda x, rm: fm.ragged_all_to_all(x, "y", 2, mesh=rm), "TypeError",
                       r"a 1-D integer tensor or a sequence of ints for send_sizes, but got send_sizes=2"),
    "0-d": (lambda x, rm: fm.ragged_all_to_all(x[0, 0], "y", [0, 0], mesh=rm), "MeshError",
            r"a tensor with at least one dim"),
    "tuple without product": (lambda x, rm: fm.ragged_all_to_all(x, ("x", "y"), [1, 1, 0, 0], mesh=rm), "MeshError",
                              r"one axis, or a tuple whose product group was realized.*pass products=\[\('x', 'y'\)\]"),
    "unknown axis": (lambda x, rm: fm.ragged_all_to_all(x, "z", [1, 1], mesh=rm), "UnknownAxisError",
                     r"`ragged_all_to_all` requires an axis name of the mesh"),
}


def bad_calls() -> dict:
    rm = realize()
    x = torch.ones(2, 3)
    res = {name: outcome(lambda call=call: call(x, rm)) for name, (call, _, _) in BAD.items()}
    # nothing was sent: the group still works, in step on every rank
    res["after"] = fm.psum(torch.ones(1), "y", mesh=rm).item()
    return res


def test_bad_sizes_raise_the_same_error_on_every_rank_before_anything_is_sent(w4):
    import re

    outs = w4.run(bad_calls)
    for res in outs:
        for name, (_, kind, pattern) in BAD.items():
            got_kind, message = res[name]
            assert got_kind == kind and re.search(pattern, message), (name, got_kind, message)
            assert "ragged_all_to_all" in message, (name, message)
        assert res["after"] == 2.0
    assert all(res == outs[0] for res in outs[1:]), "every rank raises the same errors"


def compiled() -> dict:
    import torch._dynamo as dynamo
    import torch.distributed as dist

    rank = dist.get_rank()
    rm = realize()
    x, sizes = inputs(rank, "y", True)
    want, got = expected(rank, "y", True)

    def fn(v):
        return fm.ragged_all_to_all(v * 2, "y", sizes, got, mesh=rm) + 1

    dynamo.reset()
    breaks = dynamo.explain(fn)(x).graph_break_count
    leaf = x.clone().requires_grad_(True)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(leaf)
    (out * out.detach()).sum().backward()
    eager_leaf = x.clone().requires_grad_(True)
    eager = fn(eager_leaf)
    (eager * eager.detach()).sum().backward()
    res = {"breaks": breaks, "values": torch.equal(out, want * 2 + 1), "grad": torch.equal(leaf.grad, eager_leaf.grad),
           "exchanged": outcome(lambda: torch.compile(lambda v: fm.ragged_all_to_all(v, "y", sizes, mesh=rm),
                                                      backend="eager", fullgraph=True)(x))}
    dynamo.reset()
    res["tensor sizes"] = outcome(lambda: torch.compile(
        lambda v: fm.ragged_all_to_all(v, "y", torch.tensor(sizes), torch.tensor(got), mesh=rm),
        backend="eager", fullgraph=True)(x))
    dynamo.reset()  # an untyped region with a graph break: the eager code between graphs still finds the region
    res["untyped region, graph break"] = outcome(lambda: torch.compile(fm.shard_map(
        lambda v: fm.ragged_all_to_all(v, "y", sizes), in_specs=P(), out_specs=P("y"), mesh=rm, check_vma=False),
        backend="eager")(x))
    res["regions"] = _torch.region_trace_failure()  # None where this torch's dynamo traces a region
    return res


def test_compiles_whole_with_python_int_sizes(w4):
    for res in w4.run(compiled, timeout=600):
        assert res["breaks"] == 0 and res["values"] and res["grad"], res
        kind, message = res["exchanged"]  # counts exchanged at run time: data-dependent shapes, refused clearly
        assert kind != "ok" and "recv_sizes under torch.compile" in message, message
        kind, message = res["tensor sizes"]
        assert kind != "ok" and "sizes as Python ints under torch.compile" in message, message
        kind, message = res["untyped region, graph break"]
        if res["regions"] is not None:  # torch 2.11/2.12: shard_map refuses the compiled region at its entry
            assert kind == "MeshError" and res["regions"] in message, message
        else:
            assert kind == "MeshError" and "recv_sizes under torch.compile" in message, message
