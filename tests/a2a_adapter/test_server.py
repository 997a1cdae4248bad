"""The A2A server against a real peer: the a2a-sdk Python client (JSON-RPC and HTTP+JSON).

The other side of each work item is a workspace member working through Workspaces directly
(:class:`Worker`, or the test publishing events itself)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from a2a.client import ClientCallContext
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import json_format, struct_pb2

from a2a_adapter.app import A2AService
from a2a_adapter.mapping import plain
from a2a_adapter.runtime import A2AExecRequest
from hub.auth import TokenSigner
from hub.config import HubConfig
from hub.core.capability import Capability
from hub.core.errors import Exists
from hub.core.events import (
    Completed,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    FeedbackRequested,
    MemberJoined,
    WorkClaimed,
    WorkPublished,
)
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, Worker, open_client
from tests.support.a2a import a2a_listening
from tests.support.waiting import wait_for

S = TaskState


def message(text: str, *, task_id: str = "", context_id: str = WORKSPACE) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


def kinds_of(responses: list[StreamResponse]) -> list[str]:
    out = []
    for r in responses:
        which = r.WhichOneof("payload")
        if which == "task":
            out.append(f"task:{S.Name(r.task.status.state)}")
        elif which == "status_update":
            out.append(f"status:{S.Name(r.status_update.status.state)}")
        elif which == "artifact_update":
            out.append("artifact")
        else:
            out.append(str(which))
    return out


async def events(workspaces: Workspaces) -> list[Any]:
    return await workspaces.store.read_batch(WORKSPACE, limit=10_000)


async def test_blocking_send_returns_the_completed_task(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with Worker(workspaces), open_client(service.url, token(), streaming=False) as client:
        [response] = [
            r async for r in client.send_message(SendMessageRequest(message=message("hi")))
        ]
    task = response.task
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert task.context_id == WORKSPACE
    assert [p.text for a in task.artifacts for p in a.parts] == ["result: hi"]
    assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    log = await events(workspaces)
    joined = [e for e in log if isinstance(e, MemberJoined)]
    assert [(j.producer, j.payload.via) for j in joined] == [("peer", "a2a")]
    need = next(e for e in log if e.kind == "needWork")
    assert need.producer == "peer" and need.correlation_id == task.id
    assert need.payload["parts"] == [{"text": "hi"}]
    assert [e.kind for e in log if e.correlation_id == task.id] == [
        "needWork",
        "workClaimed",
        "workPublished",
        "completed",
    ]


async def test_streaming_send_sends_task_then_updates(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with Worker(workspaces), open_client(service.url, token(), binding="JSONRPC") as client:
        got = [r async for r in client.send_message(SendMessageRequest(message=message("go")))]
    assert kinds_of(got) == [
        "task:TASK_STATE_SUBMITTED",
        "status:TASK_STATE_WORKING",
        "artifact",
        "status:TASK_STATE_COMPLETED",
    ]
    meta = plain(json_format.MessageToDict(got[1].status_update.metadata))
    assert meta["agora.kind"] == "workClaimed"
    assert meta["agora.event"]["producer"] == "bob"


async def test_http_json_binding(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        Worker(workspaces),
        open_client(service.url, token(), streaming=False, binding="HTTP+JSON") as client,
    ):
        [response] = [
            r async for r in client.send_message(SendMessageRequest(message=message("rest")))
        ]
        task = await client.get_task(GetTaskRequest(id=response.task.id))
        listed = await client.list_tasks(ListTasksRequest(context_id=WORKSPACE))
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert [t.id for t in listed.tasks] == [task.id]


async def test_get_list_and_cancel(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with open_client(service.url, token(), streaming=False) as client:
        ids = []
        for i in range(3):
            req = SendMessageRequest(message=message(f"job {i}"))
            req.configuration.return_immediately = True
            [r] = [r async for r in client.send_message(req)]
            assert r.task.status.state == S.TASK_STATE_SUBMITTED
            ids.append(r.task.id)
        got = await client.get_task(GetTaskRequest(id=ids[0], history_length=1))
        assert got.id == ids[0] and len(got.history) == 1
        page = await client.list_tasks(ListTasksRequest(context_id=WORKSPACE, page_size=2))
        assert len(page.tasks) == 2 and page.total_size == 3 and page.next_page_token
        rest = await client.list_tasks(
            ListTasksRequest(context_id=WORKSPACE, page_size=2, page_token=page.next_page_token)
        )
        assert {t.id for t in page.tasks} | {t.id for t in rest.tasks} == set(ids)
        cancelled = await client.cancel_task(CancelTaskRequest(id=ids[1]))
        assert cancelled.status.state == S.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=ids[1]))
        only = await client.list_tasks(
            ListTasksRequest(context_id=WORKSPACE, status=S.TASK_STATE_CANCELED)
        )
        assert [t.id for t in only.tasks] == [ids[1]]
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))
    cancel = [e for e in await events(workspaces) if e.kind == "workCancelled"]
    assert [(e.producer, e.correlation_id) for e in cancel] == [("peer", ids[1])]


async def test_only_requester_or_owner_may_cancel(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        open_client(service.url, token()) as owner_side,
        open_client(service.url, token("intruder")) as other,
    ):
        stream = owner_side.send_message(SendMessageRequest(message=message("mine")))
        first = await anext(stream)
        await stream.aclose()
        task_id = first.task.id
        await workspaces.publish(WORKSPACE, [WorkClaimed(correlation_id=task_id)], producer="bob")
        with pytest.raises(TaskNotCancelableError):
            await other.cancel_task(CancelTaskRequest(id=task_id))


async def test_a_cancel_the_log_cannot_take_now_is_a_server_error_to_retry(
    tmp_path: Path, signer: TokenSigner, token: TokenFactory
) -> None:
    """Another process holds the log's write lock past the store's busy timeout: CancelTask
    answers InternalError with ``agoraCode: unavailable`` (retry), not TaskNotCancelable
    (which tells the peer the task can never be cancelled), and nothing is written; once the
    lock is gone the same cancel works."""
    store = SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs", busy_timeout=0.3)
    async with store:
        ws = Workspaces(store)
        config = HubConfig()
        service = A2AService(ws, signer, config, host="127.0.0.1", port=0, blocking_timeout=20)
        async with (
            a2a_listening(service),
            open_client(service.url, token(), streaming=False) as client,
        ):
            req = SendMessageRequest(message=message("job"))
            req.configuration.return_immediately = True
            [r] = [r async for r in client.send_message(req)]
            task_id = r.task.id
            other = sqlite3.connect(tmp_path / "agora.db", isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")  # the write lock, as another writer holds it
                with pytest.raises(InternalError) as refused:
                    await client.cancel_task(CancelTaskRequest(id=task_id))
                assert isinstance(refused.value.data, dict)
                assert refused.value.data["agoraCode"] == "unavailable"
                other.execute("ROLLBACK")
            finally:
                other.close()
            assert [e.kind for e in await events(ws)].count("workCancelled") == 0
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert cancelled.status.state == S.TASK_STATE_CANCELED
        await ws.aclose()


async def test_continue_with_task_id_only_fills_the_context(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    """a2a-sdk 1.3.0 #1206: a taskId without contextId must stay in the task's context."""
    async with open_client(service.url, token()) as client:
        stream = client.send_message(SendMessageRequest(message=message("q")))
        first = await anext(stream)
        await stream.aclose()
        task_id = first.task.id
        await workspaces.publish(
            WORKSPACE,
            [
                WorkClaimed(correlation_id=task_id),
                FeedbackRequested(correlation_id=task_id, payload="which?"),
            ],
            producer="bob",
        )
        answer = message("the blue one", task_id=task_id, context_id="")
        streamed: list[StreamResponse] = []

        async def finish() -> None:
            await asyncio.sleep(0.2)
            await workspaces.publish(
                WORKSPACE, [Completed(correlation_id=task_id, payload="ok")], producer="bob"
            )

        finisher = asyncio.create_task(finish())
        async for r in client.send_message(SendMessageRequest(message=answer)):
            streamed.append(r)
        await finisher
        assert streamed[0].task.context_id == WORKSPACE
        assert kinds_of(streamed) == ["task:TASK_STATE_WORKING", "status:TASK_STATE_COMPLETED"]
        with pytest.raises(UnsupportedOperationError):  # a terminal task takes no message
            async for _ in client.send_message(
                SendMessageRequest(message=message("more", task_id=task_id))
            ):
                pass
        with pytest.raises(InvalidParamsError):  # taskId and a different contextId
            async for _ in client.send_message(
                SendMessageRequest(message=message("x", task_id=task_id, context_id="elsewhere"))
            ):
                pass
    fb = [e for e in await events(workspaces) if e.kind == "feedbackProvided"]
    assert [(e.producer, e.correlation_id, e.payload["parts"]) for e in fb] == [
        ("peer", task_id, [{"text": "the blue one"}])
    ]


