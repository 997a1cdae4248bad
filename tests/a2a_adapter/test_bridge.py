"""The client bridge: a needWork addressed to a configured A2A peer (an a2a-sdk echo agent on
a loopback port) is handed to it, and its answers come back as events produced by the peer;
after a restart the bridge resumes the open item instead of forgetting it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import GetTaskRequest, TaskState

from a2a_adapter.bridge import Bridge
from hub.config import PeerConfig
from hub.core.events import Event, FeedbackProvided, MemberJoined, NeedWork, WorkCancelled
from hub.workspaces import Workspaces
from tests.a2a_adapter.echo_agent import echo_agent
from tests.a2a_adapter.peers import WORKSPACE, fetch_card
from tests.support.waiting import wait_for


@pytest.fixture
async def echo_card() -> AsyncIterator[str]:
    async with echo_agent() as card_url:
        yield card_url


@contextlib.asynccontextmanager
async def running(bridge: Bridge) -> AsyncIterator[Bridge]:
    task = asyncio.create_task(bridge.run())
    try:
        yield bridge
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def item_events(workspaces: Workspaces, cid: str) -> list[Event]:
    log = await workspaces.store.read_batch(WORKSPACE, limit=10_000)
    return [e for e in log if e.correlation_id == cid]


async def status(workspaces: Workspaces, cid: str) -> str | None:
    item = (await workspaces.state(WORKSPACE)).work_items.get(cid)
    return None if item is None else item.status


def parts_text(payload: Any) -> list[str]:
    return [p.get("text", "") for p in payload.get("parts", [])]


async def test_need_work_for_a_peer_comes_back_as_events(
    workspaces: Workspaces, echo_card: str
) -> None:
    peers = [PeerConfig(name="echo", card_url=echo_card)]
    async with running(Bridge(workspaces, peers)):
        await workspaces.publish(
            WORKSPACE,
            [NeedWork(correlation_id="job-1", consumer="echo", payload="hello")],
            producer="alice",
        )

        async def done() -> bool:
            return await status(workspaces, "job-1") == "completed"

        await wait_for(done)
    events = await item_events(workspaces, "job-1")
    assert [(e.kind, e.producer) for e in events] == [
        ("needWork", "alice"),
        ("workClaimed", "echo"),
        ("workPublished", "echo"),
        ("completed", "echo"),
    ]
    claimed, published, completed = events[1:]
    assert claimed.payload["peer"] == "echo" and claimed.payload["peerTaskId"]
    assert parts_text(published.payload) == ["echo: hello"]
    assert parts_text(completed.payload) == ["done"]
    log = await workspaces.store.read_batch(WORKSPACE, limit=100)
    joined = [e for e in log if isinstance(e, MemberJoined)]
    assert [(j.payload.agent, j.payload.via, j.payload.card_url) for j in joined] == [
        ("echo", "a2a", echo_card)
    ]


async def test_restart_resumes_an_open_item(workspaces: Workspaces, echo_card: str) -> None:
    peers = [PeerConfig(name="echo", card_url=echo_card)]
    async with running(Bridge(workspaces, peers)):
        await workspaces.publish(
            WORKSPACE,
            [NeedWork(correlation_id="job-2", consumer="echo", payload="ask me")],
            producer="alice",
        )

        async def asked() -> bool:
            return await status(workspaces, "job-2") == "feedbackRequested"

        await wait_for(asked)
    # The hub is down; meanwhile a member answers the peer's question.
    await workspaces.publish(
        WORKSPACE, [FeedbackProvided(correlation_id="job-2", payload="blue")], producer="alice"
    )
    async with running(Bridge(workspaces, peers)):  # restart: derives the open item from the log

        async def done() -> bool:
            return await status(workspaces, "job-2") == "completed"

        await wait_for(done)
    events = await item_events(workspaces, "job-2")
    assert [(e.kind, e.producer) for e in events] == [
        ("needWork", "alice"),
        ("workClaimed", "echo"),
        ("feedbackRequested", "echo"),
        ("feedbackProvided", "alice"),
        ("workPublished", "echo"),
        ("completed", "echo"),
    ]
    assert parts_text(events[2].payload) == ["which one?"]
    assert parts_text(events[4].payload) == ["echo: blue"]


async def test_member_cancel_reaches_the_peer(workspaces: Workspaces, echo_card: str) -> None:
    peers = [PeerConfig(name="echo", card_url=echo_card)]
    bridge = Bridge(workspaces, peers)
    async with running(bridge):
        await workspaces.publish(
            WORKSPACE,
            [NeedWork(correlation_id="job-3", consumer="echo", payload="ask first")],
            producer="alice",
        )

        async def asked() -> bool:
            return await status(workspaces, "job-3") == "feedbackRequested"

        await wait_for(asked)
        await workspaces.publish(
            WORKSPACE, [WorkCancelled(correlation_id="job-3")], producer="alice"
        )

        async def idle() -> bool:
            return bridge.driving == 0

        await wait_for(idle)
    events = await item_events(workspaces, "job-3")
    assert events[-1].kind == "workCancelled" and events[-1].producer == "alice"
    peer_task = events[1].payload["peerTaskId"]
    card = await fetch_card(echo_card.removesuffix("/.well-known/agent-card.json"))
    async with httpx.AsyncClient() as http:
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)

        async def cancelled_at_peer() -> bool:
            task = await client.get_task(GetTaskRequest(id=peer_task))
            return task.status.state == TaskState.TASK_STATE_CANCELED

        await wait_for(cancelled_at_peer)
