"""``async_op=True`` and ``op_dtype=`` under the fake backend (one process, rank 5 of 8): the pending
result's API, the argument errors, types in a typed region, the unwaited-result error, and tracing
(0 graph breaks). Fake collectives carry no data: values, gradients, not blocking and op_dtype's
rounding are checked on gloo (tests/dist/test_async_gloo.py).
"""

from __future__ import annotations

import gc
import inspect
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm
from functional_mesh import P
from tests._torch_features import skip_unless_compiled_regions

MESH = fm.make_mesh((2, 4), ("dp", "tp"))
ISSUABLE = ["psum", "pmean", "pmax", "pmin", "pvary", "pcast", "all_gather", "psum_scatter", "all_to_all",
            "ragged_all_to_all", "ppermute"]
OP_DTYPE = ["psum", "pmean", "psum_scatter", "all_gather"]


@pytest.fixture
def rm():
    dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    try:
        yield fm.realize(MESH)
    finally:
        torch._dynamo.reset()
        fm.clear_cache()
        dist.destroy_process_group()


def calls(rm) -> dict:
    """One call of each collective that communicates, ``**k`` its extra keywords."""
    return {
        "psum": lambda x, **k: fm.psum(x, "tp", mesh=rm, **k),
        "pmean": lambda x, **k: fm.pmean(x, ("dp", "tp"), mesh=rm, **k),
        "pmax": lambda x, **k: fm.pmax(x, "dp", mesh=rm, **k),
        "pmin": lambda x, **k: fm.pmin(x, ("dp", "tp"), mesh=rm, **k),
        "pvary": lambda x, **k: fm.pvary(x, "tp", mesh=rm, **k),
        "pcast": lambda x, **k: fm.pcast(x, "tp", to="varying", mesh=rm, **k),
        "all_gather": lambda x, **k: fm.all_gather(x, ("dp", "tp"), dim=1, mesh=rm, **k),
        "psum_scatter": lambda x, **k: fm.psum_scatter(x, "tp", mesh=rm, **k),
        "all_to_all": lambda x, **k: fm.all_to_all(x, "tp", 0, 1, mesh=rm, **k),
        "ragged_all_to_all": lambda x, **k: fm.ragged_all_to_all(x, "tp", [1, 1, 1, 1], [1, 1, 1, 1], mesh=rm, **k),
        "ppermute": lambda x, **k: fm.ppermute(x, "tp", [(0, 1), (1, 0)], mesh=rm, **k),
    }


def test_every_collective_that_communicates_takes_async_op_and_four_take_op_dtype():
    for name in ISSUABLE:
        parameters = inspect.signature(getattr(fm, name)).parameters
        assert parameters["async_op"].default is False, name
        assert ("op_dtype" in parameters) == (name in OP_DTYPE), name
        assert "async_op" in inspect.getdoc(getattr(fm, name)).split("Returns:")[0], name  # in Args
    for name in ("axis_index", "axis_size"):  # no communication: nothing to wait for
        assert "async_op" not in inspect.signature(getattr(fm, name)).parameters


@pytest.mark.parametrize("name", ISSUABLE)
def test_a_pending_result_waits_once_and_gives_the_blocking_shape_dtype_and_graph(rm, name):
    call = calls(rm)[name]
    x = torch.ones(4, 4, requires_grad=True)
    blocking = call(x)
    pending = call(x, async_op=True)
    assert isinstance(pending, fm.Pending) and not pending.waited
    assert repr(pending).startswith(f"Pending({name} over ") and repr(pending).endswith("not waited for)")
    y = pending.wait()
    assert y is pending.wait() and pending.waited and pending.is_completed()
    assert (y.shape, y.dtype, y.requires_grad) == (blocking.shape, blocking.dtype, True)
    assert repr(pending).endswith(", waited for)")
    y.sum().backward()  # the backward runs (blocking), as the blocking call's
    assert x.grad is not None and x.grad.shape == x.shape


