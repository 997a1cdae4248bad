"""The MCP server of Agora: the SDK's low-level :class:`mcp.server.lowlevel.Server` with the
tools of :mod:`hub.mcp.tools` and the resources of :mod:`hub.mcp.resources`.

:func:`build_server` takes a :data:`LinkOpener`: how an MCP connection gets its
:class:`~hub.mcp.tools.AgentLink` (the hub session it acts through). The first request of a
connection opens it; the connection's teardown (the SDK's per-connection exit stack: stdio EOF,
an HTTP session's DELETE, idle timeout or shutdown) closes it and its resource watchers. ``agora
mcp`` opens one link for the process (:func:`serve_stdio`); the HTTP door one per MCP session
with the bearer token of the request that opened it (:mod:`hub.mcp.http`).

Errors: a tool's :class:`~hub.core.errors.AgoraError` becomes a tool result with ``isError:
true``, the text ``"<code>: <message>"`` and the structured content ``{"error": {code, message,
details}}`` (the stable codes of docs/protocol.md). A resource error is a JSON-RPC error
(``-32602`` for the client's fault, ``-32603`` for ours) with ``data: {"agoraCode": code,
"details": …}``. An unknown tool is a JSON-RPC error too (the spec's "tool not found").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, BinaryIO, Final, cast

import anyio
import anyio.to_thread
import mcp_types as types
import msgspec
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from hub import __version__
from hub.core.errors import AgoraError, ClientError, Internal
from hub.mcp.resources import (
    FILES_TEMPLATE,
    TIMELINE_TEMPLATE,
    Watchers,
    list_resources,
    read_resource,
)
from hub.mcp.tools import TOOLS, AgentLink, error_json, run_tool

__all__ = ["SERVER_NAME", "LinkOpener", "build_server", "connection_of", "serve_stdio"]

log = logging.getLogger(__name__)

SERVER_NAME: Final = "agora"
_STATE: Final = "agora"

Ctx = ServerRequestContext[Any, Any]
LinkOpener = Callable[[Ctx], AbstractAsyncContextManager[AgentLink]]
"""Opens the link of the connection ``ctx`` belongs to (entered once, on its first request;
exited when the connection ends). Raises ``AgoraError`` (e.g. ``Unauthorized``)."""

INSTRUCTIONS: Final = (
    "Agora is a shared, event-sourced workspace for several agents: files (read_file, "
    "write_file with baseRev), a conversation (post_message), work items (request_work, "
    "claim_work, publish_work, request_feedback, provide_feedback, block_work, "
    "complete_work, cancel_work, list_open_work), the event log (timeline, wait_for_event, "
    "workspace_state) and sandboxed code (code_exec). Every call acts as your token's agent."
)


def connection_of(ctx: Ctx) -> Connection:
    """The SDK's per-connection object behind a request context.

    ``ServerRequestContext`` does not expose it (mcp 2.3); the per-request ``ServerSession``
    holds it. Pinned by tests/hub/mcp/test_server.py (the SDK version is bounded in
    pyproject.toml)."""
    connection = ctx.session._connection
    assert isinstance(connection, Connection)
    return connection


class _ConnectionState:
    """One MCP connection's link and watchers, opened on its first request."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.lock = asyncio.Lock()
        self.link: AgentLink | None = None
        self.watchers: Watchers | None = None
        self.stack = contextlib.AsyncExitStack()

    async def open(self, opener: LinkOpener, ctx: Ctx) -> tuple[AgentLink, Watchers]:
        async with self.lock:
            if self.link is None or self.watchers is None:
                self.link = await self.stack.enter_async_context(opener(ctx))
                self.watchers = Watchers(self.link, self.connection.send_resource_updated)
                self.stack.push_async_callback(self.watchers.aclose)
            return self.link, self.watchers

    async def aclose(self) -> None:
        await self.stack.aclose()


def _text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def tool_error(error: AgoraError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"{error.code}: {error.message}")],
        structured_content=error_json(error),
        is_error=True,
    )


def protocol_error(error: AgoraError) -> MCPError:
    code = INVALID_PARAMS if isinstance(error, ClientError) else INTERNAL_ERROR
    data = error_json(error)["error"]
    return MCPError(code, f"{error.code}: {error.message}", {"agoraCode": error.code, **data})


