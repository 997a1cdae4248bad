"""The MCP server's wiring: what a client sees at initialize, and the SDK internals
:mod:`hub.mcp` relies on (mcp is pinned to 2.3.x in pyproject.toml; these fail first when an
upgrade moves them)."""

from __future__ import annotations

import inspect

from mcp.server.session import ServerSession
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from hub import __version__
from hub.mcp.server import INSTRUCTIONS, SERVER_NAME
from tests.support.hub import HubProcess
from tests.support.mcp import mcp_stdio


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
