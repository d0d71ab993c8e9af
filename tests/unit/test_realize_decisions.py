"""The decision points of realize(), unit-tested without processes.

The CUDA/NCCL branches cannot run on our CPU-only CI; these tests pin what realize decides
there (device from LOCAL_RANK, NCCL bound to it, split_group vs new_group), and the gloo and
fake-backend branches that the multi-process suites then exercise for real.
"""

from __future__ import annotations

import datetime

import pytest

from functional_mesh import MeshError, make_mesh
from functional_mesh._agree import CHECK_TIMEOUT_ENV, _compare, as_check_timeout
from functional_mesh._realize_plan import (
    DefaultGroup,
    Surroundings,
    plan,
    InitPlan,
    creation_method,
    describe_options,
    per_axis,
    plan_init,
    resolve_backend,
)

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "3"}


@pytest.mark.parametrize(
    ("env", "cuda", "device_type", "backend", "expected"),
    [
        (TORCHRUN, True, None, None, InitPlan("nccl", "cuda", 3)),  # GPU node: NCCL bound to LOCAL_RANK
        (TORCHRUN, False, None, None, InitPlan("gloo", "cpu", None)),  # CPU node: gloo
        (TORCHRUN, True, "cpu", None, InitPlan("gloo", "cpu", None)),  # asked for cpu on a GPU node
        (TORCHRUN, True, "cuda", "gloo", InitPlan("gloo", "cuda", 3)),  # explicit backend wins
        ({**TORCHRUN, "LOCAL_RANK": "0"}, True, None, None, InitPlan("nccl", "cuda", 0)),
        ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, True, None, None, InitPlan("nccl", "cuda", 0)),
    ],
)
def test_plan_init(env, cuda, device_type, backend, expected):
    assert plan_init(env, cuda, device_type, backend) == expected


