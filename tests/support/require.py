"""``require(service, available, why)``: skip a test whose service (docker, postgres) is missing
on this machine, but fail it when ``AGORA_REQUIRE`` lists the service (CI sets
``AGORA_REQUIRE=docker,postgres`` so a missing service can never turn into a silent skip there).
"""

from __future__ import annotations

import os

import pytest


def required_services() -> set[str]:
    """The services ``AGORA_REQUIRE`` (comma-separated) says must be there."""
    return {s.strip() for s in os.environ.get("AGORA_REQUIRE", "").split(",") if s.strip()}


def require(service: str, available: bool, why: str) -> None:
    """Skip (or, when CI requires the service, fail) if ``available`` is false."""
    if available:
        return
    if service in required_services():
        pytest.fail(f"{service} is required (AGORA_REQUIRE) but unavailable: {why}")
    pytest.skip(f"{service} unavailable: {why}")
