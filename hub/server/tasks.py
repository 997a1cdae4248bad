"""The hub's owned background work: the top-level TaskGroup's handle, and in-flight counts.

:class:`OwnedTasks` is the one place that knows the hub's top-level ``asyncio.TaskGroup``: the
appends a connection started, the presence writes, the A2A listener and kills run as its tasks,
so a client that disconnects or a shutdown never interrupts a write half-way, and shutdown
waits for every one of them. :class:`InFlight` bounds a connection's publishes in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["InFlight", "Outcome", "OwnedTasks", "settle"]

T = TypeVar("T")


class Outcome(Generic[T]):
    """The result or exception of an owned task (so the TaskGroup never sees it fail)."""

    __slots__ = ("error", "value")

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def unwrap(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


async def settle(coro: Coroutine[Any, Any, T]) -> Outcome[T]:
    """Await ``coro``; its exception (not a cancellation) becomes the outcome's error."""
    try:
        return Outcome(value=await coro)
    except Exception as e:
        return Outcome(error=e)


class OwnedTasks:
    """Tasks of the hub's top-level TaskGroup while it runs (:meth:`attach` … :meth:`detach`).

    Outside that window (before the hub runs, after it stopped) :meth:`spawn` refuses and
    :meth:`owned` runs the work in the caller."""

    __slots__ = ("_tg",)

    def __init__(self) -> None:
        self._tg: asyncio.TaskGroup | None = None

    def attach(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg

    def detach(self) -> None:
        self._tg = None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        """Run ``coro`` as a task of the group (it must not raise). Returns None (and closes
        ``coro``) when the group is not running or is shutting down."""
        tg = self._tg
        if tg is None:
            coro.close()
            return None
        try:
            return tg.create_task(coro, name=name)
        except RuntimeError:  # the group is shutting down
            coro.close()
            return None

    async def owned(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run as a task of the group: cancelling the caller (a connection
        closing) does not cancel it, and shutdown waits for it."""
        tg = self._tg
        if tg is None:
            return await coro
        wrapper = settle(coro)
        try:
            task = tg.create_task(wrapper)
        except RuntimeError:  # the group is shutting down: run it here
            wrapper.close()
            return await coro
        outcome = await asyncio.shield(task)
        return outcome.unwrap()


class InFlight:
    """A count of work in flight with a limit, and a way to wait until it drops below n."""

    __slots__ = ("_changed", "count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._changed = asyncio.Event()

    def release(self, n: int = 1) -> None:
        self.count -= n
        self._changed.set()

    async def wait_below(self, n: int) -> None:
        """Wait until fewer than ``n`` are in flight (at once if they are)."""
        while self.count >= n:
            self._changed.clear()
            await self._changed.wait()
