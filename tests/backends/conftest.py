"""Fixtures for the backend tests: one ``rig`` per backend (:mod:`tests.backends.rigs`), so the
conformance suite runs the same test bodies on every backend (after httpcore's backend tests and
eventsourcing's per-recorder suites).

``rig`` is parametrized over ``process``, ``container`` (warm pool on: runs without a workspace
take warm containers) and ``container-cold`` (no pool: every run creates a container). The
container rigs ``require("docker", ...)``: skipped without an engine here, failed in CI.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

# The helpers' assertions explain themselves like a conftest's (before they are imported).
pytest.register_assert_rewrite("tests.backends.helpers", "tests.backends.rigs")

from tests.backends.rigs import Listener, Rig, open_rig  # noqa: E402  (after the registration)


@pytest.fixture(params=["process", "container", "container-cold"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    async with open_rig(request.param) as made:
        yield made


@pytest.fixture
async def process_rig() -> AsyncIterator[Rig]:
    async with open_rig("process") as made:
        yield made


@pytest.fixture(params=["container", "container-cold"])
async def container_rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    async with open_rig(request.param) as made:
        yield made


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    probe = Listener()
    server = await asyncio.start_server(probe.handle, "127.0.0.1", 0)
    probe.port = server.sockets[0].getsockname()[1]
    async with server:
        yield probe
