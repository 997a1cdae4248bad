"""Hostile agents at the HTTP port of a real ``agora serve`` (issue #11): the A2A door (JSON-RPC
and HTTP+JSON), ``/mcp`` (Streamable HTTP) and the viewer's API, attacked with raw HTTP on
SQLite and PostgreSQL (the ``door`` fixture: afterwards the hub must restart cleanly and
``agora verify`` exit 0, with no traceback in the hub's stderr).

Each test asserts the typed refusal and that nothing was written (the workspace head, read over
the WebSocket). Already over real sockets against ``agora serve`` elsewhere, and not repeated
here: an A2A stream ending when its token is revoked or expires
(tests/a2a_adapter/test_revocation.py), ``/mcp``'s 401 for a missing/forged/expired/revoked
bearer and its 413 with ``Content-Length`` (tests/hub/mcp/test_http.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH, REST_PREFIX
from hub.core.validation import DEFAULT_LIMITS
from hub.mcp.server import MESSAGE_RESERVE
from tests.adversarial.door import Door
from tests.support.mcp import MCP_PATH
from tests.support.paths import REPO
from tests.support.peer import peer
from tests.support.tokens import crafted, mint

WAIT: Final = 30.0
MAX_EVENT_BYTES: Final = DEFAULT_LIMITS.max_event_bytes
MAX_DEPTH: Final = DEFAULT_LIMITS.max_depth
MCP_BODY_LIMIT: Final = MAX_EVENT_BYTES + MESSAGE_RESERVE
A2A_HEADERS: Final = {"A2A-Version": "1.0", "Content-Type": "application/json"}
MCP_HEADERS: Final = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}
MCP_VERSION: Final = "2025-06-18"
JSON: Final = {"Content-Type": "application/json"}


def ws_name() -> str:
    return f"advh-{uuid.uuid4().hex[:10]}"


def stderr_of(door: Door) -> str:
    return door.hub.stderr_path.read_text(errors="replace")


async def head(door: Door, workspace: str) -> int:
    async with peer(door.hub.url, mint("watcher")) as p:
        return await p.head(workspace)


def scoped(agent: str, workspace: str, **kw: Any) -> str:
    """A token valid in one workspace: an A2A message without contextId lands there."""
    return mint(agent, [workspace], ["read", "write"], **kw)


@pytest.fixture
async def http(door: Door) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=door.hub.http_url, timeout=WAIT) as client:
        yield client


def a2a(token: str) -> dict[str, str]:
    return A2A_HEADERS | {"Authorization": f"Bearer {token}"}


def message(text: str = "hi", **fields: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER"}
    msg["parts"] = [{"text": text}]
    msg.update(fields)
    return {k: v for k, v in msg.items() if v is not None}


def send_params(msg: dict[str, Any]) -> dict[str, Any]:
    return {"message": msg, "configuration": {"returnImmediately": True}}


def rpc(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def deep_body(levels: int) -> bytes:
    """A SendMessage whose message metadata is nested ``levels`` deep."""
    head_ = b'{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"metadata":'
    return head_ + b'{"x":' * levels + b"1" + b"}" * levels + b"}}}"


# -- nesting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 100_000])
async def test_a2a_a_body_nested_too_deep_is_a_parse_error(
    door: Door, http: httpx.AsyncClient, levels: int
) -> None:
    """JSON-RPC -32700, HTTP+JSON 400 INVALID_ARGUMENT: never -32603/500, no traceback."""
    workspace = ws_name()
    headers = a2a(scoped("nester", workspace))
    r = await http.post(JSONRPC_PATH, content=deep_body(levels), headers=headers)
    assert r.status_code == 200, r.text
    error = r.json()["error"]
    assert error["code"] == -32700, error
    assert error["data"] == {"agoraCode": "badRequest", "field": "$", "limit": MAX_DEPTH}
    r = await http.post(f"{REST_PREFIX}/message:send", content=deep_body(levels), headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert await head(door, workspace) == 0
    assert "Traceback" not in stderr_of(door)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 100_000])
async def test_mcp_arguments_nested_too_deep_are_refused_without_a_traceback(
    door: Door, http: httpx.AsyncClient, levels: int
) -> None:
    """A ``tools/call`` whose arguments nest past ``max_depth``: the tool's typed error
    (badRequest, field ``arguments``); past the SDK parser's own recursion limit a JSON-RPC
    parse error (400, -32700). Never a 5xx or a traceback; nothing written."""
    workspace = ws_name()
    token = scoped("mcp-nester", workspace)
    async with mcp_session(http, token, workspace) as session:
        args = b'{"text":"x","data":' + b"[" * levels + b"]" * levels + b"}"
        body = (
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"post_message",'
            b'"arguments":' + args + b"}}"
        )
        r = await http.post(MCP_PATH, content=body, headers=session)
        if levels > 1000:
            assert r.status_code == 400, r.text[:500]
            assert r.json()["error"]["code"] == -32700, r.text[:500]
        else:
            assert r.status_code == 200, r.text[:500]
            result = mcp_reply(r)["result"]
            assert result["isError"] is True, result
            error = result["structuredContent"]["error"]
            assert (error["code"], error["details"]["field"]) == ("badRequest", "arguments")
    assert await head(door, workspace) == 0
    assert "RecursionError" not in stderr_of(door)
    assert "Traceback" not in stderr_of(door)


# -- sizes --------------------------------------------------------------------------------------


async def spaces(total: int) -> AsyncIterator[bytes]:
    """A chunked body (no Content-Length) of ``total`` spaces."""
    chunk = b" " * 65536
    for _ in range(total // len(chunk) + 1):
        yield chunk


@pytest.mark.parametrize("path", [JSONRPC_PATH, f"{REST_PREFIX}/message:send", MCP_PATH])
async def test_a_body_over_the_limit_is_413_before_parsing(
    door: Door, http: httpx.AsyncClient, path: str
) -> None:
    """With Content-Length and chunked (counted as it arrives): 413, nothing written."""
    workspace = ws_name()
    token = scoped("big", workspace)
    if path == MCP_PATH:
        headers, limit = MCP_HEADERS | {"Authorization": f"Bearer {token}"}, MCP_BODY_LIMIT
    else:
        headers, limit = a2a(token), MAX_EVENT_BYTES
    big = rpc("SendMessage", send_params(message("x" * (limit + 10))))
    r = await http.post(path, content=json.dumps(big).encode(), headers=headers)
    assert r.status_code == 413, r.text[:300]
    r = await http.post(path, content=spaces(limit + 10), headers=headers)
    assert r.status_code == 413, r.text[:300]
    # Only the headers, declaring a body over the limit: answered before any of it is read.
    status = await declared_only(door.hub.http_url, path, headers, limit + 1)
    assert status == 413, status
    if path != MCP_PATH:
        assert r.json()["error"]["details"][0]["metadata"]["agoraCode"] == "tooLarge", r.text
    assert await head(door, workspace) == 0
    assert "Traceback" not in stderr_of(door)


async def declared_only(url: str, path: str, headers: dict[str, str], length: int) -> int:
    """Send a request's head with ``Content-Length: length`` and no body; the status line's
    code (a server that waits for the body never answers: the wait fails the test)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {length}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), WAIT)
        return int(status_line.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
async def test_a2a_a_message_under_the_body_limit_but_over_the_event_limit_is_too_large(
    door: Door, http: httpx.AsyncClient, binding: str
) -> None:
    """A body just under the limit (``max_event_bytes``) whose stored ``needWork`` (the message
    plus the event's envelope) is over ``max_event_bytes``: tooLarge, nothing stored."""
    workspace = ws_name()
    headers = a2a(scoped("almost", workspace))
    msg = message("")
    request: dict[str, Any] = send_params(msg)
    if binding == "jsonrpc":
        request = rpc("SendMessage", request)
    pad = MAX_EVENT_BYTES - 64 - len(json.dumps(request, separators=(",", ":")))
    msg["parts"][0]["text"] = "x" * pad
    body = json.dumps(request, separators=(",", ":")).encode()
    assert MAX_EVENT_BYTES - 128 < len(body) <= MAX_EVENT_BYTES
    path = JSONRPC_PATH if binding == "jsonrpc" else f"{REST_PREFIX}/message:send"
    r = await http.post(path, content=body, headers=headers)
    if binding == "jsonrpc":
        assert r.status_code == 200, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == -32602, error
        assert agora_code(error.get("data")) == "tooLarge", error
    else:
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text[:300]
        assert agora_code(r.json()["error"].get("details")) == "tooLarge", r.text[:300]
    assert await head(door, workspace) == 0
    assert "Traceback" not in stderr_of(door)


def agora_code(data: Any) -> str | None:
    """``agoraCode`` in a JSON-RPC error's ``data`` or an HTTP+JSON error's ``details``."""
    if isinstance(data, dict):
        if "agoraCode" in data:
            return str(data["agoraCode"])
        return agora_code(data.get("metadata"))
    if isinstance(data, list):
        for item in data:
            found = agora_code(item)
            if found is not None:
                return found
    return None


# -- request validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("SendMessage", send_params(message(role=None))),
        ("SendMessage", send_params(message(role="ROLE_BOSS"))),
        ("GetTask", {}),
        ("CancelTask", {}),
    ],
    ids=["no-role", "ROLE_BOSS", "GetTask-no-id", "CancelTask-no-id"],
)
async def test_a2a_an_invalid_request_is_invalid_params_and_writes_nothing(
    door: Door, http: httpx.AsyncClient, method: str, params: dict[str, Any]
) -> None:
    workspace = ws_name()
    headers = a2a(scoped("sloppy", workspace))
    r = await http.post(JSONRPC_PATH, json=rpc(method, params), headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["error"]["code"] == -32602, r.text
    if method == "SendMessage":
        r = await http.post(f"{REST_PREFIX}/message:send", json=params, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert await head(door, workspace) == 0


# -- paths through MCP --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "a\tb", "evil\u202etxt.exe"])
async def test_mcp_write_file_refuses_control_and_bidi_characters(
    door: Door, http: httpx.AsyncClient, bad: str
) -> None:
    workspace = ws_name()
    token = scoped("mcp-paths", workspace)
    async with mcp_session(http, token, workspace) as session:
        call = rpc("tools/call", {"name": "write_file", "arguments": {"path": bad, "text": "x"}})
        r = await http.post(MCP_PATH, json=call, headers=session)
        assert r.status_code == 200, r.text
        result = mcp_reply(r)["result"]
        assert result["isError"] is True, result
        assert result["structuredContent"]["error"]["code"] == "badRequest", result
    assert await head(door, workspace) == 0


# -- tokens -------------------------------------------------------------------------------------


ABSURD: Final = [
    pytest.param({"iat": int(time.time()) + 3600, "exp": int(time.time()) + 7200}, id="future-iat"),
    pytest.param({"exp": 2**70}, id="exp-2^70"),
]


@pytest.mark.parametrize("claims", ABSURD)
async def test_correctly_signed_tokens_with_absurd_times_are_401_at_every_http_door(
    door: Door, http: httpx.AsyncClient, claims: dict[str, int]
) -> None:
    """A2A (both bindings), ``/mcp`` and the viewer's API; the public probes stay public."""
    workspace = ws_name()
    token = crafted(workspaces=[workspace], **claims)
    bearer = {"Authorization": f"Bearer {token}"}
    attempts = [
        ("POST", JSONRPC_PATH, a2a(token), rpc("SendMessage", send_params(message()))),
        ("POST", f"{REST_PREFIX}/message:send", a2a(token), send_params(message())),
        ("GET", f"{REST_PREFIX}/tasks", a2a(token), None),
        ("POST", MCP_PATH, MCP_HEADERS | bearer, initialize()),
        ("GET", "/ui/api/workspaces", bearer, None),
    ]
    for method, path, headers, body in attempts:
        content = None if body is None else json.dumps(body).encode()
        r = await http.request(method, path, headers=headers, content=content)
        assert r.status_code == 401, (path, r.status_code, r.text[:300])
        assert r.headers["www-authenticate"].startswith("Bearer"), (path, r.headers)
    r = await http.get("/healthz", headers=bearer)
    assert r.status_code == 200, r.text
    assert await head(door, workspace) == 0


# -- token end on an open MCP session -----------------------------------------------------------


async def test_an_mcp_sessions_stream_ends_when_its_token_expires(
    door: Door, http: httpx.AsyncClient
) -> None:
    """The session's GET stream (server notifications) with a 3 s token ends once it expires,
    and the session's next request is 401."""
    workspace = ws_name()
    token = scoped("brief", workspace, ttl=3)
    async with mcp_session(http, token, workspace) as session:
        started = time.monotonic()
        get = {k: v for k, v in session.items() if k != "Content-Type"}
        get["Accept"] = "text/event-stream"
        async with asyncio.timeout(WAIT), http.stream("GET", MCP_PATH, headers=get) as stream:
            assert stream.status_code == 200, await stream.aread()
            async for _ in stream.aiter_bytes():
                pass  # until the hub ends it
        assert time.monotonic() - started < WAIT
        call = rpc("tools/list", {}, rid=9)
        r = await http.post(MCP_PATH, json=call, headers=session)
        assert r.status_code == 401, r.text


async def test_an_mcp_sessions_stream_ends_when_its_token_is_revoked(
    door: Door, http: httpx.AsyncClient
) -> None:
    workspace = ws_name()
    token = scoped("revoked", workspace)
    async with mcp_session(http, token, workspace) as session:
        get = {k: v for k, v in session.items() if k != "Content-Type"}
        get["Accept"] = "text/event-stream"
        async with asyncio.timeout(WAIT), http.stream("GET", MCP_PATH, headers=get) as stream:
            assert stream.status_code == 200, await stream.aread()
            await revoke(door, token)
            async for _ in stream.aiter_bytes():
                pass  # until the hub ends it
        call = rpc("tools/list", {}, rid=9)
        r = await http.post(MCP_PATH, json=call, headers=session)
        assert r.status_code == 401, r.text


async def revoke(door: Door, token: str) -> None:
    """``agora token revoke`` as a separate process, on the hub's store."""
    token_id = door.hub.signer.verify(token).token_id
    argv = ["-m", "hub", "token", "revoke", f"--token-id={token_id}"]
    argv += ["--data", str(door.hub.data_dir)]
    if door.store_url is not None:
        argv += ["--store", door.store_url]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, cwd=REPO, env=door.hub.environ(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()


# -- a raw MCP session --------------------------------------------------------------------------


def initialize() -> dict[str, Any]:
    params = {
        "protocolVersion": MCP_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "0"},
    }
    return rpc("initialize", params, rid=1)


def mcp_reply(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC reply in a POST's answer: a JSON body or the last ``data:`` of an SSE one."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [
            line.removeprefix("data:").strip()
            for line in response.text.splitlines()
            if line.startswith("data:")
        ]
        assert data, response.text
        reply: dict[str, Any] = json.loads(data[-1])
        return reply
    body: dict[str, Any] = response.json()
    return body


@contextlib.asynccontextmanager
async def mcp_session(
    http: httpx.AsyncClient, token: str, workspace: str
) -> AsyncIterator[dict[str, str]]:
    """An initialized MCP session over plain HTTP (``initialize``, ``notifications/initialized``);
    yields the headers of its requests; DELETEd at the end (whatever the token's state)."""
    headers = MCP_HEADERS | {"Authorization": f"Bearer {token}"}
    r = await http.post(f"{MCP_PATH}?workspace={workspace}", json=initialize(), headers=headers)
    assert r.status_code == 200, r.text
    assert "result" in mcp_reply(r), r.text
    headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": MCP_VERSION}
    try:
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        r = await http.post(MCP_PATH, json=note, headers=headers)
        assert r.status_code == 202, r.text
        yield dict(headers)
    finally:
        await http.delete(MCP_PATH, headers=headers)
