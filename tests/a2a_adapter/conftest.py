"""Fixtures for the A2A adapter tests: a hub (SQLite log + Workspaces) with the A2A listener on
a loopback port, and tokens for it (a2a-sdk clients for it: :mod:`tests.a2a_adapter.peers`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from a2a_adapter.app import A2AService
from hub.auth import TokenSigner
from hub.config import HubConfig
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory
from tests.support.a2a import a2a_listening
from tests.support.tokens import TTL_S, make_signer


@pytest.fixture
def signer() -> TokenSigner:
    return make_signer()


@pytest.fixture
def token(signer: TokenSigner) -> TokenFactory:
    def make(
        agent: str = "peer",
        workspaces: tuple[str, ...] = (WORKSPACE,),
        rights: tuple[str, ...] = ("read", "write"),
        backends: tuple[str, ...] = (),
    ) -> str:
        return signer.issue(agent, workspaces, rights, backends=backends, ttl_seconds=TTL_S)

    return make


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    store = SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs")
    async with store:
        ws = Workspaces(store)
        yield ws
        await ws.aclose()


@pytest.fixture
async def service(workspaces: Workspaces, signer: TokenSigner) -> AsyncIterator[A2AService]:
    async with a2a_listening(
        A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=0, blocking_timeout=20)
    ) as svc:
        yield svc
