"""hub.server.fanout with plain values (subscriptions, buffering, the send queue), and the
in-process
hub's fan-out encoding each event frame once however many subscribers there are."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from hub.core.events import MessagePosted
from hub.server.fanout import (
    Fanout,
    FanoutSubscription,
    LiveFrames,
    Outgoing,
    SendQueue,
    WireText,
    text_frame,
)
from tests.support.peer import Peer, message, of_kind, peer
from tests.support.tokens import mint


class Outlet:
    def __init__(self, room: int = 100) -> None:
        self.room = room
        self.items: list[Outgoing] = []
        self.overflows = 0

    def offer(self, frames: LiveFrames) -> bool:
        if len(self.items) + len(frames.items) > self.room:
            return False
        self.items.extend(frames.items)
        return True

    def overflow(self) -> None:
        self.overflows += 1

    def seqs(self) -> list[int]:
        return [seq for _, _, seq in self.items]


def events(*seqs: int) -> list[MessagePosted]:
    return [MessagePosted(id=f"e{s}", workspace="w", seq=s, producer="a") for s in seqs]


def test_buffers_until_live_then_skips_what_the_catch_up_sent() -> None:
    fanout, outlet = Fanout(), Outlet()
    sub = FanoutSubscription(outlet, "w", "a", pending_limit=10)
    fanout.add(sub)
    fanout("w", events(4, 5))  # committed while the catch-up runs
    fanout("w", events(6))
    assert outlet.items == []
    sub.cursor.advance(5)  # the catch-up sent up to 5 (it raced with 4 and 5)
    sub.go_live()
    fanout("w", events(7, 8))
    assert outlet.seqs() == [6, 7, 8]
    fanout("other", events(9))
    assert outlet.seqs() == [6, 7, 8]


async def test_per_iteration_offers_an_iterations_commits_as_one_batch() -> None:
    """With ``per_iteration``, the batches a workspace commits during one loop iteration reach
    each subscriber as ONE offer at its end (one write per subscriber, not one per commit),
    in seq order; other workspaces get their own; a batch for a workspace nobody follows is
    not held."""

    class Counting(Outlet):
        def __init__(self) -> None:
            super().__init__()
            self.offers: list[list[int]] = []

        def offer(self, frames: LiveFrames) -> bool:
            self.offers.append([seq for _, _, seq in frames.items])
            return super().offer(frames)

    fanout = Fanout(per_iteration=True)
    outlets = {w: Counting() for w in ("w", "v")}
    for workspace, outlet in outlets.items():
        sub = FanoutSubscription(outlet, workspace, "a", pending_limit=10)
        fanout.add(sub)
        sub.go_live()
    fanout("w", events(1, 2))
    fanout("v", events(1))
    fanout("w", events(3))
    fanout("nobody", events(1))
    assert outlets["w"].offers == [] and outlets["v"].offers == []
    await asyncio.sleep(0)
    assert outlets["w"].offers == [[1, 2, 3]]
    assert outlets["v"].offers == [[1]]
    assert fanout.frames_encoded == 4
    fanout("w", events(4))  # the next iteration: a batch of its own
    assert fanout.holds(["x", "w"]) and not fanout.holds(["v", "x"])
    fanout.flush()  # a reply to a follower of "w" is about to go: its events first
    assert outlets["w"].offers == [[1, 2, 3], [4]] and not fanout.holds(["w"])
    await asyncio.sleep(0)  # the flush scheduled for the iteration's end finds nothing
    assert outlets["w"].offers == [[1, 2, 3], [4]]


def test_frames_are_encoded_once_and_shared() -> None:
    fanout = Fanout()
    outlets = [Outlet() for _ in range(5)]
    for o in outlets:
        sub = FanoutSubscription(o, "w", "a", pending_limit=10)
        fanout.add(sub)
        sub.go_live()
    fanout("w", events(1, 2))
    assert fanout.frames_encoded == 2
    first = outlets[0].items[0][0]
    assert all(o.items[0][0] is first for o in outlets)
    # ... and so is its WebSocket frame: built once, the same bytes for every subscriber.
    assert isinstance(first, WireText) and first.wire == text_frame(bytes(first))


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_is_what_websockets_writes(size: int) -> None:
    """The fan-out frames events itself: byte for byte a server's unmasked text frame as the
    websockets protocol object builds it (RFC 6455 §5.2, every length encoding)."""
    from websockets.frames import TEXT, Frame

    payload = bytes(i % 251 for i in range(size))
    assert text_frame(payload) == Frame(TEXT, payload).serialize(mask=False, extensions=[])
    wire = WireText(payload)
    assert wire == payload and wire.wire == text_frame(payload)


def test_full_queue_overflows_that_subscriber_only() -> None:
    fanout = Fanout()
    slow, fast = Outlet(room=3), Outlet()
    for o in (slow, fast):
        sub = FanoutSubscription(o, "w", "a", pending_limit=10)
        fanout.add(sub)
        sub.go_live()
    fanout("w", events(1, 2, 3))  # (a batch is offered whole: one offer per subscriber)
    fanout("w", events(4))
    assert slow.seqs() == [1, 2, 3] and slow.overflows == 1
    assert fast.seqs() == [1, 2, 3, 4] and fast.overflows == 0


def test_buffer_overflow_while_catching_up() -> None:
    fanout, outlet = Fanout(), Outlet()
    sub = FanoutSubscription(outlet, "w", "a", pending_limit=2)
    fanout.add(sub)
    fanout("w", events(1, 2, 3))
    assert outlet.overflows == 1 and sub.closed
    fanout("w", events(4))
    assert outlet.overflows == 1


def test_remove_is_idempotent() -> None:
    fanout, outlet = Fanout(), Outlet()
    sub = FanoutSubscription(outlet, "w", "a", pending_limit=2)
    fanout.add(sub)
    assert fanout.subscribers("w") == 1
    fanout.remove(sub)
    fanout.remove(sub)
    assert fanout.subscribers("w") == 0
    fanout("w", events(1))
    assert fanout.frames_encoded == 0  # nobody listens: nothing encoded


async def test_send_queue_bounds() -> None:
    queue: SendQueue[int] = SendQueue(4)
    assert queue.low_water == 2
    await queue.put(1)
    await queue.put(2)
    # put() waits below the low-water mark; offer() may use the rest.
    waiting = asyncio.create_task(queue.put(3))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert queue.offer(10) and queue.offer(11)
    assert not queue.offer(12)
    assert [await queue.get() for _ in range(3)] == [1, 2, 10]
    await asyncio.wait_for(waiting, 1)
    assert [await queue.get() for _ in range(2)] == [11, 3]
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert queue.offer(5)
    assert await asyncio.wait_for(getter, 1) == 5
    with pytest.raises(ValueError):
        SendQueue(0)


async def test_send_queue_push_and_batches() -> None:
    queue: SendQueue[int] = SendQueue(4)
    # push() neither waits nor fails: the caller bounds it (acks of publishes in flight).
    for i in range(6):
        queue.push(i)
    assert len(queue) == 6 and not queue.offer(99)
    room = asyncio.create_task(queue.wait_room())
    await asyncio.sleep(0)
    assert not room.done()
    await queue.wait()  # at once: frames are queued
    taken = []
    while queue:
        taken.append(queue.popleft())
    assert taken == list(range(6))
    await asyncio.wait_for(room, 1)
    waiter = asyncio.create_task(queue.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    queue.push(7)
    await asyncio.wait_for(waiter, 1)
    assert queue.popleft() == 7
    with pytest.raises(IndexError):
        queue.popleft()


async def test_in_process_hub_encodes_each_event_frame_once(inproc_hub: Any) -> None:
    url = inproc_hub.url
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(url, mint("w")))
        subs = [await stack.enter_async_context(peer(url, mint(f"r{i}"))) for i in range(8)]
        for p in subs:
            await p.call("subscribe", workspace="once")
        # Wait for the subscribers' memberJoined events, so that only ours are counted.
        for _ in range(500):
            members = (await writer.call("state", workspace="once"))["state"]["members"]
            if len(members) == len(subs):
                break
            await asyncio.sleep(0.01)
        before = inproc_hub.fanout.frames_encoded
        ack = await writer.call("publish", workspace="once", events=[message()] * 10)
        for p in subs:
            got = await p.events("once", ack["seqs"][-1])
            assert [e["seq"] for e in got][-10:] == ack["seqs"]
        assert inproc_hub.fanout.frames_encoded - before == 10


async def test_send_queue_bounds_bytes() -> None:
    """``max_bytes`` (measured by ``size``): offers that would go over it fail, a paced put
    waits at half of it, a reply put or a push counts and can take it over (overflowing)."""
    queue: SendQueue[bytes] = SendQueue(100, max_bytes=10, size=len)
    assert queue.offer(b"12345") and queue.bytes == 5
    paced = asyncio.create_task(queue.put(b"p", paced=True))  # at half of max_bytes: waits
    await asyncio.sleep(0)
    assert not paced.done()
    assert not queue.offer(b"123456")  # 11 > 10
    assert queue.offer(b"1234") and not queue.overflowing
    await queue.put(b"reply")  # a reply is not paced by bytes: it counts
    assert queue.bytes == 14 and queue.overflowing
    assert queue.popleft() == b"12345" and queue.popleft() == b"1234"
    await asyncio.sleep(0)
    assert not paced.done()  # 5 bytes left: still at half
    assert queue.popleft() == b"reply"
    await asyncio.wait_for(paced, 1)  # below half: the paced put went in
    assert queue.bytes == 1 and not queue.overflowing


async def test_send_queue_push_many_and_take() -> None:
    """push_many is push of each, in order, counted in bytes; take returns the oldest frames
    while they come to less than its byte budget (at least one), up to the first its
    predicate marks as last, and makes room as popleft does."""
    queue: SendQueue[bytes] = SendQueue(4, max_bytes=100, size=len)
    queue.push_many([])
    assert not queue
    queue.push_many([b"aaaa", b"bb", b"STOP", b"c", b"dd"])
    assert len(queue) == 5 and queue.bytes == 13
    room = asyncio.create_task(queue.wait_room(paced=False))
    await asyncio.sleep(0)
    assert not room.done()  # 5 frames: above the low-water mark (2)
    await queue.wait()
    assert queue.take(100, lambda b: b == b"STOP") == [b"aaaa", b"bb", b"STOP"]
    assert queue.bytes == 3
    await asyncio.sleep(0)
    assert not room.done()  # 2 left: at the mark
    assert queue.take(1, lambda b: False) == [b"c"]  # one at least, then over the budget
    await asyncio.wait_for(room, 1)
    assert queue.take(100, lambda b: False) == [b"dd"] and queue.bytes == 0 and not queue


def test_send_queue_one_frame_alone_always_fits() -> None:
    """A frame over max_bytes (but within max_frame_bytes) can still be sent, alone."""
    queue: SendQueue[bytes] = SendQueue(100, max_bytes=10, size=len)
    assert queue.offer(b"x" * 50) and not queue.overflowing
    queue.push(b"y")
    assert queue.overflowing
    with pytest.raises(ValueError):
        SendQueue(4, max_bytes=10)  # no size


async def test_frames_reach_a_client_with_and_without_deflate(start_hub: Any) -> None:
    """Pre-built frames go to a plain connection as they are; a connection that negotiated
    permessage-deflate gets each frame through the protocol object (compressed), the same
    events and acks either way."""
    hub = start_hub('[server]\ncompression = "deflate"\n')
    async with contextlib.AsyncExitStack() as stack:
        plain = await stack.enter_async_context(peer(hub.url, mint("plain")))
        deflated = await stack.enter_async_context(
            peer(hub.url, mint("deflated"), compression="deflate")
        )
        assert not plain.ws.protocol.extensions and deflated.ws.protocol.extensions
        for p in (plain, deflated):
            await p.call("subscribe", workspace="wd")
        ack = await plain.call("publish", workspace="wd", events=[message("a" * 300)] * 3)
        ack2 = await deflated.call("publish", workspace="wd", events=[message("b")])
        for p in (plain, deflated):
            got = await p.events("wd", ack2["seqs"][-1])
            texts = [e["payload"]["text"] for e in of_kind(got, "messagePosted")]
            assert texts == ["a" * 300] * 3 + ["b"]
        assert ack["seqs"][-1] < ack2["seqs"][0]


async def _settle(writer: Peer, reader: Peer, workspace: str) -> None:
    """Publish a message and read until it and the reader's own ``memberJoined`` have come:
    then nothing more is on its way to the reader, and its connection's writer is idle."""
    await writer.call("publish", workspace=workspace, events=[message("settle")])
    kinds: set[str] = set()
    while not {"memberJoined", "messagePosted"} <= kinds:
        frame = await reader.recv()
        if frame["op"] == "event":
            kinds.add(frame["event"]["kind"])


