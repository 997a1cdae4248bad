"""A2A requests are validated (required fields, enums) before anything is written (issue 11)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH, A2AService
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


async def call(http: httpx.AsyncClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(
        JSONRPC_PATH, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    )
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


def message(**fields: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"messageId": str(uuid.uuid4()), "parts": [{"text": "hi"}]}
    msg.update(fields)
    return {"message": msg, "configuration": {"returnImmediately": True}}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("SendMessage", message()),  # no role
        ("SendMessage", message(role="ROLE_BOSS")),  # not a role
        ("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}}),  # no id
        ("GetTask", {}),
        ("CancelTask", {}),
        ("SubscribeToTask", {}),
    ],
)
async def test_an_invalid_request_is_invalid_params_and_writes_nothing(
    http: httpx.AsyncClient, workspaces: Workspaces, method: str, params: dict[str, Any]
) -> None:
    body = await call(http, method, params)
    assert body["error"]["code"] == -32602, body
    assert (await workspaces.state(WORKSPACE)).seq == 0


async def test_a_valid_message_is_accepted(http: httpx.AsyncClient) -> None:
    body = await call(http, "SendMessage", message(role="ROLE_USER"))
    assert "result" in body, body
