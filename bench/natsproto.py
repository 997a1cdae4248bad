"""A minimal NATS client for the benchmarks: ``CONNECT``, ``SUB``, ``PUB``, ``MSG`` split in.

Like :mod:`rawws` and :mod:`resp`, an asyncio ``Protocol`` that only encodes and splits the
text protocol (https://docs.nats.io/reference/reference-protocols/nats-protocol), so that a
benchmark measures the server. JetStream is driven through plain subjects: a publish to a
stream's subject with a reply subject gets the stream's ``PubAck`` there once stored;
``$JS.API.*`` requests create streams and push consumers. ``on_msg(subject, sid, payload)`` is
called for every ``MSG``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any


class NatsClient(asyncio.Protocol):
    """One connection to ``nats-server``."""

    def __init__(self, on_msg: Callable[[bytes, int, bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        self.on_msg = on_msg
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ready: asyncio.Future[None] = loop.create_future()  # the first PONG
        self.closed: asyncio.Future[None] = loop.create_future()
        self.close_code: int | None = None
        self.errors: list[str] = []
        self.pending: dict[int, asyncio.Future[bytes]] = {}  # sid → a request's answer

    @classmethod
    async def open(cls, port: int, on_msg: Callable[[bytes, int, bytes], None]) -> NatsClient:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: cls(on_msg), "127.0.0.1", port)
        options = {"verbose": False, "pedantic": False, "headers": False, "protocol": 1}
        proto.send(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
        async with asyncio.timeout(10):
            await proto.ready
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before PONG"))

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        while True:
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            line = bytes(buf[pos:end])
            if line.startswith(b"MSG "):
                parts = line.split()
                size = int(parts[-1])
                if len(buf) < end + 2 + size + 2:
                    break  # the payload is not all here yet
                payload = bytes(buf[end + 2 : end + 2 + size])
                pos = end + 2 + size + 2
                sid = int(parts[2])
                waiter = self.pending.pop(sid, None)
                if waiter is None:
                    self.on_msg(parts[1], sid, payload)
                elif not waiter.done():
                    waiter.set_result(payload)
                continue
            pos = end + 2
            if line == b"PING":
                self.send(b"PONG\r\n")
            elif line == b"PONG":
                if not self.ready.done():
                    self.ready.set_result(None)
            elif line.startswith(b"-ERR"):
                self.errors.append(line.decode(errors="replace"))
            # INFO and +OK need nothing.
        if pos:
            del buf[:pos]

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def sub(self, subject: str, sid: int) -> None:
        self.send(f"SUB {subject} {sid}\r\n".encode())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def pub(subject: str, payload: bytes, reply: str | None = None) -> bytes:
    """A ``PUB`` command (with a reply subject for JetStream's ack)."""
    head = f"PUB {subject} {reply} {len(payload)}" if reply else f"PUB {subject} {len(payload)}"
    return head.encode() + b"\r\n" + payload + b"\r\n"


async def request(client: NatsClient, subject: str, body: dict[str, Any], sid: int) -> Any:
    """A JetStream API request: publish ``body`` with a reply inbox (subscribed as ``sid``),
    wait for the JSON answer; raises on an API error."""
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    client.pending[sid] = fut
    inbox = f"_INBOX.api.{sid}"
    client.sub(inbox, sid)
    client.send(pub(subject, json.dumps(body).encode(), inbox))
    async with asyncio.timeout(10):
        reply = json.loads(await fut)
    client.send(f"UNSUB {sid}\r\n".encode())
    if "error" in reply:
        raise RuntimeError(f"{subject}: {reply['error']}")
    return reply