async def test_an_idle_subscriber_gets_a_commit_at_the_end_of_its_iteration(
    inproc_hub: Any,
) -> None:
    """A subscriber whose writer is idle is written to by the fan-out itself, at the end of
    the loop iteration in which the commit was heard: by the time a callback scheduled from
    the listeners after it runs, nothing waits in that connection's send queue and the batch's
    last seq is recorded as sent (no writer wake-up); while the listeners run, nothing is
    written yet (the iteration's other commits join the same write). The client gets the
    events once, in order."""
    url = inproc_hub.url
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(url, mint("w")))
        reader = await stack.enter_async_context(peer(url, mint("r")))
        await reader.call("subscribe", workspace="direct")
        await _settle(writer, reader, "direct")
        conn = next(c for c in inproc_hub.connections if "direct" in c.subscriptions)
        during: list[int | None] = []
        after: list[tuple[int, int | None]] = []

        def probe(workspace: str, batch: Any) -> None:  # called right after the fan-out
            if workspace == "direct":
                during.append(conn.last_sent.get("direct"))
                asyncio.get_running_loop().call_soon(
                    lambda: after.append((len(conn.queue), conn.last_sent.get("direct")))
                )

        before = conn.last_sent.get("direct")
        inproc_hub.workspaces.add_listener(probe)
        try:
            ack = await writer.call("publish", workspace="direct", events=[message("b")] * 3)
        finally:
            inproc_hub.workspaces.remove_listener(probe)
        last = ack["seqs"][-1]
        assert during == [before]
        assert after == [(0, last)]
        got = await reader.events("direct", last)
        assert [e["seq"] for e in got] == ack["seqs"]


