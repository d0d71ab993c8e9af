"""realize's per-axis log lines (logger "functional_mesh.realize"), under the fake backend.

Expected spans are computed here from the rank numbers (host = rank // ranks per host), not
from Mesh.host_span; the two-host gloo run (tests/multinode/) checks the same lines on real hosts.
"""

from __future__ import annotations

import logging

import pytest
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm


@pytest.fixture
def fake_world():
    def start(rank: int, size: int) -> None:
        dist.init_process_group("fake", rank=rank, world_size=size, store=FakeStore())

    yield start
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()


def span_by_hand(groups: list[list[int]], per_host: int) -> str:
    hosts = [[r // per_host for r in g] for g in groups]
    if all(len(set(h)) == 1 for h in hosts):
        return "intra-host"
    if all(len(set(h)) == len(h) for h in hosts):
        return "cross-host"
    return "mixed"


def test_one_info_line_per_axis_on_rank_zero_with_size_groups_and_host_span(fake_world, caplog, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    fake_world(0, 32)
    mesh = fm.make_mesh((2, 2, 8), ("dp", "cp", "tp")).transpose("dp", "tp", "cp")  # strides 16, 8, 1
    caplog.set_level(logging.INFO, logger="functional_mesh")
    fm.realize(mesh, products=[("dp", "cp")])
    lines = [r.getMessage() for r in caplog.records if r.name == "functional_mesh.realize"]
    expected_groups = {"dp": [[r, r + 16] for r in range(16)],
                       "tp": [list(range(8 * k, 8 * k + 8)) for k in range(4)],
                       "cp": [[r, r + 8] for r in range(32) if (r // 8) % 2 == 0]}
    assert len(lines) == 4
    for line, axis in zip(lines, ["dp", "tp", "cp"]):
        groups = expected_groups[axis]
        assert line == (f"rank 0: realize {mesh!r}: axis {axis} size={len(groups[0])} groups={len(groups)} "
                        f"new_groups={len(groups)} {span_by_hand(groups, 8)} (8 ranks per host)")
    assert lines[3].startswith(f"rank 0: realize {mesh!r}: axis dp×cp size=4 groups=8 new_groups=8 cross-host (8 ranks per host)")
    caplog.clear()
    fm.realize(mesh)  # a hit: nothing new
    assert [r.getMessage().split(" new_groups=")[1].split(" ")[0] for r in caplog.records] == ["0", "0", "0"]


def test_other_ranks_log_at_debug_and_nothing_without_logging_configured(fake_world, caplog, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    fake_world(3, 8)
    caplog.set_level(logging.INFO, logger="functional_mesh")
    fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    assert [r for r in caplog.records if r.name == "functional_mesh.realize"] == []
    caplog.set_level(logging.DEBUG, logger="functional_mesh")
    fm.realize(fm.make_mesh((4, 2), ("dp", "tp")))
    messages = [r.getMessage() for r in caplog.records if r.name == "functional_mesh.realize"]
    assert len(messages) == 2 and all(r.levelno == logging.DEBUG for r in caplog.records
                                      if r.name == "functional_mesh.realize")
    assert messages[0].endswith("host span unknown (LOCAL_WORLD_SIZE unset)")
