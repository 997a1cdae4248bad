"""Real ``agora serve`` hubs for the client tests (:class:`tests.support.hub.HubProcess`: a free
port, a temporary data directory, the test secret). ``hub.token(...)`` mints tokens it accepts;
a hub can be killed with SIGKILL and restarted on the same port and data directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hub.client import Session, connect
from tests.support.hub import HubProcess, HubStarter


def _hub(root: Path, config: str | None = None) -> Iterator[HubProcess]:
    starter = HubStarter(root)
    yield starter.start(config)
    starter.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """A hub shared by the tests of a module (each test uses its own workspace)."""
    yield from _hub(tmp_path_factory.mktemp("hub"))


@pytest.fixture
def own_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub for one test (which may kill and restart it)."""
    yield from _hub(tmp_path)


SLOW_CONSUMER_CONFIG = """
[limits]
send_queue = 16
"""


@pytest.fixture
def small_queue_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub whose per-connection send queue is tiny, so a paused reader is cut with 4408."""
    yield from _hub(tmp_path, SLOW_CONSUMER_CONFIG)


RATE_LIMITED_CONFIG = """
[limits]
publish_rate = 20.0
publish_burst = 5
"""


@pytest.fixture
def limited_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub that lets each connection publish 5 events at once, then 20 per second."""
    yield from _hub(tmp_path, RATE_LIMITED_CONFIG)


@pytest.fixture
async def alice(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("alice")) as session:
        yield session


@pytest.fixture
async def bob(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("bob")) as session:
        yield session
