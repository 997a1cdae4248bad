"""Headless Chromium for the viewer's browser tests: Debian's ``/usr/bin/chromium`` through
Playwright's ``executable_path`` (no browser is downloaded), a page per test, sign-in, and
screenshots kept as test output.

Screenshots go to ``$AGORA_SCREENSHOT_DIR`` when set (``AGORA_SCREENSHOT_DIR=docs/img``
refreshes the ones docs/viewer.md shows), else to the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.support.require import require_chromium

if TYPE_CHECKING:  # imported lazily: without playwright the tests skip instead of erroring
    from playwright.async_api import Page

TIMEOUT_MS: Final = 20_000
"""What a page may take to show a change (a loaded 2-core machine)."""


@dataclass
class Browser:
    page: Page
    shots: Path

    async def shot(self, name: str) -> Path:
        path = self.shots / f"viewer-{name}.png"
        await self.page.screenshot(path=str(path))
        return path


@contextlib.asynccontextmanager
async def open_browser(tmp_path: Path) -> AsyncIterator[Browser]:
    executable = require_chromium()
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=TIMEOUT_MS)
    shots = Path(os.environ.get("AGORA_SCREENSHOT_DIR") or tmp_path / "screenshots")
    os.makedirs(shots, exist_ok=True)
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=executable, headless=True, args=["--disable-gpu"]
        )
        try:
            context = await chromium.new_context(viewport={"width": 1400, "height": 860})
            context.set_default_timeout(TIMEOUT_MS)
            page = await context.new_page()
            yield Browser(page, shots)
        finally:
            await chromium.close()


async def sign_in(browser: Browser, http_url: str, token: str, path: str = "/ui/") -> None:
    """Open ``path`` and sign in with ``token`` (the WebSocket URL comes from config.json)."""
    from playwright.async_api import expect

    page = browser.page
    await page.goto(http_url + path)
    await expect(page.get_by_test_id("ws-url")).not_to_have_value("")
    await page.get_by_test_id("token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
