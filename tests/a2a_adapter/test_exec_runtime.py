"""Executions over A2A against a real ``agora serve``: the a2a-sdk client sends ``agora.exec``
data parts to the hub's A2A listener, the hub's own runtime (hub/runtime/runtime.py) runs
them on the ``process`` backend, and the log (read back with ``agora replay --json``) shows
the lifecycle produced by the A2A agent.

The hub is one subprocess for the module (:class:`tests.support.hub.HubProcess`, ``--port 0
--a2a-port 0``: both listeners on free ports, the A2A one read from its banner ``agora A2A on
http://…``); each test uses its own workspace. The ``process`` instance keeps its default
policy (network disabled) where ``unshare`` works here, else it is configured with the network
enabled (docs/execution.md, "process"), so the default request runs either way.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskArtifactUpdateEvent,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from google.protobuf import json_format, struct_pb2

from a2a_adapter.mapping import plain
from tests.a2a_adapter.peers import fetch_card, open_client
from tests.support import tokens
from tests.support.hub import HubProcess, HubStarter
from tests.support.paths import REPO

S = TaskState
BINDINGS = ["JSONRPC", "HTTP+JSON"]


def replay(hub: HubProcess, workspace: str) -> list[dict[str, Any]]:
    """``agora replay --json WORKSPACE --data DIR``: the stored envelopes ([] for a workspace
    without events)."""
    argv = [sys.executable, "-m", "hub", "replay", "--json", workspace]
    done = subprocess.run(
        [*argv, "--data", str(hub.data_dir)],
        cwd=REPO,
        env=hub.environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "has no events" in done.stderr:
        return []  # nothing was ever written in the workspace
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def network_isolation_works() -> bool:
    """Whether the process backend can disable the network here (its own probe, run in a
    child)."""
    probe = (
        "import asyncio; from backends.process import probe_network_isolation as p; "
        "print(bool(asyncio.run(p())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """The hub of the module: a ``process`` backend, the A2A listener on a free port."""
    limits = "" if network_isolation_works() else 'limits = { network = "enabled" }\n'
    starter = HubStarter(tmp_path_factory.mktemp("a2a-exec"))
    config = f'[[backends]]\nid = "process"\nkind = "process"\naccess = "read-write"\n{limits}'
    served = starter.start(config, a2a_port=0)
    assert not served.a2a_url.endswith(":0"), served.a2a_url  # the bound port, not the asked one
    yield served
    starter.close()


def mint(
    agent: str,
    workspace: str,
    *,
    rights: tuple[str, ...] = tokens.EXEC_RIGHTS,
    backends: tuple[str, ...] = ("process",),
) -> str:
    return tokens.mint(agent, (workspace,), rights, backends=backends)


def exec_message(workspace: str, source: str, *, message_id: str | None = None) -> Message:
    part = Part()
    part.data.CopyFrom(
        json_format.ParseDict(
            {"agora.exec": {"backend": "process", "source": source}}, struct_pb2.Value()
        )
    )
    return Message(
        message_id=message_id or str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[part],
        context_id=workspace,
    )


def new_workspace() -> str:
    return f"x-{uuid.uuid4().hex[:12]}"


def states(responses: list[StreamResponse]) -> list[str]:
    """The task state each response carries ("artifact" for an artifact update)."""
    out = []
    for r in responses:
        which = r.WhichOneof("payload")
        if which == "task":
            out.append(S.Name(r.task.status.state))
        elif which == "status_update":
            out.append(S.Name(r.status_update.status.state))
        else:
            out.append("artifact")
    return out


def meta(update: Any) -> dict[str, Any]:
    return dict(plain(json_format.MessageToDict(update.metadata)))


def chunks(responses: list[StreamResponse]) -> list[TaskArtifactUpdateEvent]:
    return [r.artifact_update for r in responses if r.WhichOneof("payload") == "artifact_update"]


def check_chunks(updates: list[TaskArtifactUpdateEvent], exec_id: str) -> dict[str, str]:
    """Each stream's chunks: the first without ``append``, the rest with it, exactly the last
    one with ``lastChunk``; returns each stream's text."""
    texts: dict[str, str] = {}
    by_stream: dict[str, list[TaskArtifactUpdateEvent]] = {}
    for u in updates:
        by_stream.setdefault(u.artifact.artifact_id, []).append(u)
    for artifact_id, stream in by_stream.items():
        name = artifact_id.removeprefix(f"{exec_id}:")
        assert artifact_id == f"{exec_id}:{name}" and name in ("stdout", "stderr"), artifact_id
        assert [u.append for u in stream] == [False] + [True] * (len(stream) - 1), name
        assert [u.last_chunk for u in stream] == [False] * (len(stream) - 1) + [True], name
        assert meta(stream[-1]).get("agora.synthetic") is True
        texts[name] = "".join(p.text for u in stream for p in u.artifact.parts)
    return texts


def exec_events(log: list[dict[str, Any]], exec_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in log
        if e["kind"].startswith("exec") and (e.get("payload") or {}).get("execId") == exec_id
    ]


