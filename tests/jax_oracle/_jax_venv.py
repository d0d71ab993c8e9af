"""The side venv that holds JAX for the oracle: ``<repo>/.venv-jax``, made once and reused.

:func:`jax_python` (a session-scoped fixture) returns the path of its python. The venv is
reused when its stamp file (written only after a successful ``pip install`` of the pinned
requirements) names the same requirements and ``import jax`` there reports the pinned version;
otherwise it is created (``python -m venv``) and installed. When ``pip`` cannot install JAX
(offline, no wheel for this platform, a timeout) the tests that need it are skipped, loudly:
a ``UserWarning`` and a line in the terminal summary (``conftest.py``), because a silently
skipped oracle looks exactly like a passing one. A venv that installed but cannot import jax
is a failure, not a skip.

Every subprocess has a bounded timeout; two pytest processes creating the venv at once are
serialised by a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from tests.jax_oracle.programs import JAX_VERSION

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FM_JAX_VENV") or REPO / ".venv-jax")  # the override is for testing the skip
REQUIREMENTS = (f"jax=={JAX_VERSION}", f"jaxlib=={JAX_VERSION}", "numpy")
STAMP = VENV / ".fm-jax-oracle-installed"
VENV_TIMEOUT_S = 120
INSTALL_TIMEOUT_S = 600
IMPORT_TIMEOUT_S = 120
SETUP_BUDGET_S = VENV_TIMEOUT_S + INSTALL_TIMEOUT_S + IMPORT_TIMEOUT_S  # the worst case of jax_python

# Reasons the oracle was skipped in this session; conftest.py prints them in the terminal summary.
SKIPPED: list[str] = []


class JaxOracleUnavailable(UserWarning):
    """pip could not install JAX into the side venv: the oracle tests are skipped."""


def python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp_text() -> str:
    return " ".join(REQUIREMENTS) + "\n"


def _imports_jax(python: Path) -> tuple[bool, str]:
    """Whether ``python`` imports the pinned jax; and what it said."""
    if not python.exists():
        return False, f"{python} does not exist"
    code = "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"
    try:
        proc = subprocess.run([str(python), "-c", code], check=False, capture_output=True, text=True,
                              timeout=IMPORT_TIMEOUT_S, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        return False, f"`import jax` did not finish within {IMPORT_TIMEOUT_S} s"
    said = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and proc.stdout.split() == [JAX_VERSION, JAX_VERSION], said


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    key = hashlib.sha1(str(VENV).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"fm-jax-venv-{key}.lock"
    with open(path, "w") as f:
        deadline = time.monotonic() + SETUP_BUDGET_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process held {path} for {SETUP_BUDGET_S} s") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], timeout: float, what: str) -> str | None:
    """Run ``cmd``; None when it succeeded, else why not (its output's tail)."""
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except subprocess.TimeoutExpired:
        return f"{what} did not finish within {timeout} s"
    except OSError as e:
        return f"{what} could not start: {e}"
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return f"{what} exited with {proc.returncode}:\n{tail}"
    return None


def ensure_jax_venv() -> Path:
    """The python of a side venv with the pinned JAX; ``pytest.skip`` (loudly) when pip cannot install it."""
    python = python_of(VENV)
    with _lock():
        if STAMP.exists() and STAMP.read_text() == _stamp_text():
            ok, said = _imports_jax(python)
            if ok:
                return python
        if not python.exists():
            problem = _run([sys.executable, "-m", "venv", str(VENV)], VENV_TIMEOUT_S, f"`python -m venv {VENV}`")
            if problem:
                _skip(problem)
        STAMP.unlink(missing_ok=True)
        problem = _run([str(python), "-m", "pip", "install", *REQUIREMENTS], INSTALL_TIMEOUT_S,
                       f"`pip install {' '.join(REQUIREMENTS)}`")
        if problem:
            _skip(problem)
        ok, said = _imports_jax(python)
        if not ok:
            pytest.fail(f"pip installed {' '.join(REQUIREMENTS)} into {VENV}, but `import jax` there fails or "
                        f"reports another version:\n{said}", pytrace=False)
        STAMP.write_text(_stamp_text())
    return python


def _skip(problem: str) -> None:
    reason = (f"JAX ORACLE SKIPPED: could not install {' '.join(REQUIREMENTS)} into {VENV}: {problem}\n"
              "fm.shard_map is NOT checked against JAX in this run.")
    SKIPPED.append(reason)
    warnings.warn(reason, JaxOracleUnavailable, stacklevel=2)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def jax_python() -> Path:
    """Path of the side venv's python, with ``jax`` and ``jaxlib`` pinned at ``JAX_VERSION``."""
    if SKIPPED:  # a previous test of this session already tried and failed: don't pay pip again
        pytest.skip(SKIPPED[0])
    return ensure_jax_venv()


def run_jax_side(jax_python: Path, command: list[str], out: Path, label: str, timeout_s: float,
                 fields: Any) -> dict[str, Any]:
    """Run the JAX side (``jax_python *command out``) on 8 host devices and load what it saved:
    ``{"__meta__": meta, name: {"outputs", "grads", **fields(info)}}``; a timeout or a nonzero exit
    fails the test with the side's output."""
    import json

    import numpy as np

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()}
    try:
        proc = subprocess.run([str(jax_python), *command, str(out)], check=False, capture_output=True, text=True,
                              timeout=timeout_s, cwd=REPO, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{label} did not finish within {timeout_s} s", pytrace=False)
    if proc.returncode:
        pytest.fail(f"{label} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-5000:]}", pytrace=False)
    with np.load(out, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        results: dict[str, Any] = {"__meta__": meta}
        for name, info in meta["programs"].items():
            results[name] = {"outputs": [z[f"{name}/out/{i}"] for i in range(info["n_out"])],
                             "grads": [z[f"{name}/grad/{j}"] for j in range(info["n_grad"])], **fields(info)}
    return results
