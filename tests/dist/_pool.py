"""A reusable pool of real gloo workers on loopback: spawn once, run many checks.

A fresh world-8 launch costs seconds on two cores (2.3 s at load 7, 12 s at load 30, once the
forkserver below is up) while one check inside a live world costs milliseconds (docs/design.md,
"Tests"), so the session keeps one pool per world size and every test module borrows it::

    w4 = pool_fixture(4)                    # module-scoped pytest fixture: the shared world-4 pool

    def check_sum(value):                   # a module-level function: runs on every rank
        t = torch.tensor([value])
        dist.all_reduce(t)
        return t.item()

    def test_sum(w4):
        assert w4.run(check_sum, 1) == [4, 4, 4, 4]   # one result per rank

A check is sent by reference (its module and qualified name) with picklable arguments; each
worker imports the module, calls the function and returns its value or the formatted
exception. ``run`` raises :class:`WorkerFailed` when any rank raised; ``outcomes`` returns
every rank's :class:`Outcome` for tests that expect exceptions.

Sharing: before a module gets the shared pool, :meth:`Pool.reset` clears what earlier modules
left on every rank (realize's cache, every group but the default one, dynamo's and DTensor's
caches, the default dtype, grad mode, the environment) and checks the ranks agree on what cannot be undone
(torch's group counter, the number of realize's checked calls); a rank that is still not clean
gets the pool killed and the module an error naming what was left. A module that breaks its
pool on purpose (killed or hung workers) or counts what a process holds (threads, descriptors)
asks for a pool of its own: ``pool_fixture(4, own=True)``.

Nothing here can hang a test:

- workers fork from multiprocessing's ``forkserver``, which imported torch and the library once
  (:data:`PRELOAD`; no torchrun), and run with ``OMP_NUM_THREADS=1``, a TCPStore that rank 0
  binds to a free port it picks itself (no port race), and a 30 s default-group timeout;
- every wait in the parent is bounded; a worker that dies or does not answer in time raises
  :class:`PoolError` naming the ranks, and the whole pool is killed (a hung collective cannot
  be cancelled) and re-spawned lazily by the next check;
- teardown is ``monitored_barrier`` (bounded), ``fm.clear_cache()``, ``destroy_process_group``,
  then a bounded join; stragglers are killed.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

HOST = "127.0.0.1"
GROUP_TIMEOUT_S = 30.0  # default group and store timeout inside the workers
# Bounds catch hangs; they do not measure speed. Measured on 2 cores at load ~30 (18 busy loops and
# other test runs): the first start 136 s (the forkserver importing PRELOAD: one process at a share
# of a core), a later world-8 start 12 s, tests/dist/test_collectives_gloo.py's forward_values 11-16 s.
CHECK_TIMEOUT_S = 60.0  # default bound on one check, in the parent
START_TIMEOUT_S = 300.0  # one start, the forkserver's import included (tests/conftest.py adds it to pytest-timeout)
CLOSE_TIMEOUT_S = 20.0
MAX_RESTARTS = 3  # re-spawns after a broken pool, per pool (each costs a launch)


class PoolError(RuntimeError):
    """The pool itself failed: a worker died, did not answer in time, or did not start."""


class Outcome(NamedTuple):
    """One rank's answer to a check."""

    rank: int
    ok: bool
    value: Any = None  # the check's return value when ok
    error_type: str = ""  # e.g. "functional_mesh.MeshError"
    message: str = ""  # str(exception)
    traceback: str = ""

    @property
    def error_name(self) -> str:
        return self.error_type.rsplit(".", 1)[-1]

    def describe(self) -> str:
        if self.ok:
            return f"rank {self.rank}: ok {self.value!r}"
        return f"rank {self.rank}: {self.error_type}: {self.message}\n{self.traceback}"