async def test_resubscribe_after_disconnect_misses_nothing(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with open_client(service.url, token()) as client:
        stream = client.send_message(SendMessageRequest(message=message("long job")))
        first = await anext(stream)
        await stream.aclose()  # the peer disconnects after the first event
        task_id = first.task.id
        assert first.task.status.state == S.TASK_STATE_SUBMITTED
        version = int(first.task.metadata["agora.version"])
        # While it is away: claimed, two chunks of output.
        await workspaces.publish(
            WORKSPACE,
            [
                WorkClaimed(correlation_id=task_id),
                WorkPublished(
                    correlation_id=task_id,
                    payload={"artifactId": "out", "parts": [{"text": "part 1;"}]},
                ),
                WorkPublished(
                    correlation_id=task_id,
                    payload={"artifactId": "out", "parts": [{"text": "part 2"}], "append": True},
                ),
            ],
            producer="bob",
        )
        # Plain SubscribeToTask: the current Task carries everything so far.
        plain_stream = client.subscribe(SubscribeToTaskRequest(id=task_id))
        snapshot = await anext(plain_stream)
        await plain_stream.aclose()
        assert snapshot.task.status.state == S.TASK_STATE_WORKING
        # Chunks are parts, as the SDK's own fold of the updates has them.
        assert [p.text for p in snapshot.task.artifacts[0].parts] == ["part 1;", "part 2"]
        # Resuming from the version it had: every missed update, in order, then live.
        resumed: list[StreamResponse] = []
        ctx = ClientCallContext(service_parameters={"Last-Event-ID": str(version)})

        async def finish() -> None:
            await asyncio.sleep(0.2)
            await workspaces.publish(
                WORKSPACE, [Completed(correlation_id=task_id, payload="all done")], producer="bob"
            )

        finisher = asyncio.create_task(finish())
        async for r in client.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx):
            resumed.append(r)
        await finisher
    assert kinds_of(resumed) == [
        "task:TASK_STATE_SUBMITTED",  # the Task as of the resume point, not as of now
        "status:TASK_STATE_WORKING",
        "artifact",
        "artifact",
        "status:TASK_STATE_COMPLETED",
    ]
    seqs = [
        int(
            plain(
                json_format.MessageToDict(r.status_update.metadata or r.artifact_update.metadata)
            )["agora.event"]["seq"]
        )
        if r.WhichOneof("payload") != "task"
        else 0
        for r in resumed
    ]
    assert seqs[1:] == sorted(seqs[1:]) and seqs[1] == version + 1


