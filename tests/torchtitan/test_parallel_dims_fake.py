"""Our ParallelDims against torchtitan 0.3.0's own, under torch's single-process fake backend.

For every spmd_backend and a range of degrees, as two ranks of an 8-rank world: every view and
every single-axis mesh torchtitan hands out has the same names, the same submesh for this rank,
the same coordinate, for the axes torchtitan talks over the same group members, and the same
dims over which DTensor finds one flattened group (torchtitan's views share its world root and
its "loss_mesh"; ours carry those products themselves); our run
creates each distinct group once (torchtitan's calls are counted for comparison); torch's own
flatten for FSDP2 over dp_shard x cp finds our group instead of creating new ones.

Fake collectives carry no data: losses are compared on gloo (test_llama3_gloo.py).
"""

from __future__ import annotations

import itertools

import pytest

from ._titan import counting_groups, require_torchtitan

require_torchtitan()

import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.testing._internal.distributed.fake_pg import FakeStore

import functional_mesh as fm
from functional_mesh.integrations import torchtitan as fm_titan

WORLD = 8
DEGREES = [  # (dp_replicate, dp_shard, cp, tp, pp, ep)
    (2, 2, 1, 2, 1, 1),  # HSDP x TP: the gloo suite's case
    (1, 2, 2, 2, 1, 1),  # FSDP x CP x TP: FSDP2 flattens dp_shard x cp itself
    (2, 2, 2, 1, 1, 1),
    (1, 4, 1, 2, 1, 2),  # EP: efsdp and ep get real groups
    (2, 4, 1, 1, 1, 2),  # HSDP x EP: the gloo suite's MoE case; sparse (dp_replicate 2, efsdp 2, ep 2)
    (1, 2, 1, 2, 2, 1),  # PP: the gloo suite's pipeline case
    (2, 2, 1, 1, 2, 1),  # PP x HSDP
    (1, 2, 1, 2, 2, 2),  # PP x EP: the sparse view with every axis but dp_replicate
    (1, 4, 2, 1, 1, 4),  # CP x EP: ep borrows from dp_shard x cp
    (1, 8, 1, 1, 1, 1),
    (1, 1, 1, 8, 1, 1),
]
IDS = ["r{}s{}c{}t{}p{}e{}".format(*d) for d in DEGREES]


@pytest.fixture(autouse=True)
def cpu_device_type(monkeypatch):
    # CPU WORKAROUND: torchtitan's device_type is "cuda" on a machine without an accelerator, and
    # its build_mesh passes it to init_device_mesh. Ours follows the default group instead.
    import torchtitan.distributed.parallel_dims as titan_parallel_dims

    monkeypatch.setattr(titan_parallel_dims, "device_type", "cpu")


def start(rank: int) -> None:
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=WORLD, store=FakeStore())


@pytest.fixture(autouse=True)
def _stop():
    yield
    if dist.is_initialized():
        fm.clear_cache()
        dist.destroy_process_group()


def describe(pd) -> dict:
    """Everything torchtitan's code reads from a built ParallelDims, as plain values."""
    def mesh(dm, real: tuple[str, ...]) -> tuple:
        names = tuple(dm.mesh_dim_names)
        members = tuple(tuple(dist.get_process_group_ranks(dm.get_group(n))) if n in real else None for n in names)
        # The layout: what a pipeline stage compares when it rebuilds a DTensor's mesh by name (pipeline_llm's
        # get_mesh). Not for "loss", a mesh no DTensor lives on: ours is a root over its ranks (stride 1),
        # torchtitan's a flatten of its world root (stride 2 when it skips ranks); same ranks, same groups.
        layout = None if names == ("loss_mesh",) else repr(dm._layout)
        return names, dm.mesh.tolist(), dm.get_coordinate(), members, layout

    def real_of(dm) -> tuple[str, ...]:
        return tuple(n for n in dm.mesh_dim_names
                     if pd._mesh_exist("loss" if n == "loss_mesh" else n, dm.size(dm.mesh_dim_names.index(n))))

    def flattened(dm) -> list[tuple[str, ...]]:
        """The choices of 2+ dims for which DTensor finds one flattened group (torch 2.13's own search)."""
        from torch.distributed.tensor._redistribute import (
            _get_flattened_mesh_by_layout_impl,
        )

        names = dm.mesh_dim_names
        return [tuple(names[i] for i in dims) for k in range(2, len(names) + 1)
                for dims in itertools.combinations(range(len(names)), k)
                if all(dm.size(i) > 1 for i in dims) and _get_flattened_mesh_by_layout_impl(dm, dims) is not None]

    out = {"world": (pd.world_mesh.mesh.tolist(), pd.world_mesh.get_group() is not None)}
    out.update({f"view:{k}": mesh(v, real_of(v)) for k, v in pd._global_meshes.items()})
    out.update({f"flattened:{k}": flattened(v) for k, v in pd._global_meshes.items()})
    out.update({f"axis:{k}": mesh(v, real_of(v)) for k, v in pd._single_axis_meshes.items()})
    out["spmd_meshes"] = [(tuple(m.mesh_dim_names), m.mesh.tolist()) for m in pd.spmd_meshes()]
    out["one_dimensional"] = sorted(pd.get_all_one_dimensional_meshes())
    return out


