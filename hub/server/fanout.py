"""Fan-out: committed events to every subscriber, without ever blocking the writer.

:class:`Fanout` is a :class:`hub.workspaces.Workspaces` listener. Workspaces calls it
synchronously, in seq order, with each committed batch; it encodes each event's ``event`` frame
**once per workspace** (the stored JSON embedded with ``msgspec.Raw``) and offers the same
``bytes`` object to every subscription of that workspace. A server's WebSocket frame is never
masked, so the whole frame (header + payload, :class:`WireText`) is built once as well, and so
are the batch's frames joined (:class:`LiveFrames`, one offer per subscriber per batch, not one
per event). In the hub (``per_iteration``) a batch is held until the end of the loop iteration
it was heard in, and everything a workspace committed meanwhile is offered as one batch, one
write per subscriber rather than one per publish (the raw ``websockets`` peer in
bench/hub_bench.py is allowed the same rule: one write per connection per iteration). A
transaction of this process's store is not held that long: :meth:`Fanout.heard`, the hub's
commit listener (:meth:`hub.log.base.EventStore.hear_commits`), offers it as the store reports
it, once the Workspaces have folded it, before its publishers' tasks resume, so the
publishers' acks follow their events. Whatever else is held (events read from another node or
worker), a connection that follows the workspace has the fan-out :meth:`Fanout.flush` before it
sends anything else (:meth:`Fanout.holds`), so no frame produced after a commit overtakes that
commit's events to a subscriber (the ack of its own publish included). A
connection without extensions whose writer is idle writes those very bytes at once (one
``transport.write`` per subscriber per iteration, no wake-up of its writer task); a busy one
queues them behind what it has queued, and its writer coalesces them. Offering never waits: a
connection whose bounded :class:`SendQueue` is full is told to :meth:`Outlet.overflow` (the
server closes it with 4408) and the others, and the writer, never wait for it.

A :class:`FanoutSubscription` starts *buffering*: it is registered before the subscriber's head is
read, so every event committed from then on reaches it; the server sends the catch-up from the
store, then :meth:`FanoutSubscription.go_live` drains the buffer skipping seqs already sent. That is
what makes the catch-up → live switch free of gaps and duplicates: each subscription keeps a
:class:`hub.core.cursor.SeqCursor`, the same reading position :class:`hub.follow.LogFollower`
keeps. (The fan-out does not read through the follower: it encodes each frame once for all
subscribers and catches up from the stored JSON without decoding it, which the follower's
per-reader event stream would give up.)
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Final, Generic, Protocol, TypeVar

from hub.core.cursor import DUPLICATE, NEXT, SeqCursor
from hub.core.events import Event, encode_event
from hub.core.records import AppendResult
from hub.core.wire.session import encode_event_frame

__all__ = [
    "Fanout",
    "FanoutSubscription",
    "LiveFrames",
    "Outgoing",
    "Outlet",
    "SendQueue",
    "WireText",
    "text_frame",
]

Outgoing = tuple[bytes, str | None, int]
"""One queued frame: its JSON bytes, and for an ``event`` frame its workspace and seq (else
``None``, 0); the writer records the last seq it handed to the socket per workspace. The
fan-out's JSON bytes are a :class:`WireText`, which also carries the whole WebSocket frame."""

NOT_AN_EVENT: Final = 0

_SHORT: Final = struct.Struct("!BB")
_MEDIUM: Final = struct.Struct("!BBH")
_LONG: Final = struct.Struct("!BBQ")


def text_frame(payload: bytes) -> bytes:
    """The RFC 6455 frame a server sends for the text message ``payload``: FIN, opcode 1, no
    mask (§5.1: a server never masks), no extension bits. Byte for byte what ``websockets``
    writes for it when no extension (permessage-deflate) was negotiated; built here because
    that frame is then the same for every subscriber, so the fan-out builds it once per event
    instead of the protocol object once per subscriber (see :class:`WireText`)."""
    n = len(payload)
    if n < 126:
        return _SHORT.pack(0x81, n) + payload
    if n < 65536:
        return _MEDIUM.pack(0x81, 126, n) + payload
    return _LONG.pack(0x81, 127, n) + payload


class WireText(bytes):
    """An ``event`` frame's JSON (the bytes themselves, as any queued frame), with ``wire``,
    its whole WebSocket frame (:func:`text_frame`), built once per event for every subscriber.
    A connection that negotiated no extension writes ``wire`` as it is: no framing, no copy
    per subscriber but the one into its coalesced write."""

    wire: bytes

    def __new__(cls, payload: bytes) -> WireText:
        self = super().__new__(cls, payload)
        self.wire = text_frame(payload)
        return self


