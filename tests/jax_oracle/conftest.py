"""The JAX oracle's fixtures, and a loud line in the terminal summary when it was skipped."""

from __future__ import annotations

from tests.jax_oracle._jax_venv import SKIPPED, jax_python  # noqa: F401 - the fixture, for this folder


def pytest_terminal_summary(terminalreporter) -> None:
    """A skipped oracle must not look like a passing one: say so in red at the end of the run."""
    for reason in dict.fromkeys(SKIPPED):
        terminalreporter.write_sep("!", "JAX oracle skipped", red=True, bold=True)
        for line in reason.splitlines():
            terminalreporter.write_line(line, red=True, bold=True)
