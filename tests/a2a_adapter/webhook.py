"""A webhook receiver on loopback for the push-notification tests: a real HTTP/1.1 server
(asyncio streams, one request per connection) that records what the hub POSTs and answers with
scripted statuses."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from typing import Any

from tests.support.waiting import wait_for


@dataclasses.dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # the decoded JSON


class WebhookReceiver:
    """``async with WebhookReceiver() as hook``: ``hook.url`` takes POSTs; ``hook.received``
    lists them. ``statuses``: the answers to the first requests, in order (then 200);
    ``delay``: seconds to wait before answering; ``location``: sent with 3xx answers."""

    def __init__(
        self, statuses: list[int] | None = None, *, delay: float = 0.0, location: str = ""
    ) -> None:
        self.statuses = list(statuses or [])
        self.delay = delay
        self.location = location
        self.received: list[Received] = []
        self.arrival = asyncio.Event()  # set at each request (clear it to wait for the next)
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?k=secret"

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def wait(self, count: int, within: float = 15.0) -> list[Received]:
        await wait_for(lambda: len(self.received) >= count, within=within)
        return self.received

    def states(self) -> list[str]:
        return [r.body["statusUpdate"]["status"]["state"] for r in self.received]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                self.received.append(
                    Received(method, path, headers, json.loads(raw) if raw else None)
                )
                self.arrival.set()
                if self.delay:
                    await asyncio.sleep(self.delay)
                status = self.statuses.pop(0) if self.statuses else 200
                extra = f"Location: {self.location}\r\n" if 300 <= status < 400 else ""
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n"
                    f"{extra}\r\nok".encode()
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