def output_text(events: list[dict[str, Any]], stream: str) -> str:
    data = b"".join(
        base64.b64decode(e["payload"]["data"])
        for e in events
        if e["kind"] == "execOutput" and e["payload"]["stream"] == stream
    )
    return data.decode()


async def test_the_card_offers_executions(hub: HubProcess) -> None:
    card = await fetch_card(hub.a2a_url)
    assert "exec" in [s.id for s in card.skills]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_failed_exec_streams_its_lifecycle_and_output(hub: HubProcess, binding: str) -> None:
    ws = new_workspace()
    token = mint("a2a-runner", ws)
    request = SendMessageRequest(message=exec_message(ws, "echo hello; echo oops >&2; exit 3"))
    async with open_client(hub.a2a_url, token, binding=binding) as client:
        got = [r async for r in client.send_message(request)]
        exec_id = got[0].task.id
        fetched = await client.get_task(GetTaskRequest(id=exec_id))

    # SUBMITTED (the Task as of execRequested) → WORKING (execStarted) → output → FAILED.
    seq = states(got)
    assert seq[0] == "TASK_STATE_SUBMITTED", seq
    assert [s for s in seq if s != "artifact"] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_FAILED",
    ], seq
    assert seq.index("TASK_STATE_WORKING") < seq.index("artifact")
    assert got[0].task.context_id == ws
    assert meta(got[0].task)["agora.task"] == "execution"
    assert meta(got[0].task)["agora.requester"] == "a2a-runner"
    final = got[-1].status_update
    assert meta(final)["agora.kind"] == "execFinished"
    result = plain(json_format.MessageToDict(final.status.message.parts[0].data))
    assert (result["status"], result["reason"], result["exitCode"]) == ("failed", "exit", 3)
    assert check_chunks(chunks(got), exec_id) == {"stdout": "hello\n", "stderr": "oops\n"}

    # GetTask folds the same events.
    assert fetched.status.state == S.TASK_STATE_FAILED
    artifacts = {a.name: "".join(p.text for p in a.parts) for a in fetched.artifacts}
    assert artifacts == {"stdout": "hello\n", "stderr": "oops\n"}

    # The log (agora replay --json): the lifecycle, produced by the A2A agent.
    log = replay(hub, ws)
    events = exec_events(log, exec_id)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "execRequested" and kinds[1] == "execStarted", kinds
    assert kinds[-1] == "execFinished" and set(kinds[2:-1]) == {"execOutput"}, kinds
    assert {e["producer"] for e in events} == {"a2a-runner"}
    requested, finished = events[0], events[-1]
    assert requested["payload"]["backend"] == "process"
    assert requested["payload"]["source"] == "echo hello; echo oops >&2; exit 3"
    assert finished["payload"]["status"] == "failed"
    assert finished["payload"]["exitCode"] == 3
    assert finished["causationId"] == requested["id"]
    assert output_text(events, "stdout") == "hello\n"
    assert output_text(events, "stderr") == "oops\n"
    joined = [e for e in log if e["kind"] == "memberJoined"]
    assert [(e["producer"], e["payload"]["via"]) for e in joined] == [("a2a-runner", "a2a")]


async def test_successful_exec_completes_and_a_retry_returns_the_same_task(
    hub: HubProcess,
) -> None:
    ws = new_workspace()
    token = mint("a2a-runner", ws)
    message = exec_message(ws, "echo hello", message_id="m-exec-1")
    async with open_client(hub.a2a_url, token) as client:
        got = [r async for r in client.send_message(SendMessageRequest(message=message))]
        exec_id = got[0].task.id
        assert [s for s in states(got) if s != "artifact"] == [
            "TASK_STATE_SUBMITTED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED",
        ]
        assert check_chunks(chunks(got), exec_id) == {"stdout": "hello\n"}
        # The same message again (a client retry): the same task, nothing run twice.
        again = exec_message(ws, "echo hello", message_id="m-exec-1")
        retry = [r async for r in client.send_message(SendMessageRequest(message=again))]
        assert retry[0].task.id == exec_id
        assert states(retry) == states(got)  # streamed again from execRequested
    async with open_client(hub.a2a_url, token, streaming=False) as client:
        [blocking] = [
            r
            async for r in client.send_message(
                SendMessageRequest(message=exec_message(ws, "echo blocking"))
            )
        ]
    assert blocking.task.status.state == S.TASK_STATE_COMPLETED
    # Chunks are parts (as the SDK folds them), closed by the empty lastChunk part.
    assert [p.text for a in blocking.task.artifacts for p in a.parts] == ["blocking\n", ""]

    log = replay(hub, ws)
    assert len([e for e in exec_events(log, exec_id) if e["kind"] == "execRequested"]) == 1
    finished = exec_events(log, exec_id)[-1]
    assert finished["kind"] == "execFinished"
    assert (finished["payload"]["status"], finished["payload"]["exitCode"]) == ("completed", 0)
    assert finished["producer"] == "a2a-runner"


