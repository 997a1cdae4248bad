"""Fixtures for every test. What tests share besides fixtures is in tests/support/ (imported as
plain modules, never from a conftest); its assertions are rewritten like a conftest's, so a
failing check there explains itself."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

pytest.register_assert_rewrite("tests.support")

# No timing assertions, Hypothesis's included: on a loaded (shared, 2-core) machine a slow
# example or a slow draw is not a failure. Tests' own @settings add to this profile.
settings.register_profile("agora", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agora")
