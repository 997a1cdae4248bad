"""hub/client/exec.py (``ws.runtime``) against a real ``agora serve`` and its default ``process``
backend (fixtures in conftest.py). The runtime's side of the same API is in
tests/hub/runtime/test_client.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import msgspec
import pytest

from hub.client import ExecResult, ExecUpdate, Session, connect
from hub.client.exec import _exec_result
from hub.core.errors import BadRequest, NotFound
from hub.core.events import ExecFinished, ExecOutput
from hub.core.wire.frames import RuntimeResult
from tests.hub.client.helpers import WAIT, name
from tests.support.hub import HubProcess


def runner_token(hub: HubProcess, agent: str = "runner") -> str:
    return hub.signer.issue(
        agent, ["*"], ["read", "write", "exec"], backends=["process"], ttl_seconds=3600
    )


@pytest.fixture
async def runner(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, runner_token(hub)) as session:
        yield session


def outputs(updates: list[ExecUpdate]) -> list[tuple[str, str | None]]:
    return [(u.event.payload.stream, u.text) for u in updates if isinstance(u.event, ExecOutput)]


def test_results_decode_per_encoding() -> None:
    fields = dict(
        status="completed",
        reason="exit",
        exit_code=0,
        stdout_truncated=False,
        stderr_truncated=True,
        duration_ms=7,
        pushed=1,
        pulled=2,
        skipped=[],
    )
    text = _exec_result(RuntimeResult(stdout="hé", stderr="", encoding="utf8", **fields))
    assert (text.stdout, text.stderr, text.has_value, text.value) == ("hé", "", False, None)
    assert text.diagnostics == [] and text.stderr_truncated and text.pulled == 2
    raw = _exec_result(
        RuntimeResult(
            stdout=base64.b64encode(b"\xff\x00").decode(),
            stderr="",
            encoding="base64",
            value=None,
            diagnostics=["d"],
            **fields,
        )
    )
    assert isinstance(raw, ExecResult) and raw.stdout == b"\xff\x00" and raw.stderr == b""
    assert raw.has_value and raw.value is None  # a program may return null
    assert raw.diagnostics == ["d"]


async def test_invalid_requests_are_refused_before_sending(runner: Session) -> None:
    ws = runner.workspace(name())
    with pytest.raises(BadRequest) as info:
        await ws.runtime.exec("true", encoding="latin1")
    assert info.value.details["field"] == "encoding"
    with pytest.raises(BadRequest) as info:
        await ws.runtime.exec("true", policy={"noSuchSetting": 1})
    assert info.value.details["field"] == "policy"
    assert await ws.events() == []  # nothing reached the log


async def test_unknown_execution_is_not_found_and_single_consumer(runner: Session) -> None:
    ws = runner.workspace(name())
    handle = ws.runtime.get_exec("nope")
    with pytest.raises(NotFound):
        await handle.result()
    with pytest.raises(BadRequest, match="single consumer"):
        async for _ in handle:
            pass
    with pytest.raises(NotFound):
        async for _ in ws.runtime.get_exec("nope", resume="tail"):
            pass
    with pytest.raises(NotFound):
        await ws.runtime.dispose_exec("nope")


async def test_stream_result_and_replay(runner: Session) -> None:
    ws = runner.workspace(name())
    handle = await ws.runtime.exec("echo one; echo two >&2; exit 3")
    async with asyncio.timeout(WAIT):
        updates = [u async for u in handle]
        result = await handle.result()
        replay = [u async for u in ws.runtime.get_exec(handle.id, resume="full")]
        after_first = [u async for u in ws.runtime.get_exec(handle.id, resume=1)]
    assert updates[0].event.kind == "execRequested" and isinstance(updates[-1].event, ExecFinished)
    assert sorted(outputs(updates)) == [("stderr", "two\n"), ("stdout", "one\n")]
    assert (result.status, result.exit_code, result.stdout, result.stderr) == (
        "failed",
        3,
        "one\n",
        "two\n",
    )
    assert [u.event.seq for u in replay] == [u.event.seq for u in updates]
    assert len(outputs(after_first)) == 1 and isinstance(after_first[-1].event, ExecFinished)


async def test_stream_resumes_after_a_dropped_connection_once_each(hub: HubProcess) -> None:
    async with connect(hub.url, runner_token(hub, "resumer")) as session:
        ws = session.workspace(name())
        handle = await ws.runtime.exec("for i in 1 2 3 4 5 6; do echo $i; sleep 0.2; done")
        got: list[ExecUpdate] = []
        async with asyncio.timeout(WAIT * 2):
            async for update in handle:
                got.append(update)
                if len(outputs(got)) == 2 and session.reconnects == 0:
                    connection = session._current
                    assert connection is not None
                    connection.transport.abort()  # no close frame: the network failed
        assert session.reconnects >= 1
        seqs = [u.event.seq for u in got]
        assert seqs == sorted(set(seqs)), f"duplicate or reordered: {seqs}"
        assert [t for _, t in outputs(got)] == [f"{i}\n" for i in range(1, 7)]
        assert isinstance(got[-1].event, ExecFinished)
        assert msgspec.to_builtins((await handle.result()).status) == "completed"
