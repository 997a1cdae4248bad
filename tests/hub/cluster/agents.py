"""Agents that survive a node's death by moving to another node: raw WebSocket ones, and
:func:`publish_pipelined` for the Python client's sessions; :func:`dead_url`, where no node is;
:class:`TsSession`, the TypeScript client's side of a test (the ``ts_session`` fixture); the
nodes' short heartbeat timings (the ``start_node`` fixture's).

:class:`Publisher` publishes messages with its own event ids, a few in flight at once; when its
node goes away it reconnects to the next node and publishes every unacknowledged id again (the
hub answers ``duplicate`` with the original seq for one that was written). :class:`Subscriber`
follows a workspace from seq 1 and, after losing its node, subscribes on the next one with
``afterSeq`` = the last seq it got; it records every event and any gap or duplicate.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from hub.client import Workspace
from tests.support.node import CLIENT_DIR

RETRYABLE: Final = frozenset({"unavailable", "conflict", "busy", "rateLimited", "internal"})
LOST: Final = (ConnectionClosed, InvalidHandshake, OSError, TimeoutError)
RECV_S: Final = 0.2
HEARTBEAT_S: Final = "0.2"  # AGORA_HEARTBEAT_S of every test node
NODE_TIMEOUT_S: Final = "1.5"  # AGORA_NODE_TIMEOUT_S of every test node


def dead_url() -> str:
    """A loopback URL where nothing listens (a port just released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"ws://127.0.0.1:{port}"


async def publish_pipelined(
    ws: Workspace,
    label: str,
    count: int,
    window: int,
    acked: dict[str, int],
    after_each: Callable[[], None],
) -> None:
    """Publish ``count`` messages (``<label>-<i>``) with ``window`` in flight, recording each
    ack's id and seq in ``acked`` and calling ``after_each()`` after each (a test kills a node
    there, with publishes in flight)."""
    gate = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with gate:
            ack = await ws.publish({"kind": "messagePosted", "payload": {"text": f"{label}-{i}"}})
            acked[ack.id] = ack.seq
            after_each()

    async with asyncio.TaskGroup() as tg:
        for i in range(count):
            tg.create_task(one(i))


async def _open(url: str, token: str) -> ClientConnection:
    ws = await connect(url, compression=None, open_timeout=5, max_size=None)
    try:
        await ws.send(json.dumps({"op": "hello", "token": token}))
        async with asyncio.timeout(5):
            welcome = json.loads(await ws.recv())
        assert welcome["op"] == "welcome", welcome
    except BaseException:
        await ws.close()
        raise
    return ws


class Publisher:
    """Publishes ``count`` messages (ids ``<name>-<i>``) to ``workspace``, at most ``window``
    unacknowledged at once, starting on ``urls[start]``."""

    def __init__(
        self,
        name: str,
        urls: list[str],
        workspace: str,
        token: str,
        count: int,
        *,
        start: int = 0,
        window: int = 4,
    ) -> None:
        self.name = name
        self.urls = urls
        self.workspace = workspace
        self.token = token
        self.ids = [f"{name}-{i}" for i in range(count)]
        self.start = start
        self.window = window
        self.acked: dict[str, int] = {}  # id -> seq
        self.duplicates = 0
        self.retried = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []  # publish -> ack, seconds

    async def run(self) -> None:
        todo: deque[str] = deque(self.ids)
        inflight: dict[int, tuple[str, float]] = {}
        rids = itertools.count(1)
        at = self.start
        while len(self.acked) < len(self.ids):
            url = self.urls[at % len(self.urls)]
            at += 1
            try:
                ws = await _open(url, self.token)
            except LOST:
                self.reconnects += 1
                await asyncio.sleep(0.05)
                continue
            try:
                while len(self.acked) < len(self.ids):
                    while todo and len(inflight) < self.window:
                        event_id = todo.popleft()
                        rid = next(rids)
                        inflight[rid] = (event_id, time.perf_counter())
                        event = {
                            "kind": "messagePosted",
                            "id": event_id,
                            "payload": {"text": f"{event_id} via {url}"},
                        }
                        frame = {"op": "publish", "rid": rid, "workspace": self.workspace}
                        await ws.send(json.dumps({**frame, "event": event}))
                    async with asyncio.timeout(10):
                        reply = json.loads(await ws.recv())
                    self._answer(reply, inflight, todo)
            except LOST:
                self.reconnects += 1
                for event_id, _ in inflight.values():
                    todo.appendleft(event_id)  # unacknowledged: publish again, same id
                inflight.clear()
            finally:
                await ws.close()

    def _answer(
        self, reply: dict[str, Any], inflight: dict[int, tuple[str, float]], todo: deque[str]
    ) -> None:
        pending = inflight.pop(reply.get("rid", -1), None)
        if pending is None:
            return
        event_id, sent = pending
        if reply["op"] == "ack":
            assert reply["id"] == event_id, reply
            seq = reply["seq"]
            if event_id in self.acked and self.acked[event_id] != seq:
                self.errors.append(f"{event_id} acked at {self.acked[event_id]} and {seq}")
            self.acked[event_id] = seq
            self.duplicates += bool(reply.get("duplicate"))
            self.latencies.append(time.perf_counter() - sent)
        elif reply["op"] == "error" and reply.get("code") in RETRYABLE:
            self.retried += 1
            todo.append(event_id)
        else:
            self.errors.append(f"{event_id}: {reply}")


class Subscriber:
    """Follows ``workspace`` from seq 1 across nodes; see the module docstring."""

    def __init__(
        self, name: str, urls: list[str], workspace: str, token: str, *, start: int = 0
    ) -> None:
        self.name = name
        self.urls = urls
        self.workspace = workspace
        self.token = token
        self.start = start
        self.events: list[tuple[int, str]] = []  # (seq, id)
        self.received_at: dict[str, float] = {}  # id -> perf_counter when it arrived
        self.errors: list[str] = []
        self.reconnects = 0
        self.subscribed = asyncio.Event()  # set while subscribed
        self.target: int | None = None  # stop once this seq has arrived

    @property
    def last(self) -> int:
        return self.events[-1][0] if self.events else 0

    def done(self) -> bool:
        return self.target is not None and self.last >= self.target

    async def run(self) -> None:
        at = self.start
        while not self.done():
            url = self.urls[at % len(self.urls)]
            at += 1
            try:
                ws = await _open(url, self.token)
            except LOST:
                self.reconnects += 1
                await asyncio.sleep(0.05)
                continue
            try:
                await self._follow(ws)
            except LOST:
                self.reconnects += 1
            finally:
                self.subscribed.clear()
                await ws.close()

    async def _follow(self, ws: ClientConnection) -> None:
        frame = {"op": "subscribe", "rid": "s", "workspace": self.workspace}
        await ws.send(json.dumps({**frame, "afterSeq": self.last}))
        while not self.done():
            try:
                async with asyncio.timeout(RECV_S):
                    message = json.loads(await ws.recv())
            except TimeoutError:
                continue
            op = message.get("op")
            if op == "subscribed":
                self.subscribed.set()
            elif op == "event" and message["workspace"] == self.workspace:
                event = message["event"]
                seq = event["seq"]
                if seq != self.last + 1:
                    self.errors.append(f"got seq {seq} after {self.last}")
                    if seq <= self.last:
                        continue
                self.events.append((seq, event["id"]))
                self.received_at[event["id"]] = time.perf_counter()
            elif op == "error":
                self.errors.append(f"error: {message}")
                raise ConnectionClosed(None, None)


# -- the TypeScript client's sessions (clients/typescript/test/support/failover.mjs) ---------

FAILOVER_SCRIPT = CLIENT_DIR / "test" / "support" / "failover.mjs"
LINE_TIMEOUT = 60.0  # seconds for the script's next line (a failover takes about one)


class TsSession:
    """``failover.mjs`` as a subprocess: a TypeScript session on several nodes, reporting one
    JSON object per line (ready, progress, then its result)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), LINE_TIMEOUT)
        if not raw:
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            raise AssertionError(f"failover.mjs ended: {err.decode(errors='replace')[-3000:]}")
        line: dict[str, Any] = json.loads(raw)
        assert "error" not in line, line
        return line

    async def until(self, key: str) -> dict[str, Any]:
        """The first line with ``key`` (a result line has no ``progress``)."""
        while True:
            line = await self.line()
            if key in line:
                return line


StartTs = Callable[..., Awaitable[TsSession]]
