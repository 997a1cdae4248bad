"""The caps on connections (hub.server.admission) over real sockets: past ``max_connections``
the handshake is refused with HTTP 503; past ``max_connections_per_agent`` the connection is
told ``busy`` and closed with 1013 right after ``hello``; a connection that never says hello
is closed with 4401 at ``hello_timeout_s``."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from hub.server.admission import ConnectionAdmission
from tests.support.hub import StartHub
from tests.support.peer import peer
from tests.support.tokens import mint

WAIT = 30.0


async def welcomed_again(url: str, token: str) -> None:
    """A connection with ``token`` is admitted again once the hub has torn the closed ones
    down (their close handshake may finish before the hub's teardown ran): retry, bounded."""
    async with asyncio.timeout(WAIT):
        while True:
            if await _welcomed(url, token):
                return
            await asyncio.sleep(0.1)


async def _welcomed(url: str, token: str) -> bool:
    try:
        async with connect(url, proxy=None) as conn:
            await conn.send(json.dumps({"op": "hello", "rid": 0, "token": token}))
            if json.loads(await conn.recv())["op"] != "welcome":
                return False
            with contextlib.suppress(TimeoutError):  # no busy error behind the welcome
                extra = json.loads(await asyncio.wait_for(conn.recv(), 0.5))
                return bool(extra.get("code") != "busy")
            return True
    except (InvalidStatus, ConnectionClosed):
        return False


def test_admission_counts_in_all_and_per_agent() -> None:
    admission = ConnectionAdmission(2, 1)
    admission.connected()
    assert not admission.full
    admission.connected()
    assert admission.full
    assert admission.admit_agent("a") and not admission.admit_agent("a")
    assert admission.admit_agent("b")
    admission.release_agent("a")
    assert admission.agent_connections("a") == 0 and admission.admit_agent("a")
    admission.disconnected()
    assert not admission.full


async def test_over_max_connections_the_handshake_is_refused_with_503(start_hub: StartHub) -> None:
    hub = start_hub("[limits]\nmax_connections = 3\n")
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(3):
            await stack.enter_async_context(peer(hub.url, mint("many")))
        with pytest.raises(InvalidStatus) as info:
            await connect(hub.url, proxy=None)
        assert info.value.response.status_code == 503
    await welcomed_again(hub.url, mint("many"))  # the closed ones made room


async def test_over_the_per_agent_cap_busy_then_1013(start_hub: StartHub) -> None:
    hub = start_hub("[limits]\nmax_connections_per_agent = 2\n")
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(peer(hub.url, mint("greedy")))
        async with peer(hub.url, mint("other")):  # another agent is not affected
            pass
        async with connect(hub.url, proxy=None) as third:
            await third.send(json.dumps({"op": "hello", "rid": 0, "token": mint("greedy")}))
            welcome = json.loads(await asyncio.wait_for(third.recv(), WAIT))
            assert welcome["op"] == "welcome"  # authenticated, then counted
            error = json.loads(await asyncio.wait_for(third.recv(), WAIT))
            assert error["op"] == "error" and error["code"] == "busy", error
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(third.recv(), WAIT)
        assert third.close_code == 1013, third.close_code
    await welcomed_again(hub.url, mint("greedy"))  # the two left: room again


async def test_no_hello_by_the_deadline_closes_4401(start_hub: StartHub) -> None:
    hub = start_hub("[limits]\nhello_timeout_s = 1.0\n")
    async with connect(hub.url, proxy=None) as silent:
        error = json.loads(await asyncio.wait_for(silent.recv(), WAIT))
        assert error["op"] == "error" and error["code"] == "unauthorized", error
        assert error["details"]["reason"] == "helloTimeout", error
        with contextlib.suppress(ConnectionClosed):
            await asyncio.wait_for(silent.recv(), WAIT)
    assert silent.close_code == 4401
    async with peer(hub.url, mint("prompt")) as p:  # a hello in time is not affected
        await asyncio.sleep(1.5)
        assert (await p.call("subscribe", workspace="w"))["op"] == "subscribed"
