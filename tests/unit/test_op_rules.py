"""The table of type-rule exceptions (functional_mesh._op_rules): what it recognises, and its one-rule-per-key law."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import functional_mesh as fm
from functional_mesh import _collectives as C
from functional_mesh import _op_rules as R


def test_a_second_rule_for_a_key_is_an_error():
    with pytest.raises(RuntimeError, match="has two rules"):
        R._register({}, None, torch.rand)  # already a random op
    with pytest.raises(RuntimeError, match="has two rules"):
        R._register({}, None, torch.Tensor.size)  # already a pass-through query


def test_every_spelling_of_an_op_is_registered_once():
    keys = list(R.registered())
    assert len(keys) == len(set(keys))
    ours = {fm.psum, fm.pmean, fm.pmax, fm.pmin, fm.pvary, fm.pcast, fm.all_gather, fm.psum_scatter, fm.all_to_all,
            fm.ragged_all_to_all, fm.ppermute, fm.axis_index, fm.axis_size}
    assert set(C.COLLECTIVES) == ours  # one record per public collective, and no other
    assert {C.COLLECTIVES[f].name for f in ours} == {f.__name__ for f in ours}
    assert all(R.op_kind(f).role == "collective" for f in ours)


def test_torch_distributed_collectives_are_known_as_raw_with_the_collective_to_use_instead():
    import torch.distributed as dist

    expected = {dist.all_reduce: "fm.psum", dist.all_gather_into_tensor: "fm.all_gather",
                dist.reduce_scatter_tensor: "fm.psum_scatter", dist.all_to_all_single: "fm.ragged_all_to_all",
                dist.broadcast: "fm.ppermute", dist.send: "fm.ppermute", dist.isend: "fm.ppermute"}
    for func, advice in expected.items():
        assert R.op_kind(func).role == "raw collective", func
        assert advice in C.RAW[func], (func, C.RAW[func])


@pytest.mark.parametrize(("call", "written"), [
    (lambda x, y: (torch.Tensor.add_, (x, y), {}), "x"),
    (lambda x, y: (torch.Tensor.__iadd__, (x, y), {}), "x"),
    (lambda x, y: (torch.Tensor.__setitem__, (x, 0, y), {}), "x"),
    (lambda x, y: (torch.add, (x, y), {"out": y}), "y"),
    (lambda x, y: (F.relu, (x,), {"inplace": True}), "x"),
    (lambda x, y: (torch.add, (x, y), {}), None),
    (lambda x, y: (torch.Tensor.__add__, (x, y), {}), None),
    (lambda x, y: (torch.Tensor.requires_grad_, (x,), {}), "x"),  # a pass-through query: never typed
])
def test_written_operand(call, written):
    x, y = torch.zeros(2), torch.ones(2)
    func, args, kwargs = call(x, y)
    got = R.written_operand(func, args, kwargs)
    assert got is {"x": x, "y": y, None: None}[written]


def test_random_ops_and_dropout_only_when_it_draws():
    x = torch.ones(3)
    assert R.is_random(torch.rand, (3,), {})
    assert R.is_random(torch.Tensor.normal_, (x,), {})
    assert R.is_random(F.dropout, (x, 0.1), {})
    assert not R.is_random(F.dropout, (x, 0.1), {"training": False})
    assert not R.is_random(F.dropout, (x,), {"p": 0.0})
    assert not R.is_random(torch.add, (x, x), {})


def test_custom_ops_cannot_be_typed_but_aten_ops_can():
    assert R.is_untypeable(torch.ops._c10d_functional.all_reduce.default)
    assert R.is_untypeable(torch.ops._c10d_functional.all_reduce)
    assert not R.is_untypeable(torch.ops.aten.add.Tensor)
    assert not R.is_untypeable(torch.add)


def test_queries_pass_through():
    assert torch.Tensor.shape.__get__ in R.PASS_THROUGH
    assert torch.Tensor.item in R.PASS_THROUGH
    assert torch.add not in R.PASS_THROUGH
