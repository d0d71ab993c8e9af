"""fm.plan_reshard: small cases whose moves were worked out by hand, the errors, and bounded work at any scale.

Each table row gives two shardings, a shape and the whole plan as ``(src, dst, "start:stop,...", stage)``
rows, derived on paper from torch.chunk's rule, the replica pick ``(u + piece offset) mod replicas``
and the doubling relay tree, piece k of the p meeting a block rooted at replica (k * R) // p of the R
(docs/across_meshes.md, "The plan").
"""

from __future__ import annotations

import pickle

import pytest

import functional_mesh as fm
from functional_mesh import MeshError, P


def sh(sizes, names, spec, devices=None):
    return fm.NamedSharding(fm.make_mesh(sizes, names, devices=devices), spec)


def rows(plan):
    return [(m.src_rank, m.dst_rank, ",".join(f"{s.start}:{s.stop}" for s in m.index), m.stage) for m in plan.moves]


CASES = {
    # a 1-D all-gather on one mesh: each rank copies its half and gets the other from its holder (stage 0)
    "same mesh, P(x) -> P()": (
        sh((2,), "x", P("x")), sh((2,), "x", P()), (4,), True,
        [(0, 0, "0:2", 0), (0, 1, "0:2", 0), (1, 0, "2:4", 0), (1, 1, "2:4", 0)], 4, 2),
    # disjoint meshes, two destination replicas: each piece reaches one root, which forwards it in stage 1;
    # the root of piece 1 is rotated to the second replica
    "disjoint, relays": (
        sh((2,), "tp", P("tp")), sh((2,), "dp", P(), range(2, 4)), (4,), True,
        [(0, 2, "0:2", 0), (1, 3, "2:4", 0), (2, 3, "0:2", 1), (3, 2, "2:4", 1)], 8, 2),
    "disjoint, no relays": (
        sh((2,), "tp", P("tp")), sh((2,), "dp", P(), range(2, 4)), (4,), False,
        [(0, 2, "0:2", 0), (0, 3, "0:2", 0), (1, 2, "2:4", 0), (1, 3, "2:4", 0)], 8, 1),
    # a replicated source: receivers 0..3 of the one piece alternate between the two replicas
    "replicas share": (
        sh((2,), "dp", P()), sh((4,), "tp", P("tp"), range(2, 6)), (4,), True,
        [(0, 2, "0:1", 0), (0, 4, "2:3", 0), (1, 3, "1:2", 0), (1, 5, "3:4", 0)], 4, 1),
    # nested uneven split: 5 over (a, b) = (2, 2) is [0:3] then [0:2],[2:3] | [3:4],[4:5] (not a flat chunk of 4)
    "nested tuple (a, b)": (
        sh((2, 2), ("a", "b"), P(("a", "b"))), sh((1,), "x", P(), [4]), (5,), True,
        [(0, 4, "0:2", 0), (1, 4, "2:3", 0), (2, 4, "3:4", 0), (3, 4, "4:5", 0)], 5, 1),
    # the same axes against mesh order (a _StridedShard layout): b splits first, so rank 1 = (a0, b1) holds [3:4]
    "nested tuple (b, a)": (
        sh((2, 2), ("a", "b"), P(("b", "a"))), sh((1,), "x", P(), [4]), (5,), True,
        [(0, 4, "0:2", 0), (1, 4, "3:4", 0), (2, 4, "2:3", 0), (3, 4, "4:5", 0)], 5, 1),
    # empty tail pieces (2 over 4: [0:1],[1:2],[2:2],[2:2]) send nothing
    "empty pieces": (
        sh((4,), "x", P("x")), sh((1,), "y", P(), [9]), (2,), True,
        [(0, 9, "0:1", 0), (1, 9, "1:2", 0)], 2, 1),
    # the same devices in another order: rank 1 holds [0:2] in the source, rank 0 needs it
    "permuted devices": (
        sh((2,), "x", P("x"), [1, 0]), sh((2,), "x", P("x")), (4,), True,
        [(0, 1, "2:4", 0), (1, 0, "0:2", 0)], 4, 1),
    # colocated replicas that hold a piece neither receive it nor break the tree: piece [0:2] (held by 0, 2)
    # roots at replica 0 = rank 0: 0 -> 1 (stage 0, 0 holds it), 0 -> 2 dropped (2 holds it), 1 -> 3 in stage 2;
    # piece [2:4] (held by 1, 3) roots at replica (1 * 4) // 2 = 2 = rank 2, which gets it from source replica
    # (0 + offset 1) mod 2 = 1 of the piece, rank 3 (stage 0); 2 -> 3 dropped (3 holds it), 2 -> 0 in stage 2
    "colocated replicas": (
        sh((2, 2), ("dp", "tp"), P("tp")), sh((2, 2), ("dp", "tp"), P()), (4,), True,
        [(0, 0, "0:2", 0), (0, 1, "0:2", 0), (1, 1, "2:4", 0), (2, 2, "0:2", 0), (3, 2, "2:4", 0), (3, 3, "2:4", 0),
         (1, 3, "0:2", 2), (2, 0, "2:4", 2)], 8, 3),
    # fewer pieces (2) than replicas (4): the roots lie 4 // 2 = 2 apart, replicas 0 and 2 (ranks 2 and 4);
    # tree position a sends to a + 1 (stage 1, from a = 0) and a + 2 (stage 2, from a = 0, 1), so every rank
    # forwards 4 or 2 bytes (one block: 4); roots 0 and 1 would leave rank 3 forwarding 6 (3 -> 5 twice, 3 -> 4)
    "spread roots": (
        sh((2,), "tp", P("tp")), sh((4,), "dp", P(), range(2, 6)), (4,), True,
        [(0, 2, "0:2", 0), (1, 4, "2:4", 0), (2, 3, "0:2", 1), (4, 5, "2:4", 1),
         (2, 4, "0:2", 2), (3, 5, "0:2", 2), (4, 2, "2:4", 2), (5, 3, "2:4", 2)], 16, 3),
    # two dims: FSDP x TP to DP replicas of TP; rank 9 = (dp 2, tp 1) gets its two pieces relayed
    "fsdp x tp -> dp x tp": (
        sh((2, 2), ("dp_shard", "tp"), P("dp_shard", "tp")), sh((4, 2), ("dp", "tp"), P(None, "tp"), range(4, 12)),
        (8, 8), True, None, 1024 // 4, 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_checked_plans(name):
    src, dst, shape, relays, want, moved, stages = CASES[name]
    plan = fm.plan_reshard(src, dst, shape, "int8", relays=relays)
    if want is not None:
        assert rows(plan) == want
    assert plan.bytes_moved == moved and plan.stages == stages


def test_fsdp_tp_to_dp_replicas_by_hand():
    src, dst, shape, *_ = CASES["fsdp x tp -> dp x tp"]
    on = fm.plan_reshard(src, dst, shape, "float32")
    # rank 9 (dp 2, tp 1) needs columns 4:8: pieces rows 0:4 (rank 1) and 4:8 (rank 3); 64 bytes each. The two
    # pieces' trees are rooted at replicas 0 and (1 * 4) // 2 = 2: rank 9 is the root of the second (from rank 3),
    # and position 2 of the first (from the root, rank 5, in stage 2)
    assert [(m.src_rank, m.dst_rank, m.index, m.stage, m.nbytes) for m in on.receives(9)] == [
        (3, 9, (slice(4, 8), slice(4, 8)), 0, 64), (5, 9, (slice(0, 4), slice(4, 8)), 2, 64)]
    # the source sends each piece once (to the root of its tree), not to all four replicas
    assert [m.dst_rank for m in on.sends(0)] == [4]
    off = fm.plan_reshard(src, dst, shape, "float32", relays=False)
    assert [m.dst_rank for m in off.sends(0)] == [4, 6, 8, 10]
    # 8 destination ranks x 32 elements x 4 bytes, nothing local; the busiest: 2 x 64 relayed (a root: to positions
    # 1 and 2 of its tree; position 1 of the other tree forwards 0) vs 4 x 64 sent
    assert on.bytes_moved == off.bytes_moved == 1024
    assert (on.max_send_bytes, off.max_send_bytes) == (128, 256)


def test_receives_and_sends_use_one_order_per_pair():
    src, dst, shape, *_ = CASES["colocated replicas"]
    plan = fm.plan_reshard(src, dst, shape, "int8")
    for a in range(4):
        for b in range(4):
            assert [m for m in plan.sends(a) if m.dst_rank == b] == [m for m in plan.receives(b) if m.src_rank == a]
    assert plan.receives(7) == plan.sends(7) == ()


def test_dtype_spellings_and_values():
    src, dst, shape, *_ = CASES["disjoint, relays"]

    class Wide:
        itemsize = 16

    assert fm.plan_reshard(src, dst, shape, "bfloat16").itemsize == 2
    assert fm.plan_reshard(src, dst, shape, "torch.float64").itemsize == 8
    assert fm.plan_reshard(src, dst, shape, Wide()).bytes_moved == 8 * 16
    plan = fm.plan_reshard(src, dst, shape, "float32")
    assert plan == fm.plan_reshard(src, dst, [4], "float32") and hash(plan) == hash(fm.plan_reshard(src, dst, (4,), "float32"))
    assert pickle.loads(pickle.dumps(plan)).moves == plan.moves
    assert pickle.loads(pickle.dumps(fm.plan_reshard(src, dst, shape, "int8", relays=False))).relays is False
    m = plan.moves[0]
    assert m == fm.Move(0, 2, (slice(0, 2),), 0, 8) and pickle.loads(pickle.dumps(m)) == m
    with pytest.raises(AttributeError):
        m.stage = 1
    assert repr(plan).startswith("ReshardPlan((4,) x 4 bytes: Mesh(tp=2) P('tp') -> Mesh(dp=2; devices 2..3) P(), 2 stages")
    assert plan.in_src(1) and not plan.in_src(2) and plan.in_dst(3) and len(plan.dst_ranks) == 2
    assert 1 in plan.src_ranks and 2 not in plan.src_ranks and -1 not in plan.src_ranks and "1" not in plan.src_ranks
    assert list(plan.dst_ranks) == [2, 3] and repr(plan.dst_ranks) == "ranks 2..3"


ERRORS = [
    (lambda s, d: fm.plan_reshard(fm.NamedSharding(s.mesh, P("x", unreduced={"y"})), d, (4,), "int8"),
     MeshError, r"`plan_reshard` requires a src sharding with no pending sum \(reduce first"),
    (lambda s, d: fm.plan_reshard(s, fm.NamedSharding(d.mesh, P(unreduced="y")), (4,), "int8"),
     MeshError, r"`plan_reshard` requires a dst sharding with no pending sum \(reduce first.*dst.spec=P\(unreduced"),
    (lambda s, d: fm.plan_reshard(fm.NamedSharding(s.mesh["x"], P("x")), d, (4,), "int8"),
     MeshError, r"`plan_reshard` requires a src mesh of one group .*src.mesh=Mesh\(x=2; 2 groups"),
    (lambda s, d: fm.plan_reshard(s, d, (4, 4, 4)[:0], "int8"),
     MeshError, r"`plan_reshard` requires a tensor with at least as many dims as the spec \(1\), but got global_shape=\(\)"),
    (lambda s, d: fm.plan_reshard(s, d, (-1,), "int8"),
     MeshError, r"`plan_reshard` requires non-negative dim sizes, but got global_shape\[0\]=-1"),
    (lambda s, d: fm.plan_reshard(s, d, "44", "int8"), TypeError, r"`plan_reshard` requires a tuple of ints"),
    (lambda s, d: fm.plan_reshard(s, d, (4,), "float33"),
     MeshError, r"`plan_reshard` requires a known dtype name, but got dtype='float33'; valid: .*bfloat16"),
    (lambda s, d: fm.plan_reshard(s, d, (4,), object()),
     TypeError, r"`plan_reshard` requires a dtype with an int .itemsize"),
    (lambda s, d: fm.plan_reshard(s.mesh, d, (4,), "int8"),
     TypeError, r"`plan_reshard` requires a functional_mesh.NamedSharding for src, but got src=Mesh"),
    (lambda s, d: fm.plan_reshard(s, P(), (4,), "int8"),
     TypeError, r"`plan_reshard` requires a functional_mesh.NamedSharding for dst, but got dst=P\(\)"),
    (lambda s, d: fm.plan_reshard(s, d, (4,), "int8", relays=1), TypeError, r"`plan_reshard` requires relays=True or False"),
    (lambda s, d: fm.plan_reshard(s, d, (4,), "int8").receives(-1),
     MeshError, r"`ReshardPlan.receives` requires a non-negative global rank, but got rank=-1"),
    (lambda s, d: fm.plan_reshard(s, d, (4,), "int8").sends(1.0), TypeError, r"`ReshardPlan.sends` requires an int"),
    (lambda s, d: fm.ShapeDtypeStruct((4, -2), "int8"),
     MeshError, r"`ShapeDtypeStruct` requires non-negative dim sizes, but got shape\[1\]=-2"),
    (lambda s, d: fm.ShapeDtypeStruct((), "int8", s),
     MeshError, r"`ShapeDtypeStruct` requires a tensor with at least as many dims as the spec"),
    (lambda s, d: fm.ShapeDtypeStruct((4,), "int8", P("x")),
     TypeError, r"`ShapeDtypeStruct` requires a NamedSharding or None for sharding"),
    (lambda s, d: fm.Move(0, 1, (slice(0, 4, 2),), 0, 2), MeshError, r"`Move` requires slices slice\(start, stop\)"),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_name_the_call_the_value_and_the_choices(i):
    make, kind, pattern = ERRORS[i]
    src = sh((2, 2), ("x", "y"), P("x"))
    dst = sh((2,), "y", P(), range(4, 6))
    with pytest.raises(kind, match=pattern):
        make(src, dst)


def test_shape_dtype_struct():
    s = sh((2,), "x", P("x"))
    a = fm.ShapeDtypeStruct([8, 4], "bfloat16", s)
    assert (a.shape, a.dtype, a.sharding, a.itemsize, a.ndim, a.nbytes) == ((8, 4), "bfloat16", s, 2, 2, 64)
    assert a == fm.ShapeDtypeStruct((8, 4), "bfloat16", s) and hash(a) == hash(fm.ShapeDtypeStruct((8, 4), "bfloat16", s))
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.shape = (1,)


# -- at any scale: the answers come from the layouts, never from a list of the world ---------------------

HUGE = 2**40  # ranks: a list of the world would not fit in memory


def test_one_ranks_moves_on_a_world_that_cannot_be_listed():
    src = sh((64, 8), ("dp_shard", "tp"), P("dp_shard", "tp"), range(512))
    dst = sh((HUGE // 8, 8), ("dp", "tp"), P(None, "tp"), range(512, 512 + HUGE))
    plan = fm.plan_reshard(src, dst, (8192, 4096), "bfloat16")
    rank = 512 + HUGE // 2 + 3  # tp = 3, replica HUGE // 16
    got = plan.receives(rank)
    # columns 1536:2048 (tp 3 of 8), rows in 64 pieces of 128, one from each source rank (dp_shard, 3)
    assert sorted((m.index[0].start, m.index[0].stop) for m in got) == [(128 * i, 128 * (i + 1)) for i in range(64)]
    assert {(m.index[1].start, m.index[1].stop) for m in got} == {(1536, 2048)}
    assert all(m.nbytes == 128 * 512 * 2 for m in got)
    assert plan.stages == 1 + 37 and all(m.stage < plan.stages for m in got)
    assert rank in plan.dst_ranks and rank not in plan.src_ranks and len(plan.dst_ranks) == HUGE
    # every source rank sends its piece once (to the root of its block's tree), relays do the rest
    assert [(m.dst_rank, m.stage) for m in plan.sends(8 * 5 + 3)] == [(plan.sends(8 * 5 + 3)[0].dst_rank, 0)]
    for m in got:  # the sender of each piece holds it: in the source (stage 0) or received before
        assert m in plan.sends(m.src_rank)
        if m.stage:
            assert any(n.index == m.index and n.stage < m.stage for n in plan.receives(m.src_rank))
    # disjoint spans: the lower bound is arithmetic (every destination rank needs its whole block)
    assert plan.bytes_moved == (HUGE // 8) * 8192 * 4096 * 2
    # the busiest sender: a root. The 64 pieces of a block are rooted at replicas k * 2**37 // 64 = k * 2**31, so
    # the root of piece 0 is at position (64 - k) * 2**31 = i * 2**31 (i = 1..63) of the other trees; position a of
    # a tree of 2**37 sends to the 2**m > a (m < 37): 37 for its own root, 37 - 31 - bitlen(i) = 6 - bitlen(i) for
    # i * 2**31: 37 + 1*5 + 2*4 + 4*3 + 8*2 + 16*1 + 32*0 = 94 pieces of 128 x 512 (the block: 64)
    assert plan.max_send_bytes == 94 * 128 * 512 * 2


def test_bytes_moved_visits_only_the_ranks_of_both_meshes():
    # the source's 512 ranks lie inside a destination of 2**40: only those 512 are looked at
    src = sh((64, 8), ("dp_shard", "tp"), P("dp_shard", "tp"), range(512))
    dst = sh((HUGE // 8, 8), ("dp", "tp"), P(None, "tp"))
    plan = fm.plan_reshard(src, dst, (8192, 4096), "int8")
    # rank r < 512 = (dp r // 8, tp r % 8) holds its own piece of columns tp: 128 x 512 elements it need not receive
    assert plan.bytes_moved == (HUGE // 8) * 8192 * 4096 - 512 * 128 * 512
    local = [m for m in plan.receives(11) if m.src_rank == 11]
    assert [m.index for m in local] == [(slice(128, 256), slice(1536, 2048))]


# -- the picture and the command line ---------------------------------------------------------------------

def test_visualize_lists_each_stage_and_the_figures():
    src, dst, shape, *_ = CASES["colocated replicas"]
    text = fm.visualize(fm.plan_reshard(src, dst, shape, "int8"))
    assert text.splitlines() == [
        "ReshardPlan((4,) x 1 bytes: Mesh(dp=2, tp=2) P('tp') -> Mesh(dp=2, tp=2) P(), 3 stages)",
        "stage 0: 6 moves",
        "  0 -> 0  0:2  2 bytes (local copy)",
        "  0 -> 1  0:2  2 bytes",
        "  1 -> 1  2:4  2 bytes (local copy)",
        "  2 -> 2  0:2  2 bytes (local copy)",
        "  3 -> 2  2:4  2 bytes",
        "  3 -> 3  2:4  2 bytes (local copy)",
        "stage 1: 0 moves",
        "stage 2: 2 moves",
        "  1 -> 3  0:2  2 bytes",
        "  2 -> 0  2:4  2 bytes",
        "bytes_moved 8, max_send_bytes 2, moves 8, stages 3",
    ]
    many = fm.plan_reshard(sh((1,), "x", P()), sh((12,), "y", P("y"), range(1, 13)), (12,), "int8")
    lines = fm.visualize(many, max_side=2).splitlines()
    assert lines[1] == "stage 0: 12 moves" and lines[9] == "  … 5 more moves" and len(lines) == 11
    with pytest.raises(MeshError, match=r"`visualize` requires no axis= with a ReshardPlan"):
        fm.visualize(many, "x")


def test_command_line_prints_a_plan(capsys):
    from functional_mesh.__main__ import main

    assert main(["plan", "--src", "dp=2,tp=2", "--src-spec", "None,tp", "--dst", "tp=4@4", "--dst-spec", "None,tp",
                 "--shape", "8,8", "--color", "never"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ReshardPlan((8, 8) x 4 bytes: Mesh(dp=2, tp=2) P(None, 'tp') -> Mesh(tp=4; devices 4..7) P(None, 'tp'), 1 stage)",
        "stage 0: 4 moves",
        "  0 -> 4  0:8, 0:2  64 bytes",
        "  1 -> 7  0:8, 6:8  64 bytes",
        "  2 -> 5  0:8, 2:4  64 bytes",
        "  3 -> 6  0:8, 4:6  64 bytes",
        "bytes_moved 256, max_send_bytes 64, moves 4, stages 1",
    ]
    # permuted destination ranks, no relays, another dtype
    assert main(["plan", "--src", "x=2", "--src-spec", "x", "--dst", "x=2", "--dst-devices", "1,0", "--dst-spec", "x",
                 "--shape", "4", "--dtype", "bfloat16", "--no-relays"]) == 0
    assert capsys.readouterr().out.splitlines()[2:4] == ["  0 -> 1  0:2  4 bytes", "  1 -> 0  2:4  4 bytes"]


@pytest.mark.parametrize("argv, message", [
    (["--src", "x=2@", "--dst", "x=2"], 'requires a non-negative int after @, like "tp=4@8", but got \'x=2@\''),
    (["--src", "x=2@4", "--src-devices", "4,5", "--dst", "x=2"], "requires either @START or --src-devices"),
    (["--src", "x=2", "--dst", "x=2", "--dtype", "float33"], "`plan_reshard` requires a known dtype name"),
    (["--src", "x=2", "--src-spec", "y", "--dst", "x=2"], "requires an axis name of the mesh, but got axis='y'"),
])
def test_command_line_names_the_bad_value(argv, message, capsys):
    from functional_mesh.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["plan", *argv, "--shape", "4"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
