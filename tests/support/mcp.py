"""MCP clients of a running hub, through the official SDK's ``ClientSession``.

:func:`mcp_stdio` starts ``agora mcp`` (``python -m hub mcp``) against a :class:`HubProcess` and
yields an initialized session over its stdin/stdout; :func:`mcp_http` yields one over
Streamable HTTP at the hub's ``/mcp`` (the hub must run with its HTTP port: ``a2a_port=0``).
Both are async context managers, reusable by any test (the joint MCP + TypeScript + Python
tests included)::

    async with mcp_stdio(hub, hub.token("alice"), workspace="demo") as session:
        result = await session.call_tool("post_message", {"text": "hi"})
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2
import msgspec
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests.support.hub import HubProcess
from tests.support.paths import REPO

__all__ = [
    "MAX_SESSIONS",
    "MAX_SESSIONS_PER_AGENT",
    "MCP_HUB_CONFIG",
    "MCP_PATH",
    "mcp_http",
    "mcp_stdio",
    "mcp_url",
    "structured",
    "tool_error",
]

MCP_PATH = "/mcp"
MAX_SESSIONS = 4
MAX_SESSIONS_PER_AGENT = 2
MCP_HUB_CONFIG = f"""
[server]
presence_grace_s = 0   # memberLeft at once: a test sees a session's hub connection end

[mcp]
max_sessions = {MAX_SESSIONS}
max_sessions_per_agent = {MAX_SESSIONS_PER_AGENT}
"""
"""An agora.toml for hubs under MCP tests: a small session cap, presence without grace."""


def mcp_url(hub: HubProcess) -> str:
    """The hub's MCP endpoint (its HTTP port)."""
    assert hub.a2a_url, "start the hub with its HTTP port (a2a_port=0)"
    return hub.a2a_url + MCP_PATH


@contextlib.asynccontextmanager
async def mcp_stdio(
    hub: HubProcess,
    token: str,
    *,
    workspace: str | None = None,
    args: Sequence[str] = (),
    message_handler: MessageHandlerFnT | None = None,
) -> AsyncIterator[ClientSession]:
    """``agora mcp --url HUB [--workspace W]`` with the token in ``$AGORA_TOKEN``."""
    argv = ["-m", "hub", "mcp", "--url", hub.url, *args]
    if workspace is not None:
        argv += ["--workspace", workspace]
    env = {
        "AGORA_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "PATH": os.environ.get("PATH", ""),
    }
    params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=str(REPO))
    # agora mcp's stderr goes beside the hub's log (quoted by nothing, read when debugging).
    with (hub.data_dir.parent / f"{hub.data_dir.name}.mcp.stderr.log").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=message_handler) as session,
        ):
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def mcp_http(
    hub: HubProcess,
    token: str | None,
    *,
    message_handler: MessageHandlerFnT | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[ClientSession]:
    """A session over Streamable HTTP with ``Authorization: Bearer <token>``."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    timeout = httpx2.Timeout(30.0, read=60.0)
    async with (
        httpx2.AsyncClient(headers=sent, timeout=timeout) as client,
        streamable_http_client(mcp_url(hub), http_client=client) as (read, write),
        ClientSession(read, write, message_handler=message_handler) as session,
    ):
        await session.initialize()
        yield session


def structured(result: CallToolResult) -> dict[str, Any]:
    """A successful tool result's structured content (AssertionError quoting an error)."""
    assert not result.is_error, result.content
    content = result.structured_content
    assert isinstance(content, dict), result
    return content


def tool_error(result: CallToolResult) -> dict[str, Any]:
    """A tool error's ``{code, message, details}`` (AssertionError for a success)."""
    assert result.is_error, result.structured_content
    content = result.structured_content
    assert isinstance(content, dict), result
    error = content["error"]
    assert isinstance(error, dict)
    text = result.content[0]
    assert getattr(text, "text", "").startswith(error["code"] + ": "), text
    return error


def as_json(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))
