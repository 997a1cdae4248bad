"""A subscriber that never reads is closed with 4408 (its close reason says the last seq it was
sent) while 20 others keep receiving everything; it then resumes with ``afterSeq`` and misses
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed

from hub.core.wire.session import parse_overflow_reason
from tests.support.hub import HubProcess
from tests.support.peer import Peer, message, peer
from tests.support.tokens import mint

WS = "slow"
MAX_EVENTS = 50_000
BATCH = 10
TEXT = "x" * 2000
HEALTHY = 20


def _tiny_socket(url: str) -> socket.socket:
    """A connected socket with a tiny receive buffer, so the hub's writes back up fast."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    sock.setblocking(False)
    return sock


async def _collect(p: Peer) -> list[int]:
    """Seqs of the events received, up to the one with id ``END``."""
    seqs: list[int] = []
    while True:
        frame = await p.recv(60)
        if frame["op"] == "event":
            seqs.append(frame["event"]["seq"])
            if frame["event"]["id"] == "END":
                return seqs


async def _drain(p: Peer) -> tuple[list[int], ConnectionClosed]:
    """Seqs of the events that reached ``p``, and how it was closed."""
    seqs: list[int] = []
    async with asyncio.timeout(60):
        while True:
            try:
                data = await p.ws.recv()
            except ConnectionClosed as e:
                return seqs, e
            frame = json.loads(data)
            if frame["op"] == "event":
                seqs.append(frame["event"]["seq"])


async def test_slow_consumer_closed_4408_others_unaffected_then_resumes(
    start_hub: Callable[..., HubProcess],
) -> None:
    hub = start_hub("[server]\npresence_grace_s = 0\n[limits]\nsend_queue = 64\n")
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(hub.url, mint("writer")))
        await writer.publish(WS, message("before"))
        slow = await stack.enter_async_context(
            peer(hub.url, mint("slowpoke"), sock=_tiny_socket(hub.url), max_queue=1)
        )
        assert (await slow.call("subscribe", workspace=WS, afterSeq=0))["op"] == "subscribed"
        # From here on the slow client reads nothing, until the hub has closed it.
        readers = []
        for i in range(HEALTHY):
            # No client-side flow control: once done, a reader still takes in the others'
            # memberLeft events, so its own close handshake is never stuck behind them.
            reader = await stack.enter_async_context(
                peer(hub.url, mint(f"reader{i}"), max_queue=None)
            )
            assert (await reader.call("subscribe", workspace=WS, afterSeq=0))["op"] == "subscribed"
            readers.append(reader)
        async with asyncio.TaskGroup() as tg:
            healthy = [tg.create_task(_collect(r)) for r in readers]
            # Publish until the hub gives up on the slow client (its memberLeft is in the
            # log); then it starts reading again, and 200 more events are published.
            published = 0
            extra = None
            slow_task = None
            while extra is None or published < extra:
                events = [message(TEXT, id=f"e{published + i}") for i in range(BATCH)]
                ack = await writer.call("publish", workspace=WS, events=events)
                assert ack["op"] == "ack", ack
                published += BATCH
                if extra is None and published % (10 * BATCH) == 0:
                    members = (await writer.call("state", workspace=WS))["state"]["members"]
                    if (
                        "slowpoke" in members and not members["slowpoke"]["present"]
                    ):  # joined, then cut
                        extra = published + 20 * BATCH
                        slow_task = tg.create_task(_drain(slow))
                    assert published < MAX_EVENTS, "the slow client was never closed"
            end = (await writer.publish(WS, message("the end", id="END")))["seq"]
        # Every other subscriber received everything, in order.
        for task in healthy:
            assert task.result() == list(range(1, end + 1))
        # The slow one: 4408, a reason within 123 bytes naming the last seq it was sent, and
        # exactly the events up to that seq.
        assert slow_task is not None
        received, closed = slow_task.result()
        assert closed.rcvd is not None and closed.rcvd.code == 4408, closed
        assert len(closed.rcvd.reason.encode()) <= 123
        last = parse_overflow_reason(closed.rcvd.reason)[WS]
        assert received == list(range(1, last + 1)), (received[-3:], last)
        assert last < end - 20 * BATCH

        # Resume from the close reason's seq: the rest arrives, nothing missing.
        again = await stack.enter_async_context(peer(hub.url, mint("slowpoke")))
        assert (await again.call("subscribe", workspace=WS, afterSeq=last))["op"] == "subscribed"
        rest = await again.events(WS, end, 60)
        assert [e["seq"] for e in rest] == list(range(last + 1, end + 1))
        left = [e for e in rest if e["kind"] == "memberLeft"]
        assert [e["payload"]["reason"] for e in left] == ["tooSlow"]


async def test_slow_consumer_4408_with_many_frames_per_write(
    start_hub: Callable[..., HubProcess],
) -> None:
    """Small events in large batches: the writer hands the socket hundreds of frames per
    write; the 4408 reason still names exactly the last event the client gets."""
    hub = start_hub(
        "[server]\npresence_grace_s = 0\n"
        "[limits]\nsend_queue = 256\npublish_rate = 1000000.0\npublish_burst = 1000000\n"
    )
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(peer(hub.url, mint("writer")))
        slow = await stack.enter_async_context(
            peer(hub.url, mint("slowpoke"), sock=_tiny_socket(hub.url), max_queue=1)
        )
        assert (await slow.call("subscribe", workspace="burst"))["op"] == "subscribed"
        reader = await stack.enter_async_context(peer(hub.url, mint("reader"), max_queue=None))
        assert (await reader.call("subscribe", workspace="burst", afterSeq=0))["op"] == "subscribed"
        healthy = asyncio.create_task(_collect(reader))
        published = 0
        while True:
            events = [message(f"m{published + i}") for i in range(200)]
            ack = await writer.call("publish", workspace="burst", events=events)
            assert ack["op"] == "ack", ack
            published += 200
            members = (await writer.call("state", workspace="burst"))["state"]["members"]
            if "slowpoke" in members and not members["slowpoke"]["present"]:  # joined, then cut
                break
            assert published < MAX_EVENTS, "the slow client was never closed"
        received, closed = await _drain(slow)
        end = (await writer.publish("burst", message("the end", id="END")))["seq"]
        assert await asyncio.wait_for(healthy, 60) == list(range(1, end + 1))
    assert closed.rcvd is not None and closed.rcvd.code == 4408, closed
    last = parse_overflow_reason(closed.rcvd.reason)["burst"]
    assert 0 < last < end
    assert received == list(range(1, last + 1)), (received[-3:], last)
