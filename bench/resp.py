"""A minimal Redis (RESP2) client for the benchmarks: commands out, replies parsed in order.

Like :mod:`rawws` for the hub, it is an asyncio ``Protocol`` that only encodes commands and
splits replies, so that a benchmark measures the server, not a client library (the driver
process has one core of two). ``on_reply(value)`` is called for every reply, in order; a
value is ``bytes`` (simple or bulk string), ``int``, ``None``, a ``list`` of values, or a
:class:`RespError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class RespError(Exception):
    """An error reply (``-ERR …``)."""


class _Incomplete(Exception):
    pass


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 value at ``pos``: (value, position after it); :class:`_Incomplete` if cut."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind, line = buf[pos], bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == 0x2B:  # +simple
        return line, pos
    if kind == 0x2D:  # -error
        return RespError(line.decode(errors="replace")), pos
    if kind == 0x3A:  # :integer
        return int(line), pos
    if kind == 0x24:  # $bulk
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        return bytes(buf[pos : pos + n]), pos + n + 2
    if kind == 0x2A:  # *array
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    raise RespError(f"bad RESP type byte {kind!r}")


def command(*args: bytes | str | int) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RespClient(asyncio.Protocol):
    """One connection to ``redis-server``."""

    def __init__(self, on_reply: Callable[[Any], None]) -> None:
        loop = asyncio.get_running_loop()
        self.on_reply = on_reply
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.close_code: int | None = None

    @classmethod
    async def open(cls, port: int, on_reply: Callable[[Any], None]) -> RespClient:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: cls(on_reply), "127.0.0.1", port)
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        try:
            while pos < len(buf):
                value, pos_next = _parse(buf, pos)
                pos = pos_next
                self.on_reply(value)
        except _Incomplete:
            pass
        if pos:
            del buf[:pos]

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
