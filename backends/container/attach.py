"""A container's stdio over the engine's attach socket: the request's stdin in, the
multiplexed stdout/stderr (8-byte frame headers) out into the run's output channel."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Final

from backends.container.spec import READ_SIZE
from backends.output import OutputChannel
from hub.core.execution.result import Stream

__all__ = ["pump", "write_stdin"]


async def write_stdin(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` to the container's stdin, then end it (half-close the socket)."""
    with contextlib.suppress(ConnectionError, OSError):
        if data:
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


_HEADER: Final = struct.Struct(">BxxxL")
_STREAMS: Final[dict[int, Stream]] = {1: "stdout", 2: "stderr"}


async def pump(reader: asyncio.StreamReader, channel: OutputChannel) -> None:
    """Demultiplex the attach stream (8-byte headers: stream, size) into the channel until
    EOF. Both streams are closed whatever happens."""
    try:
        while True:
            try:
                header = await reader.readexactly(_HEADER.size)
            except asyncio.IncompleteReadError:
                return
            kind, size = _HEADER.unpack(header)
            stream = _STREAMS.get(kind)
            while size:
                data = await reader.read(min(size, READ_SIZE))
                if not data:
                    return
                size -= len(data)
                if stream is not None:
                    await channel.feed(stream, data)
    finally:
        channel.close("stdout")
        channel.close("stderr")
