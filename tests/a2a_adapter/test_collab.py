"""A WebSocket agent (hub/client.py against hub/server/) and an A2A peer (a2a-sdk client)
on one work item, in one hub process: each sees the other's steps."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf import json_format

from a2a_adapter.app import A2AService
from a2a_adapter.mapping import plain
from hub.auth import TokenSigner
from hub.client import connect
from hub.config import HubConfig, ServerConfig
from hub.log.sqlite import SqliteEventStore
from hub.server.app import Hub
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, open_client
from tests.support.a2a import a2a_listening

S = TaskState


@pytest.fixture
async def hub_and_a2a(tmp_path: Path, signer: TokenSigner) -> AsyncIterator[tuple[str, A2AService]]:
    config = HubConfig(server=ServerConfig(host="127.0.0.1", port=0, http_port=0))
    store = SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs")
    hub = Hub(config, store, signer)
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    runner = asyncio.create_task(hub.run(stop, on_ready=ready.set_result))
    url = await asyncio.wait_for(asyncio.shield(ready), 10)
    try:
        async with a2a_listening(A2AService(hub.workspaces, signer, config, port=0)) as a2a:
            yield url, a2a
    finally:
        stop.set()
        await asyncio.wait_for(runner, 10)


def _kind(r: StreamResponse) -> tuple[str, str, str]:
    """(payload case, state, producer) of a stream response."""
    which = r.WhichOneof("payload")
    if which == "task":
        return which, S.Name(r.task.status.state), ""
    update = r.status_update if which == "status_update" else r.artifact_update
    meta = plain(json_format.MessageToDict(update.metadata))
    state = S.Name(r.status_update.status.state) if which == "status_update" else ""
    return str(which), state, meta["agora.event"]["producer"]


async def test_websocket_agent_and_a2a_peer_share_a_work_item(
    hub_and_a2a: tuple[str, A2AService], token: TokenFactory
) -> None:
    ws_url, a2a = hub_and_a2a
    ws_token = token("ws-agent")
    async with (
        connect(ws_url, ws_token) as session,
        open_client(a2a.url, token("a2a-peer")) as peer,
    ):
        ws = session.workspace(WORKSPACE)
        request = SendMessageRequest(
            message=Message(
                message_id=str(uuid.uuid4()),
                role=Role.ROLE_USER,
                context_id=WORKSPACE,
                parts=[Part(text="convert the report")],
            )
        )
        first_leg: list[StreamResponse] = []

        async def websocket_agent() -> list[str]:
            """Claim, ask a question, use the answer, publish, complete; report what it saw."""
            need = await ws.wait_for_work(timeout=10)
            cid = need.correlation_id
            assert cid is not None
            await ws.claim_work(cid)
            asked = await ws.request_feedback(cid, "which format?")
            answer = await ws.wait_for_feedback(cid, timeout=10, after_seq=asked.seq)
            await ws.publish_work(cid, f"report as {answer.payload['parts'][0]['text']}")
            await ws.signal_completed(cid, "done")
            return [f"{need.kind} by {need.producer}", f"{answer.kind} by {answer.producer}"]

        agent = asyncio.create_task(websocket_agent())
        async for r in peer.send_message(request):
            first_leg.append(r)  # ends when the WebSocket agent asks for input
        task_id = first_leg[0].task.id
        assert [_kind(r) for r in first_leg] == [
            ("task", "TASK_STATE_SUBMITTED", ""),
            ("status_update", "TASK_STATE_WORKING", "ws-agent"),
            ("status_update", "TASK_STATE_INPUT_REQUIRED", "ws-agent"),
        ]
        question = first_leg[-1].status_update.status.message
        assert [p.text for p in question.parts] == ["which format?"]

        answer = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            task_id=task_id,
            parts=[Part(text="pdf")],
        )
        second_leg = [r async for r in peer.send_message(SendMessageRequest(message=answer))]
        assert [_kind(r) for r in second_leg] == [
            ("task", "TASK_STATE_WORKING", ""),
            ("artifact_update", "", "ws-agent"),
            ("status_update", "TASK_STATE_COMPLETED", "ws-agent"),
        ]
        assert second_leg[1].artifact_update.artifact.parts[0].text == "report as pdf"
        seen_by_ws = await asyncio.wait_for(agent, 10)
        assert seen_by_ws == ["needWork by a2a-peer", "feedbackProvided by a2a-peer"]

        # The whole conversation is one work item in the log, for `agora replay`.
        history = [e for e in await ws.events() if e.correlation_id == task_id]
        assert [(e.kind, e.producer) for e in history] == [
            ("needWork", "a2a-peer"),
            ("workClaimed", "ws-agent"),
            ("feedbackRequested", "ws-agent"),
            ("feedbackProvided", "a2a-peer"),
            ("workPublished", "ws-agent"),
            ("completed", "ws-agent"),
        ]
        members = (await ws.state()).members
        assert members["a2a-peer"].via == "a2a" and members["ws-agent"].via == "websocket"


async def test_a2a_peer_follows_and_joins_a_websocket_work_item(
    hub_and_a2a: tuple[str, A2AService], token: TokenFactory
) -> None:
    ws_url, a2a = hub_and_a2a
    async with (
        connect(ws_url, token("ws-agent")) as session,
        open_client(a2a.url, token("a2a-peer")) as peer,
    ):
        ws = session.workspace(WORKSPACE)
        need = await ws.request_work("review", {"file": "a.py"})
        cid = need.correlation_id
        assert cid is not None
        sub = peer.subscribe(SubscribeToTaskRequest(id=cid))
        snapshot = await anext(sub)
        assert snapshot.task.status.state == S.TASK_STATE_SUBMITTED
        assert json_format.MessageToDict(snapshot.task.history[0].parts[0].data) == {"file": "a.py"}
        note = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            task_id=cid,
            parts=[Part(text="on it")],
        )
        request = SendMessageRequest(message=note)
        request.configuration.return_immediately = True
        posted = peer.send_message(request)
        await anext(posted)
        await posted.aclose()
        seen = await ws.wait_for_kind(cid, "messagePosted", timeout=10)
        assert seen.producer == "a2a-peer"
        assert msgspec.to_builtins(seen.payload)["text"] == "on it"
        update = await anext(sub)  # the subscriber sees its own message as a step too
        assert update.status_update.status.message.parts[0].text == "on it"
        await ws.cancel_work(cid)
        update = await anext(sub)
        assert update.status_update.status.state == S.TASK_STATE_CANCELED
        await sub.aclose()
