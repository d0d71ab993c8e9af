"""visualize / visualize_sharding: read the pictures back and compare with the mesh's own
queries (coordinate, groups, local_slices), then pin the exact text with golden files.

Golden files live in tests/golden/; each was read and checked by hand when it was written.
``FM_UPDATE_GOLDEN=1 pytest tests/unit/test_visualize.py`` rewrites them after an intended
change of format (then read the diff).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import functional_mesh as fm
from functional_mesh import MeshError, UnknownAxisError

GOLDEN = Path(__file__).parent.parent / "golden"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_pages(text: str, mesh: fm.Mesh) -> dict[int, dict[str, int]]:
    """Parse visualize's pages: rank -> {axis: index} from page titles, row and column labels."""
    found: dict[int, dict[str, int]] = {}
    title: dict[str, int] = {}
    cols: list[dict[str, int]] = []
    for line in text.splitlines()[1:]:
        if line.startswith("groups of each axis") or line.startswith("no axes"):
            break
        fields = line.split()
        if all("=" in f or f == "group" or f.rstrip(",").isdigit() for f in fields) and not line.startswith(" "):
            # a page title ("group 1, dp=0") or a row; rows start with "name=i" followed by ranks
            if not any(re.fullmatch(r"\d+[a-z]*", f) for f in fields[1:]) or fields[0] == "group":
                title = {k: int(v) for k, v in (f.rstrip(",").split("=") for f in fields if "=" in f)}
                cols = []
                continue
        if line.startswith(" ") and all("=" in f for f in fields):
            cols = [dict([f.split("=")]) for f in fields]
            cols = [{k: int(v) for k, v in c.items()} for c in cols]
            continue
        row: dict[str, int] = {}
        cells = fields
        if fields and "=" in fields[0]:
            k, v = fields[0].split("=")
            row = {k: int(v)}
            cells = fields[1:]
        for j, cell in enumerate(cells):
            rank = int(re.match(r"\d+", cell)[0])
            coord = dict(title)
            coord.update(row)
            if cols:
                coord.update(cols[j])
            found[rank] = coord
    return found


@st.composite
def small_meshes(draw):
    ndim = draw(st.integers(0, 4))
    sizes = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    names = tuple(f"a{i}" for i in range(ndim))
    n = int(np.prod(sizes)) if sizes else 1
    devices = draw(st.permutations(range(n)))
    mesh = fm.make_mesh(sizes, names, devices=devices)
    if ndim >= 2 and draw(st.booleans()):  # a family: a selection of some axes
        keep = draw(st.lists(st.sampled_from(names), min_size=1, max_size=ndim, unique=True))
        mesh = mesh[tuple(keep)]
    return mesh


@given(small_meshes())
def test_every_rank_is_drawn_once_at_its_own_coordinate(mesh):
    text = fm.visualize(mesh, max_side=10_000)
    found = read_pages(text, mesh)
    assert sorted(found) == sorted(mesh.groups().reshape(-1).tolist())
    for rank, coord in found.items():
        expected = dict(zip(mesh.axis_names, mesh.coordinate(rank)))
        assert {k: v for k, v in coord.items() if k in expected} == expected


@given(small_meshes().filter(lambda m: m.ndim > 0), st.data())
def test_letters_mark_exactly_the_groups_of_the_axis(mesh, data):
    axis = data.draw(st.sampled_from(mesh.axis_names))
    text = fm.visualize(mesh, axis=axis, max_side=10_000)
    grid = text.split("groups of each axis")[0].splitlines()[1:]
    letters: dict[str, set[int]] = {}
    for line in grid:
        for cell in re.findall(r"(?<![=\w])(\d+)([a-z]+)\b", line):
            letters.setdefault(cell[1], set()).add(int(cell[0]))
    family = mesh[axis]
    expected = sorted(sorted(g) for g in family.groups().reshape(family.num_groups, -1).tolist())
    assert sorted(sorted(s) for s in letters.values()) == expected


def test_group_lists_follow_mesh_groups_and_elide_the_middle():
    mesh = fm.make_mesh((64, 8, 8), ("dp", "cp", "tp"))
    text = fm.visualize(mesh, max_side=4)
    tp_line = next(line for line in text.splitlines() if line.strip().startswith("tp  size"))
    first, second = mesh["tp"].groups().reshape(-1, 8)[:2].tolist()
    assert tp_line.startswith(f"  tp  size 8, 512 groups: [{first[0]} {first[1]} {first[2]} … {first[7]}] "
                              f"[{second[0]} {second[1]} {second[2]} … {second[7]}]")
    assert "… 508 more [4088 4089 4090 … 4095]" in tp_line
    assert "… 60 more pages …" in text
    assert len(text.splitlines()) < 60


def read_blocks(text: str) -> dict[int, tuple[tuple[int, int], ...]]:
    """Parse visualize_sharding's table: rank -> ((start, stop) per dim)."""
    lines = [line for line in text.splitlines()[1:] if not line.startswith("dim ")]
    header = re.findall(r"\d+:\d+", lines[0]) if lines and ":" in lines[0] and not re.search(
        r"^\d+:\d+(, \d+:\d+)*  ", lines[0]) else []
    body = lines[1:] if header else lines
    found = {}
    for line in body:
        row = re.match(r"^((?:\d+:\d+(?:, )?)*)\s+(.*)$", line)
        lead = tuple(tuple(map(int, s.split(":"))) for s in re.findall(r"\d+:\d+", row[1]))
        cells = re.split(r"\s{2,}", row[2].strip())
        for j, cell in enumerate(cells):
            for r in cell.split():
                last = (tuple(map(int, header[j].split(":"))),) if header else ()
                found[int(r)] = lead + last
    return found


