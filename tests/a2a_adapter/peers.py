"""What the A2A adapter tests share besides fixtures: the workspace they use, a2a-sdk clients
built from the hub's agent card, and :class:`Worker`, a member that serves A2A requests from the
WebSocket side (through :class:`~hub.workspaces.Workspaces` directly)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf import json_format

from hub.core.events import Completed, NeedWork, WorkClaimed, WorkPublished
from hub.follow import FollowerClosed, LogFollower
from hub.workspaces import Workspaces

WORKSPACE = "demo"

TokenFactory = Callable[..., str]
"""The ``token`` fixture: ``token(agent="peer", workspaces=(WORKSPACE,), rights=…, backends=…)``."""


async def fetch_card(base_url: str) -> AgentCard:
    async with httpx.AsyncClient() as http:
        response = await http.get(base_url + "/.well-known/agent-card.json")
        response.raise_for_status()
        card = AgentCard()
        json_format.ParseDict(response.json(), card, ignore_unknown_fields=True)
        return card


@contextlib.asynccontextmanager
async def open_client(
    base_url: str, token: str, *, streaming: bool = True, binding: str = "JSONRPC"
) -> AsyncIterator[Client]:
    """An a2a-sdk client for the hub, built from its card, closed on exit."""
    card = await fetch_card(base_url)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        config = ClientConfig(
            httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding]
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


class Worker:
    """A workspace member working through :class:`Workspaces` directly (the non-A2A side):
    it claims every ``needWork`` of its workspace, publishes ``result: <text>`` and completes.
    Use as an async context manager."""

    def __init__(self, workspaces: Workspaces, workspace: str = WORKSPACE, name: str = "bob"):
        self.workspaces = workspaces
        self.workspace = workspace
        self.name = name
        self.follower = LogFollower(workspaces)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Worker:
        self.follower.install()
        head = await self.workspaces.head(self.workspace)
        self._task = asyncio.create_task(self._run(head))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.follower.aclose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, FollowerClosed):
                await self._task

    async def _run(self, after: int) -> None:
        async with contextlib.aclosing(self.follower.follow(self.workspace, after)) as events:
            async for ev in events:
                if isinstance(ev, NeedWork) and ev.correlation_id:
                    cid = ev.correlation_id
                    text = _first_text(ev.payload)
                    await self.workspaces.publish(
                        self.workspace,
                        [
                            WorkClaimed(correlation_id=cid),
                            WorkPublished(correlation_id=cid, payload=f"result: {text}"),
                            Completed(correlation_id=cid, payload="done"),
                        ],
                        producer=self.name,
                    )


def _first_text(payload: Any) -> str:
    if isinstance(payload, dict):
        for part in payload.get("parts", []):
            if "text" in part:
                return str(part["text"])
    return str(payload)