class LiveFrames:
    """One committed batch of one workspace as the fan-out offers it to every subscriber, built
    once per batch: ``items`` the queue items (one per event, in seq order), ``wire`` their
    WebSocket frames joined (what an idle connection writes as it is), ``nbytes`` what the
    items cost against a :class:`SendQueue`'s ``max_bytes`` (their JSON), ``first``/``last``
    their seqs. ``contiguous``: the seqs have no hole (Workspaces announces a workspace's events
    contiguously; checked once here rather than per event per subscriber)."""

    __slots__ = ("contiguous", "first", "frames", "items", "last", "nbytes", "wire", "workspace")

    def __init__(self, workspace: str, frames: Sequence[tuple[int, WireText]]) -> None:
        self.workspace = workspace
        self.frames = frames
        self.items: list[Outgoing] = [(data, workspace, seq) for seq, data in frames]
        self.first, self.last = frames[0][0], frames[-1][0]
        self.contiguous = self.last - self.first + 1 == len(frames)
        self.nbytes = sum(len(data) for _, data in frames)
        self.wire = frames[0][1].wire if len(frames) == 1 else b"".join(d.wire for _, d in frames)

    def after(self, seq: int) -> LiveFrames | None:
        """The frames past ``seq`` (a subscriber's catch-up sent the rest), None if none."""
        rest = [frame for frame in self.frames if frame[0] > seq]
        return LiveFrames(self.workspace, rest) if rest else None


T = TypeVar("T")


