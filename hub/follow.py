"""Follow a workspace's log: history from the store, then live, with no gap and no duplicate.

One :class:`LogFollower` is a :class:`hub.workspaces.Workspaces` listener (called synchronously,
in seq order, with each committed batch). :meth:`LogFollower.follow` registers a bounded
buffer *before* it reads the store, reads everything after ``after_seq``, then drains the
buffer skipping what it already yielded. When a slow reader's buffer overflows it is not
dropped: the buffer is cleared and the reader catches up from the store again (the log is the
truth; the buffer is only a shortcut), so a follower never loses an event. Its reading
position is a :class:`hub.core.cursor.SeqCursor`, the same one the fan-out's subscriptions keep
(:mod:`hub.server.fanout`).

Only events committed through this process's :class:`~hub.workspaces.Workspaces` wake a
follower; it also polls the store every ``poll_interval`` seconds while idle, so events
appended by another hub node sharing the store (PostgreSQL) arrive too, a little later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import Final

from hub.core.cursor import DUPLICATE, GAP, SeqCursor
from hub.core.events import Event
from hub.workspaces import Workspaces

__all__ = ["DEFAULT_BUFFER", "FollowerClosed", "LogFollower"]

DEFAULT_BUFFER: Final = 1024
READ_BATCH: Final = 500


class FollowerClosed(Exception):
    """The follower was closed (the server is shutting down)."""


class _Reader:
    __slots__ = ("buffer", "limit", "overflowed", "wake", "workspace")

    def __init__(self, workspace: str, limit: int) -> None:
        self.workspace = workspace
        self.limit = limit
        self.buffer: deque[Event] = deque()
        self.overflowed = False
        self.wake = asyncio.Event()

    def offer(self, batch: Sequence[Event]) -> None:
        if not self.overflowed:
            if len(self.buffer) + len(batch) > self.limit:
                self.buffer.clear()
                self.overflowed = True  # catch up from the store instead
            else:
                self.buffer.extend(batch)
        self.wake.set()


class LogFollower:
    """Fans committed events out to readers of :meth:`follow`. Use as an async context
    manager (or :meth:`install`/:meth:`aclose`); closing ends every open :meth:`follow`."""

    def __init__(
        self,
        workspaces: Workspaces,
        *,
        buffer: int = DEFAULT_BUFFER,
        poll_interval: float = 5.0,
    ) -> None:
        if buffer < 1:
            raise ValueError("buffer must be >= 1")
        self.workspaces = workspaces
        self.buffer = buffer
        self.poll_interval = poll_interval
        self._readers: dict[str, set[_Reader]] = {}
        self._installed = False
        self._closed = False

    async def __aenter__(self) -> LogFollower:
        self.install()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def install(self) -> None:
        """Start listening to committed events (idempotent)."""
        if not self._installed and not self._closed:
            self.workspaces.add_listener(self._on_commit)
            self._installed = True

    async def aclose(self) -> None:
        """Stop listening and end every open :meth:`follow` (idempotent)."""
        self._closed = True
        if self._installed:
            self.workspaces.remove_listener(self._on_commit)
            self._installed = False
        for readers in self._readers.values():
            for reader in readers:
                reader.wake.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def readers(self, workspace: str | None = None) -> int:
        """How many :meth:`follow` iterators are open (on ``workspace``, or in all)."""
        if workspace is not None:
            return len(self._readers.get(workspace, ()))
        return sum(len(r) for r in self._readers.values())

    def _on_commit(self, workspace: str, batch: Sequence[Event]) -> None:
        for reader in self._readers.get(workspace, ()):
            reader.offer(batch)

    async def follow(self, workspace: str, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        """Every event of ``workspace`` with ``seq > after_seq``, in order, then live ones as
        they commit, until the caller stops iterating. Raises :class:`FollowerClosed` when
        the follower closes, and what the store raises."""
        if self._closed:
            raise FollowerClosed("the log follower is closed")
        reader = _Reader(workspace, self.buffer)
        self._readers.setdefault(workspace, set()).add(reader)
        cursor = SeqCursor(after_seq)
        try:
            catch_up = True
            while True:
                if self._closed:
                    raise FollowerClosed("the log follower is closed")
                if catch_up:
                    reader.overflowed = False
                    reader.buffer.clear()
                    page = await self.workspaces.read_batch(
                        workspace, after_seq=cursor.last, limit=READ_BATCH
                    )
                    for ev in page:
                        cursor.advance(ev.seq)
                        yield ev
                    if len(page) == READ_BATCH:
                        continue
                    catch_up = False
                while reader.buffer and not reader.overflowed:
                    ev = reader.buffer.popleft()
                    step = cursor.step(ev.seq)
                    if step is DUPLICATE:
                        continue
                    if step is GAP:
                        catch_up = True  # read it from the store
                        break
                    cursor.advance(ev.seq)
                    yield ev
                if reader.overflowed:
                    catch_up = True
                if catch_up:
                    continue
                reader.wake.clear()
                if reader.buffer or reader.overflowed or self._closed:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await reader.wake.wait()
                        continue
                catch_up = True  # idle: look at the store for events of other nodes
        finally:
            readers = self._readers.get(workspace)
            if readers is not None:
                readers.discard(reader)
                if not readers:
                    del self._readers[workspace]
