"""The client's own bounds: a frame over its ``max_frame_bytes`` and a repeated identical close
reach the caller as typed errors after a bounded number of tries (no silent endless reconnect),
and reconnects do not churn presence."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve

from hub.client import connect
from hub.core.backoff import Backoff
from hub.core.errors import TooLarge, Unavailable
from tests.hub.client.helpers import WAIT, name
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import exec_peer, peer
from tests.support.tokens import mint


async def test_frame_over_the_clients_limit_is_raised_not_retried(hub: HubProcess) -> None:
    """An event larger than the client accepts (1009 from the client's side) fails the
    subscription and the session with TooLarge instead of reconnecting forever."""
    workspace = name()
    async with peer(hub.url, mint("writer")) as writer:
        ack = await writer.publish(
            workspace, {"kind": "messagePosted", "payload": {"text": "x" * 200_000}}
        )
        assert ack["op"] == "ack", ack
    async with connect(hub.url, hub.token("reader"), max_frame_bytes=64 * 1024) as session:
        ws = session.workspace(workspace)
        with pytest.raises(TooLarge):
            async with asyncio.timeout(WAIT * 3), ws.subscribe(0) as sub:
                async for _ in sub:
                    pass
        assert session.reconnects <= 5, session.reconnects
        assert session.closed


async def test_a_repeated_identical_close_is_raised_after_bounded_tries() -> None:
    """A server that welcomes the client and then closes it the same way every time (here
    1011) makes the session fail with Unavailable after MAX_IDENTICAL_CLOSES connections, not
    reconnect for ever."""
    accepted = 0

    async def handler(conn: ServerConnection) -> None:
        nonlocal accepted
        accepted += 1
        hello = json.loads(await conn.recv())
        welcome = {"op": "welcome", "rid": hello.get("rid"), "agent": "a", "rights": ["read"]}
        await conn.send(json.dumps(welcome | {"server": "fake", "protocol": "agora.v1"}))
        await conn.close(1011, "internal error")

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        fast = Backoff(initial=0.01, maximum=0.05, give_up_after=None)
        session = connect(f"ws://127.0.0.1:{port}", "t", backoff=fast, max_identical_closes=4)
        async with session:
            ws = session.workspace("w")
            with pytest.raises(Unavailable) as info:
                async with asyncio.timeout(WAIT * 3), ws.subscribe(0) as sub:
                    async for _ in sub:
                        pass
            assert info.value.details["closeCode"] == 1011
            assert session.closed
    assert accepted == 4


@pytest.fixture
def graceful_hub(tmp_path: Path) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path)
    yield starter.start("[server]\npresence_grace_s = 60\n")
    starter.close()


async def test_a_reconnect_within_the_grace_window_does_not_churn_presence(
    graceful_hub: HubProcess,
) -> None:
    """Three reconnects of a subscriber append one memberJoined and no memberLeft."""
    hub, workspace = graceful_hub, name()
    for _ in range(4):
        async with peer(hub.url, mint("flaky")) as p:
            assert (await p.call("subscribe", workspace=workspace))["op"] == "subscribed"
    async with exec_peer(hub.url) as reader:
        # The writer's own marker: everything presence wrote before it is in the log.
        await reader.publish(workspace, {"kind": "messagePosted", "payload": {"text": "mark"}})
        log = await reader.log(workspace)
    kinds = [(e["kind"], e["payload"].get("agent")) for e in log if e["kind"] != "messagePosted"]
    assert kinds == [("memberJoined", "flaky")], kinds


async def test_a_leave_is_written_once_the_grace_window_passes(own_hub: HubProcess) -> None:
    """Without a reconnect the memberLeft comes (default grace, bounded wait)."""
    hub, workspace = own_hub, name()
    async with peer(hub.url, mint("gone")) as p:
        assert (await p.call("subscribe", workspace=workspace))["op"] == "subscribed"
    async with exec_peer(hub.url) as reader:
        async with asyncio.timeout(60):
            while True:
                log = await reader.log(workspace)
                left = [e for e in log if e["kind"] == "memberLeft"]
                if left:
                    break
                await asyncio.sleep(0.2)
    assert (left[0]["payload"]["agent"], left[0]["payload"]["reason"]) == ("gone", "closed")