async def test_subscribers_are_written_to_before_the_publishers_ack(inproc_hub: Any) -> None:
    """The fan-out writes a commit's events when the store reports the commit, before the
    publishers' tasks resume: by the time the publisher's ack is written, every idle
    subscriber's socket already has the events (a subscriber does not wait for the
    publishers, nor for the end of their iteration)."""
    url = inproc_hub.url
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(url, mint("w")))
        readers = [await stack.enter_async_context(peer(url, mint(f"r{i}"))) for i in range(3)]
        for reader in readers:
            await reader.call("subscribe", workspace="early")
        for reader in readers:
            await _settle(writer, reader, "early")
        subscribed = [c for c in inproc_hub.connections if "early" in c.subscriptions]
        (publisher,) = [c for c in inproc_hub.connections if not c.subscriptions]
        at_ack: list[list[int | None]] = []
        write_now = publisher._write_now

        def record(wire: bytes) -> bool:
            at_ack.append([c.last_sent.get("early") for c in subscribed])
            return write_now(wire)

        publisher._write_now = record
        ack = await writer.call("publish", workspace="early", events=[message("e")] * 2)
        last = ack["seqs"][-1]
        assert at_ack == [[last] * 3]
        for reader in readers:
            got = await reader.events("early", last)
            assert [e["seq"] for e in got][-2:] == ack["seqs"]


