"""Shared test fixtures.

``require(service)`` skips a test whose service (docker, postgres) is missing on this machine,
but fails it when ``AGORA_REQUIRE`` lists the service (CI sets it to every service the suite
uses, so a missing service can never turn into a silent skip there).

Hypothesis runs without its wall-clock checks (no ``deadline``, no ``too_slow`` health check):
on a loaded 2-core machine they fail tests for the machine's speed, not for a bug.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "agora", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("agora")


def required_services() -> set[str]:
    return {s.strip() for s in os.environ.get("AGORA_REQUIRE", "").split(",") if s.strip()}


def require(service: str, available: bool, why: str) -> None:
    """Skip (or, when CI requires the service, fail) if ``available`` is false."""
    if available:
        return
    if service in required_services():
        pytest.fail(f"{service} is required (AGORA_REQUIRE) but unavailable: {why}")
    pytest.skip(f"{service} unavailable: {why}")
