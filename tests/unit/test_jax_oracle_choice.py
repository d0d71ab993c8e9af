"""Which JAX judges the oracle (tests/jax_oracle/_jax_venv.py, ``choose``): JAX 0.12.0.1 from the
first interpreter that reports Python >= 3.12 (the running one, ``python3.N`` and ``python3`` on
PATH, then pyenv's versions, lowest first), else the JAX 0.10.2 fallback on the running Python.

The interpreters here are fake: shell scripts in temporary PATH and pyenv folders that print what
the probe asks for (major, minor, executable), or fail as a pyenv shim with no version selected
does. The probe really runs them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.jax_oracle import _jax_venv as jv
from tests.jax_oracle.programs import JAX10_NO_REDUCED, JAX_FALLBACK, JAX_NEW
from tests.jax_oracle.programs import UNREDUCED as ALL_ROWS

UNREDUCED = [p for p in ALL_ROWS if p.name.startswith("ur_")]  # the pending-sum rows (both JAXes have them)


def _fake(path: Path, version: tuple[int, int] | None) -> str:
    """An executable at ``path`` that answers the probe as Python ``version`` (None: fails, as a shim)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if version is None:
        body = "echo 'pyenv: python3.12: command not found' >&2\nexit 127\n"
    else:
        body = f"echo {version[0]} {version[1]} {path}\n"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def running(tmp_path: Path) -> str:
    """A running Python 3.11, as on this project's machines."""
    return _fake(tmp_path / "venv" / "bin" / "python", (3, 11))


def _env(tmp_path: Path, *path_dirs: str, **extra: str) -> dict[str, str]:
    return {"PATH": os.pathsep.join(str(tmp_path / d) for d in path_dirs), "HOME": str(tmp_path / "home"),
            **extra}


def test_python312_on_path_gives_jax_012(tmp_path: Path, running: str) -> None:
    exe = _fake(tmp_path / "bin" / "python3.12", (3, 12))
    _fake(tmp_path / "bin" / "python3.13", (3, 13))  # 3.12 is looked at first
    choice = jv.choose(_env(tmp_path, "empty", "bin"), running)
    assert (choice.version, choice.python) == (JAX_NEW, exe)
    assert "3.12" in choice.why


def test_a_shim_that_does_not_answer_is_passed_over_for_pyenv(tmp_path: Path, running: str) -> None:
    _fake(tmp_path / "shims" / "python3.12", None)
    root = tmp_path / "pyenv"
    _fake(root / "versions" / "3.13.0" / "bin" / "python3.13", (3, 13))
    low = _fake(root / "versions" / "3.12.1" / "bin" / "python3.12", (3, 12))
    _fake(root / "versions" / "3.11.7" / "bin" / "python3.11", (3, 11))  # never a candidate
    choice = jv.choose(_env(tmp_path, "shims", PYENV_ROOT=str(root)), running)
    assert (choice.version, choice.python) == (JAX_NEW, low)


def test_pyenv_root_defaults_to_home(tmp_path: Path, running: str) -> None:
    exe = _fake(tmp_path / "home" / ".pyenv" / "versions" / "3.13.0" / "bin" / "python3.13", (3, 13))
    assert jv.choose(_env(tmp_path, "empty"), running) == jv.Choice(JAX_NEW, exe, f"Python 3.13 at {exe}")


def test_path_comes_before_pyenv_and_python3_counts(tmp_path: Path, running: str) -> None:
    exe = _fake(tmp_path / "bin" / "python3", (3, 14))
    _fake(tmp_path / "home" / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3.12", (3, 12))
    assert jv.choose(_env(tmp_path, "bin"), running).python == exe


def test_a_running_python_312_is_used_itself(tmp_path: Path) -> None:
    me = _fake(tmp_path / "venv" / "bin" / "python", (3, 12))
    _fake(tmp_path / "bin" / "python3.13", (3, 13))
    assert jv.choose(_env(tmp_path, "bin"), me).python == me


def test_no_python_312_falls_back_to_jax_0102_on_the_running_python(tmp_path: Path, running: str) -> None:
    _fake(tmp_path / "bin" / "python3.12", None)
    _fake(tmp_path / "bin" / "python3", (3, 11))
    (tmp_path / "home" / ".pyenv" / "versions").mkdir(parents=True)
    choice = jv.choose(_env(tmp_path, "bin"), running)
    assert (choice.version, choice.python) == (JAX_FALLBACK, running)
    assert "no Python >= 3.12" in choice.why and "python3.12" in choice.why


def test_forcing_the_fallback_and_demanding_012(tmp_path: Path, running: str) -> None:
    _fake(tmp_path / "bin" / "python3.12", (3, 12))
    forced = jv.choose(_env(tmp_path, "bin", FM_JAX_ORACLE=JAX_FALLBACK), running)
    assert (forced.version, forced.python) == (JAX_FALLBACK, running)
    assert jv.choose(_env(tmp_path, "bin", FM_JAX_ORACLE="auto"), running).version == JAX_NEW
    demanded = jv.choose(_env(tmp_path, "empty", FM_JAX_ORACLE=JAX_NEW), running)
    assert (demanded.version, demanded.python) == (JAX_NEW, None)  # the oracle is then skipped, saying why
    with pytest.raises(ValueError, match="FM_JAX_ORACLE='0.11'"):
        jv.choose(_env(tmp_path, "bin", FM_JAX_ORACLE="0.11"), running)


def test_the_running_python_answers_without_a_subprocess() -> None:
    import sys

    assert jv.probe(sys.executable) == (tuple(sys.version_info[:2]), sys.executable)
    assert jv.probe("/nonexistent/python3.12") is None


def test_each_unreduced_row_answers_for_both_jaxes() -> None:
    """The rows whose answer moved between 0.10.2 and 0.12 (issue 35's nine, and the out_specs cast
    0.12 no longer inserts), and only those."""
    new = [p for p in ALL_ROWS if not p.name.startswith("ur_")]  # reduced and the kinds: new in 0.12
    assert new and all(p.refuses(JAX_FALLBACK) == JAX10_NO_REDUCED for p in new)
    assert all(p.one_process or p.fails for p in new)  # so the fallback still judges them
    moved = {p.name for p in UNREDUCED if p.refuses(JAX_NEW) != p.refuses(JAX_FALLBACK)}
    assert moved == {"ur_neg", "ur_sub", "ur_div_mean", "ur_div_by_pending", "ur_tanh", "ur_relu", "ur_exp",
                     "ur_pmax", "ur_pmin", "ur_out_varying"}
    runs_now = {p.name for p in UNREDUCED if not p.refuses(JAX_NEW) and p.refuses(JAX_FALLBACK)}
    assert runs_now == {"ur_neg", "ur_sub"}
    refused_now = {p.name for p in UNREDUCED if p.refuses(JAX_NEW) and not p.refuses(JAX_FALLBACK)}
    assert refused_now == {"ur_out_varying"}
    # we refuse only what JAX 0.12 refuses; what 0.10.2 runs and we refuse is this one row
    assert all(p.refuses(JAX_NEW) for p in UNREDUCED if p.fails)
    assert {p.name for p in UNREDUCED if p.fails and not p.refuses(JAX_FALLBACK)} == {"ur_out_varying"}
