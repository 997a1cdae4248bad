"""hub.server.connection: one connection's publishes to a workspace land in the order they
were sent however many are in flight; the number in flight per connection is bounded (the
reader waits: back-pressure, not an error); a publish the hub accepted is written on shutdown,
before the store closes; and the batched writer sends frames in order (many frames per write)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hub.auth import TokenSigner
from hub.config import HubConfig
from hub.core.events import Event
from hub.core.records import AppendResult
from hub.log.base import AppendItem
from hub.log.sqlite import SqliteEventStore
from hub.server.app import Hub
from hub.server.connection import PUBLISHES_IN_FLIGHT
from tests.support.hub import HubProcess
from tests.support.peer import Peer, message, peer
from tests.support.tokens import SECRET, mint

BIG = "y" * (80 * 1024)  # above blob_threshold (64 KiB): its publish awaits a blob put


def _publish_frame(rid: int, workspace: str, n: int) -> dict[str, Any]:
    """The n-th publish of a pipelined sequence: mostly single events, some batches, and
    now and then a large file (whose publish waits for the blob store before deciding)."""
    if n % 25 == 7:
        event = {"kind": "fileWritten", "payload": {"path": f"big/{n}.txt", "text": BIG}}
        return {"op": "publish", "rid": rid, "workspace": workspace, "event": event}
    if n % 10 == 3:
        events = [message(f"{n}.{i}") for i in range(3)]
        return {"op": "publish", "rid": rid, "workspace": workspace, "events": events}
    return {"op": "publish", "rid": rid, "workspace": workspace, "event": message(str(n))}


async def _pipeline(p: Peer, workspace: str, count: int) -> list[list[int]]:
    """Send ``count`` publishes without waiting, then collect the acks; the seqs of each
    publish in send order."""
    for n in range(count):
        await p.send(_publish_frame(n + 1, workspace, n))
    seqs: dict[int, list[int]] = {}
    async with asyncio.timeout(60):
        while len(seqs) < count:
            frame = json.loads(await p.ws.recv())
            assert frame["op"] == "ack", frame
            seqs[frame["rid"]] = frame["seqs"] if "seqs" in frame else [frame["seq"]]
    return [seqs[rid] for rid in range(1, count + 1)]


def _flat(seqs: Sequence[Sequence[int]]) -> list[int]:
    return [s for batch in seqs for s in batch]


async def test_pipelined_publishes_land_in_send_order(hub: HubProcess) -> None:
    workspace = f"pipe-{uuid.uuid4().hex[:6]}"
    async with (
        peer(hub.url, mint("one")) as one,
        peer(hub.url, mint("two")) as two,
        peer(hub.url, mint("three")) as three,
    ):
        # Three connections pipelining into the same workspace at once: their events
        # interleave, but each connection's land in the order it sent them.
        results = await asyncio.gather(
            _pipeline(one, workspace, 400),
            _pipeline(two, workspace, 400),
            _pipeline(three, f"{workspace}-other", 200),
        )
        for seqs in results:
            flat = _flat(seqs)
            assert flat == sorted(flat) and len(set(flat)) == len(flat)
            assert all(b == list(range(b[0], b[0] + len(b))) for b in seqs)  # batches atomic
        head = await one.head(workspace)
        assert sorted(_flat(results[0]) + _flat(results[1])) == list(range(1, head + 1))
        # A request other than publish sees every publish the connection sent before it.
        await one.send(_publish_frame(1000, workspace, 0))
        state = await one.call("state", workspace=workspace)
        assert state["seq"] == head + 1


# ---------------------------------------------------------------------------------------------
# In-process hubs over stores the test controls


class GatedStore(SqliteEventStore):
    """A SQLite store whose appends wait while ``gate`` is clear (FIFO, so in call order)."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0
        self.calls = 0  # append and append_many calls
        self._changed = asyncio.Event()

    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        expected_seq: int | None = None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        self.calls += 1
        self.waiting += 1
        self._changed.set()
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
            self._changed.set()
        return await super().append(workspace, drafts, expected_seq=expected_seq, reads=reads)

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | Exception]:
        # A connection's pipelined publishes reach the store as one group: each one of them
        # counts as an append waiting at the gate.
        self.calls += 1
        self.waiting += len(items)
        self._changed.set()
        try:
            await self.gate.wait()
        finally:
            self.waiting -= len(items)
            self._changed.set()
        return await super().append_many(workspace, items)

    async def until_waiting(self, count: int, within: float = 10.0) -> None:
        """Wait until ``count`` appends wait at the gate."""
        async with asyncio.timeout(within):
            while self.waiting != count:
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def _running(store: SqliteEventStore, tmp_path: Path) -> AsyncIterator[Hub]:
    config = HubConfig().with_overrides(port=0, data=tmp_path / "data")
    hub = Hub(config, store, TokenSigner(SECRET.encode()))
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(hub.run(stop, on_ready=lambda _url: ready.set()))
    async with asyncio.timeout(20):
        await ready.wait()
    try:
        yield hub
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task


async def test_publishes_in_flight_are_bounded_then_all_acked_in_order(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "gated.db")
    async with _running(store, tmp_path) as hub:
        assert hub.url is not None
        async with peer(hub.url, mint("eager")) as p:
            store.gate.clear()
            total = PUBLISHES_IN_FLIGHT * 3
            sending = asyncio.create_task(_pipeline(p, "bounded", total))
            await store.until_waiting(PUBLISHES_IN_FLIGHT)
            await asyncio.sleep(0.2)  # the reader has more frames, but waits for a slot
            assert store.waiting == PUBLISHES_IN_FLIGHT
            assert not sending.done()
            store.gate.set()
            seqs = await asyncio.wait_for(sending, 60)  # every one acked: no error
        assert _flat(seqs) == list(range(1, len(_flat(seqs)) + 1))


