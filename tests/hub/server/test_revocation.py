"""Token revocation and token end over real sockets against a real ``agora serve``.

A revocation is written by ``agora token revoke`` (a separate process, into the same SQLite
file or PostgreSQL schema) while the hub runs; the hub must then refuse the token at ``hello``
and at the handshake, and close live connections that use it (error ``unauthorized`` reason
``revoked``, then 4401). A token's expiry closes a connection that only streams; tokens with
an ``iat`` in the future or a lifetime over ``[auth] max_token_ttl`` are refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from hub.auth import MAX_TTL_SECONDS, TokenSigner
from hub.core.capability import SYSTEM_WORKSPACE
from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.peer import Peer, message, peer
from tests.support.tokens import SECRET, mint

UNAUTHORIZED = 4401
WAIT = 20.0  # generous bound on every wait (a loaded 2-core machine)


def token_id(token: str) -> str:
    return TokenSigner(SECRET.encode()).verify(token).token_id


async def agora(*argv: str, store: list[str]) -> str:
    """Run ``python -m hub ARGV… STORE…`` as a separate process; its stdout (exit 0 asserted)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hub",
        *argv,
        *store,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def data_store(hub: HubProcess) -> list[str]:
    return ["--data", str(hub.data_dir)]


async def refusal(url: str, token: str, *, header: bool = False) -> tuple[dict[str, Any], int, str]:
    """Authenticate with ``token`` (hello, or the handshake header); the error frame and the
    close (code, reason) the hub answers with. Fails if the hub welcomes the token."""
    headers = {"Authorization": f"Bearer {token}"} if header else None
    async with connect(url, additional_headers=headers, open_timeout=10) as ws:
        if not header:
            await ws.send(json.dumps({"op": "hello", "rid": 1, "token": token}))
        async with asyncio.timeout(WAIT):
            frame = json.loads(await ws.recv())
            assert frame["op"] == "error", frame
            try:
                while True:
                    await ws.recv()
            except ConnectionClosed as e:
                assert e.rcvd is not None
                return frame, e.rcvd.code, e.rcvd.reason
    raise AssertionError("unreachable")


async def welcomed(url: str, token: str) -> bool:
    async with connect(url, open_timeout=10) as ws:
        await ws.send(json.dumps({"op": "hello", "rid": 1, "token": token}))
        async with asyncio.timeout(WAIT):
            frame = json.loads(await ws.recv())
        return bool(frame["op"] == "welcome")


async def until_refused(url: str, token: str) -> tuple[dict[str, Any], int, str]:
    """Wait (bounded) until the hub has picked up a revocation: the token is refused."""
    deadline = time.monotonic() + WAIT
    while await welcomed(url, token):
        assert time.monotonic() < deadline, "the hub never picked up the revocation"
        await asyncio.sleep(0.1)
    return await refusal(url, token)


