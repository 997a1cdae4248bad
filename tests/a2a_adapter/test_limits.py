"""The A2A door's body limits over a real socket: size before reading (413), nesting before
parsing (JSON-RPC -32700 / HTTP+JSON 400), nothing written, never -32603 (issue 11)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH, REST_PREFIX, A2AService
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory


@pytest.fixture
async def http(service: A2AService, token: TokenFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=service.url,
        headers={"Authorization": f"Bearer {token()}", "A2A-Version": "1.0"},
        timeout=30,
    ) as client:
        yield client


def send(text: str) -> dict[str, Any]:
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}},
    }


def deep_body(levels: int) -> bytes:
    head = b'{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"metadata":'
    return head + b'{"x":' * levels + b"1" + b"}" * levels + b"}}}"


async def head(workspaces: Workspaces) -> int:
    return (await workspaces.state(WORKSPACE)).seq


async def test_a_body_over_the_limit_is_413_before_it_is_parsed(
    http: httpx.AsyncClient, workspaces: Workspaces
) -> None:
    limit = workspaces.limits.max_event_bytes
    big = send("x" * (limit + 10))
    r = await http.post(JSONRPC_PATH, json=big)
    assert r.status_code == 413
    assert r.json()["error"]["details"][0]["metadata"]["agoraCode"] == "tooLarge"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    r = await http.post(f"{REST_PREFIX}/message:send", content=chunks())
    assert r.status_code == 413
    assert await head(workspaces) == 0


@pytest.mark.parametrize("levels", [65, 1000, 100_000])
async def test_a_body_nested_too_deep_is_a_parse_error_not_internal(
    http: httpx.AsyncClient, workspaces: Workspaces, levels: int
) -> None:
    r = await http.post(
        JSONRPC_PATH, content=deep_body(levels), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    error = r.json()["error"]
    assert error["code"] == -32700
    assert error["data"] == {"agoraCode": "badRequest", "field": "$", "limit": 64}
    r = await http.post(
        f"{REST_PREFIX}/message:send",
        content=deep_body(levels),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert await head(workspaces) == 0


async def test_within_the_limits_a_message_is_accepted(
    http: httpx.AsyncClient, workspaces: Workspaces
) -> None:
    r = await http.post(JSONRPC_PATH, json=send("hello"))
    assert r.status_code == 200 and "result" in r.json(), r.text
    assert await head(workspaces) >= 1
