"""Oracle for pending sums (unreduced values): ``fm.shard_map`` against JAX and against one process.

The programs are ``programs.UNREDUCED`` (mesh ``("dp", "tp") = (2, 4)``, float64), written for
JAX in ``jax_side.py`` (run once per session in the side venv, 8 host CPU devices, every axis
``AxisType.Explicit``, which JAX needs for unreduced types) and for us in ``fm_side.py`` (gloo
world 8, the full inputs as plain tensors on every rank). Each program's ``oracle`` says what our
run is held to, under the JAX that judges the run (``_jax_venv.JAX_VERSION``: 0.12.0.1, or the
0.10.2 fallback; a row's answer differs between them where ``programs.py`` gives both):

- "jax": JAX runs it; our results (``full_tensor()``; DTensors with the out_spec's placements,
  ``Partial("sum")`` where it is unreduced, and ``fm.sharding_of`` saying so), the gradients of
  ``sum_i sum(out_i * cot_i)`` with respect to every full input, and the types ``fm.typeof``
  gives the noted values all equal JAX's (``jax.typeof``);
- "jax and one process": the same, and also equal to the program in plain torch on one process;
- "one process": JAX refuses it (``div`` without a denominator cast to="reduced", ``dot_general``,
  a factor not cast to="reduced", a gradient it cannot type; under 0.10.2 also ``neg`` and ``sub``)
  but it is linear and we allow it: our results and
  gradients equal one process (``fm_side.UR_REFERENCES``: the sum of the members written out);
- "both refuse": JAX raises, and we raise a ``VmaError`` on every rank, the same message, which
  names the op (or the out_spec), the axis and the fix;
- "we refuse, JAX 0.10.2 runs it" (the fallback only): a varying result under an unreduced out_spec,
  which 0.10.2 cast implicitly and 0.12 refuses as we do; our ``VmaError`` is checked as above.

The ``rd_*`` programs are JAX 0.12's ``reduced`` (``pcast(to="reduced")``, ``P(reduced=)``: an argument
enters as a Replicate DTensor, its gradient leaves as ``Partial("sum")``), the ``mx_*``/``mn_*`` ones its
pending max/min (``P(unreduced=, unreduced_kind=)``: an argument enters as a ``Partial("max")`` DTensor);
JAX has no gradient of a pending max (``jax_grad=False``), so their gradients are held to one process.
JAX 0.10.2 has neither: under the fallback they are held to one process (or both refuse).

``test_jax_answers_as_the_table_says`` checks that JAX runs or refuses each program as the table
records (with its message), so the split above stays honest when JAX changes.
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
from tests.jax_oracle.programs import TOLERANCE, UNREDUCED, UnreducedProgram

JAX_RUN_TIMEOUT_S = 180
CHECK_TIMEOUT_S = 60  # one program on the pool, every rank
JAX_DRIVER = "import sys; from tests.jax_oracle import jax_side; sys.exit(jax_side.main_unreduced(sys.argv))"

pytestmark = pytest.mark.timeout(SETUP_BUDGET_S + JAX_RUN_TIMEOUT_S + 120)

w8 = pool_fixture(8)

BY_JAX = [p for p in UNREDUCED if not p.refuses(JAX_VERSION) and not p.fails]
PAST_JAX = [p for p in UNREDUCED if p.refuses(JAX_VERSION) and not p.fails]
REFUSED = [p for p in UNREDUCED if p.fails]
ONE_PROCESS = [p for p in UNREDUCED if p.one_process]


def _ids(p: UnreducedProgram) -> str:
    return p.name


@pytest.fixture(scope="session")
def jax_unreduced(jax_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every unreduced program's JAX results: ``{"__meta__": {...}, name: {"outputs", "grads", "error", "types"}}``."""
    out = tmp_path_factory.mktemp("jax_unreduced") / "jax.npz"
    return run_jax_side(jax_python, ["-c", JAX_DRIVER], out, "jax_side.main_unreduced", JAX_RUN_TIMEOUT_S,
                        lambda info: {"error": info["error"],
                                      "types": {k: tuple(list(a) for a in t) for k, t in info["types"].items()}})


