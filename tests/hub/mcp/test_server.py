"""The MCP server's wiring: what a client sees at initialize, and the SDK internals
:mod:`hub.mcp` relies on (mcp is pinned to 2.3.x in pyproject.toml; these fail first when an
upgrade moves them)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from mcp.server.session import ServerSession
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from hub import __version__
from hub.core.validation import DEFAULT_LIMITS
from hub.mcp.server import INSTRUCTIONS, MESSAGE_RESERVE, SERVER_NAME
from tests.support.hub import HubProcess
from tests.support.mcp import mcp_stdio
from tests.support.paths import REPO


async def test_initialize_tells_name_capabilities_and_instructions(
    hub: HubProcess, workspace: str
) -> None:
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        info = session.server_info
        capabilities = session.server_capabilities
        assert info is not None and capabilities is not None
        assert (info.name, info.version) == (SERVER_NAME, __version__)
        assert capabilities.tools is not None
        assert capabilities.resources is not None and capabilities.resources.subscribe
        assert session.instructions == INSTRUCTIONS
        assert await session.send_ping() is not None


def test_sdk_internals_we_use_are_there() -> None:
    """hub.mcp.server.connection_of reads ServerSession._connection; hub.mcp.http ends a
    revoked token's session through the manager's owners, instances and _discard_session."""
    assert "_connection" in inspect.getsource(ServerSession.__init__)
    manager_init = inspect.getsource(StreamableHTTPSessionManager.__init__)
    assert "self._session_owners" in manager_init
    assert "self._server_instances" in manager_init
    assert inspect.iscoroutinefunction(StreamableHTTPSessionManager._discard_session)


def test_stdio_lines_are_bounded(hub: HubProcess) -> None:
    """A line longer than max_event_bytes + MESSAGE_RESERVE is not buffered whole: it is
    skipped (the SDK drops a line that is not JSON-RPC), and the next message is served."""
    huge = (
        '{"jsonrpc": "2.0", "id": 0, "method": "ping", "pad": "'
        + "x" * (DEFAULT_LIMITS.max_event_bytes + MESSAGE_RESERVE)
        + '"}\n'
    )
    initialize = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "hub", "mcp", "--url", hub.url],
        input=huge + initialize + "\n",
        env=dict(os.environ, PYTHONPATH=str(REPO), AGORA_TOKEN=hub.token()),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    # The ping would be answered (id 0) had its line been read whole: it was skipped.
    assert [r.get("id") for r in replies] == [1]
    assert replies[-1]["id"] == 1 and replies[-1]["result"]["serverInfo"]["name"] == "agora"
