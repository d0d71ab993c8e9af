"""Shared test configuration: hypothesis profiles (DESIGN.md §9) and import hygiene."""

import os

from hypothesis import HealthCheck, settings

# "ci" (default, inside `make test`): ~50 examples, no deadline (2 shared cores are noisy).
settings.register_profile("ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# "fuzz" (`make fuzz`): many more examples.
settings.register_profile("fuzz", max_examples=2_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