class WorkerFailed(AssertionError):
    """At least one rank raised inside a check; the message holds every failing traceback."""

    def __init__(self, name: str, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        bad = [o for o in outcomes if not o.ok]
        text = "\n".join(o.describe() for o in bad)
        super().__init__(f"check {name} raised on ranks {[o.rank for o in bad]}:\n{text}")


# What every worker would otherwise import for itself, ~5 CPU-s a process on these cores (torch ~2.6 s;
# the library's torch-facing modules, which bring DTensor, dynamo and sympy, ~2.7 s): the forkserver
# imports it once and every worker forks from it, already holding it.
PRELOAD = ["torch", "torch.distributed", "functional_mesh._realize", "functional_mesh._collectives",
           "functional_mesh._shard_map", "functional_mesh._interop"]


def _context() -> Any:
    """multiprocessing's ``forkserver`` context, preloading :data:`PRELOAD`.

    The server is one process per pytest session, started with the first pool: a clean
    single-threaded process that has imported torch and the library but made no group, no tensor
    op and no thread, so forking from it is safe (unlike forking the pytest process). A worker is
    then a fork, not a fresh interpreter importing torch: world 8 costs one import instead of eight.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _ref(fn: Callable[..., Any]) -> tuple[str, str]:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise TypeError(f"a check must be a module-level function importable by the workers, got {fn!r}")
    return module, qualname


def _resolve(module: str, qualname: str) -> Callable[..., Any]:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# -- the worker ----------------------------------------------------------------------------------


def _worker_main(rank: int, world: int, conn: mpc.Connection, sys_path: list[str]) -> None:
    """One rank: join the gloo world, then serve checks until told to close (or the parent dies)."""
    t0 = time.monotonic()
    os.environ["OMP_NUM_THREADS"] = "1"
    # Realize calls that keep check=True wait at most this long for a missing rank.
    os.environ.setdefault("FUNCTIONAL_MESH_CHECK_TIMEOUT", "20")
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    phases = {"import": time.monotonic() - t0}
    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    if rank == 0:
        store = dist.TCPStore(HOST, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        conn.send(("port", store.port))
        port = store.port
    else:
        if not conn.poll(START_TIMEOUT_S):
            return
        _, port = conn.recv()
        store = dist.TCPStore(HOST, port, world, is_master=False, timeout=timeout)
    phases["store"] = time.monotonic() - t0
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    phases["init"] = time.monotonic() - t0
    _START_ENV.update(os.environ)
    conn.send(("ready", rank, os.getpid(), phases))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone: leave without a collective
            os._exit(3)
        if msg[0] == "close":
            _close_worker(conn, msg[1])
            # The groups are destroyed; skip the interpreter's slow teardown of torch (~0.3 s a
            # process, serialised on two cores).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        _, seq, module, qualname, args, kwargs = msg
        try:
            value = _resolve(module, qualname)(*args, **kwargs)
            reply = (seq, True, value, "", "", "")
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            kind = type(e)
            reply = (seq, False, None, f"{kind.__module__}.{kind.__qualname__}", str(e), traceback.format_exc())
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            conn.send((seq, False, None, "PicklingError", f"result of {qualname} not picklable: {e!r}", ""))


def drop_groups() -> None:
    """On one rank: ``fm.clear_cache()`` and destroy every other group but the default one."""
    import torch.distributed as dist

    fm = sys.modules.get("functional_mesh")
    if fm is not None:
        fm.clear_cache()
    world = dist.group.WORLD
    for pg in [pg for pg in dist.distributed_c10d._world.pg_map if pg is not world]:
        dist.destroy_process_group(pg)


def fresh_caches() -> None:
    """On one rank: torch's caches as in a new process, where they were loaded at all.

    dynamo's compiled code and counters; DTensor's sharding propagation caches, which would
    otherwise answer an op on a mesh realized again after ``fm.clear_cache()`` with the output
    specs of the first, whose DeviceMesh (equal to the new one) names destroyed groups: "Could not
    resolve the process group registered under the name ...".
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        dynamo.utils.counters.clear()
    if "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()


_START_ENV: dict[str, str] = {}  # the worker's environment once its world is up (reset restores it)
RESET_BARRIER_S = 20.0


def _reset_worker() -> dict[str, Any]:
    """On one rank: drop what earlier checks left, then report the state the parent checks.

    Everything that can be undone is: realize's cache (``fm.clear_cache()``), every process group
    but the default one (a user's ``new_group``, a ``DeviceMesh``'s), torch's caches
    (:func:`fresh_caches`), the default dtype, grad mode, the environment. What cannot be undone is reported, for the
    parent to compare across ranks: torch's group counter (c10d names new groups by it, so ranks
    that differ would join the wrong groups) and the number of realize's checked calls (the
    divergence check pairs the ranks' calls by it).
    """
    import torch
    import torch.distributed as dist

    world = dist.group.WORLD
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=RESET_BARRIER_S), wait_all_ranks=True)
    drop_groups()
    fresh_caches()
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    for key in set(os.environ) - set(_START_ENV):
        del os.environ[key]
    os.environ.update(_START_ENV)

    fm = sys.modules.get("functional_mesh")
    agree = sys.modules.get("functional_mesh._agree")
    c10d = dist.distributed_c10d._world
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)  # the default group still works
    return {
        "other groups": sum(pg is not world for pg in c10d.pg_map),
        "realize's groups": fm.cache_info().groups if fm is not None else 0,
        "default dtype": str(torch.get_default_dtype()),
        "grad enabled": torch.is_grad_enabled(),
        "sum of ranks": int(total.item()),
        # equal on every rank, whatever their values
        "group counter": c10d.group_count,
        "realize check calls": agree._CALLS.get("realize", 0) if agree is not None else 0,
    }


