"""One rank of a world-8 job run by two torchrun agents on this machine: each agent plays a host.

Launched by tests/multinode/test_two_hosts.py (``--nnodes=2 --nproc_per_node=4``, c10d
rendezvous); the launcher gives each agent a label in ``FM_TEST_AGENT``, which its four workers
inherit. Every rank:

1. learns the real hosts independently of ``Mesh.host_span``: it all-gathers its agent label,
   ``GROUP_RANK`` and parent (agent) pid, and checks that each agent holds ``LOCAL_WORLD_SIZE``
   ranks that agree on all three;
2. realizes three meshes: the well placed (dp=2, tp=4), tp across hosts (a transposed (tp, dp)
   layout) and tp interleaved over both hosts (a permuted device list, groups not in ascending
   order), and for each axis
   checks, against groups computed here from the rank numbers alone: the members of its real
   gloo group in group-rank order, ``psum`` and ``all_gather`` results, ``local_rank``;
3. checks ``mesh.host_span(LOCAL_WORLD_SIZE)`` against the stated placement and against the
   span measured from the gathered agent labels;
4. checks realize's INFO log lines (logger ``functional_mesh.realize``): one per axis, on
   rank 0 only, with the size, group count, new-group count and measured host span.

On success each rank prints one ``two-hosts rank ...`` line per mesh and a final ``ok`` line.
Any failed check raises, so torchrun exits non-zero. Nothing runs on import (pytest imports
this module for doctests).
"""

from __future__ import annotations

import logging
import os
import sys

# Group and divergence-check timeouts, seconds (docs/design.md "Tests": at most 30 s in tests).
GROUP_TIMEOUT_S = 20
CHECK_S = 10
REPORT = "two-hosts"


class _Capture(logging.Handler):
    """Keeps the messages realize logs, so this rank can check them."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _expected_cases(world: int, per_host: int) -> list[dict]:
    """Each mesh to realize, with its groups computed from rank numbers (not by the library).

    ``groups[axis][r]`` is the ordered member list (mesh order) of ``r``'s group along ``axis``.
    ``placement`` is what the placement was designed to be, for ``per_host`` consecutive ranks
    per host and two hosts.
    """
    import numpy as np

    import functional_mesh as fm

    if (world, per_host) != (8, 4):  # the layouts below are drawn for two hosts of 4 ranks
        raise RuntimeError(f"two_hosts_worker needs WORLD_SIZE=8, LOCAL_WORLD_SIZE=4; got {world}, {per_host}")
    ranks = range(world)
    # Well placed: rank r = 4 * dp + tp; tp stays in one host, dp crosses hosts.
    good = {
        "dp": {r: [r % 4, r % 4 + 4] for r in ranks},
        "tp": {r: [4 * (r // 4) + j for j in range(4)] for r in ranks},
    }
    # tp across hosts: a (tp=2, dp=4) grid read as (dp, tp), so r = 4 * tp + dp.
    swapped = {
        "dp": {r: [4 * (r // 4) + i for i in range(4)] for r in ranks},
        "tp": {r: [r % 4, r % 4 + 4] for r in ranks},
    }
    # tp interleaved over a permuted device list: each tp row holds two ranks of each host, each
    # dp column one rank of each; most groups are not ascending (created with sort_ranks=False).
    table = [[4, 1, 5, 0], [3, 6, 2, 7]]
    interleaved = {
        "dp": {r: [row[c] for row in table] for row_r in table for c, r in enumerate(row_r)},
        "tp": {r: list(row) for row in table for r in row},
    }
    return [
        {"name": "well-placed", "mesh": fm.make_mesh((2, 4), ("dp", "tp")), "groups": good,
         "placement": {"dp": "cross-host", "tp": "intra-host"}},
        {"name": "tp-across-hosts", "mesh": fm.make_mesh((2, 4), ("tp", "dp")).transpose("dp", "tp"),
         "groups": swapped, "placement": {"dp": "intra-host", "tp": "cross-host"}},
        {"name": "tp-interleaved", "mesh": fm.Mesh.from_ranks(np.array(table), ("dp", "tp")),
         "groups": interleaved, "placement": {"dp": "cross-host", "tp": "mixed"}},
    ]


def _measured_span(groups: dict[int, list[int]], host_of: dict[int, str]) -> str:
    """The span of one axis from the real hosts: "intra-host", "cross-host" or "mixed"."""
    rows = {tuple(members) for members in groups.values()}
    hosts = [[host_of[r] for r in row] for row in rows]
    if all(len(set(h)) == 1 for h in hosts):
        return "intra-host"
    if all(len(set(h)) == len(h) for h in hosts):
        return "cross-host"
    return "mixed"


def _check_hosts(rank: int, world: int, per_host: int) -> dict[int, str]:
    """Every rank's agent label, after checking each agent is one consistent host of per_host ranks."""
    import torch.distributed as dist

    mine = (os.environ["FM_TEST_AGENT"], int(os.environ["GROUP_RANK"]), os.getppid(), int(os.environ["LOCAL_RANK"]))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    by_label: dict[str, list] = {}
    for r, (label, group_rank, agent_pid, local_rank) in enumerate(everyone):
        by_label.setdefault(label, []).append((r, group_rank, agent_pid, local_rank))
    if len(by_label) != world // per_host:
        raise RuntimeError(f"rank {rank}: expected {world // per_host} agents, saw labels {sorted(by_label)}")
    for label, members in by_label.items():
        if len(members) != per_host:
            raise RuntimeError(f"rank {rank}: agent {label} holds {len(members)} ranks, not {per_host}: {members}")
        if len({(g, p) for _, g, p, _ in members}) != 1:
            raise RuntimeError(f"rank {rank}: agent {label}'s ranks disagree on GROUP_RANK/agent pid: {members}")
        if sorted(lr for *_, lr in members) != list(range(per_host)):
            raise RuntimeError(f"rank {rank}: agent {label}'s LOCAL_RANKs are not 0..{per_host - 1}: {members}")
    if len({m[0][1] for m in by_label.values()}) != len(by_label):
        raise RuntimeError(f"rank {rank}: two agents share a GROUP_RANK: {by_label}")
    return {r: everyone[r][0] for r in range(world)}


