"""Whether this torch compiles a ``shard_map`` region is a feature probe (``_torch.region_trace_failure``),
not a release number: run once, on the first compiled region, and never at import or eagerly.

On every torch the suite runs on (2.11.0 and 2.12.1, whose dynamo cannot trace a region; 2.13.0 and
2.14.1, whose can), the probe's answer must be what a real region does under torch.compile: where it
says yes, a typed region with a collective compiles and gives the eager values; where it says no,
shard_map raises its MeshError quoting the probe, and the same region with the gate taken away fails
inside dynamo (so the probe is no false alarm). Fake backend, rank 1 of 4, one process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm
from functional_mesh import P, _shard_map, _torch


@pytest.fixture
def rm():
    dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
    yield fm.realize(fm.make_mesh((2, 2), ("dp", "tp")))
    fm.clear_cache()
    dist.destroy_process_group()


def _region(rm):
    # typed: the plan of the mesh (a constant of the trace) and the default rule's casts, then a collective
    return fm.shard_map(lambda x: fm.psum(x * 2 + 1, "tp"), in_specs=P("tp"), out_specs=P(), mesh=rm)


def test_the_probe_answers_what_a_compiled_region_does(rm, monkeypatch):
    x = torch.arange(8.0)
    eager = _region(rm)(x).to_local()  # rank 1 is tp=1, block [4, 5, 6, 7]; the fake backend's psum keeps it
    assert eager.tolist() == [9.0, 11.0, 13.0, 15.0]
    failure = _torch.region_trace_failure()
    assert _torch.region_trace_failure() is failure  # asked once, kept
    compiled = torch.compile(_region(rm), backend="eager", fullgraph=True)
    if failure is None:
        assert torch.equal(compiled(x).to_local(), eager)
        return
    with pytest.raises(fm.MeshError, match="requires torch >= 2.13") as info:
        compiled(x)
    assert failure in str(info.value) and torch.__version__ in str(info.value)
    # without the gate dynamo meets the region and fails on its own: the probe said no for a reason
    monkeypatch.setattr(_shard_map, "_no_compiled_regions", torch.compiler.assume_constant_result(lambda: ""))
    torch._dynamo.reset()
    with pytest.raises(Exception) as raw:  # noqa: PT011 - whatever dynamo raises; only not ours
        torch.compile(_region(rm), backend="eager", fullgraph=True)(x)
    assert not isinstance(raw.value, fm.MeshError), raw.value


def test_the_probe_costs_nothing_at_import_or_eagerly():
    script = textwrap.dedent("""
        import torch, torch.distributed as dist
        import torch.testing._internal.distributed.fake_pg
        from torch.testing._internal.distributed.fake_pg import FakeStore
        import functional_mesh as fm
        from functional_mesh import P, _torch
        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
        rm = fm.realize(fm.make_mesh((2,), ("tp",)))
        fm.shard_map(lambda x: fm.psum(x, "tp"), in_specs=P("tp"), out_specs=P(), mesh=rm)(torch.ones(4))
        print("eager", _torch._REGION_TRACE)
        step = torch.compile(fm.shard_map(lambda x: x * 2, in_specs=P("tp"), out_specs=P("tp"), mesh=rm),
                             backend="eager")
        try:
            step(torch.ones(4))
        except fm.MeshError:
            pass
        print("compiled", len(_torch._REGION_TRACE))
        # the probe's graph is not counted: a program that counts its graphs sees the region's alone
        print("graphs", torch._dynamo.utils.counters["stats"]["unique_graphs"], _torch._REGION_TRACE[0] is None)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")
    assert lines[:2] == ["eager []", "compiled 1"], proc.stdout
    assert lines[2] in ("graphs 1 True", "graphs 0 False"), proc.stdout  # one region graph, or none compiled
