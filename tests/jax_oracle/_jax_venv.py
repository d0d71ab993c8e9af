"""The side venv that holds JAX for the oracle, which JAX judges the run, and where its venv lives.

Which JAX (:data:`CHOICE`, made once at import by :func:`choose`): JAX 0.12.0.1 needs a Python
>= 3.12. The first interpreter that reports one is used: the running Python, then ``python3.12``,
``python3.13``, ... and ``python3`` on the ``PATH``, then pyenv's versions
(``$PYENV_ROOT/versions/*/bin/python3.N``, ``PYENV_ROOT`` defaulting to ``~/.pyenv``), lowest
version first. Each candidate is asked for its version (a pyenv shim whose version is not
selected answers nothing and is passed over). Where none answers, the oracle falls back to
JAX 0.10.2 on the running Python. ``FM_JAX_ORACLE=0.10.2`` forces the fallback,
``FM_JAX_ORACLE=0.12.0.1`` demands the new JAX (skipped, loudly, without a Python for it). The
verdicts that differ between the two JAXes are keyed by version in ``programs.py``; each oracle
file checks that the JAX it ran is the one chosen, and ``conftest.py`` names it in the terminal
summary.

The venv (``<repo>/.venv-jax-<version>``, one per JAX so the two never clobber each other) is
made once and reused. :func:`jax_python` (a session-scoped fixture) returns the path of its
python. It is reused when its stamp file (written only after a successful ``pip install`` of the
pinned requirements) names the same requirements and ``import jax`` there reports the pinned
version; otherwise it is created (``python -m venv`` from the chosen interpreter) and installed.
When ``pip`` cannot install JAX (offline, no wheel for this platform, a timeout) the tests that
need it are skipped, loudly: a ``UserWarning`` and a line in the terminal summary
(``conftest.py``), because a silently skipped oracle looks exactly like a passing one. A venv that
installed but cannot import jax is a failure, not a skip.

Every subprocess has a bounded timeout; two pytest processes creating the venv at once are
serialised by a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import pytest

from tests.jax_oracle.programs import JAX_FALLBACK, JAX_NEW

REPO = Path(__file__).resolve().parents[2]
NEW_PYTHON = (3, 12)  # JAX_NEW's Requires-Python
PROBE_TIMEOUT_S = 30
VENV_TIMEOUT_S = 300  # ensurepip took over 120 s on 2 loaded cores
INSTALL_TIMEOUT_S = 600
IMPORT_TIMEOUT_S = 120
SETUP_BUDGET_S = VENV_TIMEOUT_S + INSTALL_TIMEOUT_S + IMPORT_TIMEOUT_S  # the worst case of jax_python

# Reasons the oracle was skipped in this session; conftest.py prints them in the terminal summary.
SKIPPED: list[str] = []
# The JAX that judged this session (set when a test first gets the venv's python); conftest.py says it.
JUDGED: list[str] = []

Probe = Callable[[str], tuple[tuple[int, int], str] | None]


@dataclass(frozen=True)
class Choice:
    """Which JAX judges the run: its version, the interpreter its venv is made from, and why."""

    version: str
    python: str | None  # None: no interpreter for ``version`` (the oracle is skipped, saying ``why``)
    why: str


def probe(candidate: str) -> tuple[tuple[int, int], str] | None:
    """``candidate``'s ``(major, minor)`` and real executable, or None where it does not answer
    (absent, a pyenv shim with no version selected, no ``venv`` module)."""
    if candidate == sys.executable:  # the running Python answers without a subprocess
        import importlib.util
        here = (sys.version_info[0], sys.version_info[1])
        return (here, sys.executable) if importlib.util.find_spec("venv") else None
    code = "import sys, venv; print(sys.version_info[0], sys.version_info[1], sys.executable)"
    try:
        proc = subprocess.run([candidate, "-c", code], check=False, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = proc.stdout.split(maxsplit=2)
    if proc.returncode or len(words) != 3 or not (words[0].isdigit() and words[1].isdigit()):
        return None
    return (int(words[0]), int(words[1])), words[2].strip()


def candidates(path: str, pyenv_root: str, running: str) -> list[str]:
    """Where to look for a Python >= 3.12, in order: the running one, ``python3.N`` (N = 12, 13, ...)
    then ``python3`` on ``path``, then pyenv's ``versions/*/bin/python3.N``, lowest version first."""
    found: list[str] = [running]
    dirs = [d for d in path.split(os.pathsep) if d]
    names = [f"python3.{n}" for n in range(NEW_PYTHON[1], 30)] + ["python3"]
    for name in names:
        for d in dirs:
            exe = Path(d) / name
            if exe.is_file() and os.access(exe, os.X_OK):
                found.append(str(exe))
                break
    versions = Path(pyenv_root) / "versions"
    pyenv: list[tuple[tuple[int, ...], str]] = []
    if versions.is_dir():
        for exe in versions.glob("*/bin/python3.*"):
            minor = exe.name[len("python3."):]
            if minor.isdigit() and int(minor) >= NEW_PYTHON[1] and os.access(exe, os.X_OK):
                key = tuple(int(p) if p.isdigit() else -1 for p in exe.parents[1].name.split("."))
                pyenv.append((key, str(exe)))
    found += [exe for _, exe in sorted(pyenv)]
    return list(dict.fromkeys(found))


