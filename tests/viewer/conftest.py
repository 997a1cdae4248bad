"""Fixtures of the browser tests: a real ``agora serve`` (HTTP port on: the viewer is there)
and headless Debian Chromium driven by Playwright (tests/viewer/browser.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.hub import HubProcess, HubStarter
from tests.viewer.browser import Browser, open_browser


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path)
    yield starter.start(a2a_port=0)
    starter.close()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    async with open_browser(tmp_path) as b:
        yield b