def _run_ours(w8: Any, program: UnreducedProgram) -> list[dict[str, Any]]:
    try:
        return w8.run(fm_side.run_unreduced, program.name, timeout=CHECK_TIMEOUT_S)
    except WorkerFailed:
        w8.kill()  # not a MeshError: the ranks may have left a collective half done
        raise


def _compare(what: str, got: Any, want: Any, problems: list[str], against: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        problems.append(f"{what}: shape {got.shape}, {against} {want.shape}")
        return
    if not np.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
        worst = float(np.max(np.abs(got - want))) if got.size else 0.0
        problems.append(f"{what}: max |ours - {against}| = {worst:.3g}\n"
                        f"    ours {got.ravel()[:6]}\n    {against:4s} {want.ravel()[:6]}")


def _value_problems(program: UnreducedProgram, r: dict[str, Any], want: dict[str, Any], against: str) -> list[str]:
    """What is wrong with one rank's run, against ``want``'s outputs and gradients."""
    if r["error"] is not None:
        return [f"raised {r['error'][0]}: {r['error'][1]}"]
    problems: list[str] = []
    if len(r["outputs"]) != len(want["outputs"]):
        return [f"{len(r['outputs'])} results, {against} {len(want['outputs'])}"]
    for i, (kind_name, got, placements, same) in enumerate(r["placements"]):
        if kind_name != "DTensor" or not same:
            problems.append(f"result {i} is a {kind_name} with placements {got}, want a DTensor with {placements}")
    for i, (described, sharding, same) in enumerate(r["shardings"]):
        if not same:
            problems.append(f"result {i}: fm.sharding_of says {described}, want {sharding}")
    for i, (got, expected) in enumerate(zip(r["outputs"], want["outputs"])):
        _compare(f"result {i}", got, expected, problems, against)
    if against == "JAX" and not program.jax_grad:  # JAX has no gradient of a pending max: one process has
        return problems
    for j, (got, expected) in enumerate(zip(r["grads"], want["grads"], strict=True)):
        _compare(f"gradient of input {j}", got, expected, problems, against)
    return problems


def _assert_every_rank(program: UnreducedProgram, ranks: list[dict[str, Any]], check: Any) -> None:
    by_problem: dict[str, list[int]] = {}
    for r in ranks:
        for problem in check(r):
            by_problem.setdefault(problem, []).append(r["rank"])
    assert not by_problem, f"{program.name} [{program.oracle(JAX_VERSION)}] ({program.about}):\n" + "\n".join(
        f"  ranks {on}: {problem}" if on else f"  {problem}" for problem, on in list(by_problem.items())[:16])


# -- JAX itself ------------------------------------------------------------------------------------------


def test_jax_side_ran_every_unreduced_program(jax_unreduced: dict[str, Any]) -> None:
    meta = jax_unreduced["__meta__"]
    assert meta["jax"] == JAX_VERSION, meta  # the JAX _jax_venv.choose() picked judged the run
    assert sorted(meta["programs"]) == sorted(programs.UNREDUCED_BY_NAME)
    # the table covers each kind of answer
    assert BY_JAX and PAST_JAX and REFUSED


@pytest.mark.parametrize("program", UNREDUCED, ids=_ids)
def test_jax_answers_as_the_table_says(program: UnreducedProgram, jax_unreduced: dict[str, Any]) -> None:
    jax, refuses = jax_unreduced[program.name], program.refuses(JAX_VERSION)
    if not refuses:
        assert jax["error"] is None, f"{program.name}: the table says JAX runs it, JAX raised {jax['error']}"
        assert len(jax["outputs"]) == len(program.out_specs)
        assert len(jax["grads"]) == (len(program.shapes) if program.jax_grad and program.grad else 0)
        noted = program.noted()
        assert {k: jax["types"].get(k) for k in noted} == noted, (
            f"{program.name}: JAX's types {jax['types']}, the table says {noted}")
    else:
        assert jax["error"] is not None, f"{program.name}: the table says JAX refuses it, JAX ran it"
        assert re.search(refuses, jax["error"][1]), (
            f"{program.name}: JAX {JAX_VERSION} raised {jax['error'][0]}: {jax['error'][1][:600]}, "
            f"the table expects {refuses!r}")


# -- ours ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("program", BY_JAX, ids=_ids)
def test_unreduced_matches_jax(program: UnreducedProgram, jax_unreduced: dict[str, Any], w8: Any) -> None:
    jax = jax_unreduced[program.name]
    assert jax["error"] is None, f"JAX raised {jax['error']}"  # test_jax_answers_as_the_table_says says more

    def check(r: dict[str, Any]) -> list[str]:
        problems = _value_problems(program, r, jax, "JAX")
        if r["error"] is None:
            for key, jax_type in jax["types"].items():
                got = r["types"].get(key)
                if got is None or tuple(map(list, got)) != tuple(map(list, jax_type)):
                    problems.append(f"type of {key!r}: fm.typeof gives (varying, unreduced, reduced) = {got}, "
                                    f"jax.typeof {jax_type}")
        return problems

    _assert_every_rank(program, _run_ours(w8, program), check)


@pytest.mark.parametrize("program", ONE_PROCESS, ids=_ids)
def test_unreduced_matches_one_process(program: UnreducedProgram, w8: Any) -> None:
    want = fm_side.one_process_unreduced(program.name)
    _assert_every_rank(program, _run_ours(w8, program),
                       lambda r: _value_problems(program, r, want, "one process"))


@pytest.mark.parametrize("program", [p for p in ONE_PROCESS if not p.refuses(JAX_VERSION)], ids=_ids)
def test_one_process_reference_matches_jax(program: UnreducedProgram, jax_unreduced: dict[str, Any]) -> None:
    """Where JAX runs a program that has a one-process reference too, the two oracles agree (the
    references' way of writing out a pending sum is checked by JAX where JAX can)."""
    jax, want = jax_unreduced[program.name], fm_side.one_process_unreduced(program.name)
    problems: list[str] = []
    for i, (got, expected) in enumerate(zip(want["outputs"], jax["outputs"], strict=True)):
        _compare(f"result {i}", got, expected, problems, "JAX")
    for j, (got, expected) in enumerate(zip(want["grads"], jax["grads"] if program.jax_grad else want["grads"],
                                            strict=True)):
        _compare(f"gradient of input {j}", got, expected, problems, "JAX")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("program", REFUSED, ids=_ids)
def test_unreduced_refused_like_jax(program: UnreducedProgram, jax_unreduced: dict[str, Any], w8: Any) -> None:
    if program.refuses(JAX_VERSION):
        assert jax_unreduced[program.name]["error"] is not None
    # else: JAX 0.10.2 runs it and we refuse, as 0.12 does (test_jax_answers_as_the_table_says checks JAX's part)

    def check(r: dict[str, Any]) -> list[str]:
        if r["error"] is None:
            return [f"no error, but the table says we refuse it [{program.oracle(JAX_VERSION)}]"]
        name, message, _ = r["error"]
        problems = [] if name == "VmaError" else [f"{name} (want VmaError): {message}"]
        return problems + [f"the message does not match {pattern!r}: {message}" for pattern in program.message
                           if not re.search(pattern, message)]

    ranks = _run_ours(w8, program)
    _assert_every_rank(program, ranks, check)
    messages = {r["error"][1] for r in ranks if r["error"]}
    assert len(messages) == 1, f"the ranks raised different messages: {sorted(messages)}"
