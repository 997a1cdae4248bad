"""Raw HTTP checks of the A2A listener: card caching headers, authentication, the A2A-Version
header, JSON-RPC error codes and the SSE framing."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH, REST_PREFIX, A2AService
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory

CARD = "/.well-known/agent-card.json"


def rpc(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def send_params(text: str = "hi", **message: Any) -> dict[str, Any]:
    msg = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}
    msg.update(message)
    return {"message": msg, "configuration": {"returnImmediately": True}}


@pytest.fixture
async def http(service: A2AService, token: TokenFactory) -> Any:
    async with httpx.AsyncClient(
        base_url=service.url,
        headers={"Authorization": f"Bearer {token()}", "A2A-Version": "1.0"},
        timeout=10,
    ) as client:
        yield client


async def test_card_has_cache_headers_and_etag(service: A2AService) -> None:
    async with httpx.AsyncClient(base_url=service.url) as client:
        first = await client.get(CARD)
        assert first.status_code == 200
        assert first.headers["cache-control"] == "public, max-age=300"
        etag = first.headers["etag"]
        assert etag.startswith('W/"')
        again = await client.get(CARD, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.headers["etag"] == etag
        other = await client.get(CARD, headers={"If-None-Match": 'W/"other"'})
        assert other.status_code == 200
    card = first.json()
    assert card["capabilities"]["streaming"] is True
    bindings = {i["protocolBinding"]: i for i in card["supportedInterfaces"]}
    assert bindings["JSONRPC"]["url"] == service.url + JSONRPC_PATH
    assert bindings["HTTP+JSON"]["url"] == service.url + REST_PREFIX
    assert {i["protocolVersion"] for i in card["supportedInterfaces"]} == {"1.0"}
    scheme = card["securitySchemes"]["agoraBearer"]["httpAuthSecurityScheme"]
    assert scheme["scheme"].lower() == "bearer"
    assert card["securityRequirements"] == [{"schemes": {"agoraBearer": {}}}]
    for field in ("name", "description", "version", "defaultInputModes", "defaultOutputModes"):
        assert card[field]
    assert all({"id", "name", "description", "tags"} <= s.keys() for s in card["skills"])


async def test_no_or_bad_token_is_401(service: A2AService, token: TokenFactory) -> None:
    async with httpx.AsyncClient(base_url=service.url, headers={"A2A-Version": "1.0"}) as client:
        none = await client.post(JSONRPC_PATH, json=rpc("GetTask", {"id": "x"}))
        assert none.status_code == 401
        assert none.headers["www-authenticate"].startswith("Bearer")
        bad = await client.post(
            JSONRPC_PATH,
            json=rpc("GetTask", {"id": "x"}),
            headers={"Authorization": "Bearer not-a-token"},
        )
        assert bad.status_code == 401 and "invalid_token" in bad.headers["www-authenticate"]
        other_secret = await client.get(
            f"{REST_PREFIX}/tasks/x", headers={"Authorization": "Basic abc"}
        )
        assert other_secret.status_code == 401


@pytest.mark.parametrize(
    ("version", "ok"),
    [("1.0", True), ("1.0.1", True), ("1.2", True), (None, False), ("0.3", False), ("2.0", False)],
)
async def test_a2a_version_header(
    service: A2AService, token: TokenFactory, version: str | None, ok: bool
) -> None:
    headers = {"Authorization": f"Bearer {token()}"}
    if version is not None:
        headers["A2A-Version"] = version
    async with httpx.AsyncClient(base_url=service.url, headers=headers) as client:
        body = (await client.post(JSONRPC_PATH, json=rpc("SendMessage", send_params()))).json()
    if ok:
        assert "result" in body, body
    else:
        assert body["error"]["code"] == -32009, body


async def test_error_codes(http: httpx.AsyncClient) -> None:
    async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await http.post(JSONRPC_PATH, json=rpc(method, params))
        assert response.status_code == 200
        body: dict[str, Any] = response.json()
        return body

    assert (await call("GetTask", {"id": "nope"}))["error"]["code"] == -32001
    assert (await call("CancelTask", {"id": "nope"}))["error"]["code"] == -32001
    assert (await call("SubscribeToTask", {"id": "nope"}))["error"]["code"] == -32001
    unknown = await call("SendMessage", send_params(taskId="nope"))
    assert unknown["error"]["code"] == -32001
    assert (await call("NoSuchMethod", {}))["error"]["code"] == -32601
    push = await call("CreateTaskPushNotificationConfig", {"taskId": "x", "url": "http://x"})
    assert push["error"]["code"] == -32001  # an unknown task (push configs are offered)
    assert (await call("GetExtendedAgentCard", {}))["error"]["code"] == -32007
    bad = await call("SendMessage", {"message": {"messageId": "m", "role": "ROLE_USER"}})
    assert bad["error"]["code"] == -32602
    forbidden = await call("SendMessage", send_params(contextId="not-mine"))
    assert forbidden["error"]["code"] == -32602
    assert forbidden["error"]["data"][0]["metadata"]["agoraCode"] == "forbidden"
    created = await call("SendMessage", send_params())
    task_id = created["result"]["task"]["id"]
    assert created["result"]["task"]["contextId"] == WORKSPACE
    assert (await call("CancelTask", {"id": task_id}))["result"]["status"]["state"] == (
        "TASK_STATE_CANCELED"
    )
    assert (await call("CancelTask", {"id": task_id}))["error"]["code"] == -32002
    terminal = await call("SendMessage", send_params(taskId=task_id))
    assert terminal["error"]["code"] == -32004
    sub = await call("SubscribeToTask", {"id": task_id})
    assert sub["error"]["code"] == -32004


async def test_rest_errors_use_http_status(http: httpx.AsyncClient) -> None:
    missing = await http.get(f"{REST_PREFIX}/tasks/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["status"] == "NOT_FOUND"


async def test_sse_frames_hold_one_result_each(http: httpx.AsyncClient) -> None:
    params = send_params("stream me")
    del params["configuration"]
    frames = []
    async with http.stream("POST", JSONRPC_PATH, json=rpc("SendStreamingMessage", params, 7)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                frames.append(json.loads(line[5:]))
                break  # the task stays SUBMITTED: one frame is enough
    [frame] = frames
    assert frame["jsonrpc"] == "2.0" and frame["id"] == 7
    assert list(frame["result"]) == ["task"]
    assert frame["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
