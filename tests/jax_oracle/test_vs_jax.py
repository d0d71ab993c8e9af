"""Oracle: ``fm.shard_map`` against ``jax.shard_map`` itself (docs/design.md, "Typed regions (shard_map)"), program by program.

Every program of ``programs.py`` is written twice: for JAX (``jax_side.py``, run once per
session in the side venv of ``_jax_venv.py``, 8 host CPU devices, ``AxisType.Auto``, float64,
``check_vma=True``) and for us (``fm_side.py``, run on a gloo world-8 pool, the full inputs as
plain tensors on every rank). For each program, on every rank:

- if JAX ran it: we run it too, and our results (``full_tensor()``, DTensors with the out_spec's
  placements) and the full gradients of ``sum_i sum(out_i * cot_i)`` with respect to every
  input equal JAX's to 1e-5;
- if JAX raised: we raise too, the same error on every rank: a ``VmaError`` for a type error
  (an op's check or the out_specs check), a ``MeshError`` for an argument whose dim its spec's
  axes do not divide (JAX's rule) or a spec that names an axis the region is not manual over
  (``axis_names=``), and our message matches the program's pinned regexes.

Another test checks that JAX raises exactly where the program table says it does, so the
table's expectations stay honest when JAX changes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.dist._pool import WorkerFailed, pool_fixture
from tests.jax_oracle import fm_side, programs
from tests.jax_oracle._jax_venv import JAX_VERSION, SETUP_BUDGET_S, run_jax_side
from tests.jax_oracle.programs import DIVISIBILITY, JAX_NEW, SPEC, TOLERANCE, VMA, Program

JAX_SIDE = Path(__file__).with_name("jax_side.py")
JAX_RUN_TIMEOUT_S = 180
CHECK_TIMEOUT_S = 60  # one program on the pool, every rank

# The first test pays for the side venv (at worst an install), the JAX run and the pool's start;
# each of those is bounded on its own.
pytestmark = pytest.mark.timeout(SETUP_BUDGET_S + JAX_RUN_TIMEOUT_S + 120)

w8 = pool_fixture(8)


@pytest.fixture(scope="session")
def jax_results(jax_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every program's JAX results: ``{"__meta__": {...}, name: {"outputs", "grads", "error", "kind"}}``."""
    out = tmp_path_factory.mktemp("jax_oracle") / "jax.npz"
    return run_jax_side(jax_python, [str(JAX_SIDE)], out, JAX_SIDE.name, JAX_RUN_TIMEOUT_S,
                        lambda info: {"error": info["error"], "kind": info["kind"]})


def test_jax_side_ran_every_program(jax_results: dict[str, Any]) -> None:
    meta = jax_results["__meta__"]
    assert meta["jax"] == JAX_VERSION, meta  # the JAX _jax_venv.choose() picked judged the run
    assert sorted(meta["programs"]) == sorted(programs.BY_NAME)
    # every error JAX raised is one this suite knows how to compare (a type check or divisibility)
    unknown = {name: info["error"] for name, info in meta["programs"].items() if info["kind"] == "other"
               and not _judged_elsewhere(programs.BY_NAME[name])}
    assert not unknown, unknown


def _judged_elsewhere(program: Program) -> bool:
    """The ``axis_names=`` programs are written to JAX 0.12's rules: the 0.10.2 fallback does not judge them."""
    return bool(program.axis_names) and JAX_VERSION != JAX_NEW


@pytest.mark.parametrize("program", programs.HAND_WRITTEN, ids=lambda p: p.name)
def test_jax_raises_where_the_table_says(program: Program, jax_results: dict[str, Any]) -> None:
    if _judged_elsewhere(program):
        pytest.skip(f"{program.name}: an axis_names= program, judged by JAX {JAX_NEW} only")
    jax = jax_results[program.name]
    assert jax["kind"] == program.fails, (
        f"{program.name} ({program.about}): the table expects {program.fails or 'no error'}, JAX gave "
        f"{jax['error'] or 'no error'}")
    if not program.fails:
        assert len(jax["outputs"]) == len(program.out_specs)
        assert len(jax["grads"]) == (len(program.shapes) if program.grad else 0)


