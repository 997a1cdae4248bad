"""Restart recovery over real sockets: a hub killed (SIGKILL) mid-execution is restarted on the
same data directory and closes the execution as ``failed/interrupted``, keeping the output
journaled before the crash; a hub stopped (SIGTERM) records its running executions itself."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

from tests.support.hub import HubProcess
from tests.support.peer import exec_peer, of_exec, of_kind


async def _until_output(url: str, exec_id: str) -> None:
    async with exec_peer(url) as p, asyncio.timeout(20):
        while True:
            if of_kind(of_exec(await p.log(), exec_id), "execOutput"):
                return
            await asyncio.sleep(0.05)


async def test_sigkill_mid_execution_then_restart_closes_it_as_interrupted(
    start_runtime_hub: Callable[..., HubProcess],
) -> None:
    first = start_runtime_hub()
    async with exec_peer(first.url) as p:
        accepted = await p.exec(source="echo before; sleep 5; echo after", execId="crash")
        assert accepted["op"] == "execAccepted"
        await p.exec(source="echo done", execId="fine")  # finished: left alone
    await _until_output(first.url, "crash")
    first.kill()  # SIGKILL: no shutdown, no execFinished
    second = start_runtime_hub(data_dir=first.data_dir)
    async with exec_peer(second.url) as p:
        result = (await p.call("execResult", workspace="w", execId="crash"))["result"]
        fine = (await p.call("execResult", workspace="w", execId="fine"))["result"]
        events = of_exec(await p.log(), "crash")
        reuse = await p.exec(source="true", execId="crash")
    assert (result["status"], result["reason"], result["exitCode"]) == ("failed", "interrupted", -1)
    assert result["stdout"] == "before\n"  # journaled before the crash, kept
    assert result["stderr"] == "interrupted when the hub restarted\n"
    assert fine["status"] == "completed"
    kinds = [e["kind"] for e in events]
    assert kinds[:3] == ["execRequested", "execStarted", "execOutput"]
    assert kinds[-2:] == ["execOutput", "execFinished"]
    note = events[-2]["payload"]
    assert (note["stream"], base64.b64decode(note["data"])) == (
        "stderr",
        b"interrupted when the hub restarted\n",
    )
    assert note["n"] == events[-3]["payload"]["n"] + 1  # output numbering continues
    assert events[-1]["producer"] == "hub"
    assert reuse["code"] == "exists"  # retained until disposed


async def test_sigterm_records_running_executions_as_interrupted(
    start_runtime_hub: Callable[..., HubProcess],
) -> None:
    first = start_runtime_hub()
    async with exec_peer(first.url) as p:
        await p.exec(source="echo working; sleep 30", execId="stopped")
    await _until_output(first.url, "stopped")
    assert first.terminate() == 0
    second = start_runtime_hub(data_dir=first.data_dir)
    async with exec_peer(second.url) as p:
        result = (await p.call("execResult", workspace="w", execId="stopped"))["result"]
        events = of_exec(await p.log(), "stopped")
    assert (result["status"], result["reason"]) == ("failed", "interrupted")
    assert result["stdout"] == "working\n"
    assert result["stderr"] == "interrupted when the hub shut down\n"
    assert len(of_kind(events, "execFinished")) == 1  # the restart found nothing to close
