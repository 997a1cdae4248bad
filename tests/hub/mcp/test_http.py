"""``/mcp`` on the hub's HTTP port, one test per attack class, over real sockets: the bearer
token (missing, malformed, forged, expired, revoked → 401 with ``WWW-Authenticate: Bearer``),
a session used with another token (404), the session cap (503), the per-agent cap (one
agent's oldest session ends), a session whose hub connection failed (no slot held), an
oversized body (413), the hub connection behind each MCP session (the token's agent; closed
with the session), and a session ended by ``DELETE`` or its idle timeout leaving neither its
token watcher nor its hub connection behind (counted on ``/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from hub.auth import TokenSigner
from hub.client import connect
from hub.core.validation import DEFAULT_LIMITS
from tests.support.hub import HubProcess, HubStarter
from tests.support.mcp import (
    MAX_SESSIONS,
    MAX_SESSIONS_PER_AGENT,
    mcp_http,
    mcp_url,
    structured,
    tool_error,
)
from tests.support.paths import REPO
from tests.support.tokens import SECRET, mint
from tests.support.waiting import wait_for

WAIT: Final = 30.0
ACCEPT: Final = {"Accept": "application/json, text/event-stream"}


def _initialize(rid: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


async def _post(
    client: httpx2.AsyncClient,
    hub: HubProcess,
    body: Any,
    token: str | None,
    session_id: str | None = None,
) -> httpx2.Response:
    headers = dict(ACCEPT)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
        headers["Mcp-Protocol-Version"] = "2025-06-18"
    return await client.post(mcp_url(hub), json=body, headers=headers)


@contextlib.asynccontextmanager
async def _raw_session(
    client: httpx2.AsyncClient, hub: HubProcess, token: str
) -> AsyncIterator[str]:
    """An initialized MCP session over plain HTTP; DELETEd at the end."""
    response = await _post(client, hub, _initialize(), token)
    assert response.status_code == 200, response.text
    session_id = response.headers["mcp-session-id"]
    try:
        yield session_id
    finally:
        headers = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id}
        await client.delete(mcp_url(hub), headers=headers)


async def _revoke(hub: HubProcess, token: str) -> None:
    token_id = TokenSigner(SECRET.encode()).verify(token).token_id
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hub", "token", "revoke", f"--token-id={token_id}"),
        *("--data", str(hub.data_dir)),
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()


def _refused(response: httpx2.Response, error: str) -> None:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="agora"'), challenge
    assert f'error="{error}"' in challenge
    assert response.json()["error"] == error


@pytest.mark.parametrize(
    ("authorization", "error"),
    [
        (None, "invalid_request"),
        ("Basic YWxpY2U6c2VjcmV0", "invalid_request"),
        ("Bearer", "invalid_request"),
        ("Bearer not-a-token", "invalid_token"),
        ("FORGED", "invalid_token"),
        ("EXPIRED", "invalid_token"),
    ],
)
async def test_bad_bearer_is_401(hub: HubProcess, authorization: str | None, error: str) -> None:
    if authorization == "FORGED":
        authorization = "Bearer " + mint("alice", secret="another-secret-0123456789-abcdefghijkl")
    elif authorization == "EXPIRED":
        past = time.time() - 7200
        authorization = "Bearer " + mint("alice", ttl=60, secret=hub.secret, clock=lambda: past)
    headers = dict(ACCEPT)
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        response = await client.post(mcp_url(hub), json=_initialize(), headers=headers)
        _refused(response, error)
        # The token in the query string is not a way in either (the spec forbids it).
        query = await client.post(mcp_url(hub) + "?access_token=x", json=_initialize())
        _refused(query, "invalid_request")


async def test_revoked_token_is_401_even_mid_session(hub: HubProcess, workspace: str) -> None:
    token = hub.token("mallory")
    async with httpx2.AsyncClient(timeout=WAIT) as client, _raw_session(client, hub, token) as sid:
        await _revoke(hub, token)
        for _ in range(100):  # the hub learns of the revocation from its log: soon
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            response = await _post(client, hub, call, token, sid)
            if response.status_code == 401:
                break
            await asyncio.sleep(0.1)
        _refused(response, "invalid_token")
        assert response.json()["reason"] == "revoked"
        again = await _post(client, hub, _initialize(), token)
        _refused(again, "invalid_token")
        # ... and the session ended with it (not at the idle timeout): its slot is free.
        async with contextlib.AsyncExitStack() as stack:
            for i in range(MAX_SESSIONS):
                await stack.enter_async_context(_raw_session(client, hub, hub.token(f"rv{i}")))


async def test_a_session_is_its_tokens(hub: HubProcess) -> None:
    alice, bob = hub.token("alice"), hub.token("bob")
    async with httpx2.AsyncClient(timeout=WAIT) as client, _raw_session(client, hub, alice) as sid:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        stolen = await _post(client, hub, call, bob, sid)
        assert stolen.status_code == 404, stolen.text
        other_alice = mint("alice", secret=hub.secret)  # same agent, another token id
        assert (await _post(client, hub, call, other_alice, sid)).status_code == 404


async def test_sessions_are_capped(hub: HubProcess) -> None:
    tokens = [hub.token(f"capped{i}") for i in range(MAX_SESSIONS)]
    async with httpx2.AsyncClient(timeout=WAIT) as client, contextlib.AsyncExitStack() as stack:
        for token in tokens:
            await stack.enter_async_context(_raw_session(client, hub, token))
        refused = await _post(client, hub, _initialize(), hub.token("late"))
        assert refused.status_code == 503, refused.text
        await stack.aclose()  # DELETE: room again
        async with _raw_session(client, hub, hub.token("late")):
            pass


async def test_one_agent_cannot_fill_every_slot(hub: HubProcess) -> None:
    """The attack: one token sends many ``initialize`` POSTs (never DELETEs). It holds at most
    ``max_sessions_per_agent``: each new one ends its oldest; another agent still gets in."""
    token = hub.token("hog")
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        opened: list[str] = []
        for _ in range(MAX_SESSIONS * 3):
            response = await _post(client, hub, _initialize(), token)
            assert response.status_code == 200, response.text
            opened.append(response.headers["mcp-session-id"])
        # The same agent with another token id shares the cap.
        response = await _post(client, hub, _initialize(), mint("hog", secret=hub.secret))
        assert response.status_code == 200, response.text
        victim = hub.token("victim")
        async with _raw_session(client, hub, victim) as sid:
            assert (await _post(client, hub, call, victim, sid)).status_code == 200
        live = [sid for sid in opened if (await _post(client, hub, call, token, sid)).is_success]
        assert live == opened[-(MAX_SESSIONS_PER_AGENT - 1) :]
        for sid in live:
            await client.delete(
                mcp_url(hub), headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": sid}
            )


async def test_a_session_whose_hub_connection_failed_holds_no_slot(tmp_path: Path) -> None:
    """The hub refuses the agent's connection (its per-agent connection limit): the tool call
    fails and the session is gone (404), so such sessions never fill ``max_sessions``."""
    starter = HubStarter(tmp_path)
    config = "[limits]\nmax_connections_per_agent = 1\n\n[mcp]\nmax_sessions = 2\n"
    hub = starter.start(config, a2a_port=0)
    try:
        token = hub.token("busy")
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "workspace_state", "arguments": {"workspace": "w"}},
        }
        async with (
            connect(hub.url, token),  # the agent's one allowed hub connection
            httpx2.AsyncClient(timeout=WAIT) as client,
        ):
            for _ in range(3):
                response = await _post(client, hub, _initialize(), token)
                assert response.status_code == 200, response.text
                sid = response.headers["mcp-session-id"]
                failed = await _post(client, hub, call, token, sid)
                assert failed.status_code == 200 and '"isError":true' in failed.text, failed.text
                again = await _post(client, hub, call, token, sid)
                assert again.status_code == 404, (failed.text, again.text)
            async with (
                _raw_session(client, hub, hub.token("other")),
                _raw_session(client, hub, hub.token("another")),
            ):
                pass
    finally:
        starter.close()


async def test_oversized_body_is_413(hub: HubProcess) -> None:
    token = hub.token("alice")
    big = "x" * (DEFAULT_LIMITS.max_event_bytes + 128 * 1024)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": big}}
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        response = await _post(client, hub, body, token)
    assert response.status_code == 413, response.text[:200]


async def test_each_session_is_one_hub_connection_of_its_agent(
    hub: HubProcess, workspace: str
) -> None:
    """Tool calls act as the token's agent; the session's hub connection closes with it (its
    presence ends with reason ``closed``), and two sessions of two agents never mix."""
    async with (
        mcp_http(hub, hub.token("carol")) as carol,
        mcp_http(hub, hub.token("dave")) as dave,
    ):
        wrote = structured(
            await carol.call_tool("post_message", {"workspace": workspace, "text": "from carol"})
        )
        structured(await dave.call_tool("post_message", {"workspace": workspace, "text": "dave"}))
        waited = await carol.call_tool(
            "wait_for_event", {"workspace": workspace, "afterSeq": wrote["seq"], "timeoutMs": 50}
        )
        structured(waited)
        denied = await dave.call_tool("post_message", {"workspace": "_agora", "text": "x"})
        assert tool_error(denied)["code"] == "forbidden"
    async with connect(hub.url, hub.token("observer", rights=("read",))) as session:
        ws = session.workspace(workspace)
        async with asyncio.timeout(WAIT), ws.subscribe(0) as sub:
            seen: list[tuple[str, str, Any]] = []
            async for ev in sub:
                payload = getattr(ev, "payload", None)
                seen.append((ev.kind, ev.producer, getattr(payload, "reason", None)))
                if ("memberLeft", "carol", "closed") in seen:
                    break
    messages = [(k, p) for k, p, _ in seen if k == "messagePosted"]
    assert messages == [("messagePosted", "carol"), ("messagePosted", "dave")]
    assert ("memberJoined", "carol", None) in seen


async def test_the_2026_protocol_without_a_session(hub: HubProcess, workspace: str) -> None:
    """A client speaking 2026-07-28 (``server/discover``, no ``initialize``) gets the tools;
    each request runs on its own hub connection with the request's token."""
    headers = {"Authorization": f"Bearer {hub.token('frank', workspaces=(workspace,))}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=WAIT) as client,
        streamable_http_client(mcp_url(hub), http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.discover()
        assert session.protocol_version == "2026-07-28"
        posted = structured(await session.call_tool("post_message", {"text": "modern"}))
        assert posted["workspace"] == workspace
    async with connect(hub.url, hub.token("observer", rights=("read",))) as observer:
        events = await observer.workspace(workspace).events()
    assert [(e.kind, e.producer) for e in events if e.kind == "messagePosted"] == [
        ("messagePosted", "frank")
    ]


async def _door_counts(hub: HubProcess) -> tuple[float, float, float]:
    """(MCP sessions, their token watchers, the hub's WebSocket connections), from /metrics."""
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        reply = await client.get(hub.a2a_url + "/metrics")
    assert reply.status_code == 200, reply.text
    found = {
        s.name: s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }
    return (
        found["agora_mcp_sessions"],
        found["agora_mcp_token_watchers"],
        found["agora_connections"],
    )


@pytest.mark.parametrize("ended_by", ["delete", "idle"])
async def test_a_session_that_ended_leaves_no_watcher_nor_hub_connection(
    tmp_path: Path, ended_by: str
) -> None:
    """The session's end (the client's ``DELETE``, or the idle timeout closing its transport)
    ends its token watcher and its hub connection at once, not when the token expires."""
    starter = HubStarter(tmp_path)
    idle = "\n[mcp]\nsession_idle_s = 1\n" if ended_by == "idle" else ""
    hub = starter.start("[server]\npresence_grace_s = 0\n" + idle, a2a_port=0)
    try:
        token = hub.token("leaver")  # valid for an hour: its end is not what ends the session
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "workspace_state", "arguments": {"workspace": "w"}},
        }
        async with httpx2.AsyncClient(timeout=WAIT) as client:
            assert await _door_counts(hub) == (0, 0, 0)
            response = await _post(client, hub, _initialize(), token)
            assert response.status_code == 200, response.text
            sid = response.headers["mcp-session-id"]
            state = await _post(client, hub, call, token, sid)  # opens its hub connection
            assert state.status_code == 200 and '"isError":false' in state.text, state.text
            assert await _door_counts(hub) == (1, 1, 1)
            if ended_by == "delete":
                headers = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": sid}
                deleted = await client.delete(mcp_url(hub), headers=headers)
                assert deleted.status_code == 200, deleted.text

            counts: list[tuple[float, float, float]] = []

            async def ended() -> bool:
                counts.append(await _door_counts(hub))
                return counts[-1] == (0, 0, 0)

            with contextlib.suppress(AssertionError):
                await wait_for(ended, within=10)
            assert counts[-1] == (0, 0, 0), "(sessions, watchers, hub connections) left"
            assert (await _post(client, hub, call, token, sid)).status_code == 404
    finally:
        starter.close()