async def test_pipelined_publishes_reach_the_store_as_one_group(tmp_path: Path) -> None:
    # Publishes the hub reads together (one TCP segment here) are decided in one pass and
    # handed to the store as one group with one wait: not one store request and one task
    # per publish (issue 16).
    store = GatedStore(tmp_path / "group.db")
    async with _running(store, tmp_path) as hub:
        assert hub.url is not None
        async with peer(hub.url, mint("grouped")) as p:
            assert (await p.call("publish", workspace="group", event=message("open")))["seq"]
            store.calls = 0
            store.gate.clear()
            count = PUBLISHES_IN_FLIGHT
            protocol = p.ws.protocol
            for n in range(count):
                frame = {"op": "publish", "rid": n + 1, "workspace": "group"}
                protocol.send_text(json.dumps({**frame, "event": message(str(n))}).encode())
            p.ws.transport.write(b"".join(protocol.data_to_send()))  # one write
            await store.until_waiting(count)
            store.gate.set()
            acks = [await p.reply(n + 1) for n in range(count)]
    assert [a["seq"] for a in acks] == list(range(2, count + 2))  # one ack each, in order
    assert store.calls <= 4, store.calls  # was one per publish


async def test_store_backpressure_keeps_send_order(tmp_path: Path) -> None:
    # A tiny store queue: appends often wait for room in it.
    store = SqliteEventStore(tmp_path / "tiny.db", queue_max=2, batch_max=4)
    async with _running(store, tmp_path) as hub:
        assert hub.url is not None
        async with contextlib.AsyncExitStack() as stack:
            peers = [
                await stack.enter_async_context(peer(hub.url, mint(f"p{i}"))) for i in range(4)
            ]
            results = await asyncio.gather(*(_pipeline(p, "tiny", 150) for p in peers))
        for seqs in results:
            flat = _flat(seqs)
            assert flat == sorted(flat), flat


async def test_shutdown_writes_the_publishes_in_flight(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "shutdown.db")
    stop = asyncio.Event()
    config = HubConfig().with_overrides(port=0, data=tmp_path / "data")
    hub = Hub(config, store, TokenSigner(SECRET.encode()))
    ready = asyncio.Event()
    running = asyncio.create_task(hub.run(stop, on_ready=lambda _url: ready.set()))
    async with asyncio.timeout(20):
        await ready.wait()
    assert hub.url is not None
    # A few more than the hub takes in: the rest wait in websockets' buffer, below its flow
    # control mark (above it the hub's transport stops reading, and the close handshake then
    # waits for close_timeout, as it did before pipelining).
    sent = PUBLISHES_IN_FLIGHT + 3
    async with peer(hub.url, mint("late")) as p:
        store.gate.clear()
        for n in range(sent):
            frame = {"op": "publish", "rid": n + 1, "workspace": "late", "event": message(str(n))}
            await p.send(frame)
        await store.until_waiting(PUBLISHES_IN_FLIGHT)
        stop.set()  # shutdown with 64 appends accepted and waiting for the store
        closed = await p.closed(30)
        assert closed.rcvd is not None and closed.rcvd.code == 1001
        await asyncio.sleep(0.1)
        assert not running.done()  # the hub waits for the accepted appends
        store.gate.set()
    async with asyncio.timeout(30):
        await running
    # Every accepted publish was written before the store closed, in the order sent (the
    # ones the reader still had in hand may follow: they were sent before the close).
    async with SqliteEventStore(tmp_path / "shutdown.db") as reopened:
        texts = [ev.payload.text async for ev in reopened.read("late")]  # type: ignore[attr-defined]
    assert PUBLISHES_IN_FLIGHT <= len(texts) <= sent
    assert texts == [str(n) for n in range(len(texts))]


# ---------------------------------------------------------------------------------------------
# The batched writer


async def test_writer_sends_queued_frames_in_order_with_few_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hub.server.connection

    connections: list[Any] = []
    original = hub.server.connection.Connection.__init__

    def record(self: Any, *args: Any) -> None:
        original(self, *args)
        connections.append(self)

    monkeypatch.setattr(hub.server.connection.Connection, "__init__", record)
    store = SqliteEventStore(tmp_path / "writer.db")
    async with _running(store, tmp_path) as running:
        assert running.url is not None
        async with peer(running.url, mint("reader")) as reader:
            head = (await reader.call("subscribe", workspace="burst"))["head"]
            writes: list[int] = []
            transport = connections[0].ws.transport
            write = transport.write

            def counting(data: bytes) -> None:
                writes.append(len(data))
                write(data)

            monkeypatch.setattr(transport, "write", counting)
            async with peer(running.url, mint("writer")) as writer:
                ack = await writer.call("publish", workspace="burst", events=[message()] * 200)
                assert ack["op"] == "ack", ack
                got = await reader.events("burst", ack["seqs"][-1])
        # memberJoined of the reader may come first; then the batch, in order.
        assert [e["seq"] for e in got][-200:] == ack["seqs"]
        assert ack["seqs"][0] > head
        # 200 frames of ~250 bytes reached the transport in a handful of writes.
        assert 1 <= len(writes) <= 10, writes