def test_plan_init_outside_torchrun_names_what_is_missing():
    with pytest.raises(MeshError, match=r"torchrun environment.*\['RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'\]"
                                        r".*run under torchrun"):
        plan_init({}, False, None, None)
    with pytest.raises(MeshError, match=r"missing environment variables=\['MASTER_PORT'\]"):
        plan_init({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, False, None, None)


def test_plan_init_rejects_cuda_without_gpu_and_unknown_device_types():
    with pytest.raises(MeshError, match=r"an available device type, but got device_type='cuda'; valid: 'cpu'"):
        plan_init(TORCHRUN, False, "cuda", None)
    with pytest.raises(MeshError, match=r"a supported device type, but got device_type='tpu'; valid: \('cpu', 'cuda'\)"):
        plan_init(TORCHRUN, False, "tpu", None)


@pytest.mark.parametrize(
    ("default", "device_type", "backend", "cuda", "expected"),
    [
        ("gloo", None, None, False, ("cpu", "gloo", None)),  # new_group(backend=None) = default's
        ("nccl", None, None, True, ("cuda", "nccl", None)),
        ("nccl", "cpu", None, True, ("cpu", "gloo", "gloo")),  # cpu groups under an NCCL job: gloo
        ("gloo", "cuda", None, True, ("cuda", "nccl", "nccl")),
        ("gloo", None, "gloo", False, ("cpu", "gloo", "gloo")),
        ("cpu:gloo,cuda:nccl", None, None, True, ("cuda", "cpu:gloo,cuda:nccl", None)),
        ("cpu:gloo,cuda:nccl", None, None, False, ("cpu", "cpu:gloo,cuda:nccl", None)),
        ("fake", None, None, False, ("cpu", "fake", None)),  # single-process simulation
        ("fake", "cuda", None, False, ("cuda", "fake", None)),
    ],
)
def test_resolve_backend(default, device_type, backend, cuda, expected):
    assert resolve_backend(default, device_type, backend, cuda) == expected


def test_resolve_backend_fake_refuses_a_real_backend():
    # new_group(backend="gloo") under the fake default group fails inside c10d (seen on torch 2.13)
    with pytest.raises(MeshError, match=r"backend=None under torch's fake process group, but got backend='gloo'"):
        resolve_backend("fake", None, "gloo", False)


ROWS_ASC = [(0, 1), (2, 3), (4, 5), (6, 7)]
ROWS_PERM = [(7, 6), (5, 4), (3, 2), (1, 0)]


@pytest.mark.parametrize(
    ("rows", "default", "backend", "bound", "expected"),
    [
        ([tuple(range(8))], "gloo", "gloo", False, "default"),  # whole world, ascending: reuse
        ([tuple(range(8))], "nccl", "gloo", True, "new_group"),  # other backend: a new group
        ([tuple(reversed(range(8)))], "gloo", "gloo", False, "new_group"),  # order differs: not the world
        # size-1 axis: no group on any backend (was "local": one singleton per rank, which on NCCL is a
        # real one-rank communicator, hundreds of MiB of GPU memory; docs/design.md "Size-1 axes")
        ([(0,), (1,), (2,)], "gloo", "gloo", False, "none"),
        ([(0,), (1,)], "nccl", "nccl", True, "none"),
        ([(0,)], "gloo", "gloo", False, "none"),  # a world of one: still no group (not the default group)
        (ROWS_ASC, "nccl", "nccl", True, "split"),  # NCCL bound to a device, ascending: one split
        (ROWS_ASC, "nccl", "nccl", False, "new_group"),  # not bound: split_group is unavailable
        (ROWS_PERM, "nccl", "nccl", True, "new_group"),  # split_group sorts members: keep mesh order
        (ROWS_ASC, "gloo", "gloo", False, "new_group"),
        (ROWS_ASC, "nccl", "gloo", True, "new_group"),  # gloo groups in an NCCL job
        (ROWS_ASC, "fake", "fake", True, "split"),  # the fake backend simulating a bound NCCL group
        (ROWS_ASC, "fake", "fake", False, "new_group"),
        (ROWS_ASC, "gloo", "gloo", True, "new_group"),  # only NCCL (or fake) splits here
    ],
)
def test_creation_method(rows, default, backend, bound, expected):
    world = 1 if rows == [(0,)] else 8
    assert creation_method(rows, world, default, backend, bound) == expected


@pytest.mark.parametrize(
    ("check", "env", "expected"),
    [(True, {}, 60.0), (False, {}, None), (5, {}, 5.0), (0.5, {}, 0.5), (True, {CHECK_TIMEOUT_ENV: "7"}, 7.0),
     (3, {CHECK_TIMEOUT_ENV: "7"}, 3.0)],
)
def test_as_check_timeout(check, env, expected):
    assert as_check_timeout(check, env) == expected


def test_check_timeout_errors():
    with pytest.raises(TypeError, match=r"check=True, False or a number of seconds, but got check='yes'"):
        as_check_timeout("yes", {})
    with pytest.raises(MeshError, match=r"a positive, finite check timeout, but got check=0.0"):
        as_check_timeout(0, {})
    with pytest.raises(MeshError, match=r"FUNCTIONAL_MESH_CHECK_TIMEOUT=.soon."):
        as_check_timeout(True, {CHECK_TIMEOUT_ENV: "soon"})


def test_compare_names_the_ranks_that_differ():
    values = {0: "a1 Mesh(dp=2)", 1: "a1 Mesh(dp=2)", 2: "b2 Mesh(tp=2)", 3: "a1 Mesh(dp=2)"}
    assert _compare("realize call #7", values) == (
        "realize call #7 differs across ranks: ranks [0, 1, 3] asked for Mesh(dp=2); ranks [2] asked for Mesh(tp=2)"
    )
    assert _compare("realize call #7", {0: "a x", 1: "a x"}) == ""


def test_a_whole_world_axis_borrows_the_default_group_only_with_its_settings():
    world = [tuple(range(8))]
    assert creation_method(world, 8, "gloo", "gloo", False) == "default"
    assert creation_method(world, 8, "gloo", "gloo", False, borrow=False) == "new_group"
    assert creation_method(world, 8, "nccl", "nccl", True, borrow=False) == "split"


class _Config:
    def __init__(self, ctas: int) -> None:
        self.max_ctas, self.net_name = ctas, "IB"


class _Options:
    """Stands for a backend's options object (no value equality, a nested config)."""

    def __init__(self, ctas: int = 4, high: bool = False) -> None:
        self.is_high_priority_stream, self.config, self._private = high, _Config(ctas), object()

    def method(self) -> None:  # pragma: no cover - never called
        pass


def test_options_are_compared_by_type_and_public_fields():
    assert describe_options(None) == "None"
    text = describe_options(_Options())
    assert text == "_Options(config=_Config(max_ctas=4, net_name='IB'), is_high_priority_stream=False)"
    assert describe_options(_Options()) == text  # equal fields, equal text: one group, one digest
    assert describe_options(_Options(ctas=8)) != text and describe_options(_Options(high=True)) != text


def test_per_axis_takes_one_value_or_a_mapping_with_defaults():
    mesh = make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    keys = ["dp", "cp", "tp", ("dp", "cp")]
    assert per_axis(mesh, keys, 3, "timeout", lambda v: v) == {k: 3 for k in keys}
    got = per_axis(mesh, keys, {"tp": 3, ("dp", "cp"): 5}, "timeout", lambda v: v)
    assert got == {"dp": None, "cp": None, "tp": 3, ("dp", "cp"): 5}
    assert per_axis(mesh, keys, {("cp",): 1}, "timeout", lambda v: v)["cp"] == 1  # a 1-tuple is the axis


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "inf", "nan"])
def test_a_bad_init_timeout_is_refused_naming_the_variable(raw):
    env = {**TORCHRUN, "FUNCTIONAL_MESH_INIT_TIMEOUT": raw}
    with pytest.raises(MeshError, match=r"`realize` requires a positive number of seconds in "
                                        r"\$FUNCTIONAL_MESH_INIT_TIMEOUT, but got FUNCTIONAL_MESH_INIT_TIMEOUT="):
        plan_init(env, False, None, None)


