"""Exact resumption: SSE ids are integer seqs, and a resubscribe with Last-Event-ID folds (with
the SDK's own artifact helper) to exactly what the uninterrupted stream folds to."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from a2a.client import ClientCallContext
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types.a2a_pb2 import StreamResponse, SubscribeToTaskRequest, Task, TaskState

from a2a_adapter.app import A2AService
from hub.core.events import Completed, NeedWork, WorkClaimed, WorkPublished
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, open_client


def fold(responses: list[StreamResponse]) -> Task:
    """A client's view of a stream: the Task, then each update applied the SDK's way."""
    task = Task()
    for r in responses:
        which = r.WhichOneof("payload")
        if which == "task":
            task.CopyFrom(r.task)
        elif which == "status_update":
            task.status.CopyFrom(r.status_update.status)
        elif which == "artifact_update":
            append_artifact_to_task(task, r.artifact_update)
    return task


def seq_of(r: StreamResponse) -> int:
    update = r.status_update if r.HasField("status_update") else r.artifact_update
    return int(update.metadata["agora.event"]["seq"])


async def ticks(workspaces: Workspaces, task_id: str) -> None:
    for i in range(5):
        art = {"artifactId": "ticks", "parts": [{"text": f"tick {i};"}]}
        if i:
            art["append"] = True
        await workspaces.publish(
            WORKSPACE, [WorkPublished(correlation_id=task_id, payload=art)], producer="bob"
        )
        await asyncio.sleep(0.01)
    await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")


@pytest.mark.parametrize("spelling", ["{}", "{}.0"])
async def test_resumed_stream_folds_to_the_uninterrupted_one(
    service: A2AService, token: TokenFactory, workspaces: Workspaces, spelling: str
) -> None:
    task_id = "t-resume"
    await workspaces.publish(
        WORKSPACE,
        [NeedWork(correlation_id=task_id, payload="count")],
        producer="alice",
    )
    await workspaces.publish(WORKSPACE, [WorkClaimed(correlation_id=task_id)], producer="bob")
    async with open_client(service.url, token()) as whole, open_client(service.url, token()) as cut:
        full_stream = whole.subscribe(SubscribeToTaskRequest(id=task_id))
        part_stream = cut.subscribe(SubscribeToTaskRequest(id=task_id))
        full = [await anext(full_stream)]
        part = [await anext(part_stream)]
        producer = asyncio.create_task(ticks(workspaces, task_id))
        while sum(r.HasField("artifact_update") for r in part) < 2:
            part.append(await anext(part_stream))
        await part_stream.aclose()  # the connection drops after two chunks
        full.extend([r async for r in full_stream])
        await producer
        last = seq_of(part[-1])
        ctx = ClientCallContext(service_parameters={"Last-Event-ID": spelling.format(last)})
        resumed = [r async for r in cut.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx)]
    assert resumed[0].HasField("task")
    assert int(resumed[0].task.metadata["agora.version"]) <= last
    assert all(seq_of(r) > last for r in resumed[1:])
    live, again = fold(full), fold(resumed)
    assert live.status.state == again.status.state == TaskState.TASK_STATE_COMPLETED
    # The SDK's helper appends each chunk as a part: five parts, each once.
    assert [p.text for p in live.artifacts[0].parts] == [f"tick {i};" for i in range(5)]
    assert list(again.artifacts) == list(live.artifacts)


async def test_every_sse_event_has_an_integer_seq_id(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    task_id = "t-ids"
    await workspaces.publish(
        WORKSPACE,
        [NeedWork(correlation_id=task_id, payload="x")],
        producer="alice",
    )
    await workspaces.publish(WORKSPACE, [WorkClaimed(correlation_id=task_id)], producer="bob")
    await ticks(workspaces, task_id)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SubscribeToTask",
        "params": {"id": task_id},
    }
    headers = {"Authorization": f"Bearer {token()}", "A2A-Version": "1.0", "Last-Event-ID": "1"}
    ids: list[int] = []
    seqs: list[int] = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", service.url + "/a2a/jsonrpc", json=body, headers=headers) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                ids.append(int(line[3:].strip()))  # an integer, not "8.0"
            elif line.startswith("data:"):
                result = json.loads(line[5:])["result"]
                meta = next(iter(result.values()))["metadata"]
                seq = meta.get("agora.version") or meta["agora.event"]["seq"]
                assert isinstance(seq, int)  # integers stay integers on the wire
                seqs.append(seq)
    assert len(ids) == len(seqs) == 8  # the Task, claimed, five ticks, completed
    assert ids == seqs and ids == sorted(ids)
