"""Shared pytest setup: hypothesis profiles `dev` (default) and `ci` (derandomized), chosen by
the HYPOTHESIS_PROFILE environment variable (`make test` sets `ci`)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=50)
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