def test_argument_errors(rm):
    x = torch.ones(8, 2)
    with pytest.raises(TypeError, match=r"`psum` requires async_op=True or False, but got async_op=1"):
        fm.psum(x, "tp", mesh=rm, async_op=1)
    with pytest.raises(TypeError, match=r"async_op"):
        fm.axis_index("tp", mesh=rm, async_op=True)
    with pytest.raises(TypeError, match=r"op_dtype"):
        fm.pmax(x, "tp", mesh=rm, op_dtype=torch.float32)
    floats = "valid: None, torch.float16, torch.bfloat16, torch.float32, torch.float64"
    for name in OP_DTYPE:
        for bad in ("float32", torch.int32, torch.complex64, torch.bool, 32):
            with pytest.raises(fm.MeshError) as info:
                calls(rm)[name](x, op_dtype=bad)
            message = str(info.value)
            assert message.startswith(f"`{name}` requires op_dtype=None or a floating-point torch.dtype for x of "
                                      "dtype torch.float32"), message
            assert f"but got op_dtype={bad!r}; {floats}" in message, message
    with pytest.raises(fm.MeshError, match=r"an integer torch.dtype for x of dtype torch.int64 .* but got "
                                           r"op_dtype=torch.float32; valid: None, torch.uint8, torch.int8"):
        fm.psum(torch.ones(2, dtype=torch.int64), "tp", mesh=rm, op_dtype=torch.float32)
    with pytest.raises(fm.MeshError, match=r"a complex torch.dtype .* valid: None, torch.complex64, torch.complex128"):
        fm.psum(torch.ones(2, dtype=torch.complex64), "tp", mesh=rm, op_dtype=torch.float64)
    # an error in the arguments comes when the call is issued, with async_op=True too
    with pytest.raises(fm.MeshError, match=r"dim 0 divisible by 4"):
        fm.psum_scatter(torch.ones(6), "tp", mesh=rm, async_op=True)
    with pytest.raises(fm.MeshError, match=r"send_sizes summing to x.shape\[0\]"):
        fm.ragged_all_to_all(torch.ones(3, 2), "tp", [1, 1, 1, 1], mesh=rm, async_op=True)


def test_op_dtype_communicates_in_that_dtype_and_casts_back_once(rm):
    seen: list[torch.dtype] = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):  # the dtype each c10d call sends
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                seen.append(args[0][0].dtype if isinstance(args[0], list) else args[0].dtype)
            return func(*args, **(kwargs or {}))

    x = torch.ones(8, 2, dtype=torch.bfloat16, requires_grad=True)
    with Record():
        ys = [calls(rm)[name](x, op_dtype=torch.float32) for name in OP_DTYPE]
        sent = list(seen)
        seen.clear()
        sum(y.float().sum() for y in ys).backward()
    assert [y.dtype for y in ys] == [torch.bfloat16] * 4 and x.grad.dtype == torch.bfloat16
    assert sent and set(sent) == {torch.float32}, sent  # forward: float32 on the wire
    assert seen and set(seen) == {torch.float32}, seen  # backward too (pmean's, all_gather's reduce-scatter...)
    seen.clear()
    with Record():
        fm.psum(x, "tp", mesh=rm, op_dtype=torch.bfloat16)  # x's own dtype: nothing to cast
    assert seen == [torch.bfloat16]


def test_types_are_decided_at_issue_in_a_typed_region(rm):
    seen = {}

    def body(v, w):
        for name, (blocking, issued) in {
            "psum v": (lambda: fm.psum(v, "tp"), lambda: fm.psum(v, "tp", async_op=True)),
            "psum w": (lambda: fm.psum(w, "tp"), lambda: fm.psum(w, "tp", async_op=True)),
            "all_gather invariant": (lambda: fm.all_gather(v, "tp", to="invariant"),
                                     lambda: fm.all_gather(v, "tp", to="invariant", async_op=True)),
            "ppermute w": (lambda: fm.ppermute(w, "dp", [(0, 1)]), lambda: fm.ppermute(w, "dp", [(0, 1)],
                                                                                        async_op=True)),
            "pvary w": (lambda: fm.pvary(w, "dp"), lambda: fm.pvary(w, "dp", async_op=True)),
        }.items():
            pending = issued()
            seen[name] = (fm.typeof(blocking()), fm.typeof(pending.wait()))
        with pytest.raises(fm.VmaError, match=r"varies over \['tp'\] and not over \['dp'\]"):
            fm.psum(v, ("dp", "tp"), async_op=True)  # raised by the call: nothing is started
        with pytest.raises(fm.VmaError, match=r"already varies over \['tp'\]"):
            fm.pvary(v, "tp", async_op=True)
        return v

    fm.shard_map(body, mesh=rm, in_specs=(P("tp"), P()), out_specs=P("tp"))(torch.ones(8), torch.ones(2))
    tp, both, none = (fm.AxisTypes(varying=frozenset(s)) for s in ({"tp"}, {"dp", "tp"}, ()))
    assert seen == {"psum v": (none, none), "psum w": (none, none), "all_gather invariant": (none, none),
                    "ppermute w": (fm.AxisTypes(varying=frozenset({"dp"})),) * 2, "pvary w": (fm.AxisTypes(
                        varying=frozenset({"dp"})),) * 2}
    assert tp != both


