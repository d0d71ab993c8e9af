"""Shared test configuration: the two tiers, hypothesis profiles (docs/design.md, "Tests"), the shared
worker pools."""

import os
import re
import sys

import pytest
from hypothesis import HealthCheck, settings

from tests.dist._pool import START_TIMEOUT_S, shared_pools  # noqa: F401 - the session fixture behind every shared pool

# "ci" (default, in both tiers): ~50 examples, no deadline (2 shared cores are noisy), and
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

# Helper modules (tests/**/_name.py) hold no tests and no doctests, but --doctest-modules would import
# them: one imports accelerate, which lives in its own venv (make test-accelerate).
collect_ignore_glob = ["*/_[a-z]*.py"]

# Two tiers (README, "Test"). `make test-all` is plain `pytest`: every test. `make test` is the fast
# tier, `pytest -m "not slow"`: every test but those marked slow here, which are the ones that start
# processes of their own or build a venv: real gloo worlds, torchrun launches, the JAX oracle. Of
# those, one real gloo check per family stays in the fast tier (SMOKE).
SLOW_PATHS = ("tests/dist/", "tests/jax_oracle/", "tests/multinode/", "tests/test_examples_dist.py",
              "tests/gpu/", "tests/accelerate/test_gloo.py")
SLOW_FIXTURES = {"jax_python"}  # the JAX oracle's venv (tests/test_docs_migration_jax.py's JAX column)
SMOKE = {
    "realize": "tests/dist/test_realize_gloo.py::test_groups_reduce_and_gather_in_mesh_order_world4[permuted]",
    "collectives": "tests/dist/test_collectives_gloo.py::test_forward_values[permuted-composed]",
    "shard_map": "tests/dist/test_shard_map_gloo.py::test_gradients_dtensor_and_plain_typed_and_untyped",
    "ragged": "tests/dist/test_ragged_gloo.py::test_uneven_and_zero_counts_every_way_of_giving_sizes_and_gradients",
    "async": "tests/dist/test_async_gloo.py::test_issuing_returns_before_the_peers_have_issued[composed]",
    "reshard": "tests/dist/test_reshard_gloo.py::test_smoke_world4_disjoint",
}


# A pool fixture is named w<world> (tests/dist/_pool.py, pool_fixture). The test whose setup starts a
# pool spends up to START_TIMEOUT_S on it (the session's first start also waits for the forkserver to
# import torch and the library), which pytest-timeout counts against the test: a test that takes one
# gets that budget on top of its own, unless it has a timeout of its own.
POOL_FIXTURE = re.compile(r"w\d+")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: outside the fast tier (`make test`); `make test-all` runs it")


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    """Mark the slow tests; a smoke pick that names no collected test is an error, not a silent gap."""
    ids = {item.nodeid for item in items}
    per_test = float(config.getoption("timeout", None) or 0)
    for item in items:
        if per_test and item.get_closest_marker("timeout") is None and any(
                POOL_FIXTURE.fullmatch(name) for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.timeout(per_test + START_TIMEOUT_S))
        if item.nodeid not in SMOKE.values() and (
                item.nodeid.startswith(SLOW_PATHS) or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
    files = {nodeid.split("::")[0] for nodeid in ids}
    lost = [f"{family}: {nodeid}" for family, nodeid in SMOKE.items()
            if nodeid.split("::")[0] in files and nodeid not in ids]
    if lost:
        raise pytest.UsageError(f"tests/conftest.py's SMOKE names tests that were not collected: {lost}")


def pytest_terminal_summary(terminalreporter):
    """How many slow tests the fast tier left to `make test-all`; after a run that included tests/fuzz:
    how many fuzz calls were made, valid and bad."""
    deselected = len(terminalreporter.stats.get("deselected", []))
    if deselected and terminalreporter.config.option.markexpr == "not slow":
        terminalreporter.write_line(f"fast tier: {deselected} slow tests left out; `make test-all` runs every test")
    harness = sys.modules.get("tests.fuzz._harness")
    if harness is not None and sum(harness.COUNTS.values()):
        counts = harness.COUNTS
        terminalreporter.write_line(
            f"fuzz: {sum(counts.values())} calls of public entry points ({counts['valid']} valid, "
            f"{counts['bad']} bad) under the {settings.default.max_examples}-example "
            f"'{os.environ.get('HYPOTHESIS_PROFILE', 'ci')}' profile")
