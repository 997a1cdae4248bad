"""``require(service, available, why)``: skip a test whose service (docker, postgres) is missing
on this machine, but fail it when ``AGORA_REQUIRE`` lists the service (``.ci/run`` lists every
service the suite uses, tests/test_ci.py checks it, so a missing one never turns into a silent
skip there).
"""

from __future__ import annotations

import importlib.util
import os
import shutil

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


CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium, which the viewer's browser tests drive through Playwright (no browser is
ever downloaded; `.ci/services` installs the package)."""


def require_chromium() -> str:
    """The Chromium executable for Playwright; skip (or fail under ``AGORA_REQUIRE=chromium``)
    when it or the ``playwright`` package is missing."""
    path = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    require("chromium", path is not None, "Debian's chromium is not installed")
    require(
        "chromium",
        importlib.util.find_spec("playwright") is not None,
        "the playwright package is not installed",
    )
    assert path is not None
    return path


def require_node() -> str:
    """The ``npm`` executable (node >= 18); skip or fail under ``AGORA_REQUIRE=node``."""
    npm = shutil.which("npm")
    require("node", npm is not None and shutil.which("node") is not None, "node/npm missing")
    assert npm is not None
    return npm