def _close_worker(conn: mpc.Connection, barrier_s: float) -> None:
    import torch.distributed as dist

    error = ""
    t0 = time.monotonic()
    try:
        # Nobody leaves while another rank may still talk to it (a rank exiting early makes
        # gloo report "Connection closed by peer" on the others); bounded, unlike barrier().
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=barrier_s), wait_all_ranks=True)
        realize = sys.modules.get("functional_mesh._cache")
        if realize is not None:
            realize.clear_cache()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    with contextlib.suppress(Exception):
        conn.send(("bye", error, time.monotonic() - t0))


# -- the parent ----------------------------------------------------------------------------------


class Pool:
    """``world`` gloo workers on loopback, started once and reused for many checks."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.procs: list[Any] = []
        self.conns: list[mpc.Connection] = []
        self.broken = False
        self.restarts = 0
        self.launches = 0
        self.start_seconds: list[float] = []
        self.phases: list[dict[str, float]] = []  # per rank: seconds to import torch, join the store, init
        self._seq = 0

    # lifecycle

    def start(self) -> Pool:
        ctx = _context()
        t0 = time.monotonic()
        deadline = t0 + START_TIMEOUT_S  # one budget for the whole start; Process.start waits for the forkserver
        self.procs, self.conns = [], []
        for rank in range(self.world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(rank, self.world, child, list(sys.path)),
                               name=f"gloo-worker-{rank}/{self.world}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        self.launches += 1
        try:
            (port_msg,) = self._collect([0], deadline - time.monotonic(), "startup (rank 0 binding the store)",
                                        budget=START_TIMEOUT_S)
            for conn in self.conns[1:]:
                conn.send(port_msg)
            ready = self._collect(range(self.world), deadline - time.monotonic(), "startup (init_process_group)",
                                  budget=START_TIMEOUT_S)
            self.phases = [msg[3] for msg in ready]
        except BaseException:
            self.kill()
            raise
        self.broken = False
        self.start_seconds.append(time.monotonic() - t0)
        return self

    def kill(self) -> None:
        """Kill every worker now (a hung collective cannot be interrupted any other way)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self.broken = True

    def close(self) -> None:
        """Barrier, clear the realize cache, destroy the default group, join; kill stragglers."""
        if self.broken or not self.procs:
            self.kill()
            return
        problems = []
        for rank, conn in enumerate(self.conns):
            try:
                conn.send(("close", CLOSE_TIMEOUT_S / 2))
            except OSError as e:
                problems.append(f"rank {rank}: {e!r}")
        try:
            for rank, (_, error, _seconds) in zip(range(self.world), self._collect(range(self.world), CLOSE_TIMEOUT_S,
                                                                          "close")):
                if error:
                    problems.append(f"rank {rank}: {error}")
        except PoolError as e:
            problems.append(str(e))
        for proc in self.procs:
            proc.join(5)
        stragglers = [p.name for p in self.procs if p.is_alive()]
        self.kill()
        self.broken = False
        if stragglers:
            problems.append(f"killed stragglers {stragglers}")
        if problems:
            raise PoolError("pool teardown was not clean: " + "; ".join(problems))

    def reset(self) -> None:
        """Make the world clean for the next module (:func:`_reset_worker` on every rank), and check it.

        Raises:
            PoolError: a rank failed to reset or is not clean after it, or the ranks disagree on
                torch's group counter or realize's checked calls; the pool is killed first, so
                the module after gets a fresh one.
        """
        self._ensure()
        clean = {"other groups": 0, "realize's groups": 0, "default dtype": "torch.float32", "grad enabled": True,
                 "sum of ranks": self.world * (self.world - 1) // 2}
        try:
            states = self.run(_reset_worker, timeout=RESET_BARRIER_S + 10)
        except WorkerFailed as e:
            self.kill()
            raise PoolError(f"world-{self.world} pool: reset failed, the pool was killed:\n{e}") from None
        problems = [f"rank {rank}: {key} is {state[key]!r}, not {want!r}"
                    for rank, state in enumerate(states) for key, want in clean.items() if state[key] != want]
        for key in ("group counter", "realize check calls"):
            if len({repr(state[key]) for state in states}) > 1:
                problems.append(f"{key} differs between ranks: {[state[key] for state in states]}")
        if problems:
            self.kill()
            raise PoolError(f"world-{self.world} pool: an earlier module left state that reset cannot undo; "
                            "the pool was killed:\n" + "\n".join(problems))

    def _ensure(self) -> None:
        if self.broken or not self.procs:
            if self.restarts >= MAX_RESTARTS:
                raise PoolError(f"world-{self.world} pool broke {self.restarts} times; not restarting again")
            if self.procs or self.broken:
                self.restarts += 1
            self.start()

    # checks

    def outcomes(self, fn: Callable[..., Any], *args: Any, timeout: float = CHECK_TIMEOUT_S,
                 **kwargs: Any) -> list[Outcome]:
        """Run ``fn(*args, **kwargs)`` on every rank; every rank's :class:`Outcome`, by rank."""
        module, qualname = _ref(fn)
        self._ensure()
        self._seq += 1
        seq = self._seq
        for conn in self.conns:
            conn.send(("run", seq, module, qualname, args, kwargs))
        replies = self._collect(range(self.world), timeout, f"check {qualname}")
        out = []
        for rank, reply in enumerate(replies):
            if reply[0] != seq:
                self.kill()
                raise PoolError(f"rank {rank} answered request {reply[0]} instead of {seq}")
            out.append(Outcome(rank, *reply[1:]))
        return out

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = CHECK_TIMEOUT_S, **kwargs: Any) -> list[Any]:
        """Run ``fn`` on every rank; the per-rank return values, or :class:`WorkerFailed`."""
        outs = self.outcomes(fn, *args, timeout=timeout, **kwargs)
        if not all(o.ok for o in outs):
            raise WorkerFailed(fn.__qualname__, outs)
        return [o.value for o in outs]

    def _collect(self, ranks: Any, timeout: float, what: str, budget: float | None = None) -> list[Any]:
        """One message from each of ``ranks``, within ``timeout`` seconds in total (the rest of
        ``budget``, which the error names, when given)."""
        ranks = list(ranks)
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(ranks):
            pending = [r for r in ranks if r not in got]
            for r in pending:  # answers that already arrived, before looking at deaths
                if self.conns[r].poll():
                    got[r] = self._recv(r, what)
            pending = [r for r in ranks if r not in got]
            if not pending:
                break
            dead = [r for r in pending if not self.procs[r].is_alive() and not self.conns[r].poll()]
            if dead:
                codes = {r: self.procs[r].exitcode for r in dead}
                self.kill()
                raise PoolError(f"{what}: rank(s) {dead} died (exit codes {codes}) before answering")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise PoolError(f"{what}: rank(s) {pending} did not answer within {budget or timeout:g} s "
                                f"(answered: {sorted(got)}); the pool was killed")
            waitables = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            mpc.wait(waitables, timeout=min(remaining, 1.0))
        return [got[r] for r in ranks]

    def _recv(self, rank: int, what: str) -> Any:
        try:
            return self.conns[rank].recv()
        except (EOFError, OSError) as e:
            proc = self.procs[rank]
            proc.join(2)
            code = proc.exitcode
            self.kill()
            if code is not None:
                raise PoolError(f"{what}: rank(s) [{rank}] died (exit codes {({rank: code})}) "
                                "before answering") from None
            raise PoolError(f"{what}: lost the pipe to rank {rank}: {e!r}") from None


