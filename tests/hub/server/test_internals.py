"""Internals the batched writer (hub/server/connection.py ``_write``) leans on, pinned: websockets
has an upper bound in pyproject.toml and this test names the internal when it moves."""

from __future__ import annotations

import asyncio
import contextlib

import websockets
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve


def test_websockets_major() -> None:
    major = int(websockets.version.version.split(".")[0])
    assert 14 <= major < 18, f"websockets {major}: re-check send_context/send_in_progress"


async def test_send_context_and_protocol_send_text() -> None:
    """On a real connection: ``send_context()`` is an async context manager, ``send_in_progress``
    an attribute, and ``protocol.send_text`` frames text the peer receives as one message."""
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        assert hasattr(ws, "send_in_progress"), "websockets Connection.send_in_progress is gone"
        assert ws.send_in_progress is None
        context = getattr(ws, "send_context", None)
        assert callable(context), "websockets Connection.send_context is gone"
        async with context():
            ws.protocol.send_text(b'{"ok":1}')
        with contextlib.suppress(Exception):
            await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            seen.set_result(str(await asyncio.wait_for(client.recv(), 30)))
    assert seen.result() == '{"ok":1}'


async def test_the_read_ahead_takes_buffered_messages() -> None:
    """The publish read-ahead (``hub.server.connection._take_buffered``) takes whole messages
    from websockets' assembler queue (``recv_messages.frames.queue``, ``get_in_progress``,
    ``maybe_resume``) as ``recv()`` would return them. Should that move, reading silently
    falls back to one message at a time: this names it."""
    from hub.server.connection import _take_buffered

    seen: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        messages = getattr(ws, "recv_messages", None)
        assert messages is not None, "websockets Connection.recv_messages is gone"
        assert hasattr(messages, "frames"), "websockets Assembler.frames is gone"
        assert hasattr(messages.frames, "queue"), "websockets SimpleQueue.queue is gone"
        assert hasattr(messages, "get_in_progress"), "websockets Assembler.get_in_progress is gone"
        assert callable(getattr(messages, "maybe_resume", None)), "Assembler.maybe_resume is gone"
        first = await ws.recv()
        for _ in range(100):  # the others arrived in the same write; let them be parsed
            if len(messages.frames.queue) >= 3:
                break
            await asyncio.sleep(0.01)
        taken = [_take_buffered(ws), _take_buffered(ws)]
        # Not UTF-8: left for recv, which fails the connection with 1007 as before.
        taken.append(_take_buffered(ws))
        seen.set_result([first, *taken])
        with contextlib.suppress(Exception):
            await ws.recv()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            for data in ("a", "é", b"\x00bin"):
                await client.send(data)
            await client.send(b"\xff", text=True)  # invalid UTF-8 in a text frame
            assert await asyncio.wait_for(seen, 30) == ["a", "é", b"\x00bin", None]
            with contextlib.suppress(Exception):
                await client.recv()
            assert client.close_code == 1007