async def test_cancel_task_kills_a_running_execution(hub: HubProcess) -> None:
    ws = new_workspace()
    token = mint("a2a-runner", ws)
    got: list[StreamResponse] = []
    started = asyncio.Event()
    async with open_client(hub.a2a_url, token) as client:

        async def stream() -> None:
            async for r in client.send_message(
                SendMessageRequest(message=exec_message(ws, "echo started; sleep 30"))
            ):
                got.append(r)
                if r.WhichOneof("payload") == "artifact_update":
                    started.set()  # the program runs: it has written to stdout

        streaming = asyncio.create_task(stream())
        await asyncio.wait_for(started.wait(), 20)
        exec_id = got[0].task.id
        t0 = time.monotonic()
        cancelled = await client.cancel_task(CancelTaskRequest(id=exec_id))
        assert time.monotonic() - t0 < 10  # not the 30 s of the sleep
        assert cancelled.id == exec_id
        assert cancelled.status.state == S.TASK_STATE_CANCELED
        await asyncio.wait_for(streaming, 20)
        # A second cancel: the task is terminal now.
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=exec_id))

    seq = [s for s in states(got) if s != "artifact"]
    assert seq[0] == "TASK_STATE_SUBMITTED" and seq[-1] == "TASK_STATE_CANCELED", seq
    kinds = [meta(r.status_update)["agora.kind"] for r in got if r.HasField("status_update")]
    assert kinds == ["execStarted", "execCancelRequested", "execFinished"]
    texts = check_chunks(chunks(got), exec_id)
    assert texts["stdout"] == "started\n"
    assert texts["stderr"] == "Execution cancelled.\n"

    events = exec_events(replay(hub, ws), exec_id)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "execRequested" and kinds[-1] == "execFinished", kinds
    assert kinds.count("execCancelRequested") == 1
    assert kinds.index("execCancelRequested") < kinds.index("execFinished")
    cancel = next(e for e in events if e["kind"] == "execCancelRequested")
    assert cancel["producer"] == "a2a-runner"
    finished = events[-1]
    assert (finished["payload"]["status"], finished["payload"]["reason"]) == (
        "cancelled",
        "killed",
    )
    assert finished["producer"] == "a2a-runner"


async def test_a_token_without_the_backend_is_refused(hub: HubProcess) -> None:
    ws = new_workspace()
    no_backend = mint("no-backend", ws, backends=())
    no_exec = mint("no-exec", ws, rights=("read", "write"))
    async with open_client(hub.a2a_url, no_backend) as client:
        with pytest.raises(InvalidParamsError) as err:
            async for _ in client.send_message(
                SendMessageRequest(message=exec_message(ws, "echo never"))
            ):
                pass
    assert err.value.data == {"agoraCode": "forbidden", "backend": "process"}
    assert "backend 'process'" in str(err.value)
    async with open_client(hub.a2a_url, no_exec) as client:
        with pytest.raises(InvalidParamsError) as err:
            async for _ in client.send_message(
                SendMessageRequest(message=exec_message(ws, "echo never"))
            ):
                pass
    assert err.value.data == {"agoraCode": "forbidden", "right": "exec", "workspace": ws}

    # A refused request writes nothing (not even the agent's memberJoined).
    assert replay(hub, ws) == []


async def test_cancel_needs_the_exec_right_and_the_backend(hub: HubProcess) -> None:
    ws = new_workspace()
    runner = mint("a2a-runner", ws)
    got: list[StreamResponse] = []
    started = asyncio.Event()
    async with open_client(hub.a2a_url, runner) as client:

        async def stream() -> None:
            request = SendMessageRequest(message=exec_message(ws, "echo started; sleep 30"))
            async for r in client.send_message(request):
                got.append(r)
                if r.WhichOneof("payload") == "artifact_update":
                    started.set()

        streaming = asyncio.create_task(stream())
        await asyncio.wait_for(started.wait(), 20)
        exec_id = got[0].task.id
        for outsider, detail in [
            (mint("no-backend", ws, backends=()), {"backend": "process"}),
            (mint("reader", ws, rights=("read",)), {"right": "exec", "workspace": ws}),
        ]:
            async with open_client(hub.a2a_url, outsider) as other:
                with pytest.raises(TaskNotCancelableError) as err:
                    await other.cancel_task(CancelTaskRequest(id=exec_id))
            assert err.value.data == {"agoraCode": "forbidden", **detail}
        cancelled = await client.cancel_task(CancelTaskRequest(id=exec_id))
        assert cancelled.status.state == S.TASK_STATE_CANCELED
        await asyncio.wait_for(streaming, 20)
    assert states(got)[-1] == "TASK_STATE_CANCELED"
    events = exec_events(replay(hub, ws), exec_id)
    kinds = [e["kind"] for e in events]
    assert kinds.count("execCancelRequested") == 1 and kinds[-1] == "execFinished"
    assert {e["producer"] for e in events} == {"a2a-runner"}
