"""Authentication and rights over real sockets: hello, the Authorization header, expired,
forged, wrong-workspace and missing-right tokens, expiry while connected."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hub.auth import TokenSigner
from tests.support.hub import HubProcess
from tests.support.peer import message, peer
from tests.support.tokens import SECRET, mint


async def test_hello_welcome(hub: HubProcess) -> None:
    async with peer(hub.url) as p:
        await p.send({"op": "hello", "rid": "h1", "token": mint("alice", ["w1"], ["read"])})
        welcome = await p.recv()
    assert welcome["op"] == "welcome"
    assert welcome["rid"] == "h1"
    assert welcome["agent"] == "alice"
    assert welcome["rights"] == ["read"]
    assert welcome["server"].startswith("agora/")
    assert welcome["workspaces"] == ["w1"]


async def test_authorization_header_gets_welcome_unprompted(hub: HubProcess) -> None:
    token = mint("bob", ["*"], ["read", "write"])
    async with peer(hub.url, token, header=True, hello=False) as p:
        welcome = await p.recv()
        assert welcome["op"] == "welcome" and welcome["agent"] == "bob"
        ack = await p.publish("auth-header", message())
        assert ack["op"] == "ack" and ack["seq"] >= 1


async def test_subprotocol_is_optional_and_negotiated(hub: HubProcess) -> None:
    async with peer(hub.url, mint(), subprotocols=["agora.v1"]) as p:
        assert p.ws.subprotocol == "agora.v1"
    async with peer(hub.url, mint()) as p:
        assert p.ws.subprotocol is None


async def test_first_frame_not_hello_is_unauthorized_4401(hub: HubProcess) -> None:
    async with peer(hub.url) as p:
        await p.send({"op": "subscribe", "rid": 1, "workspace": "w"})
        error = await p.recv()
        closed = await p.closed()
    assert error["op"] == "error" and error["code"] == "unauthorized" and error["rid"] == 1
    assert closed.rcvd is not None and closed.rcvd.code == 4401


async def test_garbage_first_frame_is_unauthorized_4401(hub: HubProcess) -> None:
    async with peer(hub.url) as p:
        await p.send("{not json")
        error = await p.recv()
        closed = await p.closed()
    assert error["code"] == "unauthorized"
    assert closed.rcvd is not None and closed.rcvd.code == 4401


async def test_expired_token(hub: HubProcess) -> None:
    token = mint(ttl=60, clock=lambda: time.time() - 3600)
    async with peer(hub.url) as p:
        await p.send({"op": "hello", "token": token})
        error = await p.recv()
        closed = await p.closed()
    assert error["code"] == "unauthorized" and error["details"]["reason"] == "expired"
    assert closed.rcvd is not None and closed.rcvd.code == 4401


async def test_forged_token(hub: HubProcess) -> None:
    forged = mint(secret="another-secret-that-is-long-enough-to-sign")
    for header in (False, True):
        async with peer(hub.url, forged, header=header, hello=False) as p:
            if not header:
                await p.send({"op": "hello", "token": forged})
            error = await p.recv()
            closed = await p.closed()
        assert error["code"] == "unauthorized"
        assert error["details"]["reason"] == "invalid_signature"
        assert closed.rcvd is not None and closed.rcvd.code == 4401


async def test_malformed_authorization_header(hub: HubProcess) -> None:
    async with peer(hub.url, "x", header=True, hello=False) as p:
        error = await p.recv()
        closed = await p.closed()
    assert error["code"] == "unauthorized"
    assert closed.rcvd is not None and closed.rcvd.code == 4401


async def test_wrong_workspace_is_forbidden_and_nothing_written(hub: HubProcess) -> None:
    async with peer(hub.url, mint("admin", ["*"], ["read", "write"])) as admin:
        await admin.publish("secret-ws", message("seed"))
        head = await admin.head("secret-ws")
        async with peer(hub.url, mint("eve", ["other"], ["read", "write"])) as eve:
            requests: list[tuple[str, dict[str, Any]]] = [
                ("publish", {"event": message("x")}),
                ("subscribe", {"afterSeq": 0}),
                ("state", {}),
            ]
            for op, fields in requests:
                reply = await eve.call(op, workspace="secret-ws", **fields)
                assert reply["op"] == "error" and reply["code"] == "forbidden", reply
                assert reply["details"]["workspace"] == "secret-ws"
            # The connection is kept.
            assert (await eve.call("state", workspace="other"))["op"] == "state"
        assert await admin.head("secret-ws") == head


async def test_missing_rights(hub: HubProcess) -> None:
    async with peer(hub.url, mint("reader", ["rights"], ["read"])) as reader:
        reply = await reader.publish("rights", message())
        assert reply["code"] == "forbidden" and reply["details"]["right"] == "write"
        assert await reader.head("rights") == 0
    async with peer(hub.url, mint("writer", ["rights"], ["write"])) as writer:
        for op in ("subscribe", "state"):
            reply = await writer.call(op, workspace="rights")
            assert reply["code"] == "forbidden" and reply["details"]["right"] == "read"
        ack = await writer.publish("rights", message())
        assert ack["op"] == "ack" and ack["seq"] == 1


async def test_hub_kinds_are_forbidden(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        before = await p.head("hubkinds")
        for kind in ("memberJoined", "execStarted", "execRequested"):
            payload: dict[str, str] = {"execId": "e", "backend": "b"}
            if kind == "memberJoined":
                payload = {"agent": "alice"}
            reply = await p.publish("hubkinds", {"kind": kind, "payload": payload})
            assert reply["code"] == "forbidden", reply
        assert await p.head("hubkinds") == before


async def test_producer_is_the_token_agent(hub: HubProcess) -> None:
    async with peer(hub.url, mint("carol")) as p:
        ack = await p.publish("producer", message(producer="mallory"))
        await p.call("subscribe", workspace="producer", afterSeq=ack["seq"] - 1)
        [event] = await p.events("producer", ack["seq"])
    assert event["producer"] == "carol"


async def test_token_expiring_while_connected_closes_4401_at_expiry(hub: HubProcess) -> None:
    """The hub closes the connection when the token expires, without waiting for a frame
    (tests/hub/server/test_revocation.py: also while only streaming)."""
    # exp is whole seconds (now + ttl, rounded down): minted just after a second begins, the
    # token lives a whole second, not whatever was left of the current one.
    await asyncio.sleep(1 - time.time() % 1 + 0.01)
    token = mint("brief", ttl=1)
    exp = TokenSigner(SECRET.encode()).verify(token).expires_at
    async with peer(hub.url, token) as p:
        assert (await p.publish("expiry", message()))["op"] == "ack"
        error = await p.recv()  # unprompted: no frame was sent since the ack
        closed = await p.closed()
    assert time.time() >= exp
    assert error["code"] == "unauthorized" and error["details"]["reason"] == "expired"
    assert error.get("rid") is None
    assert closed.rcvd is not None and closed.rcvd.code == 4401
    assert closed.rcvd.reason == "unauthorized: expired"
    async with peer(hub.url, mint()) as p:
        assert await p.head("expiry") == 1


async def test_hello_again_refreshes_the_token(hub: HubProcess) -> None:
    async with peer(hub.url, mint("dora", ttl=60)) as p:
        reply = await p.call("hello", token=mint("dora", ttl=7200))
        assert reply["op"] == "welcome" and reply["expiresAt"] > time.time() + 3600
        reply = await p.call("hello", token=mint("someone-else"))
        assert reply["code"] == "forbidden"
        assert (await p.call("state", workspace="refresh"))["op"] == "state"
