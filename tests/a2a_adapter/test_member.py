"""examples/a2a_member.py against a real ``agora serve``: a WebSocket member answering the
conformance kit's scenarios for a peer holding a token scoped to one workspace."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState

from hub.auth import TokenSigner
from tests.a2a_adapter.peers import open_client
from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.tokens import SECRET

WORKSPACE = "tck"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[HubProcess]:
    hub = HubProcess(tmp_path / "data", a2a_port=0).start()
    try:
        yield hub
    finally:
        hub.terminate()


def token(agent: str) -> str:
    return TokenSigner(SECRET.encode()).issue(
        agent, [WORKSPACE], ["read", "write"], ttl_seconds=3600
    )


@pytest.fixture
def member(served: HubProcess) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, str(REPO / "examples" / "a2a_member.py"), "--url", served.url]
    argv += ["--workspace", WORKSPACE, "--token", token("tck-member")]
    proc = subprocess.Popen(argv, cwd=REPO, env=served.environ(), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        seen = b""
        while b"answering" not in seen:
            ready, _, _ = select.select(
                [proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            assert ready, f"the member did not start: {seen!r}"
            chunk = os.read(proc.stdout.fileno(), 1024)
            assert chunk, f"the member exited: {seen!r}"
            seen += chunk
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def send(message_id: str) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text="go")])
    )


async def test_the_member_answers_the_kit_scenarios(
    served: HubProcess, member: subprocess.Popen[bytes]
) -> None:
    async with open_client(served.a2a_url, token("peer"), streaming=False) as client:
        [done] = [r async for r in client.send_message(send("tck-artifact-text-1"))]
        [asks] = [r async for r in client.send_message(send("tck-input-required-1"))]
    assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert done.task.context_id == WORKSPACE  # the token's only workspace
    assert [p.text for a in done.task.artifacts for p in a.parts] == ["Generated text content"]
    assert asks.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    async with open_client(served.a2a_url, token("peer")) as client:
        got = [r async for r in client.send_message(send("tck-stream-artifact-chunked-1"))]
    chunks = [
        p.text
        for r in got
        if r.HasField("artifact_update")
        for p in r.artifact_update.artifact.parts
    ]
    assert chunks == ["chunk-1 ", "chunk-2"]
    assert got[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
