"""Test-suite settings: one hypothesis profile, chosen explicitly so CI=true changes nothing."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Hypothesis loads its own "ci" profile when CI is set; registering and loading ours
# keeps what runs identical on a laptop and in CI (and derandomized: reproducible).
settings.register_profile(
    "kvconform",
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("kvconform-thorough", parent=settings.get_profile("kvconform"), max_examples=1000)
settings.load_profile(os.environ.get("KVCONFORM_HYPOTHESIS_PROFILE", "kvconform"))