async def test_subscribe_to_terminal_task_is_an_error_unless_resuming(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with Worker(workspaces), open_client(service.url, token()) as client:
        got = [r async for r in client.send_message(SendMessageRequest(message=message("x")))]
        task_id = got[0].task.id
        with pytest.raises(UnsupportedOperationError):
            async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                pass
        ctx = ClientCallContext(
            service_parameters={"Last-Event-ID": str(int(got[0].task.metadata["agora.version"]))}
        )
        replay = [
            r async for r in client.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx)
        ]
    assert kinds_of(replay) == [
        "task:TASK_STATE_SUBMITTED",
        "status:TASK_STATE_WORKING",
        "artifact",
        "status:TASK_STATE_COMPLETED",
    ]


async def test_forbidden_workspace_is_an_a2a_error(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with open_client(service.url, token()) as client:
        with pytest.raises(InvalidParamsError) as err:
            async for _ in client.send_message(
                SendMessageRequest(message=message("x", context_id="secret"))
            ):
                pass
    assert err.value.data is not None and err.value.data.get("agoraCode") == "forbidden"
    reader = token("reader", rights=("read",))
    async with open_client(service.url, reader) as client:
        with pytest.raises(InvalidParamsError):
            async for _ in client.send_message(SendMessageRequest(message=message("x"))):
                pass


async def test_exec_part_without_runtime_is_unsupported(
    service: A2AService, token: TokenFactory
) -> None:
    exec_part = Part()
    exec_part.data.CopyFrom(
        json_format.ParseDict(
            {"agora.exec": {"backend": "process", "source": "echo hi"}}, struct_pb2.Value()
        )
    )
    msg = Message(message_id="m-exec", role=Role.ROLE_USER, parts=[exec_part], context_id=WORKSPACE)
    async with open_client(service.url, token(rights=("read", "write", "exec"))) as client:
        with pytest.raises(UnsupportedOperationError):
            async for _ in client.send_message(SendMessageRequest(message=msg)):
                pass


class FakeRuntime:
    """Writes an execution's lifecycle the way the runtime will: requested, started, output
    in chunks, finished."""

    def __init__(self, workspaces: Workspaces) -> None:
        self.workspaces = workspaces
        self.tasks: set[asyncio.Task[None]] = set()

    async def exec(
        self, workspace: str, request: A2AExecRequest, *, exec_id: str, capability: Capability
    ) -> str:
        capability.require("exec", workspace)
        await self.request(workspace, request, exec_id=exec_id, capability=capability)
        task = asyncio.create_task(self._run(workspace, exec_id))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return exec_id

    async def request(
        self, workspace: str, request: A2AExecRequest, *, exec_id: str, capability: Capability
    ) -> None:
        """``execRequested`` by the asking agent, as the runtime writes it."""
        await self.workspaces.publish(
            workspace,
            [
                ExecRequested(
                    payload=ExecRequestedPayload(
                        exec_id=exec_id, backend=request.backend, source=request.source
                    )
                )
            ],
            producer=capability.agent,
            trusted=True,
        )

    async def _run(self, workspace: str, exec_id: str) -> None:
        await asyncio.sleep(0.1)
        hub = "hub"
        await self.workspaces.publish(
            workspace,
            [ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="process"))],
            producer=hub,
            trusted=True,
        )
        for n, data in enumerate([b"hel", b"lo\n"], start=1):
            await self.workspaces.publish(
                workspace,
                [
                    ExecOutput(
                        payload=ExecOutputPayload(exec_id=exec_id, stream="stdout", n=n, data=data)
                    )
                ],
                producer=hub,
                trusted=True,
            )
        await self.workspaces.publish(
            workspace,
            [
                ExecFinished(
                    payload=ExecFinishedPayload(
                        exec_id=exec_id, status="completed", reason="exit", exit_code=0
                    )
                )
            ],
            producer=hub,
            trusted=True,
        )

    async def kill(self, workspace: str, exec_id: str, *, capability: Capability) -> None:
        raise NotImplementedError