class SendQueue(Generic[T]):
    """A connection's bounded queue of outgoing frames (``maxsize`` frames, ``max_bytes``
    bytes as measured by ``size``).

    Live events are *offered* (:meth:`offer`: never waits, fails when full). Replies and
    catch-up events are *put* (:meth:`put`: waits while the queue holds ``low_water`` frames or
    more), so they only use the lower part of the queue and always leave room for live events:
    a connection busy catching up is not mistaken for a slow one. :meth:`push` appends without
    waiting or failing, for replies whose number the caller bounds otherwise (the acks of a
    connection's publishes in flight, admitted with :meth:`wait_room`).

    The byte bound is what bounds memory (a frame may be as large as ``max_frame_bytes``, or
    a ``state`` reply larger): :meth:`offer` refuses a frame that would take the queue over
    ``max_bytes``; a paced :meth:`put` also waits while the queue holds half of
    ``max_bytes``; a frame appended anyway (:meth:`push`, an unpaced :meth:`put` of a reply,
    or one frame larger than the room left) can take it over, which :attr:`overflowing`
    reports and the connection answers with 4408, as it does a refused offer.

    The writer takes frames with :meth:`wait` then :meth:`popleft` (everything queued at once,
    see ``hub.server.connection``; :meth:`peek` looks first) or with :meth:`get`.
    """

    def __init__(
        self,
        maxsize: int,
        low_water: int | None = None,
        *,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        if max_bytes is not None and (max_bytes < 1 or size is None):
            raise ValueError("max_bytes must be >= 1 and needs size")
        self.maxsize = maxsize
        self.low_water = max(1, maxsize // 2 if low_water is None else min(low_water, maxsize))
        self.max_bytes = max_bytes
        self.low_water_bytes = None if max_bytes is None else max(1, max_bytes // 2)
        self.bytes = 0  # queued, as measured by ``size``
        self._size = size
        self._items: deque[T] = deque()
        self._not_empty = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def overflowing(self) -> bool:
        """Whether the queue holds more than ``max_bytes`` (the connection must close). One
        frame alone never counts as over: else a frame larger than ``max_bytes`` (but within
        ``max_frame_bytes``) could never be sent, and the client would be cut at it forever."""
        return self.max_bytes is not None and self.bytes > self.max_bytes and len(self._items) > 1

    def offer(self, item: T) -> bool:
        """Append ``item`` unless the queue is full (in frames, or in bytes with ``item``);
        return whether it was appended."""
        if len(self._items) >= self.maxsize:
            return False
        if (
            self.max_bytes is not None
            and self._items
            and self.bytes + self._measure(item) > self.max_bytes
        ):
            return False  # (into an empty queue any one frame fits: see overflowing)
        self._append(item)
        return True

    def offer_many(self, items: Sequence[T], nbytes: int) -> bool:
        """:meth:`offer` ``items`` (``nbytes`` as ``size`` measures them all) all or none: a
        refused offer closes the connection (4408) whichever frame it stopped at, and the
        frames queued before it would never be written."""
        queued = len(self._items)
        if queued + len(items) > self.maxsize:
            return False
        if (
            self.max_bytes is not None
            and (queued or len(items) > 1)  # (into an empty queue one frame fits, as offer)
            and self.bytes + nbytes > self.max_bytes
        ):
            return False
        self._items.extend(items)
        self.bytes += nbytes
        self._not_empty.set()
        if self._above_low_water(paced=False):
            self._room.clear()
        return True

    def push(self, item: T) -> None:
        """Append ``item`` whatever the queue holds (the caller bounds how many it pushes)."""
        self._append(item)

    def push_many(self, items: Sequence[T]) -> None:
        """:meth:`push` each of ``items``, in order (one wake-up and one mark check for all)."""
        if not items:
            return
        self._items.extend(items)
        if self._size is not None:
            self.bytes += sum(map(self._size, items))
        self._not_empty.set()
        if self._above_low_water(paced=False):
            self._room.clear()

    async def put(self, item: T, *, paced: bool = False) -> None:
        """Append ``item`` once the queue is below its low-water mark in frames and, when
        ``paced`` (a stream the hub reads at its own pace: catch-up, ``getExec``), in bytes.
        A reply is not paced by bytes: it counts, and a client that does not read its
        replies takes the queue over ``max_bytes`` (:attr:`overflowing`)."""
        await self.wait_room(paced=paced)
        self._append(item)

    async def wait_room(self, *, paced: bool = True) -> None:
        """Wait until the queue is below its low-water marks (bytes too when ``paced``)."""
        while self._above_low_water(paced):
            self._room.clear()
            await self._room.wait()

    def _above_low_water(self, paced: bool = True) -> bool:
        if len(self._items) >= self.low_water:
            return True
        return paced and self.low_water_bytes is not None and self.bytes >= self.low_water_bytes

    def _measure(self, item: T) -> int:
        return 0 if self._size is None else self._size(item)

    async def wait(self) -> None:
        """Wait until the queue holds a frame (at once if it does)."""
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()

    def peek(self) -> T:
        """The oldest frame, left in the queue. Raises ``IndexError`` when empty."""
        return self._items[0]

    def popleft(self) -> T:
        """Remove and return the oldest frame. Raises ``IndexError`` when empty."""
        item = self._items.popleft()
        if self._size is not None:
            self.bytes -= self._size(item)
        if not self._above_low_water(paced=False):
            self._room.set()  # each waiter checks its own marks again (bytes for paced ones)
        return item

    def take(self, max_bytes: int, last: Callable[[T], bool]) -> list[T]:
        """Remove and return the oldest frames, in order: while they come to less than
        ``max_bytes`` (as measured by ``size``; at least one), up to and including the first
        for which ``last`` is true. (The writer's batch: one mark check for all of it.)"""
        items, taken = self._items, []
        size = self._size
        total = 0
        while items and total < max_bytes:
            item = items.popleft()
            taken.append(item)
            if size is not None:
                total += size(item)
            if last(item):
                break
        self.bytes -= total
        if not self._above_low_water(paced=False):
            self._room.set()
        return taken

    async def get(self) -> T:
        """Remove and return the oldest frame, waiting for one."""
        await self.wait()
        return self.popleft()

    def _append(self, item: T) -> None:
        self._items.append(item)
        self.bytes += self._measure(item)
        self._not_empty.set()
        if self._above_low_water(paced=False):
            self._room.clear()


class Outlet(Protocol):
    """The connection end of a subscription (implemented by the server's connection)."""

    def offer(self, frames: LiveFrames) -> bool:
        """Send or queue ``frames`` without waiting; False when the send queue is full."""
        ...

    def overflow(self) -> None:
        """The subscriber cannot keep up: close it (4408). Called synchronously; idempotent."""
        ...


class FanoutSubscription:
    """One connection following one workspace. Touched only from the event loop.

    ``cursor``: the seq of the last event queued for the subscriber (the connection sets it to
    the subscription's ``afterSeq``, or the head for a live-only one, and the catch-up moves
    it). ``pending_limit``: how many live events may wait while the catch-up runs before the
    subscriber counts as too slow.
    """

    __slots__ = (
        "agent",
        "closed",
        "cursor",
        "live",
        "outlet",
        "pending",
        "pending_events",
        "pending_limit",
        "workspace",
    )

    def __init__(self, outlet: Outlet, workspace: str, agent: str, *, pending_limit: int) -> None:
        self.outlet = outlet
        self.workspace = workspace
        self.agent = agent
        self.pending_limit = pending_limit
        self.live = False
        self.closed = False
        self.cursor = SeqCursor()
        self.pending: list[LiveFrames] = []
        self.pending_events = 0

    def deliver(self, frames: LiveFrames) -> None:
        """Offer a committed batch (in seq order after the previous one); never waits. One
        cursor step and one offer for the whole batch: the per-subscriber work of a batch."""
        if self.closed:
            return
        if not self.live:
            self.pending.append(frames)
            self.pending_events += len(frames.items)
            if self.pending_events > self.pending_limit:
                self._overflow()
            return
        cursor = self.cursor
        step = cursor.step(frames.first)
        if step is DUPLICATE:  # (some of) it was sent by the catch-up
            rest = frames.after(cursor.last)
            if rest is None:
                return
            frames, step = rest, cursor.step(rest.first)
        # A gap cannot come from Workspaces (it announces a workspace's events contiguously);
        # were there one, closing (4408 names the cursor) sends the client back to the log.
        if step is not NEXT or not frames.contiguous or not self.outlet.offer(frames):
            self._overflow()
            return
        cursor.advance(frames.last)

    def go_live(self) -> None:
        """The catch-up has queued every event up to the cursor: queue the buffered events
        after it and deliver directly from now on."""
        pending, self.pending, self.pending_events = self.pending, [], 0
        self.live = True
        for frames in pending:
            self.deliver(frames)

    def _overflow(self) -> None:
        self.closed = True
        self.pending, self.pending_events = [], 0
        self.outlet.overflow()


class Fanout:
    """The registry of subscriptions and the :class:`Workspaces` listener that feeds them."""

    def __init__(self, *, per_iteration: bool = False) -> None:
        self._subscriptions: dict[str, dict[int, FanoutSubscription]] = {}
        self.frames_encoded = 0  # for tests and metrics: frames built (once per event)
        # per_iteration: hold what is committed during one loop iteration and offer it at
        # its end, one batch per workspace (see __call__); else offer each batch at once.
        self.per_iteration = per_iteration
        self._held: dict[str, list[Event]] = {}

    def add(self, subscription: FanoutSubscription) -> None:
        """Start delivering ``subscription``'s workspace to it (it buffers until live)."""
        subs = self._subscriptions.setdefault(subscription.workspace, {})
        subs[id(subscription)] = subscription

    def remove(self, subscription: FanoutSubscription) -> None:
        """Stop delivering to ``subscription``. Idempotent."""
        subscription.closed = True
        subs = self._subscriptions.get(subscription.workspace)
        if subs is None:
            return
        subs.pop(id(subscription), None)
        if not subs:
            del self._subscriptions[subscription.workspace]

    def subscribers(self, workspace: str) -> int:
        return len(self._subscriptions.get(workspace, ()))

    def __call__(self, workspace: str, batch: Sequence[Event]) -> None:
        """The listener: encode each event frame once, offer the batch to every subscriber."""
        if not batch or workspace not in self._subscriptions:
            return
        if not self.per_iteration:
            self._offer(workspace, batch)
            return
        if not self._held:
            asyncio.get_running_loop().call_soon(self.flush)
        held = self._held.get(workspace)
        if held is None:
            self._held[workspace] = list(batch)
        else:
            held.extend(batch)

    def holds(self, workspaces: Collection[str]) -> bool:
        """Whether committed events of any of ``workspaces`` wait for the end of the
        iteration (``per_iteration``). A connection following one of them calls
        :meth:`flush` before it sends anything else: a reply produced after a commit (the
        ack of the publish that made it) never overtakes that commit's events."""
        held = self._held
        return bool(held) and any(w in held for w in workspaces)

    def flush(self) -> None:
        """Offer every held batch now (at the end of the iteration, or earlier for
        :meth:`holds`); a no-op when nothing is held."""
        held, self._held = self._held, {}
        for workspace, events in held.items():
            self._offer(workspace, events)

    def heard(self, _appended: Sequence[AppendResult]) -> None:
        """The hub's :meth:`EventStore.hear_commits` listener, added after the Workspaces'
        own (which folds the transaction's events and holds them here): offer them at once.
        The transaction is the batch: every publish it wrote is in it, so nothing is gained
        by holding them to the end of the iteration, and the subscribers are spared the two
        iterations until then (the publishers' tasks resuming, then the end of theirs)."""
        self.flush()

    def _offer(self, workspace: str, batch: Sequence[Event]) -> None:
        subs = self._subscriptions.get(workspace)
        if not subs:
            return
        frames = LiveFrames(
            workspace,
            [(ev.seq, WireText(encode_event_frame(workspace, encode_event(ev)))) for ev in batch],
        )
        self.frames_encoded += len(batch)
        for subscription in tuple(subs.values()):
            subscription.deliver(frames)
