"""Collectives issued now and waited for later (``async_op=True``) and ``op_dtype=``, on real gloo workers.

- Values and gradients against one process: the spec of tests/dist/test_collectives_gloo.py (every
  collective over one axis and over tuples, with and without product groups, world 8), run with
  every collective issued with ``async_op=True`` and its ``wait()`` taken.
- Several calls in flight at once, waited for in reverse order with computation between: the
  blocking calls' values and gradients, bit for bit.
- Types in a typed region: ``fm.typeof(pending.wait())`` is the blocking call's; a type error is
  raised when the call is issued.
- Not blocking: a member issues and returns while its peers have not issued yet (asserted with
  ``is_completed()`` before the peers are let go through the store: no timing).
- Compiled (``fullgraph=True``, aot_eager): 0 graph breaks, the functional collective before the
  computation that overlaps it and its ``wait_tensor`` after, eager's values and gradients.
- A result never waited for: a ``MeshError`` at the region's exit on every rank; outside a region
  the dropped call still completes and the next call works.
- ``op_dtype=torch.float32`` with bfloat16 values that bfloat16 accumulation gets wrong: the
  float32 sum rounded once, forward and backward.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import needs_compiled_regions
from tests.dist import test_collectives_gloo as spec
from tests.dist._pool import pool_fixture
from tests.dist._settings import CHECK_S, GROUP_TIMEOUT, MESHES

w4 = pool_fixture(4)
w8 = pool_fixture(8)

ASYNC = ("psum", "pmean", "pmax", "pmin", "pvary", "pcast", "all_gather", "psum_scatter", "all_to_all",
         "ragged_all_to_all", "ppermute")


def realize(products: bool):
    return fm.realize(fm.make_mesh((2, 2), ("a", "b")), timeout=GROUP_TIMEOUT, check=CHECK_S,
                      products=[("a", "b")] if products else ())


def X(rank: int, shape=(4, 4)) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).reshape(shape) * 3 + 100 * (rank + 1)


def G(rank: int, shape) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).reshape(shape) % 7 + 10 * (rank + 1)


# -- values and gradients against one process: the collectives' own spec, every call issued async -----


class _Issued:
    """``functional_mesh`` as the spec's checks call it, with every collective issued with ``async_op=True``
    and its result taken from ``wait()``."""

    def __getattr__(self, name: str):
        value = getattr(fm, name)
        if name not in ASYNC:
            return value

        def issued(*args, **kwargs):
            pending = value(*args, async_op=True, **kwargs)
            if not isinstance(pending, fm.Pending):
                raise AssertionError(f"{name}(async_op=True) returned {type(pending)}")
            return pending.wait()

        return issued


def spec_issued(check: str, mesh_name: str, products: bool) -> list[str]:
    saved = spec.fm
    spec.fm = _Issued()
    try:
        return getattr(spec, check)(MESHES[mesh_name], products)
    finally:
        spec.fm = saved


@pytest.mark.timeout(300)
@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
@pytest.mark.parametrize("check", ["forward_values", "gradients"])
def test_async_values_and_gradients_follow_the_one_process_spec(w8, check, products):
    results = w8.run(spec_issued, check, "permuted", products, timeout=240)
    assert results == [[]] * 8, "\n".join(f"rank {r}: {m}" for r, ms in enumerate(results) for m in ms[:10])


# -- many in flight: the blocking calls' values and gradients -------------------------------------------------


def _calls(rm) -> dict:
    r, n = rm.rank, 4
    ring = [(k, (k + 1) % n) for k in range(n)]
    sizes = [(r + j) % 3 for j in range(2)]
    return {
        "psum ab": lambda x, k: fm.psum(x, ("a", "b"), mesh=rm, **k),
        "pmean a": lambda x, k: fm.pmean(x, "a", mesh=rm, **k),
        "pmax ab": lambda x, k: fm.pmax(x % 5, ("a", "b"), mesh=rm, **k),
        "pmin b": lambda x, k: fm.pmin(x, "b", mesh=rm, **k),
        "pvary b": lambda x, k: fm.pvary(x, "b", mesh=rm, **k),
        "pcast ab": lambda x, k: fm.pcast(x, ("a", "b"), to="varying", mesh=rm, **k),
        "all_gather b dim 1": lambda x, k: fm.all_gather(x, "b", dim=1, mesh=rm, **k),
        "all_gather ab invariant": lambda x, k: fm.all_gather(x, ("a", "b"), to="invariant", mesh=rm, **k),
        "psum_scatter ab": lambda x, k: fm.psum_scatter(x, ("a", "b"), mesh=rm, **k),
        "psum_scatter a untiled dim 1": lambda x, k: fm.psum_scatter(x[:, :2], "a", dim=1, tiled=False, mesh=rm, **k),
        "all_to_all ab": lambda x, k: fm.all_to_all(x, ("a", "b"), 0, 1, mesh=rm, **k),
        "all_to_all b untiled": lambda x, k: fm.all_to_all(x[:2], "b", 0, 1, tiled=False, mesh=rm, **k),
        "ragged b": lambda x, k: fm.ragged_all_to_all(x[:sum(sizes)], "b", sizes, mesh=rm, **k),
        "ppermute ab ring": lambda x, k: fm.ppermute(x, ("a", "b"), ring, mesh=rm, **k),
        "ppermute a one pair": lambda x, k: fm.ppermute(x, "a", [(0, 1)], mesh=rm, **k),
    }


def many_in_flight(products: bool) -> dict:
    rm = realize(products)
    r = rm.rank
    calls = _calls(rm)
    out = {}
    for label, kwargs in (("blocking", {}), ("async", {"async_op": True})):
        x = X(r).requires_grad_(True)
        results = [call(x, dict(kwargs)) for call in calls.values()]
        busy = torch.randn(64, 64, generator=torch.Generator().manual_seed(r))
        for _ in range(20):  # computation while every call is in flight
            busy = torch.tanh(busy @ busy)
        if label == "async":
            assert all(isinstance(p, fm.Pending) for p in results)
            results = [p.wait() for p in reversed(results)][::-1]  # waited for in the other order
        total = sum((y * G(r, tuple(y.shape))).sum() for y in results)
        total.backward()
        out[label] = ([y.detach() for y in results], x.grad)
    bad = []
    for i, name in enumerate(calls):
        if not torch.equal(out["async"][0][i], out["blocking"][0][i]):
            bad.append(f"{name}: value differs")
    if not torch.equal(out["async"][1], out["blocking"][1]):
        bad.append("gradient differs")
    return {"bad": bad, "n": len(calls)}


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_many_calls_in_flight_give_the_blocking_values_and_gradients(w4, products):
    for rank, res in enumerate(w4.run(many_in_flight, products, timeout=120)):
        assert res == {"bad": [], "n": 15}, (rank, res)


# -- types in a typed region: decided at issue ------------------------------------------------------------


def typed_region(products: bool) -> dict:
    rm = realize(products)
    seen: dict = {}

    def body(v, w):  # v varies over a and b, w is invariant
        cases = {
            "psum v a": lambda k: fm.psum(v, "a", **k),
            "psum w a": lambda k: fm.psum(w, "a", **k),  # invariant: cast first, n * w
            "pmean v ab": lambda k: fm.pmean(v, ("a", "b"), **k),
            "pmax v b": lambda k: fm.pmax(v, "b", **k),
            "pmin w ab": lambda k: fm.pmin(w, ("a", "b"), **k),
            "pvary w a": lambda k: fm.pvary(w, "a", **k),
            "pcast w ab": lambda k: fm.pcast(w, ("a", "b"), to="varying", **k),
            "all_gather v b": lambda k: fm.all_gather(v, "b", **k),
            "all_gather v a invariant": lambda k: fm.all_gather(v, "a", to="invariant", **k),
            "all_gather w ab": lambda k: fm.all_gather(w, ("a", "b"), dim=1, **k),
            "psum_scatter v a": lambda k: fm.psum_scatter(v, "a", **k),
            "all_to_all w b": lambda k: fm.all_to_all(w, "b", 0, 1, **k),
            "ppermute v ab": lambda k: fm.ppermute(v, ("a", "b"), [(0, 3), (3, 0)], **k),
            "ragged v b": lambda k: fm.ragged_all_to_all(v, "b", [1, 1], [1, 1], **k),
        }
        for name, call in cases.items():
            blocking = call({})
            pending = call({"async_op": True})
            value = pending.wait()
            seen[name] = (repr(fm.typeof(blocking)), repr(fm.typeof(value)), torch.equal(blocking, value))
        u = fm.psum(v, "b")  # varies over a only
        for name, call in {"psum u ab": lambda: fm.psum(u, ("a", "b"), async_op=True),
                           "pvary v a": lambda: fm.pvary(v, "a", async_op=True)}.items():
            try:
                call()
                seen[name] = "no error"
            except fm.VmaError as e:  # raised when issued: nothing was started
                seen[name] = str(e)
        return v

    x = X(0, (4, 4))
    y = fm.shard_map(body, mesh=rm, in_specs=(P("a", "b"), P()), out_specs=P("a", "b"))(x, X(1, (2, 2)))
    seen["after"] = torch.equal(y.full_tensor(), x)
    return seen


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_a_pending_result_has_the_blocking_type_and_type_errors_come_at_issue(w4, products):
    for rank, seen in enumerate(w4.run(typed_region, products)):
        assert seen.pop("after") is True
        errors = {k: seen.pop(k) for k in ("psum u ab", "pvary v a")}
        assert "varies over ['a'] and not over ['b']" in errors["psum u ab"], errors
        assert "already varies over ['a']" in errors["pvary v a"], errors
        for name, (blocking, waited, equal) in seen.items():
            assert blocking == waited and equal, (rank, name, blocking, waited, equal)
        assert seen["psum v a"][0] == "AxisTypes(varying=frozenset({'b'}))"
        assert seen["all_gather v a invariant"][0] == "AxisTypes(varying=frozenset({'b'}))"
        assert seen["all_to_all w b"][0] == "AxisTypes(varying=frozenset({'b'}))"
        assert len(seen) == 14


def untyped_region(products: bool) -> dict:
    """check_vma=False (JAX's untyped conventions: psum's and pmax's cotangents summed first): values and
    gradients of every collective in the region, issued and waited for, equal the blocking ones."""
    rm = realize(products)
    r = rm.rank
    out = {}
    for label, kwargs in (("blocking", {}), ("async", {"async_op": True})):
        def body(v, kwargs=kwargs):
            def done(y):
                return y.wait() if isinstance(y, fm.Pending) else y

            ys = [done(fm.psum(v, ("a", "b"), **kwargs)), done(fm.pmean(v, "a", **kwargs)),
                  done(fm.pmax(v, "b", **kwargs)), done(fm.pvary(v, "a", **kwargs)),
                  done(fm.all_gather(v, ("a", "b"), **kwargs)).sum(0, keepdim=True),
                  done(fm.psum_scatter(v, "b", **kwargs)).repeat(2, 1),
                  done(fm.all_to_all(v, "a", 0, 1, **kwargs))[:, :4],
                  done(fm.ppermute(v, ("a", "b"), [(0, 2), (2, 0), (1, 3), (3, 1)], **kwargs))]
            return sum(y[:1] * (i + 1) for i, y in enumerate(ys))

        x = X(0, (4, 4)).requires_grad_(True)
        y = fm.shard_map(body, mesh=rm, in_specs=P("a"), out_specs=P(), check_vma=False)(x)
        (y.to_local() * G(r, tuple(y.to_local().shape))).sum().backward()
        out[label] = (y.to_local().detach(), x.grad)
    return {"values": torch.equal(out["async"][0], out["blocking"][0]),
            "gradients": torch.equal(out["async"][1], out["blocking"][1])}


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_an_untyped_region_gives_the_blocking_values_and_gradients(w4, products):
    for rank, res in enumerate(w4.run(untyped_region, products)):
        assert res == {"values": True, "gradients": True}, (rank, res)


# -- not blocking: the issuer returns before its peers have issued ---------------------------------------


def not_blocking(products: bool) -> dict:
    """Rank 0 issues each call and asks whether it completed before letting the others go (through
    the default store); they issue theirs only then. A blocking call would never return on rank 0."""
    rm = realize(products)
    r = rm.rank
    store = dist.distributed_c10d._get_default_store()
    ring = [(k, (k + 1) % 4) for k in range(4)]
    calls = {
        "psum ab": lambda x, k: fm.psum(x, ("a", "b"), mesh=rm, **k),
        "pmax a": lambda x, k: fm.pmax(x, "a", mesh=rm, **k),
        "all_gather ab": lambda x, k: fm.all_gather(x, ("a", "b"), mesh=rm, **k),
        "psum_scatter ab": lambda x, k: fm.psum_scatter(x, ("a", "b"), mesh=rm, **k),
        "all_to_all b": lambda x, k: fm.all_to_all(x, "b", 0, 1, mesh=rm, **k),
        "ppermute ab ring": lambda x, k: fm.ppermute(x, ("a", "b"), ring, mesh=rm, **k),
        "ragged a": lambda x, k: fm.ragged_all_to_all(x[:2], "a", [1, 1], [1, 1], mesh=rm, **k),
    }
    out = {}
    for name, call in calls.items():
        key = f"fm-test-async/{products}/{name}"
        x = X(r)
        if r == 0:
            pending = call(x, {"async_op": True})
            out[name] = pending.is_completed()  # the peers have not issued: it cannot have
            store.set(key, "go")
            got = pending.wait()
            out[name + " completed after wait"] = pending.is_completed()
        else:
            store.wait([key], datetime.timedelta(seconds=GROUP_TIMEOUT))
            got = call(x, {})
        out[name + " value"] = got
    return out


@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_issuing_returns_before_the_peers_have_issued(w4, products):
    results = w4.run(not_blocking, products, timeout=120)
    first = results[0]
    for name in ("psum ab", "pmax a", "all_gather ab", "psum_scatter ab", "all_to_all b", "ppermute ab ring",
                 "ragged a"):
        assert first[name] is False, name
        assert first[name + " completed after wait"] is True, name
    # the values: rank 0's waited result is what the blocking call gives there
    total = sum(X(m) for m in range(4))
    assert torch.equal(first["psum ab value"], total)
    assert torch.equal(first["pmax a value"], torch.maximum(X(0), X(2)))
    assert torch.equal(first["all_gather ab value"], torch.cat([X(m) for m in range(4)]))
    assert torch.equal(first["psum_scatter ab value"], total[:1])
    assert torch.equal(first["all_to_all b value"], torch.cat([X(0)[:2], X(1)[:2]], 1))
    assert torch.equal(first["ppermute ab ring value"], X(3))
    assert torch.equal(first["ragged a value"], torch.cat([X(0)[:1], X(2)[:1, :]]))


# -- a result never waited for --------------------------------------------------------------------------------


def unwaited(check_vma: bool) -> dict:
    rm = realize(False)
    out = {}

    def body(v):
        fm.psum(v, ("a", "b"), async_op=True)  # never waited for (v varies over both)
        fm.all_gather(v, "b", async_op=True).wait()  # waited for: not named
        return v

    try:
        fm.shard_map(body, mesh=rm, in_specs=P(("a", "b")), out_specs=P(("a", "b")), check_vma=check_vma)(X(0))
        out["region"] = "no error"
    except fm.MeshError as e:
        out["region"] = str(e)
    # outside a region: dropped without wait(); it completes, and the next call is in step
    dropped = fm.psum(X(rm.rank), "a", mesh=rm, async_op=True)
    del dropped
    out["next"] = fm.psum(torch.ones(2), ("a", "b"), mesh=rm)
    return out


@pytest.mark.parametrize("check_vma", [True, False], ids=["typed", "untyped"])
def test_a_result_never_waited_for_is_an_error_at_the_region_exit(w4, check_vma):
    for rank, res in enumerate(w4.run(unwaited, check_vma)):
        message = res["region"]
        assert message.startswith("`shard_map` requires every collective issued in the region with async_op=True "
                                  "to be waited for"), (rank, message)
        assert "but 1 was never waited for: psum over ('a', 'b'); call .wait()" in message, (rank, message)
        assert torch.equal(res["next"], torch.full((2,), 4.0))


# -- compiled: the functional collective at issue, its wait_tensor at wait() ------------------------------------


def _overlapped(x, rm):
    p = fm.psum(x, "a", mesh=rm, async_op=True)
    busy = torch.sin(x) * 2  # overlaps the all-reduce
    q = fm.all_gather(busy, ("a", "b"), dim=1, mesh=rm, async_op=True)
    return p.wait() + busy, q.wait()


def _region(x, rm):
    def body(v):
        p = fm.psum_scatter(v, "b", async_op=True)
        busy = torch.cos(v)
        return p.wait() + busy[: v.shape[0] // 2]

    return fm.shard_map(body, mesh=rm, in_specs=P("a"), out_specs=P("a", "b"))(x)


def compiled(products: bool) -> dict:
    import torch._dynamo as dynamo

    rm = realize(products)
    r = rm.rank
    out = {}
    for name, fn in (("overlapped", _overlapped), ("typed region", _region)):
        def run(f):
            x = X(r).requires_grad_(True)
            ys = f(x, rm)
            ys = ys if isinstance(ys, tuple) else (ys,)
            ys = [y.to_local() if hasattr(y, "to_local") else y for y in ys]
            sum((y * G(r, tuple(y.shape))).sum() for y in ys).backward()
            return [y.detach() for y in ys], x.grad

        want = run(fn)
        dynamo.reset()
        breaks = dynamo.explain(fn)(X(r), rm).graph_break_count
        dynamo.reset()
        order: list[str] = []

        def backend(gm, example_inputs):  # the ops of dynamo's graph, in order
            order.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return gm.forward

        torch.compile(fn, fullgraph=True, backend=backend)(X(r), rm)  # no gradient: the ops are inlined
        dynamo.reset()
        got = run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
        values = all(torch.equal(a, b) for a, b in zip(got[0], want[0], strict=True))
        out[name] = (breaks, values, torch.allclose(got[1], want[1], rtol=0, atol=1e-12), order)
    return out


def _position(order: list[str], needle: str) -> int:
    return next(i for i, op in enumerate(order) if needle in op)


@needs_compiled_regions()  # its program is a compiled region: not where this torch's dynamo cannot trace one
@pytest.mark.timeout(600)
@pytest.mark.parametrize("products", [True, False], ids=["products", "composed"])
def test_compiled_async_traces_whole_and_waits_where_wait_is_called(w4, products):
    for rank, res in enumerate(w4.run(compiled, products, timeout=500)):
        for name, (breaks, values, grads, order) in res.items():
            assert (breaks, values, grads) == (0, True, True), (rank, name, order)
        order = res["overlapped"][3]
        start, busy, wait = (_position(order, s) for s in ("all_reduce", "sin", "wait_tensor"))
        assert start < busy < wait, order  # the all-reduce issued before the computation, waited for after it
        order = res["typed region"][3]
        start, busy, wait = (_position(order, s) for s in ("reduce_scatter_tensor", "cos", "wait_tensor"))
        assert start < busy < wait, order


# -- op_dtype: reduced in float32, rounded once ----------------------------------------------------------------

# Rank r holds 1 + r * 2^-8 ... : chosen so that bfloat16 accumulation loses what float32 keeps.
_EPS = 2.0 ** -8


def _bf16_values(rank: int) -> torch.Tensor:
    base = torch.tensor([1.0, 1.0, 3.0, -1.0]) if rank == 0 else torch.tensor([_EPS, 3 * _EPS, -_EPS, _EPS * 0.5])
    return base.to(torch.bfloat16)


def op_dtype_exact() -> dict:
    rm = realize(True)
    r = rm.rank
    out = {}
    x = _bf16_values(r).requires_grad_(True)
    for label, kwargs in (("blocking", {}), ("async", {"async_op": True})):
        def done(y):
            return y.wait() if isinstance(y, fm.Pending) else y

        s = done(fm.psum(x, ("a", "b"), mesh=rm, op_dtype=torch.float32, **kwargs))
        m = done(fm.pmean(x, ("a", "b"), mesh=rm, op_dtype=torch.float32, **kwargs))
        sc = done(fm.psum_scatter(x, ("a", "b"), mesh=rm, op_dtype=torch.float32, **kwargs))
        g = done(fm.all_gather(x, ("a", "b"), mesh=rm, op_dtype=torch.float32, **kwargs))
        x.grad = None
        cot = torch.tensor([1.0, _EPS, 2 * _EPS, 3 * _EPS] * 4, dtype=torch.bfloat16) * (1 if r == 0 else _EPS)
        (g * cot).sum().backward()  # all_gather's backward: psum_scatter of the cotangents, in float32
        out[label] = {"psum": s.detach(), "pmean": m.detach(), "psum_scatter": sc.detach(), "all_gather": g.detach(),
                      "gather grad": x.grad,
                      "dtypes": [t.dtype for t in (s, m, sc, g, x.grad)]}
    return out


def test_op_dtype_float32_gives_the_float32_sum_rounded_once(w4):
    values = [_bf16_values(m).float() for m in range(4)]
    total = sum(values)
    want = {"psum": total.to(torch.bfloat16), "pmean": (total / 4).to(torch.bfloat16)}
    # the values discriminate: accumulating in bfloat16, member after member, gives another sum
    acc = values[0].to(torch.bfloat16)
    for v in values[1:]:
        acc = acc + v.to(torch.bfloat16)
    assert not torch.equal(acc, want["psum"])
    cots = [torch.tensor([1.0, _EPS, 2 * _EPS, 3 * _EPS] * 4, dtype=torch.bfloat16) * (1 if m == 0 else _EPS)
            for m in range(4)]
    grad_total = sum(c.float() for c in cots)  # member m's gradient: block m of the summed cotangents
    for rank, res in enumerate(w4.run(op_dtype_exact)):
        for label in ("blocking", "async"):
            got = res[label]
            assert got["dtypes"] == [torch.bfloat16] * 5, (rank, label, got["dtypes"])
            assert torch.equal(got["psum"], want["psum"]), (rank, label, got["psum"], want["psum"])
            assert torch.equal(got["pmean"], want["pmean"]), (rank, label, got["pmean"])
            assert torch.equal(got["psum_scatter"], want["psum"][rank:rank + 1]), (rank, label)
            assert torch.equal(got["all_gather"], torch.cat([_bf16_values(m) for m in range(4)])), (rank, label)
            assert torch.equal(got["gather grad"], grad_total[4 * rank:4 * rank + 4].to(torch.bfloat16)), (
                rank, label, got["gather grad"])
