"""The Python client's runtime API (``ws.runtime``) against a real ``agora serve``."""

from __future__ import annotations

import asyncio

import pytest

from hub.client import ExecHandle, connect
from hub.core.errors import BadRequest, Busy, Exists, Forbidden, NotFound
from hub.core.events import ExecFinished, ExecOutput
from tests.support.hub import HubProcess
from tests.support.tokens import mint_exec


async def test_exec_stream_and_result(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec()) as session:
        ws = session.workspace("w")
        handle = await ws.runtime.exec("echo one; sleep 0.1; echo two >&2; exit 5")
        assert isinstance(handle, ExecHandle) and len(handle.id) == 36
        updates = [u async for u in handle]
        result = await handle.result()
        assert await handle.result() is result  # memoised
    outputs = [(u.event.payload.stream, u.text) for u in updates if isinstance(u.event, ExecOutput)]
    assert outputs == [("stdout", "one\n"), ("stderr", "two\n")]
    assert isinstance(updates[-1].event, ExecFinished)
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 5)
    assert (result.stdout, result.stderr) == ("one\n", "two\n")


async def test_single_consumer(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec()) as session:
        ws = session.workspace("w")
        handle = await ws.runtime.exec("echo hi")
        result = await handle.result()
        with pytest.raises(BadRequest, match="single consumer"):
            async for _ in handle:
                pass
        streamed = await ws.runtime.exec("sleep 0.2; echo hi")
        stream = streamed.events()
        first = await anext(stream)
        with pytest.raises(BadRequest, match="single consumer"):
            await streamed.result()
        rest = [u async for u in stream]
        after = await streamed.result()  # fine once the stream ended
    assert result.stdout == "hi\n" and first.event.kind == "execRequested"
    assert rest[-1].event.kind == "execFinished" and after.stdout == "hi\n"


async def test_bytes_encoding_value_and_input(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec()) as session:
        ws = session.workspace("w")
        raw = await (await ws.runtime.exec("printf '\\377'", encoding="base64")).result()
        value = await (
            await ws.runtime.exec("input['x'] * 3", backend="python", input={"x": 14})
        ).result()
        with pytest.raises(BadRequest, match="not callable"):
            await ws.runtime.exec("cat", backend="container", input=1)
    assert raw.stdout == b"\xff"
    assert (value.value, value.has_value) == (42, True)


async def test_kill_get_exec_and_dispose(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec()) as session:
        ws = session.workspace("w")
        handle = await ws.runtime.exec("echo started; sleep 30", id="job")
        with pytest.raises(Busy):
            await ws.runtime.exec("true", id="job")
        with pytest.raises(Busy):
            await ws.runtime.dispose_exec("job")
        async for update in ws.runtime.get_exec("job", resume="full"):
            if isinstance(update.event, ExecOutput):
                break
        assert await handle.kill() == "cancelled"
        result = await handle.result()
        with pytest.raises(Exists):
            await ws.runtime.exec("true", id="job")
        tail = [u async for u in ws.runtime.get_exec("job", resume="tail")]
        after_1 = [u.event.kind async for u in ws.runtime.get_exec("job", resume=1)]
        await ws.runtime.dispose_exec("job")
        with pytest.raises(NotFound):
            await ws.runtime.dispose_exec("job")
        with pytest.raises(NotFound):
            async for _ in ws.runtime.get_exec("job"):
                pass
        again = await (await ws.runtime.exec("echo again", id="job")).result()
    assert (result.status, result.exit_code, result.stdout) == ("cancelled", 130, "started\n")
    assert tail == []
    assert after_1 == ["execCancelRequested", "execOutput", "execFinished"]
    assert again.stdout == "again\n"


async def test_forbidden_backend(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec("eve", backends=("ro",))) as session:
        ws = session.workspace("w")
        with pytest.raises(Forbidden):
            await ws.runtime.exec("true")
        ok = await (await ws.runtime.exec("echo ro", backend="ro")).result()
    assert ok.stdout == "ro\n"


async def test_concurrent_executions_through_one_session(runtime_hub: HubProcess) -> None:
    async with connect(runtime_hub.url, mint_exec()) as session:
        ws = session.workspace("w")
        handles = await asyncio.gather(*(ws.runtime.exec(f"echo {i}") for i in range(10)))
        results = await asyncio.gather(*(h.result() for h in handles))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]
