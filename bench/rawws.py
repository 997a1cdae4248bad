"""A minimal WebSocket client (RFC 6455) shared by the benchmarks: handshake, masked text
frames out, frames split in, pong and close answered. The driver process has one core of two;
a full client library would measure itself rather than the hub."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable

from websockets.speedups import apply_mask  # C masking, as websockets uses


class RawClient(asyncio.Protocol):
    """One connection. ``on_frame(payload)`` is called for every text frame received."""

    def __init__(self, on_frame: Callable[[bytes], None]) -> None:
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.handshaken = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self.close_code: int | None = None

    @classmethod
    async def open(
        cls,
        port: int,
        on_frame: Callable[[bytes], None],
        *,
        token: str | None = None,
        within: float = 10.0,
    ) -> RawClient:
        """Connect and upgrade. With ``token`` (sent as ``Authorization: Bearer``) also wait
        for the hub's ``welcome``, which is then not passed to ``on_frame``; all within
        ``within`` seconds."""
        loop = asyncio.get_running_loop()
        welcomed: asyncio.Future[None] = loop.create_future()
        if token is None:
            welcomed.set_result(None)

        def first(payload: bytes) -> None:
            if welcomed.done():
                on_frame(payload)
            elif json.loads(payload).get("op") == "welcome":
                welcomed.set_result(None)
            else:
                welcomed.set_exception(ConnectionError(payload.decode()))

        _, proto = await loop.create_connection(lambda: cls(first), "127.0.0.1", port)
        assert proto.transport is not None
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        proto.transport.write(
            (
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: agora.v1\r\n{auth}\r\n"
            ).encode()
        )
        async with asyncio.timeout(within):
            await proto.handshaken
            await welcomed
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.handshaken.done():
            self.handshaken.set_exception(ConnectionError("closed during handshake"))

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        if not self.handshaken.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.handshaken.set_exception(ConnectionError(bytes(buf[:end]).decode()))
                return
            del buf[: end + 4]
            self.handshaken.set_result(None)
        pos, size = 0, len(buf)
        on_frame = self.on_frame
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, head = b1 & 0x7F, 2
            if length == 126:
                if size - pos < 4:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            end = pos + head + length
            if end > size:
                break
            opcode = b0 & 0x0F
            if opcode == 1:
                on_frame(bytes(buf[pos + head : end]))
            elif opcode == 9:  # ping → pong
                self._send(0xA, bytes(buf[pos + head : end]))
            elif opcode == 8:  # close
                if length >= 2:
                    self.close_code = int.from_bytes(buf[pos + head : pos + head + 2], "big")
                self._send(0x8, bytes(buf[pos + head : pos + head + 2]))
            pos = end
        if pos:
            del buf[:pos]

    def _send(self, opcode: int, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        n = len(payload)
        if n < 126:
            head = bytes((0x80 | opcode, 0x80 | n))
        elif n < 65536:
            head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        self.transport.write(head + mask + apply_mask(payload, mask))

    def send(self, payload: bytes) -> None:
        self._send(0x1, payload)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