@pytest.mark.parametrize("check_vma", [True, False], ids=["typed", "untyped"])
def test_a_result_never_waited_for_is_an_error_at_the_region_exit(rm, check_vma):
    def body(v):
        fm.psum(v, "tp", async_op=True)
        fm.all_gather(v, ("dp", "tp"), async_op=True)
        fm.pmax(v, "tp", async_op=True).wait()  # waited for: not named
        return v

    with pytest.raises(fm.MeshError) as info:
        fm.shard_map(body, mesh=rm, in_specs=P("tp"), out_specs=P("tp"), check_vma=check_vma)(torch.ones(8))
    assert str(info.value) == (
        "`shard_map` requires every collective issued in the region with async_op=True to be waited for before the "
        "region's function returns (its communication would outlive the region, and a member waiting for it would "
        "hang), but 2 were never waited for: psum over 'tp', all_gather over ('dp', 'tp'); call .wait() on each "
        "pending result and use the tensor it returns")
    # the region is closed: the next one runs
    out = fm.shard_map(lambda v: fm.psum(v, "tp", async_op=True).wait(), mesh=rm, in_specs=P("tp"), out_specs=P(),
                       check_vma=check_vma)(torch.ones(8))
    assert out.shape == (2,)


def test_outside_a_region_a_dropped_result_is_not_checked(rm):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pending = fm.psum(torch.ones(2), "tp", mesh=rm, async_op=True)
        del pending
        gc.collect()
    assert fm.psum(torch.ones(2), "tp", mesh=rm).shape == (2,)


def _issued_and_waited(x, rm):
    p = fm.psum(x, "tp", mesh=rm, async_op=True)
    q = fm.all_gather(x, ("dp", "tp"), dim=1, mesh=rm, async_op=True)
    r = fm.ppermute(x, "tp", [(0, 1), (1, 0)], mesh=rm, async_op=True)
    s = fm.pmax(x, "dp", mesh=rm, async_op=True)
    t = fm.psum_scatter(x, "tp", mesh=rm, op_dtype=torch.float64, async_op=True)
    busy = torch.sin(x)
    return p.wait() + busy + r.wait() + s.wait(), q.wait(), t.wait()


def test_traced_whole_on_the_fake_backend(rm):
    x = torch.ones(8, 4)
    explained = torch._dynamo.explain(_issued_and_waited)(x, rm)
    assert explained.graph_break_count == 0, explained.break_reasons
    got = torch.compile(_issued_and_waited, fullgraph=True, backend="aot_eager")(x.requires_grad_(), rm)
    assert [tuple(t.shape) for t in got] == [(8, 4), (8, 32), (2, 4)]


def test_is_completed_under_compile_is_an_error_and_a_region_checks_there_too(rm):
    def asks(x):
        return fm.psum(x, "tp", mesh=rm, async_op=True).is_completed()

    with pytest.raises(Exception, match=r"`psum` requires eager mode for is_completed\(\)"):
        torch.compile(asks, fullgraph=True, backend="eager")(torch.ones(2))

    def unwaited(v):
        fm.psum(v, "tp", async_op=True)
        return v

    skip_unless_compiled_regions()  # the rest compiles a region: not where this torch's dynamo cannot trace one
    region = fm.shard_map(unwaited, mesh=rm, in_specs=P("tp"), out_specs=P("tp"))
    with pytest.raises(fm.MeshError, match=r"but 1 was never waited for: psum over 'tp'"):
        torch.compile(region, fullgraph=True, backend="eager")(torch.ones(8))


def test_pending_sums_are_typed_at_issue_too(rm):
    seen = {}

    def body(x, w):
        y = fm.pcast(x @ w, "tp", to="unreduced", async_op=True).wait()
        seen["pcast"] = fm.typeof(y)
        seen["psum"] = (fm.typeof(fm.psum(y, "tp", async_op=True).wait()), fm.typeof(fm.psum(y, "tp")))
        seen["psum_scatter"] = (fm.typeof(fm.psum_scatter(y, "tp", dim=1, async_op=True).wait()),
                                fm.typeof(fm.psum_scatter(y, "tp", dim=1)))
        with pytest.raises(fm.VmaError, match=r"`all_gather` over \('tp',\) requires a value that is not unreduced"):
            fm.all_gather(y, "tp", async_op=True)  # refused when issued
        return fm.psum(y, "tp")

    fm.shard_map(body, mesh=rm, in_specs=(P(None, "tp"), P("tp")), out_specs=P())(torch.ones(4, 8), torch.ones(8, 8))
    invariant, varying = fm.AxisTypes(varying=frozenset()), fm.AxisTypes(varying=frozenset({"tp"}))
    assert seen == {"pcast": fm.AxisTypes(varying=frozenset(), unreduced=frozenset({"tp"})),
                    "psum": (invariant, invariant), "psum_scatter": (varying, varying)}
