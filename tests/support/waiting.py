"""Wait for a condition, never for a time: poll until it holds, within a bound generous enough
for a loaded 2-core CI machine (a slow run is not a failure; a condition never met is)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Final

WAIT_S: Final = 30.0
"""The default bound of :func:`wait_for`, in seconds."""

POLL_S: Final = 0.02


async def wait_for(
    predicate: Callable[[], object | Awaitable[object]], within: float = WAIT_S
) -> None:
    """Poll ``predicate`` (sync, or async: its result is awaited) until it is truthy; raise
    AssertionError after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s: {predicate!r}")
        await asyncio.sleep(POLL_S)
