"""Black-box tests of the ``container`` backend through the hub, on the real Docker Engine:
a fork bomb held by the pids limit, a memory hog stopped, no network, the hub's environment
invisible, files pulled back. Skipped without an engine (failed when CI requires docker)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import pytest

from backends.container import owner_label
from tests.support.docker import EngineProxy, need_docker, owned_containers
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import ExecPeer, Frame, exec_peer, of_exec, of_kind
from tests.support.tokens import SECRET
from tests.support.waiting import wait_for


@pytest.fixture(autouse=True)
def _docker() -> None:
    need_docker()


async def test_stdout_stderr_exit_code_in_a_container(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(backend="container", source="echo out; echo err >&2; exit 4")
        events = of_exec(await p.log(), result["execId"])
    assert (result["status"], result["exitCode"]) == ("failed", 4)
    assert (result["stdout"], result["stderr"]) == ("out\n", "err\n")
    started = of_kind(events, "execStarted")[0]["payload"]
    assert (started["backend"], started["isolation"]) == ("container", "containerEphemeral")


async def test_a_fork_bomb_is_held_by_the_pids_limit(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        bomb = await p.run(
            backend="container", source="f(){ f|f& }; f; sleep 2; echo survived", timeoutMs=8000
        )
        after = await p.run(backend="container", source="echo fine")
    assert "can't fork" in bomb["stderr"] or "Resource temporarily unavailable" in bomb["stderr"]
    assert bomb["status"] in ("completed", "failed")  # held, then ended (exit or timeout)
    assert bomb["durationMs"] < 30_000
    assert after["stdout"] == "fine\n"  # the hub and the engine are fine


async def test_a_memory_hog_is_stopped(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        # busybox tail keeps a line without a newline in memory: 500 MB against a 64 MiB cap.
        result = await p.run(backend="container", source="head -c 500m /dev/zero | tail")
    assert (result["status"], result["reason"], result["exitCode"]) == (
        "failed",
        "memoryLimit",
        137,
    )
    assert any(d.get("code") == "memoryLimit" for d in result["diagnostics"])


async def test_no_network_in_a_container(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(
            backend="container",
            source=f"echo hello | nc -w 2 127.0.0.1 {runtime_hub.port} && echo connected;"
            " ls /sys/class/net",
        )
    assert "connected" not in result["stdout"]
    assert result["stdout"].split() == ["lo"]  # no interface but loopback


async def test_the_hub_environment_is_invisible_in_a_container(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(backend="container", source="env")
    assert result["status"] == "completed"
    assert "AGORA_SECRET" not in result["stdout"] and SECRET not in result["stdout"]


async def test_container_files_are_pulled_back(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.publish("w", {"kind": "fileWritten", "payload": {"path": "in.txt", "text": "3"}})
        result = await p.run(
            backend="container",
            source="cat in.txt; expr $(cat in.txt) \\* 2 > out.txt",
            execId="c",
        )
        log = await p.log()
    assert (result["stdout"], result["pushed"], result["pulled"]) == ("3", 1, 1)
    requested = of_kind(of_exec(log, "c"), "execRequested")[0]
    written = [e for e in log if e["kind"] == "fileWritten" and e["payload"]["path"] == "out.txt"]
    assert written[0]["causationId"] == requested["id"]
    assert written[0]["payload"]["text"] == "6\n"


async def test_a_read_only_policy_is_a_read_only_mount(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.publish("w", {"kind": "fileWritten", "payload": {"path": "a.txt", "text": "a"}})
        result = await p.run(
            backend="container",
            source="cat a.txt; echo x > b.txt",
            policy={"filesystem": {"mode": "workspaceReadOnly"}},
        )
    assert result["stdout"] == "a" and "Read-only file system" in result["stderr"]
    assert (result["status"], result["pulled"], result["skipped"]) == ("failed", 0, [])


async def test_kill_a_container_run(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.exec(backend="container", source="echo up; sleep 60", execId="ck")
        frames, _end = await _first_output(p, "ck")
        killed = await p.call("kill", workspace="w", execId="ck", within=30)
        result = (await p.call("execResult", workspace="w", execId="ck"))["result"]
    assert base64.b64decode(frames["event"]["payload"]["data"]) == b"up\n"
    assert (killed["op"], killed["status"]) == ("killed", "cancelled")
    assert (result["exitCode"], result["stdout"]) == (130, "up\n")


async def _first_output(p: ExecPeer, exec_id: str) -> tuple[Frame, None]:
    rid = "first"
    await p.send({"op": "getExec", "rid": rid, "workspace": "w", "execId": exec_id})
    while True:
        frame = await p.reply(rid, 30)
        if frame["op"] == "execEvent" and frame["event"]["kind"] == "execOutput":
            return frame, None


HUNG_CLOSE_GRACE_S = 2.0


async def test_a_hung_engine_does_not_hold_the_hubs_stop(tmp_path: Path) -> None:
    """The engine stops answering (every byte held: :class:`EngineProxy`) under a running
    execution and a warm container: SIGTERM still stops ``agora serve`` soon after
    ``close_grace_s`` (the stop gives up on the engine), not after the engine calls' own
    timeout (60 s, one after another; the hub ignored SIGTERM for 30 s and more), and the
    execution is recorded ``failed/interrupted`` saying why. With the engine back, the next
    start sweeps both containers the stop left."""
    async with EngineProxy(tmp_path / "engine.sock") as engine:
        config = (
            f'[[backends]]\nid = "box"\nkind = "container"\n'
            f'limits = {{ base_url = "{engine.base_url}", warm_pool = 1 }}\n'
            f"[runtime]\nclose_grace_s = {HUNG_CLOSE_GRACE_S}\n"
        )
        starter = HubStarter(tmp_path)
        try:
            # (Off the loop: the proxy serving the hub's engine calls runs on it.)
            hub = await asyncio.to_thread(starter.start, config)
            owner = owner_label(hub.data_dir)
            async with exec_peer(hub.url) as p:
                await p.exec(backend="box", source="echo up; sleep 120", execId="long")
                await _first_output(p, "long")

                async def both() -> bool:  # the run's container and the refilled warm one
                    return len(await asyncio.to_thread(owned_containers, owner)) == 2

                await wait_for(both, 30)
                left = set(await asyncio.to_thread(owned_containers, owner))
                engine.freeze()
                began = time.monotonic()
                code = await asyncio.to_thread(hub.terminate)
                took = time.monotonic() - began
            assert code == 0, hub.log()
            assert took < HUNG_CLOSE_GRACE_S + 5, (took, hub.log())
            assert "giving up on the backends' pending calls" in hub.log(), hub.log()
            engine.thaw()
            await asyncio.to_thread(hub.restart)
            async with exec_peer(hub.url) as p:
                result = (await p.call("execResult", workspace="w", execId="long"))["result"]

                async def swept() -> bool:
                    return not left & set(await asyncio.to_thread(owned_containers, owner))

                await wait_for(swept, 30)
            assert (result["status"], result["reason"]) == ("failed", "interrupted"), result
            assert "engine did not answer" in result["diagnostics"][0]["message"], result
        finally:
            engine.thaw()
            await asyncio.to_thread(starter.close)
