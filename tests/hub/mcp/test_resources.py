"""MCP resources against a real hub: files and the timeline as ``agora://`` URIs, and resource
subscriptions that send ``notifications/resources/updated`` when another agent (a Python client
over WebSocket) changes a file — over stdio and over Streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

import mcp_types as types
import msgspec
import pytest
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError

from hub.client import connect
from hub.core.errors import BadRequest
from hub.mcp.resources import file_uri, parse_uri, timeline_uri
from hub.mcp.tools import MAX_RESULT_BYTES
from tests.support.hub import HubProcess
from tests.support.mcp import mcp_http, mcp_stdio

WAIT: Final = 20.0

# resources/subscribe is the handshake era's (2025-11-25, what ClientSession.initialize
# speaks); the SDK warns that 2026-07-28 replaces it with subscriptions/listen.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")


@contextlib.asynccontextmanager
async def _session(
    transport: str, hub: HubProcess, workspace: str, updates: asyncio.Queue[str]
) -> AsyncIterator[ClientSession]:
    async def handler(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await updates.put(message.params.uri)

    if transport == "stdio":
        async with mcp_stdio(
            hub, hub.token("alice"), workspace=workspace, message_handler=handler
        ) as s:
            yield s
    else:
        token = hub.token("alice", workspaces=(workspace,))  # its one workspace: the default
        async with mcp_http(hub, token, message_handler=handler) as s:
            yield s


def test_uris_round_trip() -> None:
    uri = file_uri("demo", "src/a b/#1.py")
    assert uri == "agora://demo/files/src/a%20b/%231.py"
    assert parse_uri(uri).path == "src/a b/#1.py"
    assert parse_uri(timeline_uri("demo")).path is None
    for bad in ("http://demo/files/a", "agora://demo/files/../x", "agora://de mo/timeline",
                "agora://demo/other"):  # fmt: skip
        with pytest.raises(BadRequest):
            parse_uri(bad)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_read_and_subscribe(hub: HubProcess, workspace: str, transport: str) -> None:
    updates: asyncio.Queue[str] = asyncio.Queue()
    async with (
        connect(hub.url, hub.token("bob")) as bob,
        _session(transport, hub, workspace, updates) as session,
    ):
        ws = bob.workspace(workspace)
        await ws.write_file("notes.md", "v1")
        await ws.write_file("other.md", "x")
        listed = {str(r.uri) for r in (await session.list_resources()).resources}
        uri = file_uri(workspace, "notes.md")
        assert {uri, file_uri(workspace, "other.md"), timeline_uri(workspace)} <= listed
        read = await session.read_resource(uri)
        assert isinstance(read.contents[0], types.TextResourceContents)
        assert read.contents[0].text == "v1"
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == [
            "agora://{workspace}/files/{+path}",
            "agora://{workspace}/timeline",
        ]

        await session.subscribe_resource(uri)
        await ws.write_file("other.md", "y")  # not the subscribed file: no notification
        await ws.write_file("notes.md", "v2")
        assert await asyncio.wait_for(updates.get(), WAIT) == uri
        assert updates.empty()
        read = await session.read_resource(uri)
        assert read.contents[0].text == "v2"  # type: ignore[union-attr]
        await ws.move_file("notes.md", "moved.md")
        assert await asyncio.wait_for(updates.get(), WAIT) == uri

        await session.unsubscribe_resource(uri)
        await session.subscribe_resource(timeline_uri(workspace))
        await ws.post_message("hello")
        assert await asyncio.wait_for(updates.get(), WAIT) == timeline_uri(workspace)
        timeline = await session.read_resource(timeline_uri(workspace))
        body = msgspec.json.decode(timeline.contents[0].text)  # type: ignore[union-attr]
        assert body["events"][-1]["kind"] == "messagePosted"


async def test_resource_errors_carry_the_code(hub: HubProcess, workspace: str) -> None:
    reader = hub.token("reader", workspaces=("elsewhere",), rights=("read",))
    async with mcp_stdio(hub, reader, workspace="elsewhere") as session:
        with pytest.raises(MCPError) as missing:
            await session.read_resource(file_uri("elsewhere", "nope.txt"))
        assert missing.value.data["agoraCode"] == "notFound"
        with pytest.raises(MCPError) as forbidden:
            await session.subscribe_resource(file_uri(workspace, "a.txt"))
        assert forbidden.value.data["agoraCode"] == "forbidden"
        with pytest.raises(MCPError) as bad:
            await session.read_resource("agora://elsewhere/files/..%2Fx")
        assert bad.value.data["agoraCode"] == "badRequest"


async def test_the_timeline_resource_is_byte_capped(hub: HubProcess, workspace: str) -> None:
    """The attack: big events (here 8 of ~300 KiB) make the 100-event tail many MiB. The read
    keeps the newest ones within ``MAX_RESULT_BYTES`` and says ``truncated``."""
    big = 300 * 1024
    async with connect(hub.url, hub.token("writer")) as writer:
        ws = writer.workspace(workspace)
        for n in range(8):
            await ws.post_message(f"{n}:" + "x" * big)
    async with mcp_stdio(hub, hub.token("alice"), workspace=workspace) as session:
        read = await session.read_resource(timeline_uri(workspace))
    text = read.contents[0].text  # type: ignore[union-attr]
    assert len(text) <= MAX_RESULT_BYTES + 64 * 1024
    body = msgspec.json.decode(text)
    assert body["truncated"] is True
    texts = [e["payload"]["text"] for e in body["events"] if e["kind"] == "messagePosted"]
    assert 1 <= len(texts) < 8
    assert texts[-1].startswith("7:")  # the newest are kept
