"""Shared test configuration: hypothesis profiles (docs/design.md, "Tests") and import hygiene."""

import os
import sys

from hypothesis import HealthCheck, settings

# "ci" (default, inside `make test`): ~50 examples, no deadline (2 shared cores are noisy), and
# derandomized: every run draws the same examples, so a red CI means a change broke something, not
# that hypothesis found an old bug by chance. Random exploration is `make fuzz`'s job.
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
# "fuzz" (`make fuzz`): 500 examples per test; tests/fuzz has one test per public entry point, so
# a fuzz run makes well over 10,000 calls (the total is printed at the end of the run).
settings.register_profile(
    "fuzz", max_examples=500, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter):
    """After a run that included tests/fuzz: how many fuzz calls were made, valid and bad."""
    harness = sys.modules.get("tests.fuzz._harness")
    if harness is not None and sum(harness.COUNTS.values()):
        counts = harness.COUNTS
        terminalreporter.write_line(
            f"fuzz: {sum(counts.values())} calls of public entry points ({counts['valid']} valid, "
            f"{counts['bad']} bad) under the {settings.default.max_examples}-example "
            f"'{os.environ.get('HYPOTHESIS_PROFILE', 'ci')}' profile")
