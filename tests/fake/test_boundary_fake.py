"""The region's DTensor boundary gives what torch's ``to_local`` / ``DTensor.from_local`` give (fake backend).

Eagerly a region takes a DTensor argument's local tensor and makes each result's DTensor itself
(the spec built once per shape, the gradient DTensor from the argument's own spec) instead of
calling ``to_local`` and ``from_local``, which derive every spec anew. What users see must not
change: results, gradients (type, placements, shape, stride, values), higher-order gradients, a
mesh realized again. The reference is the same computation by hand with ``to_local`` and
``DTensor.from_local``. On the fake backend a ``psum`` leaves its input as it is, so values
compare exactly where the only communication is a ``psum``.
"""

from __future__ import annotations

import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.distributed.tensor import DTensor

import functional_mesh as fm
from functional_mesh import P


@pytest.fixture
def world(fake_world):
    """Rank 5 of a fake world of 8; nothing is left behind."""
    fake_world(8, 5)


def realize():
    return fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))


def dtensors(rm, *specs_and_shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [fm.distribute(torch.randn(shape, generator=g, dtype=torch.float64), fm.NamedSharding(rm.mesh, spec),
                          mesh=rm).requires_grad_() for spec, shape in specs_and_shapes]


def described(t: DTensor) -> tuple:
    return type(t).__name__, tuple(t.placements), tuple(t.shape), t.stride(), t.to_local().stride()


def by_hand(rm, body, args, out_placements):
    """The reference: to_local in, the body on the local tensors, DTensor.from_local out (psum: a no-op here)."""
    local = [a.to_local() for a in args]
    y = body(*local)
    return DTensor.from_local(y, rm.device_mesh, out_placements, run_check=False)


@pytest.mark.parametrize("check_vma", [True, False])
def test_results_and_gradients_equal_to_local_and_from_local(world, check_vma):
    rm = realize()

    def body(x, w):
        return torch.tanh(x @ w) * 2

    specs = ((P("tp"), (16, 6)), (P(), (6, 6)))
    ours, theirs = dtensors(rm, *specs), dtensors(rm, *specs)
    y = fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm, check_vma=check_vma)(*ours)
    want = by_hand(rm, body, theirs, y.placements)
    assert described(y) == described(want)
    torch.testing.assert_close(y.to_local(), want.to_local())
    # untyped, JAX's convention: the cotangent of a result is divided by the size of the axes its out_spec
    # does not name (dp: 2); the psums (the typed cast's of w, the untyped convention's) are no-ops here
    scale = 1.0 if check_vma else 0.5
    (y.to_local() ** 2).sum().backward()
    ((want.to_local() ** 2).sum() * scale).backward()
    for a, b in zip(ours, theirs, strict=True):
        assert described(a.grad) == described(b.grad)
        torch.testing.assert_close(a.grad.to_local(), b.grad.to_local())
    # a second step accumulates into the DTensor gradients as torch's own path does
    fm.shard_map(body, in_specs=(P("tp"), P()), out_specs=P("tp"), mesh=rm,
                 check_vma=check_vma)(*ours).to_local().sum().backward()
    (by_hand(rm, body, theirs, y.placements).to_local().sum() * scale).backward()
    for a, b in zip(ours, theirs, strict=True):
        assert described(a.grad) == described(b.grad)
        torch.testing.assert_close(a.grad.to_local(), b.grad.to_local())


def test_a_gradient_in_another_layout_and_a_gradient_of_a_gradient(world):
    rm = realize()
    # the argument's gradient comes back transposed (non-contiguous): its DTensor takes that layout
    ours, theirs = dtensors(rm, (P(None, "tp"), (6, 8))), dtensors(rm, (P(None, "tp"), (6, 8)))
    y = fm.shard_map(lambda a: a.t().contiguous() * 3, in_specs=P(None, "tp"), out_specs=P("tp"), mesh=rm)(*ours)
    want = by_hand(rm, lambda a: a.t().contiguous() * 3, theirs, y.placements)
    # (autograd.grad: the gradient as the boundary makes it; accumulating into .grad would copy it contiguous)
    (g_ours,) = torch.autograd.grad((y.to_local() ** 2).sum(), ours)
    (g_theirs,) = torch.autograd.grad((want.to_local() ** 2).sum(), theirs)
    assert described(g_ours) == described(g_theirs) and not g_ours.to_local().is_contiguous()
    torch.testing.assert_close(g_ours.to_local(), g_theirs.to_local())

    # create_graph=True: the backward itself is differentiated
    ours, theirs = dtensors(rm, (P("tp"), (8, 3)), seed=1), dtensors(rm, (P("tp"), (8, 3)), seed=1)
    grads = []
    for x, run in ((ours[0], lambda v: fm.shard_map(lambda a: a ** 3, in_specs=P("tp"), out_specs=P("tp"),
                                                     mesh=rm)(v)),
                   (theirs[0], lambda v: by_hand(rm, lambda a: a ** 3, [v], v.placements))):
        (g,) = torch.autograd.grad(run(x).to_local().sum(), x, create_graph=True)
        g.to_local().sum().backward()
        grads.append((described(g), g.to_local().detach(), x.grad))
    assert grads[0][0] == grads[1][0]
    torch.testing.assert_close(grads[0][1], grads[1][1])
    # d/dx sum(3 x^2) = 6 x, on this rank's block (the boundary's second backward, against the math)
    assert grads[0][2] is not None and tuple(grads[0][2].placements) == tuple(ours[0].placements)
    torch.testing.assert_close(grads[0][2].to_local(), 6 * ours[0].to_local().detach())
    if grads[1][2] is not None:  # torch 2.11's own to_local/from_local leave it None; later ones agree with ours
        assert described(grads[0][2]) == described(grads[1][2])
        torch.testing.assert_close(grads[0][2].to_local(), grads[1][2].to_local())


def test_no_grad_results_and_dtypes(world):
    rm = realize()
    x = fm.distribute(torch.arange(16.0).reshape(8, 2), fm.NamedSharding(rm.mesh, P("tp")), mesh=rm)
    f = fm.shard_map(lambda a: a * 2, in_specs=P("tp"), out_specs=P("tp"), mesh=rm)
    with torch.no_grad():
        a, b = f(x), f(x.to(torch.float16))
    assert (described(a), a.dtype, a.requires_grad) == (("DTensor", tuple(x.placements), (8, 2), (2, 1), (2, 1)),
                                                        torch.float32, False)
    assert (b.dtype, tuple(b.shape)) == (torch.float16, (8, 2))
    torch.testing.assert_close(a.to_local(), torch.tensor([[4.0, 5.0], [6.0, 7.0]]) * 2)  # rank 5: tp block 1
    # two results of one shape: each its own DTensor and spec (a spec changed on one is not seen by the other)
    c = f(x)
    c._spec = type(c._spec)(c.device_mesh, c.placements, tensor_meta=c._spec.tensor_meta)
    assert a._spec is not c._spec and f(x)._spec is not a._spec and described(f(x)) == described(a)


def test_a_mesh_realized_again_gets_results_on_its_own_device_mesh(world):
    rm = realize()
    f = fm.shard_map(lambda a: a + 1, in_specs=P("tp"), out_specs=P("tp"))  # mesh=None: the current mesh
    x = torch.zeros(8, 2)
    with rm:
        first = f(x)
    old = rm.device_mesh
    assert first.device_mesh is old
    fm.clear_cache()
    rm2 = realize()
    assert rm2.device_mesh is not old
    with rm2:
        again = f(x)
    assert again.device_mesh is rm2.device_mesh
    torch.testing.assert_close(again.to_local(), torch.ones(2, 2))
