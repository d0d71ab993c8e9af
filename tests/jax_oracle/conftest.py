"""The JAX oracle's fixtures, and lines in the terminal summary: which JAX judged the run, and a loud
one when the oracle was skipped."""

from __future__ import annotations

from tests.jax_oracle._jax_venv import JUDGED, SKIPPED, jax_python  # noqa: F401 - the fixture, for this folder


def pytest_terminal_summary(terminalreporter) -> None:
    """Say which JAX the oracle's verdicts come from (0.12.0.1 or the 0.10.2 fallback); and a skipped
    oracle must not look like a passing one: say so in red at the end of the run."""
    for line in dict.fromkeys(JUDGED):
        terminalreporter.write_sep("=", f"JAX oracle: judged by {line}", bold=True)
    for reason in dict.fromkeys(SKIPPED):
        terminalreporter.write_sep("!", "JAX oracle skipped", red=True, bold=True)
        for line in reason.splitlines():
            terminalreporter.write_line(line, red=True, bold=True)