class PendingRuntime(FakeRuntime):
    """Accepts an execution and never runs it; a kill asks for its cancel in the log, as the
    runtime does (``execCancelRequested``)."""

    async def exec(
        self, workspace: str, request: A2AExecRequest, *, exec_id: str, capability: Capability
    ) -> str:
        await self.request(workspace, request, exec_id=exec_id, capability=capability)
        return exec_id

    async def kill(self, workspace: str, exec_id: str, *, capability: Capability) -> None:
        await self.workspaces.publish(
            workspace,
            [ExecCancelRequested(payload=ExecCancelRequestedPayload(exec_id=exec_id))],
            producer=capability.agent,
            trusted=True,
        )


async def test_a_kill_the_log_cannot_take_now_is_a_server_error_to_retry(
    tmp_path: Path, signer: TokenSigner, token: TokenFactory
) -> None:
    """As for a work item's cancel: the runtime's kill fails with ``unavailable`` (the log's
    write lock held by another process) and CancelTask answers InternalError, not
    TaskNotCancelable."""
    store = SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs", busy_timeout=0.3)
    async with store:
        ws = Workspaces(store)
        service = A2AService(
            ws, signer, HubConfig(), host="127.0.0.1", port=0, runtime=PendingRuntime(ws)
        )
        exec_part = Part()
        exec_part.data.CopyFrom(
            json_format.ParseDict(
                {"agora.exec": {"backend": "process", "source": "sleep 9"}}, struct_pb2.Value()
            )
        )
        req = SendMessageRequest(
            message=Message(
                message_id="m-held", role=Role.ROLE_USER, parts=[exec_part], context_id=WORKSPACE
            )
        )
        req.configuration.return_immediately = True
        runner = token(rights=("read", "write", "exec"), backends=("process",))
        async with a2a_listening(service), open_client(service.url, runner, streaming=False) as c:
            [r] = [r async for r in c.send_message(req)]
            other = sqlite3.connect(tmp_path / "agora.db", isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                with pytest.raises(InternalError) as refused:
                    await c.cancel_task(CancelTaskRequest(id=r.task.id))
                assert isinstance(refused.value.data, dict)
                assert refused.value.data["agoraCode"] == "unavailable"
                other.execute("ROLLBACK")
            finally:
                other.close()
        assert "execCancelRequested" not in [e.kind for e in await events(ws)]
        await ws.aclose()


async def test_exec_part_runs_through_the_runtime(
    workspaces: Workspaces, signer: TokenSigner, token: TokenFactory
) -> None:
    runtime = FakeRuntime(workspaces)
    async with a2a_listening(
        A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=0, runtime=runtime)
    ) as svc:
        exec_part = Part()
        exec_part.data.CopyFrom(
            json_format.ParseDict(
                {"agora.exec": {"backend": "process", "source": "echo hello"}}, struct_pb2.Value()
            )
        )
        msg = Message(
            message_id="m-exec", role=Role.ROLE_USER, parts=[exec_part], context_id=WORKSPACE
        )
        runner = token(rights=("read", "write", "exec"), backends=("process",))
        async with open_client(svc.url, runner) as client:
            got = [r async for r in client.send_message(SendMessageRequest(message=msg))]
    assert kinds_of(got) == [
        "task:TASK_STATE_SUBMITTED",
        "status:TASK_STATE_WORKING",
        "artifact",
        "artifact",
        "artifact",
        "status:TASK_STATE_COMPLETED",
    ]
    chunks = [r.artifact_update for r in got if r.WhichOneof("payload") == "artifact_update"]
    assert [(c.append, c.last_chunk) for c in chunks] == [
        (False, False),
        (True, False),
        (True, True),
    ]
    assert "".join(p.text for c in chunks for p in c.artifact.parts) == "hello\n"