def _check_case(case: dict, rank: int, world: int, per_host: int, host_of: dict[int, str],
                capture: _Capture, seen: set[tuple[int, ...]]) -> str:
    import torch
    import torch.distributed as dist

    import functional_mesh as fm

    mesh, groups, name = case["mesh"], case["groups"], case["name"]
    before = len(capture.lines)
    rm = fm.realize(mesh, timeout=GROUP_TIMEOUT_S, check=CHECK_S)
    logged = capture.lines[before:]
    spans = {}
    for axis in ("dp", "tp"):
        expected = groups[axis][rank]
        size = len(expected)
        # The library's view of the groups agrees with ours: this rank's row and the whole family.
        rows = mesh[axis].groups().reshape(-1, size).tolist()
        if sorted(map(tuple, rows)) != sorted({tuple(g) for g in groups[axis].values()}):
            raise RuntimeError(f"rank {rank} {name}: mesh[{axis!r}].groups()={rows}, expected {groups[axis]}")
        # The real gloo group: members in group-rank order are the expected mesh order.
        pg = rm.group(axis)
        members = [None] * size
        dist.all_gather_object(members, rank, group=pg)
        if members != expected:
            raise RuntimeError(f"rank {rank} {name}: {axis} group members {members}, expected {expected}")
        if dist.get_process_group_ranks(pg) != expected:
            raise RuntimeError(f"rank {rank} {name}: {axis} group ranks {dist.get_process_group_ranks(pg)}, "
                               f"expected {expected}")
        if rm.local_rank(axis) != expected.index(rank) or fm.axis_index(axis, mesh=rm) != expected.index(rank):
            raise RuntimeError(f"rank {rank} {name}: {axis} index {rm.local_rank(axis)}, "
                               f"expected {expected.index(rank)}")
        # Collectives by axis name: values from rank numbers.
        x = torch.tensor([float(rank), float(rank * rank)])
        total = fm.psum(x, axis, mesh=rm)
        want = torch.tensor([float(sum(expected)), float(sum(r * r for r in expected))])
        if not torch.equal(total, want):
            raise RuntimeError(f"rank {rank} {name}: psum over {axis} gave {total.tolist()}, expected {want.tolist()}")
        gathered = fm.all_gather(torch.tensor([rank, 100 + rank]), axis, mesh=rm)
        want_g = torch.tensor([v for r in expected for v in (r, 100 + r)])
        if not torch.equal(gathered, want_g):
            raise RuntimeError(f"rank {rank} {name}: all_gather over {axis} gave {gathered.tolist()}, "
                               f"expected {want_g.tolist()}")
        # Host span: as designed, and as measured from the real agents.
        measured = _measured_span(groups[axis], host_of)
        spans[axis] = measured
        if measured != case["placement"][axis]:
            raise RuntimeError(f"rank {rank} {name}: {axis} measured {measured}, designed {case['placement'][axis]}")
    reported = mesh.host_span(int(os.environ["LOCAL_WORLD_SIZE"]))
    if reported != spans:
        raise RuntimeError(f"rank {rank} {name}: host_span={reported}, measured from the agents {spans}")
    # The product of both axes is the whole world: one psum over the tuple.
    both = fm.psum(torch.tensor([float(rank)]), ("dp", "tp"), mesh=rm)
    if both.item() != sum(range(world)):
        raise RuntimeError(f"rank {rank} {name}: psum over (dp, tp) gave {both.item()}")
    _check_log(name, mesh, groups, spans, logged, rank, per_host, seen)
    return (f"{REPORT} rank {rank} host {host_of[rank]} {name}: "
            + " ".join(f"{axis}={spans[axis]}" for axis in ("dp", "tp"))
            + f" log_lines={len(logged)}")