async def closed_with(p: Peer) -> tuple[list[dict[str, Any]], int, str]:
    """Frames until the hub closes the connection, and the close (code, reason)."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        try:
            while True:
                frames.append(json.loads(await p.ws.recv()))
        except ConnectionClosed as e:
            assert e.rcvd is not None, "the hub did not send a close frame"
            return frames, e.rcvd.code, e.rcvd.reason


def errors(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f.get("op") == "error"]


# -- revocation ---------------------------------------------------------------------------------


async def test_revoked_token_refused_at_hello_and_handshake(hub: HubProcess) -> None:
    token = mint("mallory")
    other = mint("mallory")  # another token of the same agent, not revoked
    assert await welcomed(hub.url, token)
    out = await agora("token", "revoke", f"--token-id={token_id(token)}", store=data_store(hub))
    assert out.split()[0] == "1"  # seq 1 of the system workspace

    frame, code, reason = await until_refused(hub.url, token)
    assert frame["code"] == "unauthorized" and frame["details"]["reason"] == "revoked", frame
    assert (code, reason) == (UNAUTHORIZED, "unauthorized: revoked")
    _, code, reason = await refusal(hub.url, token, header=True)
    assert (code, reason) == (UNAUTHORIZED, "unauthorized: revoked")
    assert await welcomed(hub.url, other)

    listed = await agora("token", "revoked", store=data_store(hub))
    assert f"tokenId={token_id(token)}" in listed


async def test_live_connection_closed_when_its_token_is_revoked(hub: HubProcess) -> None:
    """A connection that only reads (a subscription) is closed once its token is revoked;
    another agent's connection stays open."""
    async with (
        peer(hub.url, mint("mallory")) as victim,
        peer(hub.url, mint("alice")) as bystander,
    ):
        assert (await victim.call("subscribe", workspace="w"))["op"] == "subscribed"
        assert (await bystander.call("subscribe", workspace="w"))["op"] == "subscribed"
        out = await agora("token", "revoke", "--agent", "mallory", "--json", store=data_store(hub))
        frames, code, reason = await closed_with(victim)
        elapsed = time.time() - json.loads(out)["timestamp"] / 1000
        assert (code, reason) == (UNAUTHORIZED, "unauthorized: revoked")
        [error] = errors(frames)
        assert error["code"] == "unauthorized" and error["details"]["reason"] == "revoked"
        print(f"closed {elapsed:.3f}s after the revocation was appended")
        # The other agent's connection is untouched and still served.
        ack = await bystander.publish("w", message("still here"))
        assert ack["op"] == "ack", ack


async def test_agent_revocation_spares_tokens_issued_later(hub: HubProcess) -> None:
    old = mint("mallory")
    await agora(
        "token", "revoke", "--agent", "mallory", "--reason", "rotated", store=data_store(hub)
    )
    frame, _, _ = await until_refused(hub.url, old)
    assert frame["details"]["reason"] == "revoked"
    # iat is in whole seconds: a token of the next second is new.
    await asyncio.sleep(1.1)
    assert await welcomed(hub.url, mint("mallory"))


async def test_revocation_written_before_start_is_loaded(
    start_hub: Callable[..., HubProcess], tmp_path: Path
) -> None:
    token = mint("mallory")
    data = tmp_path / "pre"
    await agora("token", "revoke", f"--token-id={token_id(token)}", store=["--data", str(data)])
    hub = start_hub(data_dir=data)
    frame, code, _ = await refusal(hub.url, token)  # at once: loaded before accepting
    assert frame["details"]["reason"] == "revoked" and code == UNAUTHORIZED


async def test_clients_cannot_write_the_system_workspace(hub: HubProcess) -> None:
    async with peer(hub.url, mint("mallory", rights=("admin",))) as p:
        for event in (
            {"kind": "tokenRevoked", "payload": {"agent": "alice"}},
            message("hi"),
        ):
            reply = await p.publish(SYSTEM_WORKSPACE, event)
            assert reply["op"] == "error" and reply["code"] == "forbidden", reply
        # "*" does not cover the system workspace.
        reply = await p.call("subscribe", workspace=SYSTEM_WORKSPACE)
        assert reply["op"] == "error" and reply["code"] == "forbidden", reply


# -- token end ------------------------------------------------------------------------------------


async def test_expiry_closes_a_connection_that_only_streams(hub: HubProcess) -> None:
    """The reader never sends a frame after subscribing; events keep arriving until the
    token expires, then the hub closes with 4401 ``unauthorized: expired``."""
    token = mint("reader", ttl=3)
    exp = TokenSigner(SECRET.encode()).verify(token).expires_at
    async with peer(hub.url, token) as reader, peer(hub.url, mint("writer")) as writer:
        assert (await reader.call("subscribe", workspace="w"))["op"] == "subscribed"

        async def keep_publishing() -> None:
            while True:
                await writer.publish("w", message("tick"))
                await asyncio.sleep(0.2)

        ticker = asyncio.create_task(keep_publishing())
        try:
            frames, code, reason = await closed_with(reader)
        finally:
            ticker.cancel()
        closed_at = time.time()
    assert (code, reason) == (UNAUTHORIZED, "unauthorized: expired")
    [error] = errors(frames)
    assert error["details"]["reason"] == "expired"
    assert any(f.get("op") == "event" for f in frames)  # it was streaming until then
    assert closed_at >= exp
    print(f"closed {closed_at - exp:.3f}s after exp")