def _runner(program: Program) -> tuple[Any, tuple[Any, ...]]:
    if program.generated:
        return fm_side.run_program, (program.name,)
    return getattr(fm_side, f"run_{program.name}"), ()


def _compare(what: str, got: np.ndarray, want: np.ndarray, problems: list[str]) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        problems.append(f"{what}: shape {got.shape}, JAX {want.shape}")
        return
    if not np.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
        worst = float(np.max(np.abs(got - want))) if got.size else 0.0
        problems.append(f"{what}: max |ours - JAX| = {worst:.3g}\n"
                        f"    ours {got.ravel()[:6]}\n    JAX  {want.ravel()[:6]}")


def _problems(program: Program, jax: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """What is wrong with one rank's run of ``program``, compared with JAX's."""
    problems: list[str] = []
    if jax["error"]:
        kind = program.fails or VMA  # a generated program can only fail a type check
        if r["error"] is None:
            return [f"no error, but JAX raised {jax['error'][0]}: {jax['error'][1][:600]}"]
        name, message, mro = r["error"]
        if kind == VMA and name != "VmaError":
            problems.append(f"{name} (want VmaError, a type error): {message}")
        if kind == DIVISIBILITY and "MeshError" not in mro:
            problems.append(f"{name} (want a MeshError): {message}")
        if kind == SPEC and name != "MeshError":  # a spec naming an axis the region is not manual over
            problems.append(f"{name} (want a MeshError, no type error): {message}")
        problems += [f"the message does not match {pattern!r}: {message}" for pattern in program.message
                     if not re.search(pattern, message)]
        return problems
    if r["error"] is not None:
        return [f"raised {r['error'][0]}: {r['error'][1]}"]
    if len(r["outputs"]) != len(jax["outputs"]):
        return [f"{len(r['outputs'])} results, JAX {len(jax['outputs'])}"]
    for i, (kind_name, got, want, same) in enumerate(r["placements"]):
        if kind_name != "DTensor" or not same:
            problems.append(f"result {i} is a {kind_name} with placements {got}, want a DTensor with {want}")
    for i, (got, want) in enumerate(zip(r["outputs"], jax["outputs"])):
        _compare(f"result {i}", got, want, problems)
    if program.grad:
        for j, (got, want) in enumerate(zip(r["grads"], jax["grads"], strict=True)):
            _compare(f"gradient of input {j}", got, want, problems)
    return problems


@pytest.mark.parametrize("program", programs.ALL, ids=lambda p: p.name)
def test_shard_map_matches_jax(program: Program, jax_results: dict[str, Any], w8: Any) -> None:
    if _judged_elsewhere(program):
        pytest.skip(f"{program.name}: an axis_names= program, judged by JAX {JAX_NEW} only")
    jax = jax_results[program.name]
    fn, args = _runner(program)
    try:
        ranks = w8.run(fn, *args, timeout=CHECK_TIMEOUT_S)
    except WorkerFailed:
        # Not a MeshError: the ranks may have left a collective half done. Start the next
        # program on a fresh world rather than let this failure leak into it.
        w8.kill()
        raise
    by_problem: dict[str, list[int]] = {}
    for r in ranks:
        for problem in _problems(program, jax, r):
            by_problem.setdefault(problem, []).append(r["rank"])
    messages = {r["error"][1] for r in ranks if r["error"]}
    if len(messages) > 1:
        by_problem[f"the ranks raised different messages: {sorted(messages)}"] = []
    assert not by_problem, f"{program.name} ({program.about}):\n" + "\n".join(
        f"  ranks {on}: {problem}" if on else f"  {problem}" for problem, on in list(by_problem.items())[:16])