def _check_log(name: str, mesh, groups: dict, spans: dict, logged: list[str], rank: int, per_host: int,
               seen: set[tuple[int, ...]]) -> None:
    """Rank 0 logs one INFO line per axis with the measured span; other ranks log nothing at INFO."""
    if rank != 0:
        if logged:
            raise RuntimeError(f"rank {rank} {name}: realize logged at INFO on a rank other than 0: {logged}")
        return
    if len(logged) != len(mesh.axis_names):
        raise RuntimeError(f"rank 0 {name}: expected one log line per axis, got {logged}")
    for axis in mesh.axis_names:
        rows = {tuple(g) for g in groups[axis].values()}
        new = len(rows - seen)
        seen |= rows
        size = len(next(iter(rows)))
        tail = (f"axis {axis} size={size} groups={len(rows)} new_groups={new} {spans[axis]} "
                f"({per_host} ranks per host)")
        hits = [line for line in logged if line.endswith(tail)]
        if len(hits) != 1:
            raise RuntimeError(f"rank 0 {name}: no log line ending {tail!r} in {logged}")


def main() -> int:
    # INFO for realize's per-axis lines, on stderr as torchrun users would see them.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    capture = _Capture()
    logging.getLogger("functional_mesh.realize").addHandler(capture)

    import torch.distributed as dist

    import functional_mesh as fm

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    cases = _expected_cases(world, per_host)
    # The first realize initialises the default group from torchrun's environment; the whole
    # world in ascending order reuses the default group, so it creates no group.
    fm.realize(fm.make_mesh((world,), ("world",)), timeout=GROUP_TIMEOUT_S, check=CHECK_S)
    if fm.cache_info().groups != 0:
        raise RuntimeError(f"rank {rank}: realize over the whole world created groups: {fm.cache_info()}")
    capture.lines.clear()
    host_of = _check_hosts(rank, world, per_host)
    seen: set[tuple[int, ...]] = set()
    lines = [_check_case(case, rank, world, per_host, host_of, capture, seen) for case in cases]
    dist.barrier()
    # One write for the whole block, newline included: under PYTHONUNBUFFERED=1 print() writes the
    # text and its end="\n" separately, and another rank's block can land in between.
    sys.stdout.write("\n".join([*lines, f"{REPORT} rank {rank} ok"]) + "\n")
    sys.stdout.flush()
    fm.clear_cache()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