async def test_peer_steps_are_in_the_log_for_replay(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with Worker(workspaces), open_client(service.url, token("peer-x")) as client:
        _ = [r async for r in client.send_message(SendMessageRequest(message=message("audit me")))]

    async def member() -> bool:
        state = await workspaces.state(WORKSPACE)
        m = state.members.get("peer-x")
        return m is not None and m.via == "a2a"

    await wait_for(member)
    produced = {
        e.producer for e in await events(workspaces) if e.kind in ("needWork", "memberJoined")
    }
    assert produced == {"peer-x"}


class FinishedRuntime(FakeRuntime):
    """A runtime whose executions are over before ``exec`` returns (a fast program can be:
    the adapter reads the task back after the runtime answered). An id it has run is
    ``exists``, as in the real runtime."""

    async def exec(
        self, workspace: str, request: A2AExecRequest, *, exec_id: str, capability: Capability
    ) -> str:
        if exec_id in (await self.workspaces.state(workspace)).executions:
            raise Exists(f"execution {exec_id!r} exists (finished)", execId=exec_id)
        await super().exec(workspace, request, exec_id=exec_id, capability=capability)
        await asyncio.gather(*self.tasks)
        return exec_id


async def test_exec_stream_starts_at_the_request_even_if_the_run_is_over(
    workspaces: Workspaces, signer: TokenSigner, token: TokenFactory
) -> None:
    async with a2a_listening(
        A2AService(
            workspaces,
            signer,
            HubConfig(),
            host="127.0.0.1",
            port=0,
            runtime=FinishedRuntime(workspaces),
        )
    ) as svc:
        exec_part = Part()
        exec_part.data.CopyFrom(
            json_format.ParseDict(
                {"agora.exec": {"backend": "process", "source": "echo hello"}}, struct_pb2.Value()
            )
        )
        msg = Message(
            message_id="m-fast", role=Role.ROLE_USER, parts=[exec_part], context_id=WORKSPACE
        )
        runner = token(rights=("read", "write", "exec"), backends=("process",))
        async with open_client(svc.url, runner) as client:
            got = [r async for r in client.send_message(SendMessageRequest(message=msg))]
        async with open_client(svc.url, runner, streaming=False) as client:
            again = SendMessageRequest(message=msg)
            again.configuration.return_immediately = True
            [retried] = [r async for r in client.send_message(again)]
    # The Task as of execRequested, then every step, as for a run still going.
    assert kinds_of(got) == [
        "task:TASK_STATE_SUBMITTED",
        "status:TASK_STATE_WORKING",
        "artifact",
        "artifact",
        "artifact",
        "status:TASK_STATE_COMPLETED",
    ]
    # The same message again: the same execution, not a second one (nor an error).
    assert retried.task.id == got[0].task.id
    requested = [e for e in await events(workspaces) if isinstance(e, ExecRequested)]
    assert len(requested) == 1