async def test_expiry_ends_a_getexec_stream(start_hub: Callable[..., HubProcess]) -> None:
    """A connection that only reads a running execution's output (``getExec``) is closed
    when its token expires, while the execution is still producing output."""
    hub = start_hub(config='[[backends]]\nid = "sh"\nkind = "process"\n')
    signer = TokenSigner(SECRET.encode())
    token = signer.issue("runner", ["*"], ["read", "exec"], backends=["*"], ttl_seconds=4)
    exp = signer.verify(token).expires_at
    loop = "while true; do echo tick; sleep 0.2; done"
    async with peer(hub.url, token) as p:
        accepted = await p.call("exec", workspace="w", source=loop, execId="x", encoding="utf8")
        assert accepted["op"] == "execAccepted", accepted
        await p.send({"op": "getExec", "rid": "g", "workspace": "w", "execId": "x"})
        frames, code, reason = await closed_with(p)
    assert (code, reason) == (UNAUTHORIZED, "unauthorized: expired")
    assert any(f.get("op") == "execEvent" and f.get("rid") == "g" for f in frames)
    assert not any(f.get("op") == "execEnd" for f in frames)  # still running at the close
    assert time.time() >= exp
    fresh = signer.issue("runner", ["*"], ["read", "exec"], backends=["*"], ttl_seconds=60)
    async with peer(hub.url, fresh) as again:  # the execution outlives the connection
        reply = await again.call("kill", workspace="w", execId="x")
        assert reply["op"] == "killed", reply


async def test_a_fresh_hello_moves_the_end(hub: HubProcess) -> None:
    async with peer(hub.url, mint("alice", ttl=2)) as p:
        refreshed = await p.call("hello", token=mint("alice", ttl=3600))
        assert refreshed["op"] == "welcome", refreshed
        await asyncio.sleep(3)  # past the first token's exp
        reply = await p.call("state", workspace="w")
        assert reply["op"] == "state", reply


async def test_iat_in_the_future_refused(hub: HubProcess) -> None:
    ahead = mint("alice", clock=lambda: time.time() + 120)
    frame, code, _ = await refusal(hub.url, ahead)
    assert frame["details"]["reason"] == "future" and code == UNAUTHORIZED
    within_leeway = mint("alice", clock=lambda: time.time() + 30)
    assert await welcomed(hub.url, within_leeway)


async def test_lifetime_over_max_token_ttl_refused(
    hub: HubProcess, start_hub: Callable[..., HubProcess]
) -> None:
    """A correctly signed 31-day token (the default maximum is 30 days) is refused; a hub
    configured with a longer maximum accepts it."""
    loose = TokenSigner(SECRET.encode(), max_ttl=MAX_TTL_SECONDS)
    long_lived = loose.issue("alice", ["*"], ["read"], ttl_seconds=31 * 86400)
    frame, code, _ = await refusal(hub.url, long_lived)
    assert frame["details"]["reason"] == "lifetime" and code == UNAUTHORIZED
    assert await welcomed(hub.url, mint("alice", ttl=30 * 86400))
    other = start_hub(config=f"[auth]\nmax_token_ttl = {40 * 86400}\n")
    assert await welcomed(other.url, long_lived)


@pytest.mark.parametrize("ttl", [MAX_TTL_SECONDS + 1])
async def test_config_refuses_a_maximum_over_366_days(tmp_path: Path, ttl: int) -> None:
    config = tmp_path / "agora.toml"
    config.write_text(f"[auth]\nmax_token_ttl = {ttl}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub", "serve", "--port", "0", "--no-a2a", "--no-http",
        "--data", str(tmp_path / "d"), "--config", str(config),
        cwd=REPO, env=dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(REPO)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 2 and out == b""
    assert b"max_token_ttl" in err
