"""Arguments that do not fit their in_specs: one ``MeshError`` lists every misfit (fake backend).

As JAX's ``_spec_rank_error`` and ``_spec_divisibility_error`` do, the error names, for each
argument whose rank is below its spec's length or whose sharded dim does not divide over its axes,
the pytree path, the spec, the parameter of ``f`` it is bound to (``inspect.signature``; left out
where the signature cannot be read), why it does not fit, and the mesh. Nothing is entered, and
``f`` is not called, when one argument does not fit.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

import functional_mesh as fm
from functional_mesh import P
from functional_mesh import _torch


@pytest.fixture
def rm(fake_world):
    """Rank 5 of a fake world of 8, realized as (dp 2, tp 4)."""
    fake_world(8, 5)
    return fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))


HEAD = (r"`shard_map` requires every argument to fit its in_spec \(a rank at least the spec's length, every sharded "
        r"dim divisible by the total size of its axes\), but {n} arguments? do(es)? not \(mesh Mesh\(dp=2, tp=4\)\):\n")


def test_every_misfit_in_one_error_with_its_parameter_and_the_mesh(rm):
    called = []

    def step(x, w, b, *rest):
        called.append(True)
        return x

    mapped = fm.shard_map(step, in_specs=(P("tp", None, None), P(None, "tp"), P(), P("dp"), P(("dp", "tp"))),
                          out_specs=P("tp"), mesh=rm)
    want = (HEAD.format(n=4)
            + re.escape("  in_specs[0]=P('tp', None, None) (bound to step's parameter 'x'): requires a value of rank "
                        "at least 3, but got shape (8, 4)\n")
            + re.escape("  in_specs[1]=P(None, 'tp') (bound to step's parameter 'w'): maps dim 1 of size 6 (shape "
                        "(4, 6)) to axes ('tp',) of total size 4; pad the value to a multiple of 4, or shard it over "
                        "other axes\n")
            + re.escape("  in_specs[3]=P('dp') (bound to step's parameter *rest[0]): maps dim 0 of size 3 (shape (3,)) "
                        "to axes ('dp',) of total size 2; ")
            + ".*\n"
            + re.escape("  in_specs[4]=P(('dp', 'tp')) (bound to step's parameter *rest[1]): maps dim 0 of size 12 "
                        "(shape (12,)) to axes ('dp', 'tp') of total size 8; pad the value to a multiple of 8, or "
                        "shard it over other axes") + "$")
    with pytest.raises(fm.MeshError, match=want) as info:
        mapped(torch.ones(8, 4), torch.ones(4, 6), torch.ones(5), torch.ones(3), torch.ones(12))
    assert info.value.mesh == rm.mesh
    assert "in_specs[2]" not in str(info.value)  # P() fits any shape
    assert called == []


def test_a_nested_argument_is_named_by_its_path_and_the_parameter_it_is_in(rm):
    mapped = fm.shard_map(lambda params, x: x, in_specs=({"w": P("tp"), "b": P()}, P("dp", "tp")), out_specs=P(),
                          mesh=rm)
    want = (HEAD.format(n=2)
            + re.escape("  in_specs[0]['w']=P('tp') (bound to <lambda>'s parameter 'params'): maps dim 0 of size 6 "
                        "(shape (6,)) to axes ('tp',) of total size 4; ")
            + ".*\n"
            + re.escape("  in_specs[1]=P('dp', 'tp') (bound to <lambda>'s parameter 'x'): maps dim 0 of size 3 "
                        "(shape (3, 2)) to axes ('dp',) of total size 2; pad the value to a multiple of 2, or shard it "
                        "over other axes; maps dim 1 of size 2 (shape (3, 2)) to axes ('tp',) of total size 4; "))
    with pytest.raises(fm.MeshError, match=want):
        mapped({"w": torch.ones(6), "b": torch.ones(3)}, torch.ones(3, 2))


def test_the_parameters_of_a_partial_and_of_a_method_and_none_without_a_signature(rm):
    def scaled(scale, x, y):
        return x * scale

    partial = fm.shard_map(functools.partial(scaled, 2.0), in_specs=(P(), P("tp")), out_specs=P(), mesh=rm)
    with pytest.raises(fm.MeshError, match=r"in_specs\[1\]=P\('tp'\) \(bound to scaled's parameter 'y'\): maps dim 0"):
        partial(torch.ones(4), torch.ones(2))

    class Block(torch.nn.Module):
        def forward(self, hidden):
            return hidden

    module = fm.shard_map(Block(), in_specs=P(None, "tp"), out_specs=P(), mesh=rm)
    with pytest.raises(fm.MeshError, match=r"in_specs\[0\]=P\(None, 'tp'\) \(bound to Block's parameter 'hidden'\): "
                                           r"maps dim 1 of size 2"):
        module(torch.ones(4, 2))

    # torch.add has no signature inspect can read: the path and the spec alone
    builtin = fm.shard_map(torch.add, in_specs=P("tp"), out_specs=P("tp"), mesh=rm)
    with pytest.raises(fm.MeshError, match=HEAD.format(n=2) + re.escape(
            "  in_specs[0]=P('tp'): maps dim 0 of size 2 (shape (2,)) to axes ('tp',) of total size 4; pad the value "
            "to a multiple of 4, or shard it over other axes\n  in_specs[1]=P('tp'): requires a value of rank at "
            "least 1, but got shape ()")):
        builtin(torch.ones(2), torch.ones(()))


def test_a_region_over_a_selection_names_the_selection(rm):
    tp = rm["tp"]
    mapped = fm.shard_map(lambda x: x, in_specs=P("tp"), out_specs=P("tp"), mesh=tp)
    want = (r"but 1 argument does not \(mesh Mesh\(tp=4; 2 groups over devices 0\.\.7\), a selection of \(dp, tp\)\):"
            r"\n  in_specs\[0\]=P\('tp'\) \(bound to <lambda>'s parameter 'x'\)")
    with pytest.raises(fm.MeshError, match=want):
        mapped(torch.ones(6))


def test_under_torch_compile_the_error_is_the_same(rm):
    mapped = fm.shard_map(lambda x, w: x * w, in_specs=(P("tp"), P(None, "dp")), out_specs=P("tp"), mesh=rm)
    args = (torch.ones(6), torch.ones(2, 3))
    with pytest.raises(fm.MeshError) as eager:
        mapped(*args)
    torch._dynamo.reset()
    with pytest.raises(fm.MeshError) as compiled:
        torch.compile(mapped, fullgraph=True, backend="eager")(*args)
    if _torch.region_trace_failure() is not None:  # torch 2.11/2.12: no compiled regions; the gate says so first
        assert "requires torch >= 2.13" in str(compiled.value)
        return
    assert str(eager.value) in str(compiled.value)
    assert "(bound to <lambda>'s parameter 'w')" in str(compiled.value)
