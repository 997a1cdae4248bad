"""Fixtures for the MCP door: one real ``agora serve`` per module (with its HTTP port, where
``/mcp`` lives), shared by its tests; each test uses its own workspace. The MCP sessions
themselves come from :mod:`tests.support.mcp` (``mcp_stdio``, ``mcp_http``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.support.hub import HubProcess, HubStarter
from tests.support.mcp import MCP_HUB_CONFIG

_names = itertools.count()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """A real ``agora serve`` with its HTTP port (``/mcp``) on a free port, ``[mcp]
    max_sessions`` = :data:`tests.support.mcp.MAX_SESSIONS`, no presence grace."""
    starter = HubStarter(tmp_path_factory.mktemp("mcp-hub"))
    yield starter.start(MCP_HUB_CONFIG, a2a_port=0)
    starter.close()


@pytest.fixture
def workspace() -> str:
    """A fresh workspace name for one test."""
    return f"mcp-{next(_names)}"