async def test_a_busy_subscriber_queues_a_commit_behind_what_it_has_queued(
    inproc_hub: Any,
) -> None:
    """While something waits in a connection's send queue, a committed batch goes in behind
    it (never written past it): the client gets the frames in the order they were produced."""
    url = inproc_hub.url
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(url, mint("w")))
        reader = await stack.enter_async_context(peer(url, mint("r")))
        await reader.call("subscribe", workspace="busy")
        await _settle(writer, reader, "busy")
        conn = next(c for c in inproc_hub.connections if "busy" in c.subscriptions)
        queued: list[int] = []

        def first(workspace: str, batch: Any) -> None:  # runs before the fan-out
            if workspace == "busy" and not queued:
                conn.queue.push((b'{"op":"marker"}', None, 0))
                queued.append(len(conn.queue))

        listeners = inproc_hub.workspaces._listeners
        listeners.insert(0, first)
        try:
            ack = await writer.call("publish", workspace="busy", events=[message("c")])
        finally:
            listeners.remove(first)
        assert queued == [1]
        ops: list[str] = []
        while True:
            frame = await reader.recv()
            ops.append(frame["op"])
            if frame["op"] == "event" and frame["event"]["seq"] == ack["seqs"][-1]:
                break
        assert ops[-2:] == ["marker", "event"]


