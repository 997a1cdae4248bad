"""Measure the hub's memory at the door (issue #11's figures; not a test).

``python3 -m tests.adversarial.measure [--contents]`` from the repo root starts ``agora serve``
(tests/support launcher, default configuration), then:

1. a read-only client sends 250 ``state`` requests for a workspace of 32 files (~1.9 MB of
   content; ``--contents`` asks for it, as a client must since the state reply is metadata by
   default) and reads none of the replies: the hub's RSS before and after, and the close code;
2. 1,000 connections that never send ``hello``: RSS while they are open, and the close codes
   they get (4401 at ``hello_timeout_s``) within 40 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import peer
from tests.support.tokens import mint

REQUESTS = 250
IDLE = 1000


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS")


def tiny_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return sock


async def unread_replies(hub: HubProcess, contents: bool) -> str:
    assert hub.proc is not None
    pid = hub.proc.pid
    extra: dict[str, Any] = {"contents": True} if contents else {}
    async with peer(hub.url, mint("filler")) as p:
        for i in range(32):
            text = f"{i:02d}" * 30_000
            event = {"kind": "fileWritten", "payload": {"path": f"f{i}.txt", "text": text}}
            assert (await p.publish("big", event))["op"] == "ack"
        size = len(json.dumps(await p.call("state", workspace="big", **extra)))
    before = rss_mb(pid)
    token = mint("reader", rights=("read",))
    async with ws_connect(
        hub.url,
        sock=tiny_socket(hub.url),
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=None,
        max_queue=1,
        proxy=None,
    ) as slow:
        request = {"op": "state", "workspace": "big"} | extra
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            for rid in range(REQUESTS):
                await asyncio.wait_for(slow.send(json.dumps(request | {"rid": rid})), 5)
        await asyncio.sleep(3)  # the hub has read and answered what reached it
        peak = rss_mb(pid)
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            async with asyncio.timeout(120):
                while True:
                    await slow.recv()
    return (
        f"state reply {size / 1e6:.2f} MB; hub RSS {before} MB before, {peak} MB after "
        f"{REQUESTS} unread replies; close code {slow.close_code}"
    )


async def idle_connections(hub: HubProcess) -> str:
    assert hub.proc is not None
    pid = hub.proc.pid
    before = rss_mb(pid)
    started = time.monotonic()
    conns: list[ClientConnection] = []
    for _ in range(IDLE):
        conns.append(await ws_connect(hub.url, proxy=None, open_timeout=60))
    await asyncio.sleep(1)
    peak = rss_mb(pid)
    codes: dict[int | None, int] = {}

    async def until_closed(conn: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await conn.recv()
        codes[conn.close_code] = codes.get(conn.close_code, 0) + 1

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(40):
            await asyncio.gather(*(until_closed(c) for c in conns))
    elapsed = time.monotonic() - started
    still = sum(1 for c in conns if c.close_code is None)
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return (
        f"{IDLE} idle unauthenticated connections: hub RSS {before} MB before, {peak} MB with "
        f"them; close codes {codes} within {elapsed:.1f} s; still open {still}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--contents", action="store_true")
    args = parser.parse_args()
    starter = HubStarter(Path(tempfile.mkdtemp(prefix="agora-measure-")))
    try:
        hub = starter.start()
        print(await unread_replies(hub, args.contents))
        print(await idle_connections(hub))
    finally:
        starter.close()


if __name__ == "__main__":
    asyncio.run(main())