# -- shared pools --------------------------------------------------------------------------------

_SHARED: dict[int, Pool] = {}


def shared_pool(world: int) -> Pool:
    """The session's ``world``-rank pool (started by its first check), reset clean for its next user."""
    pool = _SHARED.setdefault(world, Pool(world))
    pool.restarts = 0  # MAX_RESTARTS counts per borrowing module
    pool.reset()
    return pool


@pytest.fixture(scope="session")
def shared_pools() -> Any:
    """The shared pools by world size; closes them at the end of the session (tests/conftest.py
    makes this fixture visible to every module)."""
    yield _SHARED
    problems = []
    for world in sorted(_SHARED):
        try:
            _SHARED.pop(world).close()
        except PoolError as e:
            problems.append(f"world {world}: {e}")
    if problems:
        raise PoolError("; ".join(problems))


def pool_fixture(world: int, *, own: bool = False) -> Any:
    """A module-scoped pytest fixture named ``w<world>``: a ``world``-rank pool for the module.

    By default the session's shared pool of that size, reset and checked clean first
    (:meth:`Pool.reset`). ``own=True``: a pool of the module's own, started for it and closed
    after it, for a module that breaks its pool on purpose or counts what a process holds.
    """
    if own:

        @pytest.fixture(scope="module", name=f"w{world}")
        def _own() -> Any:
            pool = Pool(world).start()
            try:
                yield pool
            finally:
                pool.close()

        return _own

    @pytest.fixture(scope="module", name=f"w{world}")
    def _shared(shared_pools: dict[int, Pool]) -> Any:
        return shared_pool(world)

    return _shared