def test_the_start_up_bound_is_its_own_setting_never_an_axis_timeout():
    assert plan_init(TORCHRUN, False, None, None).timeout is None  # torch's default
    assert plan_init({**TORCHRUN, "FUNCTIONAL_MESH_INIT_TIMEOUT": "7.5"}, False, None, None).timeout == \
        datetime.timedelta(seconds=7.5)


# -- the whole plan of a call: pure, every argument checked before any effect -------------------------

def _found(default=None, env=TORCHRUN, cuda=False):
    """Surroundings without torch: a gloo world of 8 (or none yet, with the torchrun environment)."""
    return Surroundings(env, default, cuda, lambda b: b in ("gloo", "fake"), ("undefined", "gloo", "nccl", "fake"),
                        lambda pg: isinstance(pg, _Group))


class _Group:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _plan(mesh, found, **kwargs):
    args = dict(backend=None, timeout=None, pg_options=None, wait_s=60.0, products=(), axes=None,
                members_only=False, groups=None)
    return plan(mesh, kwargs.pop("device_type", None), **{**args, **kwargs}, found=found)


def test_the_plan_of_a_call_under_a_default_group():
    mesh = make_mesh((2, 4), ("dp", "tp"))
    p = _plan(mesh, _found(DefaultGroup("gloo", 8, 5)), products=[("dp", "tp")], timeout={"tp": 3})
    assert p.init is None and (p.world, p.rank, p.member) == (8, 5, True)
    assert (p.default_backend, p.device_type, p.backend) == ("gloo", "cpu", "gloo")
    assert [key for key, _, _ in p.families] == ["dp", "tp", ("dp", "tp")]
    assert [fam.size for _, fam, _ in p.families] == [2, 4, 8]
    assert p.settings["tp"].timeout == datetime.timedelta(seconds=3) and p.settings["dp"].timeout is None
    assert p.request.startswith("Mesh(dp=2, tp=4) [") and "products=(('dp', 'tp'),)" in p.request
    with pytest.raises(AttributeError):
        p.rank = 0  # frozen
    assert _plan(mesh, _found(DefaultGroup("gloo", 8, 5)), wait_s=None).request is None  # check=False
    assert _plan(mesh, _found(DefaultGroup("fake", 8, 5))).request is None  # the fake backend: nothing to compare


def test_the_plan_starts_the_default_group_first_when_none_exists():
    p = _plan(make_mesh((2, 4), ("dp", "tp")), _found(None), timeout=5)
    assert p.init is not None and (p.init.backend, p.init.device_type) == ("gloo", "cpu")
    assert p.init_timeout == datetime.timedelta(seconds=5)  # the default group's collectives, after start-up
    assert (p.world, p.rank, p.default_backend) == (8, 3, "gloo")  # torchrun's WORLD_SIZE and RANK


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(mesh=make_mesh((2, 8), ("dp", "tp"))), MeshError, r"devices that are ranks of the world \(0\.\.7\)"),
        (dict(timeout={"tpp": 1}), MeshError, r"did you mean 'tp'"),
        (dict(backend="mpi"), MeshError, r"a backend available in this torch build, but got backend='mpi'; "
                                         r"valid: \['gloo', 'fake'\]"),
        (dict(device_type="tpu"), MeshError, r"a supported device type"),
        (dict(device_type="cuda"), MeshError, r"an available device type"),
        (dict(products=[("dp", "dp")]), MeshError, r"distinct axis names"),
        (dict(groups={"pp": _Group(2, 0)}), MeshError, r"groups= keys that are realized axes"),
        (dict(groups={"tp": object()}), TypeError, r"a torch.distributed ProcessGroup"),
        (dict(members_only=True), MeshError, r"an initialised default group for members_only=True"),
    ],
)
def test_a_bad_argument_is_refused_by_the_plan_before_any_effect(kwargs, error, match):
    """With no default group yet: the plan raises, so realize neither starts one nor makes a group."""
    mesh = kwargs.pop("mesh", make_mesh((2, 4), ("dp", "tp")))
    with pytest.raises(error, match=match):
        _plan(mesh, _found(None), **kwargs)


def test_an_adopted_group_is_checked_by_the_plan():
    mesh, found = make_mesh((2, 4), ("dp", "tp")), _found(DefaultGroup("gloo", 8, 5))
    g = _Group(4, 1)
    assert dict(_plan(mesh, found, groups={"tp": g}).adopted) == {"tp": g}
    with pytest.raises(MeshError, match=r"an adopted group of axis 'tp''s size"):
        _plan(mesh, found, groups={"tp": _Group(2, 1)})
    with pytest.raises(MeshError, match=r"holds rank 5 at its coordinate along 'tp'"):
        _plan(mesh, found, groups={"tp": _Group(4, 0)})