def test_send_queue_offer_many_is_all_or_none() -> None:
    """A batch is offered whole: it goes in if every frame fits (in frames and in bytes, one
    frame alone into an empty queue always does), else none of it does."""
    queue: SendQueue[bytes] = SendQueue(4, max_bytes=10, size=len)
    assert queue.offer_many([b"x" * 50], 50) and len(queue) == 1  # alone: fits
    assert not queue.offer_many([b"y"], 1)  # 51 > 10
    queue.popleft()
    assert not queue.offer_many([b"123456", b"12345"], 11) and not queue  # over the bytes
    assert not queue.offer_many([b"1"] * 5, 5) and not queue  # over the frames
    assert queue.offer_many([b"123", b"4567"], 7) and queue.bytes == 7 and len(queue) == 2
    assert not queue.offer_many([b"8", b"9", b"0"], 3)  # 2 + 3 frames > 4
    assert queue.offer_many([b"8", b"9"], 2) and queue.bytes == 9 and len(queue) == 4
    assert [queue.popleft() for _ in range(4)] == [b"123", b"4567", b"8", b"9"]


def test_a_batch_partly_sent_by_the_catch_up_delivers_the_rest_once() -> None:
    fanout, outlet = Fanout(), Outlet()
    sub = FanoutSubscription(outlet, "w", "a", pending_limit=10)
    fanout.add(sub)
    fanout("w", events(3, 4, 5))  # committed while the catch-up runs
    sub.cursor.advance(4)  # the catch-up read up to 4
    sub.go_live()
    fanout("w", events(6, 7))
    assert outlet.seqs() == [5, 6, 7] and outlet.overflows == 0
    fanout("w", events(9))  # a hole: the subscriber goes back to the log (4408)
    assert outlet.seqs() == [5, 6, 7] and outlet.overflows == 1


def test_a_batch_with_a_hole_closes_the_subscriber() -> None:
    fanout, outlet = Fanout(), Outlet()
    sub = FanoutSubscription(outlet, "w", "a", pending_limit=10)
    fanout.add(sub)
    sub.go_live()
    fanout("w", events(1, 3))  # (Workspaces never announces one: checked once per batch)
    assert outlet.seqs() == [] and outlet.overflows == 1


async def test_an_idle_publishers_acks_are_written_at_once(inproc_hub: Any) -> None:
    """The acks of a connection whose writer is idle are written by the publish that produced
    them, not queued for its writer task (they leave in the iteration their commit was heard
    in); they still arrive, one per publish."""
    async with peer(inproc_hub.url, mint("w")) as writer:
        await writer.call("publish", workspace="acks", events=[message("warm")])
        (conn,) = inproc_hub.connections
        pushed: list[int] = []
        push_many = conn.queue.push_many

        def record(items: Any) -> None:
            pushed.append(len(items))
            push_many(items)

        conn.queue.push_many = record
        for text in ("a", "b", "c"):
            ack = await writer.call("publish", workspace="acks", events=[message(text)])
            assert ack["op"] == "ack"
        assert pushed == []


async def test_a_subscribed_publisher_gets_its_events_before_its_ack(inproc_hub: Any) -> None:
    """The fan-out holds a commit's events until the end of the iteration, but never past a
    frame produced after the commit for a client following the workspace: a connection that
    follows the workspace it publishes to has the events when the ack arrives (read your
    writes), for a single publish and for a pipelined run of them."""
    async with peer(inproc_hub.url, mint("w")) as client:
        await client.call("subscribe", workspace="own")
        ack = await client.call("publish", workspace="own", events=[message("a")] * 2)
        # (Its own memberJoined, written by presence, may come in between: posted ones only.)
        posted = [
            f["event"]["seq"]
            for f in client.inbox
            if f["op"] == "event" and f["event"]["kind"] == "messagePosted"
        ]
        assert posted == ack["seqs"]
        client.inbox.clear()
        rids = [100 + i for i in range(4)]
        for rid in rids:  # pipelined: taken together, decided in one pass
            await client.send(
                {"op": "publish", "rid": rid, "workspace": "own", "events": [message("b")]}
            )
        seen: list[int] = []
        for rid in rids:
            ack = await client.reply(rid)
            seen += [f["event"]["seq"] for f in client.inbox if f["op"] == "event"]
            client.inbox.clear()
            assert ack["seqs"][-1] in seen