def build(kind: str, backend: str, degrees: tuple[int, ...], *, fsdp: bool = True):
    from torchtitan.distributed.parallel_dims import ParallelDims

    r, s, c, t, p, e = degrees
    args = {"dp_replicate": r, "dp_shard": s, "cp": c, "tp": t, "pp": p, "ep": e, "world_size": WORLD,
            "spmd_backend": backend}
    with counting_groups() as calls:
        pd = fm_titan.parallel_dims(**args) if kind == "fm" else ParallelDims(**args)
        pd.build_mesh()
        if fsdp and backend != "partial_dtensor":  # what fully_shard does with the mesh (flattens dp_shard x cp)
            from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info
            from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

            mesh, dims = resolve_fsdp_mesh(pd)
            if dims is not None:
                _get_mesh_info(mesh, dims)
    return pd, calls


@pytest.mark.parametrize("backend", fm_titan.SPMD_BACKENDS)
@pytest.mark.parametrize("degrees", DEGREES, ids=IDS)
@pytest.mark.parametrize("rank", [0, 5])
def test_same_meshes_and_each_group_once(rank, degrees, backend):
    start(rank)
    theirs, their_calls = build("torchtitan", backend, degrees)
    expected = describe(theirs)
    start(rank)
    ours, our_calls = build("fm", backend, degrees)
    assert describe(ours) == expected

    # every group we made is one of torchtitan's real ones, or a singleton, or one of a fake axis
    # that got groups only because this functional_mesh cannot leave it out of a torch mesh
    their_real = {c["ranks"] for c in their_calls if c["backend"] != "fake"}
    fallback = {tuple(g) for view, axes in ours.extra_axes.items() for a in axes
                for g in ours.realized[view].mesh[a].groups().reshape(-1, ours.realized[view].mesh.axis_size(a))
                .tolist()}
    made = [c["ranks"] for c in our_calls if c["kind"] == "new_group"]
    assert len(made) == len(set(made)), "a rank set got two groups"
    assert all(m in their_real or len(m) == 1 or m in fallback for m in made), (made, their_real)
    assert not [c for c in our_calls if c["kind"] == "split_group"]  # gloo/fake: new_group only
    assert len(our_calls) <= len(their_calls)
    if not ours.extra_axes:  # every fake axis left out: no more groups than torchtitan's distinct real ones
        assert len([m for m in made if len(m) > 1]) <= len(their_real)


@pytest.mark.parametrize("backend", ["full_dtensor", "spmd_types"])
def test_fsdp_flattening_dp_shard_cp_finds_our_group(backend):
    """FSDP2 (torch's _get_mesh_info, as torchtitan's resolve_fsdp_mesh feeds it) flattens dp_shard x cp."""
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info
    from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

    counts = {}
    for kind in ("torchtitan", "fm"):
        start(3)
        pd, _ = build(kind, backend, (2, 2, 2, 1, 1, 1), fsdp=False)
        mesh, dims = resolve_fsdp_mesh(pd)
        assert dims.shard == ("dp_shard", "cp")
        with counting_groups() as calls:
            info = _get_mesh_info(mesh, dims)
        counts[kind] = len(calls)
        # rank 3 is (dp_replicate 0, dp_shard 1, cp 1): its dp_shard x cp group is ranks 0..3
        assert dist.get_process_group_ranks(info.shard_process_group) == [0, 1, 2, 3]
        if kind == "fm":
            assert info.shard_process_group is pd.realized["dense"].group(("dp_shard", "cp"))
    assert counts == {"torchtitan": 2, "fm": 0}


def test_adopt_keeps_the_degrees_and_refuses_built_meshes():
    from torchtitan.distributed.parallel_dims import ParallelDims

    start(0)
    pd = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, world_size=WORLD,
                      spmd_backend="full_dtensor")
    ours = fm_titan.adopt(pd, check=False)
    assert isinstance(ours, ParallelDims) and (ours.dp_shard, ours.tp) == (2, 2)
    assert ours.realize_options == {"check": False}
    assert ours.get_mesh(["dp_replicate", "dp_shard"]).mesh_dim_names == ("dp_replicate", "dp_shard")
    pd.build_mesh()
    with pytest.raises(fm.MeshError, match="whose meshes were not built yet"):
        fm_titan.adopt(pd)


def test_untested_torchtitan_version_is_a_mesh_error(monkeypatch):
    import torchtitan

    fm_titan._parallel_dims_class.cache_clear()
    monkeypatch.setattr(torchtitan, "__version__", "0.4.0")
    try:
        with pytest.raises(fm.MeshError, match=r"torchtitan.__version__='0.4.0'; valid: \['0.3.0'\]"):
            fm_titan.parallel_dims(world_size=8, dp_shard=8)
    finally:
        fm_titan._parallel_dims_class.cache_clear()


def test_bad_degrees_are_mesh_errors_before_torchtitan_asserts():
    with pytest.raises(fm.MeshError, match="product is world_size=8"):
        fm_titan.parallel_dims(world_size=8, dp_shard=3)
    with pytest.raises(fm.MeshError, match="ep to divide dp_shard"):
        fm_titan.parallel_dims(world_size=8, dp_shard=2, tp=4, ep=3)
    with pytest.raises(fm.MeshError, match="spmd_backend='dtensor'"):
        fm_titan.parallel_dims(world_size=8, dp_shard=8, spmd_backend="dtensor")