def build_server(opener: LinkOpener) -> Server[Any]:
    """The MCP server; every connection opens its link with ``opener``."""

    async def state(ctx: Ctx) -> tuple[AgentLink, Watchers]:
        connection = connection_of(ctx)
        held = connection.state.get(_STATE)
        if not isinstance(held, _ConnectionState):
            held = _ConnectionState(connection)
            connection.state[_STATE] = held
            connection.exit_stack.push_async_callback(held.aclose)
        return await held.open(opener, ctx)

    async def list_tools(
        ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name=spec.name,
                description=spec.description,
                input_schema=spec.input_schema,
                annotations=types.ToolAnnotations(read_only_hint=spec.read_only),
            )
            for spec in TOOLS.values()
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in TOOLS:
            raise MCPError(
                INVALID_PARAMS, f"unknown tool {params.name!r}", {"agoraCode": "notFound"}
            )
        try:
            link, _ = await state(ctx)
            result = await run_tool(link, params.name, params.arguments)
        except AgoraError as e:
            return tool_error(e)
        except Exception:
            log.exception("MCP tool %s failed", params.name)
            return tool_error(Internal(f"the tool {params.name} failed"))
        return types.CallToolResult(
            content=[types.TextContent(text=_text(result))], structured_content=result
        )

    async def resources(
        ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        try:
            link, _ = await state(ctx)
            found = await list_resources(link)
        except AgoraError as e:
            raise protocol_error(e) from None
        return types.ListResourcesResult(
            resources=[types.Resource.model_validate(r, by_alias=True) for r in found]
        )

    async def templates(
        ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=FILES_TEMPLATE,
                    name="file",
                    description="A file of a workspace (text, or base64 blob for binary).",
                ),
                types.ResourceTemplate(
                    uri_template=TIMELINE_TEMPLATE,
                    name="timeline",
                    description="The newest events of a workspace, as JSON.",
                    mime_type="application/json",
                ),
            ]
        )

    async def read(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        try:
            link, _ = await state(ctx)
            found = await read_resource(link, params.uri)
        except AgoraError as e:
            raise protocol_error(e) from None
        contents: types.TextResourceContents | types.BlobResourceContents
        if "text" in found:
            contents = types.TextResourceContents.model_validate(found, by_alias=True)
        else:
            contents = types.BlobResourceContents.model_validate(found, by_alias=True)
        return types.ReadResourceResult(contents=[contents])

    async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        try:
            _, watchers = await state(ctx)
            await watchers.subscribe(params.uri)
        except AgoraError as e:
            raise protocol_error(e) from None
        return types.EmptyResult()

    async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        _, watchers = await state(ctx)
        watchers.unsubscribe(params.uri)
        return types.EmptyResult()

    return Server(
        SERVER_NAME,
        version=__version__,
        title="Agora hub",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=resources,
        on_list_resource_templates=templates,
        on_read_resource=read,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
    )


@contextlib.asynccontextmanager
async def _shared(link: AgentLink) -> AsyncIterator[AgentLink]:
    yield link  # the process owns it: the connection does not close it


MESSAGE_RESERVE: Final = 64 * 1024
"""Bytes an MCP message may exceed ``max_event_bytes`` by (the JSON-RPC envelope around the
arguments of one event); the HTTP door uses the same bound for a request body."""


class BoundedLines:
    """stdin as lines of at most ``limit`` bytes, read in a worker thread (the SDK's own
    reader has no bound: one endless line would fill the memory). A longer line is skipped to
    its end and stands as ``TOO_LONG`` (not JSON-RPC: the SDK logs and drops it)."""

    TOO_LONG: Final = "message too long"

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self.stream = stream
        self.limit = limit

    def _line(self) -> str | None:
        data = self.stream.readline(self.limit + 1)
        if not data:
            return None
        if len(data) > self.limit and not data.endswith(b"\n"):
            while (more := self.stream.readline(self.limit)) and not more.endswith(b"\n"):
                pass
            return self.TOO_LONG
        return data.decode("utf-8", "replace")

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        line = await anyio.to_thread.run_sync(self._line, abandon_on_cancel=True)
        if line is None:
            raise StopAsyncIteration
        return line


async def serve_stdio(link: AgentLink, stdin: BinaryIO | None = None) -> None:
    """Serve MCP on stdin/stdout until stdin closes, every call through ``link``; a message
    is at most ``max_event_bytes`` + :data:`MESSAGE_RESERVE` bytes."""
    server = build_server(lambda ctx: _shared(link))
    lines = BoundedLines(stdin or sys.stdin.buffer, link.limits.max_event_bytes + MESSAGE_RESERVE)
    async with stdio_server(stdin=cast(Any, lines)) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
