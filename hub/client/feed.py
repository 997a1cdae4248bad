"""Feeds: one wire subscription per followed workspace, and local subscribers as cursors over
its window of recent events.

A session follows each workspace it reads with one ``subscribe`` (a :class:`WorkspaceFeed`)
and keeps a bounded window of the events it delivered; every local subscriber and waiter
(:class:`Subscription`) is a :class:`FeedReader` holding the seq of the last event it got. The
feed's :class:`~hub.core.wire.client.ResumeCursor` (owned by the session's
:class:`~hub.core.wire.client.ClientProtocol`) drops events already held (a replay after a
resubscribe) and detects gaps; after a reconnect the feed resubscribes from the end of its
window (or from the oldest reader behind it), so readers see every event once, in order. A
reader that falls behind the window makes the feed *rewind* (the hub replays from the log).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from hub.client.errors import SessionClosed
from hub.core.cursor import Step
from hub.core.errors import AgoraError, BadRequest, Busy, ServerError
from hub.core.events import Event
from hub.core.wire import frames
from hub.core.wire.client import EventIn

if TYPE_CHECKING:
    from hub.client.session import Session
    from hub.client.workspace import Workspace

__all__ = ["CATCH_UP_RETRIES", "FeedReader", "Subscription", "UnsubscribeSent", "WorkspaceFeed"]

log = logging.getLogger(__name__)

CATCH_UP_RETRIES: Final = 5
"""Subscribes retried in a row after the hub failed to read a catch-up (then it raises)."""


class UnsubscribeSent:
    """The handler of an ``unsubscribe`` in flight: its reply needs no action."""

    __slots__ = ("workspace",)

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace


class FeedReader:
    """One local subscriber: the seq of the last event it was given, and its head.

    ``last`` is None for a live-only subscriber until the feed knows the head.
    """

    __slots__ = ("closed", "error", "feed", "head", "last")

    def __init__(self, feed: WorkspaceFeed, after_seq: int | None) -> None:
        self.feed = feed
        self.last = after_seq
        self.closed = False
        self.error: BaseException | None = None
        self.head: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def set_head(self, head: int) -> None:
        if not self.head.done():
            self.head.set_result(head)

    def finish(self, error: BaseException | None) -> None:
        """End the subscriber: with ``error``, or cleanly (iteration stops) when None."""
        self.closed = True
        if error is not None and self.error is None:
            self.error = error
        if not self.head.done():
            self.head.set_exception(error or SessionClosed("the subscription was closed"))
            self.head.exception()  # mark retrieved: head() raises it to whoever awaits

    async def get(self) -> Event:
        feed = self.feed
        while True:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise StopAsyncIteration
            if self.last is not None:
                found, ev = feed.at(self.last + 1)
                if found:
                    self.last += 1
                    if ev is not None:
                        return ev
                    continue  # a kind this client does not know: skipped, seq kept
                if self.last < feed.first:
                    feed.rewind(self.last)  # fell out of the window: read it again
            await feed.changed()


class WorkspaceFeed:
    """The wire subscription of one workspace and a window of the events it delivered.

    The window holds the contiguous seqs ``first+1 .. position`` (bounded by ``history``
    events and ``history_bytes``), ``position`` being the feed's resume cursor (the last seq
    it holds); a subscriber reads it at its own pace. One that falls behind
    the window makes the feed *rewind*: resubscribe from that subscriber's seq (the hub replays
    from the log). The feed stays subscribed until the session closes or
    :meth:`Workspace.leave`, so waiters coming and going do not make the agent leave and rejoin
    the workspace (presence events) each time.
    """

    def __init__(self, session: Session, workspace: str) -> None:
        self.session = session
        self.workspace = workspace
        self.cursors: list[FeedReader] = []
        self.window: deque[tuple[Event | None, int]] = deque()
        self.window_bytes = 0
        self.first = 0  # the window holds seqs first+1 .. position
        # The last seq held; started once a subscribe was confirmed (position/first mean
        # something). The protocol judges each event against it before the feed sees it.
        self.cursor = session._protocol.track(workspace)
        self.head = 0
        self.rid: int | None = None  # the subscribe in force, or awaiting its reply
        self.after: int | None = None  # its afterSeq
        self.confirmed = False
        self.wanted: int | None = None  # a rewind asked for while a subscribe is pending
        self.retried_busy = False
        self.failures = 0  # catch-up failures in a row
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def position(self) -> int:
        return self.cursor.position

    @property
    def started(self) -> bool:
        return self.cursor.started

    # -- the window -----------------------------------------------------------------------

    def at(self, seq: int) -> tuple[bool, Event | None]:
        index = seq - self.first - 1
        if self.started and 0 <= index < len(self.window):
            return True, self.window[index][0]
        return False, None

    async def changed(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                waiter.cancel()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _append(self, ev: Event | None, size: int) -> None:
        """Hold the event the cursor just advanced to (``position``)."""
        self.window.append((ev, size))
        self.window_bytes += size
        limits = self.session.history, self.session.history_bytes
        while len(self.window) > 1 and (
            len(self.window) > limits[0] or self.window_bytes > limits[1]
        ):
            _, dropped = self.window.popleft()
            self.window_bytes -= dropped
            self.first += 1

    def _restart(self, after: int) -> None:
        self.window.clear()
        self.window_bytes = 0
        self.first = after
        self.cursor.restart(after)

    # -- local subscribers ----------------------------------------------------------------

    def add(self, cursor: FeedReader) -> None:
        self.cursors.append(cursor)
        if self.rid is None:
            self.subscribe(cursor.last)
        elif self.confirmed:
            head = max(self.head, self.position)
            if cursor.last is None:
                cursor.last = head
            cursor.set_head(head)
            if cursor.last < self.first:
                self.rewind(cursor.last)
        elif cursor.last is not None:
            self.rewind(cursor.last)
        self._wake()

    def remove(self, cursor: FeedReader) -> None:
        if cursor in self.cursors:
            self.cursors.remove(cursor)

    def fail(self, error: BaseException | None) -> None:
        """End every local subscriber (with ``error``, or cleanly when None) and forget the
        feed."""
        for cursor in self.cursors:
            cursor.finish(error)
        self.cursors.clear()
        if self.rid is not None:
            self.session._forget(self.rid)
        self.rid = None
        self.confirmed = False
        self.session._feeds.pop(self.workspace, None)
        self.session._protocol.untrack(self.workspace, self.cursor)
        self._wake()

    def leave(self) -> None:
        """Unsubscribe and forget the feed; local subscribers stop."""
        if self.rid is not None:
            self.session._forget(self.rid)
            self._unsubscribe()
        self.fail(None)

    # -- wire ------------------------------------------------------------------------------

    def subscribe(self, after: int | None) -> None:
        """(Re)subscribe from ``after`` (None: live only)."""
        self.wanted = None
        if not self.session._connected():
            self.rid = None
            return  # the next connection subscribes (``on_connected``)
        if self.rid is not None:
            self.session._forget(self.rid)
            self._unsubscribe()
        self.after = after
        self.confirmed = False
        self.rid = self.session._send_control(
            frames.Subscribe(workspace=self.workspace, after_seq=after), self
        )

    def _unsubscribe(self) -> None:
        frame = frames.Unsubscribe(workspace=self.workspace)
        self.session._send_control(frame, UnsubscribeSent(self.workspace))

    def rewind(self, seq: int) -> None:
        """A subscriber needs the events after ``seq``, which the window does not hold."""
        if self.started and self.first <= seq:
            return
        if self.rid is not None and not self.confirmed:
            if self.after is None or seq < self.after:
                self.wanted = seq if self.wanted is None else min(self.wanted, seq)
            return
        self.subscribe(seq)

    def _resume_point(self) -> int | None:
        """Where to subscribe on a new connection: the end of the window, or earlier if a
        subscriber is behind it."""
        behind = [c.last for c in self.cursors if c.last is not None and c.last < self.position]
        if self.started:
            return min([self.position, *behind])
        known = [c.last for c in self.cursors if c.last is not None]
        return min(known) if known else None

    def on_connected(self) -> None:
        self.rid = None
        self.confirmed = False
        self.subscribe(self._resume_point())

    def on_disconnected(self) -> None:
        self.rid = None
        self.confirmed = False

    def on_subscribed(self, rid: int, head: int) -> None:
        if rid != self.rid:
            return  # a subscribe we have since replaced
        self.confirmed = True
        self.retried_busy = False
        self.head = head
        after = self.after if self.after is not None else head
        if not self.started or after != self.position:
            self._restart(after)
        for cursor in self.cursors:
            if cursor.last is None:
                cursor.last = head
            cursor.set_head(head)
        wanted, self.wanted = self.wanted, None
        behind = [c.last for c in self.cursors if c.last is not None and c.last < self.first]
        if wanted is not None and wanted < self.first:
            behind.append(wanted)
        if behind:
            self.subscribe(min(behind))
        self._wake()

    def on_error(self, rid: int, error: AgoraError) -> None:
        if rid != self.rid:
            return
        if isinstance(error, Busy) and not self.retried_busy and self.session._drop_idle_feed():
            self.retried_busy = True  # too many subscriptions: an idle one made room
            self.rid = None
            self.subscribe(self.after)
            return
        if self.confirmed and isinstance(error, ServerError) and self.failures < CATCH_UP_RETRIES:
            # The hub could not read the catch-up and ended the subscription (docs/protocol.md,
            # "subscribe"): subscribe again from what we hold, after a pause.
            self.failures += 1
            self.rid = None
            self.confirmed = False
            delay = self.session._backoff.delay(self.failures)
            asyncio.get_running_loop().call_later(delay, self._retry)
            return
        self.fail(error)

    def _retry(self) -> None:
        if self.rid is None and self.session._feeds.get(self.workspace) is self:
            self.subscribe(self.position if self.started else self._resume_point())

    def on_event(self, incoming: EventIn) -> None:
        """An event of this workspace, already judged by the cursor (the protocol advanced it
        for a :attr:`~Step.NEXT` one)."""
        seq = incoming.seq
        if seq > self.head:
            self.head = seq
        if incoming.verdict is Step.GAP:
            if self.confirmed:
                log.info("gap in %s after seq %s: resubscribing", self.workspace, self.position)
                self.subscribe(self.position)
            return
        if incoming.verdict is not Step.NEXT:
            return  # before the window starts, or already held (a replay)
        if incoming.event is None:
            log.warning("event %s of an unknown kind skipped (workspace %s)", seq, self.workspace)
        self.failures = 0
        self._append(incoming.event, incoming.size)
        self._wake()


class Subscription:
    """The events of one workspace with ``seq > after_seq``, in order, then live ones.

    An async iterator of typed :class:`hub.core.events.Event` objects and an async context manager
    (``async with ws.subscribe(0) as sub: async for ev in sub: …``). Every event comes once, in
    seq order, across reconnects. Iterating raises what ended the session
    (:class:`~hub.core.errors.Unauthorized`, :class:`~hub.core.errors.Unavailable` when
    reconnecting gave
    up) or the subscribe error (:class:`~hub.core.errors.Forbidden` without the read right,
    :class:`~hub.core.errors.BadRequest` for an ``after_seq`` beyond the head); it stops when the
    session is closed, :meth:`aclose` is called or the workspace is left.
    """

    def __init__(self, workspace: Workspace, after_seq: int | None) -> None:
        if after_seq is not None and after_seq < 0:
            raise BadRequest("afterSeq must be >= 0", field="afterSeq")
        self._workspace = workspace
        self._after = after_seq
        self._cursor: FeedReader | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _start(self) -> FeedReader:
        if self._cursor is None:
            session = self._workspace.session
            session._check_usable()
            feed = session._feed(self._workspace.name)
            cursor = FeedReader(feed, self._after)
            self._cursor = cursor
            # An abandoned iterator (``break`` out of ``async for``) is dropped when collected.
            self._finalizer = weakref.finalize(self, _drop_cursor, cursor)
            feed.add(cursor)
        return self._cursor

    async def head(self) -> int:
        """The workspace head when the subscription started: history up to it is replayed
        first. Raises as iterating does."""
        return await asyncio.shield(self._start().head)

    @property
    def last_seq(self) -> int | None:
        """The seq of the last event delivered (``after_seq`` before the first)."""
        return self._cursor.last if self._cursor is not None else self._after

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        ev = await self._start().get()
        # Read from the start of the log, the first event of an item seen is its first.
        self._workspace._note(ev, complete=self._after == 0)
        return ev

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop receiving; idempotent."""
        if self._finalizer is not None:
            self._finalizer()


def _drop_cursor(cursor: FeedReader) -> None:
    if not cursor.closed:
        cursor.finish(None)
    cursor.feed.remove(cursor)
