"""Fixtures for black-box tests of the WebSocket hub over real sockets.

``hub`` is a real ``agora serve`` (:class:`tests.support.hub.HubProcess`: ``--port 0``, a
temporary data directory, the test secret), stopped with SIGTERM afterwards (exit 0 required).
``start_hub(config=...)`` starts more, e.g. with an ``agora.toml``. ``inproc_hub`` runs
:class:`hub.server.app.Hub` in the test's own loop, for tests that look inside (the fan-out's
counters). Clients are raw connections (:mod:`tests.support.peer`), never hub/client.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.hub import BANNER_TIMEOUT, HubProcess, HubStarter, StartHub
from tests.support.tokens import make_signer


@pytest.fixture
def start_hub(tmp_path: Path) -> Iterator[StartHub]:
    """``start_hub(config=None, data_dir=None)``: a running ``agora serve``; each is stopped
    with SIGTERM after the test (and must exit 0)."""
    starter = HubStarter(tmp_path)

    def start(config: str | None = None, data_dir: Path | None = None) -> HubProcess:
        return starter.start(config, data_dir=data_dir)

    yield start
    starter.close()


@pytest.fixture
def hub(start_hub: StartHub) -> HubProcess:
    """A real ``agora serve`` with the default configuration."""
    return start_hub()


@pytest.fixture
async def inproc_hub(tmp_path: Path) -> AsyncIterator[Any]:
    """A :class:`hub.server.app.Hub` served from this test's event loop (port chosen by the OS)."""
    from hub.config import HubConfig
    from hub.log.factory import open_store
    from hub.server.app import Hub

    config = HubConfig().with_overrides(port=0, data=tmp_path / "inproc")
    store = open_store(None, config.storage.data_dir)
    server = Hub(config, store, make_signer())
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(server.run(stop, on_ready=lambda _url: ready.set()))
    async with asyncio.timeout(BANNER_TIMEOUT):
        await ready.wait()
    try:
        yield server
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task