@st.composite
def shardings(draw):
    mesh = draw(small_meshes().filter(lambda m: m.ndim > 0))
    rank = draw(st.integers(0, 3))
    free = list(mesh.axis_names)
    spec = []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(free))))
        axes = draw(st.permutations(free))[:k]
        for a in axes:
            free.remove(a)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 and draw(st.booleans()) else tuple(axes)))
    shape = tuple(draw(st.integers(0, 7)) for _ in range(rank))
    return fm.NamedSharding(mesh, fm.P(*spec)), shape


@given(shardings())
def test_every_rank_holds_the_block_local_slices_says(case):
    sharding, shape = case
    text = fm.visualize_sharding(sharding, shape, max_side=10_000)
    found = read_blocks(text)
    ranks = sharding.mesh.groups().reshape(-1).tolist()
    assert sorted(found) == sorted(ranks)
    for r in ranks:
        assert found[r] == tuple((s.start, s.stop) for s in sharding.local_slices(shape, r))


def test_uneven_and_empty_tails_are_listed_per_shard():
    mesh = fm.make_mesh((4,), ("x",))
    text = fm.visualize_sharding(fm.NamedSharding(mesh, fm.P("x")), (2,))
    assert "dim 0 splits 2 over x=4 into 1, 1, 0, 0 (uneven)" in text
    assert read_blocks(text) == {0: ((0, 1),), 1: ((1, 2),), 2: ((2, 2),), 3: ((2, 2),)}


def test_color_only_when_asked_and_the_plain_text_is_unchanged():
    mesh = fm.make_mesh((2, 2), ("a", "b"))
    plain = fm.visualize(mesh, axis="a")
    colored = fm.visualize(mesh, axis="a", color=True)
    assert "\x1b[" not in plain and "\x1b[31m" in colored
    assert ANSI.sub("", colored) == plain
    sh = fm.NamedSharding(mesh, fm.P("a", "b"))
    assert ANSI.sub("", fm.visualize_sharding(sh, (4, 4), color=True)) == fm.visualize_sharding(sh, (4, 4))


@pytest.mark.parametrize("call, error, message", [
    (lambda: fm.visualize("dp=2"), TypeError, r"`visualize` requires a functional_mesh.Mesh, but got mesh='dp=2'"),
    (lambda: fm.visualize(fm.make_mesh((2,), ("tp",)), axis="tpp"), UnknownAxisError, r"axis='tpp'.*did you mean 'tp'"),
    (lambda: fm.visualize(fm.make_mesh((2,), ("tp",)), color="yes"), TypeError, r"color='yes'"),
    (lambda: fm.visualize(fm.make_mesh((2,), ("tp",)), max_side=1), MeshError, r"max_side=1"),
    (lambda: fm.visualize_sharding(fm.P("tp"), (4,)), TypeError, r"sharding=P\('tp'\)"),
    (lambda: fm.visualize_sharding(fm.NamedSharding(fm.make_mesh((2,), ("tp",)), fm.P("tp")), (-1,)),
     MeshError, r"-1"),
    (lambda: fm.visualize_sharding(fm.NamedSharding(fm.make_mesh((2,), ("tp",)), fm.P(None, "tp")), (4,)),
     MeshError, r"\(4,\)"),
])
def test_bad_arguments_raise_naming_the_value(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _mesh3():
    return fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))


GOLDEN_CASES = {
    "mesh_3d_axis_tp": lambda: fm.visualize(_mesh3(), axis="tp"),
    "mesh_family_cp_tp": lambda: fm.visualize(_mesh3()["cp", "tp"]),
    "mesh_permuted_devices": lambda: fm.visualize(
        fm.Mesh.from_ranks([[7, 6, 5, 4], [3, 2, 1, 0]], ("dp", "tp")), axis="dp"),
    "mesh_large_elided": lambda: fm.visualize(fm.make_mesh((64, 8, 8), ("dp", "cp", "tp")), axis="cp", max_side=4),
    "mesh_colored": lambda: fm.visualize(fm.make_mesh((2, 2), ("dp", "tp")), axis="dp", color=True),
    "sharding_uneven_tuple": lambda: fm.visualize_sharding(fm.NamedSharding(_mesh3(), fm.P(("dp", "cp"), "tp")),
                                                           (5, 6)),
    "sharding_3d_tensor": lambda: fm.visualize_sharding(fm.NamedSharding(_mesh3(), fm.P("dp", None, "tp")),
                                                        (3, 2, 5)),
    "sharding_replicated_scalar": lambda: fm.visualize_sharding(fm.NamedSharding(_mesh3(), fm.P()), ()),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_pictures(name):
    text = GOLDEN_CASES[name]() + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("FM_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.read_text() == text


def test_a_taken_family_of_single_devices():
    # every group of mesh["tp"] keeps its second member: four groups of one device each
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))["tp"].take(tp=1)
    assert fm.visualize(mesh).splitlines() == [
        "Mesh((); 4 groups over devices 1..7 step 2): 4 devices",
        "group 0", "  1", "group 1", "  3", "group 2", "  5", "group 3", "  7",
        "no axes: one device per group",
    ]
    assert fm.visualize(fm.make_mesh((2,), ("dp",)).take(dp=1)).splitlines()[-1] == "no axes: one device, no groups"
