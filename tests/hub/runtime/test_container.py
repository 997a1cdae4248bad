"""Black-box tests of the ``container`` backend through the hub, on the real Docker Engine:
a fork bomb held by the pids limit, a memory hog stopped, no network, the hub's environment
invisible, files pulled back. Skipped without an engine (failed when CI requires docker)."""

from __future__ import annotations

import base64

import pytest

from tests.support.docker import need_docker
from tests.support.hub import HubProcess
from tests.support.peer import ExecPeer, Frame, exec_peer, of_exec, of_kind
from tests.support.tokens import SECRET


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
