"""Token revocation and token end on the A2A listener of a real ``agora serve``.

A token revoked by ``agora token revoke`` (a separate process writing the hub's SQLite file
while it runs) gets HTTP 401 with ``reason: "revoked"``; an open SSE stream using it ends with
the stream's error event (``InvalidParamsError``, ``data.agoraCode = "unauthorized"``, reason
``revoked``), and so does a stream whose token expires (reason ``expired``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH, REST_PREFIX
from tests.support.hub import HubProcess, HubStarter
from tests.support.paths import REPO
from tests.support.tokens import make_signer
from tests.support.tokens import mint as mint_token

WORKSPACE = "demo"
WAIT = 20.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[HubProcess]:
    """``agora serve`` with its A2A listener (the HTTP port), both on free ports."""
    starter = HubStarter(tmp_path)
    try:
        yield starter.start(a2a_port=0)
    finally:
        starter.close()  # SIGTERM; each hub must exit 0


def mint(agent: str = "peer", ttl: int = 3600) -> str:
    return mint_token(agent, [WORKSPACE], ["read", "write"], ttl=ttl)


def jti(token: str) -> str:
    return make_signer().verify(token).token_id


async def revoke(served: HubProcess, *argv: str) -> dict[str, Any]:
    """``agora token revoke ARGV --json`` as a separate process; the appended event."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub", "token", "revoke", *argv, "--json",
        "--data", str(served.data_dir),
        cwd=REPO, env=served.environ(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    event: dict[str, Any] = json.loads(out)
    return event


def client(served: HubProcess, token: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    return httpx.AsyncClient(base_url=served.a2a_url, headers=headers, timeout=WAIT)


def message(text: str = "hi") -> dict[str, Any]:
    return {
        "messageId": str(uuid.uuid4()),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        "contextId": WORKSPACE,
    }


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event type, decoded data) of each SSE event (type ``message`` unless named)."""
    kind = "message"
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            yield kind, json.loads(line[5:])
            kind = "message"


async def stream_until_end(
    served: HubProcess, token: str, binding: str, on_open: Any = None
) -> list[tuple[str, Any]]:
    """Open a streaming SendMessage (the task stays submitted: the stream stays open), call
    ``on_open`` after the first event, and return every event until the hub ends the stream."""
    events: list[tuple[str, Any]] = []
    async with client(served, token) as http:
        if binding == "jsonrpc":
            request = http.stream(
                "POST", JSONRPC_PATH, json=rpc("SendStreamingMessage", {"message": message()})
            )
        else:
            request = http.stream(
                "POST", f"{REST_PREFIX}/message:stream", json={"message": message()}
            )
        async with request as response:
            assert response.status_code == 200, await response.aread()
            async with asyncio.timeout(WAIT):
                async for event in sse_events(response):
                    events.append(event)
                    if len(events) == 1 and on_open is not None:
                        await on_open()
    return events


def error_data(binding: str, data: Any) -> dict[str, Any]:
    """The hub's ``{agoraCode, …}`` of an SSE error event: the ``google.rpc.ErrorInfo``
    metadata (JSON-RPC: ``error.data``; HTTP+JSON: ``error.details``)."""
    infos = data["error"]["data" if binding == "jsonrpc" else "details"]
    [metadata] = [i["metadata"] for i in infos if i.get("@type", "").endswith("ErrorInfo")]
    assert isinstance(metadata, dict)
    return metadata


async def test_revoked_token_is_401_with_reason(served: HubProcess) -> None:
    token = mint("mallory")
    async with client(served, token) as http:
        ok = await http.post(JSONRPC_PATH, json=rpc("ListTasks", {}))
        assert ok.status_code == 200, ok.text
        await revoke(served, f"--token-id={jti(token)}")
        deadline = time.monotonic() + WAIT
        while (
            response := await http.post(JSONRPC_PATH, json=rpc("ListTasks", {}))
        ).status_code == 200:
            assert time.monotonic() < deadline, "the A2A listener never refused the token"
            await asyncio.sleep(0.1)
        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        error = response.json()["error"]
        assert error["reason"] == "revoked" and error["status"] == "UNAUTHENTICATED"
        rest = await http.get(f"{REST_PREFIX}/tasks/x")
        assert rest.status_code == 401 and rest.json()["error"]["reason"] == "revoked"
    async with client(served, mint("alice")) as other:
        assert (await other.post(JSONRPC_PATH, json=rpc("ListTasks", {}))).status_code == 200


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_revocation_ends_an_open_stream(served: HubProcess, binding: str) -> None:
    token = mint("mallory")
    appended: list[dict[str, Any]] = []

    async def revoke_it() -> None:
        appended.append(await revoke(served, "--agent", "mallory"))

    events = await stream_until_end(served, token, binding, on_open=revoke_it)
    ended_at = time.time()
    assert events[0][0] == "message"  # the task, first
    kind, data = events[-1]
    assert kind == "error", events
    details = error_data(binding, data)
    assert details["agoraCode"] == "unauthorized" and details["reason"] == "revoked", data
    print(f"stream ended {ended_at - appended[0]['timestamp'] / 1000:.3f}s after the revocation")


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_expiry_ends_an_open_stream(served: HubProcess, binding: str) -> None:
    token = mint("shortlived", ttl=3)
    exp = make_signer().verify(token).expires_at
    events = await stream_until_end(served, token, binding)
    ended_at = time.time()
    kind, data = events[-1]
    assert kind == "error", events
    details = error_data(binding, data)
    assert details["agoraCode"] == "unauthorized" and details["reason"] == "expired", data
    assert ended_at >= exp
    print(f"stream ended {ended_at - exp:.3f}s after exp")