def choose(environ: Mapping[str, str] | None = None, running: str | None = None,
           ask: Probe = probe) -> Choice:
    """The JAX that judges the run (see the module's docstring): ``JAX_NEW`` from the first
    candidate that reports Python >= 3.12, else ``JAX_FALLBACK`` on ``running``."""
    environ = os.environ if environ is None else environ
    running = sys.executable if running is None else running
    wanted = environ.get("FM_JAX_ORACLE", "").strip()
    if wanted not in ("", "auto", JAX_NEW, JAX_FALLBACK):
        raise ValueError(f"FM_JAX_ORACLE={wanted!r}: want {JAX_NEW}, {JAX_FALLBACK}, auto or unset")
    if wanted == JAX_FALLBACK:
        return Choice(JAX_FALLBACK, running, f"FM_JAX_ORACLE={JAX_FALLBACK} forces the fallback")
    pyenv_root = environ.get("PYENV_ROOT") or str(Path(environ.get("HOME") or Path.home()) / ".pyenv")
    looked = candidates(environ.get("PATH", ""), pyenv_root, running)
    for candidate in looked:
        answer = ask(candidate)
        if answer and answer[0] >= NEW_PYTHON:
            (major, minor), exe = answer
            return Choice(JAX_NEW, exe, f"Python {major}.{minor} at {exe}")
    none = (f"no Python >= {NEW_PYTHON[0]}.{NEW_PYTHON[1]} answered among {', '.join(looked)} (the running "
            f"Python, python3.N and python3 on PATH, {pyenv_root}/versions/*/bin/python3.N)")
    if wanted == JAX_NEW:
        return Choice(JAX_NEW, None, none)
    return Choice(JAX_FALLBACK, running, f"the fallback: {none}")


CHOICE = choose()
JAX_VERSION = CHOICE.version  # the JAX that judges this run
VENV = Path(os.environ.get("FM_JAX_VENV") or REPO / f".venv-jax-{JAX_VERSION}")  # the override is for testing the skip
REQUIREMENTS = (f"jax=={JAX_VERSION}", f"jaxlib=={JAX_VERSION}", "numpy")
STAMP = VENV / ".fm-jax-oracle-installed"


def judged_by() -> str:
    """One line: which JAX judges this run, and from which Python."""
    return f"jax {JAX_VERSION} in {VENV} ({CHOICE.why})"


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
    if CHOICE.python is None:
        _skip(CHOICE.why)
    with _lock():
        if STAMP.exists() and STAMP.read_text() == _stamp_text():
            ok, said = _imports_jax(python)
            if ok:
                return python
        if not python.exists():
            problem = _run([str(CHOICE.python), "-m", "venv", str(VENV)], VENV_TIMEOUT_S,
                           f"`{CHOICE.python} -m venv {VENV}`")
            if problem:
                shutil.rmtree(VENV, ignore_errors=True)  # a half-made venv would be taken for a made one
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
    python = ensure_jax_venv()
    JUDGED.append(judged_by())
    return python


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
