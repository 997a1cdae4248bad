"""hub/client/feed.py against a real ``agora serve`` (fixtures in conftest.py): subscriptions
read history then live events, once each, in order, across rewinds and 4408 resumes."""

from __future__ import annotations

import asyncio

from hub.client import Session, connect
from hub.core.events import Event, MessagePosted
from tests.hub.client.helpers import WAIT, assert_contiguous, collect, message, name, text
from tests.support.hub import HubProcess


async def test_subscribe_history_then_live_no_gap_no_duplicate(
    alice: Session, bob: Session
) -> None:
    w = name()
    writer = bob.workspace(w)
    for i in range(5):
        await writer.post_message(f"before {i}")
    reader = alice.workspace(w)
    got: list[Event] = []
    async with asyncio.timeout(WAIT), reader.subscribe(0) as sub:
        async for ev in sub:
            got.append(ev)
            if ev.seq == 5:
                for i in range(5):
                    await writer.post_message(f"after {i}")
            if len([e for e in got if isinstance(e, MessagePosted)]) == 10:
                break
    assert_contiguous(got, 1, got[-1].seq)
    texts = [e.payload.text for e in got if isinstance(e, MessagePosted)]
    assert texts == [f"before {i}" for i in range(5)] + [f"after {i}" for i in range(5)]


async def test_many_local_subscribers_share_one_feed(alice: Session, bob: Session) -> None:
    w = name()
    writer = bob.workspace(w)
    await writer.publish_batch([message(str(i)) for i in range(20)])
    ws = alice.workspace(w)
    live = ws.subscribe(None)
    head = await live.head()
    assert head == 20
    # Different starting points at once, then more events while they read. (Alice's own
    # subscription adds a memberJoined after the head: 31 events in all.)
    starts = (0, 7, 19, 25)
    tasks = [asyncio.create_task(collect(ws, after, 31 - after)) for after in starts]
    await asyncio.sleep(0.05)
    await writer.publish_batch([message(str(i)) for i in range(20, 30)])
    for after, events in zip(starts, await asyncio.gather(*tasks), strict=True):
        assert_contiguous(events, after + 1, 31)
    live_events = [await anext(live) for _ in range(11)]
    assert_contiguous(live_events, head + 1, 31)
    assert live_events[0].kind == "memberJoined"
    await live.aclose()


async def test_slow_local_subscriber_outside_the_window_is_replayed(hub: HubProcess) -> None:
    w = name()
    async with (
        connect(hub.url, hub.token("alice"), history=8) as alice,
        connect(hub.url, hub.token("bob")) as bob,
    ):
        ws = alice.workspace(w)
        sub = ws.subscribe(0)
        await sub.head()
        for start in range(0, 100, 25):
            await bob.workspace(w).publish_batch(
                [message(str(i)) for i in range(start, start + 25)]
            )
        await asyncio.sleep(0.2)  # the feed's window (8 events) has long moved on
        async with asyncio.timeout(WAIT):
            got = [await anext(sub) for _ in range(100)]
        assert_contiguous(got, 1, 100)
        # Each rewind (unsubscribe, subscribe again) appends presence events, which a catch-up
        # that outruns its reader turns into a livelock: the reader must catch up in a few.
        head = (await bob.workspace(w).state()).seq
        assert head <= 101 + 2 * 10, f"{(head - 101) // 2} rewinds for one slow reader"
        await sub.aclose()


async def test_slow_consumer_cut_with_4408_resumes_transparently(
    small_queue_hub: HubProcess,
) -> None:
    hub = small_queue_hub
    w = "slow"
    body = "x" * 30_000  # ~30 kB per event: the socket buffers fill after a few hundred
    count = 400
    async with (
        connect(hub.url, hub.token("slow")) as slow,
        connect(hub.url, hub.token("fast")) as fast,
    ):
        sub = slow.workspace(w).subscribe(0)
        await sub.head()
        connection = slow._current
        assert connection is not None
        connection.transport.pause_reading()  # the consumer stops reading its socket
        out = fast.workspace(w)
        for start in range(0, count, 20):
            await out.publish_batch([message(f"{i}:{body}") for i in range(start, start + 20)])
        await asyncio.sleep(0.5)
        connection.transport.resume_reading()
        got: list[Event] = []
        async with asyncio.timeout(WAIT * 3):
            async for ev in sub:
                got.append(ev)
                if isinstance(ev, MessagePosted) and text(ev).startswith(f"{count - 1}:"):
                    break
        assert_contiguous(got, 1, got[-1].seq)
        numbers = [int(text(e).split(":")[0]) for e in got if isinstance(e, MessagePosted)]
        assert numbers == list(range(count))
        assert slow.reconnects >= 1
        assert slow.last_close is not None and slow.last_close[0] == 4408
        await sub.aclose()
